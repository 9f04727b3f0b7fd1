package kernels

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
)

// fmaRef is a·b+c rounded once to float32, computed exactly with big.Float:
// an independent definition of fma32.
func fmaRef(a, b, c float32) float32 {
	if math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || math.IsInf(float64(c), 0) ||
		a != a || b != b || c != c {
		return float32(float64(a)*float64(b) + float64(c))
	}
	x := new(big.Float).SetPrec(400).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(400).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(400).SetFloat64(float64(c)))
	f, _ := x.Float32()
	if f == 0 && c == 0 && float64(a)*float64(b) == 0 {
		// big.Float has no signed zero arithmetic rules: an exact zero
		// sum takes IEEE's sign (+0 unless both terms are -0).
		return float32(float64(a)*float64(b) + float64(c))
	}
	return f
}

// TestFMA32 checks fma32 against the exact computation on random operands,
// float32 edge values, and sums built to land half-way between two
// float32 (where rounding through float64 twice goes wrong).
func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	check := func(a, b, c float32) {
		t.Helper()
		if got, want := fma32(a, b, c), fmaRef(a, b, c); !sameBits(got, want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#08x), exact %g (%#08x)", a, b, c,
				got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for range 200000 {
		a, b := float32(r.NormFloat64()), float32(r.NormFloat64())
		c := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(60)-30)))
		check(a, b, c)
	}
	for _, a := range opsEdges {
		for _, b := range opsEdges {
			for _, c := range []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1e-40, 3e38} {
				check(a, b, c)
			}
		}
	}
	// a·b = 1 + 2^-24 + 2^-48 (a tie in float32 nudged up by 2^-48), plus a
	// tiny c below: the float64 sum rounds to the tie, then to even, which
	// is wrong; fma32 must round up or down as the exact sum says.
	hard := 0
	for range 100000 {
		a := float32(1 + float64(r.IntN(1<<12))*0x1p-23)
		b := float32(1 + float64(r.IntN(1<<12))*0x1p-23)
		p := float64(a) * float64(b)
		ulp := math.Ldexp(1, math.Ilogb(p)-23)
		mid := math.Floor(p/ulp)*ulp + ulp/2 // the float32 tie below or at p
		c := float32(mid - p)                // p + c ≈ the tie
		for _, d := range []float32{c, math.Nextafter32(c, 1), math.Nextafter32(c, -1)} {
			check(a, b, d)
			if float32(p+float64(d)) != fmaRef(a, b, d) {
				hard++
			}
		}
	}
	if hard == 0 {
		t.Error("no case where rounding through float64 twice is wrong: the test lost its teeth")
	}
}

// canonInput is n floats, normal at scale 1 with edge values mixed in when
// edges is set (never infinities or NaN in weights, which would make every
// sum NaN and hide the order).
func canonInput(r *rand.Rand, n int, edges bool) []float32 {
	x := opsInput(r, n, 1, false)
	if edges {
		for i := range x {
			switch r.IntN(8) {
			case 0:
				x[i] = float32(math.Copysign(0, -1))
			case 1:
				x[i] = 1e-40
			case 2:
				x[i] = float32(r.NormFloat64() * 1e6)
			case 3:
				x[i] = float32(r.NormFloat64() * 1e-6)
			}
		}
	}
	return x
}

// TestFloatDotTwins: every float dot product the kernels dispatch to (f32,
// bf16, q8, q4 with float activations, and the router's 4-row f32 kernel)
// gives its canonical Go twin's bits on every length 1..600 (quantised
// kinds: every group count up to 10), with and without edge values.
func TestFloatDotTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	p := NewPool(2)
	defer p.Close()
	for _, edges := range []bool{false, true} {
		for n := 1; n <= 600; n++ {
			w, x := canonInput(r, n, edges), canonInput(r, 4*n, edges)
			if got, want := Dot(w, x[:n]), dotF32(w, x[:n]); !sameBits(got, want) {
				t.Fatalf("Dot n=%d edges=%v: %v, twin %v", n, edges, got, want)
			}
			m := Mat{Rows: 1, Cols: n, Kind: format.F32, F32: w}
			out := make([]float32, 4)
			p.MatMul(out, &m, x, 4) // 4 rows: dotF32x4 where it applies
			for b := range 4 {
				if want := dotF32(w, x[b*n:(b+1)*n]); !sameBits(out[b], want) {
					t.Fatalf("f32 MatMul n=%d row %d: %v, twin %v", n, b, out[b], want)
				}
			}
			bf := make([]uint16, n)
			for i := range bf {
				bf[i] = uint16(math.Float32bits(w[i]) >> 16)
			}
			mb := Mat{Rows: 1, Cols: n, Kind: format.BF16, BF16: bf}
			if got, want := mb.dotRow(0, x[:n], nil), dotBF16(bf, x[:n]); !sameBits(got, want) {
				t.Fatalf("bf16 n=%d: %v, twin %v", n, got, want)
			}
		}
		for ng := 1; ng <= 10; ng++ {
			cols := ng * format.GroupSize
			x := canonInput(r, cols, edges)
			xsum := make([]float32, ng)
			GroupSums(xsum, x)
			for _, k := range []format.Kind{format.Q8, format.Q4} {
				m, _ := encodeMat(t, canonInput(r, 3*cols, false), 3, cols, k)
				for o := range 3 {
					if got, want := m.dotRow(o, x, xsum), m.dotRowGo(o, x, xsum); !sameBits(got, want) {
						t.Fatalf("%s groups %d row %d: %v, twin %v", k, ng, o, got, want)
					}
				}
			}
		}
	}
}

// TestAxpyTwin: Axpy is the fused a·x+y of axpyGo, bit for bit, on every
// length 1..600.
func TestAxpyTwin(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	for _, edges := range []bool{false, true} {
		for n := 1; n <= 600; n++ {
			x, y := canonInput(r, n, edges), canonInput(r, n, edges)
			a := float32(r.NormFloat64())
			want := append([]float32(nil), y...)
			axpyGo(want, a, x)
			got := guarded(y)
			Axpy(got, a, x)
			compareBits(t, "Axpy", n, got, want)
			checkGuard(t, "Axpy", got)
		}
	}
}

// withGo runs f with the pure-Go kernels, as SLUICE_NOSIMD=1 does.
func withGo(f func()) {
	a, v := useAVX2, useVNNI
	useAVX2, useVNNI = false, false
	defer func() { useAVX2, useVNNI = a, v }()
	f()
}

// TestAttendTwin: attention with the assembly kernels gives the Go twins'
// bits, for head sizes with and without the assembly paths and every
// position count up to 70.
func TestAttendTwin(t *testing.T) {
	r := rand.New(rand.NewPCG(67, 68))
	for _, hd := range []int{8, 16, 32, 48, 64, 128, 256} {
		for n := 1; n <= 70; n++ {
			stride := 2*hd + 8
			q := canonInput(r, hd, n%3 == 0)
			kc, vc := canonInput(r, n*stride, false), canonInput(r, n*stride, n%5 == 0)
			scale := float32(1 / math.Sqrt(float64(hd)))
			got, want := make([]float32, hd), make([]float32, hd)
			s := make([]float32, n)
			Attend(got, q, kc[hd:], vc[hd:], stride, n, scale, s)
			withGo(func() { Attend(want, q, kc[hd:], vc[hd:], stride, n, scale, s) })
			compareBits(t, "Attend", n, got, want)
		}
	}
}

// TestDeltaRuleCanon: DeltaRule gives deltaRuleGo's bits (state, output
// and scratch) over several steps, for every dv the kernels take and some
// they leave to Go.
func TestDeltaRuleCanon(t *testing.T) {
	r := rand.New(rand.NewPCG(69, 70))
	for _, dk := range []int{1, 3, 16, 64, 128} {
		for dv := 1; dv <= 160; dv++ {
			if dv > 40 && dv%8 != 0 {
				continue
			}
			S, k, q, v := canonInput(r, dk*dv, false), canonInput(r, dk, false), canonInput(r, dk, false), canonInput(r, dv, dv%3 == 0)
			L2Norm(k, 1e-6)
			L2Norm(q, 1e-6)
			S2 := append([]float32(nil), S...)
			kv, o, kv2, o2 := make([]float32, dv), make([]float32, dv), make([]float32, dv), make([]float32, dv)
			for step := range 3 {
				DeltaRule(S, k, q, v, kv, o, 0.93, 0.6)
				deltaRuleGo(S2, k, q, v, kv2, o2, 0.93, 0.6)
				_ = step
				compareBits(t, "DeltaRule S", dv, S, S2)
				compareBits(t, "DeltaRule o", dv, o, o2)
				compareBits(t, "DeltaRule kv", dv, kv, kv2)
			}
		}
	}
}

// BenchmarkDotTwins times the canonical Go dot products against the
// assembly (per 4096-element dot).
func BenchmarkDotTwins(b *testing.B) {
	r := rand.New(rand.NewPCG(71, 72))
	w, x := randVec(r, 4096), randVec(r, 4096)
	bf := make([]uint16, len(w))
	for i := range bf {
		bf[i] = uint16(math.Float32bits(w[i]) >> 16)
	}
	var sink float32
	b.Run("f32-go", func(b *testing.B) {
		for b.Loop() {
			sink += dotF32(w, x)
		}
	})
	b.Run("bf16-go", func(b *testing.B) {
		for b.Loop() {
			sink += dotBF16(bf, x)
		}
	})
	b.Run("f32-asm", func(b *testing.B) {
		for b.Loop() {
			sink += Dot(w, x)
		}
	})
	_ = sink
}
