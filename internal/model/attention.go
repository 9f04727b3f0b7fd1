package model

import (
	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// attnScratch holds the buffers of the attention block.
type attnScratch struct {
	q, k, v []float32 // [rows][heads*(2)*head_dim], [rows][kv*head_dim] x2
	o       []float32 // [rows][heads*head_dim]
	scores  []float32 // [threads][group][ctx] softmax weights, grown on demand
	task    attnTask
}

func (a *attnScratch) init(c *format.Config, rows int) {
	a.q = make([]float32, rows*c.Heads*c.HeadDim*2)
	a.k = make([]float32, rows*c.KVHeads*c.HeadDim)
	a.v = make([]float32, rows*c.KVHeads*c.HeadDim)
	a.o = make([]float32, rows*c.Heads*c.HeadDim)
}

// The attention ops of block.Backend. Position p of a cache of rows rows
// is at row p % rows (a ring for sliding-window layers).

// Project implements block.Backend.
func (r *Runner) Project(L *block.Attn) {
	a := &r.attn
	r.Pool.MatMul2(a.q, &L.Q.Mat, a.k, &L.K.Mat, r.h, r.nb)
	r.Pool.MatMul(a.v, &L.V.Mat, r.h, r.nb)
}

// Prep implements block.Backend.
func (r *Runner) Prep(L *block.Attn, cache int) {
	kc, vc, rows := r.st.kv(cache)
	r.rows(rowTask{op: opQKPrep, attn: L, kc: kc, vc: vc, rows: rows, pos: r.pos}, r.nb)
}

// Attend implements block.Backend.
func (r *Runner) Attend(L *block.Attn, cache int) {
	a := &r.attn
	kc, vc, rows := r.st.kv(cache)
	pos, nb := r.pos, r.nb
	qw, qstride := L.Q.Mat.Rows, L.HeadDim // per row width of the q projection; per head
	if L.Gate {
		qstride = 2 * L.HeadDim // per head: query then gate
	}
	threads := r.Pool.Threads()
	span := pos + nb
	if L.Window > 0 {
		span = min(span, L.Window)
	}
	group := 1
	if nb == 1 && L.Window == 0 && L.Sinks == nil {
		group = min(L.Heads/L.KVHeads, maxAttnGroup)
	}
	if need := threads * group * span; len(a.scores) < need {
		// Grow to a power of two of at least 4096 positions per thread and
		// head of a group, so decoding reallocates O(log ctx) times at
		// most, never per token.
		n := 4096
		for n < span {
			n *= 2
		}
		a.scores = make([]float32, threads*group*n)
	}
	a.task = attnTask{r: r, L: L, kc: kc, vc: vc, rows: rows, pos: pos, nb: nb, qw: qw, qstride: qstride, span: span, group: group}
	r.Pool.Parallel(a.task.items(), 1, &a.task)
	a.task = attnTask{}
}

// AttnOut implements block.Backend.
func (r *Runner) AttnOut(L *block.Attn) {
	r.Pool.MatMul(r.y, &L.O.Mat, r.attn.o, r.nb)
	r.bias(r.y, L.OB, r.nb)
}

// qkPrep adds the projection biases, normalises and rotates the queries
// and keys of rows lo..hi and appends their keys and values to the cache.
func (r *Runner) qkPrep(L *block.Attn, kc, vc []float32, rows, pos, lo, hi int) {
	a := &r.attn
	hd, nh, nkv := L.HeadDim, L.Heads, L.KVHeads
	qw, qstride := L.Q.Mat.Rows, hd
	if L.Gate {
		qstride = 2 * hd // per head: query then gate
	}
	rh := r.rope.Dim / 2
	kvw := nkv * hd
	for i := lo; i < hi; i++ {
		cos, sin := r.cos[i*rh:(i+1)*rh], r.sin[i*rh:(i+1)*rh]
		if L.QB != nil {
			kernels.Add(a.q[i*qw:(i+1)*qw], L.QB)
			kernels.Add(a.k[i*kvw:(i+1)*kvw], L.KB)
			kernels.Add(a.v[i*kvw:(i+1)*kvw], L.VB)
		}
		for h := 0; h < nh; h++ {
			q := a.q[i*qw+h*qstride : i*qw+h*qstride+hd]
			if n := L.QNorm; n != nil {
				kernels.RMSNorm(q, q, n.W, n.Eps, n.ZeroCentred)
			}
			kernels.Rope(q, cos, sin)
		}
		for h := 0; h < nkv; h++ {
			k := a.k[i*kvw+h*hd : i*kvw+(h+1)*hd]
			if n := L.KNorm; n != nil {
				kernels.RMSNorm(k, k, n.W, n.Eps, n.ZeroCentred)
			}
			kernels.Rope(k, cos, sin)
		}
		slot := (pos + i) % rows
		copy(kc[slot*kvw:(slot+1)*kvw], a.k[i*kvw:(i+1)*kvw])
		copy(vc[slot*kvw:(slot+1)*kvw], a.v[i*kvw:(i+1)*kvw])
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
	L                 *block.Attn
	kc, vc            []float32
	rows              int
	pos, nb, qw, span int
	qstride           int
	// group > 1: a decode step's query heads sharing a key-value head
	// pass over its keys one after another, then over its values (see
	// grouped), up to group heads at a time.
	group int
}

// maxAttnGroup bounds the heads a decode step's attention takes together,
// and so the scratch: group × context floats per thread.
const maxAttnGroup = 8

// items is the number of indices: row pairs times heads.
func (t *attnTask) items() int { return (t.nb + 1) / 2 * t.L.Heads }

func (t *attnTask) Run(lo, hi int) {
	nh := t.L.Heads
	// Each contiguous part gets its own scores row, chosen by its start.
	part := t.r.Pool.Part(t.items(), 1, lo)
	if t.group > 1 {
		t.grouped(lo, hi, t.r.attn.scores[part*t.group*t.span:(part+1)*t.group*t.span])
		return
	}
	sc := t.r.attn.scores[part*t.span : (part+1)*t.span]
	for idx := lo; idx < hi; idx++ {
		i, h := idx/nh, idx%nh
		t.head(i, h, sc)
		if j := t.nb - 1 - i; j != i {
			t.head(j, h, sc)
		}
	}
}

// grouped computes heads lo..hi of a decode step's one row, the heads of
// one key-value head (at most group of them) together: every head's
// scores over the keys first, then every head's mix of the values, so
// that a head's pass finds the keys or values the previous one read still
// in cache (at 512 positions and 128 dims, 256 KB each: in L2 alone, but
// not together). Each head's arithmetic is kernels.Attend's.
func (t *attnTask) grouped(lo, hi int, sc []float32) {
	L := t.L
	a := &t.r.attn
	hd, nh, nkv := L.HeadDim, L.Heads, L.KVHeads
	kvw, g, n := nkv*hd, nh/nkv, t.pos+1
	var sums [maxAttnGroup]float32
	for h0 := lo; h0 < hi; {
		h1 := min(hi, (h0/g+1)*g, h0+t.group)
		kvh := h0 / g
		for h := h0; h < h1; h++ {
			q := a.q[h*t.qstride : h*t.qstride+hd]
			sums[h-h0] = kernels.AttendScores(q, t.kc[kvh*hd:], kvw, n, L.Scale, sc[(h-h0)*t.span:])
		}
		for h := h0; h < h1; h++ {
			o := a.o[h*hd : (h+1)*hd]
			kernels.AttendMix(o, t.vc[kvh*hd:], kvw, n, sc[(h-h0)*t.span:], sums[h-h0])
			if L.Gate {
				kernels.MulSigmoid(o, a.q[h*t.qstride+hd:h*t.qstride+2*hd])
			}
		}
		h0 = h1
	}
}

// head computes query head h of row i.
func (t *attnTask) head(i, h int, sc []float32) {
	L := t.L
	a := &t.r.attn
	hd, nh, nkv := L.HeadDim, L.Heads, L.KVHeads
	kvw := nkv * hd
	q := a.q[i*t.qw+h*t.qstride : i*t.qw+h*t.qstride+hd]
	kvh := h / (nh / nkv)
	n := t.pos + i + 1
	o := a.o[i*nh*hd+h*hd : i*nh*hd+(h+1)*hd]
	if L.Window == 0 && L.Sinks == nil {
		kernels.Attend(o, q, t.kc[kvh*hd:], t.vc[kvh*hd:], kvw, n, L.Scale, sc)
	} else {
		first := 0
		if L.Window > 0 && n > L.Window {
			first, n = n-L.Window, L.Window
		}
		var sink []float32
		if L.Sinks != nil {
			sink = L.Sinks[h : h+1]
		}
		kernels.AttendRing(o, q, t.kc[kvh*hd:], t.vc[kvh*hd:], kvw, t.rows, first, n, L.Scale, sink, sc)
	}
	if L.Gate {
		g := a.q[i*t.qw+h*t.qstride+hd : i*t.qw+h*t.qstride+2*hd]
		kernels.MulSigmoid(o, g)
	}
}
