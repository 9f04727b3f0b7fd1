// Small vector kernels of the forward pass (conv taps, max, scale, add),
// each an AVX2 loop with its Go tail or twin; vec_amd64.s also holds the
// 4-row f32 dot and the 32-column delta-rule step.
package kernels

// MulSet sets s[i] = 0 + w[i]·x[i]: the first term of a MulAdd sum, with
// the same bits as clearing s and adding (a -0 product becomes +0).
func MulSet(s, w, x []float32) {
	n := len(s)
	w, x = w[:n], x[:n]
	i := 0
	if useAVX2 && n >= 8 {
		i = n &^ 7
		mulSetAVX2(&s[0], &w[0], &x[0], i)
	}
	for ; i < n; i++ {
		var z float32
		s[i] = z + float32(w[i]*x[i])
	}
}

// MulAdd adds w[i]·x[i] to s[i], rounding the product before the sum (no
// fused multiply-add), so a sum built term by term equals the scalar
// `s += w*x` loop bit for bit. The DeltaNet causal conv uses it with the
// kernel weights laid out by tap.
func MulAdd(s, w, x []float32) {
	n := len(s)
	w, x = w[:n], x[:n]
	i := 0
	if useAVX2 && n >= 8 {
		i = n &^ 7
		mulAddAVX2(&s[0], &w[0], &x[0], i)
	}
	for ; i < n; i++ {
		s[i] += float32(w[i] * x[i]) // never fused, on any CPU
	}
}

// Max is the largest element of a non-empty x.
func Max(x []float32) float32 {
	m := x[0]
	i := 0
	if useAVX2 && len(x) >= 8 {
		i = len(x) &^ 7
		m = maxAVX2(&x[0], i)
	}
	for _, v := range x[i:] {
		m = max(m, v)
	}
	return m
}

// Scale multiplies x by a in place.
func Scale(x []float32, a float32) {
	i := 0
	if useAVX2 && len(x) >= 8 {
		i = len(x) &^ 7
		scaleAVX2(&x[0], a, i)
	}
	for j := range x[i:] {
		x[i+j] *= a
	}
}
