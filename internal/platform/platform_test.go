package platform

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
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

// TestLoadFile reads files below and above a huge page whole, releases
// them, refuses empty and missing files, and stops when cancelled.
func TestLoadFile(t *testing.T) {
	for _, n := range []int{5, 3*4096 + 123, 2<<20 + 77, 9 << 20} {
		path, want := testFile(t, n)
		var last int64
		b, huge, err := LoadFile(context.Background(), path, func(done, total int64) {
			if total != int64(n) || done <= last || done > total {
				t.Errorf("progress %d of %d after %d, file of %d", done, total, last, n)
			}
			last = done
		})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("%d bytes: loaded bytes differ from the file", n)
		}
		if runtime.GOOS == "linux" {
			if last != int64(n) {
				t.Errorf("%d bytes: progress ended at %d", n, last)
			}
			if uintptr(unsafe.Pointer(&b[0]))%(2<<20) != 0 {
				t.Errorf("%d bytes at %p: not on a huge-page boundary", n, &b[0])
			}
			t.Logf("%d bytes: huge pages advised: %v", n, huge)
		}
		if err := Unmap(b); err != nil {
			t.Fatal(err)
		}
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	if _, _, err := LoadFile(context.Background(), empty, nil); err == nil {
		t.Fatal("loading an empty file: no error")
	}
	if _, _, err := LoadFile(context.Background(), filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Fatal("loading a missing file: no error")
	}
	if runtime.GOOS == "linux" {
		path, _ := testFile(t, 4096)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, _, err := LoadFile(ctx, path, nil); err != context.Canceled {
			t.Fatalf("loading under a cancelled context: %v, want context.Canceled", err)
		}
	}
}

func TestAllocAligned(t *testing.T) {
	for _, n := range []int{1, 4096, 3*4096 + 5, 1 << 20, 5<<20 + 4097} {
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
	if _, err := f.Pread(buf, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want[4096:3*4096]) {
		t.Fatal("read bytes differ from the file")
	}
	if _, err := f.Pread(buf, 3*4096); err == nil {
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

// TestPreadConcurrent reads every block of a file from many goroutines at
// once, as the expert readers do, through the uncached file and a buffered
// one, and checks each block's bytes.
func TestPreadConcurrent(t *testing.T) {
	const blocks = 64
	path, want := testFile(t, blocks*4096)
	direct, _, _, err := OpenUncached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	buffered, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer buffered.Close()
	for _, f := range []*File{direct, buffered} {
		errs := make(chan error, blocks)
		for b := range blocks {
			go func() {
				buf, err := Alloc(4096)
				if err != nil {
					errs <- err
					return
				}
				defer Free(buf)
				for range 8 {
					off := int64((b*7)%blocks) * 4096
					if n, err := f.Pread(buf, off); err != nil || n != len(buf) {
						errs <- fmt.Errorf("block at %d: %d bytes, %v", off, n, err)
						return
					}
					if !bytes.Equal(buf, want[off:off+4096]) {
						errs <- fmt.Errorf("block at %d: bytes differ from the file", off)
						return
					}
				}
				errs <- nil
			}()
		}
		for range blocks {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}

// TestPreadAllocs: a read allocates nothing, so that decoding through a
// streamed expert pool stays allocation-free.
func TestPreadAllocs(t *testing.T) {
	path, _ := testFile(t, 4*4096)
	f, _, _, err := OpenUncached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf, err := Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(buf)
	f.Pread(buf, 0)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := f.Pread(buf, 4096); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Pread allocates %.1f times", n)
	}
}

func TestUncachedName(t *testing.T) {
	want := map[string]string{"linux": "O_DIRECT", "darwin": "F_NOCACHE", "windows": "FILE_FLAG_NO_BUFFERING"}[runtime.GOOS]
	if want != "" && UncachedName != want {
		t.Fatalf("UncachedName = %q on %s, want %q", UncachedName, runtime.GOOS, want)
	}
}

// TestCPUTime: the process's user time grows while it computes, and
// neither figure goes backwards.
func TestCPUTime(t *testing.T) {
	u0, s0, ok := CPUTime()
	if !ok {
		if runtime.GOOS == "linux" || runtime.GOOS == "darwin" || runtime.GOOS == "windows" {
			t.Fatalf("no CPU time on %s", runtime.GOOS)
		}
		t.Skipf("no CPU time on %s", runtime.GOOS)
	}
	x := uint64(1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		for i := 0; i < 1<<20; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		u1, s1, _ := CPUTime()
		if u1 < u0 || s1 < s0 {
			t.Fatalf("CPU time went backwards: user %v → %v, system %v → %v", u0, u1, s0, s1)
		}
		if u1 >= u0+20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("user time grew from %v to %v in 5 s of computing", u0, u1)
		}
	}
	sink = x
}

var sink uint64
