package model

import (
	"slices"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// moeScratch holds the buffers of the MoE block.
type moeScratch struct {
	logits   []float32 // [rows][experts] router logits, then probabilities
	ids      []int     // [rows][top_k] chosen experts in router order
	w        []float32 // [rows][top_k] their weights
	slot     []int     // [experts] position in distinct, or -1
	distinct []int     // experts the batch needs, in first-use order
	members  [][]int   // per distinct expert: the (row*top_k+k) that use it
	in       []float32 // [rows][hidden] gathered rows of one expert
	g, u     []float32 // [rows][inter]
	dout     []float32 // [rows][hidden]
	outk     []float32 // [rows][top_k][hidden] each routed expert's output
	maxw     []float32 // [experts] per distinct expert: largest routing weight (Hint)
	nrows    []int     // [experts] per distinct expert: rows routed to it (Hint)
	plogits  []float32 // [rows][experts] lookahead: next layer's router logits
	pnorm    []float32 // [rows][hidden] lookahead: residual under the next layer's norm
	pred     []int     // lookahead: predicted experts of the next layer, first-use order
	pmark    []bool    // [experts] lookahead: already in pred
	pk       []int     // [top_k] lookahead: one row's picks
	sg, su   []float32 // [rows][shared_inter]
	sgate    []float32 // [rows]
	shared   []float32 // [rows][hidden]
}

func (s *moeScratch) init(c *format.Config, rows int) {
	H, E, K, I := c.Hidden, c.Experts, c.TopK, c.MoEInter
	s.logits = make([]float32, rows*E)
	s.ids = make([]int, rows*K)
	s.w = make([]float32, rows*K)
	s.slot = make([]int, E)
	for i := range s.slot {
		s.slot[i] = -1
	}
	s.distinct = make([]int, 0, E)
	s.members = make([][]int, E)
	for i := range s.members {
		s.members[i] = make([]int, 0, rows*K)
	}
	s.maxw = make([]float32, E)
	s.nrows = make([]int, E)
	s.plogits = make([]float32, rows*E)
	s.pnorm = make([]float32, rows*H)
	s.pred = make([]int, 0, E)
	s.pmark = make([]bool, E)
	s.pk = make([]int, 0, K)
	s.in = make([]float32, rows*H)
	s.g = make([]float32, rows*max(I, c.SharedInter))
	s.u = make([]float32, rows*max(I, c.SharedInter))
	s.dout = make([]float32, rows*H)
	s.outk = make([]float32, rows*K*H)
	if c.SharedInter > 0 {
		s.sg = make([]float32, rows*c.SharedInter)
		s.su = make([]float32, rows*c.SharedInter)
		s.sgate = make([]float32, rows)
		s.shared = make([]float32, rows*H)
	}
}

// Route writes the top-k experts and weights of each row given its router
// probabilities: the k largest in descending order (lowest id first on
// ties), renormalised when the config says so.
func Route(probs []float32, k int, norm bool, ids []int, w []float32) {
	for j := 0; j < k; j++ {
		best := -1
		for e, p := range probs {
			taken := false
			for _, t := range ids[:j] {
				if t == e {
					taken = true
					break
				}
			}
			if !taken && (best < 0 || p > probs[best]) {
				best = e
			}
		}
		ids[j], w[j] = best, probs[best]
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

// moeBlock routes nb rows of r.h, runs the shared and routed experts, and
// leaves Σ_k w_k·expert_k(h) (+ gated shared expert) in r.y. Routed outputs
// are summed in router order, so the result does not depend on the order in
// which the provider delivers experts.
func (r *Runner) moeBlock(L *Layer, nb int) error {
	c := &r.M.Config
	s := &r.moe
	H, E, K, I := c.Hidden, c.Experts, c.TopK, c.MoEInter
	r.Pool.MatMul(s.logits, &L.Router, r.h, nb)
	r.trace("router_logits", L.Index, nb, E, s.logits)
	s.distinct = s.distinct[:0]
	for i := 0; i < nb; i++ {
		p := s.logits[i*E : (i+1)*E]
		kernels.Softmax(p)
		Route(p, K, c.NormTopK, s.ids[i*K:(i+1)*K], s.w[i*K:(i+1)*K])
		if r.Routes != nil {
			ids, w := s.ids[i*K:(i+1)*K], s.w[i*K:(i+1)*K]
			r.Routes(L.Index, r.positions[i], ids)
			var sum float32
			for k, e := range ids {
				w[k] = p[e]
				sum += w[k]
			}
			for k := range w {
				w[k] /= sum
			}
		}
		for k, e := range s.ids[i*K : (i+1)*K] {
			if s.slot[e] < 0 {
				s.slot[e] = len(s.distinct)
				s.distinct = append(s.distinct, e)
				s.members[e] = s.members[e][:0]
			}
			s.members[e] = append(s.members[e], i*K+k)
		}
	}
	for di, e := range s.distinct {
		s.slot[e] = -1
		mem := s.members[e]
		s.nrows[di] = len(mem)
		var mw float32
		for _, rk := range mem {
			mw = max(mw, s.w[rk])
		}
		s.maxw[di] = mw
	}
	nd := len(s.distinct)
	if err := r.M.Experts.Begin(L.Index, s.distinct, Hint{MaxWeight: s.maxw[:nd], Rows: s.nrows[:nd]}); err != nil {
		return err
	}
	r.lookahead(L, nb)
	for range s.distinct {
		di, ex, err := r.M.Experts.Next()
		if err != nil {
			return err
		}
		mem := s.members[s.distinct[di]]
		if ex == nil {
			// Cut by a lossy deadline policy: the expert adds nothing.
			for _, rk := range mem {
				clear(s.outk[rk*H : (rk+1)*H])
			}
			continue
		}
		n := len(mem)
		for j, rk := range mem {
			copy(s.in[j*H:(j+1)*H], r.h[(rk/K)*H:(rk/K+1)*H])
		}
		r.Pool.MatMul(s.g, &ex.Gate, s.in, n)
		r.Pool.MatMul(s.u, &ex.Up, s.in, n)
		kernels.SwiGLU(s.g[:n*I], s.g[:n*I], s.u[:n*I])
		r.Pool.MatMul(s.dout, &ex.Down, s.g, n)
		for j, rk := range mem {
			copy(s.outk[rk*H:(rk+1)*H], s.dout[j*H:(j+1)*H])
		}
	}
	if L.HasShared {
		SI := c.SharedInter
		r.Pool.MatMul(s.sg, &L.SharedGate, r.h, nb)
		r.Pool.MatMul(s.su, &L.SharedUp, r.h, nb)
		kernels.SwiGLU(s.sg[:nb*SI], s.sg[:nb*SI], s.su[:nb*SI])
		r.Pool.MatMul(s.shared, &L.SharedDown, s.sg, nb)
		r.Pool.MatMul(s.sgate, &L.SharedExpertGate, r.h, nb)
	}
	for i := 0; i < nb; i++ {
		y := r.y[i*H : (i+1)*H]
		clear(y)
		for k := 0; k < K; k++ {
			kernels.Axpy(y, s.w[i*K+k], s.outk[(i*K+k)*H:(i*K+k+1)*H])
		}
		if L.HasShared {
			kernels.Axpy(y, kernels.Sigmoid(s.sgate[i]), s.shared[i*H:(i+1)*H])
		}
	}
	return nil
}

// lookahead predicts the next layer's experts while this layer's reads are
// in flight: the next layer's router applied to the residual stream under
// the next layer's post-attention norm. The residual still lacks this
// layer's MoE output and the next layer's mixer output, so the prediction
// is approximate; it only decides what to read early, never what is
// computed. Issued after Begin so that this layer's misses queue first.
func (r *Runner) lookahead(L *Layer, nb int) {
	pf, ok := r.M.Experts.(Prefetcher)
	if !ok || !pf.Lookahead() || L.Index+1 >= len(r.M.Layers) {
		return
	}
	c := &r.M.Config
	s := &r.moe
	H, E, K := c.Hidden, c.Experts, c.TopK
	next := &r.M.Layers[L.Index+1]
	eps := float32(c.RMSEps)
	for i := 0; i < nb; i++ {
		kernels.RMSNorm(s.pnorm[i*H:(i+1)*H], r.x[i*H:(i+1)*H], next.PostNorm, eps, c.ZeroCentredNorm())
	}
	r.Pool.MatMul(s.plogits, &next.Router, s.pnorm, nb)
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
	pf.Prefetch(L.Index+1, s.pred)
}
