package kernels

import (
	"os"
	"unsafe"

	"github.com/sluicelm/sluice/internal/format"
)

// runQ4 computes rows [lo,hi) of a q4 product with the tile kernels: one
// call per tile of consecutive weight rows (16 with AVX-512, 8 with AVX2,
// one per vector lane) covering every activation row, so that a tile's
// weights are rearranged once and reused nb times. The results are
// dotQ4I8's, bit for bit, whatever the tile, the split or nb.
func (t *matmulTask) runQ4(lo, hi int) {
	w := t.w
	C := w.Cols
	ng := C / format.GroupSize
	nb := t.nb
	// The kernels read whole rows: check the slices once, here.
	_, _, _ = w.Q[w.Rows*C/2-1], w.Scales[w.Rows*ng-1], w.Biases[w.Rows*ng-1]
	// out is checked by slicing: reading its last element would race with
	// the thread whose part writes it.
	_, _, _, _ = t.x8[nb*C-1], t.xs[nb*ng-1], t.xsum[nb*ng-1], t.out[:nb*w.Rows]
	if p := t.pair.w; p != nil {
		_, _, _, _ = p.Q[p.Rows*C/2-1], p.Scales[p.Rows*ng-1], p.Biases[p.Rows*ng-1], t.pair.out[:nb*p.Rows]
	}
	if nb == 1 || (ng == 1 && nb <= 3) {
		// Decode, and the smallest batches of 64-column matrices: each
		// weight is used once or nearly, so rearranging a tile costs more
		// than it saves (measured: BenchmarkQ4Paths); q4Rows keeps the
		// weights in place.
		for r := 0; r < nb; r++ {
			t.rowsQ4(lo, hi, r)
		}
		return
	}
	T := 8
	if useVNNI {
		T = 16
	}
	room := t.room(lo)
	step := rowsPerWiden(ng, T)
	var flat []byte
	if w.Tiled {
		// Room for a tile's rows gathered row-major, after the widened
		// scales and biases of a step's rows.
		flat = roomTail(room, 2*step*ng, T*C/2)
	}
	for c0 := lo; c0 < hi; c0 += step {
		c1 := min(c0+step, hi)
		// A tile reads whole tiles of rows, past c1 within the matrix.
		s, b := w.widen(room, c0, min(c0+(c1-c0+T-1)/T*T, w.Rows))
		for w0 := c0; w0 < c1; w0 += T {
			i := (w0 - c0) * ng
			q := &w.Q[w0*C/2]
			if w.Tiled {
				q = flatTile(w, w0, min(T, w.Rows-w0), flat)
			}
			if useVNNI {
				q4TileVNNI(q, C/2, &s[i], &b[i], ng, min(T, w.Rows-w0), min(T, c1-w0),
					&t.x8[0], &t.xs[0], &t.xsum[0], nb, &t.out[w0], 4*w.Rows)
			} else {
				q4TileAVX2(q, C/2, &s[i], &b[i], ng, min(T, w.Rows-w0), min(T, c1-w0),
					&t.x8[0], &t.xs[0], &t.xsum[0], nb, &t.out[w0], 4*w.Rows)
			}
		}
	}
}

// flatTile gathers rows [w0, w0+n) of the tiled matrix w row-major into
// buf for the prefill kernels, which rearrange a tile from rows a stride
// apart; a copy of the rows they read anyway, against the nb activation
// rows each weight then meets.
func flatTile(w *Mat, w0, n int, buf []byte) *byte {
	rb := w.Cols / 2
	b := buf[:n*rb]
	i := 0
	if w0%TileRows == 0 {
		// Whole tiles group by group, so that each tile is read in order,
		// one sequential stream as the decode reads it.
		full := min(n, w.Rows/TileRows*TileRows-w0) / TileRows * TileRows
		for ; i < full; i += TileRows {
			untile(b[i*rb:][:TileRows*rb], w.Q[(w0+i)*rb:][:TileRows*rb], rb)
		}
	}
	for ; i < n; i++ {
		if q := w.rowQ4(w0+i, b[i*rb:(i+1)*rb]); &q[0] != &b[i*rb] {
			copy(b[i*rb:], q)
		}
	}
	return &b[0]
}

// untile writes the tile src (TileRows rows of rb bytes, tiled) to dst
// row-major, group by group so that src is read in order. The Go loop's
// 8-byte moves cost about as much as reading the tile; the assembly moves
// a group's 8 rows a pass, prefetching ahead.
func untile(dst, src []byte, rb int) {
	_, _ = dst[TileRows*rb-1], src[TileRows*rb-1]
	if q4RowsTiles && useAVX2 {
		untileAVX2(&dst[0], rb, &src[0], rb/tileGroup)
		return
	}
	untileGo(dst, src, rb)
}

// untileGo is untile's Go twin.
func untileGo(dst, src []byte, rb int) {
	ng := rb / tileGroup
	_, _ = dst[TileRows*rb-1], src[TileRows*rb-1]
	for g := range ng {
		for r := range TileRows {
			for k := range tileQwords {
				*(*[8]byte)(dst[r*rb+g*tileGroup+8*k:]) = *(*[8]byte)(src[tileAt(g, r, k):])
			}
		}
	}
}

// roomTail returns n bytes of *room past its first used floats (where
// widen puts a step's scales and biases), enlarging *room where it is
// short: once per part's room, so that products allocate nothing after
// their first.
func roomTail(room *[]float32, used, n int) []byte {
	need := used + (n+3)/4
	if len(*room) < need {
		*room = make([]float32, need)
	}
	r := (*room)[used:need]
	return unsafe.Slice((*byte)(unsafe.Pointer(&r[0])), n)
}

// rowsQ4 computes rows [lo,hi) for activation row r with q4Rows, 8 rows
// per step, and the single-row kernel for the rest: the last few, and of
// a tiled matrix those of a tile the part shares with another (a part
// that does not start on a tile's first row), gathered row-major. A
// paired task (matmulTask.pair) computes its pair's rows too, in the same
// pass.
func (t *matmulTask) rowsQ4(lo, hi, r int) {
	w := t.w
	C := w.Cols
	ng := C / format.GroupSize
	a, n8 := lo, (hi-lo)&^7
	mode := q4RowsMode &^ q4RowsPairs
	if !useVNNI {
		mode &^= q4RowsVNNI | q4RowsZMM
	}
	if w.Tiled {
		// q4Rows takes the whole tiles inside [lo,hi).
		mode |= q4RowsTiled
		a = min((lo+TileRows-1)/TileRows*TileRows, hi)
		n8 = max(min(hi, w.Rows/TileRows*TileRows)/TileRows*TileRows-a, 0)
		if !q4RowsTiles {
			n8 = 0
		}
	}
	out := t.out[r*w.Rows:]
	room := t.room(lo)
	p := &t.pair
	if n8 > 0 {
		if p.w != nil {
			b := a + p.off
			pair := q4Pair{q: &p.w.Q[b*C/2], scales: &p.w.Scales[b*ng], biases: &p.w.Biases[b*ng], out: &p.out[r*p.w.Rows+b]}
			q4RowsPaired(&w.Q[a*C/2], C/2, &w.Scales[a*ng], &w.Biases[a*ng], ng, n8,
				&t.x8[r*C], &t.xs[r*ng], &t.xsum[r*ng], &out[a], mode, room, &pair)
		} else {
			q4Rows(&w.Q[a*C/2], C/2, &w.Scales[a*ng], &w.Biases[a*ng], ng, n8,
				&t.x8[r*C], &t.xs[r*ng], &t.xsum[r*ng], &out[a], mode, room)
		}
	}
	t.restQ4(w, out, lo, hi, a, n8, r, room)
	if p.w != nil {
		t.restQ4(p.w, p.out[r*p.w.Rows:], lo+p.off, hi+p.off, a+p.off, n8, r, room)
	}
}

// restQ4 computes the rows of [lo,hi) outside the n8 rows from a that
// q4Rows took, of w into out, with the single-row kernel.
func (t *matmulTask) restQ4(w *Mat, out []float32, lo, hi, a, n8, r int, room *[]float32) {
	C := w.Cols
	ng := C / format.GroupSize
	for o := lo; o < hi; o++ {
		if o == a && n8 > 0 {
			o += n8 - 1
			continue
		}
		s, b := w.widen(room, o, o+1)
		// Declared here, the buffer is zeroed only for the few rows that
		// take this path, not on every call of the decode's hot loop.
		var qb [rowQRoom]byte
		q := w.rowQ4(o, qb[:])
		out[o] = dotQ4I8AVX2(&q[0], &s[0], &b[0], &t.x8[r*C], &t.xs[r*ng], &t.xsum[r*ng], ng)
	}
}

// The variants of the decode kernel q4Rows, bits of its mode.
const (
	q4RowsVNNI     = 1 // VPDPBUSD for the integer part, else VPMADDUBSW
	q4RowsPrefetch = 4 // software prefetch of later rows, 4 KB ahead or more (PFMIN)
	q4RowsZMM      = 8 // with both others: two groups at a time on 512-bit registers
	// q4RowsTiled reads the tiled layout (Mat.Tiled): a tile is one
	// sequential stream, and each 64-byte line of it holds 8 bytes of
	// each of the 8 rows, which VPDPBUSD (or VPMADDUBSW) multiplies by
	// the activations' matching 8 bytes broadcast, so that each row's
	// sums stay in its own lanes. With q4RowsZMM a line is one 512-bit
	// register, else two 256-bit ones.
	q4RowsTiled = 16
	// q4RowsPairs is not the kernel's but the products': a decode's
	// products of tiled matrices run as pairs of row ranges
	// (q4RowsPaired), where q4PairMode allows.
	q4RowsPairs = 32
)

// q4PairMode reports whether q4RowsPaired reads both its ranges in one
// pass in mode: the tiled layout on Z registers, with the prefetch.
func q4PairMode(mode uint8) bool {
	const need = q4RowsTiled | q4RowsZMM | q4RowsPrefetch
	return mode&need == need
}

// q4Pair is the second range of rows of q4RowsPaired: its weights, scales,
// biases and outputs, as q4Rows takes the first's. The assembly reads the
// fields in this order.
type q4Pair struct {
	q              *byte
	scales, biases *uint16
	out            *float32
}

// TiledQ4 reports whether the loaders should tile the q4 matrices they own
// (TileQ4, Mat.Tiled): on AVX2 CPUs and AMD's, not where Intel's 512-bit
// variant runs. On a 2-core Zen 4, the 256-bit VNNI variant on 2 threads
// over 1 GiB of distinct 512×2048 matrices (an expert's gate, 1 KB rows)
// streamed 27.5-31.6 GB/s tiled against 20.2-29.7 row-major, ahead in six
// of six alternating rounds (1.06-1.44x); BenchmarkQ4DecodeDRAM's whole2
// cases for mode 5, 4 runs each, gave 22.0-26.7 against 14.4-27.9 GB/s
// there, and 28.6-33.9 against 25.1-31.7 for 2048×512 (plain reads
// 31-33): the hardware prefetchers follow one stream where they follow 8
// streams 1 KB apart poorly, which the software prefetch of the next tile
// only partly made up for. On an Intel Xeon with AVX-512 VNNI an earlier
// tiled layout, decoded on 256-bit registers, gained nothing (19.7-20.1
// GB/s against 20.5-24.7), so there, where the 512-bit variant runs
// (q4RowsZMM), the matrices stay row-major. The present layout, which
// the 512-bit variant reads too, streams faster there but does not decode
// faster: on an Intel Xeon (a 16-core GPU host, 2 threads),
// BenchmarkQ4DecodeDRAM's whole2 read 2048×768 matrices at 25.2-25.6 GB/s
// tiled (27.3-27.9 on 256-bit registers) against 21.2-21.9 row-major, but
// an 8-layer qwen3-30b-a3b synth decoded at 40.8, 42.7 and 44.9 tok/s
// tiled (39.0, 42.1 and 44.3 on 256-bit registers) against 41.6, 44.3
// and 44.5 row-major (sluice bench --device cpu --prompt 1 --gen 64
// --repeat 2, three alternating rounds). The
// resident 40-layer qwen3.5-35b-a3b synth then decoded faster in six of
// seven alternating pairs (median 1.09x; the README's Zen 4 section). On
// a 2-core Zen 5, which runs the 512-bit variant at full width, that
// earlier layout on 256-bit registers already decoded faster than
// row-major rows on 512-bit ones (amdZMM): medians of alternating runs of
// sluice bench --prompt 1 --gen 64 --repeat 2, 96.0 against 88.2 tok/s on
// an 8-layer qwen3-30b-a3b synth (7 rounds), 50.3 against 47.7 on a
// 3-layer glm-4.5-air one (5 rounds), and 18.9 against 18.9 on a 4-layer
// deepseek-v3 cut (5 rounds). The present layout (rows interleaved by 8
// bytes, the decode on 512-bit registers there) computes faster in the L2
// cache and decoded as fast from memory (the README's Zen 5 section). Its
// prefill (--prompt 512) lost 7% to the gathers of flatTile until untile
// made them one pass of vector moves: 576.8 against 585.6 tok/s
// row-major (medians of 5 alternating rounds). For comparison,
// SLUICE_FLATQ4 in the environment keeps them row-major everywhere, and
// SLUICE_TILEQ4 tiles them wherever the amd64 kernels run.
func TiledQ4() bool { return tiledQ4 }

var tiledQ4 = q4RowsTiles && useAVX2 && os.Getenv("SLUICE_FLATQ4") == "" &&
	(q4RowsMode&q4RowsZMM == 0 || amdZMM || os.Getenv("SLUICE_TILEQ4") != "")

// q4RowsMode is the decode kernel's variant on this CPU. With the weights
// in memory rather than cache (a decode step at real shapes), the prefetch
// cut the CPU time of a 4-layer 30B-A3B-shaped model's decode by about a
// third on the 2-core development machine (user time of sluice bench
// --threads 1; BenchmarkQ4DecodeDRAM): the hardware prefetchers follow the
// kernel's 8 interleaved row streams poorly. Prefetching past a matrix's
// last tile touches whatever follows it, harmlessly (prefetches never
// fault). With VNNI, pairs of groups on 512-bit registers take half the
// instructions per weight: on one thread with the matrix in the L2 cache
// (BenchmarkQ4RowsModes, mode13 against mode5) the best of nine runs
// streamed 58 GB/s against 39 on a 2-core Zen 5; from memory
// (BenchmarkQ4DecodeDRAM) both variants ran at 35-40 GB/s on 2 threads,
// so there the memory's access pattern, not the instructions, sets the
// pace. On a 2-core Zen 4, which issues each 512-bit operation as two
// halves (splitZMM), the 512-bit variant streamed 30 GB/s in the L2 cache
// where the Zen 5's did 58, and decoded the 40-layer qwen3.5-35b-a3b synth
// more slowly than the 256-bit one (mode 5) in all of seven alternating
// pairs (sluice bench --gen 64 --repeat 3: 1.02-1.45x, median 1.28x; the
// README's Zen 4 section), so there the decode keeps to 256-bit
// registers. Pairs of row ranges (q4RowsPairs) ran 5-12% faster than one
// range while the tiled path returned through the kernel's tests of its
// mode after every group; since that path loops over a chunk's groups
// itself, one range streams faster than two: on a 2-core Zen 5, the
// 48-layer qwen3-30b-a3b synth decoded at 28.2-31.6 tok/s against 25.8-28.0
// with pairs (sluice bench --prompt 1 --gen 64 --repeat 3 --threads 2, four
// alternating rounds), and BenchmarkQ4DecodePairs gave pairs/single
// 0.87-1.00. SLUICE_Q4PAIRS in the environment turns them on, for
// comparison.
var q4RowsMode = func() uint8 {
	switch {
	case useVNNI && splitZMM:
		return q4RowsVNNI | q4RowsPrefetch
	case useVNNI && os.Getenv("SLUICE_Q4PAIRS") != "":
		return q4RowsVNNI | q4RowsPrefetch | q4RowsZMM | q4RowsPairs
	case useVNNI:
		return q4RowsVNNI | q4RowsPrefetch | q4RowsZMM
	}
	return q4RowsPrefetch
}()
