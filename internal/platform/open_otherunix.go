//go:build unix && !linux && !darwin

package platform

import (
	"errors"
	"os"
)

func openUncached(path string) (*os.File, error) {
	return nil, errors.New("no uncached reads on this platform")
}
