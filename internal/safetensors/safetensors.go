// Package safetensors reads Hugging Face safetensors checkpoints, single-file
// or sharded behind model.safetensors.index.json, by mapping each shard
// read-only so that packing a model larger than memory never copies it whole.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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
	n := t.Elems()
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
	default:
		return nil, fmt.Errorf("safetensors: tensor %s: unsupported dtype %s (want BF16, F16 or F32)", t.Name, t.DType)
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
	size := st.Size()
	if size < 8 {
		return fmt.Errorf("safetensors: %s: truncated (%d bytes)", path, size)
	}
	data, err := platform.MapFile(path)
	if err != nil {
		return fmt.Errorf("safetensors: %v", err)
	}
	c.maps = append(c.maps, data)
	hlen := binary.LittleEndian.Uint64(data[:8])
	if hlen > uint64(size-8) || hlen > 100<<20 {
		return fmt.Errorf("safetensors: %s: header length %d exceeds file size %d (truncated or not safetensors)", path, hlen, size)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+hlen], &hdr); err != nil {
		return fmt.Errorf("safetensors: %s: bad header: %v", path, err)
	}
	body := data[8+hlen:]
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("safetensors: %s: tensor %s: %v", path, name, err)
		}
		t := &Tensor{Name: name, DType: e.DType, Shape: e.Shape, File: path}
		es := 0
		switch e.DType {
		case "BF16", "F16":
			es = 2
		case "F32", "U32": // U32: MLX's packed quantised weights
			es = 4
		case "F8_E4M3", "F8_E5M2", "U8", "I8":
			es = 1
		}
		if e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > int64(len(body)) {
			return fmt.Errorf("safetensors: %s: tensor %s: data offsets %v outside the file's %d data bytes (truncated?)", path, name, e.Offsets, len(body))
		}
		t.Data = body[e.Offsets[0]:e.Offsets[1]]
		if es > 0 && int64(t.Elems()*es) != e.Offsets[1]-e.Offsets[0] {
			return fmt.Errorf("safetensors: %s: tensor %s: shape %v needs %d bytes, has %d", path, name, e.Shape, t.Elems()*es, e.Offsets[1]-e.Offsets[0])
		}
		if _, dup := c.Tensors[name]; dup {
			return fmt.Errorf("safetensors: tensor %s appears twice (%s)", name, path)
		}
		c.Tensors[name] = t
	}
	return nil
}

// ErrNotFound is returned for a tensor the checkpoint does not hold.
var ErrNotFound = errors.New("tensor not found")
