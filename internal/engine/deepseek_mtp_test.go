package engine_test

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

const dsModel = "tiny-deepseek-v32"

// deepSeekMTPCheckpoint writes a copy of the tiny DeepSeek-V3.2 with
// num_nextn_predict_layers 1 and a seeded random MTP module stored as
// DeepSeek's checkpoints store it: layer num_hidden_layers with enorm,
// hnorm, eh_proj, shared_head and a full decoder layer (MLA + MoE). Each
// tensor of its decoder layer is drawn with the mean and spread of the
// same tensor of trunk layer 1, so activations keep their scale. zero
// names a half of eh_proj's columns to zero: "embed" (the first H, which
// multiply enorm(embed)), "hidden" (the last H, which multiply hnorm(h)) or
// "" (none).
func deepSeekMTPCheckpoint(t *testing.T, zero string) string {
	return mtpCheckpoint(t, dsModel, zero)
}

// mtpCheckpoint is testutil.WithDeepSeekMTP: deepSeekMTPCheckpoint for
// any model whose MTP module has DeepSeek-V3's layout (deepseek_v32,
// glm4_moe) and whose layer 1 is a MoE layer.
func mtpCheckpoint(t *testing.T, name, zero string) string {
	return testutil.WithDeepSeekMTP(t, name, zero)
}

// TestDeepSeekMTPDrafts: a DeepSeek checkpoint with an MTP module packs it
// (its expert records after the trunk's), loads it, and drafts with it;
// greedy tokens with D = 1, 2, 3 drafts are plain greedy's exactly, with
// the store resident and through the smallest expert pool.
func TestDeepSeekMTPDrafts(t *testing.T) { testMTPDrafts(t, dsModel) }

// testMTPDrafts is TestDeepSeekMTPDrafts on mtpCheckpoint(name).
func testMTPDrafts(t *testing.T, name string) {
	dir := packMTP(t, name, "")
	openDir := func(o engine.Options) *engine.Engine {
		o.Threads = 2
		e, err := engine.Open(context.Background(), dir, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return e
	}
	resident := openDir(engine.Options{})
	m := resident.Model
	if m.MTP == nil || m.Manifest.ExpertLayers != m.Config.Layers+1 || m.Config.MTPLayers != 1 {
		t.Fatalf("MTP module not loaded: MTP %v, expert layers %d of %d trunk layers", m.MTP != nil, m.Manifest.ExpertLayers, m.Config.Layers)
	}
	st := &m.Manifest.Stores[0]
	minPool := openDir(engine.Options{Experts: engine.ExpertOptions{PoolBytes: int64(experts.MinSlots(&m.Config)) * st.Stride}})
	if minPool.Stream == nil {
		t.Fatalf("the smallest pool did not stream: %s", minPool.ExpertPlan)
	}
	refs := testutil.LoadRefs(t, name)
	o := greedy48
	o.MaxTokens = 24
	for _, s := range []struct {
		name string
		e    *engine.Engine
	}{{"resident", resident}, {"min-pool", minPool}} {
		for ci, c := range refs.Cases[:3] {
			want, _ := generateOpts(t, s.e, c.Prompt, o)
			if ci == 0 && testutil.FirstDiff(want, c.Greedy[:min(len(c.Greedy), len(want))]) >= 0 {
				t.Errorf("%s case %d: plain greedy %v, reference %v", s.name, ci, want, c.Greedy)
			}
			for _, d := range []int{1, 2, 3} {
				od := o
				od.Drafts = d
				got, gs := generateOpts(t, s.e, c.Prompt, od)
				if i := testutil.FirstDiff(got, want); i >= 0 || len(got) != len(want) {
					t.Errorf("%s D=%d case %d: tokens differ from plain greedy at %d\n got %v\nwant %v", s.name, d, ci, i, got, want)
				}
				mt := gs.MTP
				if mt == nil || mt.Disabled != "" || mt.Drafts != d || mt.Drafted == 0 || mt.Steps+mt.Accepted != len(got)-1 {
					t.Fatalf("%s D=%d case %d: MTP stats %+v: the module did not draft", s.name, d, ci, mt)
				}
				if ci == 0 {
					t.Logf("%s D=%d: %d of %d drafts accepted (random MTP weights)", s.name, d, mt.Accepted, mt.Drafted)
				}
			}
		}
	}
}

// packDeepSeekMTP packs deepSeekMTPCheckpoint(zero) exactly (16 bits).
func packDeepSeekMTP(t *testing.T, zero string) string { return packMTP(t, dsModel, zero) }

// packMTP packs mtpCheckpoint(name, zero) exactly (16 bits).
func packMTP(t *testing.T, name, zero string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "packed")
	if err := pack.Pack(context.Background(), mtpCheckpoint(t, name, zero), dir, pack.Options{Bits: 16}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDeepSeekMTPInputs checks which input feeds which half of eh_proj, as
// DeepSeek-V3 defines it (eh_proj over [enorm(embed(t_{j+1})) ‖
// hnorm(h_j)]): with the hidden half of eh_proj zero the head's logits do
// not depend on the hidden states it is given, and with the embedding half
// zero they do not depend on the tokens; each time the other input still
// changes them.
func TestDeepSeekMTPInputs(t *testing.T) {
	for _, zero := range []string{"hidden", "embed"} {
		e, err := engine.Open(context.Background(), packDeepSeekMTP(t, zero), engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		m, r := e.Model, e.Runner
		H, V := m.Config.Hidden, m.Config.Vocab
		const n = 5
		rng := rand.New(rand.NewPCG(5, 6))
		hidden := func() []float32 {
			h := make([]float32, n*H)
			for i := range h {
				h[i] = float32(rng.NormFloat64())
			}
			return h
		}
		logits := func(h []float32, toks []int) []float32 {
			st, err := m.NewState(16)
			if err != nil {
				t.Fatal(err)
			}
			out := make([]float32, n*V)
			if err := r.MTPForward(st, 0, h, toks, out, true); err != nil {
				t.Fatal(err)
			}
			return out
		}
		h1, h2 := hidden(), hidden()
		t1, t2 := []int{5, 17, 300, 41, 9}, []int{77, 3, 1000, 2, 64}
		base := logits(h1, t1)
		unchanged, changed := logits(h1, t2), logits(h2, t1) // other tokens; other hidden states
		if zero == "hidden" {
			unchanged, changed = changed, unchanged
		}
		if !slices.Equal(base, unchanged) {
			t.Errorf("eh_proj's %s half zero: the logits depend on the %s input", zero, zero)
		}
		if slices.Equal(base, changed) {
			t.Errorf("eh_proj's %s half zero: the logits do not depend on the other input", zero)
		}
		e.Close()
	}
}

// TestDeepSeekMTPFollowChunked: DeepSeek's MTP module fed chunk by chunk
// (MTPFollow after each trunk step, the last row's token arriving later)
// fills the same latent cache and gives bit-identical logits to one batch
// over the whole prompt.
func TestDeepSeekMTPFollowChunked(t *testing.T) { testMTPFollowChunked(t, dsModel) }

// testMTPFollowChunked is TestDeepSeekMTPFollowChunked on
// mtpCheckpoint(name).
func testMTPFollowChunked(t *testing.T, name string) {
	e, err := engine.Open(context.Background(), packMTP(t, name, ""), engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m := e.Model
	p := testutil.LoadRefs(t, name).Cases[5].Prompt
	T := len(p)
	H, V := m.Config.Hidden, m.Config.Vocab
	one := model.NewRunner(m, 2, 64)
	defer one.Close()
	if T > one.MaxRows {
		t.Fatalf("prompt of %d tokens", T)
	}
	a, _ := m.NewState(T)
	if err := one.Forward(a, p, make([]float32, V), false); err != nil {
		t.Fatal(err)
	}
	hid := make([]float32, 0, (T-1)*H)
	for i := 0; i < T-1; i++ {
		hid = append(hid, one.Hidden(i)...)
	}
	want := make([]float32, (T-1)*V)
	if err := one.MTPForward(a, 0, hid, p[1:], want, true); err != nil {
		t.Fatal(err)
	}
	for _, rows := range []int{1, 7, 64} {
		r := model.NewRunner(m, 2, rows)
		b, _ := m.NewState(T)
		for i := 0; i < T-1; i += rows {
			j := min(i+rows, T-1)
			if err := r.Forward(b, p[i:j], make([]float32, V), false); err != nil {
				t.Fatal(err)
			}
			if err := r.MTPFollow(b, p[i:j], -1, nil); err != nil {
				t.Fatal(err)
			}
		}
		got := make([]float32, V)
		if err := r.MTPFollow(b, nil, p[T-1], got); err != nil {
			t.Fatal(err)
		}
		r.Close()
		if b.MTPPos != T-1 {
			t.Fatalf("rows %d: MTPPos %d, want %d", rows, b.MTPPos, T-1)
		}
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(want[(T-2)*V+i]) {
				t.Fatalf("rows %d: last MTP logit %d = %v, one batch %v", rows, i, v, want[(T-2)*V+i])
			}
		}
	}
}
