package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// TestCorruptHeaders are the corrupt headers that OpenDir once accepted,
// each the smallest file showing it: every one must now be an error that
// names the file and what is wrong.
func TestCorruptHeaders(t *testing.T) {
	for _, c := range []struct {
		name, hdr string
		data      int // bytes of data after the header
		want      []string
	}{
		// An unknown dtype had no element size, so nothing checked its range.
		{"unknown-dtype", `{"a":{"dtype":"XX","shape":[4],"data_offsets":[0,4]}}`, 4, []string{"tensor a", `"XX"`}},
		{"missing-dtype", `{"a":{"shape":[4],"data_offsets":[0,4]}}`, 4, []string{"tensor a", "dtype"}},
		// Negative dimensions whose product matched the bytes: Elems() = 2.
		{"negative-shape", `{"a":{"dtype":"BF16","shape":[-1,-2],"data_offsets":[0,4]}}`, 4, []string{"tensor a", "[-1 -2]"}},
		// 2^62·4 elements of 4 bytes wrapped to 0 bytes and was accepted.
		{"shape-overflow", `{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, 0, []string{"tensor a", "too large"}},
		{"shape-overflow-bytes", `{"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}}`, 0, []string{"tensor a", "too large"}},
		{"overlap", `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8, []string{"overlap", "a", "b"}},
		{"same-range", `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}`, 4, []string{"overlap"}},
		// json.Unmarshal into a map kept the last of two descriptions.
		{"duplicate-key", `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}`, 8, []string{`"a"`, "twice"}},
		// A fixed-size [2]int64 ignored a third offset and zeroed a missing one.
		{"three-offsets", `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4,8]}}`, 8, []string{"tensor a", "data_offsets"}},
		{"one-offset", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[0]}}`, 0, []string{"tensor a", "data_offsets"}},
		{"no-offsets", `{"a":{"dtype":"U8","shape":[0]}}`, 0, []string{"tensor a", "data_offsets"}},
		// A missing shape read as a scalar.
		{"missing-shape", `{"a":{"dtype":"F32","data_offsets":[0,4]}}`, 4, []string{"tensor a", "shape"}},
		{"null-shape", `{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, 4, []string{"tensor a", "shape"}},
		// A null header was an empty, valid checkpoint.
		{"null-header", `null`, 0, []string{"bad header"}},
		{"array-header", `[]`, 0, []string{"bad header"}},
		{"trailing-garbage", `{}x`, 0, []string{"bad header"}},
		{"sub-byte-dtype", `{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, 1, []string{"tensor a", "whole number of bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			b := binary.LittleEndian.AppendUint64(nil, uint64(len(c.hdr)))
			b = append(b, c.hdr...)
			b = append(b, make([]byte, c.data)...)
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			openErr(t, dir, append([]string{"model.safetensors"}, c.want...)...)
		})
	}
}

// TestHeaderStillAccepted: the stricter header checks keep what the format
// allows: white space after the object, empty and scalar tensors, adjacent
// and empty ranges, and every dtype of the format.
func TestHeaderStillAccepted(t *testing.T) {
	hdr := `{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},` +
		`"e":{"dtype":"F16","shape":[0,3],"data_offsets":[4,4]},"s":{"dtype":"F64","shape":[],"data_offsets":[4,12]},` +
		`"f":{"dtype":"F4","shape":[2,2],"data_offsets":[12,14]},"z":{"dtype":"BOOL","shape":[0],"data_offsets":[2,2]}}` + " \n\t "
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(append(b, hdr...), make([]byte, 14)...)
	c := &Checkpoint{Tensors: map[string]*Tensor{}}
	if err := c.parse("x.safetensors", b); err != nil {
		t.Fatal(err)
	}
	if len(c.Tensors) != 5 || len(c.Tensors["s"].Data) != 8 || len(c.Tensors["f"].Data) != 2 {
		t.Fatalf("tensors %v", c.Names())
	}
}

// TestFloat32ShortData: a hand-built Tensor whose data is shorter than its
// shape, or whose shape is negative, is an error, not an index panic.
func TestFloat32ShortData(t *testing.T) {
	for _, tn := range []*Tensor{
		{Name: "short", DType: "F32", Shape: []int{3}, Data: make([]byte, 8)},
		{Name: "long", DType: "BF16", Shape: []int{1}, Data: make([]byte, 4)},
		{Name: "neg", DType: "F16", Shape: []int{-2}, Data: nil},
	} {
		if _, err := tn.Float32(); err == nil {
			t.Errorf("%s: Float32 of %v with %d bytes succeeded", tn.Name, tn.Shape, len(tn.Data))
		}
	}
}
