package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/testutil/ref"
)

// opsEdges are inputs at the corners of Exp's range reduction and of
// float32: zeros of both signs, the clamps at -87.3 and 88.7 and their
// neighbours, the region where k reaches 128, huge and infinite values,
// subnormals and NaN.
var opsEdges = func() []float32 {
	var e []float32
	for _, v := range []float32{0, 1, 0.5, 20, 87.3, 88.7, 88.37, 88.38, 88.72, 89, 100, 1e4, 1e30,
		math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-40, float32(math.Inf(1))} {
		for _, s := range []float32{1, -1} {
			e = append(e, s*v, s*math.Nextafter32(v, 0), s*math.Nextafter32(v, float32(math.Inf(1))))
		}
	}
	return append(e, float32(math.NaN()))
}()

// opsInput fills n floats: normal values at scale sc, with some elements
// replaced by edge values when edges is set.
func opsInput(r *rand.Rand, n int, sc float64, edges bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * sc)
		if edges && r.IntN(4) == 0 {
			x[i] = opsEdges[r.IntN(len(opsEdges))]
		}
	}
	return x
}

// sameBits reports whether a and b are the same float32, any NaN matching
// any NaN (NaN payloads are not part of the contract).
func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// guarded returns a slice of n floats holding x whose backing array runs 8
// floats further, filled with a sentinel; checkGuard fails if the kernel
// wrote there (a masked tail store gone wrong).
func guarded(x []float32) []float32 {
	b := make([]float32, len(x)+8)
	copy(b, x)
	for i := len(x); i < len(b); i++ {
		b[i] = -12345
	}
	return b[:len(x)]
}

func checkGuard(t *testing.T, name string, x []float32) {
	t.Helper()
	for i, v := range x[len(x):cap(x)] {
		if v != -12345 {
			t.Fatalf("%s n=%d: wrote past the end at +%d", name, len(x), i)
		}
	}
}

func compareBits(t *testing.T, name string, n int, got, want []float32) {
	t.Helper()
	for i := range want {
		if !sameBits(got[i], want[i]) {
			t.Fatalf("%s n=%d [%d]: asm %v (%#08x), Go %v (%#08x)", name, n, i,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// TestOpsTwins checks every element-wise assembly kernel against its Go
// twin bit for bit, on every length 1..600 (all tail shapes, the 32-float
// blocks of the norms' sums and the model's sizes), with ordinary and edge
// inputs, aliased and separate outputs, and nothing written past the end.
func TestOpsTwins(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA on this CPU (or SLUICE_NOSIMD set)")
	}
	r := rand.New(rand.NewPCG(41, 42))
	for n := 1; n <= 600; n++ {
		for _, c := range []struct {
			sc    float64
			edges bool
		}{{1, false}, {30, false}, {1, true}} {
			x, w := opsInput(r, n, c.sc, c.edges), opsInput(r, n, 1, false)
			if c.edges && r.IntN(2) == 0 {
				w = opsInput(r, n, 1, true)
			}
			for _, zc := range []bool{false, true} {
				want := make([]float32, n)
				rmsNormGo(want, x, w, 1e-6, zc)
				got := guarded(make([]float32, n))
				RMSNorm(got, x, w, 1e-6, zc)
				compareBits(t, fmt.Sprintf("RMSNorm zc=%v", zc), n, got, want)
				checkGuard(t, "RMSNorm", got)
				al := guarded(x)
				RMSNorm(al, al, w, 1e-6, zc)
				compareBits(t, fmt.Sprintf("RMSNorm aliased zc=%v", zc), n, al, want)
				checkGuard(t, "RMSNorm aliased", al)
			}

			want := append([]float32(nil), x...)
			l2NormGo(want, 1e-6)
			got := guarded(x)
			L2Norm(got, 1e-6)
			compareBits(t, "L2Norm", n, got, want)
			checkGuard(t, "L2Norm", got)

			want = append([]float32(nil), x...)
			siluGo(want)
			got = guarded(x)
			SiLUInPlace(got)
			compareBits(t, "SiLUInPlace", n, got, want)
			checkGuard(t, "SiLUInPlace", got)

			want = make([]float32, n)
			swigluGo(want, x, w)
			got = guarded(make([]float32, n))
			SwiGLU(got, x, w)
			compareBits(t, "SwiGLU", n, got, want)
			checkGuard(t, "SwiGLU", got)
			got = guarded(x) // dst == gate, as the MoE calls it
			SwiGLU(got, got, w)
			compareBits(t, "SwiGLU dst=gate", n, got, want)
			checkGuard(t, "SwiGLU dst=gate", got)
			got = guarded(w) // dst == up, as the gated norm calls it
			SwiGLU(got, x, got)
			compareBits(t, "SwiGLU dst=up", n, got, want)

			want = append([]float32(nil), w...)
			mulSigmoidGo(want, x)
			got = guarded(w)
			MulSigmoid(got, x)
			compareBits(t, "MulSigmoid", n, got, want)
			checkGuard(t, "MulSigmoid", got)

			want = append([]float32(nil), x...)
			softmaxGo(want)
			got = guarded(x)
			Softmax(got)
			compareBits(t, "Softmax", n, got, want)
			checkGuard(t, "Softmax", got)
		}
	}
}

// TestOpsExpSweep runs SiLUInPlace and MulSigmoid over a sweep of about a
// million float32 bit patterns of both signs, so the vector Exp inside them
// is compared with the scalar Exp (through Sigmoid) across its whole
// domain, not only at random normal inputs.
func TestOpsExpSweep(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA on this CPU (or SLUICE_NOSIMD set)")
	}
	const step = 4093
	x := make([]float32, 0, 1<<32/step+1)
	for b := uint64(0); b < 1<<32; b += step {
		x = append(x, math.Float32frombits(uint32(b)))
	}
	got := append([]float32(nil), x...)
	SiLUInPlace(got)
	for i, v := range x {
		if want := SiLU(v); !sameBits(got[i], want) {
			t.Fatalf("SiLU(%v): asm %v, scalar %v", v, got[i], want)
		}
	}
	o := make([]float32, len(x))
	for i := range o {
		o[i] = 1
	}
	MulSigmoid(o, x)
	for i, v := range x {
		if want := Sigmoid(v); !sameBits(o[i], want) {
			t.Fatalf("Sigmoid(%v): asm %v, scalar %v", v, o[i], want)
		}
	}
}

// TestOpsAccuracy checks the kernels (whichever path is in use) against
// float64 references, so the twins are right and not merely equal.
func TestOpsAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, n := range []int{1, 7, 64, 100, 256, 384, 513} {
		x, w := opsInput(r, n, 3, false), opsInput(r, n, 1, false)
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		got := make([]float32, n)
		RMSNorm(got, x, w, 1e-6, true)
		inv := 1 / math.Sqrt(ss/float64(n)+1e-6)
		for i := range x {
			want := float64(x[i]) * inv * (1 + float64(w[i]))
			if d := math.Abs(float64(got[i]) - want); d > 1e-6*(1+math.Abs(want)) {
				t.Fatalf("RMSNorm n=%d [%d]: %v, want %v", n, i, got[i], want)
			}
		}
		y := append([]float32(nil), x...)
		L2Norm(y, 0)
		var nn float64
		for _, v := range y {
			nn += float64(v) * float64(v)
		}
		if math.Abs(nn-1) > 1e-5 {
			t.Fatalf("L2Norm n=%d: |y|² = %v", n, nn)
		}
		SwiGLU(got, x, w)
		for i := range x {
			g := float64(x[i])
			want := g / (1 + math.Exp(-g)) * float64(w[i])
			if d := math.Abs(float64(got[i]) - want); d > 1e-6*(1+math.Abs(want)) {
				t.Fatalf("SwiGLU n=%d [%d]: %v, want %v", n, i, got[i], want)
			}
		}
		s := append([]float32(nil), x...)
		Softmax(s)
		for i, want := range ref.Softmax(x) {
			if d := math.Abs(float64(s[i]) - want); d > 1e-6*(1e-3+want) {
				t.Fatalf("Softmax n=%d [%d]: %v, want %v", n, i, s[i], want)
			}
		}
	}
	for _, v := range []float32{-100, -88.8, -30, -2, 0, 0.5, 3, 25, 88.8, 100} {
		sg := 1 / (1 + math.Exp(-float64(v)))
		if d := math.Abs(float64(Sigmoid(v)) - sg); d > 2e-7*sg+1e-38 {
			t.Errorf("Sigmoid(%v) = %v, want %v", v, Sigmoid(v), sg)
		}
	}
}

// TestOpsEmpty: zero-length inputs are no-ops on both paths.
func TestOpsEmpty(t *testing.T) {
	RMSNorm(nil, nil, nil, 1e-6, false)
	L2Norm(nil, 1e-6)
	SiLUInPlace(nil)
	SwiGLU(nil, nil, nil)
	MulSigmoid(nil, nil)
	Softmax(nil)
	softmaxGo(nil)
}

// BenchmarkOps compares each kernel's assembly with its Go twin at the
// model's sizes: go test ./internal/kernels -run x -bench Ops.
func BenchmarkOps(b *testing.B) {
	r := rand.New(rand.NewPCG(45, 46))
	x, w, d := opsInput(r, 512, 1, false), opsInput(r, 512, 1, false), make([]float32, 512)
	type kern struct {
		name string
		n    int
		asm  func(n int)
		gof  func(n int)
	}
	// The in-place kernels run on d, reset each time (the copy is part of
	// both measurements): repeated in place, L2Norm and Softmax would see
	// other inputs and MulSigmoid would drive d into slow subnormals.
	ks := []kern{
		{"RMSNorm", 256, func(n int) { RMSNorm(d[:n], x[:n], w[:n], 1e-6, true) },
			func(n int) { rmsNormGo(d[:n], x[:n], w[:n], 1e-6, true) }},
		{"RMSNorm", 64, func(n int) { RMSNorm(d[:n], x[:n], w[:n], 1e-6, true) },
			func(n int) { rmsNormGo(d[:n], x[:n], w[:n], 1e-6, true) }},
		{"L2Norm", 128, func(n int) { copy(d, x[:n]); L2Norm(d[:n], 1e-6) },
			func(n int) { copy(d, x[:n]); l2NormGo(d[:n], 1e-6) }},
		{"SwiGLU", 64, func(n int) { SwiGLU(d[:n], x[:n], w[:n]) }, func(n int) { swigluGo(d[:n], x[:n], w[:n]) }},
		{"SwiGLU", 512, func(n int) { SwiGLU(d[:n], x[:n], w[:n]) }, func(n int) { swigluGo(d[:n], x[:n], w[:n]) }},
		{"SiLUInPlace", 384, func(n int) { copy(d, x[:n]); SiLUInPlace(d[:n]) },
			func(n int) { copy(d, x[:n]); siluGo(d[:n]) }},
		{"MulSigmoid", 512, func(n int) { copy(d, w[:n]); MulSigmoid(d[:n], x[:n]) },
			func(n int) { copy(d, w[:n]); mulSigmoidGo(d[:n], x[:n]) }},
		{"Softmax", 64, func(n int) { copy(d, x[:n]); Softmax(d[:n]) },
			func(n int) { copy(d, x[:n]); softmaxGo(d[:n]) }},
	}
	for _, k := range ks {
		for _, impl := range []string{"asm", "go"} {
			f := k.asm
			if impl == "go" {
				f = k.gof
			} else if !useAVX2 {
				continue
			}
			b.Run(fmt.Sprintf("%s/%d/%s", k.name, k.n, impl), func(b *testing.B) {
				b.SetBytes(int64(4 * k.n))
				for b.Loop() {
					f(k.n)
				}
			})
		}
	}
}
