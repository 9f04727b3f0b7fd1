package engine

import (
	"context"
	"fmt"

	"github.com/sluicelm/sluice/internal/model"
)

// Speculative decoding with the model's MTP head.
//
// A step starts with a decided token t_P that the trunk has not consumed
// (position P = St.Pos) and, from the previous step, the head's prediction
// for the position after it. The head drafts d1..dD (d1 from that
// prediction, each further one by feeding the head its own post-norm output
// and the previous draft); the trunk runs [t_P, d1..dD] as one batch with
// per-row DeltaNet snapshots; the longest prefix of drafts that the trunk's
// own choice agrees with is kept, plus the trunk's token after it; State.Commit
// rolls the trunk back to the last kept row; and MTPFollow runs the head's
// rows for the kept positions (from the trunk's hidden states), whose last
// row predicts the next step's first draft.
//
// Greedy (temperature 0) keeps a draft when it equals the trunk's greedy
// token, so the tokens are those of plain decoding: the verify rows' logits
// are bit-identical to one-row steps. With temperature > 0 a draft is drawn
// from the head's distribution q (after the same sampling filters) and kept
// with probability min(1, p/q) against the trunk's distribution p; a
// rejection draws from the residual max(0, p-q), so every token is
// distributed as the model's own.

// MTPStats describe speculative decoding over one generation.
type MTPStats struct {
	Drafts        int       `json:"drafts"`              // drafts per step in use (0: off, see Disabled)
	Steps         int       `json:"steps"`               // trunk verify passes
	Drafted       int       `json:"drafted"`             // drafts proposed
	Accepted      int       `json:"accepted"`            // drafts kept
	DepthDrafted  []int     `json:"depth_drafted"`       // [depth-1] drafts proposed at each depth
	DepthAccepted []int     `json:"depth_accepted"`      // [depth-1] drafts kept at each depth
	Acceptance    []float64 `json:"acceptance_by_depth"` // [depth-1] kept / proposed at each depth
	TokensPerStep float64   `json:"tokens_per_step"`     // tokens decided per trunk pass
	Disabled      string    `json:"disabled,omitempty"`  // why drafts asked for are off
}

// drafter runs speculative decoding's parts where the forward runs: the
// MTP head, with its cache beside the trunk's, and the verify's per-row
// DeltaNet snapshots. The CPU's runner with the host state's snapshots
// (cpuDrafter), or a GPU backend that keeps both in device memory.
type drafter interface {
	Forwarder
	model.MTPRows
	// MTPFollow is model.Runner.MTPFollow.
	MTPFollow(st *model.State, tokens []int, next int, out []float32) error
	// Speculate and Commit are model.State's, for the forward's copy of
	// the state.
	Speculate(st *model.State, rows int) error
	Commit(st *model.State, n int) error
	// MaxDrafts is the most drafts a step may verify.
	MaxDrafts() int
}

// greedyDrafter is a drafter that takes greedy choices where the forward
// runs (the GPU): for greedy decoding without penalties a verify and the
// head bring back token ids, not a vocabulary of logits per row for the
// host to scan.
type greedyDrafter interface {
	// ForwardArgmaxAll is Forward that writes every row's greedy choice
	// into best.
	ForwardArgmaxAll(st *model.State, tokens, best []int) error
	// MTPForwardArgmax and MTPFollowArgmax are MTPForward and MTPFollow
	// that return the last row's greedy choice.
	MTPForwardArgmax(st *model.State, pos int, hidden []float32, toks []int) (int, error)
	MTPFollowArgmax(st *model.State, tokens []int, next int) (int, error)
}

// cpuDrafter is the CPU runner as a drafter.
type cpuDrafter struct {
	*model.Runner
	most int // the most drafts a step verifies (Engine.maxDrafts)
}

func (c cpuDrafter) Speculate(st *model.State, rows int) error { return st.Speculate(rows) }
func (c cpuDrafter) Commit(st *model.State, n int) error       { return st.Commit(n) }
func (c cpuDrafter) MaxDrafts() int                            { return c.most }

// drafter returns where drafts run, or nil when the forward's device
// cannot run them.
func (e *Engine) drafter() drafter {
	if d, ok := e.Fwd.(drafter); ok {
		return d
	}
	if e.Fwd == Forwarder(e.Runner) {
		return cpuDrafter{e.Runner, e.maxDrafts}
	}
	return nil
}

// spec is one sequence's speculative-decoding state.
type spec struct {
	dr     drafter       // where the head and the verify run
	ga     greedyDrafter // dr, when it takes the greedy choices itself; nil otherwise
	pick   int           // with ga: the head's choice for the first draft, then each next one
	vbest  []int         // with ga: [d+1] the verify rows' choices
	d      int           // drafts per step
	tok    int           // decided token not yet consumed by the trunk; -1 before the first step
	ready  bool          // mlog and seed hold the head's row for tok
	mlog   []float32     // [vocab] the head's logits for the first draft
	seed   []float32     // [hidden] the post-norm output of that row, the chain's input
	drafts []int         // [d]
	q      []float32     // [d][vocab] draft distributions (temperature > 0)
	p      []float32     // [vocab] the trunk's distribution at one row
	vtok   []int         // [d+1] the verify batch
	vlog   []float32     // [d+1][vocab] its logits
	stats  MTPStats
}

// specRows is the rows of logits over the vocabulary a sequence's
// speculative state holds at d drafts (newSpec): the head's row (mlog),
// the sampling row (p), the verify's d+1 rows (vlog) and the draft
// distributions' d (q); the memory budget counts them (callerBytes).
func specRows(d int) int { return 1 + 1 + (d + 1) + d }

// newSpec returns the speculative state for o, or nil and the reason drafts
// are off.
func (e *Engine) newSpec(o GenOptions) (*spec, string) {
	if o.Drafts <= 0 {
		return nil, ""
	}
	if e.Model.MTP == nil {
		return nil, "the model has no MTP head"
	}
	dr := e.drafter()
	if dr == nil {
		return nil, fmt.Sprintf("drafts do not run on %s", e.Device)
	}
	d := min(o.Drafts, dr.MaxDrafts())
	if d <= 0 {
		if e.OnGPU() {
			return nil, fmt.Sprintf("%s keeps no room for drafts: open the engine with Options.Drafts (--drafts) set and a prefill chunk of more than one row", e.Device)
		}
		return nil, fmt.Sprintf("a batch of %d row leaves no room for drafts (raise the chunk size)", e.Runner.MaxRows)
	}
	c := &e.Model.Config
	V := c.Vocab
	sp := &spec{dr: dr, d: d, tok: -1, mlog: make([]float32, V), seed: make([]float32, c.Hidden),
		drafts: make([]int, d), p: make([]float32, V), vtok: make([]int, d+1), vlog: make([]float32, (d+1)*V)}
	if !o.Sample.Greedy() {
		sp.q = make([]float32, d*V)
	}
	if ga, ok := dr.(greedyDrafter); ok && plainGreedy(o.Sample) {
		sp.ga, sp.vbest = ga, make([]int, d+1)
	}
	sp.stats = MTPStats{Drafts: d, DepthDrafted: make([]int, d), DepthAccepted: make([]int, d)}
	return sp, ""
}

// CanDraft reports whether the model has an MTP head for speculative
// decoding (GenOptions.Drafts).
func (e *Engine) CanDraft() bool { return e.Model.MTP != nil }

// statsCopy returns the statistics with the derived fields filled in.
func (sp *spec) statsCopy() *MTPStats {
	s := sp.stats
	s.DepthDrafted = append([]int(nil), s.DepthDrafted...)
	s.DepthAccepted = append([]int(nil), s.DepthAccepted...)
	s.Acceptance = make([]float64, len(s.DepthDrafted))
	for i, n := range s.DepthDrafted {
		if n > 0 {
			s.Acceptance[i] = float64(s.DepthAccepted[i]) / float64(n)
		}
	}
	if s.Steps > 0 {
		s.TokensPerStep = float64(s.Steps+s.Accepted) / float64(s.Steps)
	}
	return &s
}

// decide records a token the sampler settled on, which the trunk would
// consume at position pos, and reports whether the sequence stops there
// (EOS, length or context), as plain Step does.
func (q *Sequence) decide(tok, pos int, text *string) bool {
	q.out = append(q.out, tok)
	q.history = append(q.history, tok)
	if q.eos[tok] && !q.opts.IgnoreEOS {
		q.stats.StopReason = "eos"
		q.done = true
		return true
	}
	if !q.e.Tok.IsSpecial(tok) {
		*text += q.dec.Add(tok)
	}
	switch {
	case len(q.out) >= q.opts.MaxTokens:
		q.done = true
	case pos >= q.St.Ctx:
		q.stats.StopReason = "context"
		q.done = true
	}
	return q.done
}

// specStep is Step with drafts: it decides one or more tokens with one
// trunk pass and returns them.
func (q *Sequence) specStep(ctx context.Context) ([]int, string, error) {
	sp, st := q.sp, q.St
	r := sp.dr
	V := q.e.Model.Config.Vocab
	greedy := q.opts.Sample.Greedy()
	start := len(q.out)
	text := ""
	if sp.tok < 0 {
		// The first token comes from the prefill's logits.
		t := q.smp.Sample(q.logits, q.history)
		if err := finiteLogit(q.logits[t], st.Pos-1); err != nil {
			q.done = true
			return nil, "", fmt.Errorf("generate: %w", err)
		}
		if q.decide(t, st.Pos, &text) {
			return q.out[start:], text, nil
		}
		sp.tok = q.out[len(q.out)-1]
	}
	if err := ctx.Err(); err != nil {
		return q.out[start:], text, err
	}
	fail := func(err error) ([]int, string, error) {
		q.done = true
		return q.out[start:], text, err
	}
	// Each verify row decides one token; stay within the length and context.
	D := min(sp.d, q.opts.MaxTokens-len(q.out)-1, st.Ctx-st.Pos-1)
	hist := len(q.history)
	for k := 0; k < D; k++ {
		if k == 0 && !sp.ready {
			if err := sp.follow(st, nil, sp.tok); err != nil {
				return fail(err)
			}
		}
		if k > 0 {
			// Chained row: the head's own output with the previous draft, at
			// cache row P-1+k; rows from P on are rewritten by MTPFollow.
			sp.ready = false
			if err := sp.chain(st, st.Pos-1+k, sp.drafts[k-1:k]); err != nil {
				return fail(err)
			}
		}
		var d int
		switch {
		case sp.ga != nil:
			d = sp.pick
		case greedy:
			d = q.smp.Sample(sp.mlog, q.history)
		default:
			qk := sp.q[k*V : (k+1)*V]
			q.smp.Probs(qk, sp.mlog, q.history)
			d = q.smp.SampleFrom(qk)
		}
		sp.drafts[k] = d
		q.history = append(q.history, d)
	}
	q.history = q.history[:hist]

	// Verify [t_P, d1..dD] in one trunk pass.
	sp.vtok[0] = sp.tok
	copy(sp.vtok[1:], sp.drafts[:D])
	if D > 0 {
		if err := r.Speculate(st, D+1); err != nil {
			return fail(err)
		}
	}
	var err error
	if sp.ga != nil {
		err = sp.ga.ForwardArgmaxAll(st, sp.vtok[:D+1], sp.vbest)
	} else {
		err = r.Forward(st, sp.vtok[:D+1], sp.vlog, true)
	}
	if err != nil {
		return fail(err)
	}
	n, c := 0, -1
	for ; n < D; n++ {
		row := sp.vlog[n*V : (n+1)*V]
		switch {
		case sp.ga != nil:
			if t := sp.vbest[n]; t != sp.drafts[n] {
				c = t
			}
		case greedy:
			if t := q.smp.Sample(row, q.history); t != sp.drafts[n] {
				c = t
			}
		default:
			q.smp.Probs(sp.p, row, q.history)
			if t, ok := q.smp.AcceptDraft(sp.p, sp.q[n*V:(n+1)*V], sp.drafts[n]); !ok {
				c = t
			}
		}
		if c >= 0 {
			break
		}
		q.history = append(q.history, sp.drafts[n])
	}
	switch {
	case c >= 0:
	case sp.ga != nil:
		c = sp.vbest[D]
	default:
		c = q.smp.Sample(sp.vlog[D*V:(D+1)*V], q.history)
	}
	q.history = q.history[:hist]
	if sp.ga == nil {
		// The trunk's rows decided drafts[:n] and c: refuse them where the
		// forward computed garbage, as Step does.
		for j := 0; j <= n; j++ {
			t := c
			if j < n {
				t = sp.drafts[j]
			}
			if err := finiteLogit(sp.vlog[j*V+t], st.Pos-1+j); err != nil {
				return fail(fmt.Errorf("generate: %w", err))
			}
		}
	}
	if D > 0 {
		if err := r.Commit(st, n+1); err != nil {
			return fail(err)
		}
	}
	s := &sp.stats
	s.Steps++
	s.Drafted += D
	s.Accepted += n
	for k := 0; k < D; k++ {
		s.DepthDrafted[k]++
		if k < n {
			s.DepthAccepted[k]++
		}
	}
	for i, t := range sp.drafts[:n] {
		if q.decide(t, st.Pos-n+i, &text) {
			return q.out[start:], text, nil
		}
	}
	if q.decide(c, st.Pos, &text) {
		return q.out[start:], text, nil
	}
	// The head's rows for the kept positions; the last predicts the next
	// step's first draft.
	sp.tok = c
	if err := sp.follow(st, sp.vtok[:n+1], c); err != nil {
		return fail(err)
	}
	sp.ready = true
	return q.out[start:], text, nil
}

// follow runs the head's rows for the tokens the trunk kept, the last row
// with next: its prediction (the logits in mlog, or with ga the choice in
// pick) gives the next step's first draft, its output the chain's seed.
func (sp *spec) follow(st *model.State, tokens []int, next int) error {
	var err error
	if sp.ga != nil {
		sp.pick, err = sp.ga.MTPFollowArgmax(st, tokens, next)
	} else {
		err = sp.dr.MTPFollow(st, tokens, next, sp.mlog)
	}
	if err == nil {
		copy(sp.seed, sp.dr.MTPHidden(0))
	}
	return err
}

// chain runs the head's chained row at cache row pos: its own output (the
// seed) with the previous draft tok, predicting the next draft.
func (sp *spec) chain(st *model.State, pos int, tok []int) error {
	var err error
	if sp.ga != nil {
		sp.pick, err = sp.ga.MTPForwardArgmax(st, pos, sp.seed, tok)
	} else {
		err = sp.dr.MTPForward(st, pos, sp.seed, tok, sp.mlog, false)
	}
	if err == nil {
		copy(sp.seed, sp.dr.MTPHidden(0))
	}
	return err
}

// prefillMTP runs the head over a prefill chunk the trunk just consumed.
func (q *Sequence) prefillMTP(chunk []int) error {
	q.sp.ready, q.sp.tok = false, -1
	return q.sp.dr.MTPFollow(q.St, chunk, -1, nil)
}
