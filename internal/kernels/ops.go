package kernels

import "math"

// The element-wise kernels below have AVX2 assembly (ops_amd64.s) and a
// pure-Go twin each; on amd64 the two give the same bits for every input,
// so results do not change with SLUICE_NOSIMD or the CPU's AVX2 support. To
// make that possible the twins spell out the assembly's arithmetic: every
// product is rounded before it is added (the float32 conversions say so,
// and keep compilers for FMA architectures from fusing them), and sums use
// the assembly's lane structure instead of one running total.

// RMSNorm writes x/rms(x)*w into dst (dst may be x itself, but must not
// otherwise overlap it). With zeroCentred the weight is stored as w-1 and
// applied as (1+w), as qwen3_5_moe does. Σx² is summed in 32 lanes (see
// sumSquares).
func RMSNorm(dst, x, w []float32, eps float32, zeroCentred bool) {
	n := len(x)
	if useAVX2 && n > 0 {
		_, _ = dst[n-1], w[n-1]
		rmsNormAVX2(&dst[0], &x[0], &w[0], n, eps, zeroCentred)
		return
	}
	rmsNormGo(dst, x, w, eps, zeroCentred)
}

// rmsNormGo is the pure-Go twin of RMSNorm's assembly.
func rmsNormGo(dst, x, w []float32, eps float32, zeroCentred bool) {
	n := len(x)
	inv := float32(1 / math.Sqrt(float64(sumSquares(x)/float32(n)+eps)))
	w = w[:n]
	dst = dst[:n]
	if zeroCentred {
		for i, v := range x {
			dst[i] = float32(v*inv) * (1 + w[i])
		}
		return
	}
	for i, v := range x {
		dst[i] = float32(v*inv) * w[i]
	}
}

// L2Norm scales x in place to unit length: x/sqrt(Σx²+eps), Σx² summed as
// in RMSNorm.
func L2Norm(x []float32, eps float32) {
	if useAVX2 && len(x) > 0 {
		l2NormAVX2(&x[0], len(x), eps)
		return
	}
	l2NormGo(x, eps)
}

// l2NormGo is the pure-Go twin of L2Norm's assembly.
func l2NormGo(x []float32, eps float32) {
	inv := float32(1 / math.Sqrt(float64(sumSquares(x)+eps)))
	for i := range x {
		x[i] *= inv
	}
}

// sumSquares is Σx² in the assembly's lane structure: whole 32-float blocks
// accumulate element i into lane i%32 (four 8-wide registers, which keeps
// four add chains in flight), the remaining <32 floats into lanes 0..7;
// then the four registers are added pairwise and the 8 lanes reduced by
// hsum8. It is more accurate than one running sum, and fixed, so a row's
// norm does not depend on where it sits in a batch.
func sumSquares(x []float32) float32 {
	var a [32]float32
	n32 := len(x) &^ 31
	for i, v := range x[:n32] {
		a[i&31] += float32(v * v)
	}
	for i, v := range x[n32:] {
		a[i&7] += float32(v * v)
	}
	var s [8]float32
	for l := range s {
		s[l] = (a[l] + a[8+l]) + (a[16+l] + a[24+l])
	}
	return hsum8(&s)
}

// hsum8 adds 8 lanes in the order of the assembly's horizontal sum
// (VEXTRACTF128, VADDPS, VHADDPS, VHADDPS).
func hsum8(s *[8]float32) float32 {
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

// Sigmoid is 1/(1+e^-x).
// It uses the float32 Exp: SiLU and the attention gate call it for every
// element of a step, where float64 math.Exp was a visible share of decode.
// The vector kernels (SiLUInPlace, SwiGLU, MulSigmoid) compute exactly this
// per lane, so scalar and vector calls agree bit for bit.
func Sigmoid(x float32) float32 { return 1 / (1 + Exp(-x)) }

// SiLU is x·sigmoid(x).
func SiLU(x float32) float32 { return x * Sigmoid(x) }

// Softplus is log(1+e^x), linear above 20 as torch computes it.
func Softplus(x float32) float32 {
	if x > 20 {
		return x
	}
	return float32(math.Log1p(math.Exp(float64(x))))
}

// SiLUInPlace sets x[i] = SiLU(x[i]), as the DeltaNet's causal conv
// activation does for each of its channels.
func SiLUInPlace(x []float32) {
	if useAVX2 && len(x) > 0 {
		siluAVX2(&x[0], len(x))
		return
	}
	siluGo(x)
}

// siluGo is the pure-Go twin of SiLUInPlace's assembly.
func siluGo(x []float32) {
	for i, v := range x {
		x[i] = SiLU(v)
	}
}

// SwiGLU writes silu(gate)*up into dst; dst may be gate or up (the gated
// RMSNorm's o·silu(z) is SwiGLU(o, z, o)).
func SwiGLU(dst, gate, up []float32) {
	n := len(gate)
	if useAVX2 && n > 0 {
		_, _ = dst[n-1], up[n-1]
		swigluAVX2(&dst[0], &gate[0], &up[0], n)
		return
	}
	swigluGo(dst, gate, up)
}

// swigluGo is the pure-Go twin of SwiGLU's assembly.
func swigluGo(dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for i, g := range gate {
		dst[i] = SiLU(g) * up[i]
	}
}

// MulSigmoid sets o[i] *= Sigmoid(g[i]): the output gate of gated attention.
func MulSigmoid(o, g []float32) {
	n := len(o)
	if useAVX2 && n > 0 {
		_ = g[n-1]
		mulSigmoidAVX2(&o[0], &g[0], n)
		return
	}
	mulSigmoidGo(o, g)
}

// mulSigmoidGo is the pure-Go twin of MulSigmoid's assembly.
func mulSigmoidGo(o, g []float32) {
	g = g[:len(o)]
	for i := range o {
		o[i] *= Sigmoid(g[i])
	}
}

// Softmax normalises x in place (an empty x is left alone). The sum of the
// exponentials is taken in 8 lanes, element i into lane i%8, then hsum8.
func Softmax(x []float32) {
	if useAVX2 && len(x) > 0 {
		softmaxAVX2(&x[0], len(x))
		return
	}
	softmaxGo(x)
}

// softmaxGo is the pure-Go twin of Softmax's assembly.
func softmaxGo(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x {
		m = max(m, v)
	}
	var a [8]float32
	for i, v := range x {
		e := Exp(v - m)
		x[i] = e
		a[i&7] += e
	}
	inv := 1 / hsum8(&a)
	for i := range x {
		x[i] *= inv
	}
}

// Rope applies rotary embedding (rotate-half convention) to the first
// len(cos)*2 dimensions of one head vector; the rest pass through.
func Rope(x, cos, sin []float32) {
	h := len(cos)
	a, b := x[:h], x[h:2*h]
	sin = sin[:h]
	for i := range a {
		x1, x2 := a[i], b[i]
		// Rounded products: no fusion on any CPU (see canon.go).
		a[i] = float32(x1*cos[i]) - float32(x2*sin[i])
		b[i] = float32(x2*cos[i]) + float32(x1*sin[i])
	}
}

// RopeFreqs returns inv_freq[i] = theta^(-2i/dim) for i < dim/2, as
// transformers computes it in float32; a runner computes them once.
func RopeFreqs(dim int, theta float64) []float32 {
	inv := make([]float32, dim/2)
	for i := range inv {
		inv[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(dim)))
	}
	return inv
}

// RopeTable fills cos and sin for one position from RopeFreqs.
func RopeTable(cos, sin []float32, pos int, invFreq []float32) {
	cos, sin = cos[:len(invFreq)], sin[:len(invFreq)]
	for i, inv := range invFreq {
		f := float32(pos) * inv
		cos[i] = float32(math.Cos(float64(f)))
		sin[i] = float32(math.Sin(float64(f)))
	}
}

// Axpy adds a*x to y.
func Axpy(y []float32, a float32, x []float32) {
	if useAVX2 && len(y)%16 == 0 && len(y) > 0 {
		x = x[:len(y)]
		axpyAVX2(&y[0], a, &x[0], len(y))
		return
	}
	axpyGo(y, a, x)
}

// axpyGo is the pure-Go twin of Axpy's assembly: y[i] = a·x[i] + y[i]
// fused (canon.go).
func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] = fma32(a, x[i], y[i])
	}
}

// Add adds x to y (the residual add of every layer).
func Add(y, x []float32) {
	x = x[:len(y)]
	i := 0
	if useAVX2 && len(y) >= 8 {
		i = len(y) &^ 7
		addAVX2(&y[0], &x[0], i)
	}
	for ; i < len(y); i++ {
		y[i] += x[i]
	}
}

// Dot is Σ a[i]·b[i].
func Dot(a, b []float32) float32 {
	if useAVX2 && len(a)%16 == 0 && len(a) > 0 {
		b = b[:len(a)]
		return dotF32AVX2(&a[0], &b[0], len(a))
	}
	return dotF32(a, b)
}
