//go:build linux

package gpu

import (
	"fmt"
	"math"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/format"
)

// mlaBufs is the device scratch of DeepSeek's latent attention and its
// indexer, laid out as the CPU's (model/mla.go), for the model's first
// MLA layer (all are alike).
type mlaBufs struct {
	qa   uintptr // [rows][q_lora]: q_a, then q_a_layernorm(q_a)
	q    uintptr // [rows][heads][nope+rope]
	ckv  uintptr // [rows][kv_lora+rope]: the latents, then normed and rotated
	qn   uintptr // [rows][heads][nope]: q_nope, contiguous, for a quantised W_k
	qabs uintptr // [rows][heads][kv_lora+rope]: the absorbed queries
	olat uintptr // [rows][heads][kv_lora]: the attention's output in the latent (W_k's product before it)
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

// mlaTabs is one latent attention's W_k and W_v on the device: the
// address tables (cuda.HeadTab) through which MatEx multiplies them a head
// a slot, and their kind ("" for float32, which HeadF32 multiplies).
type mlaTabs struct {
	wk, wv         uintptr
	wkKind, wvKind string
}

// exKinds names the kinds MatEx multiplies (the recorded step's experts,
// and W_k and W_v a head at a time).
var exKinds = map[format.Kind]string{format.Q4: "q4", format.Q8: "q8", format.BF16: "bf16"}

// headTabs uploads the address tables of every latent attention's W_k and
// W_v (the weights are already on the device: r.mats), and the slots'
// heads (slot k is head k % heads).
func (r *Runner) headTabs(layers []block.Layer) error {
	m0 := firstMLA(layers)
	if m0 == nil {
		return nil
	}
	var ta arena
	offs := map[*block.MLA][2]int{}
	tab := func(w mat, heads int) (string, int, error) {
		if w.kind == format.F32 {
			return "", 0, nil
		}
		kind, ok := exKinds[w.kind]
		if !ok {
			return "", 0, fmt.Errorf("gpu: a latent attention's W_k or W_v of kind %s", w.kind)
		}
		p := w.q
		if w.kind == format.BF16 {
			p = w.p
		}
		t, err := cuda.HeadTab(kind, cuda.Q4{Rows: w.rows, Cols: w.cols, Q: p, Scales: w.s, Biases: w.b}, heads)
		if err != nil {
			return "", 0, err
		}
		return kind, ta.put(bytesOf(t)), nil
	}
	for _, L := range layers {
		m, ok := L.Mixer.(*block.MLA)
		if !ok {
			continue
		}
		if m.Heads != m0.Heads { // the slots' heads (r.headOf) are m0's
			return fmt.Errorf("gpu: latent attention layers of %d and %d heads", m0.Heads, m.Heads)
		}
		var t mlaTabs
		var o [2]int
		var err error
		if t.wkKind, o[0], err = tab(r.wmat(&m.WK), m.Heads); err != nil {
			return err
		}
		if t.wvKind, o[1], err = tab(r.wmat(&m.WV), m.Heads); err != nil {
			return err
		}
		r.mlaTab[m] = t
		offs[m] = o
	}
	heads := make([]int32, headSlots(m0.Heads, r.maxRows))
	for k := range heads {
		heads[k] = int32(k % m0.Heads)
	}
	hoff := ta.put(bytesOf(heads))
	buf, err := ta.commit(r.Dev)
	if err != nil {
		return err
	}
	r.weights = append(r.weights, buf)
	for m, o := range offs {
		t := r.mlaTab[m]
		t.wk, t.wv = buf.Ptr+uintptr(o[0]), buf.Ptr+uintptr(o[1])
		r.mlaTab[m] = t
	}
	r.headOf = buf.Ptr + uintptr(hoff)
	return nil
}

// headSlots is the most slots one MatEx launch of a product a head at a
// time takes: every (row, head) of rows rows, within the grid's 65535
// and a whole number of heads, so that each launch's first slot is head 0.
func headSlots(heads, rows int) int {
	return min(rows*heads, 65535/heads*heads)
}

// headMul writes out row k = W_{k % heads}·x row k for the step's
// nb·heads rows (x [nb·heads][cols] and out [nb·heads][w.rows/heads],
// contiguous), W at its kind through its address table: the one-row
// kernels, a (row, head) a slot, or for a chunk of rows at q4 the tiled
// kernel a head at a time (the same bits).
func (r *Runner) headMul(out uintptr, w mat, kind string, tab uintptr, x uintptr, heads int) {
	n, C, O := r.nb*heads, w.cols, w.rows/heads
	if kind == "q4" && r.nb >= groupedRows && cuda.GemmCols(C) {
		// A chunk's rows: the tiled kernel, every (row, head) in one
		// launch, each head's weights read once a tile of rows.
		r.prepare(x, n, C, w.kind)
		a := cuda.Acts{X: x, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: n, Cols: C}
		r.check(r.k.MatQ4Heads(r.s, out, tab, heads, O, a, cuda.GemmRows(r.nb)))
		return
	}
	step := headSlots(heads, r.maxRows)
	for k0 := 0; k0 < n; k0 += step {
		k1 := min(n, k0+step)
		xk := x + uintptr(4*k0*C)
		r.prepare(xk, k1-k0, C, w.kind)
		a := cuda.Acts{X: xk, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: k1 - k0, Cols: C}
		r.check(r.k.MatEx(r.s, kind, out+uintptr(4*k0*O), tab, r.headOf, O, a, k1-k0, true))
	}
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
	add(&b.qn, rows*m.Heads*m.Nope)
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
	w(&m.WK)
	w(&m.WV)
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
	r.absorb(m)
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

// absorb writes the absorbed queries qabs: W_k^T·q_nope a head at a time
// (W_k's rows are [heads·kv_lora][nope], k_t), then q_rot, as the CPU's
// MLAPrep. A quantised W_k multiplies q_nope copied contiguous, into olat
// (free until the attention), and the product is copied into place.
func (r *Runner) absorb(m *block.MLA) {
	b, nb, H := &r.mla, r.nb, m.Heads
	w, qw := m.KVLora+m.RopeDim, m.Nope+m.RopeDim
	wk, t := r.wmat(&m.WK), r.mlaTab[m]
	if t.wkKind == "" {
		r.check(r.k.HeadF32(r.s, b.qabs, wk.p, b.q, cuda.Heads{Rows: nb, Heads: H, O: m.KVLora, C: m.Nope,
			XRow: H * qw, XHead: qw, ORow: H * w, OHead: w}))
	} else {
		r.check(r.k.CopyRows(r.s, b.qn, m.Nope, b.q, qw, nb*H, m.Nope))
		r.headMul(b.olat, wk, t.wkKind, t.wk, b.qn, H)
		r.check(r.k.CopyRows(r.s, b.qabs, w, b.olat, m.KVLora, nb*H, m.KVLora))
	}
	r.check(r.k.CopyRows(r.s, b.qabs+uintptr(4*m.KVLora), w, b.q+uintptr(4*m.Nope), qw, nb*H, m.RopeDim))
}

// vout writes o = W_v·olat a head at a time.
func (r *Runner) vout(m *block.MLA) {
	b, H := &r.mla, m.Heads
	wv, t := r.wmat(&m.WV), r.mlaTab[m]
	if t.wvKind == "" {
		r.check(r.k.HeadF32(r.s, b.o, wv.p, b.olat, cuda.Heads{Rows: r.nb, Heads: H, O: m.V, C: m.KVLora,
			XRow: H * m.KVLora, XHead: m.KVLora, ORow: H * m.V, OHead: m.V}))
		return
	}
	r.headMul(b.o, wv, t.wvKind, t.wv, b.olat, H)
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
	r.vout(m)
	r.mark("attn_out")
	r.mul(r.y, r.wmat(&m.O), b.o, r.nb, m.Heads*m.V)
}
