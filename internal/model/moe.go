package model

import (
	"math"
	"slices"
	"sync/atomic"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// moeScratch holds the buffers of the MoE block.
type moeScratch struct {
	main    moeThread   // the sequential path's buffers
	threads []moeThread // per pool thread, for experts computed in parallel
	exps    []*Expert   // [distinct] experts of a step, when they stay valid
	rpos    []int       // positions in distinct of a ReadyProvider's batch
	rex     []*Expert   // their experts
	order   []int       // distinct indices (len(distinct): shared expert) by descending rows
	task    moeTask
	logits  []float32    // [rows][experts] router logits, then probabilities
	ids     []int        // [rows][top_k] chosen experts in router order
	w       []float32    // [rows][top_k] their weights
	grp     ExpertGroups // the batch's choices by expert; outk's rows in its order
	outk    []float32    // [rows·top_k][hidden] routed outputs, each expert's rows together
	pos     []int        // [rows][top_k] the row of outk holding (row, k)
	maxw    []float32    // [experts] per distinct expert: largest routing weight (Hint)
	plogits []float32    // [rows][experts] lookahead: next layer's router logits
	pnorm   []float32    // [rows][hidden] lookahead: residual under the next layer's norm
	pred    []int        // lookahead: predicted experts of the next layer, first-use order
	pmark   []bool       // [experts] lookahead: already in pred
	pk      []int        // [top_k] lookahead: one row's picks
	sgate   []float32    // [rows]
	shared  []float32    // [rows][hidden]
	dense   int          // the widest dense MLP's intermediate size
	choice  []float32    // [rows][experts] grouped routing: scores for choice
}

// moeThread is one thread's buffers for computing whole experts.
type moeThread struct {
	sc       kernels.Scratch
	in, g, u []float32
}

// matmuler is kernels.Pool (one product over every thread) or
// kernels.Scratch (one product on the calling thread); both give
// bit-identical results.
type matmuler interface {
	MatMul(out []float32, w *kernels.Mat, x []float32, nb int)
	MatMul2(out1 []float32, w1 *kernels.Mat, out2 []float32, w2 *kernels.Mat, x []float32, nb int)
}

// stableExperts is implemented by providers whose Expert values stay valid
// for the whole step (every expert resident): the MoE block then collects
// them all and computes different experts on different threads, one
// dispatch per layer instead of three per expert.
type stableExperts interface {
	StableExperts() bool
}

func (s *moeScratch) initThreads(c *format.Config, rows int, pool *kernels.Pool) {
	H, I := c.Hidden, max(c.MoEInter, c.SharedInter)
	s.threads = make([]moeThread, pool.Threads())
	for i := range s.threads {
		t := &s.threads[i]
		// A thread out of experts helps the others with their last ones.
		t.sc.Join(pool.Crew(), i)
		t.in = make([]float32, rows*H)
		t.g = make([]float32, rows*I)
		t.u = make([]float32, rows*I)
	}
	s.exps = make([]*Expert, c.Experts)
	s.order = make([]int, 0, c.Experts+1)
	s.rpos = make([]int, 0, c.Experts)
	s.rex = make([]*Expert, 0, c.Experts)
}

func (s *moeScratch) init(c *format.Config, rows int) {
	H, E, K, I := c.Hidden, c.Experts, c.TopK, c.MoEInter
	s.logits = make([]float32, rows*E)
	s.ids = make([]int, rows*K)
	s.w = make([]float32, rows*K)
	s.grp = NewExpertGroups(E, rows*K)
	s.maxw = make([]float32, E)
	s.plogits = make([]float32, rows*E)
	s.pnorm = make([]float32, rows*H)
	s.pred = make([]int, 0, E)
	s.pmark = make([]bool, E)
	s.pk = make([]int, 0, K)
	s.main = moeThread{in: make([]float32, rows*H), g: make([]float32, rows*max(I, c.SharedInter, s.dense)),
		u: make([]float32, rows*max(I, c.SharedInter, s.dense))}
	s.outk = make([]float32, rows*K*H)
	s.choice = make([]float32, rows*E)
	s.pos = make([]int, rows*K)
	if c.SharedInter > 0 {
		s.sgate = make([]float32, rows)
		s.shared = make([]float32, rows*H)
	}
}

// Route writes the top-k experts and weights of each row given its router
// probabilities: the k largest in descending order (lowest id first on
// ties), renormalised when the config says so.
func Route(probs []float32, k int, norm bool, ids []int, w []float32) {
	// One pass, keeping the best k so far in order: an expert moves ahead
	// only of strictly smaller ones, so ties keep the lower id first.
	n := 0
	for e, p := range probs {
		if n == k && p <= w[k-1] {
			continue
		}
		j := min(n, k-1)
		for ; j > 0 && w[j-1] < p; j-- {
			ids[j], w[j] = ids[j-1], w[j-1]
		}
		ids[j], w[j] = e, p
		n = min(n+1, k)
	}
	if norm {
		var s float32
		for _, v := range w[:k] {
			s += v
		}
		for j := range w[:k] {
			w[j] /= s
		}
	}
}

// RouteFunc overwrites ids (top-k distinct experts) of the row at pos of
// layer.
type RouteFunc func(layer, pos int, ids []int)

// The MoE ops of block.Backend: the routed outputs are summed in router
// order, so the result does not depend on the order in which the provider
// delivers experts.

// RouterLogits implements block.Backend.
func (r *Runner) RouterLogits(L *block.MoE) {
	s := &r.moe
	r.Pool.MatMul(s.logits, &L.Router.Mat, r.h, r.nb)
	r.bias(s.logits, L.RouterBias, r.nb)
	r.trace("router_logits", L.Layer, r.nb, r.M.Config.Experts, s.logits)
}

// Route implements block.Backend.
func (r *Runner) Route(L *block.MoE) {
	r.rows(rowTask{op: opRoute, moe: L}, r.nb)
	if r.Routes == nil {
		return
	}
	c := &r.M.Config
	s := &r.moe
	E, K := c.Experts, c.TopK
	for i := 0; i < r.nb; i++ {
		p := s.logits[i*E : (i+1)*E]
		ids, w := s.ids[i*K:(i+1)*K], s.w[i*K:(i+1)*K]
		r.Routes(L.Layer, r.positions[i], ids)
		var sum float32
		for k, e := range ids {
			w[k] = p[e]
			sum += w[k]
		}
		for k := range w {
			w[k] /= sum
		}
	}
}

// Combine implements block.Backend.
func (r *Runner) Combine(L *block.MoE) { r.rows(rowTask{op: opCombine, moe: L}, r.nb) }

// Experts implements block.Backend: the provider's Begin with the batch's
// distinct experts, the lookahead, then the routed experts and the shared
// expert.
func (r *Runner) Experts(L *block.MoE) error {
	c := &r.M.Config
	s := &r.moe
	K := c.TopK
	nb := r.nb
	g := &s.grp
	if err := GroupChoices(g, s.ids[:nb*K]); err != nil {
		return err
	}
	for di, e := range g.Distinct {
		// The expert's outputs go to consecutive rows of outk, straight
		// from its down projection; the combine finds them through pos.
		var mw float32
		for j, rk := range g.Members(e) {
			s.pos[rk] = g.Base[di] + j
			mw = max(mw, s.w[rk])
		}
		s.maxw[di] = mw
	}
	nd := len(g.Distinct)
	if err := r.M.Experts.Begin(L.Layer, g.Distinct, Hint{MaxWeight: s.maxw[:nd], Rows: g.Rows[:nd]}); err != nil {
		return err
	}
	r.lookahead(L, nb)
	if st, ok := r.M.Experts.(stableExperts); ok && st.StableExperts() && r.Pool.Threads() > 1 {
		for range s.grp.Distinct {
			di, ex, err := r.M.Experts.Next()
			if err != nil {
				return err
			}
			s.exps[di] = ex
		}
		s.order = s.order[:0]
		if L.Shared != nil {
			s.order = append(s.order, len(s.grp.Distinct)) // one more work item
		}
		for di := range s.grp.Distinct {
			s.addItem(di)
		}
		r.runItems(L, nb)
	} else if rp, ok := r.M.Experts.(ReadyProvider); ok && r.Pool.Threads() > 1 {
		if err := r.readyExperts(L, rp, nb); err != nil {
			return err
		}
	} else {
		for range s.grp.Distinct {
			di, ex, err := r.M.Experts.Next()
			if err != nil {
				return err
			}
			r.runExpert(L, ex, di, &s.main, r.Pool)
		}
		if L.Shared != nil {
			r.sharedExpert(L, nb, &s.main, r.Pool)
		}
	}
	if L.Shared != nil && L.SharedGate.Present() {
		r.Pool.MatMul(s.sgate, &L.SharedGate.Mat, r.h, nb)
	}
	return nil
}

// addItem queues distinct expert di for runItems. Largest first, handed
// out one at a time: experts differ in rows by an order of magnitude in a
// prefill chunk, so equal counts per thread would leave one thread idle.
// The shared expert's item (len(distinct)), when queued, stays first.
func (s *moeScratch) addItem(di int) {
	j := len(s.order)
	s.order = append(s.order, di)
	for ; j > 0 && s.order[j-1] < len(s.grp.Distinct) && s.grp.Rows[s.order[j-1]] < s.grp.Rows[di]; j-- {
		s.order[j] = s.order[j-1]
	}
	s.order[j] = di
}

// runItems computes the queued items (s.order, experts in s.exps) as
// whole experts on different threads, in one dispatch.
func (r *Runner) runItems(L *block.MoE, nb int) {
	s := &r.moe
	s.task = moeTask{r: r, L: L, nb: nb, items: len(s.order)}
	r.Pool.ParallelCrew(r.Pool.Threads(), 1, &s.task)
	s.task = moeTask{}
}

// readyExperts computes a streamed step's experts in batches: whatever the
// provider has in memory goes out in one dispatch, whole experts on
// different threads (the shared expert with the first batch), as resident
// experts do; while only reads are left, the shared expert if not yet
// done, else the next expert to land alone, split across the threads.
// Which path an expert takes changes no result: each product is
// bit-identical on one thread or several, and Combine sums in router
// order.
func (r *Runner) readyExperts(L *block.MoE, rp ReadyProvider, nb int) error {
	s := &r.moe
	nd := len(s.grp.Distinct)
	shared := L.Shared != nil
	for done := 0; done < nd; {
		var err error
		if s.rpos, s.rex, err = rp.Ready(s.rpos[:0], s.rex[:0]); err != nil {
			return err
		}
		switch {
		case len(s.rpos) == 0 && shared:
			r.sharedExpert(L, nb, &s.main, r.Pool) // while the reads land
			shared = false
		case len(s.rpos) == 0:
			di, ex, err := rp.Next()
			if err != nil {
				return err
			}
			r.runExpert(L, ex, di, &s.main, r.Pool)
			done++
		case len(s.rpos) == 1 && !shared:
			r.runExpert(L, s.rex[0], s.rpos[0], &s.main, r.Pool)
			done++
		default:
			s.order = s.order[:0]
			if shared {
				s.order = append(s.order, nd)
				shared = false
			}
			for k, di := range s.rpos {
				s.exps[di] = s.rex[k]
				s.addItem(di)
			}
			r.runItems(L, nb)
			done += len(s.rpos)
		}
	}
	if shared {
		r.sharedExpert(L, nb, &s.main, r.Pool)
	}
	return nil
}

// Dense implements block.Backend.
func (r *Runner) Dense(m *block.MLP) {
	t := &r.moe.main
	nb, I := r.nb, m.Inter
	r.Pool.MatMul2(t.g, &m.Gate.Mat, t.u, &m.Up.Mat, r.h, nb)
	kernels.SwiGLU(t.g[:nb*I], t.g[:nb*I], t.u[:nb*I])
	r.Pool.MatMul(r.y, &m.Down.Mat, t.g, nb)
}

// lookahead predicts the next layer's experts while this layer's reads are
// in flight: the next layer's router applied to the residual stream under
// the next layer's post-attention norm. The residual still lacks this
// layer's MoE output and the next layer's mixer output, so the prediction
// is approximate; it only decides what to read early, never what is
// computed. Issued after Begin so that this layer's misses queue first.
// A DeepPrefetcher also gets the layers after the next, each by its own
// router and norm over the same residual, in order of distance.
func (r *Runner) lookahead(L *block.MoE, nb int) {
	pf, ok := r.M.Experts.(Prefetcher)
	layers := r.M.Arch.Layers
	if !ok || !pf.Lookahead() || L.Layer+1 >= len(layers) {
		return
	}
	lw, _ := pf.(LookWeigher)
	if lw != nil && !lw.Predicting(nb) {
		return
	}
	next := layers[L.Layer+1].MoE()
	if next == nil {
		return
	}
	pf.Prefetch(L.Layer+1, r.predict(next, nb))
	dp, ok := pf.(DeepPrefetcher)
	if !ok {
		return
	}
	for d := 2; d <= dp.LookDepth() && L.Layer+d < len(layers); d++ {
		if m := layers[L.Layer+d].MoE(); m != nil {
			dp.PrefetchAhead(L.Layer+d, d, r.predict(m, nb))
		}
	}
}

// predict returns the experts m's router would choose for the residual
// stream as it is (under m's norm): each row's top k by logit, the union
// over the rows in that order, in moe.pred until the next call.
func (r *Runner) predict(m *block.MoE, nb int) []int {
	c := &r.M.Config
	s := &r.moe
	H, E, K := c.Hidden, c.Experts, c.TopK
	pre := m.Pre
	for i := 0; i < nb; i++ {
		kernels.RMSNorm(s.pnorm[i*H:(i+1)*H], r.x[i*H:(i+1)*H], pre.W, pre.Eps, pre.ZeroCentred)
	}
	r.Pool.MatMul(s.plogits, &m.Router.Mat, s.pnorm, nb)
	if b := m.RouterBias; b != nil {
		for i := 0; i < nb; i++ {
			kernels.Add(s.plogits[i*E:(i+1)*E], b)
		}
	}
	s.pred = s.pred[:0]
	for i := 0; i < nb; i++ {
		row := s.plogits[i*E : (i+1)*E]
		pk := s.pk[:0]
		// Top-k by logit (softmax keeps the order), then the union over rows.
		for k := 0; k < K; k++ {
			best := -1
			for e, v := range row {
				if (best < 0 || v > row[best]) && !slices.Contains(pk, e) {
					best = e
				}
			}
			pk = append(pk, best)
			if !s.pmark[best] {
				s.pmark[best] = true
				s.pred = append(s.pred, best)
			}
		}
	}
	for _, e := range s.pred {
		s.pmark[e] = false
	}
	return s.pred
}

// runExpert computes distinct expert di for the rows that chose it into its
// block of moe.outk. A nil expert was cut by a lossy deadline policy and
// contributes zero.
func (r *Runner) runExpert(L *block.MoE, ex *Expert, di int, t *moeThread, mm matmuler) {
	c := &r.M.Config
	s := &r.moe
	H, K, I := c.Hidden, c.TopK, c.MoEInter
	mem := s.grp.Members(s.grp.Distinct[di])
	n := len(mem)
	out := s.outk[s.grp.Base[di]*H : (s.grp.Base[di]+n)*H]
	if ex == nil {
		clear(out)
		return
	}
	for j, rk := range mem {
		copy(t.in[j*H:(j+1)*H], r.h[(rk/K)*H:(rk/K+1)*H])
	}
	mm.MatMul2(t.g, &ex.Gate, t.u, &ex.Up, t.in, n)
	if ex.GateBias != nil {
		for j := 0; j < n; j++ {
			kernels.Add(t.g[j*I:(j+1)*I], ex.GateBias)
			kernels.Add(t.u[j*I:(j+1)*I], ex.UpBias)
		}
	}
	switch L.Act {
	case block.ClampedSwiGLU:
		kernels.ClampedSwiGLU(t.g[:n*I], t.g[:n*I], t.u[:n*I])
	default:
		kernels.SwiGLU(t.g[:n*I], t.g[:n*I], t.u[:n*I])
	}
	mm.MatMul(out, &ex.Down, t.g, n)
	if ex.DownBias != nil {
		for j := 0; j < n; j++ {
			kernels.Add(out[j*H:(j+1)*H], ex.DownBias)
		}
	}
}

// sharedExpert computes the ungated shared expert of every row into
// moe.shared.
func (r *Runner) sharedExpert(L *block.MoE, nb int, t *moeThread, mm matmuler) {
	sh := L.Shared
	SI := sh.Inter
	s := &r.moe
	mm.MatMul2(t.g, &sh.Gate.Mat, t.u, &sh.Up.Mat, r.h, nb)
	kernels.SwiGLU(t.g[:nb*SI], t.g[:nb*SI], t.u[:nb*SI])
	mm.MatMul(s.shared, &sh.Down.Mat, t.g, nb)
}

// moeTask computes whole experts: each thread takes the next item of
// moe.order until none is left; item len(distinct) is the shared expert.
// Which thread computes an expert changes nothing in its result.
type moeTask struct {
	r         *Runner
	L         *block.MoE
	nb, items int
	next      atomic.Int32
}

func (t *moeTask) Run(lo, hi int) {
	r := t.r
	s := &r.moe
	th := &s.threads[lo] // one index per thread
	defer r.Pool.Crew().Done(lo, th.sc.Rooms())
	for {
		j := int(t.next.Add(1)) - 1
		if j >= t.items {
			return
		}
		di := s.order[j]
		if di == len(s.grp.Distinct) {
			r.sharedExpert(t.L, t.nb, th, &th.sc)
			continue
		}
		r.runExpert(t.L, s.exps[di], di, th, &th.sc)
	}
}

// RouteGroups is DeepSeek's routing (block.SigmoidGroups) of one row:
// sigmoid scores p (in place of the logits), the choice = p + correction
// restricted to the TopGroups groups whose two best choices sum highest
// (the lower group first on ties), the k best choices there, weighted by
// their scores, renormalised when NormTopK, times Scale. choice is
// scratch of len(p). The GPU's route_groups kernel computes the same bits.
func RouteGroups(m *block.MoE, p, choice []float32, ids []int, w []float32) {
	E, K := len(p), len(ids)
	for e := range p {
		p[e] = kernels.Sigmoid(p[e])
		choice[e] = p[e] + m.Correction[e]
	}
	if m.Groups > 1 && m.TopGroups < m.Groups {
		gs := E / m.Groups
		var gscore [64]float32
		var keep [64]bool
		for g := 0; g < m.Groups; g++ {
			a, b := float32(math.Inf(-1)), float32(math.Inf(-1))
			for _, v := range choice[g*gs : (g+1)*gs] {
				if v > a {
					a, b = v, a
				} else if v > b {
					b = v
				}
			}
			gscore[g] = a + b
		}
		for range m.TopGroups {
			best := -1
			for g := 0; g < m.Groups; g++ {
				if !keep[g] && (best < 0 || gscore[g] > gscore[best]) {
					best = g
				}
			}
			keep[best] = true
		}
		for g := 0; g < m.Groups; g++ {
			if !keep[g] {
				for e := g * gs; e < (g+1)*gs; e++ {
					choice[e] = float32(math.Inf(-1))
				}
			}
		}
	}
	Route(choice, K, false, ids, w)
	var sum float32
	for k, e := range ids {
		w[k] = p[e]
		sum += w[k]
	}
	if m.NormTopK {
		sum += 1e-20
		for k := range w {
			w[k] /= sum
		}
	}
	for k := range w {
		w[k] *= m.Scale
	}
}
