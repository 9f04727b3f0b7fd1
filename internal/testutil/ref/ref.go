// Package ref holds float64 references of the kernels' float32 functions
// for tests, in a package of its own so that the kernels' tests can use
// them too (testutil imports the packages above the kernels).
package ref

import "math"

// LogSoftmax is x's log-probabilities in float64, for the tests' NLL
// figures: finer than the engine's float32 sample.LogSoftmax, so that two
// backends' NLLs compare without its rounding.
func LogSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

// Softmax is x's probabilities in float64, the reference of
// kernels.Softmax.
func Softmax(x []float32) []float64 {
	p := LogSoftmax(x)
	for i, v := range p {
		p[i] = math.Exp(v)
	}
	return p
}
