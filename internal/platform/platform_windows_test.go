package platform

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/windows"
)

// TestUncachedOverlapped: the uncached handle is opened for overlapped I/O.
// Windows serialises all I/O on a handle opened for synchronous I/O, so
// without it the expert readers' reads would run one at a time whatever
// the queue depth asked for.
func TestUncachedOverlapped(t *testing.T) {
	path, _ := testFile(t, 4096)
	f, direct, why, err := OpenUncached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !direct {
		t.Fatalf("FILE_FLAG_NO_BUFFERING refused: %s", why)
	}
	const fileModeInformation = 16
	var mode uint32
	var iosb windows.IO_STATUS_BLOCK
	if err := windows.NtQueryInformationFile(windows.Handle(f.fd), &iosb, (*byte)(unsafe.Pointer(&mode)), 4, fileModeInformation); err != nil {
		t.Fatal(err)
	}
	if mode&(windows.FILE_SYNCHRONOUS_IO_ALERT|windows.FILE_SYNCHRONOUS_IO_NONALERT) != 0 {
		t.Fatalf("file mode %#x: the handle is synchronous, so its reads are serialised", mode)
	}
}
