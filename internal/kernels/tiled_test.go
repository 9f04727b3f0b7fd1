package kernels

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
)

// tiledCopy is a copy of m (q4) with its weights tiled.
func tiledCopy(m Mat) Mat {
	m.Q = slices.Clone(m.Q)
	TileQ4(m.Q, m.Rows, m.Cols, nil)
	m.Tiled = true
	return m
}

// TestTileQ4Layout: TileQ4 puts bytes 8k..8k+7 of group g of a tile's
// row r at g·256 + k·64 + r·8 bytes from the tile's start and leaves the
// rows after the last whole tile alone; rowQ4, untile and FlatQ give the
// rows back.
func TestTileQ4Layout(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, rows := range []int{3, 8, 13, 24} {
		for _, cols := range []int{64, 192, 2048} {
			c := newQ4Case(r, rows, cols, 1)
			flat := c.w
			m := tiledCopy(flat)
			rb := cols / 2
			for row := range rows {
				want := flat.Q[row*rb : (row+1)*rb]
				for g := range cols / format.GroupSize {
					for k := range 4 {
						at := row*rb + g*32 + k*8 // row-major, after the last tile
						if row < rows/8*8 {
							at = row/8*8*rb + g*256 + k*64 + row%8*8
						}
						if !bytes.Equal(m.Q[at:at+8], want[g*32+k*8:g*32+k*8+8]) {
							t.Fatalf("%d×%d: row %d group %d qword %d is not at byte %d", rows, cols, row, g, k, at)
						}
					}
				}
				if got := m.rowQ4(row, nil); !bytes.Equal(got, want) {
					t.Fatalf("%d×%d: rowQ4(%d) differs from the row", rows, cols, row)
				}
			}
			for t0 := 0; t0+8 <= rows; t0 += 8 {
				tile := m.Q[t0*rb : (t0+8)*rb]
				want := flat.Q[t0*rb : (t0+8)*rb]
				got := make([]byte, len(tile))
				untile(got, tile, rb)
				goTwin := make([]byte, len(tile))
				untileGo(goTwin, tile, rb)
				if !bytes.Equal(got, want) || !bytes.Equal(goTwin, want) {
					t.Fatalf("%d×%d: untile of the tile at row %d differs from its rows (Go twin equal: %v)", rows, cols, t0, bytes.Equal(goTwin, want))
				}
			}
			if !bytes.Equal(m.FlatQ(), flat.Q) {
				t.Fatalf("%d×%d: FlatQ differs from the row-major weights", rows, cols)
			}
		}
	}
}

// TestTiles: q4 matrices of a whole tile of rows or more are tiled, but
// for rows of an odd number of groups where the decode has the 512-bit
// variant on an AMD CPU; others never.
func TestTiles(t *testing.T) {
	r := rand.New(rand.NewPCG(67, 68))
	for _, c := range []struct {
		rows, cols int
		kind       format.Kind
		want       bool
	}{
		{8, 128, format.Q4, true},
		{16, 2048, format.Q4, true},
		{7, 128, format.Q4, false},
		{8, 192, format.Q4, !amdZMM},
		{16, 2880, format.Q4, !amdZMM},
		{8, 128, format.Q8, false},
	} {
		m, _ := encodeMat(t, randVec(r, c.rows*c.cols), c.rows, c.cols, c.kind)
		if got := Tiles(&m); got != c.want {
			t.Errorf("%v %d×%d: Tiles %v, want %v (amdZMM %v)", c.kind, c.rows, c.cols, got, c.want, amdZMM)
		}
	}
}

// TestQ4RowsTiled: the decode kernel on tiled weights gives the Go twin's
// bits in every variant.
func TestQ4RowsTiled(t *testing.T) {
	if !useAVX2 || !q4RowsTiles {
		t.Skip("no tiled decode kernel")
	}
	r := rand.New(rand.NewPCG(63, 64))
	for _, cols := range []int{64, 128, 192, 320, 768, 1088, 2048, 8256} {
		// One tile, a pair, a pair and one, two pairs and one.
		for _, rows := range []int{8, 16, 24, 40} {
			c := newQ4Case(r, rows, cols, 2)
			m := tiledCopy(c.w)
			ng := cols / format.GroupSize
			for _, mode := range q4RowsModes() {
				for b := 0; b < c.nb; b++ {
					out := make([]float32, rows)
					for i := range out {
						out[i] = float32(math.NaN())
					}
					q4Rows(&m.Q[0], cols/2, &m.Scales[0], &m.Biases[0], ng, rows, &c.x8[b*cols], &c.xs[b*ng], &c.xsum[b*ng], &out[0], mode|q4RowsTiled, new([]float32))
					for o := range out {
						if want := c.want(b, o); math.Float32bits(out[o]) != math.Float32bits(want) {
							t.Fatalf("mode %d cols %d rows %d: out[%d][%d] = %v, Go twin %v", mode, cols, rows, b, o, out[o], want)
						}
					}
				}
			}
		}
	}
}

// TestQ4RowsPaired: the paired decode kernel gives each of its ranges the
// Go twin's bits, paired with a second matrix and with the second half of
// the same one, for one tile, a few and an odd count, group counts below,
// at and above a chunk, in the paired variant and the one that runs the
// ranges in turn.
func TestQ4RowsPaired(t *testing.T) {
	if !useAVX2 || !q4RowsTiles {
		t.Skip("no tiled decode kernel")
	}
	r := rand.New(rand.NewPCG(67, 68))
	modes := []uint8{q4RowsPrefetch | q4RowsTiled}
	if useVNNI {
		modes = append(modes, q4RowsVNNI|q4RowsPrefetch|q4RowsZMM|q4RowsTiled)
	}
	nans := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return v
	}
	for _, cols := range []int{64, 128, 320, 1088, 2048, 8256} {
		ng := cols / format.GroupSize
		for _, rows := range []int{8, 24, 40} {
			a := newQ4Case(r, 2*rows, cols, 1)
			b := newQ4Case(r, rows, cols, 1)
			b.x8, b.xs, b.xsum = a.x8, a.xs, a.xsum
			ma, mb := tiledCopy(a.w), tiledCopy(b.w)
			for _, mode := range modes {
				outA, outB := nans(rows), nans(rows)
				pair := q4Pair{q: &mb.Q[0], scales: &mb.Scales[0], biases: &mb.Biases[0], out: &outB[0]}
				q4RowsPaired(&ma.Q[0], cols/2, &ma.Scales[0], &ma.Biases[0], ng, rows, &a.x8[0], &a.xs[0], &a.xsum[0], &outA[0], mode, new([]float32), &pair)
				for o := range rows {
					if want := a.want(0, o); math.Float32bits(outA[o]) != math.Float32bits(want) {
						t.Fatalf("mode %d cols %d rows %d, two matrices: first's row %d = %v, Go twin %v", mode, cols, rows, o, outA[o], want)
					}
					if want := b.want(0, o); math.Float32bits(outB[o]) != math.Float32bits(want) {
						t.Fatalf("mode %d cols %d rows %d, two matrices: second's row %d = %v, Go twin %v", mode, cols, rows, o, outB[o], want)
					}
				}
				out := nans(2 * rows)
				pair = q4Pair{q: &ma.Q[rows*cols/2], scales: &ma.Scales[rows*ng], biases: &ma.Biases[rows*ng], out: &out[rows]}
				q4RowsPaired(&ma.Q[0], cols/2, &ma.Scales[0], &ma.Biases[0], ng, rows, &a.x8[0], &a.xs[0], &a.xsum[0], &out[0], mode, new([]float32), &pair)
				for o := range 2 * rows {
					if want := a.want(0, o); math.Float32bits(out[o]) != math.Float32bits(want) {
						t.Fatalf("mode %d cols %d rows %d, halves: row %d = %v, Go twin %v", mode, cols, rows, o, out[o], want)
					}
				}
			}
		}
	}
}

// TestTiledMatMul: products and rows of a tiled matrix are those of the
// row-major one bit for bit, for decode and prefill batches, on parts
// that start inside a tile (3 threads over 100 rows), with chunks taken
// from a slow part, in the Go twins, and in every kernel variant; and so
// are MatMul2's, on a pool and on one thread (with pairs of row ranges,
// q4RowsPairs, the two matrices paired row for row).
func TestTiledMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	type shape struct{ rows, cols int }
	shapes := []shape{{8, 64}, {21, 128}, {100, 512}, {777, 512}, {64, 2048}}
	modes := []uint8{q4RowsMode}
	if useAVX2 {
		modes = q4RowsModes()
	}
	var flat2, m2 Mat // a second matrix of each shape, for MatMul2
	check := func(name string, p *Pool, flat, m *Mat, nb int) {
		t.Helper()
		x := randVec(r, nb*flat.Cols)
		want := make([]float32, nb*flat.Rows)
		var sc Scratch
		sc.MatMul(want, flat, x, nb)
		got := make([]float32, nb*flat.Rows)
		p.MatMul(got, m, x, nb)
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%s, %d×%d, %d rows: element %d is %v, row-major %v", name, flat.Rows, flat.Cols, nb, i, got[i], want[i])
		}
		want2 := make([]float32, nb*flat.Rows)
		sc.MatMul(want2, &flat2, x, nb)
		var one Scratch
		for _, mm2 := range []func(o1 []float32, w1 *Mat, o2 []float32, w2 *Mat, x []float32, nb int){p.MatMul2, one.MatMul2} {
			got1, got2 := make([]float32, nb*flat.Rows), make([]float32, nb*flat.Rows)
			mm2(got1, m, got2, &m2, x, nb)
			if i := firstDiff(got1, want); i >= 0 {
				t.Fatalf("%s, MatMul2, %d×%d, %d rows: first product's element %d is %v, row-major %v", name, flat.Rows, flat.Cols, nb, i, got1[i], want[i])
			}
			if i := firstDiff(got2, want2); i >= 0 {
				t.Fatalf("%s, MatMul2, %d×%d, %d rows: second product's element %d is %v, row-major %v", name, flat.Rows, flat.Cols, nb, i, got2[i], want2[i])
			}
		}
	}
	for _, sh := range shapes {
		w := randVec(r, sh.rows*sh.cols)
		flat, _ := encodeMat(t, w, sh.rows, sh.cols, format.Q4)
		m := tiledCopy(flat)
		flat2, _ = encodeMat(t, randVec(r, sh.rows*sh.cols), sh.rows, sh.cols, format.Q4)
		m2 = tiledCopy(flat2)
		for _, mode := range modes {
			old := q4RowsMode
			q4RowsMode = mode
			for _, threads := range []int{1, 2, 3} {
				p := NewPool(threads)
				for _, nb := range []int{1, 2, 3, 17} {
					check(fmt.Sprintf("mode %d, %d threads", mode, threads), p, &flat, &m, nb)
				}
				p.Close()
			}
			q4RowsMode = old
		}
		if sh.rows == 777 {
			// A slow part whose chunks (224 rows) the others take; the
			// parts (259 rows) end inside a tile.
			p := NewPool(3)
			var before uint64
			stallUntilStolen(p.crew, &before)
			for _, nb := range []int{1, 3} {
				before = p.crew.Stolen()
				check("slow part", p, &flat, &m, nb)
				if p.crew.Stolen() == before {
					t.Errorf("%d rows: no chunk was taken from the slow part", nb)
				}
			}
			p.Close()
		}
		a, v := useAVX2, useVNNI
		useAVX2, useVNNI = false, false
		p := NewPool(2)
		for _, nb := range []int{1, 3} {
			check("Go twins", p, &flat, &m, nb)
		}
		p.Close()
		useAVX2, useVNNI = a, v
		got, want := make([]float32, sh.cols), make([]float32, sh.cols)
		for row := range sh.rows {
			flat.Row(want, row)
			m.Row(got, row)
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("%d×%d: Row(%d)[%d] = %v, row-major %v", sh.rows, sh.cols, row, i, got[i], want[i])
			}
		}
	}
}

// BenchmarkTileQ4 is the rate at which TileQ4 rearranges weights in place
// (the loaders' cost: a resident expert store once at load, a streamed
// record as it lands), over 256 MiB of 512×2048 matrices.
func BenchmarkTileQ4(b *testing.B) {
	ms, free := dramMats(b, 512, 2048, 256<<20)
	defer free()
	var tmp []byte
	b.SetBytes(int64(len(ms) * len(ms[0].Q)))
	for b.Loop() {
		for i := range ms {
			tmp = TileQ4(ms[i].Q, 512, 2048, tmp)
		}
	}
}

// TestUntileQ4: UntileQ4 and Untile give back the row-major weights of
// what TileQ4 tiled, rows after the last whole tile included; Tile leaves
// a matrix stored tiled as it is; Untile leaves row-major and non-q4
// matrices alone.
func TestUntileQ4(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, rows := range []int{8, 13, 24} {
		for _, cols := range []int{64, 192, 2048} {
			flat := newQ4Case(r, rows, cols, 1).w
			m := tiledCopy(flat)
			q := slices.Clone(m.Q)
			UntileQ4(q, rows, cols, nil)
			if !bytes.Equal(q, flat.Q) {
				t.Fatalf("%d×%d: UntileQ4 differs from the row-major weights", rows, cols)
			}
			stored := slices.Clone(m.Q)
			Tile(&m, nil) // marked tiled: as a store's view is
			if !bytes.Equal(m.Q, stored) || !m.Tiled {
				t.Fatalf("%d×%d: Tile rearranged a matrix tiled already", rows, cols)
			}
			Untile(&m, nil)
			if !bytes.Equal(m.Q, flat.Q) || m.Tiled {
				t.Fatalf("%d×%d: Untile left tiled %v, weights equal %v", rows, cols, m.Tiled, bytes.Equal(m.Q, flat.Q))
			}
			Untile(&m, nil)
			if !bytes.Equal(m.Q, flat.Q) {
				t.Fatalf("%d×%d: Untile rearranged a row-major matrix", rows, cols)
			}
		}
	}
}

// TestStoreTiles: a packer stores tiled exactly the q4 matrices Tiles
// would tile here.
func TestStoreTiles(t *testing.T) {
	for _, c := range []struct {
		shape []int
		kind  format.Kind
	}{{[]int{8, 128}, format.Q4}, {[]int{7, 128}, format.Q4}, {[]int{8, 192}, format.Q4}, {[]int{768, 2048}, format.Q4},
		{[]int{8, 128}, format.Q8}, {[]int{16, 128}, format.MXFP4}, {[]int{128}, format.F32}} {
		tn := format.Tensor{Kind: c.kind, Shape: c.shape}
		want := c.kind == format.Q4 && Tiles(&Mat{Kind: c.kind, Rows: tn.Rows(), Cols: tn.Cols()})
		if got := StoreTiles(&tn); got != want {
			t.Errorf("%v %v: StoreTiles %v, want %v", c.kind, c.shape, got, want)
		}
	}
}

// TestMatFromTiled: a tensor the store marks tiled gives a tiled view;
// one that cannot be tiled (q8, too few rows) is refused, not read.
func TestMatFromTiled(t *testing.T) {
	buf := make([]byte, 1<<16)
	for _, c := range []struct {
		kind format.Kind
		rows int
		ok   bool
	}{{format.Q4, 8, true}, {format.Q4, 16, true}, {format.Q4, 7, false}, {format.Q8, 8, false}} {
		vb, sb := c.kind.Sizes(c.rows, 128)
		tn := format.Tensor{Name: "w", Kind: c.kind, Shape: []int{c.rows, 128}, Size: vb, ScaleOffset: 4096, BiasOffset: 4096 + sb, Tiled: true}
		m, err := MatFrom(buf, &tn)
		if c.ok && (err != nil || !m.Tiled) {
			t.Errorf("%v %d rows: tiled %v, %v", c.kind, c.rows, m.Tiled, err)
		}
		if !c.ok && err == nil {
			t.Errorf("%v %d rows marked tiled: taken", c.kind, c.rows)
		}
	}
}
