//go:build linux

package cuda

import (
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Module is a loaded PTX module.
type Module struct {
	h uintptr
	// JIT is the driver's compile time as it reports it
	// (CU_JIT_WALL_TIME), and Load the wall time of the whole load: a load
	// whose PTX the driver's compute cache already holds compiles nothing.
	JIT, Load time.Duration
}

// LoadPTX loads a module from PTX text (cuModuleLoadDataEx). The driver
// compiles the PTX for the device at load and keeps the result in its own
// JIT cache (~/.nv/ComputeCache, or $CUDA_CACHE_PATH; on by default, sized
// by $CUDA_CACHE_MAXSIZE), keyed by the PTX, the device and the driver, so
// a process after the first loads the cached machine code. A compile
// failure returns the JIT's error log.
func (d *Device) LoadPTX(ptx []byte) (*Module, error) {
	img := make([]byte, len(ptx)+1) // cuModuleLoadData wants a NUL-terminated image
	copy(img, ptx)
	base := d.arena + scratchOff
	opts := (*[3]int32)(cptr(base))
	vals := (*[3]uintptr)(cptr(base + 64))
	logBuf := base + 128
	// CU_JIT_WALL_TIME (2, out: float ms in the value slot),
	// CU_JIT_ERROR_LOG_BUFFER (5), CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES (6).
	opts[0], opts[1], opts[2] = 2, 5, 6
	vals[0], vals[1], vals[2] = 0, logBuf, jitLogSize
	*(*byte)(cptr(logBuf)) = 0
	start := time.Now()
	r, _, _ := purego.SyscallN(fns.moduleLoadDataEx, d.out(0), uintptr(unsafe.Pointer(&img[0])), 3, base, base+64)
	load := time.Since(start)
	if r != 0 {
		err := check("cuModuleLoadDataEx", r)
		if log := strings.TrimSpace(goString(logBuf)); log != "" {
			err = fmt.Errorf("%w: %s", err, log)
		}
		return nil, err
	}
	ms := *(*float32)(unsafe.Pointer(&vals[0]))
	return &Module{h: uintptr(d.outU64(0)), JIT: time.Duration(float64(ms) * float64(time.Millisecond)), Load: load}, nil
}

// Unload unloads m.
func (d *Device) Unload(m *Module) error {
	if m == nil || m.h == 0 {
		return nil
	}
	err := d.call("cuModuleUnload", fns.moduleUnload, m.h)
	m.h = 0
	return err
}

// Func is a kernel of a loaded module.
type Func struct {
	h    uintptr
	Name string
	// pdl: launch with programmatic dependent launch (LaunchEx's
	// attribute). Only kernels that open with kernels/common.cuh's
	// PDL_ENTRY (the sm_90 PTX) may: a kernel that does not wait for its
	// predecessor could read its output before it is written.
	pdl bool
}

// Func looks up the kernel called name (its extern "C" name) in m.
func (d *Device) Func(m *Module, name string) (Func, error) {
	cname := append([]byte(name), 0)
	// Go memory goes to C only as an unsafe.Pointer converted in the
	// SyscallN call itself, which keeps it where it is until the call
	// returns (never through d.call's argument copy).
	r, _, _ := purego.SyscallN(fns.moduleGetFunction, d.out(0), m.h, uintptr(unsafe.Pointer(&cname[0])))
	if err := check("cuModuleGetFunction", r); err != nil {
		return Func{}, fmt.Errorf("%w: kernel %s", err, name)
	}
	return Func{h: uintptr(d.outU64(0)), Name: name}, nil
}

// SetMaxDynamicShared lets f use up to n bytes of dynamic shared memory
// (above the default 48 KiB).
func (d *Device) SetMaxDynamicShared(f Func, n int) error {
	return d.call("cuFuncSetAttribute", fns.funcSetAttribute, f.h, 8, uintptr(n)) // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// Launch queues f on s with the given grid, block and dynamic shared
// memory. Each argument is one kernel parameter's bits in the low bytes of
// a uint64: a device address as is, int32 and float32 through I and F. The
// values are copied into the arena, which the driver reads during the call,
// so Launch allocates nothing.
func (d *Device) Launch(f Func, grid, block Dim3, shared int, s Stream, args ...uint64) error {
	if len(args) > maxArgs {
		return fmt.Errorf("cuda: %s: %d arguments, at most %d", f.Name, len(args), maxArgs)
	}
	vals := (*[maxArgs]uint64)(cptr(d.arena + argBase))
	ptrs := (*[maxArgs]uintptr)(cptr(d.arena + ptrBase))
	for i, a := range args {
		vals[i] = a
		ptrs[i] = d.arena + argBase + uintptr(8*i)
	}
	d.Launches++
	var err error
	if f.pdl {
		err = d.launchPDL(f, grid, block, shared, s)
	} else {
		err = d.call("cuLaunchKernel", fns.launchKernel, f.h,
			uintptr(max(grid.X, 1)), uintptr(max(grid.Y, 1)), uintptr(max(grid.Z, 1)),
			uintptr(max(block.X, 1)), uintptr(max(block.Y, 1)), uintptr(max(block.Z, 1)),
			uintptr(shared), s.h, d.arena+ptrBase, 0)
	}
	if err != nil {
		return fmt.Errorf("%w: kernel %s grid %v block %v", err, f.Name, grid, block)
	}
	return nil
}

// launchPDL queues f through cuLaunchKernelEx with the attribute
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION set: f's blocks may
// be scheduled before the kernel ahead of it on s has finished (f waits for
// it itself), which hides f's launch behind that kernel. Stream capture
// records the dependency in the graph, so a recorded decode step replays
// the same way. The CUlaunchConfig and its one attribute are built in the
// arena (driver.h's layout on 64-bit hosts: six dims and the shared bytes
// as uint32 from 0, the stream at 32, the attribute pointer at 40, their
// count at 48; an attribute is a uint32 id, 4 bytes of padding and a
// 64-byte value).
func (d *Device) launchPDL(f Func, grid, block Dim3, shared int, s Stream) error {
	cfg := (*[7]uint32)(cptr(d.arena + cfgBase))
	cfg[0], cfg[1], cfg[2] = uint32(max(grid.X, 1)), uint32(max(grid.Y, 1)), uint32(max(grid.Z, 1))
	cfg[3], cfg[4], cfg[5] = uint32(max(block.X, 1)), uint32(max(block.Y, 1)), uint32(max(block.Z, 1))
	cfg[6] = uint32(shared)
	attr := d.arena + cfgBase + 64
	*(*uintptr)(cptr(d.arena + cfgBase + 32)) = s.h
	*(*uintptr)(cptr(d.arena + cfgBase + 40)) = attr
	*(*uint32)(cptr(d.arena + cfgBase + 48)) = 1
	*(*[18]uint32)(cptr(attr)) = [18]uint32{0: 6, 2: 1} // the id, then programmaticStreamSerializationAllowed = 1
	return d.call("cuLaunchKernelEx", fns.launchKernelEx, d.arena+cfgBase, f.h, d.arena+ptrBase, 0)
}

// I is an int kernel argument (int32 in the kernel).
func I(v int) uint64 { return uint64(uint32(int32(v))) }

// F is a float32 kernel argument.
func F(v float32) uint64 { return uint64(*(*uint32)(unsafe.Pointer(&v))) }

// P is a device-address kernel argument.
func P(p uintptr) uint64 { return uint64(p) }

// Graph is an instantiated CUDA graph, ready to replay.
type Graph struct{ g, exec uintptr }

// BeginCapture starts capturing the work queued on s (which must not be
// the default stream) into a graph; nothing queued runs until the graph is
// launched. The capture mode is thread-local: the owner thread is the only
// one that queues work anyway.
func (d *Device) BeginCapture(s Stream) error {
	return d.call("cuStreamBeginCapture", fns.streamBeginCapture, s.h, 1) // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
}

// EndCapture ends the capture on s and instantiates the graph.
func (d *Device) EndCapture(s Stream) (*Graph, error) {
	if err := d.call("cuStreamEndCapture", fns.streamEndCapture, s.h, d.out(0)); err != nil {
		return nil, err
	}
	g := &Graph{g: uintptr(d.outU64(0))}
	if err := d.call("cuGraphInstantiateWithFlags", fns.graphInstantiate, d.out(0), g.g, 0); err != nil {
		purego.SyscallN(fns.graphDest, g.g)
		return nil, err
	}
	g.exec = uintptr(d.outU64(0))
	return g, nil
}

// LaunchGraph queues one replay of g on s.
func (d *Device) LaunchGraph(g *Graph, s Stream) error {
	return d.call("cuGraphLaunch", fns.graphLaunch, g.exec, s.h)
}

// DestroyGraph frees g.
func (d *Device) DestroyGraph(g *Graph) error {
	if g == nil {
		return nil
	}
	err := d.call("cuGraphExecDestroy", fns.graphExecDestroy, g.exec)
	if err2 := d.call("cuGraphDestroy", fns.graphDest, g.g); err == nil {
		err = err2
	}
	return err
}
