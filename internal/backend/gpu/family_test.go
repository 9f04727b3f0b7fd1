//go:build linux && !nocuda

package gpu_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/backend/gpu"
	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestGPUFamilyFallback: every family's pack is accepted (qwen3_next
// as Qwen3.5's blocks, glm4_moe, gpt_oss, deepseek_v32), and a model the
// GPU does not run (top-33 routing) is refused saying why: device auto
// runs it on the CPU and says why, and device cuda is an error. Needs no
// GPU.
func TestGPUFamilyFallback(t *testing.T) {
	supported := func(name, dir string) {
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		err = gpu.Supported(m)
		m.Close()
		if err != nil {
			t.Errorf("gpu.Supported(%s) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"tiny-qwen3-next", "tiny-glm4-moe"} {
		if !testutil.ExtraPresent(name) {
			t.Skipf("model %s: its archive is not where the checkout was when this binary was built", name)
		}
		supported(name, testutil.Packed(t, name, 4))
	}
	for _, name := range []string{"tiny-gpt-oss", "tiny-deepseek-v32"} {
		if dir := packed(t, name, 4); dir != "" {
			supported(name, dir)
		}
	}
	const why = "top-33 routing not supported on the GPU"
	dir := testutil.PackedVariant(t, "tiny-deepseek-v32", 4, testutil.GPURefused)
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = gpu.Supported(m)
	m.Close()
	if err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("gpu.Supported(top-33) = %v, want a refusal saying %q", err, why)
	}
	e, err := engine.Open(context.Background(), dir, engine.Options{Device: "auto", Ctx: 256})
	if err != nil {
		t.Fatal(err)
	}
	if e.OnGPU() || !strings.Contains(e.DeviceNote, why) {
		t.Errorf("device auto: device %q, note %q; want the CPU and a note saying %q", e.Device, e.DeviceNote, why)
	}
	e.Close()
	e, err = engine.Open(context.Background(), dir, engine.Options{Device: "cuda", Ctx: 256})
	if err == nil {
		e.Close()
	}
	if err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("device cuda: %v, want an error saying %q", err, why)
	}
}

// TestNeedBytes: the device memory a model's experts need counts the MoE
// layers only: a dense layer's records are holes in the store, never
// uploaded (GLM-4.5's first layer). Needs no GPU.
func TestNeedBytes(t *testing.T) {
	const name = "tiny-glm4-moe"
	if !testutil.ExtraPresent(name) {
		t.Skipf("model %s: its archive is not where the checkout was when this binary was built", name)
	}
	m, err := model.Load(testutil.Packed(t, name, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, man := &m.Config, m.Manifest
	if c.FirstDense != 1 || man.ExpertLayers != c.Layers {
		t.Fatalf("%s: %d leading dense layers, %d expert layers of %d: not the shape this test expects", name, c.FirstDense, man.ExpertLayers, c.Layers)
	}
	dense, exps := gpu.NeedBytes(m)
	if want := int64(c.Layers-c.FirstDense) * int64(man.Experts) * man.Stores[0].Stride; exps != want || dense != man.DenseBytes {
		t.Errorf("NeedBytes = %d dense, %d experts; want %d, %d (%d MoE layers of %d records)", dense, exps, man.DenseBytes, want, c.Layers-c.FirstDense, man.Experts)
	}
}

// TestGPUDeepSeekV3: the tiny DeepSeek-V3.2 as a deepseek_v3 config (no
// indexer: every row attends to every position, the latent attention's
// other path) gives the CPU's logits on the GPU, at 16 bits, over a
// prompt of 600 positions (three chunks of the attention's split).
func TestGPUDeepSeekV3(t *testing.T) {
	needGPU(t)
	const name = "tiny-deepseek-v32"
	modelSrc(t, name)
	dir := testutil.PackedVariant(t, name, 16, testutil.DeepSeekV3)
	g, c := open(t, dir, "cuda", 64), open(t, dir, "cpu", 64)
	if m, ok := g.Model.Arch.Layers[1].Mixer.(*block.MLA); !ok || m.Index != nil {
		t.Fatal("the deepseek_v3 config did not build an MLA without indexer")
	}
	prompt := refs(t, name).Long[0].Prompt[:600]
	V := g.Model.Config.Vocab
	lg, lc := all(t, g, prompt), all(t, c, prompt)
	var worst float64
	same := 0
	for p := range prompt {
		a, b := lg[p*V:(p+1)*V], lc[p*V:(p+1)*V]
		for i := range a {
			worst = math.Max(worst, math.Abs(float64(a[i]-b[i])))
		}
		if sample.Argmax(a) == sample.Argmax(b) {
			same++
		}
	}
	t.Logf("%d positions: logits within %.2e of the CPU's, argmax agrees in %d", len(prompt), worst, same)
	if worst > 1e-3 || same < len(prompt)-2 {
		t.Errorf("logits differ by up to %g, argmax agrees in %d of %d", worst, same, len(prompt))
	}
}
