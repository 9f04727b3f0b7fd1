//go:build unix && !linux

package platform

import (
	"context"
	"os"
	"syscall"
)

func mapFile(f *os.File, n int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmap(b []byte) error { return syscall.Munmap(b) }

func alloc(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
}

func free(b []byte) error { return syscall.Munmap(b) }

// loadFile maps the file: only Linux offers transparent huge pages for
// anonymous memory, so elsewhere a mapping serves as well and costs no
// read up front.
// loadCopies: see LoadCopies.
const loadCopies = false

func loadFile(_ context.Context, path string, _ func(done, total int64)) ([]byte, bool, error) {
	b, err := MapFile(path)
	return b, false, err
}
