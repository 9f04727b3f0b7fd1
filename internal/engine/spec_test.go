package engine_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
)

const specModel = "tiny-qwen3-5-moe"

// pooled opens the exact model with its experts streamed through a pool of
// a quarter of the expert store.
func pooled(t *testing.T, o engine.Options) *engine.Engine {
	t.Helper()
	m, err := model.Load(testutil.Packed(t, specModel, 16))
	if err != nil {
		t.Fatal(err)
	}
	st := &m.Manifest.Stores[0]
	total := int64(m.Manifest.ExpertLayers*m.Manifest.Experts) * st.Stride
	m.Close()
	o.Experts.PoolBytes = total / 4
	e := open(t, specModel, o)
	if e.Stream == nil {
		t.Fatalf("a pool of %d bytes did not stream: %s", o.Experts.PoolBytes, e.ExpertPlan)
	}
	return e
}

// TestDraftsGreedyExact: with temperature 0, tokens with D drafts are the
// reference's plain greedy tokens for every D, on every reference prompt,
// with the whole store resident or a 25% expert pool, and with prefill
// chunks that split the MTP rows across batches.
func TestDraftsGreedyExact(t *testing.T) {
	refs := testutil.LoadRefs(t, specModel)
	type setup struct {
		name  string
		e     *engine.Engine
		cases []testutil.Case
		ds    []int
	}
	resident := open(t, specModel, engine.Options{})
	pool := pooled(t, engine.Options{})
	setups := []setup{
		{"resident", resident, refs.Cases, []int{1, 3}},
		{"resident", resident, refs.Cases[:6], []int{2, 4}},
		{"resident/chunk7", open(t, specModel, engine.Options{ChunkRows: 7}), refs.Cases[:3], []int{2, 6}},
		{"pool25", pool, refs.Cases, []int{1, 3}},
		{"pool25", pool, refs.Cases[:6], []int{0, 2, 4}},
	}
	for _, s := range setups {
		for _, d := range s.ds {
			var drafted, accepted, steps int
			for ci, c := range s.cases {
				o := greedy48
				o.Drafts = d
				got, st := generateOpts(t, s.e, c.Prompt, o)
				if i := testutil.FirstDiff(got, c.Greedy); i >= 0 {
					t.Errorf("%s D=%d case %d: tokens differ from plain greedy at %d\n got %v\nwant %v", s.name, d, ci, i, got, c.Greedy)
				}
				if d == 0 {
					if st.MTP != nil {
						t.Errorf("%s: drafts off but MTP stats %+v", s.name, st.MTP)
					}
					continue
				}
				m := st.MTP
				if m == nil || m.Drafts != min(d, s.e.Runner.MaxRows-1) || len(m.Acceptance) != m.Drafts {
					t.Fatalf("%s D=%d: MTP stats %+v", s.name, d, m)
				}
				if m.Steps+m.Accepted != len(got)-1 || m.Accepted > m.Drafted {
					t.Errorf("%s D=%d case %d: %d steps + %d accepted != %d tokens after the first (drafted %d)", s.name, d, ci, m.Steps, m.Accepted, len(got)-1, m.Drafted)
				}
				drafted += m.Drafted
				accepted += m.Accepted
				steps += m.Steps
			}
			if d > 0 {
				t.Logf("%s D=%d: %d/%d drafts accepted, %.2f tokens per trunk step", s.name, d, accepted, drafted, float64(steps+accepted)/float64(steps))
				if accepted == 0 {
					t.Errorf("%s D=%d: no draft accepted: the MTP head is not drafting the model's tokens", s.name, d)
				}
			}
		}
	}
}

// generateOpts runs one generation on a fresh state, without an emit callback.
func generateOpts(t *testing.T, e *engine.Engine, prompt []int, o engine.GenOptions) ([]int, engine.Stats) {
	t.Helper()
	return generate(t, e, prompt, o, nil)
}

// TestDraftsMatchPlain: greedy with penalties, EOS inside an accepted
// run, the end of the context, and short lengths give the same tokens and
// stop reason with drafts as without.
func TestDraftsMatchPlain(t *testing.T) {
	refs := testutil.LoadRefs(t, specModel)
	e := open(t, specModel, engine.Options{})
	small := open(t, specModel, engine.Options{Ctx: 40})
	pen := greedy48
	pen.Sample = sample.Params{RepetitionPenalty: 1.3, PresencePenalty: 0.4, FrequencyPenalty: 0.2}
	eos := greedy48
	eos.IgnoreEOS = false
	type variant struct {
		name string
		e    *engine.Engine
		o    engine.GenOptions
		ci   int
		eos  bool
	}
	var vs []variant
	for ci := range 4 {
		vs = append(vs, variant{fmt.Sprint("penalties/", ci), e, pen, ci, false})
	}
	vs = append(vs, variant{"eos", e, eos, 0, true}, variant{"eos", e, eos, 3, true}, variant{"context", small, greedy48, 2, false})
	for n := range 6 {
		o := greedy48
		o.MaxTokens = n
		vs = append(vs, variant{fmt.Sprint("max", n), e, o, 1, false})
	}
	for _, v := range vs {
		c := refs.Cases[v.ci]
		old := v.e.Model.Config.EOS
		if v.eos {
			// Declare a mid-continuation token EOS (sequences read the
			// EOS ids when they start).
			v.e.Model.Config.EOS = []int{c.Greedy[13]}
		}
		want, ws := generateOpts(t, v.e, c.Prompt, v.o)
		for _, d := range []int{1, 3, 5} {
			o := v.o
			o.Drafts = d
			got, gs := generateOpts(t, v.e, c.Prompt, o)
			if !slices.Equal(got, want) || gs.StopReason != ws.StopReason {
				t.Errorf("%s case %d D=%d: %v (%s), plain %v (%s)", v.name, v.ci, d, got, gs.StopReason, want, ws.StopReason)
			}
		}
		v.e.Model.Config.EOS = old
	}
}

// TestDraftsSeeded: sampling with drafts is reproducible from the seed.
func TestDraftsSeeded(t *testing.T) {
	c := testutil.LoadRefs(t, specModel).Cases[1]
	e := open(t, specModel, engine.Options{})
	o := func(seed uint64) engine.GenOptions {
		return engine.GenOptions{MaxTokens: 48, IgnoreEOS: true, Drafts: 3,
			Sample: sample.Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepetitionPenalty: 1.1, Seed: seed}}
	}
	a, s := generateOpts(t, e, c.Prompt, o(7))
	b, _ := generateOpts(t, e, c.Prompt, o(7))
	if !slices.Equal(a, b) || len(a) != 48 {
		t.Errorf("seed 7 twice: %v and %v", a, b)
	}
	if d, _ := generateOpts(t, e, c.Prompt, o(8)); slices.Equal(a, d) {
		t.Errorf("seeds 7 and 8 gave the same tokens %v", a)
	}
	if s.MTP == nil || s.MTP.Drafted == 0 || s.MTP.Accepted == 0 {
		t.Errorf("MTP stats %+v: want drafts proposed and some kept", s.MTP)
	}
}

// TestDraftsDistribution checks speculative sampling end to end against
// the exact distribution: over many seeds, the first two generated tokens
// (the second decided by the acceptance rule on the head's draft, or the
// residual draw) follow p(t1)·p(t2|t1) computed from the trunk alone.
func TestDraftsDistribution(t *testing.T) {
	ctx := context.Background()
	c := testutil.LoadRefs(t, specModel).Cases[2]
	e := open(t, specModel, engine.Options{})
	V := e.Model.Config.Vocab
	params := sample.Params{Temperature: 1.5, TopK: 3}

	// The exact joint distribution from the trunk.
	smp, _ := sample.New(params, V)
	logits := make([]float32, V)
	st, _ := e.NewState()
	if err := e.Runner.Forward(st, c.Prompt, logits, false); err != nil {
		t.Fatal(err)
	}
	p1 := make([]float32, V)
	smp.Probs(p1, logits, c.Prompt)
	want := map[[2]int]float64{}
	for t1, pr := range p1 {
		if pr == 0 {
			continue
		}
		s2, _ := e.NewState()
		if err := s2.CopyFrom(st); err != nil {
			t.Fatal(err)
		}
		if err := e.Runner.Forward(s2, []int{t1}, logits, false); err != nil {
			t.Fatal(err)
		}
		p2 := make([]float32, V)
		smp.Probs(p2, logits, append(slices.Clone(c.Prompt), t1))
		for t2, q := range p2 {
			if q > 0 {
				want[[2]int{t1, t2}] = float64(pr) * float64(q)
			}
		}
	}

	// Speculative generations from a prefilled prefix.
	o := engine.GenOptions{MaxTokens: 3, IgnoreEOS: true, Drafts: 1, Sample: params}
	prefix, _ := e.NewState()
	{
		q, err := e.NewSequence(prefix, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Prefill(ctx, c.Prompt[:len(c.Prompt)-1]); err != nil {
			t.Fatal(err)
		}
	}
	const N = 2500
	got := map[[2]int]int{}
	var drafted, accepted int
	s, _ := e.NewState()
	for i := range N {
		if err := s.CopyFrom(prefix); err != nil {
			t.Fatal(err)
		}
		o.Sample.Seed = uint64(i)
		q, err := e.NewSequence(s, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Prefill(ctx, c.Prompt[len(c.Prompt)-1:]); err != nil {
			t.Fatal(err)
		}
		var toks []int
		for !q.Done() && len(toks) < 2 {
			tk, _, err := q.Step(ctx)
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, tk...)
		}
		got[[2]int{toks[0], toks[1]}]++
		m := q.Stats().MTP
		drafted += m.Drafted
		accepted += m.Accepted
	}
	// Chi-square over cells expecting at least 5 draws, the rest pooled.
	var chi, restP float64
	restN, cells := 0, 0
	for k, pr := range want {
		if pr*N < 5 {
			restP += pr
			restN += got[k]
			continue
		}
		d := float64(got[k]) - pr*N
		chi += d * d / (pr * N)
		cells++
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			t.Fatalf("drew %v %d times; the model gives it probability 0", k, n)
		}
	}
	if restP*N >= 1 {
		d := float64(restN) - restP*N
		chi += d * d / (restP * N)
		cells++
	}
	// The 1e-4 upper quantile of chi-square with up to 9 degrees of freedom
	// is below 34; seeds are fixed, so the test is deterministic.
	t.Logf("%d draws, %d cells, chi-square %.1f; %d/%d drafts accepted", N, cells, chi, accepted, drafted)
	if cells < 4 || cells > 10 {
		t.Fatalf("%d cells; the test wants a distribution over a handful of pairs", cells)
	}
	if chi > 34 {
		t.Errorf("chi-square %.1f over %d cells: the speculative tokens do not follow the model's distribution", chi, cells)
	}
	if accepted == 0 || accepted == drafted {
		t.Errorf("%d of %d drafts accepted: the test wants both outcomes exercised", accepted, drafted)
	}
	if math.IsNaN(chi) {
		t.Fatal("NaN chi-square")
	}
}

// TestDraftsWithoutMTP: a model without an MTP head decodes plainly when
// drafts are asked for, and says so.
func TestDraftsWithoutMTP(t *testing.T) {
	name := "tiny-qwen3-moe"
	c := testutil.LoadRefs(t, name).Cases[0]
	e := open(t, name, engine.Options{})
	if e.CanDraft() {
		t.Fatal("tiny-qwen3-moe reports an MTP head")
	}
	o := greedy48
	o.Drafts = 3
	got, s := generateOpts(t, e, c.Prompt, o)
	if !slices.Equal(got, c.Greedy) {
		t.Errorf("tokens %v, want %v", got, c.Greedy)
	}
	if s.MTP == nil || s.MTP.Disabled == "" || s.MTP.Drafted != 0 {
		t.Errorf("MTP stats %+v, want drafts disabled with a reason", s.MTP)
	}
}
