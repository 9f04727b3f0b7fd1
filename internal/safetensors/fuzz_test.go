package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"unsafe"
)

// FuzzParse feeds arbitrary bytes to the header parser as one shard and
// checks that it never panics, never allocates far more than the input, and
// that whatever it accepts is consistent: every tensor's bytes lie in the
// file's data section, match its dtype and shape, and overlap no other
// tensor's.
func FuzzParse(f *testing.F) {
	seeds := []map[string]rawTensor{
		{"w": {DType: "BF16", Shape: []int{4, 8}, Data: make([]byte, 64)}, "v": {DType: "F32", Shape: []int{3}, Data: f32s(1, 2, 3)}},
		{"s": {DType: "F32", Shape: []int{}, Data: f32s(7)}, "e": {DType: "F16", Shape: []int{0, 5}}},
		{"q": {DType: "U32", Shape: []int{2, 2}, Data: make([]byte, 16)}, "b": {DType: "I8", Shape: []int{3}, Data: []byte{1, 2, 3}}, "f": {DType: "F8_E4M3", Shape: []int{2}, Data: []byte{1, 2}}},
	}
	dir := f.TempDir()
	for i, s := range seeds {
		p := filepath.Join(dir, "seed"+string(rune('0'+i)))
		writeSafetensors(f, p, s)
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	hdr := func(h string) []byte { return append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...) }
	f.Add(append(hdr(`{"a":{"dtype":"BF16","shape":[-1,-2],"data_offsets":[0,4]}}`), make([]byte, 4)...))
	f.Add(append(hdr(`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`), make([]byte, 4)...))
	f.Add(append(hdr(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`), make([]byte, 8)...))
	f.Add(append(hdr(`{"a":{"dtype":"XX","shape":[4],"data_offsets":[0,4]}}`), make([]byte, 4)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		c := &Checkpoint{Tensors: map[string]*Tensor{}}
		err := c.parse("fuzz.safetensors", data)
		runtime.ReadMemStats(&ms)
		if got, limit := ms.TotalAlloc-before, uint64(1<<20+64*len(data)); got > limit {
			t.Fatalf("parsing %d bytes allocated %d bytes", len(data), got)
		}
		if err != nil {
			return
		}
		checkTensors(t, data, c)
	})
}

// checkTensors checks every tensor parse accepted from data.
func checkTensors(t *testing.T, data []byte, c *Checkpoint) {
	t.Helper()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	body := int64(8 + binary.LittleEndian.Uint64(data))
	type span struct{ lo, hi int64 }
	var spans []span
	for name, tn := range c.Tensors {
		if tn.Name != name {
			t.Fatalf("tensor %q named %q", name, tn.Name)
		}
		bits, ok := dtypeBits[tn.DType]
		if !ok {
			t.Fatalf("tensor %s: dtype %q accepted", name, tn.DType)
		}
		elems := int64(1)
		for _, d := range tn.Shape {
			if d < 0 {
				t.Fatalf("tensor %s: shape %v accepted", name, tn.Shape)
			}
			elems *= int64(d)
		}
		if int64(len(tn.Data))*8 != elems*bits {
			t.Fatalf("tensor %s: %s %v in %d bytes", name, tn.DType, tn.Shape, len(tn.Data))
		}
		if len(tn.Data) == 0 {
			continue
		}
		lo := int64(uintptr(unsafe.Pointer(unsafe.SliceData(tn.Data))) - base)
		hi := lo + int64(len(tn.Data))
		if lo < body || hi > int64(len(data)) {
			t.Fatalf("tensor %s: bytes [%d, %d) outside the data section [%d, %d)", name, lo, hi, body, len(data))
		}
		spans = append(spans, span{lo, hi})
		if tn.DType == "BF16" || tn.DType == "F16" || tn.DType == "F32" {
			if _, err := tn.Float32(); err != nil {
				t.Fatalf("tensor %s: Float32: %v", name, err)
			}
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			t.Fatalf("tensors overlap: %v", spans)
		}
	}
}

// FuzzOpenDir runs the same checks through OpenDir on a real file, so the
// mapping and the file-size checks are covered too.
func FuzzOpenDir(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "model.safetensors")
	writeSafetensors(f, p, map[string]rawTensor{"w": {DType: "BF16", Shape: []int{2, 2}, Data: make([]byte, 8)}})
	b, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		ck, err := OpenDir(dir)
		if err != nil {
			return
		}
		defer ck.Close()
		// The map is a different copy of the file; compare contents only.
		for name, tn := range ck.Tensors {
			if int64(len(tn.Data)) > int64(len(data)) {
				t.Fatalf("tensor %s: %d bytes from a %d-byte file", name, len(tn.Data), len(data))
			}
		}
	})
}
