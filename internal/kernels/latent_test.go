package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttendLatent checks latent attention over a selection of positions
// against a float64 softmax whose values are the keys' prefix.
func TestAttendLatent(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const w, dv, n = 80, 64, 30
	q := make([]float32, w)
	kc := make([]float32, n*w)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	for i := range kc {
		kc[i] = float32(rng.NormFloat64())
	}
	for _, sel := range [][]int{nil, {0, 3, 4, 17, 29}} {
		pos := sel
		if pos == nil {
			for j := 0; j < n; j++ {
				pos = append(pos, j)
			}
		}
		s := make([]float64, len(pos))
		mx := math.Inf(-1)
		for j, p := range pos {
			for i := range q {
				s[j] += float64(q[i]) * float64(kc[p*w+i])
			}
			s[j] *= 0.1
			mx = math.Max(mx, s[j])
		}
		var sum float64
		for j := range s {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		o := make([]float32, dv)
		AttendLatent(o, q, kc, w, sel, n, 0.1, make([]float32, n))
		for i := range o {
			var want float64
			for j, p := range pos {
				want += s[j] / sum * float64(kc[p*w+i])
			}
			if math.Abs(float64(o[i])-want) > 1e-5 {
				t.Fatalf("sel %v: o[%d] = %v, want %v", sel, i, o[i], want)
			}
		}
	}
}

// TestAttendLatentPaths: over every position, the four-keys scores and
// the register chains of the values (DeepSeek's widths, 576 and 512) give
// the bits of the position-by-position path a selection takes.
func TestAttendLatentPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const w, dv, n = 576, 512, 37
	q, kc := randVec(rng, w), randVec(rng, n*w)
	all := make([]int, n)
	for j := range all {
		all[j] = j
	}
	fast, slow := make([]float32, dv), make([]float32, dv)
	AttendLatent(fast, q, kc, w, nil, n, 0.05, make([]float32, n))
	AttendLatent(slow, q, kc, w, all, n, 0.05, make([]float32, n))
	for i := range fast {
		if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) {
			t.Fatalf("o[%d]: every position %v, position by position %v", i, fast[i], slow[i])
		}
	}
}

// TestAttendLatentHeads: a group of heads a block of positions at a time
// gives each head AttendLatent's bits, over fewer positions than a block,
// whole blocks and a partial last one, five heads (two pairs and one
// alone); and mixAccAVX2 and mixAcc2AVX2 continue chains as mixAccGo does.
func TestAttendLatentHeads(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, c := range []struct{ w, dv int }{{576, 512}, {80, 64}} {
		for _, n := range []int{1, 37, 128, 150} {
			const heads = 5
			q, kc := randVec(rng, heads*c.w), randVec(rng, n*c.w)
			got := make([]float32, heads*c.dv)
			AttendLatentHeads(got, q, heads, c.w, c.dv, c.dv, kc, c.w, n, 0.05, make([]float32, heads*n), make([]float32, heads))
			for g := 0; g < heads; g++ {
				want := make([]float32, c.dv)
				AttendLatent(want, q[g*c.w:(g+1)*c.w], kc, c.w, nil, n, 0.05, make([]float32, n))
				for i := range want {
					if math.Float32bits(got[g*c.dv+i]) != math.Float32bits(want[i]) {
						t.Fatalf("w %d, %d positions, head %d: o[%d] = %v, one head %v", c.w, n, g, i, got[g*c.dv+i], want[i])
					}
				}
			}
		}
	}
	if !useAVX2 {
		return
	}
	// Widths of 32 to 352: mixAccAVX2 takes 128 elements a pass on 512-bit
	// registers (mixZMM), then 64, then a last 32.
	for _, hd := range []int{32, 64, 96, 128, 160, 256, 288, 352} {
		n, stride := 9, hd+64
		v, p := randVec(rng, n*stride), randVec(rng, n)
		a, b := randVec(rng, hd), make([]float32, hd)
		copy(b, a)
		c, p2 := randVec(rng, hd), randVec(rng, n)
		c2, d2 := append([]float32(nil), c...), append([]float32(nil), c...)
		mixAcc2AVX2(&a[0], &c[0], &v[0], 4*stride, n, hd, &p[0], &p2[0])
		mixAccGo(b, v, stride, n, p)
		mixAccAVX2(&c2[0], &v[0], 4*stride, n, hd, &p2[0])
		mixAccGo(d2, v, stride, n, p2)
		for d := range a {
			if math.Float32bits(a[d]) != math.Float32bits(b[d]) || math.Float32bits(c[d]) != math.Float32bits(c2[d]) || math.Float32bits(c2[d]) != math.Float32bits(d2[d]) {
				t.Fatalf("width %d, dim %d: mixAcc2AVX2 %v and %v, mixAccAVX2 %v, mixAccGo %v and %v", hd, d, a[d], c[d], c2[d], b[d], d2[d])
			}
		}
	}
}

// TestLayerNorm checks LayerNorm against float64.
func TestLayerNorm(t *testing.T) {
	x := []float32{0.5, -1, 2, 3.5, -0.25, 1, 0, 7}
	w := []float32{1, 2, 0.5, 1, 1, -1, 3, 1}
	b := []float32{0, 0.1, -0.2, 0, 1, 0, 0, -1}
	dst := make([]float32, len(x))
	LayerNorm(dst, x, w, b, 1e-6)
	var mean, vr float64
	for _, v := range x {
		mean += float64(v)
	}
	mean /= float64(len(x))
	for _, v := range x {
		vr += (float64(v) - mean) * (float64(v) - mean)
	}
	vr /= float64(len(x))
	for i, v := range x {
		want := (float64(v)-mean)/math.Sqrt(vr+1e-6)*float64(w[i]) + float64(b[i])
		if math.Abs(float64(dst[i])-want) > 1e-5 {
			t.Errorf("%d: %v, want %v", i, dst[i], want)
		}
	}
}

// BenchmarkAttendLatentHeads times 64 heads of DeepSeek-V3's widths (576,
// values 512) over 1024 positions on one goroutine: a head at a time
// (AttendLatent) against groups of 8 (AttendLatentHeads).
// Run: go test ./internal/kernels -run x -bench AttendLatentHeads -count 3
func BenchmarkAttendLatentHeads(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const w, dv, n, heads = 576, 512, 1024, 64
	q, kc := randVec(rng, heads*w), randVec(rng, n*w)
	o := make([]float32, heads*dv)
	s, sums := make([]float32, 8*n), make([]float32, 8)
	b.Run("head", func(b *testing.B) {
		for b.Loop() {
			for h := 0; h < heads; h++ {
				AttendLatent(o[h*dv:(h+1)*dv], q[h*w:(h+1)*w], kc, w, nil, n, 0.05, s[:n])
			}
		}
	})
	b.Run("group8", func(b *testing.B) {
		for b.Loop() {
			for h := 0; h < heads; h += 8 {
				AttendLatentHeads(o[h*dv:], q[h*w:], 8, w, dv, dv, kc, w, n, 0.05, s, sums)
			}
		}
	})
}

// indexFormula is the indexer's scores a key and a head at a time, as
// IndexScores defines them.
func indexFormula(sc, q []float32, heads, dim int, k []float32, n int, scale float32, ws []float32) {
	for j := range n {
		var v float32
		for h := range heads {
			x := Dot(q[h*dim:(h+1)*dim], k[j*dim:(j+1)*dim]) * scale
			v += float32(ws[h] * max(x, 0))
		}
		sc[j] = v
	}
}

// TestIndexScores: the indexer's scores a block of keys at a time, three
// heads a pass, give the bits of the formula taken a key and a head at a
// time, over head counts that are and are not multiples of three, blocks
// of several sizes (the scratch sets them) and widths with and without
// the assembly path.
func TestIndexScores(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, dim := range []int{32, 128, 40} {
		for _, heads := range []int{1, 4, 64} {
			for _, n := range []int{1, 63, 65, 200} {
				q, k := randVec(r, heads*dim), randVec(r, n*dim)
				ws := randVec(r, heads)
				want := make([]float32, n)
				indexFormula(want, q, heads, dim, k, n, 0.09, ws)
				for _, blk := range []int{64, 7} {
					got := make([]float32, n+3)
					IndexScores(got, q, heads, dim, k, n, 0.09, ws, make([]float32, heads*blk))
					for j := range n {
						if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
							t.Fatalf("dim %d, %d heads, %d keys, blocks of %d: key %d = %v, one at a time %v", dim, heads, n, blk, j, got[j], want[j])
						}
					}
					if got[n] != 0 {
						t.Fatalf("dim %d, %d heads, %d keys: wrote past its keys", dim, heads, n)
					}
				}
			}
		}
	}
}

// BenchmarkIndexScores: DeepSeek-V3.2's indexer over 4096 positions (64
// heads of 128) for one row, a key and a head at a time (the formula) and
// through IndexScores, one thread.
func BenchmarkIndexScores(b *testing.B) {
	r := rand.New(rand.NewPCG(43, 44))
	const heads, dim, n = 64, 128, 4096
	q, k, ws := randVec(r, heads*dim), randVec(r, n*dim), randVec(r, heads)
	sc := make([]float32, n)
	b.Run("formula", func(b *testing.B) {
		for b.Loop() {
			indexFormula(sc, q, heads, dim, k, n, 0.09, ws)
		}
	})
	d := make([]float32, heads*64)
	b.Run("blocks", func(b *testing.B) {
		for b.Loop() {
			IndexScores(sc, q, heads, dim, k, n, 0.09, ws, d)
		}
	})
}
