package kernels

import "math"

// AttendLatent computes one head's attention over a latent cache (MLA,
// absorbed): s_j = scale·(q·k_j) over full rows of kc, and o = Σ_j p_j ·
// k_j[:len(o)] (the values are the keys' prefix). It visits the rows at
// positions sel in order, or rows 0..n-1 when sel is nil; s is scratch of
// at least n floats. Every sum runs in position order, so the result does
// not depend on batching.
func AttendLatent(o, q, kc []float32, stride int, sel []int, n int, scale float32, s []float32) {
	w := len(q)
	if sel != nil {
		n = len(sel)
	}
	s = s[:n]
	row := func(j int) int {
		if sel != nil {
			return sel[j] * stride
		}
		return j * stride
	}
	// Every position in order: the scores four keys at a time and the
	// values each output's chain in registers (scoresAVX2, mixAVX2: the
	// bits of Dot·scale and of the Axpy chain from +0); selected
	// positions one by one.
	contiguous := sel == nil && useAVX2 && n > 0
	if contiguous && w%32 == 0 {
		_ = kc[(n-1)*stride+w-1]
		scoresAVX2(&q[0], &kc[0], 4*stride, n, w, scale, &s[0])
	} else {
		for j := range s {
			at := row(j)
			s[j] = Dot(q, kc[at:at+w]) * scale
		}
	}
	mx := Max(s)
	var sum float32
	for j := range s {
		e := Exp(s[j] - mx)
		s[j] = e
		sum += e
	}
	if contiguous && len(o)%32 == 0 {
		_ = kc[(n-1)*stride+len(o)-1]
		mixAVX2(&o[0], &kc[0], 4*stride, n, len(o), &s[0])
	} else {
		clear(o)
		for j, p := range s {
			at := row(j)
			Axpy(o, p, kc[at:at+len(o)])
		}
	}
	Scale(o, 1/sum)
}

// LayerNorm writes (x − mean)/sqrt(var + eps)·w + b into dst (dst may
// alias x), with the mean and the biased variance summed in order in
// float32, as torch's LayerNorm computes them.
func LayerNorm(dst, x, w, b []float32, eps float32) {
	n := float32(len(x))
	var mean float32
	for _, v := range x {
		mean += v
	}
	mean /= n
	var vr float32
	for _, v := range x {
		d := v - mean
		vr += float32(d * d) // products rounded: Go would fuse them on arm64
	}
	vr /= n
	inv := float32(1 / math.Sqrt(float64(vr+eps)))
	for i, v := range x {
		dst[i] = float32((v-mean)*inv*w[i]) + b[i]
	}
}
