package engine

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/tokenizer"
)

// Sequence is one generation in progress: its state, sampler, token history
// and text decoder. Generate drives one to completion; the server
// interleaves many, a few Steps each, on the engine's one runner.
type Sequence struct {
	e       *Engine
	St      *model.State
	opts    GenOptions
	smp     *sample.Sampler
	eos     map[int]bool
	logits  []float32 // the next token's logits, valid after Prefill
	history []int     // prompt + generated, for penalties
	out     []int
	dec     *tokenizer.StreamDecoder
	done    bool
	stats   Stats
	decodeT time.Duration
	sp      *spec // speculative decoding with the MTP head; nil when off
	// am is set when the next token is the plain argmax and the forward
	// computes it on the device; next is then that token.
	am   argmaxer
	next int
	// Expert pool counters at the start and after the last prefill: the
	// host's streaming pool's, and the GPU's pool's.
	xStart, xPrefilled experts.Snapshot
	gStart, gPrefilled DevicePool
}

// NewSequence prepares a generation into st. On an empty st it is a new
// text, unrelated to the one before (unless o.KeepPoolCounts): the expert
// pools' eviction counts of earlier texts then weigh far less than the
// new one's (experts.Stream.NewText). A state holding a prefix (a
// conversation continued from a cached state) keeps them.
func (e *Engine) NewSequence(st *model.State, o GenOptions) (*Sequence, error) {
	smp, err := sample.New(o.Sample, e.Model.Config.Vocab)
	if err != nil {
		return nil, err
	}
	if st.Pos == 0 && !o.KeepPoolCounts {
		e.newText()
	}
	q := &Sequence{e: e, St: st, opts: o, smp: smp, eos: map[int]bool{},
		logits: make([]float32, e.Model.Config.Vocab), dec: e.Tok.NewStreamDecoder()}
	for _, id := range e.Model.Config.EOS {
		q.eos[id] = true
	}
	q.stats.StopReason = "length"
	q.stats.Device = e.Device
	q.xStart = e.expertSnap()
	q.gStart, _ = e.DevicePool()
	var off string
	if q.sp, off = e.newSpec(o); off != "" {
		q.stats.MTP = &MTPStats{Disabled: off}
	}
	if a, ok := e.Fwd.(argmaxer); ok && q.sp == nil && plainGreedy(o.Sample) {
		// Drafting samples its first token from the prefill's logits.
		q.am = a
	}
	return q, nil
}

// plainGreedy reports whether p picks the largest logit as it is: greedy,
// with no penalty to apply first.
func plainGreedy(p sample.Params) bool {
	return p.Greedy() && (p.RepetitionPenalty == 0 || p.RepetitionPenalty == 1) && p.PresencePenalty == 0 && p.FrequencyPenalty == 0
}

// Prefill feeds prompt tokens after whatever st already holds, chunk by
// chunk so that a long prompt can be cancelled. It may be called with only
// the suffix past a cached prefix; history for penalties then covers the
// tokens given here.
func (q *Sequence) Prefill(ctx context.Context, prompt []int) error {
	if len(prompt) == 0 {
		return fmt.Errorf("generate: empty prompt")
	}
	st := q.St
	if st.Pos+len(prompt) > st.Ctx {
		return fmt.Errorf("generate: prompt of %d tokens does not fit the context of %d (at position %d); %s", len(prompt), st.Ctx, st.Pos, q.e.CtxHint())
	}
	t0 := time.Now()
	step := q.e.Runner.MaxRows
	for i := 0; i < len(prompt); i += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		j := min(i+step, len(prompt))
		if err := q.forward(prompt[i:j]); err != nil {
			return err
		}
		if q.sp != nil {
			if err := q.prefillMTP(prompt[i:j]); err != nil {
				return err
			}
		}
	}
	q.history = append(q.history, prompt...)
	q.stats.PromptTokens += len(prompt)
	q.stats.PrefillMS += msSince(t0)
	q.stats.PrefillTokS = rate(q.stats.PromptTokens, q.stats.PrefillMS)
	q.xPrefilled = q.e.expertSnap()
	q.gPrefilled, _ = q.e.DevicePool()
	if q.opts.MaxTokens <= 0 {
		q.done = true
	}
	return nil
}

// IsEOS reports whether tok stops this sequence.
func (q *Sequence) IsEOS(tok int) bool { return q.eos[tok] && !q.opts.IgnoreEOS }

// Done reports whether the sequence has stopped (EOS, length or context).
func (q *Sequence) Done() bool { return q.done }

// Tokens returns the generated tokens so far.
func (q *Sequence) Tokens() []int { return q.out }

// Stats returns the generation's statistics so far.
func (q *Sequence) Stats() Stats {
	s := q.stats
	s.GeneratedTokens = len(q.out)
	s.DecodeMS = float64(q.decodeT.Nanoseconds()) / 1e6
	if len(q.out) > 1 {
		// The first token comes from the prefill's logits; the decode rate
		// counts the forward passes that followed.
		s.DecodeTokS = rate(len(q.out)-1, s.DecodeMS)
	}
	if q.sp != nil {
		s.MTP = q.sp.statsCopy()
	}
	q.e.fillExpertStats(&s, q.xStart, q.xPrefilled)
	q.e.fillGPUPoolStats(&s, q.gStart, q.gPrefilled)
	return s
}

// Step samples the next token, and unless the sequence stops there, runs it
// through the model so that the following Step has its logits. It returns
// the tokens accepted this step (one, for plain decoding) and the text they
// complete. An EOS token ends the sequence and is returned without text.
func (q *Sequence) Step(ctx context.Context) ([]int, string, error) {
	if q.done {
		return nil, "", nil
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	t0 := time.Now()
	defer func() { q.decodeT += time.Since(t0) }()
	if q.sp != nil {
		return q.specStep(ctx)
	}
	next := q.next
	if q.am == nil {
		next = q.smp.Sample(q.logits, q.history)
		if err := finiteLogit(q.logits[next], q.St.Pos-1); err != nil {
			q.done = true
			return nil, "", fmt.Errorf("generate: %w", err)
		}
	}
	q.out = append(q.out, next)
	q.history = append(q.history, next)
	if q.eos[next] && !q.opts.IgnoreEOS {
		q.stats.StopReason = "eos"
		q.done = true
		return q.out[len(q.out)-1:], "", nil
	}
	text := ""
	if !q.e.Tok.IsSpecial(next) {
		text = q.dec.Add(next)
	}
	switch {
	case len(q.out) >= q.opts.MaxTokens:
		q.done = true
	case q.St.Pos >= q.St.Ctx:
		q.stats.StopReason = "context"
		q.done = true
	default:
		tok := [1]int{next}
		if err := q.forward(tok[:]); err != nil {
			q.done = true
			return q.out[len(q.out)-1:], text, err
		}
	}
	return q.out[len(q.out)-1:], text, nil
}

// finiteLogit refuses a chosen token whose logit is NaN or infinite: the
// forward computed garbage (corrupt weights, or an overflow), and greedy
// and sampled choices alike fall back to token 0 on it, which reads as a
// real answer. pos is the position whose logits these are.
func finiteLogit(v float32, pos int) error {
	if v != v || math.IsInf(float64(v), 0) {
		return fmt.Errorf("the logits at position %d are not finite (%v): the model's weights may be corrupt", pos, v)
	}
	return nil
}

// Flush returns text held back for an incomplete UTF-8 sequence.
func (q *Sequence) Flush() string { return q.dec.Flush() }

// forward runs tokens through the model: the next token's logits into
// q.logits, or, for plain greedy decoding on a device that computes the
// argmax, the next token into q.next.
func (q *Sequence) forward(tokens []int) error {
	if q.am != nil {
		var err error
		q.next, err = q.am.ForwardArgmax(q.St, tokens)
		return err
	}
	return q.e.Fwd.Forward(q.St, tokens, q.logits, false)
}
