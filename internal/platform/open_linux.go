package platform

import (
	"os"
	"syscall"
)

func openUncached(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
}
