package model

import (
	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/kernels"
)

// rowOp names the row-wise steps of a forward pass that rowTask runs over
// the pool. Each touches only its own rows (or channels), in the same order
// as a single thread would, so splitting them changes no result.
type rowOp int

const (
	// opNorm: dst_i = RMSNorm(x_i + add_i) with weight w, storing the sum
	// back into x when add is set (the residual add fused into the norm).
	opNorm rowOp = iota
	// opQKPrep: per-head q/k norms and rotary embedding of the attention
	// projections, and the row's keys and values appended to the cache.
	opQKPrep
	// opRoute: softmax over the router logits and top-k choice per row.
	opRoute
	// opCombine: y_i = Σ_k w_ik·expert_k(h_i) (+ sigmoid-gated shared expert).
	opCombine
	// opConv: the DeltaNet causal conv + SiLU, split by channel (rows stay
	// sequential within a channel, since each shifts the history).
	opConv
	// opDNPrep: per-row q/k L2 norms, q scaling, beta and decay.
	opDNPrep
	// opDNGate: the DeltaNet output's gated RMSNorm per (row, head).
	opDNGate
	// opRope: the rotary tables of the batch's positions.
	opRope
	// opBias: dst_i += b, rows of len(b) (projection biases).
	opBias
	// opMLANorm: q_a_layernorm of the latent attention's query.
	opMLANorm
	// opMLAPrep: latent norm, rope, cache append (MLAPrep then absorbs
	// W_k into the queries per row and head).
	opMLAPrep
	// opSelect: the indexer's choice of positions per row.
	opSelect
)

// rowGrain is the fewest rows (or channels) worth a part of their own:
// these ops cost well under a microsecond per row, below the pool's
// hand-off, so decode and short verify batches run them inline.
const rowGrain = 16

// rowTask runs one rowOp over a range of rows; its fields are the op's
// operands.
type rowTask struct {
	r       *Runner
	op      rowOp
	attn    *block.Attn     // opQKPrep
	dn      *block.DeltaNet // opConv, opDNPrep, opDNGate
	moe     *block.MoE      // opRoute, opCombine
	mla     *block.MLA      // opMLANorm, opMLAPrep, opSelect
	norm    *block.Norm     // opNorm
	st      *State          // opConv, opDNPrep
	li, pos int
	nb      int       // opConv: rows of the step
	kc, vc  []float32 // opQKPrep: the layer's cache
	rows    int       // opQKPrep: cache rows (a ring's slot is pos % rows)
	x, add  []float32 // opNorm
	dst, b  []float32 // opNorm, opBias
}

// rows runs t over n indices (rows, or channels for opConv) on the pool.
func (r *Runner) rows(t rowTask, n int) {
	grain := rowGrain
	if t.op == opConv {
		// A channel costs one row's worth per row of the step.
		grain = convGrain(t.nb)
	}
	r.rowT = t
	r.rowT.r = r
	r.Pool.Parallel(n, grain, &r.rowT)
	r.rowT = rowTask{}
}

// norm writes RMSNorm(x_i [+ add_i]) into dst for nb rows (x += add first
// when add is non-nil).
func (r *Runner) norm(dst, x, add []float32, n *block.Norm, nb int) {
	r.rows(rowTask{op: opNorm, dst: dst, x: x, add: add, norm: n}, nb)
}

// bias adds b to each of nb rows of dst.
func (r *Runner) bias(dst, b []float32, nb int) {
	if b != nil {
		r.rows(rowTask{op: opBias, dst: dst, b: b}, nb)
	}
}

func (t *rowTask) Run(lo, hi int) {
	r := t.r
	c := &r.M.Config
	H := c.Hidden
	switch t.op {
	case opNorm:
		n := t.norm
		for i := lo; i < hi; i++ {
			x := t.x[i*H : (i+1)*H]
			if t.add != nil {
				kernels.Add(x, t.add[i*H:(i+1)*H])
			}
			kernels.RMSNorm(t.dst[i*H:(i+1)*H], x, n.W, n.Eps, n.ZeroCentred)
		}
	case opBias:
		w := len(t.b)
		for i := lo; i < hi; i++ {
			kernels.Add(t.dst[i*w:(i+1)*w], t.b)
		}
	case opMLANorm:
		r.mlaNorm(t.mla, lo, hi)
	case opMLAPrep:
		r.mlaPrep(t.mla, t.kc, t.vc, t.pos, lo, hi)
	case opSelect:
		r.selectRows(t.mla, t.vc, t.pos, t.nb, lo, hi)
	case opQKPrep:
		r.qkPrep(t.attn, t.kc, t.vc, t.rows, t.pos, lo, hi)
	case opRoute:
		s := &r.moe
		E, K := c.Experts, c.TopK
		for i := lo; i < hi; i++ {
			p := s.logits[i*E : (i+1)*E]
			ids, w := s.ids[i*K:(i+1)*K], s.w[i*K:(i+1)*K]
			switch t.moe.Score {
			case block.SigmoidGroups:
				RouteGroups(t.moe, p, s.choice[i*E:(i+1)*E], ids, w)
			case block.TopKSoftmax:
				Route(p, K, false, ids, w)
				kernels.Softmax(w)
			default:
				kernels.Softmax(p)
				Route(p, K, t.moe.NormTopK, ids, w)
			}
		}
	case opCombine:
		s := &r.moe
		K := c.TopK
		for i := lo; i < hi; i++ {
			y := r.y[i*H : (i+1)*H]
			clear(y)
			for k := 0; k < K; k++ {
				at := s.pos[i*K+k]
				kernels.Axpy(y, s.w[i*K+k], s.outk[at*H:(at+1)*H])
			}
			if t.moe.Shared != nil {
				g := float32(1)
				if t.moe.SharedGate.Present() {
					g = kernels.Sigmoid(s.sgate[i])
				}
				kernels.Axpy(y, g, s.shared[i*H:(i+1)*H])
			}
		}
	case opConv:
		r.dnConv(t.dn, t.st, t.li, t.nb, lo, hi)
	case opDNPrep:
		r.dnPrep(t.dn, lo, hi)
	case opDNGate:
		d := &r.dn
		g := &t.dn.GNorm
		nv, dv := t.dn.ValueHeads, t.dn.ValueDim
		for i := lo; i < hi; i++ {
			o := d.o[i*nv*dv : (i+1)*nv*dv]
			z := d.z[i*nv*dv : (i+1)*nv*dv]
			for h := 0; h < nv; h++ {
				oh := o[h*dv : (h+1)*dv]
				kernels.RMSNorm(oh, oh, g.W, g.Eps, g.ZeroCentred)
			}
			kernels.SwiGLU(o, z, o) // o·silu(z)
		}
	case opRope:
		rp := r.rope
		h := rp.Dim / 2
		for i := lo; i < hi; i++ {
			cos, sin := r.cos[i*h:(i+1)*h], r.sin[i*h:(i+1)*h]
			kernels.RopeTable(cos, sin, r.positions[i], rp.InvFreq)
			if rp.Scale != 1 {
				kernels.Scale(cos, rp.Scale)
				kernels.Scale(sin, rp.Scale)
			}
		}
	}
}
