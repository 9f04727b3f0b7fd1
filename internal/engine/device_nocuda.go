//go:build !linux || nocuda

package engine

import (
	"fmt"
	"runtime"

	"github.com/sluicelm/sluice/internal/model"
)

// gpuPresent is false: this build has no GPU backend.
func gpuPresent() bool { return false }

// openCUDA reports that this build has no GPU backend.
func openCUDA(m *model.Model, ordinal, rows, ctx int, o Options) (Forwarder, string, error) {
	if runtime.GOOS != "linux" {
		return nil, "", fmt.Errorf("the GPU backend is available on linux only")
	}
	return nil, "", fmt.Errorf("this binary was built without CUDA support (-tags nocuda)")
}
