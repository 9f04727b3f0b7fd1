//go:build linux && !nocuda

package gpu_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/backend/gpu"
	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestGPUFamilyFallback: a family the GPU backend does not run is refused
// by name: qwen3_next packs into Qwen3.5's tensor layout and block order,
// but it has not run on a GPU, so device auto runs it on the CPU and says
// why, and device cuda is an error. Needs no GPU.
func TestGPUFamilyFallback(t *testing.T) {
	const name = "tiny-qwen3-next"
	dir := testutil.Packed(t, name, 4)
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = gpu.Supported(m)
	m.Close()
	if err == nil || !strings.Contains(err.Error(), "qwen3_next") {
		t.Errorf("gpu.Supported(%s) = %v, want a refusal naming qwen3_next", name, err)
	}
	e, err := engine.Open(context.Background(), dir, engine.Options{Device: "auto", Ctx: 256})
	if err != nil {
		t.Fatal(err)
	}
	if e.OnGPU() || !strings.Contains(e.DeviceNote, "qwen3_next") {
		t.Errorf("device auto: device %q, note %q; want the CPU and a note naming qwen3_next", e.Device, e.DeviceNote)
	}
	e.Close()
	e, err = engine.Open(context.Background(), dir, engine.Options{Device: "cuda", Ctx: 256})
	if err == nil {
		e.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "qwen3_next") {
		t.Errorf("device cuda: %v, want an error naming qwen3_next", err)
	}
}
