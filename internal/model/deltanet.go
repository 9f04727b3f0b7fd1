package model

import (
	"math"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// dnScratch holds the buffers of the gated DeltaNet block.
type dnScratch struct {
	qkv  []float32 // [rows][conv_dim] projections, then conv+SiLU outputs in place
	z    []float32 // [rows][v_heads*v_dim]
	b, a []float32 // [rows][v_heads]
	o    []float32 // [rows][v_heads*v_dim]
	hist []float32 // [kernel-1][conv_dim] the conv's next history
	acc  []float32 // [threads][conv_dim] conv sums
	task dnTask
}

func (d *dnScratch) init(c *format.Config, rows, threads int) {
	if c.LinearKeyHeads == 0 {
		return
	}
	kd, vd := c.LinearKeyHeads*c.LinearKeyDim, c.LinearValueHeads*c.LinearValueDim
	d.qkv = make([]float32, rows*(2*kd+vd))
	d.z = make([]float32, rows*vd)
	d.b = make([]float32, rows*c.LinearValueHeads)
	d.a = make([]float32, rows*c.LinearValueHeads)
	d.o = make([]float32, rows*vd)
	d.hist = make([]float32, max(c.ConvKernel-1, 0)*(2*kd+vd))
	d.acc = make([]float32, threads*(2*kd+vd))
}

// The gated DeltaNet ops of block.Backend. They run the rows in order,
// updating the state's conv history and recurrent matrix; under
// State.Speculate they also save both after each row, for Commit to roll
// back to.

// DNProject implements block.Backend.
func (r *Runner) DNProject(L *block.DeltaNet) {
	d := &r.dn
	r.Pool.MatMul2(d.qkv, &L.QKV.Mat, d.z, &L.Z.Mat, r.h, r.nb)
	r.Pool.MatMul(d.b, &L.B.Mat, r.h, r.nb)
	r.Pool.MatMul(d.a, &L.A.Mat, r.h, r.nb)
}

// Conv implements block.Backend.
func (r *Runner) Conv(L *block.DeltaNet, cache int) {
	cd := 2*L.KeyHeads*L.KeyDim + L.ValueHeads*L.ValueDim
	r.rows(rowTask{op: opConv, dn: L, st: r.st, li: cache, nb: r.nb}, cd)
}

// DNPrep implements block.Backend.
func (r *Runner) DNPrep(L *block.DeltaNet) { r.rows(rowTask{op: opDNPrep, dn: L}, r.nb) }

// DeltaRule implements block.Backend.
func (r *Runner) DeltaRule(L *block.DeltaNet, cache int) {
	d := &r.dn
	d.task = dnTask{r: r, L: L, rec: r.st.rec[cache], nb: r.nb, st: r.st, li: cache}
	r.Pool.Parallel(L.ValueHeads, 1, &d.task)
	d.task = dnTask{}
}

// DNGate implements block.Backend.
func (r *Runner) DNGate(L *block.DeltaNet) { r.rows(rowTask{op: opDNGate, dn: L}, r.nb) }

// DNOut implements block.Backend.
func (r *Runner) DNOut(L *block.DeltaNet) { r.Pool.MatMul(r.y, &L.Out.Mat, r.dn.o, r.nb) }

// dnConv runs the causal depthwise conv over [history..., x] and SiLU for
// channels lo..hi of every row of the step, leaving the outputs in place of
// the inputs and the last kernel-1 inputs as the new history; under
// State.Speculate it first saves those channels' history after each row.
// Rows go last to first: row i reads inputs i-K+1..i, none of which a later
// row has overwritten yet. Each output sums its taps in time order, as the
// per-channel scalar loop did.
func (r *Runner) dnConv(L *block.DeltaNet, st *State, li, nb, lo, hi int) {
	d := &r.dn
	K := L.Kernel
	cd := 2*L.KeyHeads*L.KeyDim + L.ValueHeads*L.ValueDim
	conv := st.conv[li] // [K-1][cd], oldest first
	// in returns the channels lo..hi of input t of the timeline
	// [history..., rows...] (t < 0: history).
	in := func(t int) []float32 {
		if t < 0 {
			return conv[(K-1+t)*cd+lo : (K-1+t)*cd+hi]
		}
		return d.qkv[t*cd+lo : t*cd+hi]
	}
	for i := 0; i < nb; i++ {
		if sc, _ := st.snapRow(li, i); sc != nil {
			for j := 0; j < K-1; j++ {
				copy(sc[j*cd+lo:j*cd+hi], in(i-(K-2)+j))
			}
		}
	}
	hist := d.hist // the new history, set aside before the rows are overwritten
	for j := 0; j < K-1; j++ {
		copy(hist[j*cd+lo:j*cd+hi], in(nb-(K-1)+j))
	}
	acc := d.acc[r.Pool.Part(cd, convGrain(nb), lo)*cd:]
	acc = acc[lo:hi]
	for i := nb - 1; i >= 0; i-- {
		kernels.MulSet(acc, L.ConvT[lo:hi], in(i-(K-1)))
		for j := 1; j < K; j++ {
			kernels.MulAdd(acc, L.ConvT[j*cd+lo:j*cd+hi], in(i-(K-1)+j))
		}
		kernels.SiLUInPlace(acc)
		copy(d.qkv[i*cd+lo:i*cd+hi], acc)
	}
	for j := 0; j < K-1; j++ {
		copy(conv[j*cd+lo:j*cd+hi], hist[j*cd+lo:j*cd+hi])
	}
}

// convGrain is the fewest channels per part of the conv of nb rows: a
// channel costs one row's worth per row of the step.
func convGrain(nb int) int { return max(rowGrain, 2048/max(nb, 1)) }

// dnPrep normalises q and k per head (q also scaled by 1/sqrt(dk)) and turns
// the b and a projections into beta and the decay, for rows lo..hi.
func (r *Runner) dnPrep(L *block.DeltaNet, lo, hi int) {
	d := &r.dn
	nk, nv, dk := L.KeyHeads, L.ValueHeads, L.KeyDim
	kd := nk * dk
	cd := 2*kd + nv*L.ValueDim
	qscale := float32(1 / math.Sqrt(float64(dk)))
	for i := lo; i < hi; i++ {
		x := d.qkv[i*cd : (i+1)*cd]
		for h := 0; h < nk; h++ {
			q := x[h*dk : (h+1)*dk]
			kernels.L2Norm(q, 1e-6)
			for j := range q {
				q[j] *= qscale
			}
			kernels.L2Norm(x[kd+h*dk:kd+(h+1)*dk], 1e-6)
		}
		for h := 0; h < nv; h++ {
			ai := i*nv + h
			d.b[ai] = kernels.Sigmoid(d.b[ai])                                                                                   // beta
			d.a[ai] = float32(math.Exp(float64(-float32(math.Exp(float64(L.ALog[h]))) * kernels.Softplus(d.a[ai]+L.DtBias[h])))) // decay = exp(g)
		}
	}
}

// dnTask runs the delta rule for a range of value heads over every row:
// S = decay·S; S += k⊗(beta·(v − Sᵀk)); o = Sᵀq. Heads are independent, rows
// are sequential within a head.
type dnTask struct {
	r   *Runner
	L   *block.DeltaNet
	rec []float32
	nb  int
	st  *State // for per-row snapshots under Speculate
	li  int
}

func (t *dnTask) Run(lo, hi int) {
	d := &t.r.dn
	nk, nv, dk, dv := t.L.KeyHeads, t.L.ValueHeads, t.L.KeyDim, t.L.ValueDim
	kd, vd := nk*dk, nv*dv
	cd := 2*kd + vd
	var mem [256]float32
	for h := lo; h < hi; h++ {
		S := t.rec[h*dk*dv : (h+1)*dk*dv]
		kh := h / (nv / nk)
		for i := 0; i < t.nb; i++ {
			x := d.qkv[i*cd : (i+1)*cd]
			q := x[kh*dk : (kh+1)*dk]
			k := x[kd+kh*dk : kd+(kh+1)*dk]
			v := x[2*kd+h*dv : 2*kd+(h+1)*dv]
			decay, beta := d.a[i*nv+h], d.b[i*nv+h]
			kv := mem[:dv]
			if dv > len(mem) {
				kv = make([]float32, dv) // heads wider than 256 are not in any known model
			}
			var next []float32 // the next head's state, on its way while this one computes
			if i == 0 && h+1 < hi {
				next = t.rec[(h+1)*dk*dv : (h+2)*dk*dv]
			}
			kernels.DeltaRuleAhead(S, next, k, q, v, kv, d.o[i*vd+h*dv:i*vd+(h+1)*dv], decay, beta)
			if _, sr := t.st.snapRow(t.li, i); sr != nil {
				copy(sr[h*dk*dv:(h+1)*dk*dv], S)
			}
		}
	}
}
