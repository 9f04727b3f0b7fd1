package platform

import (
	"os"

	"golang.org/x/sys/unix"
)

// uncachedName is what macOS calls its page-cache bypass.
const uncachedName = "F_NOCACHE"

// openUncached sets F_NOCACHE, macOS's page-cache bypass: unlike O_DIRECT
// it is a hint with no alignment rule, but aligned reads keep it cheap.
func openUncached(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_NOCACHE, 1); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
