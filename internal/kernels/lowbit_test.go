package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// lowMats returns a [rows][cols] matrix of b-bit values (packed by
// quant.PackLow, the store's writer) and the same values widened to q4,
// sharing scales and biases.
func lowMats(r *rand.Rand, rows, cols, b int) (low, q4 Mat) {
	const G = format.GroupSize
	ng := cols / G
	low = Mat{Rows: rows, Cols: cols, Kind: format.Q3, Q: make([]byte, rows*cols*b/8),
		Scales: make([]float32, rows*ng), Biases: make([]float32, rows*ng)}
	if b == 2 {
		low.Kind = format.Q2
	}
	q4 = Mat{Rows: rows, Cols: cols, Kind: format.Q4, Q: make([]byte, rows*cols/2), Scales: low.Scales, Biases: low.Biases}
	var q [G]uint8
	for g := 0; g < rows*ng; g++ {
		for j := range q {
			q[j] = uint8(r.IntN(1 << b))
		}
		if g%5 == 1 {
			for j := range q {
				q[j] = 1<<b - 1 // the largest products
			}
		}
		quant.PackLow(low.Q[g*G*b/8:(g+1)*G*b/8], q[:], b)
		for j := 0; j < G/2; j++ {
			q4.Q[g*G/2+j] = q[j] | q[j+G/2]<<4
		}
		low.Scales[g] = float32(r.NormFloat64() * 0.01)
		low.Biases[g] = float32(r.NormFloat64() * 0.02)
	}
	return low, q4
}

func lowActs(r *rand.Rand, nb, cols int) []float32 {
	x := make([]float32, nb*cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		if i%97 == 3 {
			x[i] *= 40 // an outlier sets its group's int8 scale
		}
	}
	return x
}

// TestLowTwinIsWidenedQ4 checks the definition: a low-bit row's product is
// its q4 widening's, bit for bit (dotLowI8 against dotQ4I8).
func TestLowTwinIsWidenedQ4(t *testing.T) {
	r := rand.New(rand.NewPCG(91, 92))
	for _, b := range []int{3, 2} {
		for _, cols := range []int{64, 192, 768, 2048} {
			const rows = 5
			low, q4 := lowMats(r, rows, cols, b)
			ng := cols / format.GroupSize
			x := lowActs(r, 1, cols)
			x8, xs, xsum := make([]int8, cols), make([]float32, ng), make([]float32, ng)
			quantizeRow8Go(x8, xs, x)
			GroupSums(xsum, x)
			for o := 0; o < rows; o++ {
				rb := cols * b / 8
				got := dotLowI8(low.Q[o*rb:(o+1)*rb], b, low.Scales[o*ng:(o+1)*ng], low.Biases[o*ng:(o+1)*ng], x8, xs, xsum)
				want := dotQ4I8(q4.Q[o*cols/2:(o+1)*cols/2], q4.Scales[o*ng:(o+1)*ng], q4.Biases[o*ng:(o+1)*ng], x8, xs, xsum)
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("b=%d cols=%d row %d: %v, widened q4 gives %v", b, cols, o, got, want)
				}
			}
		}
	}
}

// TestLowPerm checks that each permutation is one: every value of a group
// meets exactly one activation.
func TestLowPerm(t *testing.T) {
	for _, b := range []int{3, 2} {
		var seen [format.GroupSize]bool
		for _, v := range lowPerm[b] {
			if seen[v] {
				t.Fatalf("b=%d: value %d twice", b, v)
			}
			seen[v] = true
		}
	}
}

// TestLowRowsAsm checks the assembly kernel against the Go twin bit for
// bit: 8, 16 and 40 rows, one to 32 groups.
func TestLowRowsAsm(t *testing.T) {
	if !lowAsm() {
		t.Skip("no low-bit kernel on this CPU")
	}
	r := rand.New(rand.NewPCG(93, 94))
	for _, b := range []int{3, 2} {
		for _, ng := range []int{1, 2, 3, 12, 32} {
			for _, rows := range []int{8, 16, 40} {
				cols := ng * format.GroupSize
				low, _ := lowMats(r, rows, cols, b)
				x := lowActs(r, 1, cols)
				x8, xs, xsum := make([]int8, cols), make([]float32, ng), make([]float32, ng)
				quantizeRow8Go(x8, xs, x)
				GroupSums(xsum, x)
				x8p := make([]int8, cols)
				permuteLow(x8p, x8, b)
				out := make([]float32, rows+1)
				out[rows] = 12345 // must stay
				rb := cols * b / 8
				lowRows(&low.Q[0], rb, &low.Scales[0], &low.Biases[0], ng, rows, &x8p[0], &xs[0], &xsum[0], &out[0], b, lowK)
				for o := 0; o < rows; o++ {
					want := dotLowI8(low.Q[o*rb:(o+1)*rb], b, low.Scales[o*ng:(o+1)*ng], low.Biases[o*ng:(o+1)*ng], x8, xs, xsum)
					if math.Float32bits(out[o]) != math.Float32bits(want) {
						t.Fatalf("b=%d ng=%d rows=%d: row %d %v, twin %v", b, ng, rows, o, out[o], want)
					}
				}
				if out[rows] != 12345 {
					t.Fatalf("b=%d ng=%d rows=%d: wrote past the last row", b, ng, rows)
				}
			}
		}
	}
}

// TestMatMulLow runs whole products of q3 and q2 matrices (odd row
// counts, several activation rows, one and two threads) and requires the
// products of their q4 widenings, bit for bit.
func TestMatMulLow(t *testing.T) {
	r := rand.New(rand.NewPCG(95, 96))
	p1, p2 := NewPool(1), NewPool(2)
	defer p1.Close()
	defer p2.Close()
	for _, b := range []int{3, 2} {
		for _, sh := range [][3]int{{13, 128, 1}, {37, 768, 1}, {8, 64, 3}, {203, 2048, 1}, {768, 2048, 1}, {29, 192, 5}, {45, 128, 4}, {70, 768, 17}, {2048, 768, 9}, {40, 128, 25}, {19, 256, 33}} {
			rows, cols, nb := sh[0], sh[1], sh[2]
			low, q4 := lowMats(r, rows, cols, b)
			x := lowActs(r, nb, cols)
			want := make([]float32, nb*rows)
			p1.MatMul(want, &q4, x, nb)
			for _, p := range []*Pool{p1, p2} {
				got := make([]float32, nb*rows)
				p.MatMul(got, &low, x, nb)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("b=%d %v threads=%d: out[%d] %v, widened q4 %v", b, sh, p.Threads(), i, got[i], want[i])
					}
				}
			}
			// MatMul2 (gate and up) prepares x once for both.
			g, u := make([]float32, nb*rows), make([]float32, nb*rows)
			p2.MatMul2(g, &low, u, &low, x, nb)
			for i := range g {
				if math.Float32bits(g[i]) != math.Float32bits(want[i]) || math.Float32bits(u[i]) != math.Float32bits(want[i]) {
					t.Fatalf("b=%d %v MatMul2: out[%d] %v %v, want %v", b, sh, i, g[i], u[i], want[i])
				}
			}
		}
	}
}

// BenchmarkLowDecode compares one-row products of q4, q3 and q2 matrices
// of the 30B-A3B expert shapes, on one thread, from cache (one matrix)
// and from memory (256 MiB of matrices at q4, cycled).
func BenchmarkLowDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(97, 98))
	for _, sh := range [][2]int{{768, 2048}, {2048, 768}} {
		rows, cols := sh[0], sh[1]
		for _, where := range []string{"cache", "dram"} {
			n := 1
			if where == "dram" {
				n = (256 << 20) / (rows * cols * 5 / 8)
			}
			var q3s, q2s, q4s []Mat
			for range n {
				l3, w4 := lowMats(r, rows, cols, 3)
				l2, _ := lowMats(r, rows, cols, 2)
				q3s, q2s, q4s = append(q3s, l3), append(q2s, l2), append(q4s, w4)
			}
			x := lowActs(r, 1, cols)
			out := make([]float32, rows)
			for _, k := range []struct {
				name string
				ms   []Mat
			}{{"q4", q4s}, {"q3", q3s}, {"q2", q2s}} {
				b.Run(fmt.Sprintf("%dx%d/%s/%s", rows, cols, where, k.name), func(b *testing.B) {
					var sc Scratch
					i := 0
					for b.Loop() {
						sc.MatMul(out, &k.ms[i%len(k.ms)], x, 1)
						i++
					}
				})
			}
		}
	}
}

// BenchmarkLowBatch compares the two paths of a batched low-bit product
// (a prefill chunk's expert): the decode kernel once per activation row,
// and widening to q4 tiles (lowWideRows).
func BenchmarkLowBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(99, 100))
	low, _ := lowMats(r, 768, 2048, 3)
	defer func(v int) { lowWideRows = v }(lowWideRows)
	for _, nb := range []int{4, 8, 16, 32} {
		x := lowActs(r, nb, 2048)
		out := make([]float32, nb*768)
		for _, path := range []string{"rows", "widen"} {
			b.Run(fmt.Sprintf("nb%d/%s", nb, path), func(b *testing.B) {
				lowWideRows = 1 << 30
				if path == "widen" {
					lowWideRows = 1
				}
				var sc Scratch
				for b.Loop() {
					sc.MatMul(out, &low, x, nb)
				}
			})
		}
	}
}
