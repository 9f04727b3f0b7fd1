package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// rawTensor is one tensor to write: dtype, shape and its raw little-endian
// bytes. Offsets, when set, override the data_offsets written to the header
// (to build malformed files); the data is still appended.
type rawTensor struct {
	DType   string
	Shape   []int
	Data    []byte
	Offsets *[2]int64
}

// writeSafetensors writes a safetensors file: an 8-byte little-endian header
// length, the JSON header (padded with spaces to a multiple of 8, as the
// reference writer does), then the tensors' bytes in name order.
func writeSafetensors(t testing.TB, path string, ts map[string]rawTensor) {
	t.Helper()
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var body []byte
	for _, n := range names {
		r := ts[n]
		off := [2]int64{int64(len(body)), int64(len(body) + len(r.Data))}
		if r.Offsets != nil {
			off = *r.Offsets
		}
		shape := r.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[n] = map[string]any{"dtype": r.DType, "shape": shape, "data_offsets": off}
		body = append(body, r.Data...)
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	out = append(out, hb...)
	out = append(out, body...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func u16s(v ...uint16) []byte {
	b := make([]byte, 0, 2*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint16(b, x)
	}
	return b
}

func f32s(v ...float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func TestRoundTripDTypes(t *testing.T) {
	dir := t.TempDir()
	bf := []uint16{0x3f80, 0xc020, 0x0000, 0x8000, 0x7f80, 0xff80, 0x3e20, 0x0001} // 1, -2.5, +0, -0, +inf, -inf, 0.15625, smallest bf16 subnormal
	bfWant := []float32{1, -2.5, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 0.15625, math.Float32frombits(0x00010000)}
	hf := []uint16{0x3c00, 0xc100, 0x0001, 0x8000, 0x7bff, 0x7c00}
	hfWant := []float32{1, -2.5, float32(math.Ldexp(1, -24)), float32(math.Copysign(0, -1)), 65504, float32(math.Inf(1))}
	f32Want := []float32{3.14159, -1e-40, math.MaxFloat32, float32(math.Copysign(0, -1)), 1e-3, 42}
	writeSafetensors(t, filepath.Join(dir, "model.safetensors"), map[string]rawTensor{
		"a.bf16": {DType: "BF16", Shape: []int{2, 4}, Data: u16s(bf...)},
		"b.f16":  {DType: "F16", Shape: []int{3, 2}, Data: u16s(hf...)},
		"c.f32":  {DType: "F32", Shape: []int{6}, Data: f32s(f32Want...)},
		"d.i8":   {DType: "I8", Shape: []int{4}, Data: []byte{1, 2, 3, 4}},
		"e.one":  {DType: "F32", Shape: []int{}, Data: f32s(7)},
	})
	ck, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if got, want := ck.Names(), []string{"a.bf16", "b.f16", "c.f32", "d.i8", "e.one"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	check := func(name, dtype string, shape []int, want []float32) {
		t.Helper()
		tn := ck.Tensors[name]
		if tn.DType != dtype || !slices.Equal(tn.Shape, shape) || tn.Name != name {
			t.Fatalf("%s: got name %q dtype %s shape %v, want %s %v", name, tn.Name, tn.DType, tn.Shape, dtype, shape)
		}
		if tn.Elems() != len(want) {
			t.Fatalf("%s: Elems() = %d, want %d", name, tn.Elems(), len(want))
		}
		got, err := tn.Float32()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Errorf("%s[%d] = %g (%#08x), want %g (%#08x)", name, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
	check("a.bf16", "BF16", []int{2, 4}, bfWant)
	check("b.f16", "F16", []int{3, 2}, hfWant)
	check("c.f32", "F32", []int{6}, f32Want)
	check("e.one", "F32", []int{}, []float32{7})
	if _, err := ck.Tensors["d.i8"].Float32(); err == nil || !strings.Contains(err.Error(), "I8") || !strings.Contains(err.Error(), "d.i8") {
		t.Errorf("Float32 of an I8 tensor: err = %v, want an error naming the tensor and dtype", err)
	}
	if err := ck.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestShardedIndex(t *testing.T) {
	dir := t.TempDir()
	writeSafetensors(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), map[string]rawTensor{
		"x": {DType: "F32", Shape: []int{2}, Data: f32s(1, 2)},
	})
	writeSafetensors(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), map[string]rawTensor{
		"y": {DType: "BF16", Shape: []int{1}, Data: u16s(0x4040)},
	})
	// A stray file beside an index must be ignored: the index is authoritative.
	writeSafetensors(t, filepath.Join(dir, "stray.safetensors"), map[string]rawTensor{
		"z": {DType: "F32", Shape: []int{1}, Data: f32s(9)},
	})
	writeIndex(t, dir, map[string]string{"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"})
	ck, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if got := ck.Names(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("Names() = %v, want [x y]", got)
	}
	y, err := ck.Tensors["y"].Float32()
	if err != nil || len(y) != 1 || y[0] != 3 {
		t.Fatalf("y = %v, %v; want [3]", y, err)
	}
	if !strings.HasSuffix(ck.Tensors["y"].File, "model-00002-of-00002.safetensors") {
		t.Errorf("y.File = %s", ck.Tensors["y"].File)
	}

	// Without an index every *.safetensors file is read.
	os.Remove(filepath.Join(dir, "model.safetensors.index.json"))
	ck2, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck2.Close()
	if got := ck2.Names(); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("without index Names() = %v, want [x y z]", got)
	}
}

func writeIndex(t testing.TB, dir string, wm map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// openErr opens dir and requires an error containing every want string.
func openErr(t *testing.T, dir string, want ...string) {
	t.Helper()
	ck, err := OpenDir(dir)
	if err == nil {
		ck.Close()
		t.Fatalf("OpenDir(%s) succeeded, want an error", dir)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("OpenDir error %q does not mention %q", err, w)
		}
	}
}

func TestTruncatedSharedShard(t *testing.T) {
	src := filepath.Join("..", "..", "..", "shared", "models", "tiny-qwen3-moe", "model-00001-of-00004.safetensors")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("shared model not available: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	openErr(t, dir, "model.safetensors", "outside")
}

func TestMalformedFiles(t *testing.T) {
	good := map[string]rawTensor{
		"w": {DType: "BF16", Shape: []int{4, 8}, Data: make([]byte, 64)},
		"v": {DType: "F32", Shape: []int{3}, Data: make([]byte, 12)},
	}
	write := func(t *testing.T, ts map[string]rawTensor) (string, string) {
		dir := t.TempDir()
		p := filepath.Join(dir, "model.safetensors")
		writeSafetensors(t, p, ts)
		return dir, p
	}
	t.Run("control", func(t *testing.T) {
		dir, _ := write(t, good)
		ck, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	})
	t.Run("truncated-half", func(t *testing.T) {
		dir, p := write(t, good)
		b, _ := os.ReadFile(p)
		// Cut inside the data: the header survives, the offsets do not fit.
		hlen := binary.LittleEndian.Uint64(b)
		cut := int(8+hlen) + 40
		if err := os.WriteFile(p, b[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		openErr(t, dir, "outside")
	})
	t.Run("truncated-header", func(t *testing.T) {
		dir, p := write(t, good)
		b, _ := os.ReadFile(p)
		os.WriteFile(p, b[:len(b)/4], 0o644)
		openErr(t, dir, "header length")
	})
	t.Run("shorter-than-length-prefix", func(t *testing.T) {
		dir, p := write(t, good)
		os.WriteFile(p, []byte{1, 2, 3}, 0o644)
		openErr(t, dir, "truncated")
	})
	t.Run("empty-file", func(t *testing.T) {
		dir, p := write(t, good)
		os.WriteFile(p, nil, 0o644)
		openErr(t, dir, "truncated")
	})
	t.Run("header-length-beyond-file", func(t *testing.T) {
		dir, p := write(t, good)
		b, _ := os.ReadFile(p)
		binary.LittleEndian.PutUint64(b, uint64(len(b)))
		os.WriteFile(p, b, 0o644)
		openErr(t, dir, "header length")
	})
	t.Run("header-length-huge", func(t *testing.T) {
		dir, p := write(t, good)
		b, _ := os.ReadFile(p)
		binary.LittleEndian.PutUint64(b, math.MaxUint64)
		os.WriteFile(p, b, 0o644)
		openErr(t, dir, "header length")
	})
	t.Run("bad-json", func(t *testing.T) {
		dir, p := write(t, good)
		b, _ := os.ReadFile(p)
		b[8] = '['
		os.WriteFile(p, b, 0o644)
		openErr(t, dir, "bad header")
	})
	t.Run("offsets-past-end", func(t *testing.T) {
		ts := map[string]rawTensor{
			"w": good["w"],
			"v": {DType: "F32", Shape: []int{3}, Data: make([]byte, 12), Offsets: &[2]int64{64, 64 + 12 + 4}},
		}
		dir, _ := write(t, ts)
		openErr(t, dir, "v", "offsets")
	})
	t.Run("offsets-reversed", func(t *testing.T) {
		ts := map[string]rawTensor{
			"w": {DType: "BF16", Shape: []int{0}, Data: make([]byte, 64), Offsets: &[2]int64{10, 4}},
		}
		dir, _ := write(t, ts)
		openErr(t, dir, "w", "offsets")
	})
	t.Run("offsets-negative", func(t *testing.T) {
		ts := map[string]rawTensor{
			"w": {DType: "BF16", Shape: []int{2}, Data: make([]byte, 4), Offsets: &[2]int64{-4, 0}},
		}
		dir, _ := write(t, ts)
		openErr(t, dir, "w", "offsets")
	})
	t.Run("shape-bytes-mismatch", func(t *testing.T) {
		ts := map[string]rawTensor{
			"w": {DType: "BF16", Shape: []int{4, 9}, Data: make([]byte, 64)},
		}
		dir, _ := write(t, ts)
		openErr(t, dir, "w", "[4 9]", "72", "64")
	})
	t.Run("f32-shape-bytes-mismatch", func(t *testing.T) {
		ts := map[string]rawTensor{
			"v": {DType: "F32", Shape: []int{3}, Data: make([]byte, 6)},
		}
		dir, _ := write(t, ts)
		openErr(t, dir, "v", "[3]")
	})
	t.Run("bad-entry", func(t *testing.T) {
		dir, p := write(t, good)
		hdr := `{"w":{"dtype":"BF16","shape":"oops","data_offsets":[0,0]}}`
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		os.WriteFile(p, append(out, hdr...), 0o644)
		openErr(t, dir, "w")
	})
	t.Run("duplicate-across-shards", func(t *testing.T) {
		dir := t.TempDir()
		writeSafetensors(t, filepath.Join(dir, "a.safetensors"), good)
		writeSafetensors(t, filepath.Join(dir, "b.safetensors"), map[string]rawTensor{"w": good["w"]})
		openErr(t, dir, "w", "twice")
	})
}

func TestMissing(t *testing.T) {
	t.Run("no-dir", func(t *testing.T) {
		openErr(t, filepath.Join(t.TempDir(), "nope"), "nope")
	})
	t.Run("empty-dir", func(t *testing.T) {
		openErr(t, t.TempDir(), "safetensors")
	})
	t.Run("index-missing-shard", func(t *testing.T) {
		dir := t.TempDir()
		writeSafetensors(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), map[string]rawTensor{
			"x": {DType: "F32", Shape: []int{1}, Data: f32s(1)},
		})
		writeIndex(t, dir, map[string]string{"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"})
		openErr(t, dir, "model-00002-of-00002.safetensors")
	})
	t.Run("index-empty", func(t *testing.T) {
		dir := t.TempDir()
		writeSafetensors(t, filepath.Join(dir, "model.safetensors"), map[string]rawTensor{
			"x": {DType: "F32", Shape: []int{1}, Data: f32s(1)},
		})
		writeIndex(t, dir, map[string]string{})
		openErr(t, dir, "weight_map")
	})
	t.Run("index-bad-json", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte("{"), 0o644)
		openErr(t, dir, "index.json")
	})
}
