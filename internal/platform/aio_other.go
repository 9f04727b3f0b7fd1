//go:build !linux

package platform

import "errors"

// Reads is kernel asynchronous I/O for uncached reads; only Linux has it
// here (aio_linux.go), and elsewhere the caller reads with blocking calls.
type Reads struct{}

// ReadDone is one finished read (aio_linux.go).
type ReadDone struct {
	Tag uint64
	N   int64
	Err error
}

// NewReads fails with errors.ErrUnsupported: no asynchronous reads on
// this platform.
func NewReads(depth int) (*Reads, error) { return nil, errors.ErrUnsupported }

// Submit is never called: NewReads gave no Reads.
func (r *Reads) Submit(f *File, buf []byte, off int64, tag uint64) error {
	return errors.New("no kernel asynchronous reads on this platform")
}

// Collect is never called: NewReads gave no Reads.
func (r *Reads) Collect(out []ReadDone, wait bool) ([]ReadDone, error) { return out, nil }

// Close does nothing.
func (r *Reads) Close() error { return nil }
