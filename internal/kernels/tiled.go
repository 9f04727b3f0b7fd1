package kernels

import "github.com/sluicelm/sluice/internal/format"

// TileRows is the rows of a tile in the tiled q4 layout (Mat.Tiled): the
// decode kernel's 8 rows a step, as a store records it (format.Tensor.Tiled).
const TileRows = format.TileRows

// tileGroup is the bytes of one row's group of q4 weights.
const tileGroup = format.GroupSize / 2

// rowQRoom is the stack room of one gathered q4 row (8192 columns); wider
// rows take a heap buffer.
const rowQRoom = 4096

// Tiles reports whether a loader that tiles (TiledQ4) tiles m: a q4
// matrix of a whole tile of rows or more, except, where the decode has
// the 512-bit variant (amdZMM), rows of an odd number of groups, which
// decoded faster row-major there. gpt-oss's 2880 columns (45 groups) are
// such rows: on a 2-core Zen 5, a 2-layer gpt-oss-120b synth decoded at
// 107.9 tok/s tiled against 115.0 row-major (medians of 6 alternating
// rounds of sluice bench --prompt 1 --gen 64, row-major ahead in 5), and
// BenchmarkQ4DecodeDRAM's whole2 on 2880×2880 matrices read 46.5-56.3
// GB/s row-major against 46.6-50.0 tiled (3 runs). Of the even widths
// measured in the same runs, rows of 256 B to 3.5 KB read as fast or
// faster tiled, but for 2 KB rows (1408×4096: 44.9-45.6 row-major against
// 41.8-44.9), and the 3-layer glm-4.5-air synth, whose experts have such
// rows, decoded faster tiled (TiledQ4). With the present layout (rows
// interleaved by 8 bytes, TileQ4) tiling those rows too still lost: the
// gpt-oss synth decoded at 83.7 tok/s against 102.9 with them row-major
// (medians of 6 alternating rounds, row-major ahead in all six).
//
// An MXFP4 matrix is tiled (TileMXFP4) where TiledMXFP4 says so, when it
// has a whole tile of 16 rows and whole groups of 64 columns (the
// activations' scales come a group at a time).
func Tiles(m *Mat) bool {
	switch m.Kind {
	case format.Q4:
		return m.Rows >= TileRows && !(amdZMM && m.Cols/format.GroupSize%2 == 1)
	case format.MXFP4:
		return TiledMXFP4() && m.Rows >= mxTileRows && m.Cols%format.GroupSize == 0 && m.Cols > 0
	}
	return false
}

// TileQ4 rearranges the row-major q4 weights q of a rows×cols matrix into
// the tiled layout of Mat.Tiled, in place: within each whole tile of
// TileRows rows, group g takes the 256 bytes at g·256 from the tile's
// start, and in them bytes 8k..8k+7 of row r (qword k) sit at k·64 + r·8.
// Qword k of all 8 rows is then one 64-byte line, which the decode kernel
// multiplies by the activations' qword k broadcast, each row's sum staying
// in its own lanes. tmp is scratch of TileRows·cols/2 bytes, grown when
// short and returned for the next call. The results of every product are
// the same bits in either layout; only the order of the bytes changes.
func TileQ4(q []byte, rows, cols int, tmp []byte) []byte {
	rb := cols / 2
	ng := cols / format.GroupSize
	tb := TileRows * rb
	if cap(tmp) < tb {
		tmp = make([]byte, tb)
	}
	tmp = tmp[:tb]
	for t := 0; t+TileRows <= rows; t += TileRows {
		src := q[t*rb : t*rb+tb]
		for r := range TileRows {
			row := src[r*rb : r*rb+rb]
			for g := range ng {
				for k := range tileQwords {
					*(*[8]byte)(tmp[tileAt(g, r, k):]) = *(*[8]byte)(row[g*tileGroup+8*k:])
				}
			}
		}
		copy(src, tmp)
	}
	return tmp
}

// UntileQ4 is TileQ4's inverse: it rearranges the tiled q4 weights q of a
// rows×cols matrix back to row-major order in place, for readers of a
// store's raw bytes that want rows (the GGUF writer, the low-bit packer).
// tmp is scratch as for TileQ4.
func UntileQ4(q []byte, rows, cols int, tmp []byte) []byte {
	rb := cols / 2
	tb := TileRows * rb
	if cap(tmp) < tb {
		tmp = make([]byte, tb)
	}
	tmp = tmp[:tb]
	if rb == 0 {
		return tmp
	}
	for t := 0; t+TileRows <= rows; t += TileRows {
		src := q[t*rb : t*rb+tb]
		untile(tmp, src, rb)
		copy(src, tmp)
	}
	return tmp
}

// tileQwords is the qwords of one row's group.
const tileQwords = tileGroup / 8

// tileAt is the offset of row r's qword k of group g from its tile's start.
func tileAt(g, r, k int) int {
	return g*TileRows*tileGroup + k*TileRows*8 + r*8
}

// rowQ4 returns row r's q4 bytes in row-major order: a view of Q, or, for
// a row inside a tile of a tiled matrix, the row gathered into buf (a
// heap buffer when buf is shorter than the row).
func (m *Mat) rowQ4(r int, buf []byte) []byte {
	rb := m.Cols / 2
	if !m.Tiled || r >= m.Rows/TileRows*TileRows {
		return m.Q[r*rb : (r+1)*rb]
	}
	if len(buf) < rb {
		buf = make([]byte, rb)
	}
	buf = buf[:rb]
	tile := m.Q[r/TileRows*TileRows*rb:][:TileRows*rb]
	for g := range rb / tileGroup {
		for k := range tileQwords {
			*(*[8]byte)(buf[g*tileGroup+8*k:]) = *(*[8]byte)(tile[tileAt(g, r%TileRows, k):])
		}
	}
	return buf
}

// FlatQ returns m's quantised weights row-major: Q itself, or a row-major
// copy of a tiled matrix's, for consumers that read rows in place (the
// GPU's upload).
func (m *Mat) FlatQ() []byte {
	if !m.Tiled {
		return m.Q
	}
	out := make([]byte, len(m.Q))
	m.FlatQInto(out)
	return out
}

// FlatQInto writes m's quantised weights row-major into dst (len(m.Q)
// bytes), without allocating: the GPU's expert pool stages records so.
func (m *Mat) FlatQInto(dst []byte) {
	dst = dst[:len(m.Q)]
	if !m.Tiled {
		copy(dst, m.Q)
		return
	}
	rb := m.Cols / 2
	if rb == 0 {
		return
	}
	for r := range m.Rows {
		row := dst[r*rb : (r+1)*rb]
		if src := m.rowQ4(r, row); &src[0] != &row[0] {
			copy(row, src)
		}
	}
}
