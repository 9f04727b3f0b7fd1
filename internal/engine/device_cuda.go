//go:build linux && !nocuda

package engine

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/backend/gpu"
	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/model"
)

// gpuForwarder owns its device as well as the backend.
type gpuForwarder struct {
	*gpu.Runner
}

// Close frees the backend, then releases the device.
func (g gpuForwarder) Close() {
	g.Runner.Close()
	g.Runner.Dev.Close()
}

// DevicePool implements DevicePooler.
func (g gpuForwarder) DevicePool() DevicePool { return g.Runner.Pool() }

// gpuPresent reports whether the driver finds a GPU, which device auto
// may then choose.
func gpuPresent() bool {
	n, err := cuda.Count()
	return err == nil && n > 0
}

// openCUDA opens GPU ordinal and uploads m for steps of rows rows, its
// experts whole or through a device pool (o.Experts), with room for
// o.States sequences and o.Drafts drafts per step, or says why the GPU is
// not usable (no driver, no GPU, too old, model not supported or too
// large).
func openCUDA(m *model.Model, ordinal, rows, ctx int, o Options) (Forwarder, string, error) {
	xo := o.Experts
	if err := gpu.Supported(m); err != nil {
		return nil, "", err
	}
	n, err := cuda.Count()
	if err != nil {
		return nil, "", err
	}
	if n == 0 {
		return nil, "", fmt.Errorf("no NVIDIA GPU found")
	}
	dev, err := cuda.Open(ordinal)
	if err != nil {
		return nil, "", err
	}
	if dev.Major < 8 {
		dev.Close()
		return nil, "", fmt.Errorf("GPU %d (%s) has compute capability %d.%d; sluice's kernels need 8.0 (Ampere) or later", ordinal, dev.Name, dev.Major, dev.Minor)
	}
	r, err := gpu.New(dev, m, gpu.Config{Rows: rows, Ctx: ctx, PoolBytes: xo.GPUPoolBytes, PoolShare: xo.GPUPoolShare,
		Policy: xo.Policy, NoLookahead: xo.NoLookahead, VRAMBytes: xo.VRAMBytes, States: o.States, Drafts: o.Drafts, CPUShare: xo.GPUCPUShare, CPUAuto: xo.GPUCPUAuto, CPUThreads: o.Threads})
	if err != nil {
		dev.Close()
		return nil, "", err
	}
	return gpuForwarder{r}, fmt.Sprintf("cuda:%d (%s)", ordinal, dev.Name), nil
}

// The GPU backend runs speculative decoding itself.
var _ drafter = gpuForwarder{}

// The GPU backend takes a greedy verify's and the head's choices itself.
var _ greedyDrafter = gpuForwarder{}
