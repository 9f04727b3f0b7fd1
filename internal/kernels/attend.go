package kernels

import "math"

// Attend computes one query head's causal attention over n cached
// positions: s_j = scale·(q·k_j), e_j = exp(s_j − max s), o = (Σ_j e_j·v_j)
// / Σ_j e_j. Keys and values are rows stride floats apart in kc and vc,
// starting at their first element; s is scratch of at least n floats.
// Positions are visited in order, so the result does not depend on
// batching or threads. Normalising o once, rather than every weight, saves
// a pass over the n scores.
func Attend(o, q, kc, vc []float32, stride, n int, scale float32, s []float32) {
	sum := AttendScores(q, kc, stride, n, scale, s)
	AttendMix(o[:len(q)], vc, stride, n, s, sum)
}

// AttendScores is Attend's first half: s[j] = exp(scale·(q·k_j) − max),
// returning Σ_j s[j]. Split from AttendMix so that the query heads sharing
// a key-value head can pass over the keys one after another, then over
// the values, each while it stays in cache.
func AttendScores(q, kc []float32, stride, n int, scale float32, s []float32) float32 {
	hd := len(q)
	s = s[:n]
	if useAVX2 && hd%32 == 0 && n > 0 {
		_ = kc[(n-1)*stride+hd-1]
		scoresAVX2(&q[0], &kc[0], 4*stride, n, hd, scale, &s[0])
	} else {
		for j := range s {
			s[j] = Dot(q, kc[j*stride:j*stride+hd]) * scale
		}
	}
	mx := Max(s)
	var sum float32
	// The exponentials' sum: the first n&^7 in 8 lanes (j into lane j%8)
	// reduced by hsum8, then the rest one by one, on every path.
	j0 := n &^ 7
	if useAVX2 && j0 > 0 {
		sum = expSubAVX2(&s[0], j0, mx)
	} else if j0 > 0 {
		sum = expSubGo(s[:j0], mx)
	}
	for j := j0; j < n; j++ {
		e := Exp(s[j] - mx)
		s[j] = e
		sum += e
	}
	return sum
}

// AttendMix is Attend's second half: o = (Σ_j s[j]·v_j) / sum, for the
// weights and sum of AttendScores.
func AttendMix(o, vc []float32, stride, n int, s []float32, sum float32) {
	hd := len(o)
	s = s[:n]
	if useAVX2 && hd%32 == 0 && n > 0 {
		_ = vc[(n-1)*stride+hd-1]
		mixAVX2(&o[0], &vc[0], 4*stride, n, hd, &s[0])
	} else {
		clear(o)
		for j, p := range s {
			Axpy(o, p, vc[j*stride:j*stride+hd])
		}
	}
	Scale(o, 1/sum)
}

// expSubGo is expSubAVX2's twin: s[j] = Exp(s[j]-mx), returning the sum
// of the values in 8 lanes (j into lane j%8) reduced by hsum8.
func expSubGo(s []float32, mx float32) float32 {
	var a [8]float32
	for j, v := range s {
		e := Exp(v - mx)
		s[j] = e
		a[j&7] += e
	}
	return hsum8(&a)
}

// Exp is e^x in float32 for the softmax: range reduction to 2^k·e^r with
// |r| ≤ ln2/2 and a degree-6 polynomial, within 2 ulp of the correctly
// rounded value over the softmax's domain (x ≤ 0), without the float64
// round trip of math.Exp.
func Exp(x float32) float32 {
	if x < -87.3 {
		return 0
	}
	if x > 88.7 {
		return float32(math.Inf(1))
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	// The float32 conversions round every product before the following
	// sum, as the assembly (expSubAVX2, the ops kernels) computes it; Go
	// would otherwise be free to fuse them (GOAMD64=v3 does).
	k := float32(math.Floor(float64(float32(x*log2e) + 0.5)))
	r := float32(x-float32(k*ln2hi)) - float32(k*ln2lo)
	// e^r ≈ 1 + r + r²/2 + … + r⁶/720 (Horner).
	p := float32(1.0 / 720)
	p = float32(p*r) + 1.0/120
	p = float32(p*r) + 1.0/24
	p = float32(p*r) + 1.0/6
	p = float32(p*r) + 0.5
	p = float32(p*r) + 1
	p = float32(p*r) + 1
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}
