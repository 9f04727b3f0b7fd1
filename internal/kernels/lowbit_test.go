package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

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
		Scales: make([]uint16, rows*ng), Biases: make([]uint16, rows*ng)}
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
		low.Scales[g] = quant.F16(float32(r.NormFloat64() * 0.01))
		low.Biases[g] = quant.F16(float32(r.NormFloat64() * 0.02))
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
				got := dotLowI8(low.Q[o*rb:(o+1)*rb], b, low.sf()[o*ng:(o+1)*ng], low.bf()[o*ng:(o+1)*ng], x8, xs, xsum)
				want := dotQ4I8(q4.Q[o*cols/2:(o+1)*cols/2], q4.sf()[o*ng:(o+1)*ng], q4.bf()[o*ng:(o+1)*ng], x8, xs, xsum)
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

// lowKernel is one of the low-bit decode kernels: rows a multiple of
// step, run when avail(b).
type lowKernel struct {
	name  string
	step  int
	avail func(b int) bool
	run   func(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)
}

var lowKernels = []lowKernel{
	{"avx2", 8, func(int) bool { return lowAsm() }, lowRows},
	{"avx512", 16, lowVNNI, lowRowsVNNI},
}

// lowCase is a low-bit matrix with one quantised activation row: x8 as
// the Go twin takes it and x8p as the kernels do.
type lowCase struct {
	w           Mat
	x8, x8p     []int8
	xs, xsum    []float32
	rb, qstride int
}

// newLowCase makes a rows×cols matrix of b bits whose rows lie qstride ≥
// cols·b/8 bytes apart (the kernels' qstride, padding between rows).
func newLowCase(r *rand.Rand, rows, cols, b, pad int) *lowCase {
	ng := cols / format.GroupSize
	low, _ := lowMats(r, rows, cols, b)
	c := &lowCase{w: low, rb: cols * b / 8, qstride: cols*b/8 + pad}
	if pad > 0 {
		q := make([]byte, rows*c.qstride)
		for o := 0; o < rows; o++ {
			copy(q[o*c.qstride:], low.Q[o*c.rb:(o+1)*c.rb])
			for k := c.rb; k < c.qstride; k++ {
				q[o*c.qstride+k] = 0xff // garbage the kernels must not read
			}
		}
		c.w.Q = q
	}
	x := lowActs(r, 1, cols)
	c.x8, c.xs, c.xsum = make([]int8, cols), make([]float32, ng), make([]float32, ng)
	quantizeRow8Go(c.x8, c.xs, x)
	GroupSums(c.xsum, x)
	c.x8p = make([]int8, cols)
	permuteLow(c.x8p, c.x8, b)
	return c
}

// want is dotLowI8 of row o.
func (c *lowCase) want(o int) float32 {
	ng := len(c.xs)
	b := c.w.Kind.Bits()
	q := c.w.Q[o*c.qstride : o*c.qstride+c.rb]
	return dotLowI8(q, b, c.w.sf()[o*ng:(o+1)*ng], c.w.bf()[o*ng:(o+1)*ng], c.x8, c.xs, c.xsum)
}

// TestLowRowsKernels checks each assembly kernel against the Go twin bit
// for bit: one to two tiles and an odd count of them, one to 32 groups
// (one, two and an odd count at the edges of the group loop), rows
// contiguous and padded apart. A kernel the CPU lacks is skipped, and
// says so.
func TestLowRowsKernels(t *testing.T) {
	for _, k := range lowKernels {
		for _, b := range []int{3, 2} {
			t.Run(fmt.Sprintf("%s/q%d", k.name, b), func(t *testing.T) {
				if !k.avail(b) {
					t.Skipf("%s q%d kernel not available on this CPU", k.name, b)
				}
				r := rand.New(rand.NewPCG(93, uint64(94+b)))
				for _, ng := range []int{1, 2, 3, 12, 32} {
					for _, tiles := range []int{1, 2, 5} {
						for _, pad := range []int{0, 8} {
							rows := tiles * k.step
							c := newLowCase(r, rows, ng*format.GroupSize, b, pad)
							out := make([]float32, rows+1)
							out[rows] = 12345 // must stay
							k.run(&c.w.Q[0], c.qstride, &c.w.sf()[0], &c.w.bf()[0], ng, rows, &c.x8p[0], &c.xs[0], &c.xsum[0], &out[0], b, lowK)
							for o := 0; o < rows; o++ {
								if want := c.want(o); math.Float32bits(out[o]) != math.Float32bits(want) {
									t.Fatalf("ng=%d rows=%d pad=%d: row %d %v, twin %v", ng, rows, pad, o, out[o], want)
								}
							}
							if out[rows] != 12345 {
								t.Fatalf("ng=%d rows=%d pad=%d: wrote past the last row", ng, rows, pad)
							}
						}
					}
				}
			})
		}
	}
}

// TestLowPaths runs decode-sized products (fewer activation rows than
// lowWideRows) of q3 and q2 matrices on every kernel path this CPU has:
// the Go twin, AVX2 (8-row tiles) and AVX-512 (16-row tiles, a last 8
// rows through AVX2), on one thread and on three (parts that start and
// end off the tiles), and requires dotLowI8 of every row bit for bit.
// Row counts put every remainder at the end of a 64-row step: none, 8
// rows, 8 plus a few, a few alone.
func TestLowPaths(t *testing.T) {
	p1, p3 := NewPool(1), NewPool(3)
	defer p1.Close()
	defer p3.Close()
	for _, path := range []q4Path{{"go", false, false}, {"avx2", true, false}, {"avx512", true, true}} {
		for _, b := range []int{3, 2} {
			t.Run(fmt.Sprintf("%s/q%d", path.name, b), func(t *testing.T) {
				if path.avx2 && !lowAsm() || path.vnni && !lowVNNI(b) {
					t.Skipf("%s q%d kernel not available on this CPU", path.name, b)
				}
				r := rand.New(rand.NewPCG(101, uint64(102+b)))
				for _, sh := range [][2]int{{16, 64}, {8, 128}, {24, 64}, {40, 192}, {64, 128}, {88, 64}, {200, 320}, {13, 64}, {31, 256}, {61, 128}, {83, 2048}} {
					rows, cols := sh[0], sh[1]
					c := newLowCase(r, rows, cols, b, 0)
					for _, nb := range []int{1, 3} {
						// Activation rows after the first repeat it, so that
						// c.want holds for every row.
						x := lowActs(r, 1, cols)
						c.x8, c.xs, c.xsum = make([]int8, cols), make([]float32, cols/format.GroupSize), make([]float32, cols/format.GroupSize)
						quantizeRow8Go(c.x8, c.xs, x)
						GroupSums(c.xsum, x)
						xb := make([]float32, 0, nb*cols)
						for range nb {
							xb = append(xb, x...)
						}
						for _, p := range []*Pool{p1, p3} {
							got := make([]float32, nb*rows)
							withQ4Path(path.avx2, path.vnni, func() { p.MatMul(got, &c.w, xb, nb) })
							for i, v := range got {
								if want := c.want(i % rows); math.Float32bits(v) != math.Float32bits(want) {
									t.Fatalf("%dx%d nb=%d threads=%d: out[%d] %v, dotLowI8 %v", rows, cols, nb, p.Threads(), i, v, want)
								}
							}
						}
					}
				}
			})
		}
	}
}

// TestLowUnpack512 follows the AVX-512 kernel's unpacking of a pair of
// groups through the instructions' definitions (VPERMB, VPMULTISHIFTQB
// and the mask for q3; the lane broadcasts, shifts and masks for q2), on
// any CPU, and checks that byte d of vector h holds what the AVX2 order
// (lowValue) puts at byte 32h + d%32, of row A for d < 32 and row B
// after: the kernels share the permuted activations.
func TestLowUnpack512(t *testing.T) {
	const G = format.GroupSize
	r := rand.New(rand.NewPCG(103, 104))
	for _, b := range []int{3, 2} {
		gb := G * b / 8
		for trial := 0; trial < 200; trial++ {
			var vals [2][G]uint8 // rows A, B
			var packed [2][]byte
			for row := range vals {
				for i := range vals[row] {
					vals[row][i] = uint8(r.IntN(1 << b))
				}
				packed[row] = make([]byte, gb)
				quant.PackLow(packed[row], vals[row][:], b)
			}
			var vec [2][64]byte
			if b == 3 {
				var reg [64]byte // the masked loads: A at byte 0, B at 32
				copy(reg[:], packed[0])
				copy(reg[32:], packed[1])
				for h := range vec {
					var p [64]byte
					for d := range p {
						p[d] = reg[lowK.perm3[h][d]&63]
					}
					for d := range vec[h] {
						q := uint64(0)
						for k := 0; k < 8; k++ {
							q |= uint64(p[d&^7+k]) << (8 * k)
						}
						sh := uint(lowK.mshift3[h][d] & 63)
						vec[h][d] = byte(q>>sh|q<<(64-sh)) & 7
					}
				}
			} else {
				var reg [64]byte // A's bytes in lanes 0 and 1, B's in 2 and 3
				for L := 0; L < 4; L++ {
					copy(reg[16*L:], packed[L/2])
				}
				for i := 0; i < 16; i++ { // VPSRLVD
					dw := uint32(reg[4*i]) | uint32(reg[4*i+1])<<8 | uint32(reg[4*i+2])<<16 | uint32(reg[4*i+3])<<24
					dw >>= lowK.shift2[i]
					reg[4*i], reg[4*i+1], reg[4*i+2], reg[4*i+3] = byte(dw), byte(dw>>8), byte(dw>>16), byte(dw>>24)
				}
				for d := range vec[0] {
					vec[0][d] = reg[d] & 3
				}
				for i := 0; i < 32; i++ { // VPSRLW $2
					w := (uint16(reg[2*i]) | uint16(reg[2*i+1])<<8) >> 2
					vec[1][2*i], vec[1][2*i+1] = byte(w)&3, byte(w>>8)&3
				}
			}
			for h := range vec {
				for d, got := range vec[h] {
					if want := vals[d/32][lowValue(b, 32*h+d%32)]; got != want {
						t.Fatalf("q%d trial %d: vector %d byte %d holds %d, want value %d = %d", b, trial, h, d, got, lowValue(b, 32*h+d%32), want)
					}
				}
			}
		}
	}
}

// TestLowTabOffsets pins the lowTab offsets the assembly uses.
func TestLowTabOffsets(t *testing.T) {
	var k lowTab
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"shuf", unsafe.Offsetof(k.shuf), 0}, {"mul", unsafe.Offsetof(k.mul), 128},
		{"ones", unsafe.Offsetof(k.ones), 256}, {"m3", unsafe.Offsetof(k.m3), 288},
		{"shift", unsafe.Offsetof(k.shift), 320}, {"iota", unsafe.Offsetof(k.iota), 352},
		{"perm3", unsafe.Offsetof(k.perm3), 384}, {"mshift3", unsafe.Offsetof(k.mshift3), 512},
		{"shift2", unsafe.Offsetof(k.shift2), 640}, {"iota16", unsafe.Offsetof(k.iota16), 704},
	} {
		if c.got != c.want {
			t.Errorf("lowTab.%s at %d, the assembly reads it at %d", c.name, c.got, c.want)
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

// BenchmarkLowRows compares the AVX2 and AVX-512 decode kernels on the
// same data: one activation row against a 768×2048 q3 or q2 matrix (the
// 30B-A3B gate and up shape), from the L2 cache (one matrix, 0.79 MB at
// q3 with its scales and biases) and from memory (1 GiB of matrices,
// cycled, past any L3). The bytes per second count the weights, scales
// and biases read.
func BenchmarkLowRows(b *testing.B) {
	const rows, cols = 768, 2048
	const G = format.GroupSize
	ng := cols / G
	r := rand.New(rand.NewPCG(105, 106))
	x := lowActs(r, 1, cols)
	x8, xs, xsum := make([]int8, cols), make([]float32, ng), make([]float32, ng)
	quantizeRow8Go(x8, xs, x)
	GroupSums(xsum, x)
	out := make([]float32, rows)
	for _, where := range []string{"l2", "dram"} {
		for _, bits := range []int{3, 2} {
			rb := cols * bits / 8
			size := rows * (rb + 2*2*ng)
			n := 1
			if where == "dram" {
				n = (1 << 30) / size
			}
			// Any bytes are a valid bit stream: random ones will do.
			ms := make([]Mat, n)
			fs := make([][2][]float32, n) // the kernels' widened scales and biases
			for i := range ms {
				m := Mat{Rows: rows, Cols: cols, Kind: format.Q3, Q: make([]byte, rows*rb),
					Scales: make([]uint16, rows*ng), Biases: make([]uint16, rows*ng)}
				if bits == 2 {
					m.Kind = format.Q2
				}
				for j := 0; j+8 <= len(m.Q); j += 8 {
					binary.LittleEndian.PutUint64(m.Q[j:], r.Uint64())
				}
				for j := range m.Scales {
					m.Scales[j], m.Biases[j] = quant.F16(float32(r.NormFloat64()*0.01)), quant.F16(float32(r.NormFloat64()*0.02))
				}
				ms[i] = m
				fs[i] = [2][]float32{m.sf(), m.bf()}
			}
			x8p := make([]int8, cols)
			permuteLow(x8p, x8, bits)
			for _, k := range lowKernels {
				b.Run(fmt.Sprintf("%s/q%d/%s", where, bits, k.name), func(b *testing.B) {
					if !k.avail(bits) {
						b.Skipf("%s q%d kernel not available on this CPU", k.name, bits)
					}
					b.SetBytes(int64(size))
					i := 0
					for b.Loop() {
						m, f := &ms[i%len(ms)], &fs[i%len(ms)]
						k.run(&m.Q[0], rb, &f[0][0], &f[1][0], ng, rows, &x8p[0], &xs[0], &xsum[0], &out[0], bits, lowK)
						i++
					}
				})
			}
		}
	}
}
