//go:build linux

package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Info describes a device.
type Info struct {
	Ordinal      int
	Name         string
	Major, Minor int // compute capability
	SMs          int // multiprocessors
	TotalBytes   int64
	Driver       int // cuDriverGetVersion, e.g. 13000
}

func (i Info) String() string {
	return fmt.Sprintf("GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GiB, driver API %d.%d",
		i.Ordinal, i.Name, i.Major, i.Minor, i.SMs, float64(i.TotalBytes)/(1<<30), i.Driver/1000, i.Driver%1000/10)
}

// Device is one GPU with its primary context current on a goroutine locked
// to one OS thread; every driver call goes through that goroutine (Do).
type Device struct {
	Info
	dev  int32
	ctx  uintptr
	reqs chan *request
	// arena is page-locked host memory for the pointers and values the
	// driver reads or writes during a call (out-parameters, kernel
	// arguments), so no Go pointer is ever handed to C and a launch
	// allocates nothing. Only the owner thread touches it.
	arena uintptr
	// sys holds the arguments of the driver call in progress: passing a
	// slice of it to purego.SyscallN allocates nothing, where a fresh
	// variadic list would escape to the heap on every call.
	sys    [16]uintptr
	closed bool
	// Launches counts kernel launches queued (read it from inside Do).
	Launches uint64
}

const (
	arenaBytes = 64 << 10
	outBase    = 0     // [0, 256): out-parameters of one call
	argBase    = 256   // launch argument values, 8 bytes each
	cfgBase    = 4096  // cuLaunchKernelEx's CUlaunchConfig (56 bytes), then its attribute (72)
	ptrBase    = 8192  // launch argument pointer array
	scratchOff = 16384 // JIT option values and logs
	maxArgs    = 64
	jitLogSize = 16 << 10
)

// Count returns the number of CUDA devices, or an error (wrapping
// ErrNoDriver where there is no driver).
func Count() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	// cuDeviceGetCount needs no context, so any thread will do.
	var n int32
	r, _, _ := purego.SyscallN(fns.deviceGetCount, uintptr(unsafe.Pointer(&n)))
	return int(n), check("cuDeviceGetCount", r)
}

// Open loads the driver, retains device ordinal's primary context and
// starts the goroutine that owns it. Where there is no driver or no such
// device it returns an error and starts nothing.
func Open(ordinal int) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: no GPU %d (%d present)", ordinal, n)
	}
	d := &Device{reqs: make(chan *request)}
	d.Ordinal = ordinal
	errc := make(chan error)
	go d.owner(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return d, nil
}

// owner is the goroutine that owns the context: it sets it up, then runs
// closures from Do until Close.
func (d *Device) owner(errc chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	if err := d.setup(); err != nil {
		errc <- err
		return
	}
	errc <- nil
	for q := range d.reqs {
		q.err = q.run()
		q.done <- struct{}{}
	}
}

func (d *Device) setup() error {
	var dev int32
	if r, _, _ := purego.SyscallN(fns.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(d.Ordinal)); r != 0 {
		return check("cuDeviceGet", r)
	}
	d.dev = dev
	var ctx uintptr
	if r, _, _ := purego.SyscallN(fns.primaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(dev)); r != 0 {
		return check("cuDevicePrimaryCtxRetain", r)
	}
	d.ctx = ctx
	if r, _, _ := purego.SyscallN(fns.ctxSetCurrent, ctx); r != 0 {
		return check("cuCtxSetCurrent", r)
	}
	var arena uintptr
	if r, _, _ := purego.SyscallN(fns.memAllocHost, uintptr(unsafe.Pointer(&arena)), arenaBytes); r != 0 {
		return check("cuMemAllocHost", r)
	}
	d.arena = arena
	name := make([]byte, 256)
	if r, _, _ := purego.SyscallN(fns.deviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev)); r != 0 {
		return check("cuDeviceGetName", r)
	}
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	d.Name = string(name)
	attr := func(a int) (int, error) {
		var v int32
		r, _, _ := purego.SyscallN(fns.deviceGetAttr, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev))
		return int(v), check("cuDeviceGetAttribute", r)
	}
	var err error
	if d.Major, err = attr(75); err != nil { // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
		return err
	}
	if d.Minor, err = attr(76); err != nil {
		return err
	}
	if d.SMs, err = attr(16); err != nil { // MULTIPROCESSOR_COUNT
		return err
	}
	var total uint64
	if r, _, _ := purego.SyscallN(fns.deviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(dev)); r != 0 {
		return check("cuDeviceTotalMem", r)
	}
	d.TotalBytes = int64(total)
	var ver int32
	if r, _, _ := purego.SyscallN(fns.driverGetVersion, uintptr(unsafe.Pointer(&ver))); r != 0 {
		return check("cuDriverGetVersion", r)
	}
	d.Driver = int(ver)
	return nil
}

// Do runs f on the thread that owns the device's context and returns its
// error. Every other method must be called from inside f; f must not call
// Do itself (it would wait for itself).
func (d *Device) Do(f func() error) error {
	q := requests.Get().(*request)
	q.f = f
	d.reqs <- q
	<-q.done
	err := q.err
	q.f, q.err = nil, nil
	requests.Put(q)
	return err
}

// request is one Do call in flight; they are recycled, so that a Do whose
// f is not a fresh closure allocates nothing (a decode step's).
type request struct {
	f    func() error
	err  error
	done chan struct{}
}

var requests = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// run calls f on the owner thread, turning a panic into an error.
func (q *request) run() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cuda: panic on the device thread: %v", p)
		}
	}()
	return q.f()
}

// Close synchronises, frees the arena, releases the primary context and
// stops the owner goroutine; a second Close does nothing. Buffers, modules, streams and graphs should be
// freed first; the primary context's release frees what is left once no
// other user of it remains.
func (d *Device) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	err := d.Do(func() error {
		err := d.Sync()
		if d.arena != 0 {
			purego.SyscallN(fns.memFreeHost, d.arena)
			d.arena = 0
		}
		r, _, _ := purego.SyscallN(fns.primaryCtxRelease, uintptr(d.dev))
		if err == nil {
			err = check("cuDevicePrimaryCtxRelease", r)
		}
		return err
	})
	close(d.reqs)
	return err
}

// call invokes a driver function and names it in the error; it allocates
// nothing.
func (d *Device) call(name string, fn uintptr, args ...uintptr) error {
	n := copy(d.sys[:], args)
	r, _, _ := purego.SyscallN(fn, d.sys[:n]...)
	return check(name, r)
}

// out returns the address of out-parameter slot i (8 bytes) in the arena.
func (d *Device) out(i int) uintptr { return d.arena + outBase + uintptr(8*i) }

func (d *Device) outU64(i int) uint64 { return *(*uint64)(cptr(d.out(i))) }

// Sync waits for all work on the device (cuCtxSynchronize).
func (d *Device) Sync() error { return d.call("cuCtxSynchronize", fns.ctxSynchronize) }

// MemInfo returns the free and total device memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total int64, err error) {
	err = d.call("cuMemGetInfo", fns.memGetInfo, d.out(0), d.out(1))
	return int64(d.outU64(0)), int64(d.outU64(1)), err
}

// Buf is device memory: Ptr is its device address, Bytes its size.
type Buf struct {
	Ptr   uintptr
	Bytes int
}

// Off returns the device address off bytes into b (for kernel arguments).
func (b Buf) Off(off int) uintptr { return b.Ptr + uintptr(off) }

// Alloc allocates n bytes of device memory (cuMemAlloc; 256-byte aligned).
func (d *Device) Alloc(n int) (Buf, error) {
	if n <= 0 {
		return Buf{}, fmt.Errorf("cuda: allocation of %d bytes", n)
	}
	if err := d.call("cuMemAlloc", fns.memAlloc, d.out(0), uintptr(n)); err != nil {
		return Buf{}, fmt.Errorf("%w (%d bytes)", err, n)
	}
	return Buf{Ptr: uintptr(d.outU64(0)), Bytes: n}, nil
}

// Free frees b (a zero Buf is ignored).
func (d *Device) Free(b Buf) error {
	if b.Ptr == 0 {
		return nil
	}
	return d.call("cuMemFree", fns.memFree, b.Ptr)
}

// bytesOf returns the address and length in bytes of a slice of plain
// values (no Go pointers inside), for synchronous copies.
func bytesOf[T any](s []T) (unsafe.Pointer, int) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&s[0]), len(s) * int(unsafe.Sizeof(s[0]))
}

// Upload copies src into b starting at byte off (cuMemcpyHtoD, synchronous).
// T must hold no pointers (numbers, or arrays and structs of them).
func Upload[T any](d *Device, b Buf, off int, src []T) error {
	p, n := bytesOf(src)
	if off < 0 || off+n > b.Bytes {
		return fmt.Errorf("cuda: upload of %d bytes at %d into a %d-byte buffer", n, off, b.Bytes)
	}
	if n == 0 {
		return nil
	}
	// The pointer is converted in the SyscallN call itself, which keeps
	// the memory in place until the call returns.
	r, _, _ := purego.SyscallN(fns.memcpyHtoD, b.Ptr+uintptr(off), uintptr(p), uintptr(n))
	runtime.KeepAlive(src)
	return check("cuMemcpyHtoD", r)
}

// Download copies len(dst) elements from b at byte off into dst
// (cuMemcpyDtoH). It returns when the copy is done, and is ordered after
// work on the default stream only: synchronise a stream from NewStream
// first. Like Upload, T must hold no pointers.
func Download[T any](d *Device, dst []T, b Buf, off int) error {
	p, n := bytesOf(dst)
	if off < 0 || off+n > b.Bytes {
		return fmt.Errorf("cuda: download of %d bytes at %d from a %d-byte buffer", n, off, b.Bytes)
	}
	if n == 0 {
		return nil
	}
	r, _, _ := purego.SyscallN(fns.memcpyDtoH, uintptr(p), b.Ptr+uintptr(off), uintptr(n))
	runtime.KeepAlive(dst)
	return check("cuMemcpyDtoH", r)
}

// CopyD copies n bytes between device addresses (cuMemcpyDtoD).
func (d *Device) CopyD(dst, src uintptr, n int) error {
	return d.call("cuMemcpyDtoD", fns.memcpyDtoD, dst, src, uintptr(n))
}

// CopyDAsync copies n bytes between device addresses on s.
func (d *Device) CopyDAsync(dst, src uintptr, n int, s Stream) error {
	return d.call("cuMemcpyDtoDAsync", fns.memcpyDtoDAsync, dst, src, uintptr(n), s.h)
}

// Fill32 sets n 32-bit words at p to v (cuMemsetD32): tests poison outputs
// with it.
func (d *Device) Fill32(p uintptr, v uint32, n int) error {
	return d.call("cuMemsetD32", fns.memsetD32, p, uintptr(v), uintptr(n))
}

// Fill32Async is Fill32 queued on s (cuMemsetD32Async).
func (d *Device) Fill32Async(p uintptr, v uint32, n int, s Stream) error {
	return d.call("cuMemsetD32Async", fns.memsetD32Async, p, uintptr(v), uintptr(n), s.h)
}

// FillF32 sets n floats at p to f.
func (d *Device) FillF32(p uintptr, f float32, n int) error {
	return d.Fill32(p, math.Float32bits(f), n)
}

// Host is page-locked host memory (cuMemAllocHost): the source or target
// of asynchronous copies, which need it to overlap with compute.
type Host struct {
	Ptr   uintptr
	Bytes int
}

// AllocHost allocates n bytes of page-locked host memory.
func (d *Device) AllocHost(n int) (Host, error) {
	if err := d.call("cuMemAllocHost", fns.memAllocHost, d.out(0), uintptr(n)); err != nil {
		return Host{}, fmt.Errorf("%w (%d bytes)", err, n)
	}
	return Host{Ptr: uintptr(d.outU64(0)), Bytes: n}, nil
}

// FreeHost frees h.
func (d *Device) FreeHost(h Host) error {
	if h.Ptr == 0 {
		return nil
	}
	return d.call("cuMemFreeHost", fns.memFreeHost, h.Ptr)
}

// Slice views h as a byte slice (valid until FreeHost).
func (h Host) Slice() []byte { return unsafe.Slice((*byte)(cptr(h.Ptr)), h.Bytes) }

// F32 views h as float32s (valid until FreeHost).
func (h Host) F32() []float32 { return unsafe.Slice((*float32)(cptr(h.Ptr)), h.Bytes/4) }

// UploadAsync copies n bytes from pinned host memory at h+hoff to the
// device address dst on stream s.
func (d *Device) UploadAsync(dst uintptr, h Host, hoff, n int, s Stream) error {
	if hoff < 0 || hoff+n > h.Bytes {
		return fmt.Errorf("cuda: async upload of %d bytes at %d from %d pinned bytes", n, hoff, h.Bytes)
	}
	return d.call("cuMemcpyHtoDAsync", fns.memcpyHtoDAsync, dst, h.Ptr+uintptr(hoff), uintptr(n), s.h)
}

// DownloadAsync copies n bytes from the device address src into pinned
// host memory at h+hoff on stream s.
func (d *Device) DownloadAsync(h Host, hoff int, src uintptr, n int, s Stream) error {
	if hoff < 0 || hoff+n > h.Bytes {
		return fmt.Errorf("cuda: async download of %d bytes at %d into %d pinned bytes", n, hoff, h.Bytes)
	}
	return d.call("cuMemcpyDtoHAsync", fns.memcpyDtoHAsync, h.Ptr+uintptr(hoff), src, uintptr(n), s.h)
}

// Register page-locks n bytes of host memory at p that Go did not
// allocate from the driver (cuMemHostRegister), so that UploadFromAsync
// copies from it by DMA, overlapping compute, with no staging copy on the
// host. The memory must stay mapped until Unregister.
func (d *Device) Register(p uintptr, n int) error {
	return d.call("cuMemHostRegister", fns.memHostRegister, p, uintptr(n), 0)
}

// Unregister undoes Register.
func (d *Device) Unregister(p uintptr) error {
	return d.call("cuMemHostUnregister", fns.memHostUnregister, p)
}

// UploadFromAsync copies n bytes from host memory at src, page-locked by
// Register or AllocHost, to the device address dst on stream s.
func (d *Device) UploadFromAsync(dst, src uintptr, n int, s Stream) error {
	return d.call("cuMemcpyHtoDAsync", fns.memcpyHtoDAsync, dst, src, uintptr(n), s.h)
}

// StreamWait makes the work queued on s after it wait until e, recorded
// on another stream, has completed (cuStreamWaitEvent); the host does not
// wait.
func (d *Device) StreamWait(s Stream, e Event) error {
	return d.call("cuStreamWaitEvent", fns.streamWaitEvent, s.h, e.h, 0)
}

// Stream is a CUDA stream; the zero Stream is the legacy default stream
// (which cannot be captured into a graph).
type Stream struct{ h uintptr }

// NewStream creates a non-blocking stream (it does not synchronise with the
// default stream).
func (d *Device) NewStream() (Stream, error) {
	err := d.call("cuStreamCreate", fns.streamCreate, d.out(0), 1) // CU_STREAM_NON_BLOCKING
	return Stream{uintptr(d.outU64(0))}, err
}

// DestroyStream destroys s.
func (d *Device) DestroyStream(s Stream) error {
	if s.h == 0 {
		return nil
	}
	return d.call("cuStreamDestroy", fns.streamDestroy, s.h)
}

// SyncStream waits for the work queued on s.
func (d *Device) SyncStream(s Stream) error {
	return d.call("cuStreamSynchronize", fns.streamSynchronize, s.h)
}

// Event is a CUDA event (timing enabled).
type Event struct{ h uintptr }

// NewEvent creates an event.
func (d *Device) NewEvent() (Event, error) {
	err := d.call("cuEventCreate", fns.eventCreate, d.out(0), 0)
	return Event{uintptr(d.outU64(0))}, err
}

// DestroyEvent destroys e.
func (d *Device) DestroyEvent(e Event) error {
	if e.h == 0 {
		return nil
	}
	return d.call("cuEventDestroy", fns.eventDestroy, e.h)
}

// Record records e on s.
func (d *Device) Record(e Event, s Stream) error {
	return d.call("cuEventRecord", fns.eventRecord, e.h, s.h)
}

// WaitEvent blocks until e has completed.
func (d *Device) WaitEvent(e Event) error {
	return d.call("cuEventSynchronize", fns.eventSynchronize, e.h)
}

// Elapsed returns the milliseconds between two completed events.
func (d *Device) Elapsed(start, end Event) (float32, error) {
	err := d.call("cuEventElapsedTime", fns.eventElapsedTime, d.out(0), start.h, end.h)
	return *(*float32)(cptr(d.out(0))), err
}
