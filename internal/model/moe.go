package model

import (
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
		for k, e := range s.ids[i*K : (i+1)*K] {
			if s.slot[e] < 0 {
				s.slot[e] = len(s.distinct)
				s.distinct = append(s.distinct, e)
				s.members[e] = s.members[e][:0]
			}
			s.members[e] = append(s.members[e], i*K+k)
		}
	}
	for _, e := range s.distinct {
		s.slot[e] = -1
	}
	if err := r.M.Experts.Begin(L.Index, s.distinct); err != nil {
		return err
	}
	for range s.distinct {
		di, ex, err := r.M.Experts.Next()
		if err != nil {
			return err
		}
		mem := s.members[s.distinct[di]]
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
