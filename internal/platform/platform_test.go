package platform

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"
)

func testFile(t *testing.T, n int) (string, []byte) {
	t.Helper()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	path := filepath.Join(t.TempDir(), "f.bin")
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, want
}

func TestMapFile(t *testing.T) {
	path, want := testFile(t, 3*4096+123)
	b, err := MapFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatal("mapped bytes differ from the file")
	}
	if err := Unmap(b); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	if _, err := MapFile(empty); err == nil {
		t.Fatal("mapping an empty file: no error")
	}
	if _, err := MapFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("mapping a missing file: no error")
	}
}

func TestAllocAligned(t *testing.T) {
	for _, n := range []int{1, 4096, 3*4096 + 5, 1 << 20} {
		b, err := Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != n || uintptr(unsafe.Pointer(&b[0]))%4096 != 0 {
			t.Fatalf("Alloc(%d): len %d at %p, want page-aligned", n, len(b), &b[0])
		}
		for i := range b {
			if b[i] != 0 {
				t.Fatalf("Alloc(%d): byte %d is %d, want zeroed memory", n, i, b[i])
			}
		}
		b[n-1] = 1 // writable
		if err := Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Alloc(0); err == nil {
		t.Fatal("Alloc(0): no error")
	}
}

// TestOpenUncached reads aligned blocks through the bypass (or the
// buffered fallback, which must say why) and checks the bytes.
func TestOpenUncached(t *testing.T) {
	path, want := testFile(t, 4*4096)
	f, direct, why, err := OpenUncached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !direct && why == "" {
		t.Fatal("buffered fallback without a reason")
	}
	if runtime.GOOS == "linux" && !direct {
		t.Logf("O_DIRECT refused on %s: %s", t.TempDir(), why) // tmpfs, some overlays
	}
	buf, err := Alloc(2 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(buf)
	if _, err := Pread(f, buf, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want[4096:3*4096]) {
		t.Fatal("read bytes differ from the file")
	}
	if _, err := Pread(f, buf, 3*4096); err == nil {
		t.Fatal("reading past the end: no error")
	}
	if _, _, _, err := OpenUncached(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("opening a missing file: no error")
	}
}

func TestAvailable(t *testing.T) {
	n, src := Available()
	if src == "" {
		t.Fatal("no description")
	}
	switch runtime.GOOS {
	case "linux", "darwin", "windows":
		if n <= 0 {
			t.Fatalf("Available = %d (%s), want a positive figure", n, src)
		}
	}
	t.Logf("%d bytes: %s", n, src)
}
