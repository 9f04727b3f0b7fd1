//go:build linux

package gpu

import (
	"math"
	"unsafe"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/cuda"
)

// mlaBufs is the device scratch of DeepSeek's latent attention and its
// indexer, laid out as the CPU's (model/mla.go), for the model's first
// MLA layer (all are alike).
type mlaBufs struct {
	qa   uintptr // [rows][q_lora]: q_a, then q_a_layernorm(q_a)
	q    uintptr // [rows][heads][nope+rope]
	ckv  uintptr // [rows][kv_lora+rope]: the latents, then normed and rotated
	qabs uintptr // [rows][heads][kv_lora+rope]: the absorbed queries
	olat uintptr // [rows][heads][kv_lora]: the attention's output in the latent
	o    uintptr // [rows][heads·v]
	qi   uintptr // [rows][index_heads][index_dim]
	ki   uintptr // [rows][index_dim]
	wts  uintptr // [rows][index_heads]
	sc   uintptr // [rows][ctx]: the indexer's scores
	sel  uintptr // int32 [rows][index_topk]: the positions each row attends to
}

// firstMLA is the first latent attention block of layers, or nil.
func firstMLA(layers []block.Layer) *block.MLA {
	for _, L := range layers {
		if m, ok := L.Mixer.(*block.MLA); ok {
			return m
		}
	}
	return nil
}

// mlaShape is m's shape for the kernels.
func mlaShape(m *block.MLA) cuda.MLA {
	return cuda.MLA{Heads: m.Heads, Nope: m.Nope, Rope: m.RopeDim, V: m.V, KVLora: m.KVLora}
}

// mlaAttn is the attention of the step's rows over m's latent cache.
func (r *Runner) mlaAttn(m *block.MLA) cuda.Attn {
	w := m.KVLora + m.RopeDim
	a := cuda.Attn{Pos: r.pos, Rows: r.nb, Heads: m.Heads, KVHeads: 1, HeadDim: w, VDim: m.KVLora,
		QRow: m.Heads * w, QHead: w, ORow: m.Heads * m.KVLora, Scale: m.Scale, Scratch: r.attSBytes}
	if m.Index != nil {
		a.Sel, a.TopK = r.mla.sel, m.Index.TopK
	}
	return a
}

// mlaScratch adds the latent attention's buffers for rows rows over ctx
// positions to the scratch layout (add reserves floats), and returns the
// attention scratch it needs in bytes (whole rows at once:
// cuda.AttendScratchFor).
func mlaScratch(m *block.MLA, b *mlaBufs, rows, ctx, whole int, add func(*uintptr, int)) int {
	w := m.KVLora + m.RopeDim
	add(&b.qa, rows*m.QLora)
	add(&b.q, rows*m.Heads*(m.Nope+m.RopeDim))
	add(&b.ckv, rows*w)
	add(&b.qabs, rows*m.Heads*w)
	add(&b.olat, rows*m.Heads*m.KVLora)
	add(&b.o, rows*m.Heads*m.V)
	topK := 0
	if ix := m.Index; ix != nil {
		add(&b.qi, rows*ix.Heads*ix.Dim)
		add(&b.ki, rows*ix.Dim)
		add(&b.wts, rows*ix.Heads)
		add(&b.sc, rows*ctx)
		add(&b.sel, rows*ix.TopK)
		topK = ix.TopK
	}
	return cuda.AttendScratchFor(cuda.Attn{Pos: ctx, Rows: rows, Heads: m.Heads, HeadDim: w, VDim: m.KVLora, TopK: topK}, whole)
}

// uploadMLA names m's weights for the upload (w: a matrix, v: a vector).
func uploadMLA(m *block.MLA, w func(*block.Weight), v func([]float32)) {
	w(&m.QA)
	w(&m.QB)
	w(&m.KVA)
	w(&m.O)
	v(m.QANorm.W)
	v(m.KVANorm.W)
	if ix := m.Index; ix != nil {
		w(&ix.WQ)
		w(&ix.WK)
		w(&ix.Weights)
		v(ix.KNorm)
		v(ix.KBias)
	}
}

// kvbBytes is the size of m's W_k and W_v in the device's layout:
// float32 kv_b_proj [heads][nope+v][kv_lora], as the absorb and W_v
// kernels read it.
func kvbBytes(m *block.MLA) int { return 4 * m.Heads * (m.Nope + m.V) * m.KVLora }

// kvbGrowth is how many more bytes m's W_k and W_v take on the device
// (float32, kvbBytes) than in the pack (WK and WV at its bits).
func kvbGrowth(m *block.MLA) int64 {
	d := int64(kvbBytes(m))
	for _, w := range []*block.Weight{&m.WK, &m.WV} {
		v, s := w.Mat.Kind.Sizes(w.Mat.Rows, w.Mat.Cols)
		d -= v + 2*s
	}
	return d
}

// kvbF32 writes m's W_k and W_v, dequantised from the pack's WK and WV
// (kvbBytes into b): the device keeps kv_b_proj whole in float32.
func kvbF32(m *block.MLA, b []byte) {
	dst := unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), kvbBytes(m)/4)
	row := make([]float32, max(m.Nope, m.KVLora))
	for h := 0; h < m.Heads; h++ {
		head := dst[h*(m.Nope+m.V)*m.KVLora:]
		for c := 0; c < m.KVLora; c++ {
			m.WK.Mat.Row(row, h*m.KVLora+c)
			for n, x := range row[:m.Nope] {
				head[n*m.KVLora+c] = x
			}
		}
		for j := 0; j < m.V; j++ {
			m.WV.Mat.Row(head[(m.Nope+j)*m.KVLora:(m.Nope+j+1)*m.KVLora], h*m.V+j)
		}
	}
}

// MLAProject implements block.Backend: q_a (normed) and q_b, the latent
// with its rope part, and the indexer's queries, keys and weights.
func (r *Runner) MLAProject(m *block.MLA) {
	r.mark("attn_proj")
	b, nb := &r.mla, r.nb
	r.mul(b.qa, r.wmat(&m.QA), r.h, nb, r.H)
	r.mul(b.ckv, r.wmat(&m.KVA), r.h, nb, r.H)
	n := &m.QANorm
	r.check(r.k.RMSNorm(r.s, b.qa, b.qa, 0, r.vecs[&n.W[0]], nb, m.QLora, m.QLora, n.Eps, n.ZeroCentred))
	r.mul(b.q, r.wmat(&m.QB), b.qa, nb, m.QLora)
	if ix := m.Index; ix != nil {
		r.mul(b.qi, r.wmat(&ix.WQ), b.qa, nb, m.QLora)
		r.mul(b.ki, r.wmat(&ix.WK), r.h, nb, r.H)
		r.mul(b.wts, r.wmat(&ix.Weights), r.h, nb, r.H)
	}
}

// MLAPrep implements block.Backend: kv_a_layernorm and the rope on the
// latents, the rope on the queries and W_k absorbed into them, the
// indexer's key norm and rope, and the step's latents and indexer keys
// appended to the cache.
func (r *Runner) MLAPrep(m *block.MLA, cache int) {
	r.mark("attn_prep")
	b, nb := &r.mla, r.nb
	w, qw := m.KVLora+m.RopeDim, m.Nope+m.RopeDim
	rh := r.M.Arch.Rope.Dim / 2
	kn := &m.KVANorm
	r.check(r.k.RMSNorm(r.s, b.ckv, b.ckv, 0, r.vecs[&kn.W[0]], nb, m.KVLora, w, kn.Eps, kn.ZeroCentred))
	r.check(r.k.Rope(r.s, b.ckv+uintptr(4*m.KVLora), r.cos, r.sin, nb, 1, w, 0, rh))
	r.check(r.k.Rope(r.s, b.q+uintptr(4*m.Nope), r.cos, r.sin, nb, m.Heads, m.Heads*qw, qw, rh))
	r.check(r.k.MLAAbsorb(r.s, b.qabs, b.q, r.kvb[m], nb, mlaShape(m)))
	ix := m.Index
	if ix != nil {
		r.check(r.k.LayerNorm(r.s, b.ki, b.ki, r.vecs[&ix.KNorm[0]], r.vecs[&ix.KBias[0]], nb, ix.Dim, ix.Eps))
		r.check(r.k.Rope(r.s, b.ki, r.cos, r.sin, nb, 1, ix.Dim, 0, rh))
		r.check(r.k.Rope(r.s, b.qi, r.cos, r.sin, nb, ix.Heads, ix.Heads*ix.Dim, ix.Dim, rh))
	}
	ds := r.cur
	app := func(dst, src uintptr, width int) {
		if r.graphing { // positions read on the device
			for i := range nb {
				r.check(r.k.KVAppend(r.s, dst, 0, src+uintptr(4*i*width), 0, r.posDev+uintptr(4*i), width, 0))
			}
			return
		}
		r.check(r.Dev.CopyDAsync(dst+uintptr(4*r.pos*width), src, 4*nb*width, r.s))
	}
	app(ds.kc[cache], b.ckv, w)
	if ix != nil {
		app(ds.vc[cache], b.ki, ix.Dim)
	}
}

// Select implements block.Backend: the indexer's scores and each row's
// top-k positions.
func (r *Runner) Select(m *block.MLA, cache int) {
	r.mark("index")
	ix, b, ds := m.Index, &r.mla, r.cur
	x := cuda.Index{Pos: r.pos, Rows: r.nb, Heads: ix.Heads, Dim: ix.Dim, TopK: ix.TopK, Stride: r.ctx,
		Scale: float32(1 / math.Sqrt(float64(ix.Dim))), WScale: float32(1 / math.Sqrt(float64(ix.Heads)))}
	if r.graphing {
		x.PosDev, x.MaxPos = r.posDev, ds.ctx
	}
	r.check(r.k.IndexSelect(r.s, b.sel, b.sc, b.qi, ds.vc[cache], b.wts, x))
}

// MLAAttend implements block.Backend: the attention over the latents of
// the selected positions (every position without an indexer), W_v per
// head, then o_proj.
func (r *Runner) MLAAttend(m *block.MLA, cache int) {
	r.mark("attend")
	b, ds := &r.mla, r.cur
	at := r.mlaAttn(m)
	if r.graphing {
		at.PosDev, at.MaxPos = r.posDev, ds.ctx
	}
	kc := ds.kc[cache]
	r.check(r.k.AttendLatent(r.s, b.olat, b.qabs, kc, r.attS, at))
	r.check(r.k.MLAVOut(r.s, b.o, b.olat, r.kvb[m], r.nb, mlaShape(m)))
	r.mark("attn_out")
	r.mul(r.y, r.wmat(&m.O), b.o, r.nb, m.Heads*m.V)
}
