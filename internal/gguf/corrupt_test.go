package gguf

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// header is the start of a version 3 file with nt tensors and nkv keys.
func header(nt, nkv uint64) []byte { return le("GGUF", uint32(3), nt, nkv) }

// info is one tensor description.
func info(name string, typ Type, off uint64, dims ...uint64) []byte {
	b := le(uint64(len(name)), name, uint32(len(dims)))
	for _, d := range dims {
		b = le(b, d)
	}
	return le(b, uint32(typ), off)
}

// withData pads a header to the alignment and appends n bytes of data.
func withData(b []byte, n int) []byte {
	for len(b)%Alignment != 0 {
		b = append(b, 0)
	}
	return append(b, make([]byte, n)...)
}

// readErr reads b and requires an error containing every want string,
// without allocating more than 16 MiB on the way.
func readErr(t *testing.T, b []byte, want ...string) {
	t.Helper()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	_, err := Read(bytes.NewReader(b), int64(len(b)))
	runtime.ReadMemStats(&ms)
	if got := ms.TotalAlloc - before; got > 16<<20 {
		t.Errorf("reading %d bytes allocated %d MiB", len(b), got>>20)
	}
	if err == nil {
		t.Fatalf("Read accepted the file")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// TestCorruptFiles are corrupt files, each the smallest showing one way
// Read once failed: a huge allocation before finding the file too short,
// or a silent acceptance. All must now be errors that say what is wrong.
func TestCorruptFiles(t *testing.T) {
	for _, c := range []struct {
		name string
		b    []byte
		want []string
	}{
		{"bad-magic", le("GGUX", uint32(3), uint64(0), uint64(0)), []string{"magic"}},
		{"bad-version", le("GGUF", uint32(1), uint64(0), uint64(0)), []string{"version 1"}},
		{"truncated", le("GGUF", uint32(3), uint64(0)), []string{"header"}},
		// Counts the file cannot hold are refused before the loops.
		{"tensor-count-huge", header(1<<24, 0), []string{"16777216 tensors"}},
		{"key-count-past-end", header(0, 100), []string{"100 keys"}},
		// A key length of 2^29 allocated 512 MiB before reading past the end.
		{"string-past-end", le(header(0, 1), uint64(1<<29), "kkkkkkkkkkkkkkkk"), []string{"536870912", "past the end"}},
		{"value-string-past-end", le(header(0, 1), uint64(1), "k", uint32(tString), uint64(1<<29)), []string{`key "k"`, "past the end"}},
		// Counts under the 2^26 cap allocated up to 1 GiB ([]any of 2^26).
		{"array-past-end", le(header(0, 1), uint64(1), "k", uint32(tArray), uint32(tUint8), uint64(1<<26)), []string{`key "k"`, "67108864 elements"}},
		{"int32-array-past-end", le(header(0, 1), uint64(1), "k", uint32(tArray), uint32(tInt32), uint64(1<<26-1), uint64(0)), []string{`key "k"`, "past the end"}},
		{"string-array-past-end", le(header(0, 1), uint64(1), "k", uint32(tArray), uint32(tString), uint64(1<<20), uint64(0)), []string{`key "k"`, "past the end"}},
		// An empty array of an unknown or nested type was accepted.
		{"array-unknown-type", le(header(0, 1), uint64(1), "k", uint32(tArray), uint32(99), uint64(0)), []string{`key "k"`, "type 99"}},
		{"array-of-arrays", le(header(0, 1), uint64(1), "k", uint32(tArray), uint32(tArray), uint64(0)), []string{`key "k"`, "type 9"}},
		{"unknown-value-type", le(header(0, 1), uint64(1), "k", uint32(42), uint64(0)), []string{`key "k"`, "type 42"}},
		{"duplicate-key", le(header(0, 2), uint64(1), "k", uint32(tUint32), uint32(1), uint64(1), "k", uint32(tUint32), uint32(2)), []string{`"k"`, "twice"}},
		// A bad alignment was ignored (wrong type, zero) or used (3).
		{"alignment-zero", le(header(0, 1), uint64(17), "general.alignment", uint32(tUint32), uint32(0)), []string{"general.alignment", "power of two"}},
		{"alignment-odd", le(header(0, 1), uint64(17), "general.alignment", uint32(tUint32), uint32(3)), []string{"general.alignment", "power of two"}},
		{"alignment-type", le(header(0, 1), uint64(17), "general.alignment", uint32(tUint64), uint64(64)), []string{"general.alignment", "uint64"}},
		// 2^62 × 4 F32 elements is 2^64 bytes, which wrapped to 0.
		{"dims-overflow", withData(le(header(1, 0), info("w", F32, 0, 1<<62, 4)), 0), []string{"tensor w", "overflow"}},
		{"dims-product-overflow", withData(le(header(1, 0), info("w", F32, 0, 4, 1<<40, 1<<40)), 0), []string{"tensor w", "overflow"}},
		{"dims-negative-int", withData(le(header(1, 0), info("w", F16, 0, 1<<63)), 0), []string{"tensor w", "overflow"}},
		// Offsets overlapping, misaligned or wrapping were accepted.
		{"offsets-overlap", withData(le(header(2, 0), info("a", F32, 0, 8), info("b", F32, 0, 8)), 64), []string{"tensor b", "offset 0, want 32"}},
		{"offset-misaligned", withData(le(header(1, 0), info("a", F32, 4, 2)), 64), []string{"tensor a", "offset 4, want 0"}},
		{"offset-wraps", withData(le(header(1, 0), info("a", F32, 1<<64-64, 2)), 64), []string{"tensor a", "18446744073709551552"}},
		{"offset-past-end", withData(le(header(1, 0), info("a", F32, 0, 9)), 32), []string{"tensor a", "past the file"}},
		{"unknown-tensor-type", withData(le(header(1, 0), info("a", 99, 0, 32)), 64), []string{"tensor a", "type(99)"}},
		{"duplicate-tensor", withData(le(header(2, 0), info("a", F32, 0, 8), info("a", F32, 32, 8)), 64), []string{"tensor a", "twice"}},
		{"too-many-dims", withData(le(header(1, 0), info("a", F32, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1)), 64), []string{"tensor a", "9 dimensions"}},
	} {
		t.Run(c.name, func(t *testing.T) { readErr(t, c.b, c.want...) })
	}
}

// TestMinimalFileAccepted: the hand-built files above differ from a valid
// one only in what each breaks.
func TestMinimalFileAccepted(t *testing.T) {
	b := withData(le(header(2, 1), uint64(17), "general.alignment", uint32(tUint32), uint32(32), info("a", F32, 0, 8), info("b", F32, 32, 8, 1)), 64)
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 2 || f.Tensors[1].Offset != f.Tensors[0].Offset+32 {
		t.Fatalf("tensors %+v", f.Tensors)
	}
}
