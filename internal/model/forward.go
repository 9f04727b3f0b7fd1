package model

import (
	"fmt"
	"time"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/kernels"
)

// TraceFunc receives a named intermediate of the forward pass: rows×width
// values, row-major. Names follow refs/layers: "embed", "input_norm",
// "mixer_out", "post_norm", "router_logits", "moe_out", "layer_out",
// "final_norm"; layer is -1 for whole-model values.
type TraceFunc func(name string, layer, rows int, data []float32)

// Runner runs forward passes of one model. It owns the worker pool and all
// scratch, sized once for MaxRows rows, so a step allocates nothing. A
// Runner serves one step at a time.
type Runner struct {
	M       *Model
	Pool    *kernels.Pool
	MaxRows int
	Trace   TraceFunc
	// Routes, when set, replaces the router's top-k choice of each row
	// (a benchmark replaying recorded routes on a synthetic model); the
	// weights stay the router's probabilities of the chosen experts.
	Routes RouteFunc
	// Ops, when set, receives the wall time of each of the trunk's
	// operations and of the logits (sluice bench --ops): where a step's
	// time goes. The MTP head's are not counted.
	Ops *block.OpTimes
	// timed is block.Timed over the runner for timedFor, made once for
	// each Ops rather than on every step (an interface value escapes).
	timed    block.Backend
	timedFor *block.OpTimes

	x, h, y   []float32 // [rows][hidden] residual, normed input, block output
	final     []float32 // [rows][hidden] final-normed hidden (for MTP and tracing)
	attn      attnScratch
	dn        dnScratch
	moe       moeScratch
	cos, sin  []float32 // [rows][rotary/2]
	positions []int
	rope      *block.Rope // the family's rotary embedding
	rowT      rowTask     // the row-wise op in flight
	mtp       mtpScratch  // the MTP head's buffers, allocated on first use
	mla       mlaScratch  // the latent attention's buffers, when the model has it

	// The step in flight, for the Backend methods.
	st  *State
	pos int // the step's first cache row
	nb  int // rows of the step
}

var _ block.Backend = (*Runner)(nil)

// NewRunner prepares scratch for batches of up to maxRows rows.
func NewRunner(m *Model, threads, maxRows int) *Runner {
	c := &m.Config
	if maxRows < 1 {
		maxRows = 1
	}
	r := &Runner{M: m, Pool: kernels.NewPool(threads), MaxRows: maxRows, rope: &m.Arch.Rope}
	m.MaxBatch = max(m.MaxBatch, maxRows)
	H := c.Hidden
	r.x = make([]float32, maxRows*H)
	r.h = make([]float32, maxRows*H)
	r.y = make([]float32, maxRows*H)
	r.final = make([]float32, maxRows*H)
	r.cos = make([]float32, maxRows*r.rope.Dim/2)
	r.sin = make([]float32, maxRows*r.rope.Dim/2)
	r.positions = make([]int, maxRows)
	r.attn.init(c, maxRows)
	r.dn.init(c, maxRows, r.Pool.Threads())
	for i := range m.Arch.Layers {
		L := &m.Arch.Layers[i]
		if d, ok := L.FFN.(*block.MLP); ok {
			r.moe.dense = max(r.moe.dense, d.Inter)
		}
		if a, ok := L.Mixer.(*block.MLA); ok && r.mla.qa == nil {
			r.mla.init(a, maxRows, r.Pool.Threads())
		}
	}
	r.moe.init(c, maxRows)
	r.moe.initThreads(c, maxRows, r.Pool)
	return r
}

// Close stops the runner's workers.
func (r *Runner) Close() { r.Pool.Close() }

// Forward consumes tokens at positions st.Pos.. and advances st. When all is
// true it writes logits for every token into out ([n][vocab]); otherwise
// only the last token's ([vocab]). Tokens are processed in chunks of
// MaxRows; the result does not depend on the chunking.
func (r *Runner) Forward(st *State, tokens []int, out []float32, all bool) error {
	V := r.M.Config.Vocab
	if len(tokens) == 0 {
		return fmt.Errorf("forward: no tokens")
	}
	if st.Pos+len(tokens) > st.Ctx {
		return fmt.Errorf("forward: %d tokens at position %d exceed the context of %d", len(tokens), st.Pos, st.Ctx)
	}
	for _, t := range tokens {
		if t < 0 || t >= V {
			return fmt.Errorf("forward: token id %d outside the vocabulary [0,%d)", t, V)
		}
	}
	if all && len(out) < len(tokens)*V || !all && len(out) < V {
		return fmt.Errorf("forward: logits buffer too small")
	}
	for done := 0; done < len(tokens); {
		nb := min(r.MaxRows, len(tokens)-done)
		last := done+nb == len(tokens)
		// Logits go straight into out: only the rows asked for are
		// computed, and no [rows][vocab] scratch is held (it would be
		// hundreds of MB for a 150k vocabulary and a 256-row chunk).
		var dst []float32
		switch {
		case all:
			dst = out[done*V : (done+nb)*V]
		case last:
			dst = out[:V]
		}
		if err := r.step(st, tokens[done:done+nb], dst, all); err != nil {
			return err
		}
		done += nb
	}
	return nil
}

// Hidden returns the final-normed hidden state of row i of the last step
// (the input of the MTP head).
func (r *Runner) Hidden(i int) []float32 {
	H := r.M.Config.Hidden
	return r.final[i*H : (i+1)*H]
}

func (r *Runner) trace(name string, layer, nb, width int, v []float32) {
	if r.Trace != nil {
		r.Trace(name, layer, nb, v[:nb*width])
	}
}

// step runs one batch of nb ≤ MaxRows rows through the trunk.
func (r *Runner) step(st *State, tokens []int, logits []float32, allRows bool) error {
	m := r.M
	a := m.Arch
	H := m.Config.Hidden
	nb := len(tokens)
	if err := st.fits(nb); err != nil {
		return err
	}
	for i, t := range tokens {
		a.Embed.Mat.Row(r.x[i*H:(i+1)*H], t)
		r.positions[i] = st.Pos + i
	}
	r.st, r.pos, r.nb = st, st.Pos, nb
	defer func() { r.st = nil }()
	r.trace("embed", -1, nb, H, r.x)
	r.ropeTables(nb)
	var b block.Backend = r
	if r.Ops != nil {
		if r.timedFor != r.Ops {
			r.timed, r.timedFor = block.Timed(r, r.Ops), r.Ops
		}
		b = r.timed
	}
	if err := a.Forward(b); err != nil {
		return err
	}
	var t0 time.Time
	if r.Ops != nil {
		t0 = time.Now()
	}
	r.norm(r.final, r.x, r.y, &a.Norm, nb)
	if r.Ops != nil {
		r.Ops.Add(block.OpNorm, t0)
	}
	r.trace("layer_out", len(a.Layers)-1, nb, H, r.x)
	r.trace("final_norm", -1, nb, H, r.final)
	if r.Ops != nil && logits != nil {
		defer r.Ops.Add(block.OpLMHead, time.Now())
	}
	switch {
	case logits == nil:
	case allRows:
		r.Pool.MatMul(logits, &a.LMHead.Mat, r.final, nb)
	default:
		r.Pool.MatMul(logits, &a.LMHead.Mat, r.final[(nb-1)*H:nb*H], 1)
	}
	st.Pos += nb
	return nil
}

// ropeTables fills cos/sin for the batch's positions.
func (r *Runner) ropeTables(nb int) {
	r.rows(rowTask{op: opRope}, nb)
}

// Norm implements block.Backend.
func (r *Runner) Norm(n *block.Norm, add bool) {
	var y []float32
	if add {
		y = r.y
	}
	r.norm(r.h, r.x, y, n, r.nb)
}

// Emit implements block.Backend.
func (r *Runner) Emit(name string, layer int, b block.Buf) {
	if r.Trace == nil {
		return
	}
	v := r.x
	switch b {
	case block.H:
		v = r.h
	case block.Y:
		v = r.y
	}
	r.trace(name, layer, r.nb, r.M.Config.Hidden, v)
}
