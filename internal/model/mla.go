package model

import (
	"math"
	"slices"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// mlaScratch holds the buffers of the latent attention block and its
// indexer, sized for the model's first MLA layer (all are alike).
type mlaScratch struct {
	qa     []float32 // [rows][q_lora]: q_a, then q_a_layernorm(q_a)
	q      []float32 // [rows][heads·(nope+rope)]
	ckv    []float32 // [rows][kv_lora+rope]
	qabs   []float32 // [rows][heads][kv_lora+rope] absorbed queries
	o      []float32 // [rows][heads·v]
	qi     []float32 // [rows][index_heads·index_dim]
	ki     []float32 // [rows][index_dim]
	wts    []float32 // [rows][index_heads]
	sel    []int     // [rows][index_topk] selected positions, ascending
	nsel   []int     // [rows] how many (-1: every position)
	scores []float32 // [threads][ctx], grown on demand
	order  []int     // [threads][ctx] the indexer's ranking, grown on demand
	olat   []float32 // [threads][latentGroup][kv_lora]
	// gscores and sums are each thread's softmax weights and their sums
	// for a group of heads over every position (kernels.AttendLatentHeads).
	gscores, sums []float32 // [threads][latentGroup][ctx], grown with scores; [threads][latentGroup]
	// picked is each thread's copy of one row's selected latents, in
	// order, so that the row's heads read them as a contiguous cache.
	picked []float32 // [threads][index_topk][kv_lora+rope]
	// Each thread's product scratch and, for the absorb, one head's
	// q_nope of every row and their W_k^T·q_nope.
	sc     []kernels.Scratch // [threads]
	view   []kernels.Mat     // [threads]: the head's rows of WK or WV (held here, not on the stack, so as not to escape)
	hx, ho []float32         // [threads][rows][nope], [threads][rows][kv_lora]
	rows   int
	task   mlaTask
	absorb absorbTask
	score  scoreTask
}

func (s *mlaScratch) init(m *block.MLA, rows, threads int) {
	w := m.KVLora + m.RopeDim
	s.qa = make([]float32, rows*m.QLora)
	s.q = make([]float32, rows*m.Heads*(m.Nope+m.RopeDim))
	s.ckv = make([]float32, rows*w)
	s.qabs = make([]float32, rows*m.Heads*w)
	s.o = make([]float32, rows*m.Heads*m.V)
	s.olat = make([]float32, threads*latentGroup*m.KVLora)
	s.sums = make([]float32, threads*latentGroup)
	s.sc, s.view = make([]kernels.Scratch, threads), make([]kernels.Mat, threads)
	s.hx, s.ho, s.rows = make([]float32, threads*rows*m.Nope), make([]float32, threads*rows*m.KVLora), rows
	s.nsel = make([]int, rows)
	if ix := m.Index; ix != nil {
		s.qi = make([]float32, rows*ix.Heads*ix.Dim)
		s.ki = make([]float32, rows*ix.Dim)
		s.wts = make([]float32, rows*ix.Heads)
		s.sel = make([]int, rows*ix.TopK)
		s.picked = make([]float32, threads*ix.TopK*w)
	}
}

// grow makes room for span positions per thread.
func (s *mlaScratch) grow(threads, span int) {
	if len(s.scores) >= threads*span {
		return
	}
	n := 4096
	for n < span {
		n *= 2
	}
	s.scores = make([]float32, threads*n)
	s.order = make([]int, threads*n)
	s.gscores = make([]float32, threads*latentGroup*n)
}

// MLAProject implements block.Backend.
func (r *Runner) MLAProject(m *block.MLA) {
	s := &r.mla
	nb := r.nb
	r.Pool.MatMul2(s.qa, &m.QA.Mat, s.ckv, &m.KVA.Mat, r.h, nb)
	r.rows(rowTask{op: opMLANorm, mla: m}, nb)
	r.Pool.MatMul(s.q, &m.QB.Mat, s.qa, nb)
	if ix := m.Index; ix != nil {
		r.Pool.MatMul(s.qi, &ix.WQ.Mat, s.qa, nb)
		r.Pool.MatMul2(s.ki, &ix.WK.Mat, s.wts, &ix.Weights.Mat, r.h, nb)
	}
}

// MLAPrep implements block.Backend. W_k is absorbed into the queries a
// head at a time across the pool's threads: the head's block of WK times
// every row's q_nope as one product, so that a prefill chunk reads each
// head's W_k once, and a decode's one row still reads all of them (16 MB a
// layer at 4 bits at DeepSeek-V3's shapes) on every core.
func (r *Runner) MLAPrep(m *block.MLA, cache int) {
	kc, vc, _ := r.st.kv(cache)
	r.rows(rowTask{op: opMLAPrep, mla: m, kc: kc, vc: vc, pos: r.pos}, r.nb)
	s := &r.mla
	s.absorb = absorbTask{r: r, m: m, nb: r.nb}
	r.Pool.Parallel(m.Heads, 1, &s.absorb)
	s.absorb = absorbTask{}
}

// absorbTask writes the absorbed queries of heads lo..hi of every row:
// [W_k^T·q_nope ‖ q_rot], the query already rotated.
type absorbTask struct {
	r  *Runner
	m  *block.MLA
	nb int
}

func (t *absorbTask) Run(lo, hi int) {
	m, s, nb := t.m, &t.r.mla, t.nb
	w, qw := m.KVLora+m.RopeDim, m.Nope+m.RopeDim
	part := t.r.Pool.Part(m.Heads, 1, lo)
	x := s.hx[part*s.rows*m.Nope:][:nb*m.Nope]
	out := s.ho[part*s.rows*m.KVLora:][:nb*m.KVLora]
	for h := lo; h < hi; h++ {
		for i := 0; i < nb; i++ {
			copy(x[i*m.Nope:(i+1)*m.Nope], s.q[(i*m.Heads+h)*qw:])
		}
		s.headProduct(part, &m.WK.Mat, h*m.KVLora, (h+1)*m.KVLora, out, x, nb)
		for i := 0; i < nb; i++ {
			qa := s.qabs[(i*m.Heads+h)*w : (i*m.Heads+h+1)*w]
			copy(qa[:m.KVLora], out[i*m.KVLora:(i+1)*m.KVLora])
			copy(qa[m.KVLora:], s.q[(i*m.Heads+h)*qw+m.Nope:(i*m.Heads+h+1)*qw])
		}
	}
}

// Select implements block.Backend. A step of many rows scores and
// chooses each row's positions on one thread a row; a step of fewer than
// would keep the threads busy (a decode) splits each row's positions
// over the threads instead, since a row's scores cost O(context) (64
// heads of 128 dims a position at DeepSeek-V3.2's shapes). The scores,
// and so the choice, are the same either way.
func (r *Runner) Select(m *block.MLA, cache int) {
	kc, vc, _ := r.st.kv(cache)
	s := &r.mla
	s.grow(r.Pool.Threads(), r.pos+r.nb)
	if r.nb >= rowGrain*r.Pool.Threads() {
		r.rows(rowTask{op: opSelect, mla: m, kc: kc, vc: vc, pos: r.pos, nb: r.nb}, r.nb)
		return
	}
	ix := m.Index
	for i := 0; i < r.nb; i++ {
		n := r.pos + i + 1
		sel := s.sel[i*ix.TopK : (i+1)*ix.TopK]
		if s.every(i, n, sel) {
			continue
		}
		sc := s.scores[:n] // thread 0's span: no task runs beside this one
		s.score = scoreTask{r: r, ix: ix, vc: vc, row: i, sc: sc}
		r.Pool.Parallel(n, 256, &s.score)
		s.score = scoreTask{}
		TopK(sel, sc, s.order[:ix.TopK])
		slices.Sort(sel)
		s.nsel[i] = ix.TopK
	}
}

// every selects all n positions of row i, when they are no more than
// sel holds, and reports whether it did.
func (s *mlaScratch) every(i, n int, sel []int) bool {
	if n > len(sel) {
		return false
	}
	s.nsel[i] = n
	for t := range n {
		sel[t] = t
	}
	return true
}

// scoreTask scores positions lo..hi of one row for the indexer.
type scoreTask struct {
	r   *Runner
	ix  *block.Indexer
	vc  []float32
	row int
	sc  []float32
}

func (t *scoreTask) Run(lo, hi int) { t.r.indexScores(t.ix, t.vc, t.row, lo, hi, t.sc) }

// indexScores writes into sc[lo:hi] the indexer's scores of positions
// lo..hi for row i: Σ_h w_h·heads^-½·relu(dim^-½·q_h·k_t), heads in order.
// The dots run a block of positions at a time for all heads
// (kernels.IndexScores), in scratch on the stack of whichever thread runs
// the span.
func (r *Runner) indexScores(ix *block.Indexer, vc []float32, i, lo, hi int, sc []float32) {
	s := &r.mla
	scale := float32(1 / math.Sqrt(float64(ix.Dim)))
	wscale := float32(1 / math.Sqrt(float64(ix.Heads)))
	wts := s.wts[i*ix.Heads : (i+1)*ix.Heads]
	var buf [indexScratch]float32
	tmp := buf[:]
	if 2*ix.Heads > len(buf) {
		tmp = make([]float32, 2*ix.Heads) // more heads than any release has
	}
	ws := tmp[:ix.Heads]
	for h, w := range wts {
		ws[h] = w * wscale // weights_proj·heads^-½, rounded as before its product with relu(scale·q·k)
	}
	q := s.qi[i*ix.Heads*ix.Dim : (i+1)*ix.Heads*ix.Dim]
	kernels.IndexScores(sc[lo:hi], q, ix.Heads, ix.Dim, vc[lo*ix.Dim:hi*ix.Dim], hi-lo, scale, ws, tmp[ix.Heads:])
}

// indexScratch is indexScores' scratch in floats: the heads' weights and
// the dots of 64 positions at DeepSeek-V3.2's 64 heads (16.5 KB).
const indexScratch = 64*64 + 64

// MLAAttend implements block.Backend.
func (r *Runner) MLAAttend(m *block.MLA, cache int) {
	s := &r.mla
	kc, _, _ := r.st.kv(cache)
	if m.Index == nil {
		for i := 0; i < r.nb; i++ {
			s.nsel[i] = -1
		}
	}
	s.grow(r.Pool.Threads(), r.pos+r.nb)
	s.task = mlaTask{r: r, m: m, kc: kc, pos: r.pos, nb: r.nb}
	r.Pool.Parallel(r.nb*m.Heads, 1, &s.task)
	s.task = mlaTask{}
	r.Pool.MatMul(r.y, &m.O.Mat, s.o, r.nb)
}

// mlaNorm applies q_a_layernorm to rows lo..hi of qa.
func (r *Runner) mlaNorm(m *block.MLA, lo, hi int) {
	s := &r.mla
	n := &m.QANorm
	for i := lo; i < hi; i++ {
		x := s.qa[i*m.QLora : (i+1)*m.QLora]
		kernels.RMSNorm(x, x, n.W, n.Eps, n.ZeroCentred)
	}
}

// mlaPrep norms and rotates the latents and queries of rows lo..hi and
// appends the latents (and the indexer's keys) to the cache; absorbTask
// then absorbs W_k into the queries.
func (r *Runner) mlaPrep(m *block.MLA, kc, vc []float32, pos, lo, hi int) {
	s := &r.mla
	w := m.KVLora + m.RopeDim
	qw := m.Nope + m.RopeDim
	rh := r.rope.Dim / 2
	kn := &m.KVANorm
	for i := lo; i < hi; i++ {
		cos, sin := r.cos[i*rh:(i+1)*rh], r.sin[i*rh:(i+1)*rh]
		c := s.ckv[i*w : (i+1)*w]
		kernels.RMSNorm(c[:m.KVLora], c[:m.KVLora], kn.W, kn.Eps, kn.ZeroCentred)
		kernels.Rope(c[m.KVLora:], cos, sin)
		for h := 0; h < m.Heads; h++ {
			kernels.Rope(s.q[(i*m.Heads+h)*qw+m.Nope:(i*m.Heads+h+1)*qw], cos, sin)
		}
		copy(kc[(pos+i)*w:(pos+i+1)*w], c)
		if ix := m.Index; ix != nil {
			k := s.ki[i*ix.Dim : (i+1)*ix.Dim]
			kernels.LayerNorm(k, k, ix.KNorm, ix.KBias, ix.Eps)
			kernels.Rope(k, cos, sin)
			for h := 0; h < ix.Heads; h++ {
				kernels.Rope(s.qi[(i*ix.Heads+h)*ix.Dim:(i*ix.Heads+h+1)*ix.Dim], cos, sin)
			}
			copy(vc[(pos+i)*ix.Dim:(pos+i+1)*ix.Dim], k)
		}
	}
}

// selectRows picks the positions rows lo..hi attend to: every position
// while a row has at most TopK, else the TopK best indexer scores (the
// lower position first on ties), in position order.
func (r *Runner) selectRows(m *block.MLA, vc []float32, pos, nb, lo, hi int) {
	s := &r.mla
	ix := m.Index
	part := r.Pool.Part(nb, rowGrain, lo)
	span := len(s.scores) / r.Pool.Threads()
	sc := s.scores[part*span : (part+1)*span]
	ord := s.order[part*span : (part+1)*span]
	for i := lo; i < hi; i++ {
		n := pos + i + 1
		sel := s.sel[i*ix.TopK : (i+1)*ix.TopK]
		if s.every(i, n, sel) {
			continue
		}
		r.indexScores(ix, vc, i, 0, n, sc)
		TopK(sel, sc[:n], ord[:ix.TopK])
		slices.Sort(sel)
		s.nsel[i] = ix.TopK
	}
}

// latentGroup is the most heads of a row whose attention over every
// position runs together (kernels.AttendLatentHeads), each block of
// latents read once for them.
const latentGroup = 8

// mlaTask computes (row, head) pairs of the latent attention: the softmax
// over the row's positions in order, then W_v per head. A row's heads go
// up to latentGroup at a time; a row with a selection first copies its
// selected latents, in order, into the thread's picked rows, which the
// heads then read as they read a whole cache (the same values in the
// same order: the same bits).
type mlaTask struct {
	r       *Runner
	m       *block.MLA
	kc      []float32
	pos, nb int
}

func (t *mlaTask) Run(lo, hi int) {
	r, m := t.r, t.m
	s := &r.mla
	w, kvl := m.KVLora+m.RopeDim, m.KVLora
	part := r.Pool.Part(t.nb*m.Heads, 1, lo)
	span := len(s.scores) / r.Pool.Threads()
	gsc := s.gscores[part*latentGroup*span : (part+1)*latentGroup*span]
	sums := s.sums[part*latentGroup : (part+1)*latentGroup]
	olats := s.olat[part*latentGroup*kvl : (part+1)*latentGroup*kvl]
	var picked []float32
	if ix := m.Index; ix != nil {
		picked = s.picked[part*ix.TopK*w : (part+1)*ix.TopK*w]
	}
	pickedRow := -1
	for idx := lo; idx < hi; {
		i, h := idx/m.Heads, idx%m.Heads
		kc, n := t.kc, t.pos+i+1
		if k := s.nsel[i]; k >= 0 {
			if pickedRow != i {
				for j, p := range s.sel[i*m.Index.TopK : i*m.Index.TopK+k] {
					copy(picked[j*w:(j+1)*w], t.kc[p*w:(p+1)*w])
				}
				pickedRow = i
			}
			kc, n = picked, k
		}
		q := s.qabs[(i*m.Heads+h)*w:]
		g := min(latentGroup, m.Heads-h, hi-idx)
		kernels.AttendLatentHeads(olats, q, g, w, kvl, kvl, kc, w, n, m.Scale, gsc, sums)
		for k := 0; k < g; k++ {
			olat := olats[k*kvl : (k+1)*kvl]
			o := s.o[(i*m.Heads+h+k)*m.V : (i*m.Heads+h+k+1)*m.V]
			s.headProduct(part, &m.WV.Mat, (h+k)*m.V, (h+k+1)*m.V, o, olat, 1)
		}
		idx += g
	}
}

// headProduct writes out = W[lo:hi]·x for nb rows of x (a head's block
// of WK or WV) on thread part's scratch, or row by row where the rows
// can't be viewed (a tiled matrix off a tile's boundary).
func (s *mlaScratch) headProduct(part int, w *kernels.Mat, lo, hi int, out, x []float32, nb int) {
	if v, ok := w.View(lo, hi); ok {
		s.view[part] = v
		s.sc[part].MatMul(out, &s.view[part], x, nb)
		return
	}
	var room [64]float32
	xsum := room[:]
	if g := w.Cols / format.GroupSize; g > len(room) {
		xsum = make([]float32, g) // no model's latent is this wide
	}
	for i := 0; i < nb; i++ {
		w.DotRows(out[i*(hi-lo):(i+1)*(hi-lo)], lo, x[i*w.Cols:(i+1)*w.Cols], xsum)
	}
}

// TopK writes into sel the positions of the len(sel) best scores, the
// lower position first on ties, in no particular order: a bounded heap
// whose root is the worst kept, O(n log k). heap is scratch of len(sel).
// It is the indexer's choice; the GPU's index_select keeps the same set.
func TopK(sel []int, sc []float32, heap []int) {
	k := len(sel)
	better := func(a, b int) bool { return sc[a] > sc[b] || sc[a] == sc[b] && a < b }
	down := func(i int) {
		for {
			w, l, r := i, 2*i+1, 2*i+2
			if l < k && better(heap[w], heap[l]) {
				w = l
			}
			if r < k && better(heap[w], heap[r]) {
				w = r
			}
			if w == i {
				return
			}
			heap[i], heap[w] = heap[w], heap[i]
			i = w
		}
	}
	for t := 0; t < k; t++ {
		heap[t] = t
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for t := k; t < len(sc); t++ {
		if better(t, heap[0]) {
			heap[0] = t
			down(0)
		}
	}
	copy(sel, heap)
}
