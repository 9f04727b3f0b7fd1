package kernels

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// mxMat builds an MXFP4 matrix through the packer's encoder and MatFrom,
// and returns the values it decodes to (quant.DecodeMXFP4).
func mxMat(t testing.TB, w []float32, rows, cols int) (Mat, []float32) {
	t.Helper()
	enc, err := quant.Encode(w, rows, cols, format.MXFP4)
	if err != nil {
		t.Fatal(err)
	}
	vb, _ := format.MXFP4.Sizes(rows, cols)
	tn := format.Tensor{Name: "w", Kind: format.MXFP4, Shape: []int{rows, cols}, Size: vb}
	m, err := MatFrom(enc.Values, &tn)
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	quant.DecodeMXFP4(deq, enc.Values, rows, cols)
	return m, deq
}

// mxCase is an MXFP4 product with raw operands reaching the extremes: codes
// ±6 (mxCode ±12) and ±0, activations ±127, scale bytes 0, 1 and 254
// (subnormal and the largest factors), zero blocks.
type mxCase struct {
	w          Mat
	x8         []int8
	xs         []float32
	rows, cols int
	nb         int
}

func newMXCase(r *rand.Rand, rows, cols, nb int) *mxCase {
	nblk, ng := cols/format.MXBlock, cols/format.GroupSize
	c := &mxCase{rows: rows, cols: cols, nb: nb}
	c.w = Mat{Rows: rows, Cols: cols, Kind: format.MXFP4, Q: make([]byte, rows*cols/2), E8: make([]byte, rows*nblk)}
	for i := range c.w.Q {
		switch r.IntN(8) {
		case 0:
			c.w.Q[i] = 0x77
		case 1:
			c.w.Q[i] = 0xff
		case 2:
			c.w.Q[i] = 0x80
		default:
			c.w.Q[i] = byte(r.IntN(256))
		}
	}
	for i := range c.w.E8 {
		switch r.IntN(10) {
		case 0:
			c.w.E8[i] = 0
		case 1:
			c.w.E8[i] = 1
		case 2:
			c.w.E8[i] = 254
		default:
			c.w.E8[i] = byte(112 + r.IntN(20))
		}
	}
	c.x8 = make([]int8, nb*cols)
	for i := range c.x8 {
		switch r.IntN(6) {
		case 0:
			c.x8[i] = 127
		case 1:
			c.x8[i] = -127
		default:
			c.x8[i] = int8(r.IntN(255) - 127)
		}
	}
	c.xs = make([]float32, nb*ng)
	for i := range c.xs {
		c.xs[i] = float32(math.Abs(r.NormFloat64())) / 127
	}
	if nblk > 1 {
		clear(c.w.Q[:format.MXBlock/2])
		clear(c.x8[format.MXBlock : 2*format.MXBlock])
	}
	return c
}

func (c *mxCase) want(b, o int) float32 {
	C, nblk, ng := c.cols, c.cols/format.MXBlock, c.cols/format.GroupSize
	return dotMXFP4I8(c.w.Q[o*C/2:(o+1)*C/2], c.w.E8[o*nblk:(o+1)*nblk], c.x8[b*C:(b+1)*C], c.xs[b*ng:(b+1)*ng])
}

func (c *mxCase) run(splits ...int) []float32 {
	out := make([]float32, c.nb*c.rows)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	t := matmulTask{out: out, xs: c.xs, x8: c.x8, w: &c.w, nb: c.nb}
	lo := 0
	for _, s := range append(splits, c.rows) {
		t.Run(lo, s)
		lo = s
	}
	return out
}

// TestMXFP4Kernels: every path (Go twin, AVX2, AVX-512) gives the Go
// twin's bits for row counts and thread splits of every size, column
// counts with and without a tail of fewer than eight blocks, and
// activation row counts from decode to a prefill batch.
func TestMXFP4Kernels(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, p := range q4Paths() {
		for _, sh := range [][2]int{{1, 64}, {16, 64}, {7, 256}, {37, 128}, {5, 320}, {64, 256}, {256, 64}, {24, 192}, {33, 576}, {9, 2880}} {
			for _, nb := range []int{1, 2, 3, 8, 17} {
				rows, cols := sh[0], sh[1]
				c := newMXCase(r, rows, cols, nb)
				var out, gotMM, wantMM []float32
				withQ4Path(p.avx2, p.vnni, func() {
					out = c.run(rows/3, rows/3+1, rows-rows/4)
					gotMM, wantMM = c.viaScratch() // the activations prepared: mxfp4Rows16
				})
				for b := 0; b < nb; b++ {
					for o := 0; o < rows; o++ {
						if got, want := out[b*rows+o], c.want(b, o); math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s [%d %d] nb %d: row %d out %d: %v, Go twin %v", p.name, rows, cols, nb, b, o, got, want)
						}
						if got, want := gotMM[b*rows+o], wantMM[b*rows+o]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s [%d %d] nb %d: MatMul row %d out %d: %v, Go twin %v", p.name, rows, cols, nb, b, o, got, want)
						}
					}
				}
			}
		}
	}
}

// TestMXFP4Extremes saturates every block: codes ±6 against activations
// ±127, the largest block sums (32·12·127; 32·24·127 in the tile kernel's
// biased form).
func TestMXFP4Extremes(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	for _, p := range q4Paths() {
		for i, code := range []byte{0x77, 0xff, 0x7f, 0x77, 0xff, 0x7f} {
			c := newMXCase(r, 20, 576, 1+4*(i/3)) // the row kernel, then the tile one
			for i := range c.w.Q {
				c.w.Q[i] = code
			}
			for i := range c.x8 {
				c.x8[i] = 127
				if i/format.MXBlock%3 == 1 {
					c.x8[i] = -127
				}
			}
			var out []float32
			withQ4Path(p.avx2, p.vnni, func() { out = c.run(9) })
			for b := 0; b < c.nb; b++ {
				for o := 0; o < c.rows; o++ {
					if got, want := out[b*c.rows+o], c.want(b, o); math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s code %#x: row %d out %d: %v, Go twin %v", p.name, code, b, o, got, want)
					}
				}
			}
		}
	}
}

// TestMXFP4Product checks the kernels' reading of the format against the
// packer's: through Scratch.MatMul on every path, W·x is within float
// rounding of the float64 product of quant.DecodeMXFP4's weights and the
// int8 activations QuantizeRow8 made, and Mat.Row decodes as quant does.
func TestMXFP4Product(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	rows, cols, nb := 70, 576, 5
	w := randVec(r, rows*cols)
	m, deq := mxMat(t, w, rows, cols)
	row := make([]float32, cols)
	for o := 0; o < rows; o++ {
		m.Row(row, o)
		for i, v := range row {
			if v != deq[o*cols+i] {
				t.Fatalf("Row(%d)[%d] = %v, quant decodes %v", o, i, v, deq[o*cols+i])
			}
		}
	}
	x := randVec(r, nb*cols)
	ng := cols / format.GroupSize
	x8, xs := make([]int8, nb*cols), make([]float32, nb*ng)
	for b := 0; b < nb; b++ {
		quantizeRow8Go(x8[b*cols:(b+1)*cols], xs[b*ng:(b+1)*ng], x[b*cols:(b+1)*cols])
	}
	for _, p := range q4Paths() {
		out := make([]float32, nb*rows)
		withQ4Path(p.avx2, p.vnni, func() {
			var sc Scratch
			sc.MatMul(out, &m, x, nb)
		})
		for b := 0; b < nb; b++ {
			for o := 0; o < rows; o++ {
				var want, mag float64
				for i := 0; i < cols; i++ {
					v := float64(deq[o*cols+i]) * float64(xs[b*ng+i/format.GroupSize]) * float64(x8[b*cols+i])
					want += v
					mag += math.Abs(v)
				}
				if got := float64(out[b*rows+o]); math.Abs(got-want) > 1e-5*mag {
					t.Fatalf("%s: row %d out %d = %v, float64 product %v", p.name, b, o, got, want)
				}
			}
		}
	}
}

// TestMXFP4Encode: values that are MXFP4 values encode back exactly (signed
// zeros too), and others round to a nearest one.
func TestMXFP4Encode(t *testing.T) {
	r := rand.New(rand.NewPCG(67, 68))
	rows, cols := 6, 64
	w := make([]float32, rows*cols)
	for g := 0; g < rows*cols/format.MXBlock; g++ {
		e := 100 + r.IntN(40)
		if g == 1 {
			e = 0
		}
		for i := 0; i < format.MXBlock; i++ {
			w[g*format.MXBlock+i] = quant.MXFP4Value(byte(r.IntN(16)), byte(e))
		}
	}
	w[5] = float32(math.Copysign(0, -1))
	_, deq := mxMat(t, w, rows, cols)
	for i := range w {
		if math.Float32bits(deq[i]) != math.Float32bits(w[i]) {
			t.Fatalf("value %d: %v encodes to %v", i, w[i], deq[i])
		}
	}
	if _, err := quant.Encode([]float32{float32(math.Inf(1))}, 1, 1, format.MXFP4); err == nil {
		t.Fatal("one column: no error")
	}
}

// BenchmarkMXFP4Paths times the MXFP4 kernels on the tiny gpt-oss expert
// shapes and a gpt-oss-20b one, at decode and at a small batch.
func BenchmarkMXFP4Paths(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range []struct{ rows, cols, nb int }{{64, 256, 1}, {256, 64, 1}, {2880, 2880, 1}, {64, 256, 16}} {
		m, _ := mxMat(b, randVec(r, sh.rows*sh.cols), sh.rows, sh.cols)
		x := randVec(r, sh.nb*sh.cols)
		out := make([]float32, sh.nb*sh.rows)
		for _, p := range q4Paths() {
			b.Run(fmt.Sprintf("%dx%d/nb%d/%s", sh.rows, sh.cols, sh.nb, p.name), func(b *testing.B) {
				withQ4Path(p.avx2, p.vnni, func() {
					var sc Scratch
					for b.Loop() {
						sc.MatMul(out, &m, x, sh.nb)
					}
				})
				b.ReportMetric(float64(sh.rows*sh.cols*sh.nb)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// TestMXFP4PrepTile: the AVX-512 tile rearrangement writes the Go one's
// bytes, full and partial tiles.
func TestMXFP4PrepTile(t *testing.T) {
	if !useVNNI {
		t.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(69, 70))
	c := newMXCase(r, 40, 320, 1)
	nblk := 320 / format.MXBlock
	for _, n := range []int{16, 7, 1} {
		a, b := make([]byte, nblk*mxTileBytes), make([]byte, nblk*mxTileBytes)
		for i := range b {
			b[i] = 0xaa // a partial tile must be cleared
		}
		withQ4Path(true, false, func() { mxPrepTile(a, &c.w, 17, n) })
		withQ4Path(true, true, func() { mxPrepTile(b, &c.w, 17, n) })
		if !slices.Equal(a, b) {
			t.Fatalf("n %d: AVX-512 tile differs from Go's", n)
		}
	}
}

// mxTiledCopy is a copy of m (MXFP4) in the tiled layout, the same bytes
// from the AVX-512 rearrangement and the Go one.
func mxTiledCopy(m Mat) Mat {
	m.Q, m.E8 = slices.Clone(m.Q), slices.Clone(m.E8)
	g := Mat{Q: slices.Clone(m.Q), E8: slices.Clone(m.E8)}
	TileMXFP4(m.Q, m.E8, m.Rows, m.Cols, nil)
	withQ4Path(useAVX2, false, func() { TileMXFP4(g.Q, g.E8, m.Rows, m.Cols, nil) })
	if !bytes.Equal(m.Q, g.Q) || !bytes.Equal(m.E8, g.E8) {
		panic("TileMXFP4: the AVX-512 rearrangement differs from Go's")
	}
	m.Tiled = true
	return m
}

// BenchmarkTileMXFP4 rearranges a gpt-oss expert matrix (2880×2880) into
// the tiled layout, as loaders do once a record.
func BenchmarkTileMXFP4(b *testing.B) {
	const rows, cols = 2880, 2880
	q, e8 := make([]byte, rows*cols/2), make([]byte, rows*cols/format.MXBlock)
	var tmp []byte
	b.SetBytes(int64(len(q) + len(e8)))
	for b.Loop() {
		tmp = TileMXFP4(q, e8, rows, cols, tmp)
	}
}

// TestTileMXFP4Layout: TileMXFP4 puts dword j of row r's block b at
// b·256 + j·64 + r·4 from its tile's first code byte and the row's scale
// byte of block b at b·16 + r from the tile's first scale byte, leaving
// the rows after the last whole tile alone; rowMX and Row give the rows
// back.
func TestTileMXFP4Layout(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, rows := range []int{5, 16, 21, 48} {
		for _, cols := range []int{64, 192, 2880} {
			c := newMXCase(r, rows, cols, 1)
			flat := c.w
			m := mxTiledCopy(flat)
			rb, nblk := cols/2, cols/format.MXBlock
			for row := range rows {
				for b := range nblk {
					for j := range 4 {
						at := row*rb + b*16 + j*4
						if row < rows/16*16 {
							at = row/16*16*rb + b*256 + j*64 + row%16*4
						}
						if !bytes.Equal(m.Q[at:at+4], flat.Q[row*rb+b*16+j*4:][:4]) {
							t.Fatalf("%d×%d: row %d block %d dword %d is not at byte %d", rows, cols, row, b, j, at)
						}
					}
					at := row*nblk + b
					if row < rows/16*16 {
						at = row/16*16*nblk + b*16 + row%16
					}
					if m.E8[at] != flat.E8[row*nblk+b] {
						t.Fatalf("%d×%d: row %d block %d's scale is not at byte %d", rows, cols, row, b, at)
					}
				}
				q, e8 := m.rowMX(row, nil, nil)
				if !bytes.Equal(q, flat.Q[row*rb:(row+1)*rb]) || !bytes.Equal(e8, flat.E8[row*nblk:(row+1)*nblk]) {
					t.Fatalf("%d×%d: rowMX(%d) differs from the row", rows, cols, row)
				}
				got, want := make([]float32, cols), make([]float32, cols)
				m.Row(got, row)
				flat.Row(want, row)
				if !slices.Equal(got, want) {
					t.Fatalf("%d×%d: Row(%d) of the tiled matrix differs", rows, cols, row)
				}
			}
		}
	}
}

// TestMXFP4PrepX: the assembly's permutations and block sums are the Go
// twins'.
func TestMXFP4PrepX(t *testing.T) {
	if !useVNNI {
		t.Skip("no AVX-512 VNNI")
	}
	r := rand.New(rand.NewPCG(73, 74))
	for _, cols := range []int{64, 320, 2880} {
		c := newMXCase(r, 1, cols, 1)
		nblk := cols / format.MXBlock
		xa, xb := make([]int8, cols), make([]int8, cols)
		sa, sb := make([]int32, nblk), make([]int32, nblk)
		mxPermX(xa, sa, c.x8)
		mxPrepX(xb, sb, c.x8)
		if !slices.Equal(xa, xb) || !slices.Equal(sa, sb) {
			t.Fatalf("%d columns: assembly permutation %v, block sums %v", cols, slices.Equal(xa, xb), slices.Equal(sa, sb))
		}
		mxPermRows(xa, sa, c.x8)
		mxPrepRows(xb, sb, c.x8)
		if !slices.Equal(xa, xb) || !slices.Equal(sa, sb) {
			t.Fatalf("%d columns: assembly row-kernel permutation %v, block sums %v", cols, slices.Equal(xa, xb), slices.Equal(sa, sb))
		}
	}
}

// TestMXFP4Tiled: products with a tiled matrix give the row-major
// matrix's bits (dotMXFP4I8) on every path, the decode kernel and its Go
// twin, the batched kernel from stored tiles, and the gathered rows of
// parts that do not start on a tile, with scale bytes at both ends of
// their range.
func TestMXFP4Tiled(t *testing.T) {
	r := rand.New(rand.NewPCG(75, 76))
	for _, p := range q4Paths() {
		for _, sh := range [][2]int{{16, 64}, {37, 128}, {48, 576}, {21, 320}, {64, 2880}} {
			for _, nb := range []int{1, 2, 3, 4, 8, 17} {
				rows, cols := sh[0], sh[1]
				c := newMXCase(r, rows, cols, nb)
				for i := range c.w.E8 {
					if i%53 == 7 {
						c.w.E8[i] = 255 // 2^127, with xs small enough to stay finite
					}
				}
				want := make([]float32, nb*rows)
				for b := range nb {
					for o := range rows {
						want[b*rows+o] = c.want(b, o)
					}
				}
				tc := *c
				tc.w = mxTiledCopy(c.w)
				var out, gotMM, wantMM []float32
				withQ4Path(p.avx2, p.vnni, func() {
					out = tc.runTiled(rows/3, rows/3+1, rows-rows/4)
					gotMM, wantMM = tc.viaScratch()
				})
				for i := range want {
					if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s [%d %d] nb %d: out %d: %v, row-major %v", p.name, rows, cols, nb, i, out[i], want[i])
					}
					if math.Float32bits(gotMM[i]) != math.Float32bits(wantMM[i]) {
						t.Fatalf("%s [%d %d] nb %d: MatMul out %d: %v, row-major %v", p.name, rows, cols, nb, i, gotMM[i], wantMM[i])
					}
				}
				if nb == 1 && cols%format.GroupSize == 0 {
					// The Go twin of the decode kernel reads the layout alike.
					nblk, ng := cols/format.MXBlock, cols/format.GroupSize
					xp, sx := make([]int8, cols), make([]int32, nblk)
					mxPermX(xp, sx, c.x8)
					n := rows / 16
					got := make([]float32, 16*n)
					mxfp4TiledGo(tc.w.Q, tc.w.E8, nblk, n, xp, sx, c.xs[:ng], got)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("Go twin [%d %d]: row %d: %v, row-major %v", rows, cols, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// runTiled runs the product as a thread's parts do, split at splits, with
// the activations prepared as Scratch.prepare prepares them.
func (c *mxCase) runTiled(splits ...int) []float32 {
	out := make([]float32, c.nb*c.rows)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	t := matmulTask{out: out, xs: c.xs, x8: c.x8, w: &c.w, nb: c.nb}
	if mxTiledReady(&c.w) && c.nb < mxTileMinRows {
		nblk := c.cols / format.MXBlock
		t.x8p, t.sx12 = make([]int8, len(c.x8)), make([]int32, c.nb*nblk)
		for r := range c.nb {
			mxPrepX(t.x8p[r*c.cols:(r+1)*c.cols], t.sx12[r*nblk:(r+1)*nblk], c.x8[r*c.cols:(r+1)*c.cols])
		}
	}
	lo := 0
	for _, s := range append(splits, c.rows) {
		t.Run(lo, s)
		lo = s
	}
	return out
}

// viaScratch runs the product through Scratch.MatMul from float
// activations near c's, and returns it with the row-major rows' products
// (dotMXFP4I8) of the int8 activations MatMul quantises them to.
func (c *mxCase) viaScratch() (got, want []float32) {
	ng := c.cols / format.GroupSize
	x := make([]float32, c.nb*c.cols)
	for i := range x {
		x[i] = float32(c.x8[i]) * c.xs[i/format.GroupSize]
	}
	x8, xs := make([]int8, len(x)), make([]float32, c.nb*ng)
	for b := range c.nb {
		quantizeRow8Go(x8[b*c.cols:(b+1)*c.cols], xs[b*ng:(b+1)*ng], x[b*c.cols:(b+1)*c.cols])
	}
	want = make([]float32, c.nb*c.rows)
	for o := range c.rows {
		q, e8 := c.w.rowMX(o, nil, nil)
		for b := range c.nb {
			want[b*c.rows+o] = dotMXFP4I8(q, e8, x8[b*c.cols:(b+1)*c.cols], xs[b*ng:(b+1)*ng])
		}
	}
	got = make([]float32, c.nb*c.rows)
	var sc Scratch
	sc.MatMul(got, &c.w, x, c.nb)
	return got, want
}
