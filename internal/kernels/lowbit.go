package kernels

import "github.com/sluicelm/sluice/internal/format"

// Products with the low-bit expert records (format.Q3, format.Q2) that
// --miss-bits reads. They use the q4 design (int8 activations, an exact
// integer sum per group, then dotQ4I8's float chain), so a row's result
// is the one its record widened to q4 would give, bit for bit: widening
// keeps every value, scale and bias. Only the unpacking differs, and
// since the integer sum does not depend on the order of its products, the
// assembly unpacks a group in whatever order suits it and multiplies by
// the activations permuted to match (lowPerm), once per activation row.

// dotLowI8 is the low-bit dot product of one weight row (ng groups of
// GroupSize·b/8 bytes, format.Q3's or Q2's bit stream) and one int8
// activation row: dotQ4I8's arithmetic, and what every low-bit kernel
// reproduces bit for bit.
func dotLowI8(q []byte, b int, scales, biases []float32, x8 []int8, xs, xsum []float32) float32 {
	const G = format.GroupSize
	gb := G * b / 8
	var acc float32
	for g := range scales {
		s := lowGroupSum(q[g*gb:(g+1)*gb], b, (*[G]int8)(x8[g*G:]))
		c := float32(scales[g] * xs[g])
		t := float32(float32(s) * c)
		bb := float32(biases[g] * xsum[g])
		acc += t + bb
	}
	return acc
}

// lowGroupSum is Σ q·x over one group, exact: value i of the group is
// bits [i·b, (i+1)·b) of its little-endian bit stream.
func lowGroupSum(q []byte, b int, x *[format.GroupSize]int8) int32 {
	var s int32
	switch b {
	case 2:
		q := (*[16]byte)(q)
		for j, w := range q {
			v := x[4*j : 4*j+4 : 4*j+4]
			s += int32(w&3)*int32(v[0]) + int32(w>>2&3)*int32(v[1]) + int32(w>>4&3)*int32(v[2]) + int32(w>>6)*int32(v[3])
		}
	case 3:
		q := (*[24]byte)(q)
		for j := 0; j < 8; j++ {
			w := int32(q[3*j]) | int32(q[3*j+1])<<8 | int32(q[3*j+2])<<16
			v := x[8*j : 8*j+8 : 8*j+8]
			for k := range v {
				s += (w >> (3 * k) & 7) * int32(v[k])
			}
		}
	default:
		panic("kernels: low-bit width not 2 or 3")
	}
	return s
}

// lowTab holds the constants of the low-bit assembly kernels, passed to
// them by address (offsets in lowbit_amd64.s).
type lowTab struct {
	shuf  [4][32]byte   // q3: VPSHUFB patterns building the 16-bit windows of vector a
	mul   [4][16]uint16 // q3: 2^(13−p), moving a window's value (at bit p) to bits 13–15
	ones  [16]uint16    // VPMADDWD's pairwise sum
	m3    [32]byte      // q2: 0x03 per byte
	shift [8]uint32     // q2: per-dword right shift, 0 in the low lane and 4 in the high
	iota  [8]uint32     // 0..7: the gather indices' row numbers

	// The AVX-512 kernel's (lowbit_avx512_amd64.s), from offset 384.
	perm3   [2][64]byte // q3: VPERMB indices of vector h's source bytes, per qword
	mshift3 [2][64]byte // q3: VPMULTISHIFTQB bit offsets of the values in those qwords
	shift2  [16]uint32  // q2: per-dword right shift, 0 and 4 in alternate 128-bit lanes
	iota16  [16]uint32  // 0..15: the gather indices' row numbers
}

// The q3 kernel loads a group's 24 bytes as bytes 0–15 in the low 128-bit
// lane and 8–23 in the high one, so lane L holds the 3-byte triples
// 4L..4L+3 (values 8t..8t+7 each), starting at byte 4L of the lane. Vector
// a (0..3) gets, in word w of lane L, the 16-bit window of value
// 8(4L + w/2) + 2a + w%2; the multiply and a right shift by 13 leave the
// value alone in the word, and VPACKUSWB of vectors 0 and 1 (2 and 3)
// gives the bytes multiplied by the first (second) 32 permuted
// activations.
//
// The q2 kernel broadcasts a group's 16 bytes to both lanes and shifts
// the high lane right by 4: masking each byte then gives value 4j+2L in
// byte j of lane L, and masking after a further shift by 2 gives value
// 4j+2L+1.

// The AVX-512 kernel holds two rows' groups in one 512-bit register, row
// A's in the low 256 bits and row B's in the high, each half in the AVX2
// kernels' order, so that both kernels take the same permuted activations
// (each 32-byte half of x8p broadcast to both halves). For q3 both groups
// are loaded into one register (A's 24 bytes at byte 0, B's at 32); VPERMB
// gathers into each qword of vector h the source bytes of its 8 values
// (values 8T+2a and 8T+2a+1 of four triples T lie in 6 bits, bits
// 6a..6a+5 of the triple, so in the two bytes from byte 6a/8 on), and
// VPMULTISHIFTQB moves each value's bits to the bottom of its byte, with
// no word arithmetic or packing. For q2, lanes 0 and 1 hold row A's 16
// bytes, lanes 2 and 3 row B's, and the AVX2 kernel's shifts and masks
// apply per 256-bit half unchanged.

// lowValue is the group index of the value that byte i (0..63) of a
// low-bit kernel's unpacked group holds, for width b.
func lowValue(b, i int) int {
	h, i := i/32, i%32 // which of the two multiplied vectors
	L, j := i/16, i%16 // lane, byte in the lane
	if b == 2 {
		return 4*j + 2*L + h
	}
	a, w := 2*h+j/8, j%8
	return 8*(4*L+w/2) + 2*a + w%2
}

var (
	lowPerm [4][format.GroupSize]uint8 // [b] x8 index of permuted activation i
	lowK    = newLowTab()
)

func init() {
	for _, b := range []int{2, 3} {
		for i := range lowPerm[b] {
			lowPerm[b][i] = uint8(lowValue(b, i))
		}
	}
}

func newLowTab() *lowTab {
	t := new(lowTab)
	for a := 0; a < 4; a++ {
		for L := 0; L < 2; L++ {
			for w := 0; w < 8; w++ {
				tl, k := w/2, 2*a+w%2
				bit := 3 * k // in the triple
				lo := 4*L + 3*tl + bit/8
				hi := byte(0x80) // zero: the value lies in one byte
				if bit%8 > 5 {
					hi = byte(lo + 1)
				}
				t.shuf[a][16*L+2*w] = byte(lo)
				t.shuf[a][16*L+2*w+1] = hi
				t.mul[a][8*L+w] = 1 << (13 - bit%8)
			}
		}
	}
	for i := range t.ones {
		t.ones[i] = 1
	}
	for i := range t.m3 {
		t.m3[i] = 3
	}
	for i := range t.shift {
		t.shift[i] = uint32(4 * (i / 4))
		t.iota[i] = uint32(i)
	}
	for h := 0; h < 2; h++ {
		for d := 0; d < 64; d++ {
			H, e := d/32, d%32 // row A or B; byte in the half
			L, j := e/16, e%16 // as lowValue: lane and byte of vector h
			a, u := 2*h+j/8, j%8
			lo := 6 * a / 8 // the triple's first byte holding values 2a, 2a+1
			T := 4*L + u/2  // the triple of this byte's value
			// Byte u of the qword: byte lo+u%2 of triple T; the value
			// (2a + u%2 of the triple, bit 6a + 3·(u%2)) lies in the
			// qword's 16 bits from 16·(u/2) on.
			t.perm3[h][d] = byte(32*H + 3*T + lo + u%2)
			t.mshift3[h][d] = byte(16*(u/2) + 6*a + 3*(u%2) - 8*lo)
		}
	}
	for i := range t.shift2 {
		t.shift2[i] = uint32(4 * (i / 4 % 2))
		t.iota16[i] = uint32(i)
	}
	return t
}

// permuteLow writes x8's groups in the order of lowPerm[b] into dst.
func permuteLow(dst, x8 []int8, b int) {
	const G = format.GroupSize
	p := &lowPerm[b]
	for g := 0; g+G <= len(x8); g += G {
		d, s := (*[G]int8)(dst[g:]), (*[G]int8)(x8[g:])
		for i, k := range p {
			d[i] = s[k]
		}
	}
}

// lowWideRows is the batch from which a low-bit product widens its rows
// to q4, a tile at a time, and runs the q4 tile kernels: a prefill chunk
// uses each weight many times, and the decode kernel unpacks it again for
// every activation row. Widening costs about as much as 15–25 activation
// rows of the decode kernel (BenchmarkLowBatch, 768×2048 q3, on the
// loaded 2-core machine: the crossover lay between 16 and 32 rows). A
// variable so that the benchmark can force either path.
var lowWideRows = 24

// lowWideBytes bounds a widened tile (16 rows of up to 8192 columns), on
// the stack of the thread that computes it.
const lowWideBytes = 16 * 8192 / 2

// runLow computes rows [lo,hi) of a q3 or q2 product: 16 rows per kernel
// call with AVX-512 (lowVNNI), 8 with AVX2 (without it, or for a last 8
// rows), the Go twin for the rest (and everywhere without the kernels);
// batches of lowWideRows or more through the q4 tiles.
func (t *matmulTask) runLow(lo, hi int) {
	w := t.w
	C := w.Cols
	ng := C / format.GroupSize
	b := w.Kind.Bits()
	rb := C * b / 8 // bytes of a row
	T := 8
	if useVNNI {
		T = 16
	}
	room := t.room(lo)
	if t.nb >= lowWideRows && useAVX2 && ng > 0 && hi > lo && T*C/2 <= lowWideBytes {
		var buf [lowWideBytes]byte
		_ = w.Q[hi*rb-1]
		_, _, _, _ = t.x8[t.nb*C-1], t.xs[t.nb*ng-1], t.xsum[t.nb*ng-1], t.out[:t.nb*w.Rows]
		for w0 := lo; w0 < hi; w0 += T {
			n := min(T, hi-w0)
			widenLow(buf[:n*C/2], w.Q[w0*rb:(w0+n)*rb], b)
			s, bi := w.widen(room, w0, w0+n)
			if useVNNI {
				q4TileVNNI(&buf[0], C/2, &s[0], &bi[0], ng, n, n,
					&t.x8[0], &t.xs[0], &t.xsum[0], t.nb, &t.out[w0], 4*w.Rows)
			} else {
				q4TileAVX2(&buf[0], C/2, &s[0], &bi[0], ng, n, n,
					&t.x8[0], &t.xs[0], &t.xsum[0], t.nb, &t.out[w0], 4*w.Rows)
			}
		}
		return
	}
	o := lo
	if lowAsm() && ng > 0 {
		n8 := (hi - lo) &^ 7
		if n8 > 0 {
			// The kernel reads whole rows: check the slices once.
			_ = w.Q[(lo+n8)*rb-1]
			_, _, _, _ = t.x8p[t.nb*C-1], t.xs[t.nb*ng-1], t.xsum[t.nb*ng-1], t.out[:t.nb*w.Rows]
			// A few rows' tiles at a time for every activation row, so
			// that a batch reads the weights from memory once.
			step := rowsPerWiden(ng, 16)
			vnni := lowVNNI(b)
			for o0 := lo; o0 < lo+n8; o0 += step {
				n := min(step, lo+n8-o0)
				n16 := 0
				if vnni {
					n16 = n &^ 15
				}
				s, bi := w.widen(room, o0, o0+n)
				for r := 0; r < t.nb; r++ {
					if n16 > 0 {
						lowRowsVNNI(&w.Q[o0*rb], rb, &s[0], &bi[0], ng, n16,
							&t.x8p[r*C], &t.xs[r*ng], &t.xsum[r*ng], &t.out[r*w.Rows+o0], b, lowK)
					}
					if n16 < n {
						lowRows(&w.Q[(o0+n16)*rb], rb, &s[n16*ng], &bi[n16*ng], ng, n-n16,
							&t.x8p[r*C], &t.xs[r*ng], &t.xsum[r*ng], &t.out[r*w.Rows+o0+n16], b, lowK)
					}
				}
			}
			o += n8
		}
	}
	for i := o; i < hi; i++ {
		s, bi := w.widen(room, i, i+1)
		for r := 0; r < t.nb; r++ {
			t.out[r*w.Rows+i] = dotLowI8(w.Q[i*rb:(i+1)*rb], b, s, bi, t.x8[r*C:(r+1)*C], t.xs[r*ng:(r+1)*ng], t.xsum[r*ng:(r+1)*ng])
		}
	}
}

// widenLow writes the b-bit groups of src as q4 groups (format.Q4's
// nibble order) into dst.
func widenLow(dst, src []byte, b int) {
	const G = format.GroupSize
	gb := G * b / 8
	var q [G]uint8
	for g := 0; g < len(src)/gb; g++ {
		s := src[g*gb : (g+1)*gb]
		if b == 2 {
			for j, w := range (*[16]byte)(s) {
				q[4*j], q[4*j+1], q[4*j+2], q[4*j+3] = w&3, w>>2&3, w>>4&3, w>>6
			}
		} else {
			for j := 0; j < 8; j++ {
				w := uint32(s[3*j]) | uint32(s[3*j+1])<<8 | uint32(s[3*j+2])<<16
				d := (*[8]uint8)(q[8*j:])
				d[0], d[1], d[2], d[3] = uint8(w&7), uint8(w>>3&7), uint8(w>>6&7), uint8(w>>9&7)
				d[4], d[5], d[6], d[7] = uint8(w>>12&7), uint8(w>>15&7), uint8(w>>18&7), uint8(w>>21&7)
			}
		}
		o := (*[G / 2]byte)(dst[g*G/2:])
		for j := range o {
			o[j] = q[j] | q[j+G/2]<<4
		}
	}
}
