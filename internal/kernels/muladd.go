package kernels

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
		s[i] += w[i] * x[i]
	}
}
