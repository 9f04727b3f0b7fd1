package model

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestQwen3NextIsQwen35: Qwen3.5-MoE's test checkpoint re-laid as
// qwen3_next (fused DeltaNet projections, an MTP head the config does not
// count) packs into the same model: trunk logits and MTP logits bit for bit
// those of the qwen3_5_moe original on the reference prompts. The fused
// layout itself is checked against transformers by TestConformance on
// tiny-qwen3-next; this checks the split is the exact inverse of the
// fusion, and that a Qwen3-Next checkpoint's mtp.* head loads and drafts.
func TestQwen3NextIsQwen35(t *testing.T) {
	if testing.Short() {
		t.Skip("packs a converted checkpoint")
	}
	const name = "tiny-qwen3-5-moe"
	src := testutil.ModelDir(t, name)
	conv := t.TempDir()
	testutil.WriteAsQwen3Next(t, src, conv)
	dir := filepath.Join(t.TempDir(), "packed")
	if err := pack.Pack(context.Background(), conv, dir, pack.Options{Bits: 16}); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := NewResidentProvider(b)
	if err != nil {
		t.Fatal(err)
	}
	b.Experts = p
	if b.Config.Family != "qwen3_next" || b.Config.MTPLayers != 1 || b.MTP == nil {
		t.Fatalf("converted checkpoint: family %q, %d MTP layers, head loaded %v", b.Config.Family, b.Config.MTPLayers, b.MTP != nil)
	}
	a := load(t, name, 16)
	ra, rb := NewRunner(a, 2, 160), NewRunner(b, 2, 160)
	defer ra.Close()
	defer rb.Close()
	H, V := a.Config.Hidden, a.Config.Vocab
	run := func(m *Model, r *Runner, prompt []int) ([]float32, []float32) {
		T := len(prompt)
		st, _ := m.NewState(T)
		out := make([]float32, T*V)
		if err := r.Forward(st, prompt, out, true); err != nil {
			t.Fatal(err)
		}
		hid := append([]float32(nil), r.final[:(T-1)*H]...)
		mtp := make([]float32, (T-1)*V)
		if err := r.MTPForward(st, 0, hid, prompt[1:], mtp, true); err != nil {
			t.Fatal(err)
		}
		return out, mtp
	}
	for ci, c := range testutil.LoadRefs(t, name).Cases[:4] {
		la, ma := run(a, ra, c.Prompt)
		lb, mb := run(b, rb, c.Prompt)
		for i := range la {
			if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
				t.Fatalf("case %d: logit %d (pos %d) %v, qwen3_5_moe %v", ci, i, i/V, lb[i], la[i])
			}
		}
		for i := range ma {
			if math.Float32bits(ma[i]) != math.Float32bits(mb[i]) {
				t.Fatalf("case %d: MTP logit %d (row %d) %v, qwen3_5_moe %v", ci, i, i/V, mb[i], ma[i])
			}
		}
	}
}

// The tiny Qwen3-Next references were computed by a transformers model that
// had been cast to bf16 for export and back to float32 (scripts/tiny), so
// its rotary inverse frequencies, a buffer rather than a weight, were
// rounded to bf16 on the way; the model read back from disk recomputes them
// in float32, as sluice does. That rounding, and nothing else, is why the
// shared tables allow this model testutil.LogitTol's wider bound: with the
// frequencies rounded to bf16 as the reference had them, every case's last
// logits agree within 1e-4, every position's argmax agrees, and so do the
// 48 greedy tokens of every case.
func TestQwen3NextReferenceRope(t *testing.T) {
	const name = "tiny-qwen3-next"
	m := load(t, name, 16)
	round := func(inv []float32) {
		for i, f := range inv {
			inv[i] = quant.BF16ToF32(quant.BF16(f))
		}
	}
	round(m.Arch.Rope.InvFreq)
	for _, L := range m.Arch.Layers {
		if a, ok := L.Mixer.(*block.Attn); ok && a.Rope != nil {
			round(a.Rope.InvFreq)
		}
	}
	refs := testutil.LoadRefs(t, name)
	r := NewRunner(m, 2, 64)
	defer r.Close()
	V := m.Config.Vocab
	var worst float64
	for ci, c := range refs.Cases {
		st, err := m.NewState(len(c.Prompt))
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(c.Prompt)*V)
		if err := r.Forward(st, c.Prompt, out, true); err != nil {
			t.Fatal(err)
		}
		for p := range c.Prompt {
			if got := sample.Argmax(out[p*V : (p+1)*V]); got != c.Argmax[p] {
				t.Errorf("case %d pos %d: argmax %d, want %d", ci, p, got, c.Argmax[p])
			}
		}
		last := out[(len(c.Prompt)-1)*V:]
		for i, want := range c.LastLogits {
			worst = math.Max(worst, math.Abs(float64(last[i])-want))
		}
	}
	t.Logf("rope frequencies in bf16, as the reference had them: last logits within %.2e over %d cases", worst, len(refs.Cases))
	// And the 48 greedy tokens of every case, exactly.
	logits := make([]float32, V)
	for ci, c := range refs.Cases {
		st, _ := m.NewState(len(c.Prompt) + len(c.Greedy))
		if err := r.Forward(st, c.Prompt, logits, false); err != nil {
			t.Fatal(err)
		}
		for i, want := range c.Greedy {
			next := sample.Argmax(logits)
			if next != want {
				t.Errorf("case %d: greedy token %d is %d, want %d", ci, i, next, want)
				break
			}
			if err := r.Forward(st, []int{next}, logits, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	if worst > 1e-4 {
		t.Errorf("last logits differ by up to %g", worst)
	}
}
