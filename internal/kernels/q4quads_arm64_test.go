//go:build arm64

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/quant"
)

// q4QuadsCase is raw operands for q4QuadsNEON: rows weight rows of ng
// groups, qstride bytes apart (padding between them), and nb activation
// rows.
type q4QuadsCase struct {
	q            []byte
	sc, bi       []float32
	sh, bh       []uint16 // sc and bi as halves (they are halves' values)
	x8           []int8
	xs, xsum     []float32
	rows, ng, nb int
	qstride      int
}

func newQ4QuadsCase(r *rand.Rand, rows, ng, nb, pad int, extreme bool) *q4QuadsCase {
	c := &q4QuadsCase{rows: rows, ng: ng, nb: nb, qstride: ng*32 + pad}
	c.q = make([]byte, rows*c.qstride)
	for i := range c.q {
		c.q[i] = byte(r.IntN(256))
		if extreme {
			c.q[i] = 0xff
		}
	}
	c.x8 = make([]int8, nb*ng*64)
	for i := range c.x8 {
		c.x8[i] = int8(r.IntN(256) - 128)
		if extreme {
			c.x8[i] = [3]int8{127, -127, -128}[(i/64)%3]
		}
	}
	c.sc, c.bi = randVec(r, rows*ng), randVec(r, rows*ng)
	c.sh, c.bh = quant.F16s(c.sc), quant.F16s(c.bi)
	c.sc, c.bi = widened(c.sh), widened(c.bh)
	c.xs, c.xsum = randVec(r, nb*ng), randVec(r, nb*ng)
	if ng > 1 && rows > 1 {
		clear(c.q[c.qstride : c.qstride+32]) // a zero group
	}
	return c
}

// want is dotQ4I8 for activation row b and weight row i.
func (c *q4QuadsCase) want(b, i int) float32 {
	ng := c.ng
	return dotQ4I8(c.q[i*c.qstride:i*c.qstride+ng*32], c.sc[i*ng:(i+1)*ng], c.bi[i*ng:(i+1)*ng],
		c.x8[b*ng*64:(b+1)*ng*64], c.xs[b*ng:(b+1)*ng], c.xsum[b*ng:(b+1)*ng])
}

// sdotPaths are the integer paths this CPU runs: the SMULL/SMLAL fallback
// always, SDOT where the CPU has it.
func sdotPaths(t testing.TB) []bool {
	if useSDOT {
		return []bool{false, true}
	}
	t.Log("no SDOT on this CPU: only the fallback path runs")
	return []bool{false}
}

// TestQ4QuadsNEON: the four-row NEON kernel gives dotQ4I8's bits for every
// weight row and activation row, with SDOT and without, for group counts
// 1 to 9 and 17, one to three quads, one to five activation rows (pairs
// and a last row alone), padded weight rows, and an output stride wider
// than the tile, whose gaps must stay untouched; also with every nibble 15
// against activations of ±127 and -128, the largest integer sums.
func TestQ4QuadsNEON(t *testing.T) {
	r := rand.New(rand.NewPCG(91, 92))
	const sentinel = -12345
	for _, sdot := range sdotPaths(t) {
		for _, ng := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 17} {
			for nq := 1; nq <= 3; nq++ {
				for nb := 1; nb <= 5; nb++ {
					for _, extreme := range []bool{false, true} {
						c := newQ4QuadsCase(r, 4*nq, ng, nb, 16*r.IntN(3), extreme)
						ostride := 4*c.rows + 4*r.IntN(3)
						out := make([]float32, (nb*ostride)/4+4)
						for i := range out {
							out[i] = sentinel
						}
						q4QuadsNEON(&c.q[0], c.qstride, &c.sc[0], &c.bi[0], ng, nq, &c.x8[0], &c.xs[0], &c.xsum[0],
							nb, &out[0], ostride, sdot)
						name := fmt.Sprintf("sdot %v ng %d nq %d nb %d extreme %v", sdot, ng, nq, nb, extreme)
						for b := 0; b < nb; b++ {
							for i := 0; i < c.rows; i++ {
								got, want := out[b*ostride/4+i], c.want(b, i)
								if math.Float32bits(got) != math.Float32bits(want) {
									t.Fatalf("%s: act %d row %d: %v, twin %v", name, b, i, got, want)
								}
							}
						}
						for j, v := range out {
							if b, i := j/(ostride/4), j%(ostride/4); (b >= nb || i >= c.rows) && v != sentinel {
								t.Fatalf("%s: wrote out[%d] outside the tile", name, j)
							}
						}
					}
				}
			}
		}
	}
}

// TestQ4EntryPointsNEON: q4Rows and q4TileAVX2, the arm64 entry points
// runQ4 calls, give the twin's bits for row counts that are not multiples
// of four (the rows left over go to dotQ4I8NEON).
func TestQ4EntryPointsNEON(t *testing.T) {
	r := rand.New(rand.NewPCG(93, 94))
	for _, ng := range []int{1, 3, 4} {
		for rows := 1; rows <= 11; rows++ {
			c := newQ4QuadsCase(r, rows, ng, 3, 0, false)
			out := make([]float32, rows)
			q4Rows(&c.q[0], c.qstride, &c.sh[0], &c.bh[0], ng, rows, &c.x8[0], &c.xs[0], &c.xsum[0], &out[0], 0, new([]float32))
			for i, v := range out {
				if want := c.want(0, i); math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("q4Rows ng %d rows %d: row %d: %v, twin %v", ng, rows, i, v, want)
				}
			}
			tile := make([]float32, 3*rows)
			q4TileAVX2(&c.q[0], c.qstride, &c.sc[0], &c.bi[0], ng, rows, rows, &c.x8[0], &c.xs[0], &c.xsum[0], 3, &tile[0], 4*rows)
			for b := 0; b < 3; b++ {
				for i := 0; i < rows; i++ {
					if v, want := tile[b*rows+i], c.want(b, i); math.Float32bits(v) != math.Float32bits(want) {
						t.Fatalf("q4TileAVX2 ng %d rows %d: act %d row %d: %v, twin %v", ng, rows, b, i, v, want)
					}
				}
			}
		}
	}
}

// BenchmarkQ4QuadsNEON compares the four-row kernel with the one-row loop
// it replaced (q4RowsOne: dotQ4I8NEON per row pair, reloading the
// activations for every weight row), in decode (one activation row) and
// in a prefill tile (8 weight rows, 16 activation rows). Under qemu the
// times are those of the emulator, not of an arm64 CPU: they show that
// both run, not which is faster. The instructions of the loops per group,
// counted in go tool objdump (SDOT path; SMULL/SMLAL in brackets): the
// one-row dotQ4I8NEON 28 (31) per output, plus a call per row; the
// four-row kernel 94 (126) for 8 outputs with two activation rows, 11.75
// (15.75) per output, and 62 (78) for 4 with one, 15.5 (19.5) per output;
// and 32 bytes loaded per output and group instead of 96 (pairs).
func BenchmarkQ4QuadsNEON(b *testing.B) {
	r := rand.New(rand.NewPCG(95, 96))
	for _, sh := range []struct{ rows, ng, nb int }{{256, 32, 1}, {8, 32, 16}} {
		c := newQ4QuadsCase(r, sh.rows, sh.ng, sh.nb, 0, false)
		out := make([]float32, sh.rows*sh.nb)
		for _, k := range []struct {
			name string
			f    func(lo, hi int)
		}{
			{"quads", func(lo, hi int) {
				q4QuadsNEON(&c.q[0], c.qstride, &c.sc[0], &c.bi[0], sh.ng, sh.rows/4, &c.x8[0], &c.xs[0], &c.xsum[0],
					sh.nb, &out[0], 4*sh.rows, useSDOT)
			}},
			{"onerow", func(lo, hi int) {
				q4RowsOne(&c.q[0], c.qstride, &c.sc[0], &c.bi[0], sh.ng, 0, sh.rows, &c.x8[0], &c.xs[0], &c.xsum[0],
					sh.nb, &out[0], 4*sh.rows)
			}},
		} {
			b.Run(fmt.Sprintf("%dx%d/nb%d/%s", sh.rows, sh.ng*64, sh.nb, k.name), func(b *testing.B) {
				for b.Loop() {
					k.f(0, sh.rows)
				}
				b.ReportMetric(float64(sh.rows*sh.ng*64*sh.nb)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s(emulated)")
			})
		}
	}
}
