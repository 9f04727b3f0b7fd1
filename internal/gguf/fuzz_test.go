package gguf

import (
	"bytes"
	"encoding/binary"
	"io"
	"runtime"
	"testing"
)

// writeFile builds a GGUF file in memory with tensors whose data is a
// counting pattern.
func writeFile(t testing.TB, kvs []KV, tensors []Tensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	err := Write(&buf, kvs, tensors, func(i int, w io.Writer) error {
		n, err := tensors[i].Size()
		if err != nil {
			return err
		}
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i + j)
		}
		_, err = w.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzRead feeds arbitrary bytes to Read and checks that it never panics,
// never allocates far more than the input, and that whatever it accepts is
// consistent: every tensor has a size, lies after the header and inside the
// file, is aligned, and shares no byte with another.
func FuzzRead(f *testing.F) {
	f.Add(writeFile(f, []KV{{"general.architecture", "llama"}, {"a", []string{"x", "yy"}}, {"b", []int32{1, 2}}, {"c", uint16(3)}},
		[]Tensor{{Name: "w", Type: Q4_0, Dims: []uint64{32, 2}}, {Name: "n", Type: F32, Dims: []uint64{3}}}))
	f.Add(writeFile(f, []KV{{"general.alignment", uint32(64)}, {"f", []float32{1}}, {"u", []uint32{}}},
		[]Tensor{{Name: "h", Type: F16, Dims: []uint64{5, 1, 2}}, {Name: "q", Type: Q8_0, Dims: []uint64{64}}}))
	f.Add(writeFile(f, nil, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		g, err := Read(bytes.NewReader(data), int64(len(data)))
		runtime.ReadMemStats(&ms)
		// The bufio reader's 64 KiB, then what the header's values take
		// (an []any of bytes takes 16 per byte).
		if got, limit := ms.TotalAlloc-before, uint64(1<<20+64*len(data)); got > limit {
			t.Fatalf("reading %d bytes allocated %d bytes", len(data), got)
		}
		if err != nil {
			return
		}
		align := int64(Alignment)
		if a, ok := g.Get("general.alignment").(uint32); ok {
			align = int64(a)
		}
		end := int64(0)
		for _, tn := range g.Tensors {
			n, err := tn.Size()
			if err != nil {
				t.Fatalf("tensor %s accepted without a size: %v", tn.Name, err)
			}
			if tn.Offset%align != 0 || tn.Offset < end || n < 0 || n > int64(len(data))-tn.Offset {
				t.Fatalf("tensor %s: %d bytes at %d (previous end %d, alignment %d, file %d bytes)", tn.Name, n, tn.Offset, end, align, len(data))
			}
			end = tn.Offset + n
		}
		if len(g.Tensors) > 0 && g.Tensors[0].Offset < 24 {
			t.Fatalf("tensor %s at %d, inside the header", g.Tensors[0].Name, g.Tensors[0].Offset)
		}
	})
}

// le builds little-endian test input from uint32 (4 bytes), uint64 (8),
// string (its bytes) and []byte values.
func le(vs ...any) []byte {
	var b []byte
	for _, v := range vs {
		switch v := v.(type) {
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, v)
		case string:
			b = append(b, v...)
		case []byte:
			b = append(b, v...)
		default:
			panic(v)
		}
	}
	return b
}
