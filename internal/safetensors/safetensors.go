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
	"math"
	"os"
	"path/filepath"
	"sort"

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

// OpenDir opens model.safetensors.index.json and its shards, or a lone
// model.safetensors, or every *.safetensors file of dir.
func OpenDir(dir string) (*Checkpoint, error) {
	var files []string
	idx := filepath.Join(dir, "model.safetensors.index.json")
	if b, err := os.ReadFile(idx); err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &ix); err != nil {
			return nil, fmt.Errorf("safetensors: %s: %v", idx, err)
		}
		seen := map[string]bool{}
		for _, f := range ix.WeightMap {
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("safetensors: %s: empty weight_map", idx)
		}
	} else {
		m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		for _, f := range m {
			files = append(files, filepath.Base(f))
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("safetensors: no model.safetensors.index.json or *.safetensors in %s", dir)
		}
	}
	c := &Checkpoint{Tensors: map[string]*Tensor{}}
	for _, f := range files {
		if err := c.openFile(filepath.Join(dir, f)); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Checkpoint) openFile(path string) error {
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
	hdr, err := decodeHeader(data[8 : 8+hlen])
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

// headerEntry is one key of a header and its undecoded value.
type headerEntry struct {
	name string
	raw  json.RawMessage
}

// decodeHeader splits the JSON header object into its entries in file
// order. Unlike json.Unmarshal into a map it rejects a repeated key, which
// would otherwise silently keep only the last of two tensor descriptions.
func decodeHeader(b []byte) ([]headerEntry, error) {
	r := bytes.NewReader(b)
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil {
		return nil, err
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("header is not a JSON object")
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
