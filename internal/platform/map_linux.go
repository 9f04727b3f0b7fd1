package platform

import (
	"context"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 and arm64 transparent huge page.
const hugePage = 2 << 20

// The mappings here are made and released with raw system calls rather
// than syscall.Mmap, whose bookkeeping accepts only whole mappings it made
// itself: allocHuge trims its mapping to a huge-page boundary. Every
// mapping is released by its capacity, which is the length mapped.

func mapFile(f *os.File, n int) ([]byte, error) {
	p, err := unix.MmapPtr(int(f.Fd()), 0, nil, uintptr(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func unmap(b []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b)))
}

func alloc(n int) ([]byte, error) {
	if n >= hugePage {
		b, _, err := allocHuge(n)
		return b, err
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func free(b []byte) error { return unmap(b) }

// allocHuge maps n bytes of zeroed anonymous memory starting on a
// huge-page boundary and asks for transparent huge pages over it
// (MADV_HUGEPAGE; the system default is often "madvise", which gives them
// only to memory that asks). A decode step at real shapes reads hundreds
// of MB of weights once each: with 4 KiB pages nearly every 4 KiB read
// also walks the page tables. huge reports whether the advice was taken
// (a kernel without transparent huge pages refuses it; the memory works
// the same).
func allocHuge(n int) (b []byte, huge bool, err error) {
	span := (n + hugePage - 1) &^ (hugePage - 1)
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(span+hugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, false, err
	}
	base := uintptr(p)
	lead := (hugePage - base%hugePage) % hugePage
	if lead > 0 {
		if err := unix.MunmapPtr(p, lead); err != nil {
			unix.MunmapPtr(p, uintptr(span+hugePage))
			return nil, false, err
		}
	}
	if tail := hugePage - lead; tail > 0 {
		unix.MunmapPtr(unsafe.Add(p, lead+uintptr(span)), tail)
	}
	b = unsafe.Slice((*byte)(unsafe.Add(p, lead)), span)[:n]
	huge = unix.Madvise(b[:span], unix.MADV_HUGEPAGE) == nil
	return b, huge, nil
}

// loadFile reads path into allocHuge's memory, 64 MiB at a time, checking
// ctx between reads.
// loadCopies: see LoadCopies.
const loadCopies = true

func loadFile(ctx context.Context, path string, progress func(done, total int64)) ([]byte, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	n := st.Size()
	if n == 0 {
		return nil, false, fmt.Errorf("%s is empty", path)
	}
	if int64(int(n)) != n {
		return nil, false, fmt.Errorf("%s: %d bytes do not fit this platform's address space", path, n)
	}
	b, huge, err := allocHuge(int(n))
	if err != nil {
		return nil, false, fmt.Errorf("loading %s: allocating %d bytes: %v", path, n, err)
	}
	const chunk = 64 << 20
	fd := f.Fd()
	for off := int64(0); off < n; off += chunk {
		if err := ctx.Err(); err != nil {
			free(b)
			return nil, false, err
		}
		end := min(off+chunk, n)
		if _, err := pread(fd, path, b[off:end], off); err != nil {
			free(b)
			return nil, false, fmt.Errorf("loading %s: %v", path, err)
		}
		if progress != nil {
			progress(end, n)
		}
	}
	return b, huge, nil
}
