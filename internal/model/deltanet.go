package model

import (
	"math"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// dnScratch holds the buffers of the gated DeltaNet block.
type dnScratch struct {
	qkv  []float32 // [rows][conv_dim] projections, then conv+SiLU outputs in place
	z    []float32 // [rows][v_heads*v_dim]
	b, a []float32 // [rows][v_heads]
	o    []float32 // [rows][v_heads*v_dim]
	task dnTask
}

func (d *dnScratch) init(c *format.Config, rows int) {
	if c.Family != format.FamilyQwen35MoE {
		return
	}
	kd, vd := c.LinearKeyHeads*c.LinearKeyDim, c.LinearValueHeads*c.LinearValueDim
	d.qkv = make([]float32, rows*(2*kd+vd))
	d.z = make([]float32, rows*vd)
	d.b = make([]float32, rows*c.LinearValueHeads)
	d.a = make([]float32, rows*c.LinearValueHeads)
	d.o = make([]float32, rows*vd)
}

// deltanet runs the gated DeltaNet block of trunk layer li over nb rows in
// order, updating st's conv history and recurrent state, and leaves the
// projected output in r.y. Under State.Speculate it also saves both after
// each row, for Commit to roll back to.
func (r *Runner) deltanet(L *Layer, st *State, li, nb int) {
	conv, rec := st.conv[li], st.rec[li]
	c := &r.M.Config
	d := &r.dn
	nk, nv, dk, dv, K := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim, c.ConvKernel
	kd, vd := nk*dk, nv*dv
	cd := 2*kd + vd
	r.Pool.MatMul2(d.qkv, &L.QKV, d.z, &L.Z, r.h, nb)
	r.Pool.MatMul(d.b, &L.B, r.h, nb)
	r.Pool.MatMul(d.a, &L.A, r.h, nb)
	qscale := float32(1 / math.Sqrt(float64(dk)))
	for i := 0; i < nb; i++ {
		x := d.qkv[i*cd : (i+1)*cd]
		// Causal depthwise conv over [history..., x], then SiLU; the history
		// shifts by one row.
		for ch, xv := range x {
			w := L.Conv[ch*K : (ch+1)*K]
			var s float32
			for j := 0; j < K-1; j++ {
				s += w[j] * conv[j*cd+ch]
			}
			s += w[K-1] * xv
			for j := 0; j < K-2; j++ {
				conv[j*cd+ch] = conv[(j+1)*cd+ch]
			}
			conv[(K-2)*cd+ch] = xv
			x[ch] = kernels.SiLU(s)
		}
		if sc, _ := st.snapRow(li, i); sc != nil {
			copy(sc, conv)
		}
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
	d.task = dnTask{r: r, rec: rec, nb: nb, st: st, li: li}
	r.Pool.Parallel(nv, 1, &d.task)
	d.task = dnTask{}
	eps := float32(c.RMSEps)
	for i := 0; i < nb; i++ {
		for h := 0; h < nv; h++ {
			o := d.o[i*vd+h*dv : i*vd+(h+1)*dv]
			kernels.RMSNorm(o, o, L.GNorm, eps, false)
			z := d.z[i*vd+h*dv : i*vd+(h+1)*dv]
			for j := range o {
				o[j] *= kernels.SiLU(z[j])
			}
		}
	}
	r.Pool.MatMul(r.y, &L.Out, d.o, nb)
}

// dnTask runs the delta rule for a range of value heads over every row:
// S = decay·S; S += k⊗(beta·(v − Sᵀk)); o = Sᵀq. Heads are independent, rows
// are sequential within a head.
type dnTask struct {
	r   *Runner
	rec []float32
	nb  int
	st  *State // for per-row snapshots under Speculate
	li  int
}

func (t *dnTask) Run(lo, hi int) {
	c := &t.r.M.Config
	d := &t.r.dn
	nk, nv, dk, dv := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim
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
			kernels.DeltaRule(S, k, q, v, kv, d.o[i*vd+h*dv:i*vd+(h+1)*dv], decay, beta)
			if _, sr := t.st.snapRow(t.li, i); sr != nil {
				copy(sr[h*dk*dv:(h+1)*dk*dv], S)
			}
		}
	}
}
