// Package platform holds the few operating-system calls sluice needs that
// the standard library does not give on every platform: read-only file
// mappings, page-aligned anonymous memory, uncached (page-cache bypassing)
// reads, how much memory the process may still use, and the free space of
// a file system. Each has one file per platform; a platform that lacks a
// feature falls back and says so through the returned description, never
// silently.
package platform

import (
	"context"
	"fmt"
	"os"
	"time"
)

// MapFile maps path read-only and whole. The mapping outlives the file
// handle; release it with Unmap.
func MapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	if int64(int(st.Size())) != st.Size() {
		return nil, fmt.Errorf("%s: %d bytes do not fit this platform's address space", path, st.Size())
	}
	b, err := mapFile(f, int(st.Size()))
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %v", path, err)
	}
	return b, nil
}

// LoadFile returns the whole of path in memory that Unmap releases. On
// Linux it reads the file into anonymous memory that asks for transparent
// huge pages, which a decode step reading every resident weight once runs
// measurably faster from than from a file mapping's 4 KiB pages; huge
// reports whether the kernel took that advice. The memory is the
// process's own, as the memory budget assumes, rather than page cache the
// kernel may drop and read again under pressure. Elsewhere LoadFile maps
// the file as MapFile does. progress, when not nil, is told the bytes read
// so far; ctx cancels between reads of 64 MiB.
func LoadFile(ctx context.Context, path string, progress func(done, total int64)) (b []byte, huge bool, err error) {
	return loadFile(ctx, path, progress)
}

// LoadCopies reports whether LoadFile reads a file into the process's own
// memory (Linux), which its caller may then rearrange in place; elsewhere
// LoadFile's memory is a read-only mapping of the file.
func LoadCopies() bool { return loadCopies }

// Alloc returns n bytes of zeroed, page-aligned memory outside the Go heap,
// as uncached reads need (their buffers must be aligned to the device's
// block size). Release it with Free.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("platform: allocating %d bytes", n)
	}
	b, err := alloc(n)
	if err != nil {
		return nil, fmt.Errorf("platform: allocating %d bytes: %v", n, err)
	}
	return b, nil
}

// Unmap releases a mapping made by MapFile.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return unmap(b)
}

// Free releases memory from Alloc.
func Free(b []byte) error {
	if b == nil {
		return nil
	}
	return free(b)
}

// OpenUncached opens path for reading with the platform's page-cache bypass
// (O_DIRECT on Linux, F_NOCACHE on macOS, FILE_FLAG_NO_BUFFERING on
// Windows): streamed expert records would otherwise fill the page cache past
// the memory budget and evict the dense weights. direct reports whether the
// bypass is in force; reads of a direct file must use Alloc'd buffers and
// offsets and lengths that are multiples of 4096. It probes one aligned
// read, since some filesystems accept the flag at open and refuse at read;
// when the bypass is refused it returns a buffered file and why.
func OpenUncached(path string) (f *File, direct bool, why string, err error) {
	of, err := openUncached(path)
	if err == nil {
		f = newFile(of)
		buf, aerr := Alloc(4096)
		if aerr != nil {
			f.Close()
			return nil, false, "", aerr
		}
		_, rerr := f.Pread(buf, 0)
		Free(buf)
		if rerr == nil {
			return f, true, "", nil
		}
		f.Close()
		why = rerr.Error()
	} else {
		why = err.Error()
	}
	f, err = Open(path)
	if err != nil {
		return nil, false, "", err
	}
	return f, false, why, nil
}

// File is a file opened for positional reads, by Open or OpenUncached. Its
// Pread, unlike os.File's ReadAt, lets concurrent reads of one file run
// together on every platform (os.File serialises them on Windows) and
// allocates nothing.
type File struct {
	*os.File
	fd uintptr // the descriptor or handle, taken once: Fd has side effects on Windows
}

func newFile(f *os.File) *File { return &File{File: f, fd: f.Fd()} }

// Open opens path for reading through the page cache.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return newFile(f), nil
}

// Pread reads len(buf) bytes at off; it fails with io.ErrUnexpectedEOF when
// the file ends first. The File must stay open until it returns.
func (f *File) Pread(buf []byte, off int64) (int, error) { return pread(f.fd, f.Name(), buf, off) }

// UncachedName is the platform's name for the page-cache bypass that
// OpenUncached uses, for messages: a Windows user looking for "O_DIRECT"
// would find nothing.
const UncachedName = uncachedName

// Available returns the memory this process may still use and where the
// figure came from, or -1 and why when the platform gives no figure.
func Available() (int64, string) { return available() }

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

// CPUTime is the CPU time the process has used so far, in user mode and
// in the kernel (system calls: with experts streamed, chiefly the reads);
// ok is false where the platform gives no figure. On a machine whose
// cores the compute threads fill, the kernel's share is time the compute
// did not get, which sluice bench reports per decoded token.
func CPUTime() (user, sys time.Duration, ok bool) { return cpuTime() }

// MachineCPU is the machine's CPU time so far, summed over its processors
// in the system's clock ticks: total, and of it the time a hypervisor ran
// something else on the processors this (virtual) machine was given
// (steal). Between two readings, steal over total is the share of the
// machine's processor time it lost to its host, time the compute threads
// wanted and the process's own CPU time does not show; on a VM the host's
// emulation of the disk takes some of it while experts stream. ok is
// false where the platform gives no figure (Linux only).
func MachineCPU() (steal, total uint64, ok bool) { return machineCPU() }
