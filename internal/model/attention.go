package model

import (
	"math"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// attnScratch holds the buffers of the attention block.
type attnScratch struct {
	q, k, v []float32 // [rows][heads*(2)*head_dim], [rows][kv*head_dim] x2
	o       []float32 // [rows][heads*head_dim]
	scores  []float32 // [threads][ctx] softmax weights, grown on demand
	task    attnTask
}

func (a *attnScratch) init(c *format.Config, rows int) {
	a.q = make([]float32, rows*c.Heads*c.HeadDim*2)
	a.k = make([]float32, rows*c.KVHeads*c.HeadDim)
	a.v = make([]float32, rows*c.KVHeads*c.HeadDim)
	a.o = make([]float32, rows*c.Heads*c.HeadDim)
}

// attention runs (gated) grouped-query attention for nb rows at positions
// pos.., appending their keys and values to the cache kc/vc, and leaves the
// projected output in r.y.
func (r *Runner) attention(L *Layer, kc, vc []float32, pos, nb int) {
	c := &r.M.Config
	a := &r.attn
	gated := c.Family == format.FamilyQwen35MoE
	qw, qstride := L.Q.Rows, c.HeadDim // per row width of the q projection; per head
	if gated {
		qstride = 2 * c.HeadDim // per head: query then gate
	}
	r.Pool.MatMul2(a.q, &L.Q, a.k, &L.K, r.h, nb)
	r.Pool.MatMul(a.v, &L.V, r.h, nb)
	r.rows(rowTask{op: opQKPrep, L: L, kc: kc, vc: vc, pos: pos}, nb)
	threads := r.Pool.Threads()
	if need := threads * (pos + nb); len(a.scores) < need {
		// Grow to a power of two of at least 4096 positions per thread, so
		// decoding reallocates O(log ctx) times at most, never per token.
		span := 4096
		for span < pos+nb {
			span *= 2
		}
		a.scores = make([]float32, threads*span)
	}
	a.task = attnTask{r: r, kc: kc, vc: vc, pos: pos, nb: nb, qw: qw, qstride: qstride, gated: gated, span: pos + nb}
	r.Pool.Parallel(a.task.items(), 1, &a.task)
	a.task = attnTask{}
	r.Pool.MatMul(r.y, &L.O, a.o, nb)
}

// qkPrep normalises and rotates the queries and keys of rows lo..hi and
// appends their keys and values to the cache.
func (r *Runner) qkPrep(L *Layer, kc, vc []float32, pos, lo, hi int) {
	c := &r.M.Config
	a := &r.attn
	hd, nh, nkv := c.HeadDim, c.Heads, c.KVHeads
	qw, qstride := L.Q.Rows, hd
	if c.Family == format.FamilyQwen35MoE {
		qstride = 2 * hd // per head: query then gate
	}
	zc := c.ZeroCentredNorm()
	eps := float32(c.RMSEps)
	rh := c.RotaryDim / 2
	kvw := nkv * hd
	for i := lo; i < hi; i++ {
		cos, sin := r.cos[i*rh:(i+1)*rh], r.sin[i*rh:(i+1)*rh]
		for h := 0; h < nh; h++ {
			q := a.q[i*qw+h*qstride : i*qw+h*qstride+hd]
			kernels.RMSNorm(q, q, L.QNorm, eps, zc)
			kernels.Rope(q, cos, sin)
		}
		for h := 0; h < nkv; h++ {
			k := a.k[i*kvw+h*hd : i*kvw+(h+1)*hd]
			kernels.RMSNorm(k, k, L.KNorm, eps, zc)
			kernels.Rope(k, cos, sin)
		}
		copy(kc[(pos+i)*kvw:(pos+i+1)*kvw], a.k[i*kvw:(i+1)*kvw])
		copy(vc[(pos+i)*kvw:(pos+i+1)*kvw], a.v[i*kvw:(i+1)*kvw])
	}
}

// attnTask computes causal attention for (row, head) pairs: softmax over
// the cache in position order, so the result is independent of the batch.
// Row i attends to pos+i+1 positions, so index j covers rows j and nb-1-j
// of one head: every index then costs about the same, and the contiguous
// parts Parallel hands the threads are balanced (in row order, the last
// part of a prompt chunk would do three times the first's work).
type attnTask struct {
	r                 *Runner
	kc, vc            []float32
	pos, nb, qw, span int
	qstride           int
	gated             bool
}

// items is the number of indices: row pairs times heads.
func (t *attnTask) items() int { return (t.nb + 1) / 2 * t.r.M.Config.Heads }

func (t *attnTask) Run(lo, hi int) {
	c := &t.r.M.Config
	nh := c.Heads
	// Each contiguous part gets its own scores row, chosen by its start.
	part := t.r.Pool.Part(t.items(), 1, lo)
	sc := t.r.attn.scores[part*t.span : (part+1)*t.span]
	for idx := lo; idx < hi; idx++ {
		i, h := idx/nh, idx%nh
		t.head(i, h, sc)
		if j := t.nb - 1 - i; j != i {
			t.head(j, h, sc)
		}
	}
}

// head computes query head h of row i.
func (t *attnTask) head(i, h int, sc []float32) {
	c := &t.r.M.Config
	a := &t.r.attn
	hd, nh, nkv := c.HeadDim, c.Heads, c.KVHeads
	kvw := nkv * hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	q := a.q[i*t.qw+h*t.qstride : i*t.qw+h*t.qstride+hd]
	kvh := h / (nh / nkv)
	n := t.pos + i + 1
	o := a.o[i*nh*hd+h*hd : i*nh*hd+(h+1)*hd]
	kernels.Attend(o, q, t.kc[kvh*hd:], t.vc[kvh*hd:], kvw, n, scale, sc)
	if t.gated {
		g := a.q[i*t.qw+h*t.qstride+hd : i*t.qw+h*t.qstride+2*hd]
		kernels.MulSigmoid(o, g)
	}
}
