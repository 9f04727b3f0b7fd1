package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/testutil/ref"
)

// encodeMat builds a Mat of kind k from float32 weights via the packer's
// encoder, laid out in one buffer as the packed format would.
func encodeMat(t testing.TB, w []float32, rows, cols int, k format.Kind) (Mat, []float32) {
	t.Helper()
	enc, err := quant.Encode(w, rows, cols, k)
	if err != nil {
		t.Fatal(err)
	}
	m := Mat{Rows: rows, Cols: cols, Kind: k, Scales: quant.F16s(enc.Scales), Biases: quant.F16s(enc.Biases)}
	switch k {
	case format.F32:
		m.F32 = append([]float32(nil), w...)
	case format.BF16:
		m.BF16 = make([]uint16, rows*cols)
		for i := range m.BF16 {
			m.BF16[i] = uint16(enc.Values[2*i]) | uint16(enc.Values[2*i+1])<<8
		}
	default:
		m.Q = enc.Values
	}
	deq := make([]float32, rows*cols)
	quant.Decode(deq, enc.Values, enc.Scales, enc.Biases, rows, cols, k)
	return m, deq
}

// widened is halves widened to float32 with the scalar conversion.
func widened(h []uint16) []float32 {
	v := make([]float32, len(h))
	for i, x := range h {
		v[i] = quant.F16ToF32(x)
	}
	return v
}

// sf and bf are m's scales and biases widened to float32, as the kernels
// take them (each call allocates).
func (m *Mat) sf() []float32 { return widened(m.Scales) }
func (m *Mat) bf() []float32 { return widened(m.Biases) }

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestMatMulScalarTwin checks every storage kind's product against the plain
// float64 product of the dequantised matrix.
func TestMatMulScalarTwin(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p := NewPool(2)
	defer p.Close()
	for _, k := range []format.Kind{format.F32, format.BF16, format.Q8, format.Q4} {
		for _, sh := range [][3]int{{1, 64, 1}, {37, 128, 3}, {256, 256, 1}, {64, 512, 9}} {
			rows, cols, nb := sh[0], sh[1], sh[2]
			w := randVec(r, rows*cols)
			m, deq := encodeMat(t, w, rows, cols, k)
			x := randVec(r, nb*cols)
			out := make([]float32, nb*rows)
			p.MatMul(out, &m, x, nb)
			for b := 0; b < nb; b++ {
				for o := 0; o < rows; o++ {
					var want float64
					for i := 0; i < cols; i++ {
						want += float64(deq[o*cols+i]) * float64(x[b*cols+i])
					}
					tol := 1e-4 * math.Sqrt(float64(cols)) * (1 + math.Abs(want))
					if k == format.Q4 {
						// int8 activations: each term's error is at most half
						// an activation step, max|x|/254 per group.
						tol = 0.05 * math.Sqrt(float64(cols))
					}
					if d := math.Abs(float64(out[b*rows+o]) - want); d > tol {
						t.Fatalf("%s [%d %d] row %d out %d: %v, scalar %v", k, rows, cols, b, o, out[b*rows+o], want)
					}
				}
			}
			// Row view matches the dequantised matrix.
			row := make([]float32, cols)
			m.Row(row, rows-1)
			for i := range row {
				if row[i] != deq[(rows-1)*cols+i] {
					t.Fatalf("%s: Row(%d)[%d] = %v, want %v", k, rows-1, i, row[i], deq[(rows-1)*cols+i])
				}
			}
		}
	}
}

// TestQuantError bounds the round-trip error of each quantised kind by half
// a quantisation step.
func TestQuantError(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	w := randVec(r, 64*256)
	for _, k := range []format.Kind{format.Q8, format.Q4} {
		_, deq := encodeMat(t, w, 64, 256, k)
		enc, _ := quant.Encode(w, 64, 256, k)
		for i := range w {
			step := enc.Scales[i/format.GroupSize]
			if d := math.Abs(float64(w[i] - deq[i])); d > float64(step)/2*1.001+1e-7 {
				t.Fatalf("%s: value %d error %g > half step %g", k, i, d, step/2)
			}
		}
	}
}

// TestMatMulRowInvariance: a row's product is bit-identical alone or in a
// batch, on one thread or two.
func TestMatMulRowInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	for _, k := range []format.Kind{format.F32, format.BF16, format.Q8, format.Q4} {
		rows, cols, nb := 300, 256, 9 // two 4-row blocks and a single row
		m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, k)
		x := randVec(r, nb*cols)
		batch := make([]float32, nb*rows)
		p2.MatMul(batch, &m, x, nb)
		one := make([]float32, rows)
		for b := 0; b < nb; b++ {
			p1.MatMul(one, &m, x[b*cols:(b+1)*cols], 1)
			for o := range one {
				if math.Float32bits(one[o]) != math.Float32bits(batch[b*rows+o]) {
					t.Fatalf("%s: row %d out %d differs alone vs batched", k, b, o)
				}
			}
		}
	}
}

func TestNormsAndActivations(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := randVec(r, 256)
	w := randVec(r, 256)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/256+1e-6)
	for _, zc := range []bool{false, true} {
		got := make([]float32, 256)
		RMSNorm(got, x, w, 1e-6, zc)
		for i := range x {
			ww := float64(w[i])
			if zc {
				ww += 1
			}
			if d := math.Abs(float64(got[i]) - float64(x[i])*inv*ww); d > 1e-5*(1+math.Abs(float64(got[i]))) {
				t.Fatalf("RMSNorm zc=%v [%d]: %v", zc, i, d)
			}
		}
	}
	y := append([]float32(nil), x...)
	L2Norm(y, 1e-6)
	var n float64
	for _, v := range y {
		n += float64(v) * float64(v)
	}
	if math.Abs(n-1) > 1e-5 {
		t.Errorf("L2Norm: |y|² = %v", n)
	}
	s := append([]float32(nil), x[:16]...)
	Softmax(s)
	for i, want := range ref.Softmax(x[:16]) {
		if d := math.Abs(float64(s[i]) - want); d > 1e-6 {
			t.Fatalf("Softmax[%d] off by %g", i, d)
		}
	}
	for _, v := range []float32{-30, -2, 0, 0.5, 3, 25} {
		sp := math.Log1p(math.Exp(float64(v)))
		if d := math.Abs(float64(Softplus(v)) - sp); d > 1e-6*(1+sp) {
			t.Errorf("Softplus(%v) off by %g", v, d)
		}
		si := float64(v) / (1 + math.Exp(-float64(v)))
		if d := math.Abs(float64(SiLU(v)) - si); d > 1e-6*(1+math.Abs(si)) {
			t.Errorf("SiLU(%v) off by %g", v, d)
		}
	}
}

func TestRope(t *testing.T) {
	const dim, hd, pos = 16, 64, 37
	cos, sin := make([]float32, dim/2), make([]float32, dim/2)
	RopeTable(cos, sin, pos, RopeFreqs(dim, 10000))
	r := rand.New(rand.NewPCG(9, 10))
	x := randVec(r, hd)
	y := append([]float32(nil), x...)
	Rope(y, cos, sin)
	for i := 0; i < dim/2; i++ {
		f := float64(pos) / math.Pow(10000, float64(2*i)/dim)
		c, s := math.Cos(f), math.Sin(f)
		w1 := float64(x[i])*c - float64(x[i+dim/2])*s
		w2 := float64(x[i+dim/2])*c + float64(x[i])*s
		if math.Abs(float64(y[i])-w1) > 1e-4 || math.Abs(float64(y[i+dim/2])-w2) > 1e-4 {
			t.Fatalf("Rope pair %d: (%v,%v), want (%v,%v)", i, y[i], y[i+dim/2], w1, w2)
		}
	}
	for i := dim; i < hd; i++ {
		if y[i] != x[i] {
			t.Fatalf("Rope changed pass-through dim %d", i)
		}
	}
}

func TestMatFromBounds(t *testing.T) {
	tn := &format.Tensor{Name: "w", Kind: format.Q4, Shape: []int{4, 64}, Offset: 0, Size: 128, ScaleOffset: 128, BiasOffset: 192}
	if _, err := MatFrom(make([]byte, 100), tn); err == nil {
		t.Error("MatFrom accepted a buffer shorter than the tensor")
	}
	if _, err := MatFrom(make([]byte, 512), tn); err != nil {
		t.Errorf("MatFrom: %v", err)
	}
}

func BenchmarkMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	p := NewPool(0)
	defer p.Close()
	for _, k := range []format.Kind{format.BF16, format.Q8, format.Q4} {
		rows, cols := 4096, 256
		m, _ := encodeMat(b, randVec(r, rows*cols), rows, cols, k)
		x := randVec(r, cols)
		out := make([]float32, rows)
		b.Run(string(k), func(b *testing.B) {
			b.SetBytes(int64(len(m.Q) + 2*len(m.BF16)))
			for b.Loop() {
				p.MatMul(out, &m, x, 1)
			}
		})
	}
}

// TestSIMDTwin compares the assembly dot products with their pure-Go twins
// on every storage kind.
func TestSIMDTwin(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA on this CPU (or SLUICE_NOSIMD set)")
	}
	r := rand.New(rand.NewPCG(11, 12))
	for _, k := range []format.Kind{format.F32, format.BF16, format.Q8, format.Q4} {
		for _, cols := range []int{64, 256, 512, 2048} {
			rows := 8
			m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, k)
			x := randVec(r, cols)
			xsum := make([]float32, cols/format.GroupSize)
			GroupSums(xsum, x)
			for o := 0; o < rows; o++ {
				a, b := m.dotRow(o, x, xsum), m.dotRowGo(o, x, xsum)
				if d := math.Abs(float64(a - b)); d > 1e-5*math.Sqrt(float64(cols))*(1+math.Abs(float64(b))) {
					t.Fatalf("%s cols %d row %d: asm %v, Go %v", k, cols, o, a, b)
				}
			}
		}
	}
}

// TestQ4Int8Design checks the integer-activation q4 kernel against its Go
// twin exactly-ish and against the float product within the error that
// int8 activations add.
func TestQ4Int8Design(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(13, 14))
	rows, cols := 16, 512
	m, deq := encodeMat(t, randVec(r, rows*cols), rows, cols, format.Q4)
	x := randVec(r, cols)
	ng := cols / format.GroupSize
	x8, xs, xsum := make([]int8, cols), make([]float32, ng), make([]float32, ng)
	QuantizeRow8(x8, xs, x)
	GroupSums(xsum, x)
	for o := 0; o < rows; o++ {
		a := dotQ4I8AVX2(&m.Q[o*cols/2], &m.sf()[o*ng], &m.bf()[o*ng], &x8[0], &xs[0], &xsum[0], ng)
		b := dotQ4I8(m.Q[o*cols/2:(o+1)*cols/2], m.sf()[o*ng:(o+1)*ng], m.bf()[o*ng:(o+1)*ng], x8, xs, xsum)
		if d := math.Abs(float64(a - b)); d > 1e-4*(1+math.Abs(float64(b))) {
			t.Fatalf("row %d: asm %v, Go twin %v", o, a, b)
		}
		var want float64
		for i := 0; i < cols; i++ {
			want += float64(deq[o*cols+i]) * float64(x[i])
		}
		if d := math.Abs(float64(a) - want); d > 0.05*math.Sqrt(float64(cols)) {
			t.Fatalf("row %d: int8 design %v, float %v", o, a, want)
		}
	}
}

// BenchmarkQ4Designs compares the two q4 matrix-vector designs on one core:
// dequantise-and-FMA (float activations) against int8 activations with
// integer dot products (quantising the activation row included), one row
// per call for both, then the int8 design's 8-row decode kernel.
func BenchmarkQ4Designs(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range [][2]int{{4096, 256}, {2048, 2048}, {512, 2048}} {
		rows, cols := sh[0], sh[1]
		m, _ := encodeMat(b, randVec(r, rows*cols), rows, cols, format.Q4)
		x := randVec(r, cols)
		ng := cols / format.GroupSize
		xsum := make([]float32, ng)
		x8, xs := make([]int8, cols), make([]float32, ng)
		out := make([]float32, rows)
		ms, mb := m.sf(), m.bf()
		name := fmt.Sprintf("%dx%d", rows, cols)
		b.Run("float-fma/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(m.Q)))
			for b.Loop() {
				GroupSums(xsum, x)
				for o := range out {
					out[o] = dotQ4AVX2(&m.Q[o*cols/2], &ms[o*ng], &mb[o*ng], &x[0], &xsum[0], ng)
				}
			}
		})
		b.Run("int8-dot/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(m.Q)))
			for b.Loop() {
				GroupSums(xsum, x)
				QuantizeRow8(x8, xs, x)
				for o := range out {
					out[o] = dotQ4I8AVX2(&m.Q[o*cols/2], &ms[o*ng], &mb[o*ng], &x8[0], &xs[0], &xsum[0], ng)
				}
			}
		})
		// The int8 design as decode runs it: 8 weight rows per call.
		var sc Scratch
		b.Run("int8-rows8/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(m.Q)))
			for b.Loop() {
				sc.MatMul(out, &m, x, 1)
			}
		})
	}
}

func TestAxpyDotTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{16, 64, 100, 128} {
		x, y := randVec(r, n), randVec(r, n)
		want := append([]float32(nil), y...)
		axpyGo(want, 0.37, x)
		got := append([]float32(nil), y...)
		Axpy(got, 0.37, x)
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-6*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("Axpy n=%d [%d]: %v, twin %v", n, i, got[i], want[i])
			}
		}
		if d := math.Abs(float64(Dot(x, y) - dotF32(x, y))); d > 1e-5*math.Sqrt(float64(n)) {
			t.Fatalf("Dot n=%d off by %g", n, d)
		}
	}
}

// BenchmarkMatMulBatch measures a prefill-shaped product (64 rows).
func BenchmarkMatMulBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	p := NewPool(0)
	defer p.Close()
	for _, k := range []format.Kind{format.Q8, format.Q4} {
		rows, cols, nb := 1024, 256, 64
		m, _ := encodeMat(b, randVec(r, rows*cols), rows, cols, k)
		x := randVec(r, nb*cols)
		out := make([]float32, nb*rows)
		b.Run(string(k), func(b *testing.B) {
			for b.Loop() {
				p.MatMul(out, &m, x, nb)
			}
			b.ReportMetric(float64(rows*cols*nb)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
		})
	}
}

func TestDeltaRuleTwin(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, d := range [][2]int{{64, 64}, {128, 128}, {16, 24}} {
		dk, dv := d[0], d[1]
		S := randVec(r, dk*dv)
		k, q, v := randVec(r, dk), randVec(r, dk), randVec(r, dv)
		L2Norm(k, 1e-6)
		S2 := append([]float32(nil), S...)
		o1, o2 := make([]float32, dv), make([]float32, dv)
		kv := make([]float32, dv)
		for step := 0; step < 3; step++ {
			DeltaRule(S, k, q, v, kv, o1, 0.9, 0.6)
			deltaRuleGo(S2, k, q, v, kv, o2, 0.9, 0.6)
		}
		for i := range S {
			if d := math.Abs(float64(S[i] - S2[i])); d > 1e-4*(1+math.Abs(float64(S2[i]))) {
				t.Fatalf("dk %d dv %d: S[%d] %v, twin %v", dk, dv, i, S[i], S2[i])
			}
		}
		for i := range o1 {
			if d := math.Abs(float64(o1[i] - o2[i])); d > 1e-4*(1+math.Abs(float64(o2[i]))) {
				t.Fatalf("dk %d dv %d: o[%d] %v, twin %v", dk, dv, i, o1[i], o2[i])
			}
		}
	}
}

// TestScratchMatMul: the single-thread product equals the pool's bit for bit.
func TestScratchMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	p := NewPool(2)
	defer p.Close()
	var sc Scratch
	for _, k := range []format.Kind{format.F32, format.BF16, format.Q8, format.Q4} {
		rows, cols, nb := 200, 256, 6
		m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, k)
		x := randVec(r, nb*cols)
		a, b := make([]float32, nb*rows), make([]float32, nb*rows)
		p.MatMul(a, &m, x, nb)
		sc.MatMul(b, &m, x, nb)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s: element %d: pool %v, scratch %v", k, i, a[i], b[i])
			}
		}
	}
}

// TestQuantizeRow8 checks the int8 activations against round-half-even of
// x/scale computed in float64, and the scale against max|x|/127.
func TestQuantizeRow8(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	x := randVec(r, 256)
	x[5] = 0
	for i := 64; i < 128; i++ {
		x[i] = 0 // an all-zero group
	}
	x8, xs := make([]int8, 256), make([]float32, 4)
	QuantizeRow8(x8, xs, x)
	for g := 0; g < 4; g++ {
		var m float64
		for _, v := range x[g*64 : g*64+64] {
			m = math.Max(m, math.Abs(float64(v)))
		}
		if math.Abs(float64(xs[g])-m/127) > 1e-6*m {
			t.Fatalf("group %d scale %v, want %v", g, xs[g], m/127)
		}
		for i := g * 64; i < g*64+64; i++ {
			want := 0.0
			if xs[g] > 0 {
				want = math.RoundToEven(float64(x[i] * (1 / xs[g])))
			}
			if math.Abs(float64(x8[i])-want) > 0 || want > 127 || want < -127 {
				t.Fatalf("x8[%d] = %d, want %v", i, x8[i], want)
			}
		}
	}
}

func TestExp(t *testing.T) {
	var worst float64
	for x := -87.0; x <= 10; x += 0.001 {
		got := float64(Exp(float32(x)))
		want := math.Exp(float64(float32(x)))
		worst = math.Max(worst, math.Abs(got-want)/want)
	}
	if worst > 4e-7 {
		t.Errorf("Exp relative error up to %g", worst)
	}
	if Exp(-100) != 0 || !math.IsInf(float64(Exp(100)), 1) {
		t.Error("Exp out of range")
	}
}

// TestAttend checks the attention kernel against a float64 softmax-weighted
// sum, on head sizes with and without the assembly path.
func TestAttend(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, hd := range []int{64, 128, 48} {
		stride, n := 3*hd, 37
		q := randVec(r, hd)
		kc, vc := randVec(r, n*stride), randVec(r, n*stride)
		off := hd // the head's slice starts one head into each row
		o := make([]float32, hd)
		s := make([]float32, n)
		scale := float32(1 / math.Sqrt(float64(hd)))
		Attend(o, q, kc[off:], vc[off:], stride, n, scale, s)
		sc := make([]float64, n)
		mx := math.Inf(-1)
		for j := range sc {
			for d := 0; d < hd; d++ {
				sc[j] += float64(q[d]) * float64(kc[off+j*stride+d])
			}
			sc[j] *= float64(scale)
			mx = math.Max(mx, sc[j])
		}
		var sum float64
		for j := range sc {
			sc[j] = math.Exp(sc[j] - mx)
			sum += sc[j]
		}
		for d := 0; d < hd; d++ {
			var want float64
			for j := range sc {
				want += sc[j] / sum * float64(vc[off+j*stride+d])
			}
			if math.Abs(float64(o[d])-want) > 1e-5 {
				t.Fatalf("hd %d dim %d: %v, want %v", hd, d, o[d], want)
			}
		}
	}
}

// TestMatMul2: a pair of products sharing their input equals two products.
func TestMatMul2(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	p := NewPool(2)
	defer p.Close()
	var sc Scratch
	rows, cols, nb := 96, 256, 5
	a, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, format.Q4)
	b, _ := encodeMat(t, randVec(r, 2*rows*cols), 2*rows, cols, format.Q4)
	x := randVec(r, nb*cols)
	wa, wb := make([]float32, nb*rows), make([]float32, 2*nb*rows)
	p.MatMul(wa, &a, x, nb)
	p.MatMul(wb, &b, x, nb)
	for _, mm := range []interface {
		MatMul2(o1 []float32, w1 *Mat, o2 []float32, w2 *Mat, x []float32, nb int)
	}{p, &sc} {
		ga, gb := make([]float32, nb*rows), make([]float32, 2*nb*rows)
		mm.MatMul2(ga, &a, gb, &b, x, nb)
		for i := range wa {
			if ga[i] != wa[i] {
				t.Fatalf("first product differs at %d", i)
			}
		}
		for i := range wb {
			if gb[i] != wb[i] {
				t.Fatalf("second product differs at %d", i)
			}
		}
	}
}

// TestQ4BlockedKernels: the 4-weight-row and 4-activation-row q4 kernels
// give each output bit-identical to the single-row kernel.
func TestQ4BlockedKernels(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(27, 28))
	rows, cols := 11, 512
	m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, format.Q4)
	ng := cols / format.GroupSize
	for _, nb := range []int{1, 3, 4, 9} {
		x := randVec(r, nb*cols)
		var sc Scratch
		out := make([]float32, nb*rows)
		sc.MatMul(out, &m, x, nb)
		x8, xs, xsum := make([]int8, cols), make([]float32, ng), make([]float32, ng)
		for b := 0; b < nb; b++ {
			QuantizeRow8(x8, xs, x[b*cols:(b+1)*cols])
			GroupSums(xsum, x[b*cols:(b+1)*cols])
			for o := 0; o < rows; o++ {
				want := dotQ4I8AVX2(&m.Q[o*cols/2], &m.sf()[o*ng], &m.bf()[o*ng], &x8[0], &xs[0], &xsum[0], ng)
				if math.Float32bits(out[b*rows+o]) != math.Float32bits(want) {
					t.Fatalf("nb %d row %d out %d: %v, single-row kernel %v", nb, b, o, out[b*rows+o], want)
				}
			}
		}
	}
}

// TestExpSubAVX2: the vector exp is lane for lane the scalar Exp.
func TestExpSubAVX2(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(29, 30))
	s := make([]float32, 256)
	for i := range s {
		s[i] = float32(r.NormFloat64() * 30)
	}
	s[3] = -200 // underflows to 0
	var mx float32
	for _, v := range s {
		mx = max(mx, v)
	}
	want := make([]float32, len(s))
	for i, v := range s {
		want[i] = Exp(v - mx)
	}
	got := append([]float32(nil), s...)
	sum := expSubAVX2(&got[0], len(got), mx)
	var ws float64
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("lane %d: %v, Exp %v", i, got[i], want[i])
		}
		ws += float64(want[i])
	}
	if math.Abs(float64(sum)-ws) > 1e-5*ws {
		t.Fatalf("sum %v, want %v", sum, ws)
	}
	// A dense sweep of the softmax's domain: a polynomial constant one ulp
	// off shows on about one input in a million.
	const n = 1 << 22
	sw := make([]float32, n)
	for i := range sw {
		sw[i] = -88 * float32(i) / n
	}
	expSubAVX2(&sw[0], n, 0)
	for i, v := range sw {
		if x := -88 * float32(i) / n; math.Float32bits(v) != math.Float32bits(Exp(x)) {
			t.Fatalf("e^%v: %v, Exp %v", x, v, Exp(x))
		}
	}
}

// TestScoresBlocks: scores computed four keys at a time equal one-key
// dots, over key counts with and without a remainder.
func TestScoresBlocks(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(31, 32))
	for _, hd := range []int{16, 48, 64, 128} {
		for _, n := range []int{3, 11, 8, 29} {
			stride := 2 * hd
			q, kc := randVec(r, hd), randVec(r, n*stride)
			out := make([]float32, n)
			scoresAVX2(&q[0], &kc[0], 4*stride, n, hd, 0.125, &out[0])
			for j := 0; j < n; j++ {
				want := dotF32AVX2(&q[0], &kc[j*stride], hd) * 0.125
				if math.Float32bits(out[j]) != math.Float32bits(want) {
					t.Fatalf("hd %d, %d keys, key %d: %v, one-key %v", hd, n, j, out[j], want)
				}
			}
		}
	}
}

// TestScores3: three queries a pass (scores3AVX2) give three one-query
// passes' bits, over odd and even key counts.
func TestScores3(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(35, 36))
	for _, hd := range []int{80, 576} {
		for _, n := range []int{1, 2, 7, 64} {
			stride, qs := hd+16, hd+32
			q, kc := randVec(r, 3*qs), randVec(r, n*stride)
			out := make([]float32, 3*(n+5))
			scores3AVX2(&q[0], 4*qs, &kc[0], 4*stride, n, hd, 0.07, &out[0], 4*(n+5))
			for h := 0; h < 3; h++ {
				want := make([]float32, n)
				scoresAVX2(&q[h*qs], &kc[0], 4*stride, n, hd, 0.07, &want[0])
				for j := 0; j < n; j++ {
					if got := out[h*(n+5)+j]; math.Float32bits(got) != math.Float32bits(want[j]) {
						t.Fatalf("hd %d, %d keys, head %d key %d: %v, one query %v", hd, n, h, j, got, want[j])
					}
				}
				for j := n; j < n+5; j++ {
					if out[h*(n+5)+j] != 0 {
						t.Fatalf("hd %d, %d keys, head %d: wrote past its keys", hd, n, h)
					}
				}
			}
		}
	}
}

// TestQuantizeRow8Twin: the assembly quantisation equals the Go one exactly.
func TestQuantizeRow8Twin(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	x := randVec(r, 512)
	for i := 128; i < 192; i++ {
		x[i] = 0
	}
	x[300] = 1e-30
	a8, b8 := make([]int8, 512), make([]int8, 512)
	as, bs := make([]float32, 8), make([]float32, 8)
	QuantizeRow8(a8, as, x)
	quantizeRow8Go(b8, bs, x)
	for i := range a8 {
		if a8[i] != b8[i] {
			t.Fatalf("x8[%d]: %d, Go %d", i, a8[i], b8[i])
		}
	}
	for g := range as {
		if math.Float32bits(as[g]) != math.Float32bits(bs[g]) {
			t.Fatalf("xs[%d]: %v, Go %v", g, as[g], bs[g])
		}
	}
}

// TestViewAndDotRows: a view of whole rows (tiled q4 included, on tile
// boundaries) multiplies as those rows of the whole matrix do, bit for
// bit, at one activation row and at several; DotRows gives dotRow's
// values; a view off a tile's boundary, or out of range, is refused.
func TestViewAndDotRows(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	var sc Scratch
	for _, c := range []struct {
		k     format.Kind
		tiled bool
	}{{format.F32, false}, {format.BF16, false}, {format.Q8, false}, {format.Q4, false}, {format.Q4, true}} {
		const rows, cols, lo, hi = 64, 128, 16, 40
		m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, c.k)
		if c.tiled {
			TileQ4(m.Q, rows, cols, nil)
			m.Tiled = true
		}
		for _, nb := range []int{1, 3} {
			x := randVec(r, nb*cols)
			whole, part := make([]float32, nb*rows), make([]float32, nb*(hi-lo))
			sc.MatMul(whole, &m, x, nb)
			v, ok := m.View(lo, hi)
			if !ok {
				t.Fatalf("%s tiled %v: rows %d..%d refused", c.k, c.tiled, lo, hi)
			}
			sc.MatMul(part, &v, x, nb)
			for i := 0; i < nb; i++ {
				for j := 0; j < hi-lo; j++ {
					if got, want := part[i*(hi-lo)+j], whole[i*rows+lo+j]; math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s tiled %v, %d rows: view row %d = %v, whole %v", c.k, c.tiled, nb, j, got, want)
					}
				}
			}
		}
		x := randVec(r, cols)
		xsum := make([]float32, cols/format.GroupSize)
		GroupSums(xsum, x)
		out := make([]float32, hi-lo)
		m.DotRows(out, lo, x, make([]float32, cols/format.GroupSize))
		for j := range out {
			if want := m.dotRow(lo+j, x, xsum); math.Float32bits(out[j]) != math.Float32bits(want) {
				t.Fatalf("%s tiled %v: DotRows row %d = %v, dotRow %v", c.k, c.tiled, lo+j, out[j], want)
			}
		}
		for _, bad := range [][2]int{{-1, 8}, {8, rows + 1}, {20, 10}} {
			if _, ok := m.View(bad[0], bad[1]); ok {
				t.Errorf("%s: view of rows %d..%d accepted", c.k, bad[0], bad[1])
			}
		}
		if _, ok := m.View(4, 16); ok == c.tiled {
			t.Errorf("%s tiled %v: view of rows 4..16 ok %v", c.k, c.tiled, ok)
		}
	}
}
