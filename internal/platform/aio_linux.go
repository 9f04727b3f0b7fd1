package platform

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Reads is Linux's kernel asynchronous I/O (io_setup, io_submit) for the
// uncached reads of an expert pool: the goroutine that needs a record
// submits its read and collects the completion, and no goroutine waits in
// a read (io_submit itself pins the buffer's pages and builds the block
// requests: 0.09-0.25 ms for a 2.65 MB read on the development VM). A
// goroutine blocked in pread keeps its scheduler slot (its P)
// until the runtime's monitor takes it back, which it checks for every 20
// µs to 10 ms; with GOMAXPROCS at the core count, a read in flight so held
// one of the two slots of a 2-core machine, and a runtime trace of a
// capped decode had the compute's second thread waiting for a slot 19% of
// the time (see the README's "Reads that hold no thread"). Completions are
// read from the ring the kernel maps into the process, without a system
// call, and waited for in io_getevents only when there is none.
type Reads struct {
	ctx  uintptr // the context, which is also the ring's address
	ring *aioRing
	nr   uint32 // the ring's events
	cb   iocb
	cbs  [1]*iocb
	evs  []aioEvent
}

// ReadDone is one finished read: the tag it was submitted with, the bytes
// it read (fewer than asked for where the file ends), and its error.
type ReadDone struct {
	Tag uint64
	N   int64
	Err error
}

// iocb is the kernel's struct iocb. Its key and read flags are zero, so
// their order, which differs with the byte order, does not matter.
type iocb struct {
	data     uint64
	key      uint32
	rwFlags  uint32
	opcode   uint16
	prio     int16
	fd       uint32
	buf      uint64
	nbytes   uint64
	offset   int64
	reserved uint64
	flags    uint32
	resfd    uint32
}

// aioEvent is the kernel's struct io_event.
type aioEvent struct {
	data, obj uint64
	res, res2 int64
}

// aioRing is the header of the completion ring (struct aio_ring); the
// events follow it at headerLen.
type aioRing struct {
	id, nr, head, tail                        uint32
	magic, compatFeatures, incompat, headerLn uint32
}

const (
	aioRingMagic = 0xa10a10a1
	iocbCmdPread = 0
)

// NewReads sets up a context for depth reads in flight. It fails where
// the kernel has no asynchronous I/O (or a sandbox forbids it), and the
// caller then reads with blocking calls instead.
func NewReads(depth int) (*Reads, error) {
	var ctx uintptr
	if _, _, e := syscall.Syscall(syscall.SYS_IO_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil, fmt.Errorf("io_setup: %w", e)
	}
	r := &Reads{ctx: ctx, evs: make([]aioEvent, depth)}
	// The context is the ring's address in this process: memory the
	// kernel mapped, not Go's, so it does not move.
	ring := *(**aioRing)(unsafe.Pointer(&ctx))
	if ring.magic == aioRingMagic && ring.headerLn == uint32(unsafe.Sizeof(aioRing{})) && ring.incompat == 0 && ring.nr > 0 {
		r.ring, r.nr = ring, ring.nr
	}
	r.cbs[0] = &r.cb
	return r, nil
}

// Submit starts reading len(buf) bytes of f at off into buf, which must
// stay valid (and, as f is uncached, aligned) until the read is
// collected; tag comes back with its completion.
func (r *Reads) Submit(f *File, buf []byte, off int64, tag uint64) error {
	r.cb = iocb{data: tag, opcode: iocbCmdPread, fd: uint32(f.fd), buf: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), nbytes: uint64(len(buf)), offset: off}
	for {
		n, _, e := syscall.Syscall(syscall.SYS_IO_SUBMIT, r.ctx, 1, uintptr(unsafe.Pointer(&r.cbs[0])))
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return fmt.Errorf("io_submit: %w", e)
		case n != 1:
			return fmt.Errorf("io_submit: %d of 1 submitted", n)
		}
		return nil
	}
}

// Collect appends the reads that have finished to out, without blocking
// unless wait is set and none has: then it waits for at least one. With
// the ring readable, a collect that finds none and does not wait makes no
// system call (the kernel posts every completion to the ring).
func (r *Reads) Collect(out []ReadDone, wait bool) ([]ReadDone, error) {
	if r.ring != nil {
		head := atomic.LoadUint32(&r.ring.head)
		tail := atomic.LoadUint32(&r.ring.tail)
		if head >= r.nr || tail >= r.nr {
			r.ring = nil // not the ring this reads: the system call from now on
		} else if head != tail {
			base := unsafe.Add(unsafe.Pointer(r.ring), unsafe.Sizeof(aioRing{}))
			for ; head != tail; head = (head + 1) % r.nr {
				ev := (*aioEvent)(unsafe.Add(base, uintptr(head)*unsafe.Sizeof(aioEvent{})))
				out = append(out, done(ev))
			}
			atomic.StoreUint32(&r.ring.head, head)
			return out, nil
		} else if !wait {
			return out, nil
		}
	}
	least := uintptr(0)
	var zero syscall.Timespec
	tsp := &zero
	if wait {
		least, tsp = 1, nil // no timeout
	}
	for {
		n, _, e := syscall.Syscall6(syscall.SYS_IO_GETEVENTS, r.ctx, least, uintptr(len(r.evs)), uintptr(unsafe.Pointer(&r.evs[0])), uintptr(unsafe.Pointer(tsp)), 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return out, fmt.Errorf("io_getevents: %w", e)
		}
		for i := range int(n) {
			out = append(out, done(&r.evs[i]))
		}
		return out, nil
	}
}

// done converts a kernel event.
func done(ev *aioEvent) ReadDone {
	if ev.res < 0 {
		return ReadDone{Tag: ev.data, Err: syscall.Errno(-ev.res)}
	}
	return ReadDone{Tag: ev.data, N: ev.res}
}

// Close releases the context; reads still in flight are waited for by
// the kernel.
func (r *Reads) Close() error {
	if r.ctx == 0 {
		return nil
	}
	_, _, e := syscall.Syscall(syscall.SYS_IO_DESTROY, r.ctx, 0, 0)
	r.ctx, r.ring = 0, nil
	if e != 0 {
		return fmt.Errorf("io_destroy: %w", e)
	}
	return nil
}
