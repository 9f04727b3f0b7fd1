package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttendRing checks windowed attention with a sink against a float64
// softmax over [scores, sink], and requires the same bits whether the
// window's positions sit contiguously or wrap around the ring's end.
func TestAttendRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const hd, stride, n = 64, 128, 21
	q := make([]float32, hd)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	keys := make([][]float32, n)
	vals := make([][]float32, n)
	for j := range keys {
		keys[j], vals[j] = make([]float32, hd), make([]float32, hd)
		for i := 0; i < hd; i++ {
			keys[j][i], vals[j][i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
	}
	scale := float32(0.125)
	for _, sink := range [][]float32{nil, {0.7}, {6}} {
		// The float64 reference.
		s := make([]float64, n)
		mx := math.Inf(-1)
		for j := range s {
			for i := 0; i < hd; i++ {
				s[j] += float64(q[i]) * float64(keys[j][i])
			}
			s[j] *= float64(scale)
			mx = math.Max(mx, s[j])
		}
		if sink != nil {
			mx = math.Max(mx, float64(sink[0]))
		}
		var sum float64
		for j := range s {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		if sink != nil {
			sum += math.Exp(float64(sink[0]) - mx)
		}
		want := make([]float64, hd)
		for j := range s {
			for i := range want {
				want[i] += s[j] / sum * float64(vals[j][i])
			}
		}
		var first []float32
		for _, lay := range []struct{ rows, start int }{{n, 0}, {32, 5}, {32, 20}, {25, 24}} {
			kc := make([]float32, lay.rows*stride)
			vc := make([]float32, lay.rows*stride)
			for j := 0; j < n; j++ {
				at := (lay.start + j) % lay.rows * stride
				copy(kc[at+3:], keys[j])
				copy(vc[at+3:], vals[j])
			}
			o := make([]float32, hd)
			AttendRing(o, q, kc[3:], vc[3:], stride, lay.rows, lay.start, n, scale, sink, make([]float32, n))
			for i := range o {
				if math.Abs(float64(o[i])-want[i]) > 1e-5 {
					t.Fatalf("sink %v ring %d start %d: o[%d] = %v, want %v", sink, lay.rows, lay.start, i, o[i], want[i])
				}
			}
			if first == nil {
				first = o
				continue
			}
			for i := range o {
				if math.Float32bits(o[i]) != math.Float32bits(first[i]) {
					t.Fatalf("sink %v ring %d start %d: o[%d] = %v, contiguous %v", sink, lay.rows, lay.start, i, o[i], first[i])
				}
			}
		}
	}
}

// TestClampedSwiGLU checks gpt-oss's activation against its float64
// formula, including values beyond the clamp.
func TestClampedSwiGLU(t *testing.T) {
	gate := []float32{-9, -1, 0, 0.5, 3, 6.9, 7, 12}
	up := []float32{-12, -7.5, 0, 2, -3, 7, 8, 0.25}
	dst := make([]float32, len(gate))
	ClampedSwiGLU(dst, gate, up)
	for i := range dst {
		g := math.Min(float64(gate[i]), 7)
		u := math.Max(math.Min(float64(up[i]), 7), -7)
		want := (u + 1) * g / (1 + math.Exp(-1.702*g))
		if math.Abs(float64(dst[i])-want) > 1e-5*math.Max(1, math.Abs(want)) {
			t.Errorf("gate %v up %v: %v, want %v", gate[i], up[i], dst[i], want)
		}
	}
}
