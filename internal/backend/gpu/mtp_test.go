//go:build linux

package gpu_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/internal/testutil/ref"
)

// mtpModel is the shared GPU model with a trained MTP head.
const mtpModel = "tiny-qwen3-5-moe"

// mtpModels are the GPU models with an MTP head, and whether it was
// trained: the repository's GLM-4.5 has none (transformers has no MTP to
// train), so it is given a random one (testutil.WithDeepSeekMTP) and its
// drafts are checked for exactness only.
var mtpModels = []struct {
	name    string
	trained bool
}{{mtpModel, true}, {"tiny-glm4-moe", false}, {"tiny-deepseek-v32", false}}

// packedMTP is packed at bits for a model of mtpModels.
func packedMTP(t testing.TB, name string, trained bool, bits int) string {
	t.Helper()
	if trained {
		return packed(t, name, bits)
	}
	return packedFrom(t, name, name+"-mtp", pack.Options{Bits: bits}, func() string { return testutil.WithDeepSeekMTP(t, name, "") })
}

// follower is the MTP head of a forward: the CPU runner's, or the GPU
// backend's.
type follower interface {
	MTPFollow(st *model.State, tokens []int, next int, out []float32) error
}

// openDrafts opens the model on the GPU with room for drafts.
func openDrafts(t testing.TB, dir string, drafts int, xo engine.ExpertOptions) *engine.Engine {
	t.Helper()
	return openCUDA(t, dir, engine.Options{ChunkRows: 64, Experts: xo, Drafts: drafts})
}

// TestGPUMTPMatchesCPU runs the MTP head on the GPU and on the CPU over
// every reference prompt, token by token (a trunk step, then the head's row
// for it once the next token is known), at 4 bits for a trained head, at
// 16 for a random one. The GPU's q4 products round differently from the
// CPU's, and the head's input is the trunk's
// output, so the two differ as the trunks do, compounded: the head's
// negative log-likelihood of the token after next agrees within 1%, its
// argmax in at least 95% of rows; the trunk's figures are logged beside
// them.
func TestGPUMTPMatchesCPU(t *testing.T) {
	needGPU(t)
	for _, mm := range mtpModels {
		t.Run(mm.name, func(t *testing.T) { mtpMatchesCPU(t, mm.name, mm.trained) })
	}
}

func mtpMatchesCPU(t *testing.T, name string, trained bool) {
	// A random head's logits are flat, so its argmax turns on the q4
	// products' rounding: it is compared with exact weights.
	bits := 4
	if !trained {
		bits = 16
	}
	dir := packedMTP(t, name, trained, bits)
	g := openDrafts(t, dir, 3, engine.ExpertOptions{})
	c := open(t, dir, "cpu", 64)
	gf, ok := g.Fwd.(follower)
	if !ok {
		t.Fatalf("the GPU forward %T has no MTP head", g.Fwd)
	}
	V := g.Model.Config.Vocab
	var rows, same, trunkSame int
	var nllG, nllC, trunkG, trunkC float64
	var diffs, trunkDiffs []float64
	relDiff := func(a, b []float32) float64 {
		var d, scale float64
		for j := range b {
			d = math.Max(d, math.Abs(float64(a[j]-b[j])))
			scale = math.Max(scale, math.Abs(float64(b[j])))
		}
		return d / scale
	}
	for ci, cs := range refs(t, name).Cases {
		p := cs.Prompt
		sg, _ := g.Model.NewState(len(p))
		sc, _ := c.Model.NewState(len(p))
		lg, lc := make([]float32, V), make([]float32, V)
		for i := 0; i+2 < len(p); i++ {
			tok := p[i : i+1]
			if err := g.Fwd.Forward(sg, tok, lg, false); err != nil {
				t.Fatal(err)
			}
			if err := c.Runner.Forward(sc, tok, lc, false); err != nil {
				t.Fatal(err)
			}
			trunkG -= ref.LogSoftmax(lg)[p[i+1]]
			trunkC -= ref.LogSoftmax(lc)[p[i+1]]
			trunkDiffs = append(trunkDiffs, relDiff(lg, lc))
			if sample.Argmax(lg) == sample.Argmax(lc) {
				trunkSame++
			}
			if err := gf.MTPFollow(sg, tok, p[i+1], lg); err != nil {
				t.Fatal(err)
			}
			if err := c.Runner.MTPFollow(sc, tok, p[i+1], lc); err != nil {
				t.Fatal(err)
			}
			if sg.MTPPos != sc.MTPPos || sg.MTPPos != i+1 {
				t.Fatalf("case %d row %d: MTP rows consumed %d on the GPU, %d on the CPU, want %d", ci, i, sg.MTPPos, sc.MTPPos, i+1)
			}
			nllG -= ref.LogSoftmax(lg)[p[i+2]]
			nllC -= ref.LogSoftmax(lc)[p[i+2]]
			diffs = append(diffs, relDiff(lg, lc))
			rows++
			if sample.Argmax(lg) == sample.Argmax(lc) {
				same++
			}
		}
	}
	sort.Float64s(diffs)
	sort.Float64s(trunkDiffs)
	n := float64(rows)
	t.Logf("%d rows. MTP head: NLL GPU %.5f, CPU %.5f (%+.3f%%), argmax agrees in %d, largest logit difference of the largest logit median %.2e, max %.2e",
		rows, nllG/n, nllC/n, 100*(nllG/nllC-1), same, diffs[rows/2], diffs[rows-1])
	t.Logf("trunk: NLL GPU %.5f, CPU %.5f (%+.3f%%), argmax agrees in %d, largest logit difference median %.2e, max %.2e",
		trunkG/n, trunkC/n, 100*(trunkG/trunkC-1), trunkSame, trunkDiffs[rows/2], trunkDiffs[rows-1])
	if d := math.Abs(nllG/nllC - 1); d > 0.01 {
		t.Errorf("the GPU head's NLL is off the CPU's by %.3f%%, want <= 1%%", 100*d)
	}
	if float64(same) < 0.95*n {
		t.Errorf("the heads' argmax agrees in %d of %d rows, want >= 95%%", same, rows)
	}
}

// top2 is the gap between the two largest values of x.
func top2(x []float32) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	for _, v := range x {
		f := float64(v)
		switch {
		case f > a:
			a, b = f, a
		case f > b:
			b = f
		}
	}
	return a - b
}

// TestGPUDrafts: speculative decoding on the GPU, resident (verifies and
// the head's rows recorded and replayed, or every kernel launched from the
// host), through a pool of a quarter of the records or of top-k records (a
// verify's experts then run in waves), and through three tiers with both
// pools at top-k records,
// leaves greedy tokens as plain decoding gives them for 1, 2 and 3 drafts
// (the choices taken on the device; and on the host, with a penalty), with drafts kept and drafts rejected (so the verify's rollback
// ran) along the way; the same holds resuming from a state copied on the
// device. Sampled decoding with drafts repeats itself for one seed. A
// backend opened without room for drafts decodes without them and says
// why.
func TestGPUDrafts(t *testing.T) {
	needGPU(t)
	for _, mm := range mtpModels {
		t.Run(mm.name, func(t *testing.T) { drafts(t, mm.name, mm.trained) })
	}
}

func drafts(t *testing.T, name string, trained bool) {
	dir := packedMTP(t, name, trained, 4)
	cases := refs(t, name).Cases
	ctx := context.Background()
	gen := func(e *engine.Engine, st *model.State, prompt []int, o engine.GenOptions) ([]int, engine.Stats) {
		t.Helper()
		if st == nil {
			var err error
			if st, err = e.NewState(); err != nil {
				t.Fatal(err)
			}
		}
		got, s, err := e.Generate(ctx, st, prompt, o, nil)
		if err != nil {
			t.Fatal(err)
		}
		return got, s
	}
	m := openDrafts(t, dir, 3, engine.ExpertOptions{}).Model.Manifest
	least := int64(m.Config.TopK) * m.Stores[0].Stride
	pools := []struct {
		name     string
		xo       engine.ExpertOptions
		launched bool // every kernel launched from the host: no recorded steps
	}{
		{"resident", engine.ExpertOptions{}, false},
		{"resident, launched", engine.ExpertOptions{}, true},
		{"quarter", engine.ExpertOptions{GPUPoolShare: 0.25}, false},
		{"topk", engine.ExpertOptions{GPUPoolBytes: least}, false},
		{"tiers, least", engine.ExpertOptions{GPUPoolBytes: least, PoolBytes: least}, false},
	}
	for _, pc := range pools {
		e := openDrafts(t, dir, 3, pc.xo)
		if pc.launched {
			e.Fwd.(interface{ SetGraphs(bool) }).SetGraphs(false)
		}
		var drafted, accepted int
		for ci, c := range cases {
			plain := engine.GenOptions{MaxTokens: 40, IgnoreEOS: true}
			want, _ := gen(e, nil, c.Prompt, plain)
			for d := 1; d <= 3; d++ {
				o := plain
				o.Drafts = d
				got, s := gen(e, nil, c.Prompt, o)
				if i := testutil.FirstDiff(got, want); i >= 0 {
					t.Errorf("pool %s case %d, %d drafts: tokens differ at %d\n got %v\nwant %v", pc.name, ci, d, i, got, want)
				}
				if s.MTP == nil || s.MTP.Disabled != "" || s.MTP.Drafts != d {
					t.Fatalf("pool %s case %d, %d drafts: MTP stats %+v", pc.name, ci, d, s.MTP)
				}
				drafted += s.MTP.Drafted
				accepted += s.MTP.Accepted
			}
		}
		t.Logf("pool %s: %d of %d drafts kept", pc.name, accepted, drafted)

		// Greedy with a penalty: the choices are made on the host, from
		// the logits, with and without drafts.
		pen := engine.GenOptions{MaxTokens: 40, IgnoreEOS: true, Sample: sample.Params{RepetitionPenalty: 1.3}}
		want, _ := gen(e, nil, cases[0].Prompt, pen)
		pen.Drafts = 2
		if got, _ := gen(e, nil, cases[0].Prompt, pen); testutil.FirstDiff(got, want) >= 0 {
			t.Errorf("pool %s: greedy with a repetition penalty, 2 drafts: %v, without %v", pc.name, got, want)
		}
		if (trained && accepted == 0) || accepted == drafted {
			t.Errorf("pool %s: %d of %d drafts kept; want some kept and some rejected", pc.name, accepted, drafted)
		}

		// Resumed from a copy of a prefix (the server's prefix cache).
		c := cases[1]
		n := len(c.Prompt) / 2
		plain := engine.GenOptions{MaxTokens: 24, IgnoreEOS: true}
		want, _ = gen(e, nil, c.Prompt, plain)
		a, _ := e.NewState()
		q, err := e.NewSequence(a, engine.GenOptions{Drafts: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Prefill(ctx, c.Prompt[:n]); err != nil {
			t.Fatal(err)
		}
		b, _ := e.NewState()
		if err := e.CopyState(b, a); err != nil {
			t.Fatal(err)
		}
		o := plain
		o.Drafts = 2
		if got := resume(t, e, b, c.Prompt[n:], o); testutil.FirstDiff(got, want) >= 0 {
			t.Errorf("pool %s: drafts from a copied state: tokens differ at %d\n got %v\nwant %v", pc.name, testutil.FirstDiff(got, want), got, want)
		}

		// Sampled, twice with one seed.
		so := engine.GenOptions{MaxTokens: 32, IgnoreEOS: true, Drafts: 2, Sample: sample.Params{Temperature: 0.8, TopP: 0.95, Seed: 7}}
		s1, st1 := gen(e, nil, c.Prompt, so)
		s2, _ := gen(e, nil, c.Prompt, so)
		if len(s1) != 32 || testutil.FirstDiff(s1, s2) >= 0 || st1.MTP == nil || st1.MTP.Drafted == 0 {
			t.Errorf("pool %s: sampled with drafts: %v then %v, MTP %+v", pc.name, s1, s2, st1.MTP)
		}
	}

	e := openDrafts(t, dir, 0, engine.ExpertOptions{})
	o := engine.GenOptions{MaxTokens: 8, IgnoreEOS: true, Drafts: 2}
	got, s := gen(e, nil, cases[0].Prompt, o)
	o.Drafts = 0
	want, _ := gen(e, nil, cases[0].Prompt, o)
	if s.MTP == nil || !strings.Contains(s.MTP.Disabled, "no room for drafts") || testutil.FirstDiff(got, want) >= 0 {
		t.Errorf("opened without drafts: tokens %v (plain %v), MTP %+v", got, want, s.MTP)
	}
}

// TestGPUQwen3NextMTP: the Qwen3.5 test checkpoint rewritten in
// Qwen3-Next's layout (fused DeltaNet projections, an mtp.* head the
// config does not count; testutil.WriteAsQwen3Next) runs on the GPU as the
// same model: at 4 bits its trunk's logits and its MTP head's are the
// Qwen3.5 pack's bit for bit, token by token over four reference prompts.
func TestGPUQwen3NextMTP(t *testing.T) {
	needGPU(t)
	src := filepath.Join(shared(t), "models", mtpModel)
	if _, err := os.Stat(filepath.Join(src, "model.safetensors.index.json")); err != nil {
		if m, _ := filepath.Glob(filepath.Join(src, "*.safetensors")); len(m) == 0 {
			t.Skipf("model %s: no safetensors in the shared data", mtpModel)
		}
	}
	conv := t.TempDir()
	testutil.WriteAsQwen3Next(t, src, conv)
	dn := filepath.Join(t.TempDir(), "packed")
	if err := pack.Pack(context.Background(), conv, dn, pack.Options{Bits: 4}); err != nil {
		t.Fatal(err)
	}
	a := openDrafts(t, packed(t, mtpModel, 4), 3, engine.ExpertOptions{})
	b := openDrafts(t, dn, 3, engine.ExpertOptions{})
	if b.Model.Config.Family != "qwen3_next" || b.Model.MTP == nil {
		t.Fatalf("converted pack: family %q, MTP head loaded %v", b.Model.Config.Family, b.Model.MTP != nil)
	}
	af, aok := a.Fwd.(follower)
	bf, bok := b.Fwd.(follower)
	if !aok || !bok {
		t.Fatalf("the GPU forwards %T, %T have no MTP head", a.Fwd, b.Fwd)
	}
	V := a.Model.Config.Vocab
	same := func(what string, ci, i int, x, y []float32) {
		t.Helper()
		for j := range x {
			if math.Float32bits(x[j]) != math.Float32bits(y[j]) {
				t.Fatalf("case %d row %d: %s logit %d is %v for qwen3_next, %v for qwen3_5_moe", ci, i, what, j, y[j], x[j])
			}
		}
	}
	rows := 0
	for ci, cs := range refs(t, mtpModel).Cases[:4] {
		p := cs.Prompt
		sa, _ := a.Model.NewState(len(p))
		sb, _ := b.Model.NewState(len(p))
		la, lb := make([]float32, V), make([]float32, V)
		for i := 0; i+1 < len(p); i++ {
			tok := p[i : i+1]
			if err := a.Fwd.Forward(sa, tok, la, false); err != nil {
				t.Fatal(err)
			}
			if err := b.Fwd.Forward(sb, tok, lb, false); err != nil {
				t.Fatal(err)
			}
			same("trunk", ci, i, la, lb)
			if err := af.MTPFollow(sa, tok, p[i+1], la); err != nil {
				t.Fatal(err)
			}
			if err := bf.MTPFollow(sb, tok, p[i+1], lb); err != nil {
				t.Fatal(err)
			}
			same("MTP", ci, i, la, lb)
			rows++
		}
	}
	t.Logf("%d rows: trunk and MTP logits bit-identical", rows)
}
