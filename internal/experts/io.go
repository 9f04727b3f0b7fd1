package experts

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// openRecords opens an expert store for reading, with O_DIRECT unless
// buffered is set or the filesystem refuses it (tmpfs, some overlays):
// O_DIRECT keeps streamed records out of the page cache, which would
// otherwise grow past the memory budget and evict the dense weights. It
// probes one aligned read, since some filesystems accept the flag at open
// and refuse at read.
func openRecords(path string, buffered bool) (f *os.File, direct bool, err error) {
	if !buffered {
		f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err == nil {
			buf := alignedBuf(4096)
			_, rerr := syscall.Pread(int(f.Fd()), buf, 0)
			syscall.Munmap(buf)
			if rerr == nil {
				return f, true, nil
			}
			f.Close()
		}
	}
	f, err = os.Open(path)
	if err != nil {
		return nil, false, fmt.Errorf("expert store: %v", err)
	}
	return f, false, nil
}

// alignedBuf maps n bytes of page-aligned anonymous memory.
func alignedBuf(n int64) []byte {
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		panic(fmt.Sprintf("experts: mapping %d bytes: %v", n, err)) // out of address space: nothing sensible to do
	}
	return b
}

// preadFull reads len(buf) bytes at off. It uses the raw fd so that a read
// costs no allocation and does not go through the runtime poller (regular
// files are never non-blocking anyway).
func preadFull(f *os.File, buf []byte, off int64) error {
	fd := int(f.Fd())
	for done := 0; done < len(buf); {
		n, err := syscall.Pread(fd, buf[done:], off+int64(done))
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		done += n
	}
	return nil
}
