package kernels

import "math"

// RMSNorm writes x/rms(x)*w into dst (dst may alias x). With zeroCentred the
// weight is stored as w-1 and applied as (1+w), as qwen3_5_moe does.
func RMSNorm(dst, x, w []float32, eps float32, zeroCentred bool) {
	n := len(x)
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(n)+eps)))
	w = w[:n]
	dst = dst[:n]
	if zeroCentred {
		for i, v := range x {
			dst[i] = v * inv * (1 + w[i])
		}
		return
	}
	for i, v := range x {
		dst[i] = v * inv * w[i]
	}
}

// L2Norm scales x in place to unit length: x/sqrt(Σx²+eps).
func L2Norm(x []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss+eps)))
	for i := range x {
		x[i] *= inv
	}
}

// Sigmoid is 1/(1+e^-x).
// It uses the float32 Exp: SiLU and the attention gate call it for every
// element of a step, where float64 math.Exp was a visible share of decode.
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

// SwiGLU writes silu(gate)*up into dst.
func SwiGLU(dst, gate, up []float32) {
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for i, g := range gate {
		dst[i] = SiLU(g) * up[i]
	}
}

// Softmax normalises x in place.
func Softmax(x []float32) {
	m := x[0]
	for _, v := range x {
		m = max(m, v)
	}
	var s float32
	for i, v := range x {
		e := Exp(v - m)
		x[i] = e
		s += e
	}
	inv := 1 / s
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
		a[i] = x1*cos[i] - x2*sin[i]
		b[i] = x2*cos[i] + x1*sin[i]
	}
}

// RopeTable fills cos and sin for one position: inv_freq[i] =
// theta^(-2i/dim) for i < dim/2, as transformers computes it in float32.
func RopeTable(cos, sin []float32, pos int, dim int, theta float64) {
	for i := 0; i < dim/2; i++ {
		inv := float32(1 / math.Pow(theta, float64(2*i)/float64(dim)))
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

// axpyGo is the pure-Go twin of Axpy's assembly.
func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// Add adds x to y.
func Add(y, x []float32) {
	x = x[:len(y)]
	for i := range y {
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
