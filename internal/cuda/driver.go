//go:build linux

// Package cuda binds the CUDA driver API (libcuda.so.1) at run time, with
// no cgo, and holds sluice's GPU kernels as embedded PTX.
//
// Why purego: the standard library cannot dlopen a shared library or call a
// C function without cgo; github.com/ebitengine/purego implements dlopen,
// dlsym and the C calling convention in Go and assembly and works with
// CGO_ENABLED=0, so the binary builds without a C toolchain and runs on a
// machine without CUDA (Open then returns an error). One consequence: a
// binary that links this package names glibc's dynamic loader as its ELF
// interpreter (purego imports dlopen from libdl.so.2), so it is no longer
// a static executable, although it needs nothing beyond libc.
//
// Threads: a CUDA context is current per OS thread, and goroutines move
// between threads. A Device therefore owns one goroutine locked to its
// thread (runtime.LockOSThread) with the device's primary context current,
// and every driver call runs there: Device.Do hands it a closure. The
// methods of Device other than Open, Do, Close and the Info fields must be
// called from inside Do; they are not safe for concurrent use.
//
// Versioned symbols: cuda.h #defines many names to _v2 entry points (e.g.
// cuMemAlloc → cuMemAlloc_v2) and libcuda still exports the legacy ABIs
// under the plain names, so a plain dlsym can bind the wrong ABI. Every
// entry point but cuGetProcAddress_v2 itself is therefore resolved through
// cuGetProcAddress_v2 for CUDA version 12.0, which returns the versioned
// function that a program compiled against that cuda.h would call.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// apiVersion is the CUDA version whose ABI the entry points are resolved
// for (cuGetProcAddress_v2's cudaVersion): 12.0, which the driver of any
// sm_80+ machine of today supports.
const apiVersion = 12000

// fns holds the driver entry points, resolved once per process.
var fns struct {
	init, driverGetVersion, getErrorName                       uintptr
	deviceGet, deviceGetCount, deviceGetName, deviceGetAttr    uintptr
	deviceTotalMem, primaryCtxRetain, primaryCtxRelease        uintptr
	ctxSetCurrent, ctxSynchronize, memGetInfo                  uintptr
	moduleLoadDataEx, moduleUnload, moduleGetFunction          uintptr
	funcSetAttribute                                           uintptr
	memAlloc, memFree, memAllocHost, memFreeHost               uintptr
	memcpyHtoD, memcpyDtoH, memcpyDtoD                         uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync          uintptr
	memsetD32, memsetD32Async                                  uintptr
	memHostRegister, memHostUnregister, streamWaitEvent        uintptr
	streamCreate, streamDestroy, streamSynchronize             uintptr
	eventCreate, eventDestroy, eventRecord, eventSynchronize   uintptr
	eventElapsedTime                                           uintptr
	launchKernel, launchKernelEx                               uintptr
	streamBeginCapture, streamEndCapture                       uintptr
	graphInstantiate, graphLaunch, graphExecDestroy, graphDest uintptr
}

var (
	loadOnce sync.Once
	loadErr  error
)

// ErrNoDriver is wrapped by the error Open returns where libcuda.so.1
// cannot be loaded (no NVIDIA driver on this machine).
var ErrNoDriver = errors.New("cuda: no NVIDIA driver (libcuda.so.1 not found)")

// dlopen is purego.Dlopen on one thread: its error is dlerror's, a
// per-thread message that a goroutine moved to another thread between
// the two calls reads as empty (the user saw "libcuda.so.1 not found): "
// with no reason).
func dlopen(path string, mode int) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, mode)
}

// dlsym is purego.Dlsym on one thread, as dlopen.
func dlsym(lib uintptr, name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlsym(lib, name)
}

// load opens libcuda.so.1, resolves every entry point and runs cuInit.
func load() error {
	loadOnce.Do(func() { loadErr = loadDriver() })
	return loadErr
}

func loadDriver() error {
	// Eager module loading: with the default lazy loading, a kernel's first
	// launch behind a stream wait on host memory was seen to hang for good
	// (CUDA-NOTES §0). It must be set before cuInit; the user's own setting
	// wins.
	if os.Getenv("CUDA_MODULE_LOADING") == "" {
		os.Setenv("CUDA_MODULE_LOADING", "EAGER")
	}
	lib, err := dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	getProc, err := dlsym(lib, "cuGetProcAddress_v2")
	if err != nil {
		return fmt.Errorf("cuda: libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12): %v", err)
	}
	var status int32
	resolve := func(p *uintptr, name string) error {
		if err != nil {
			return err
		}
		cname := append([]byte(name), 0)
		var fn uintptr
		r, _, _ := purego.SyscallN(getProc, uintptr(unsafe.Pointer(&cname[0])), uintptr(unsafe.Pointer(&fn)), apiVersion, 0, uintptr(unsafe.Pointer(&status)))
		if r != 0 || fn == 0 || status != 0 {
			return fmt.Errorf("cuda: cuGetProcAddress_v2(%s): error %d, status %d", name, r, status)
		}
		*p = fn
		return nil
	}
	for _, e := range []struct {
		p    *uintptr
		name string
	}{
		{&fns.init, "cuInit"}, {&fns.driverGetVersion, "cuDriverGetVersion"}, {&fns.getErrorName, "cuGetErrorName"},
		{&fns.deviceGet, "cuDeviceGet"}, {&fns.deviceGetCount, "cuDeviceGetCount"}, {&fns.deviceGetName, "cuDeviceGetName"},
		{&fns.deviceGetAttr, "cuDeviceGetAttribute"}, {&fns.deviceTotalMem, "cuDeviceTotalMem"},
		{&fns.primaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&fns.primaryCtxRelease, "cuDevicePrimaryCtxRelease"},
		{&fns.ctxSetCurrent, "cuCtxSetCurrent"}, {&fns.ctxSynchronize, "cuCtxSynchronize"}, {&fns.memGetInfo, "cuMemGetInfo"},
		{&fns.moduleLoadDataEx, "cuModuleLoadDataEx"}, {&fns.moduleUnload, "cuModuleUnload"}, {&fns.moduleGetFunction, "cuModuleGetFunction"},
		{&fns.funcSetAttribute, "cuFuncSetAttribute"},
		{&fns.memAlloc, "cuMemAlloc"}, {&fns.memFree, "cuMemFree"}, {&fns.memAllocHost, "cuMemAllocHost"}, {&fns.memFreeHost, "cuMemFreeHost"},
		{&fns.memcpyHtoD, "cuMemcpyHtoD"}, {&fns.memcpyDtoH, "cuMemcpyDtoH"}, {&fns.memcpyDtoD, "cuMemcpyDtoD"},
		{&fns.memcpyHtoDAsync, "cuMemcpyHtoDAsync"}, {&fns.memcpyDtoHAsync, "cuMemcpyDtoHAsync"}, {&fns.memcpyDtoDAsync, "cuMemcpyDtoDAsync"},
		{&fns.memsetD32, "cuMemsetD32"}, {&fns.memsetD32Async, "cuMemsetD32Async"},
		{&fns.memHostRegister, "cuMemHostRegister"}, {&fns.memHostUnregister, "cuMemHostUnregister"}, {&fns.streamWaitEvent, "cuStreamWaitEvent"},
		{&fns.streamCreate, "cuStreamCreate"}, {&fns.streamDestroy, "cuStreamDestroy"}, {&fns.streamSynchronize, "cuStreamSynchronize"},
		{&fns.eventCreate, "cuEventCreate"}, {&fns.eventDestroy, "cuEventDestroy"}, {&fns.eventRecord, "cuEventRecord"},
		{&fns.eventSynchronize, "cuEventSynchronize"}, {&fns.eventElapsedTime, "cuEventElapsedTime"},
		{&fns.launchKernel, "cuLaunchKernel"}, {&fns.launchKernelEx, "cuLaunchKernelEx"},
		{&fns.streamBeginCapture, "cuStreamBeginCapture"}, {&fns.streamEndCapture, "cuStreamEndCapture"},
		{&fns.graphInstantiate, "cuGraphInstantiateWithFlags"}, {&fns.graphLaunch, "cuGraphLaunch"},
		{&fns.graphExecDestroy, "cuGraphExecDestroy"}, {&fns.graphDest, "cuGraphDestroy"},
	} {
		err = resolve(e.p, e.name)
	}
	if err != nil {
		return err
	}
	if r, _, _ := purego.SyscallN(fns.init, 0); r != 0 {
		return &Error{Call: "cuInit", Code: int(r), Name: errorName(r)}
	}
	return nil
}

// Error is a failed driver call: the call and the CUDA error's name.
type Error struct {
	Call string // the driver function, e.g. "cuMemAlloc"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string { return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code) }

// errorName is cuGetErrorName's answer for r, or a number where the driver
// does not know r.
func errorName(r uintptr) string {
	if fns.getErrorName == 0 {
		return fmt.Sprintf("CUresult %d", r)
	}
	var s uintptr
	if rc, _, _ := purego.SyscallN(fns.getErrorName, r, uintptr(unsafe.Pointer(&s))); rc != 0 || s == 0 {
		return fmt.Sprintf("CUresult %d", r)
	}
	return goString(s)
}

// goString copies the NUL-terminated C string at p (driver-owned static
// memory) into a Go string.
func goString(p uintptr) string {
	var b []byte
	for i := uintptr(0); ; i++ {
		c := *(*byte)(cptr(p + i))
		if c == 0 {
			return string(b)
		}
		b = append(b, c)
	}
}

// cptr turns an address of C or device-mapped memory into an
// unsafe.Pointer. Such memory is never managed by the Go collector, so the
// conversion rules for Go pointers do not apply; the indirection keeps vet's
// unsafeptr check, which cannot know that, quiet.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// check turns a CUresult into an *Error naming call, or nil.
func check(call string, r uintptr) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: errorName(r)}
}
