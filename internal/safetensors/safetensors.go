// Package safetensors reads Hugging Face safetensors checkpoints, single-file
// or sharded behind model.safetensors.index.json, by mapping each shard
// read-only so that packing a model larger than memory never copies it whole.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/quant"
)

// Tensor is one named tensor; Data aliases the mapped file.
type Tensor struct {
	Name  string
	DType string // "BF16", "F16", "F32", or "U32" (MLX-quantised weights), "U8"…
	Shape []int
	Data  []byte
	File  string
}

// Elems is the number of elements the shape holds.
func (t *Tensor) Elems() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32 converts the tensor to float32; bf16 is a 16-bit shift, f16 is
// converted exactly, f32 is copied.
func (t *Tensor) Float32() ([]float32, error) {
	es := 0
	switch t.DType {
	case "BF16", "F16":
		es = 2
	case "F32":
		es = 4
	default:
		return nil, fmt.Errorf("safetensors: tensor %s: unsupported dtype %s (want BF16, F16 or F32)", t.Name, t.DType)
	}
	n := t.Elems()
	// A Tensor built by hand (a slice or reshape of a loaded one) may not
	// hold the bytes its shape says; that is an error, not a panic.
	if n < 0 || len(t.Data) != n*es {
		return nil, fmt.Errorf("safetensors: tensor %s: shape %v of %s needs %d bytes, has %d", t.Name, t.Shape, t.DType, n*es, len(t.Data))
	}
	out := make([]float32, n)
	switch t.DType {
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
		}
	case "F16":
		for i := range out {
			out[i] = quant.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	}
	return out, nil
}

// Checkpoint is the set of tensors of a checkpoint directory.
type Checkpoint struct {
	Tensors map[string]*Tensor
	maps    [][]byte
}

// Names returns the tensor names in sorted order.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.Tensors))
	for n := range c.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Close unmaps every shard.
func (c *Checkpoint) Close() error {
	var first error
	for _, m := range c.maps {
		if err := platform.Unmap(m); err != nil && first == nil {
			first = err
		}
	}
	c.maps = nil
	return first
}

// IndexFile is the name of the shard index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// OpenDir opens model.safetensors.index.json and its shards, or a lone
// model.safetensors, or every *.safetensors file of dir.
//
// With an index, the index is authoritative for which files are read, and
// every tensor it names must be in the shard it names: a checkpoint whose
// index and shards disagree was copied or converted wrongly, and reading it
// anyway would pack whatever the shards happen to hold. Tensors a shard
// holds beyond the index are kept, as transformers loads whole shards.
func OpenDir(dir string) (*Checkpoint, error) {
	var files []string
	var wm map[string]string // tensor → shard, from the index
	idx := filepath.Join(dir, IndexFile)
	if b, err := os.ReadFile(idx); err == nil {
		if wm, err = parseIndex(b); err != nil {
			return nil, fmt.Errorf("safetensors: %s: %v", idx, err)
		}
		seen := map[string]bool{}
		for _, f := range wm {
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
	} else if !errors.Is(err, fs.ErrNotExist) {
		// An index that exists but cannot be read (permissions, a
		// directory) must not silently fall back to every shard on disk.
		return nil, fmt.Errorf("safetensors: %v", err)
	} else {
		// ReadDir, not Glob: dir is a path, not a pattern, and Glob would
		// read a sibling directory's shards when dir holds '*' or '['.
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("safetensors: %v", err)
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".safetensors") {
				files = append(files, e.Name())
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("safetensors: no %s or *.safetensors in %s", IndexFile, dir)
		}
	}
	c := &Checkpoint{Tensors: map[string]*Tensor{}}
	for _, f := range files {
		if err := c.openFile(filepath.Join(dir, f)); err != nil {
			c.Close()
			if wm != nil && errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("safetensors: %s: shard %s, which the index lists for %s, is missing", idx, f, tensorsOf(wm, f))
			}
			return nil, err
		}
	}
	if wm != nil {
		names := make([]string, 0, len(wm))
		for n := range wm {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			want := filepath.Join(dir, wm[n])
			t, ok := c.Tensors[n]
			if !ok {
				c.Close()
				return nil, fmt.Errorf("safetensors: %s: tensor %s: the index maps it to shard %s, which does not hold it", idx, n, wm[n])
			}
			if t.File != want {
				c.Close()
				return nil, fmt.Errorf("safetensors: %s: tensor %s: the index maps it to shard %s, but it is in %s", idx, n, wm[n], filepath.Base(t.File))
			}
		}
	}
	return c, nil
}

// parseIndex returns the weight_map of an index file, tensor → shard file
// name relative to the checkpoint directory, cleaned. It refuses what would
// otherwise be read silently wrong: a repeated key (json.Unmarshal keeps the
// last), a shard path outside the directory (an index is data from the
// hub, and "../../x" or "/etc/x" must not make sluice read other files), a
// missing or empty weight_map.
func parseIndex(b []byte) (map[string]string, error) {
	top, err := decodeObject(b)
	if err != nil {
		return nil, fmt.Errorf("not a JSON index: %v", err)
	}
	var raw json.RawMessage
	for _, e := range top {
		if e.name == "weight_map" {
			raw = e.raw
		}
	}
	if raw == nil {
		return nil, fmt.Errorf("no weight_map")
	}
	ents, err := decodeObject(raw)
	if err != nil {
		return nil, fmt.Errorf("weight_map: %v", err)
	}
	if len(ents) == 0 {
		return nil, fmt.Errorf("empty weight_map")
	}
	wm := make(map[string]string, len(ents))
	for _, e := range ents {
		var f string
		if err := json.Unmarshal(e.raw, &f); err != nil || bytes.Equal(e.raw, []byte("null")) {
			return nil, fmt.Errorf("weight_map: tensor %s: shard %s is not a file name", e.name, e.raw)
		}
		if !filepath.IsLocal(f) {
			return nil, fmt.Errorf("weight_map: tensor %s: shard %q is not a file inside the checkpoint directory", e.name, f)
		}
		// Cleaned, so "./a" and "a" are one shard, opened once.
		wm[e.name] = filepath.Clean(f)
	}
	return wm, nil
}

// tensorsOf names the tensors wm maps to shard f, for an error message:
// the first in sorted order and how many more.
func tensorsOf(wm map[string]string, f string) string {
	var names []string
	for n, s := range wm {
		if s == f {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 1 {
		return "tensor " + names[0]
	}
	return fmt.Sprintf("tensor %s and %d more", names[0], len(names)-1)
}

func (c *Checkpoint) openFile(path string) error {
	// Stat before opening: opening a FIFO or a device blocks or reads
	// something that is not a file's bytes.
	if st, err := os.Stat(path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("safetensors: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("safetensors: %v", err)
	}
	if size := st.Size(); size < 8 {
		return fmt.Errorf("safetensors: %s: truncated (%d bytes)", path, size)
	}
	data, err := platform.MapFile(path)
	if err != nil {
		return fmt.Errorf("safetensors: %v", err)
	}
	c.maps = append(c.maps, data)
	return c.parse(path, data)
}

// dtypeBits is the size in bits of an element of each dtype of the
// safetensors format; a dtype not here is an error, not a tensor of unknown
// size whose byte range nothing checks.
var dtypeBits = map[string]int64{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
	"U16": 16, "I16": 16, "F16": 16, "BF16": 16,
	"U32": 32, "I32": 32, "F32": 32, // U32: MLX's packed quantised weights
	"U64": 64, "I64": 64, "F64": 64,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

// parse adds the tensors of data, the whole mapped file path, to c. Every
// range is checked against the file and against its dtype and shape, with
// overflow-safe arithmetic, so a corrupt header is an error here rather than
// a panic or a wrong tensor later.
func (c *Checkpoint) parse(path string, data []byte) error {
	size := int64(len(data))
	if size < 8 {
		return fmt.Errorf("safetensors: %s: truncated (%d bytes)", path, size)
	}
	hlen := binary.LittleEndian.Uint64(data[:8])
	if hlen > uint64(size-8) || hlen > 100<<20 {
		return fmt.Errorf("safetensors: %s: header length %d exceeds file size %d (truncated or not safetensors)", path, hlen, size)
	}
	hdr, err := decodeObject(data[8 : 8+hlen])
	if err != nil {
		return fmt.Errorf("safetensors: %s: bad header: %v", path, err)
	}
	body := data[8+hlen:]
	type span struct {
		name       string
		start, end int64
	}
	var spans []span
	for _, h := range hdr {
		name, raw := h.name, h.raw
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int   `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("safetensors: %s: tensor %s: %v", path, name, err)
		}
		bits, ok := dtypeBits[e.DType]
		if !ok {
			return fmt.Errorf("safetensors: %s: tensor %s: unknown dtype %q", path, name, e.DType)
		}
		// A missing shape would read as a scalar and a short data_offsets as
		// zeros; both are corrupt headers, not defaults.
		if e.Shape == nil {
			return fmt.Errorf("safetensors: %s: tensor %s: no shape", path, name)
		}
		if len(e.Offsets) != 2 {
			return fmt.Errorf("safetensors: %s: tensor %s: data_offsets %v, want [begin, end]", path, name, e.Offsets)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 || d != 0 && elems > math.MaxInt64/8/int64(d) {
				return fmt.Errorf("safetensors: %s: tensor %s: shape %v is negative or too large", path, name, e.Shape)
			}
			elems *= int64(d)
		}
		// elems < 2^60 here, so elems*bits cannot overflow.
		if elems*bits%8 != 0 {
			return fmt.Errorf("safetensors: %s: tensor %s: shape %v of %s is not a whole number of bytes", path, name, e.Shape, e.DType)
		}
		want := elems * bits / 8
		if e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > int64(len(body)) {
			return fmt.Errorf("safetensors: %s: tensor %s: data offsets %v outside the file's %d data bytes (truncated?)", path, name, e.Offsets, len(body))
		}
		if want != e.Offsets[1]-e.Offsets[0] {
			return fmt.Errorf("safetensors: %s: tensor %s: shape %v needs %d bytes, has %d", path, name, e.Shape, want, e.Offsets[1]-e.Offsets[0])
		}
		if _, dup := c.Tensors[name]; dup {
			return fmt.Errorf("safetensors: tensor %s appears twice (%s)", name, path)
		}
		c.Tensors[name] = &Tensor{Name: name, DType: e.DType, Shape: e.Shape, File: path, Data: body[e.Offsets[0]:e.Offsets[1]]}
		spans = append(spans, span{name, e.Offsets[0], e.Offsets[1]})
	}
	// Two tensors sharing bytes is a corrupt header (the format lays them
	// end to end); reading one would silently return part of the other.
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var prev span
	for _, s := range spans {
		if s.start < prev.end && s.start < s.end {
			return fmt.Errorf("safetensors: %s: tensors %s %v and %s %v overlap", path, prev.name, []int64{prev.start, prev.end}, s.name, []int64{s.start, s.end})
		}
		if s.end > prev.end {
			prev = s
		}
	}
	return nil
}

// headerEntry is one key of a JSON object and its undecoded value.
type headerEntry struct {
	name string
	raw  json.RawMessage
}

// decodeObject splits a JSON object (a shard's header, an index or its
// weight_map) into its entries in file order. Unlike json.Unmarshal into a
// map it rejects a repeated key, which would otherwise silently keep only
// the last of two tensor descriptions or shard names.
func decodeObject(b []byte) ([]headerEntry, error) {
	r := bytes.NewReader(b)
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil {
		return nil, err
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var out []headerEntry
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("key %v is not a string", tok)
		}
		if seen[name] {
			return nil, fmt.Errorf("key %q appears twice", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("key %q: %v", name, err)
		}
		out = append(out, headerEntry{name, raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	// Anything after the object but white space (the reference writer
	// pads with spaces) is not a header.
	if rest, _ := io.ReadAll(io.MultiReader(dec.Buffered(), r)); len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("data after the header object")
	}
	return out, nil
}

// ErrNotFound is returned for a tensor the checkpoint does not hold.
var ErrNotFound = errors.New("tensor not found")
