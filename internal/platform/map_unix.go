//go:build unix

package platform

import (
	"errors"
	"io"
	"syscall"
)

// pread uses the raw descriptor so that a read costs no allocation and
// does not go through the runtime poller (regular files are never
// non-blocking anyway).
func pread(h uintptr, name string, buf []byte, off int64) (int, error) {
	fd := int(h)
	done := 0
	for done < len(buf) {
		n, err := syscall.Pread(fd, buf[done:], off+int64(done))
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return done, err
		}
		if n == 0 {
			return done, io.ErrUnexpectedEOF
		}
		done += n
	}
	return done, nil
}
