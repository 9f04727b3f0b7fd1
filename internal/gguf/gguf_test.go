package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
)

// TestWriteRead writes metadata of every supported kind and tensors of
// every type, reads the file back, and compares everything, data included.
func TestWriteRead(t *testing.T) {
	kvs := []KV{
		{"general.architecture", "qwen3moe"},
		{"general.name", "t"},
		{"t.u8", uint8(7)}, {"t.i8", int8(-7)}, {"t.u16", uint16(700)}, {"t.i16", int16(-700)},
		{"t.u32", uint32(1 << 20)}, {"t.i32", int32(-5)}, {"t.u64", uint64(1 << 40)}, {"t.i64", int64(-1 << 40)},
		{"t.f32", float32(1e-6)}, {"t.f64", 0.25}, {"t.bool", true},
		{"t.strs", []string{"a", "", "ccc"}}, {"t.i32s", []int32{1, -2, 3}}, {"t.u32s", []uint32{4, 5}}, {"t.f32s", []float32{0.5, -1}},
	}
	tensors := []Tensor{
		{Name: "a", Type: F32, Dims: []uint64{3}},
		{Name: "b", Type: Q4_0, Dims: []uint64{64, 3}},
		{Name: "c", Type: Q8_0, Dims: []uint64{32, 2, 5}},
		{Name: "d", Type: F16, Dims: []uint64{5, 1}},
	}
	data := make([][]byte, len(tensors))
	for i := range tensors {
		n, err := tensors[i].Size()
		if err != nil {
			t.Fatal(err)
		}
		data[i] = make([]byte, n)
		for j := range data[i] {
			data[i][j] = byte(i*31 + j*7)
		}
	}
	// Sizes from the formats' definitions, not from Size.
	for i, want := range []int{12, 3 * 2 * 18, 10 * 34, 10} {
		if len(data[i]) != want {
			t.Fatalf("tensor %s: %d bytes, want %d", tensors[i].Name, len(data[i]), want)
		}
	}
	var buf bytes.Buffer
	err := Write(&buf, kvs, tensors, func(i int, w io.Writer) error {
		_, err := w.Write(data[i])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if string(b[:4]) != "GGUF" || binary.LittleEndian.Uint32(b[4:]) != 3 {
		t.Fatalf("header %q", b[:8])
	}
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.KV, kvs) {
		t.Fatalf("metadata:\n got %v\nwant %v", f.KV, kvs)
	}
	if len(f.Tensors) != len(tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tensors))
	}
	for i, got := range f.Tensors {
		if got.Name != tensors[i].Name || got.Type != tensors[i].Type || !reflect.DeepEqual(got.Dims, tensors[i].Dims) {
			t.Fatalf("tensor %d: %+v, want %+v", i, got, tensors[i])
		}
		if got.Offset%Alignment != 0 {
			t.Fatalf("tensor %s at %d, not aligned", got.Name, got.Offset)
		}
		if !bytes.Equal(b[got.Offset:got.Offset+int64(len(data[i]))], data[i]) {
			t.Fatalf("tensor %s: data differs", got.Name)
		}
	}
	// A short data callback is an error, not a corrupt file.
	err = Write(io.Discard, nil, tensors[:1], func(int, io.Writer) error { return nil })
	if err == nil {
		t.Fatal("short tensor data accepted")
	}
	last := f.Tensors[len(f.Tensors)-1]
	cut := last.Offset + int64(len(data[len(data)-1])) - 1
	if _, err := Read(bytes.NewReader(b[:cut]), cut); err == nil {
		t.Fatal("truncated file accepted")
	}
	if _, err := Read(bytes.NewReader(b[:40]), 40); err == nil {
		t.Fatal("truncated header accepted")
	}
}

// TestQuantRoundTrip: values on a block's grid survive quantisation
// exactly, in both types; others within half a step.
func TestQuantRoundTrip(t *testing.T) {
	src := make([]float32, 2*BlockSize)
	for i := range src {
		src[i] = float32((i*5)%16-8) * 0.25 // includes -8·0.25, so d = 0.25
	}
	q := make([]byte, 2*18)
	QuantizeQ4_0(q, src)
	got := make([]float32, len(src))
	DequantizeQ4_0(got, q)
	if !reflect.DeepEqual(got, src) {
		t.Fatalf("Q4_0: %v, want %v", got, src)
	}
	if q[2] != byte(0|((16*5)%16)<<4) {
		t.Fatalf("Q4_0 byte 0 = %#x: element 0 low nibble, element 16 high", q[2])
	}
	q8 := make([]byte, 2*34)
	QuantizeQ8_0(q8, src)
	DequantizeQ8_0(got, q8)
	for i := range src {
		if d := math.Abs(float64(got[i] - src[i])); d > 2.0/127/2+1e-6 {
			t.Fatalf("Q8_0 [%d]: %v, want %v", i, got[i], src[i])
		}
	}
}

// TestMXFP4Block: PutMXFP4 puts value j's code in byte j's low nibble and
// value j+16's in its high one, after the scale byte, and DequantizeMXFP4
// gives E2M1(code)·2^(e−127) back: the layout and values of ggml's
// block_mxfp4 (its table holds the E2M1 values doubled, its scale
// 2^(e−128)).
func TestMXFP4Block(t *testing.T) {
	var codes [BlockSize]byte
	for i := range codes {
		codes[i] = byte(i*7) % 16
	}
	b := make([]byte, 17)
	PutMXFP4(b, &codes, 120)
	if b[0] != 120 || b[1] != codes[0]|codes[16]<<4 || b[16] != codes[15]|codes[31]<<4 {
		t.Fatalf("block bytes % x", b)
	}
	e2m1x2 := []float32{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	got := make([]float32, BlockSize)
	DequantizeMXFP4(got, b)
	for i, c := range codes {
		if want := e2m1x2[c] * float32(math.Ldexp(1, 120-128)); got[i] != want {
			t.Fatalf("value %d (code %d): %v, want %v", i, c, got[i], want)
		}
	}
	if n, err := MXFP4.RowBytes(64); err != nil || n != 34 {
		t.Fatalf("MXFP4 row of 64: %d bytes, %v", n, err)
	}
}

// TestLlamaReader reads a written file with llama.cpp's own Python reader
// (gguf-py), when SLUICE_GGUF_PY names its directory and python3 (or
// SLUICE_PYTHON) has numpy.
func TestLlamaReader(t *testing.T) {
	dir := os.Getenv("SLUICE_GGUF_PY")
	if dir == "" {
		t.Skip("SLUICE_GGUF_PY not set (a llama.cpp checkout's gguf-py directory)")
	}
	path := filepath.Join(t.TempDir(), "t.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float32, 64*2)
	for i := range vals {
		vals[i] = float32(i%16-8) * 0.5
	}
	tensors := []Tensor{{Name: "w", Type: Q4_0, Dims: []uint64{64, 2}}, {Name: "n", Type: F32, Dims: []uint64{4}}}
	err = Write(f, []KV{{"general.architecture", "llama"}, {"llama.block_count", uint32(3)}, {"x.list", []string{"p", "q"}}}, tensors, func(i int, w io.Writer) error {
		if i == 0 {
			q := make([]byte, 4*18)
			QuantizeQ4_0(q, vals)
			_, err := w.Write(q)
			return err
		}
		return binary.Write(w, binary.LittleEndian, []float32{1, 2, 3, 4})
	})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	script := `
import sys
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
f = r.fields
print(bytes(f["general.architecture"].parts[-1]).decode(), int(f["llama.block_count"].parts[-1][0]))
for t in r.tensors:
    v = dequantize(t.data, t.tensor_type).flatten()
    print(t.name, t.tensor_type.name, list(map(int, t.shape)), " ".join("%g" % x for x in v[:20]))
`
	py := os.Getenv("SLUICE_PYTHON") // a python3 with numpy
	if py == "" {
		py = "python3"
	}
	cmd := exec.Command(py, "-c", script, path)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Skipf("gguf-py unusable here: %v\n%s", err, out)
	}
	var want bytes.Buffer
	fmt.Fprintln(&want, "llama 3")
	fmt.Fprint(&want, "w Q4_0 [64, 2]")
	for _, v := range vals[:20] {
		fmt.Fprintf(&want, " %g", v)
	}
	fmt.Fprintln(&want)
	fmt.Fprintln(&want, "n F32 [4] 1 2 3 4")
	if string(out) != want.String() {
		t.Fatalf("gguf-py read:\n%s\nwant:\n%s", out, want.String())
	}
}
