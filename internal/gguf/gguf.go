// Package gguf writes and reads GGUF files, the model format of llama.cpp
// (version 3: a header of typed key-value metadata and tensor descriptions,
// then the tensors' data, each aligned). sluice writes GGUF only to hand
// llama.cpp the same synthetic model it benchmarks itself, so the package
// covers what that needs: scalar, string and array metadata, and tensors in
// F32, F16, Q4_0, Q8_0 and MXFP4.
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Magic opens every GGUF file; Version is the version written.
const (
	Magic   = "GGUF"
	Version = 3
	// Alignment of the data section and of every tensor in it (llama.cpp's
	// default, used when general.alignment is absent).
	Alignment = 32
)

// Type is a tensor's element type, numbered as ggml's enum ggml_type.
type Type uint32

// The element types this package writes.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q8_0 Type = 8
	// MXFP4 blocks of 32: the E8M0 scale byte, then 16 bytes whose byte j
	// holds element j's E2M1 code in its low nibble and element j+16's in
	// its high one (ggml's block_mxfp4).
	MXFP4 Type = 39
)

// BlockSize is the number of elements per quantisation block of Q4_0 and
// Q8_0 (each block: an f16 scale, then the quantised values).
const BlockSize = 32

func (t Type) String() string {
	switch t {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case Q4_0:
		return "Q4_0"
	case Q8_0:
		return "Q8_0"
	case MXFP4:
		return "MXFP4"
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// RowBytes is the size of a row of n elements of type t; n must be a
// multiple of BlockSize for the quantised types.
func (t Type) RowBytes(n int) (int64, error) {
	switch t {
	case F32:
		return 4 * int64(n), nil
	case F16:
		return 2 * int64(n), nil
	case Q4_0, Q8_0, MXFP4:
		if n%BlockSize != 0 {
			return 0, fmt.Errorf("gguf: %s row of %d elements, not a multiple of %d", t, n, BlockSize)
		}
		per := int64(2 + BlockSize/2)
		switch t {
		case Q8_0:
			per = 2 + BlockSize
		case MXFP4:
			per = 1 + BlockSize/2
		}
		return int64(n/BlockSize) * per, nil
	}
	return 0, fmt.Errorf("gguf: unsupported type %s", t)
}

// Tensor describes one tensor: Dims in ggml's order, innermost (the row
// length) first, so a PyTorch weight [out][in] is Dims {in, out} and a
// stack of experts [E][out][in] is {in, out, E}.
type Tensor struct {
	Name string
	Type Type
	Dims []uint64
	// Offset is where the data starts, from the beginning of the file
	// (set by Read; Write computes it).
	Offset int64
}

// Size is the tensor's data size in bytes.
func (t *Tensor) Size() (int64, error) {
	if len(t.Dims) == 0 {
		return 0, fmt.Errorf("gguf: tensor %s has no dimensions", t.Name)
	}
	// Dimensions read from a file may be anything; a product that
	// overflows would wrap to a small or negative size that passes the
	// bounds checks.
	overflow := fmt.Errorf("gguf: tensor %s: dimensions %v overflow", t.Name, t.Dims)
	if t.Dims[0] > math.MaxInt64/8 {
		return 0, overflow
	}
	rb, err := t.Type.RowBytes(int(t.Dims[0]))
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	n := rb
	for _, d := range t.Dims[1:] {
		if d != 0 && uint64(n) > math.MaxInt64/d {
			return 0, overflow
		}
		n *= int64(d)
	}
	return n, nil
}

// KV is one metadata entry. Value is one of: string, bool, uint8, int8,
// uint16, int16, uint32, int32, uint64, int64, float32, float64, or a slice
// of string, int32, uint32 or float32.
type KV struct {
	Key   string
	Value any
}

// Value types of the metadata (gguf_type).
const (
	tUint8   = 0
	tInt8    = 1
	tUint16  = 2
	tInt16   = 3
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tBool    = 7
	tString  = 8
	tArray   = 9
	tUint64  = 10
	tInt64   = 11
	tFloat64 = 12
)

type countWriter struct {
	w *bufio.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) u32(v uint32) { binary.Write(c, binary.LittleEndian, v) }
func (c *countWriter) u64(v uint64) { binary.Write(c, binary.LittleEndian, v) }
func (c *countWriter) str(s string) {
	c.u64(uint64(len(s)))
	c.w.WriteString(s)
	c.n += int64(len(s))
}

func (c *countWriter) pad() {
	for c.n%Alignment != 0 {
		c.w.WriteByte(0)
		c.n++
	}
}

// Write writes a GGUF file: the metadata kvs, the descriptions of tensors
// (their Offset is ignored and recomputed), then each tensor's data, which
// data(i, w) must write in full, exactly tensors[i]'s Size bytes.
func Write(w io.Writer, kvs []KV, tensors []Tensor, data func(i int, w io.Writer) error) error {
	c := &countWriter{w: bufio.NewWriterSize(w, 1<<20)}
	c.w.WriteString(Magic)
	c.n += 4
	c.u32(Version)
	c.u64(uint64(len(tensors)))
	c.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		c.str(kv.Key)
		if err := writeValue(c, kv.Value); err != nil {
			return fmt.Errorf("gguf: key %s: %w", kv.Key, err)
		}
	}
	sizes := make([]int64, len(tensors))
	var off int64
	for i := range tensors {
		t := &tensors[i]
		n, err := t.Size()
		if err != nil {
			return err
		}
		sizes[i] = n
		c.str(t.Name)
		c.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			c.u64(d)
		}
		c.u32(uint32(t.Type))
		c.u64(uint64(off))
		off = alignUp(off+n, Alignment)
	}
	c.pad()
	for i := range tensors {
		start := c.n
		if err := data(i, c); err != nil {
			return fmt.Errorf("gguf: tensor %s: %w", tensors[i].Name, err)
		}
		if got := c.n - start; got != sizes[i] {
			return fmt.Errorf("gguf: tensor %s: wrote %d bytes, want %d", tensors[i].Name, got, sizes[i])
		}
		c.pad()
	}
	return c.w.Flush()
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

func writeValue(c *countWriter, v any) error {
	le := binary.LittleEndian
	switch v := v.(type) {
	case string:
		c.u32(tString)
		c.str(v)
	case bool:
		c.u32(tBool)
		b := byte(0)
		if v {
			b = 1
		}
		c.Write([]byte{b})
	case uint8:
		c.u32(tUint8)
		c.Write([]byte{v})
	case int8:
		c.u32(tInt8)
		c.Write([]byte{byte(v)})
	case uint16:
		c.u32(tUint16)
		binary.Write(c, le, v)
	case int16:
		c.u32(tInt16)
		binary.Write(c, le, v)
	case uint32:
		c.u32(tUint32)
		c.u32(v)
	case int32:
		c.u32(tInt32)
		binary.Write(c, le, v)
	case uint64:
		c.u32(tUint64)
		c.u64(v)
	case int64:
		c.u32(tInt64)
		binary.Write(c, le, v)
	case float32:
		c.u32(tFloat32)
		binary.Write(c, le, v)
	case float64:
		c.u32(tFloat64)
		binary.Write(c, le, v)
	case []string:
		c.u32(tArray)
		c.u32(tString)
		c.u64(uint64(len(v)))
		for _, s := range v {
			c.str(s)
		}
	case []int32:
		c.u32(tArray)
		c.u32(tInt32)
		c.u64(uint64(len(v)))
		binary.Write(c, le, v)
	case []uint32:
		c.u32(tArray)
		c.u32(tUint32)
		c.u64(uint64(len(v)))
		binary.Write(c, le, v)
	case []float32:
		c.u32(tArray)
		c.u32(tFloat32)
		c.u64(uint64(len(v)))
		binary.Write(c, le, v)
	default:
		return fmt.Errorf("unsupported value type %T", v)
	}
	return nil
}

// File is what Read finds in a GGUF file.
type File struct {
	Version uint32
	KV      []KV
	Tensors []Tensor
}

// Get returns the value of key, or nil.
func (f *File) Get(key string) any {
	for _, kv := range f.KV {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// Read parses the header of a GGUF file (metadata and tensor
// descriptions, with absolute offsets); size is the file's length, against
// which every length, count and tensor is checked. As llama.cpp does, it
// requires the tensors to follow each other in order, each aligned, so that
// no two share bytes.
func Read(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("gguf: negative file size %d", size)
	}
	d := &decoder{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: size}
	if m := d.bytes(4); d.err == nil && string(m) != Magic {
		return nil, fmt.Errorf("gguf: bad magic %q", m)
	}
	f := &File{Version: d.u32()}
	if d.err == nil && f.Version != 2 && f.Version != 3 {
		return nil, fmt.Errorf("gguf: version %d not supported", f.Version)
	}
	nt, nkv := d.u64(), d.u64()
	// A key takes at least 13 bytes (length, type, one byte of value) and a
	// tensor description 24 (name length, dimension count, type, offset).
	if d.err == nil && (nt > 1<<24 || nkv > 1<<24 || 24*nt+13*nkv > uint64(size-d.n)) {
		return nil, fmt.Errorf("gguf: %d tensors, %d keys: corrupt header (the file has %d bytes)", nt, nkv, size)
	}
	align := int64(Alignment)
	keys := map[string]bool{}
	for i := uint64(0); i < nkv && d.err == nil; i++ {
		k := d.str()
		v := d.value(d.u32())
		if d.err != nil {
			return nil, fmt.Errorf("gguf: header: key %q: %w", k, d.err)
		}
		if keys[k] {
			return nil, fmt.Errorf("gguf: key %q appears twice", k)
		}
		keys[k] = true
		f.KV = append(f.KV, KV{k, v})
		if k == "general.alignment" {
			// llama.cpp rejects any other alignment; silently using the
			// default would misplace every tensor.
			a, ok := v.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("gguf: general.alignment %v (%T) is not a power of two uint32", v, v)
			}
			align = int64(a)
		}
	}
	names := map[string]bool{}
	for i := uint64(0); i < nt && d.err == nil; i++ {
		t := Tensor{Name: d.str()}
		nd := d.u32()
		if nd > 8 {
			return nil, fmt.Errorf("gguf: tensor %s has %d dimensions", t.Name, nd)
		}
		for j := uint32(0); j < nd; j++ {
			t.Dims = append(t.Dims, d.u64())
		}
		t.Type = Type(d.u32())
		t.Offset = int64(d.u64())
		if d.err == nil && names[t.Name] {
			return nil, fmt.Errorf("gguf: tensor %s appears twice", t.Name)
		}
		names[t.Name] = true
		f.Tensors = append(f.Tensors, t)
	}
	if d.err != nil {
		return nil, fmt.Errorf("gguf: header: %w", d.err)
	}
	base := alignUp(d.n, align)
	var next int64 // where the next tensor must start, from base
	for i := range f.Tensors {
		t := &f.Tensors[i]
		n, err := t.Size()
		if err != nil {
			return nil, err
		}
		if t.Offset != next {
			return nil, fmt.Errorf("gguf: tensor %s at data offset %d, want %d (tensors follow each other in order, each aligned to %d)", t.Name, uint64(t.Offset), next, align)
		}
		t.Offset += base
		if t.Offset > size || n > size-t.Offset {
			return nil, fmt.Errorf("gguf: tensor %s of %d bytes at %d ends past the file's %d bytes", t.Name, n, t.Offset, size)
		}
		next = alignUp(next+n, align)
	}
	return f, nil
}

// decoder reads the header's values in order; n counts the bytes read and
// size is the file's, which bounds every length and count before anything
// is allocated for it.
type decoder struct {
	r    *bufio.Reader
	n    int64
	size int64
	err  error
}

func (d *decoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > 1<<30 || n > uint64(d.size-d.n) {
		d.err = fmt.Errorf("length %d at offset %d runs past the end of the file (%d bytes)", n, d.n, d.size)
		return nil
	}
	b := make([]byte, n)
	_, d.err = io.ReadFull(d.r, b)
	d.n += int64(n)
	return b
}

func (d *decoder) byte() byte {
	b := d.bytes(1)
	if d.err != nil {
		return 0
	}
	return b[0]
}

func (d *decoder) u32() uint32 {
	b := d.bytes(4)
	if d.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (d *decoder) u64() uint64 {
	b := d.bytes(8)
	if d.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

func (d *decoder) str() string { return string(d.bytes(d.u64())) }

func (d *decoder) value(t uint32) any {
	switch t {
	case tUint8:
		return d.byte()
	case tInt8:
		return int8(d.byte())
	case tUint16:
		return uint16(d.byte()) | uint16(d.byte())<<8
	case tInt16:
		return int16(uint16(d.byte()) | uint16(d.byte())<<8)
	case tUint32:
		return d.u32()
	case tInt32:
		return int32(d.u32())
	case tUint64:
		return d.u64()
	case tInt64:
		return int64(d.u64())
	case tFloat32:
		return math.Float32frombits(d.u32())
	case tFloat64:
		return math.Float64frombits(d.u64())
	case tBool:
		return d.byte() != 0
	case tString:
		return d.str()
	case tArray:
		et, n := d.u32(), d.u64()
		if d.err != nil {
			return nil
		}
		// The smallest an element can be, to bound n by the bytes left
		// before allocating n elements. Arrays of arrays are refused, as
		// llama.cpp does.
		var elem uint64
		switch et {
		case tUint8, tInt8, tBool:
			elem = 1
		case tUint16, tInt16:
			elem = 2
		case tUint32, tInt32, tFloat32:
			elem = 4
		case tUint64, tInt64, tFloat64, tString:
			elem = 8
		default:
			d.err = fmt.Errorf("array of unknown element type %d", et)
			return nil
		}
		if n > 1<<26 || n > uint64(d.size-d.n)/elem {
			d.err = fmt.Errorf("array of %d elements of type %d at offset %d runs past the end of the file (%d bytes)", n, et, d.n, d.size)
			return nil
		}
		switch et {
		case tString:
			v := make([]string, 0, n)
			for i := uint64(0); i < n && d.err == nil; i++ {
				v = append(v, d.str())
			}
			return v
		case tInt32:
			v := make([]int32, n)
			for i := range v {
				v[i] = int32(d.u32())
			}
			return v
		case tUint32:
			v := make([]uint32, n)
			for i := range v {
				v[i] = d.u32()
			}
			return v
		case tFloat32:
			v := make([]float32, n)
			for i := range v {
				v[i] = math.Float32frombits(d.u32())
			}
			return v
		default:
			v := make([]any, 0, n)
			for i := uint64(0); i < n && d.err == nil; i++ {
				v = append(v, d.value(et))
			}
			return v
		}
	}
	if d.err == nil {
		d.err = fmt.Errorf("unknown value type %d", t)
	}
	return nil
}
