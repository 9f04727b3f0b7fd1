package experts

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/platform"
)

// openRecords opens an expert store for reading, uncached unless buffered
// is set or the platform or filesystem refuses it (tmpfs, some overlays):
// uncached reads keep streamed records out of the page cache, which would
// otherwise grow past the memory budget and evict the dense weights. why
// says what refused the bypass.
func openRecords(path string, buffered bool) (f *platform.File, direct bool, why string, err error) {
	if buffered {
		f, err = platform.Open(path)
	} else {
		f, direct, why, err = platform.OpenUncached(path)
	}
	if err != nil {
		return nil, false, "", fmt.Errorf("expert store: %v", err)
	}
	return f, direct, why, nil
}

// alignedBuf returns n bytes of page-aligned memory outside the Go heap,
// a valid destination for uncached reads.
func alignedBuf(n int64) []byte {
	b, err := platform.Alloc(int(n))
	if err != nil {
		panic(fmt.Sprintf("experts: %v", err)) // out of address space: nothing sensible to do
	}
	return b
}

// preadFull reads len(buf) bytes at off.
func preadFull(f *platform.File, buf []byte, off int64) error {
	_, err := f.Pread(buf, off)
	return err
}
