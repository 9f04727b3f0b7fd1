package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// MulAdd matches the scalar s += w*x loop bit for bit at every length,
// including the tails the assembly leaves to Go.
func TestMulAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 100; n++ {
		s, w, x := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range s {
			s[i], w[i], x[i] = rng.Float32()*4-2, rng.Float32()*4-2, rng.Float32()*1e3-5e2
		}
		want := append([]float32(nil), s...)
		for i := range want {
			p := float32(w[i] * x[i]) // rounded: Go would fuse it on arm64
			want[i] += p
		}
		MulAdd(s, w, x)
		for i := range s {
			if math.Float32bits(s[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d [%d]: %g, want %g", n, i, s[i], want[i])
			}
		}
	}
}

// Max and Scale match their scalar loops at every length.
func TestMaxScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 1; n <= 100; n++ {
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*200 - 150
		}
		x[rng.IntN(n)] = 60 + float32(n) // the maximum anywhere, tails included
		want := x[0]
		for _, v := range x {
			want = max(want, v)
		}
		if got := Max(x); got != want {
			t.Fatalf("n=%d: Max %v, want %v", n, got, want)
		}
		y := append([]float32(nil), x...)
		Scale(y, 0.37)
		for i := range y {
			if y[i] != x[i]*0.37 {
				t.Fatalf("n=%d [%d]: Scale %v, want %v", n, i, y[i], x[i]*0.37)
			}
		}
	}
}

// MulSet equals clearing and MulAdd, -0 products included; Add equals the
// scalar loop.
func TestMulSetAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for n := 1; n <= 70; n++ {
		s, w, x := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range w {
			w[i], x[i] = rng.Float32()*4-2, rng.Float32()*8-4
			if i%5 == 0 {
				x[i] = float32(math.Copysign(0, -1)) // a -0 product
			}
		}
		want := make([]float32, n)
		MulAdd(want, w, x)
		MulSet(s, w, x)
		for i := range s {
			if math.Float32bits(s[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d [%d]: MulSet %v, clear+MulAdd %v", n, i, s[i], want[i])
			}
		}
		y := append([]float32(nil), w...)
		Add(y, x)
		for i := range y {
			if y[i] != w[i]+x[i] {
				t.Fatalf("n=%d [%d]: Add %v, want %v", n, i, y[i], w[i]+x[i])
			}
		}
	}
}

// mixAVX2 computes each output element as the FMA chain over the values in
// order, for head sizes that take the 64-wide chunks, the 32-wide ones, and
// both.
func TestMixChains(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, hd := range []int{32, 64, 96, 128, 256} {
		for _, n := range []int{1, 2, 7, 40} {
			stride := hd + 32
			v := make([]float32, n*stride)
			p := make([]float32, n)
			for i := range v {
				v[i] = rng.Float32()*2 - 1
			}
			for i := range p {
				p[i] = rng.Float32()
			}
			o := make([]float32, hd)
			mixAVX2(&o[0], &v[0], 4*stride, n, hd, &p[0])
			for d := range o {
				var want float32
				for j := 0; j < n; j++ {
					want = float32(math.FMA(float64(p[j]), float64(v[j*stride+d]), float64(want)))
				}
				if math.Float32bits(o[d]) != math.Float32bits(want) {
					t.Fatalf("hd %d n %d dim %d: %v, FMA chain %v", hd, n, d, o[d], want)
				}
			}
		}
	}
}

// BenchmarkAttend is one query head over 512 cached positions (head size
// 64), the inner step of attention at depth 512.
func BenchmarkAttend(b *testing.B) {
	rng := rand.New(rand.NewPCG(13, 14))
	const hd, n, stride = 64, 512, 128
	kc, vc := make([]float32, n*stride), make([]float32, n*stride)
	for i := range kc {
		kc[i], vc[i] = rng.Float32()*2-1, rng.Float32()*2-1
	}
	q, o, s := make([]float32, hd), make([]float32, hd), make([]float32, n)
	for i := range q {
		q[i] = rng.Float32()*2 - 1
	}
	for b.Loop() {
		Attend(o, q, kc, vc, stride, n, 0.125, s)
	}
}

// The 32-column delta-rule kernel matches the general one bit for bit: the
// new state, the output and the kv scratch.
func TestDeltaRule32(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	rng := rand.New(rand.NewPCG(15, 16))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	for _, dv := range []int{32, 64, 128} {
		for _, dk := range []int{1, 16, 64} {
			S, k, q, v := vec(dk*dv), vec(dk), vec(dk), vec(dv)
			S2 := append([]float32(nil), S...)
			next := vec(dk * dv)
			kv, o, kv2, o2 := make([]float32, dv), make([]float32, dv), make([]float32, dv), make([]float32, dv)
			for step := 0; step < 3; step++ {
				deltaRuleAVX2(&S[0], &k[0], &q[0], &v[0], &kv[0], &o[0], 0.93, 0.6, dk, dv)
				// With the next state's prefetch on every other step.
				pf, pfstep := &S2[0], 0
				if step%2 == 0 {
					pf, pfstep = &next[0], 64
				}
				deltaRule32AVX2(&S2[0], &k[0], &q[0], &v[0], &kv2[0], &o2[0], 0.93, 0.6, dk, dv, pf, pfstep)
				for _, c := range []struct {
					name string
					a, b []float32
				}{{"S", S, S2}, {"o", o, o2}, {"kv", kv, kv2}} {
					for i := range c.a {
						if math.Float32bits(c.a[i]) != math.Float32bits(c.b[i]) {
							t.Fatalf("dv %d dk %d step %d: %s[%d] %v, general kernel %v", dv, dk, step, c.name, i, c.b[i], c.a[i])
						}
					}
				}
			}
		}
	}
}

// BenchmarkDeltaRule is one step of one 64x64 head, the general kernel
// against the 32-column one.
func BenchmarkDeltaRule(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2/FMA")
	}
	const dk, dv = 64, 64
	S, k, q, v := make([]float32, dk*dv), make([]float32, dk), make([]float32, dk), make([]float32, dv)
	kv, o := make([]float32, dv), make([]float32, dv)
	for i := range k {
		k[i], q[i], v[i] = 0.1, 0.2, 0.3
	}
	b.Run("general", func(b *testing.B) {
		for b.Loop() {
			deltaRuleAVX2(&S[0], &k[0], &q[0], &v[0], &kv[0], &o[0], 0.9, 0.5, dk, dv)
		}
	})
	b.Run("cols32", func(b *testing.B) {
		for b.Loop() {
			deltaRule32AVX2(&S[0], &k[0], &q[0], &v[0], &kv[0], &o[0], 0.9, 0.5, dk, dv, &S[0], 0)
		}
	})
}

// BenchmarkDeltaRuleDRAM steps Qwen3.5-35B-A3B's decode states (30 layers
// of 32 heads of 128×128 floats, 60 MiB, beyond the last-level cache)
// head after head, as a decode's delta rule does, with DeltaRuleAhead
// bringing in the next head's state ("ahead") and without ("alone"), the
// two alternating pass by pass: "ahead/alone" is the median of the
// rounds' ratios of speed. Use -benchtime Nx for N rounds.
func BenchmarkDeltaRuleDRAM(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2/FMA")
	}
	const dk, dv, heads = 128, 128, 30 * 32
	rng := rand.New(rand.NewPCG(19, 20))
	S := randVec(rng, heads*dk*dv)
	k, q, v := randVec(rng, dk), randVec(rng, dk), randVec(rng, dv)
	kv, o := make([]float32, dv), make([]float32, dv)
	pass := func(ahead bool) time.Duration {
		t0 := time.Now()
		for h := range heads {
			var next []float32
			if ahead && h+1 < heads {
				next = S[(h+1)*dk*dv : (h+2)*dk*dv]
			}
			// A decay below 1 and a small beta keep the state bounded.
			DeltaRuleAhead(S[h*dk*dv:(h+1)*dk*dv], next, k, q, v, kv, o, 0.5, 0.01)
		}
		return time.Since(t0)
	}
	ratios, ta := alternating(b, func() time.Duration { return pass(true) }, func() time.Duration { return pass(false) })
	rates := make([]float64, len(ta))
	for i, t := range ta {
		rates[i] = float64(2*4*len(S)) / t.Seconds() / 1e9
	}
	b.ReportMetric(median(ratios), "ahead/alone")
	b.ReportMetric(median(rates), "ahead-GB/s(r+w)")
}

// BenchmarkAttendMix is AttendMix at a head of 128 over 512 positions
// (the values in cache), the half of prefill's attention that sums.
func BenchmarkAttendMix(b *testing.B) {
	rng := rand.New(rand.NewPCG(17, 18))
	const hd, n, stride = 128, 512, 1024
	vc := randVec(rng, n*stride)
	o, s := make([]float32, hd), randVec(rng, n)
	b.SetBytes(int64(4 * n * hd))
	for b.Loop() {
		AttendMix(o, vc, stride, n, s, 1)
	}
}

// BenchmarkAttendScores is AttendScores at a head of 128 over 512
// positions (the keys in cache), the half of prefill's attention that
// scores.
func BenchmarkAttendScores(b *testing.B) {
	rng := rand.New(rand.NewPCG(19, 20))
	const hd, n, stride = 128, 512, 1024
	kc, q := randVec(rng, n*stride), randVec(rng, hd)
	s := make([]float32, n)
	b.SetBytes(int64(4 * n * hd))
	for b.Loop() {
		AttendScores(q, kc, stride, n, 0.088, s)
	}
}
