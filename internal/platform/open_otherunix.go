//go:build unix && !linux && !darwin

package platform

import (
	"errors"
	"os"
)

// uncachedName names the bypass this platform lacks.
const uncachedName = "uncached reads"

func openUncached(path string) (*os.File, error) {
	return nil, errors.New("no uncached reads on this platform")
}
