package kernels

import "github.com/sluicelm/sluice/internal/format"

// TileRows is the rows of a tile in the tiled q4 layout (Mat.Tiled): the
// decode kernel's 8 rows a step.
const TileRows = 8

// tileGroup is the bytes of one row's group of q4 weights.
const tileGroup = format.GroupSize / 2

// rowQRoom is the stack room of one gathered q4 row (8192 columns); wider
// rows take a heap buffer.
const rowQRoom = 4096

// TileQ4 rearranges the row-major q4 weights q of a rows×cols matrix into
// the tiled layout of Mat.Tiled, in place: within each whole tile of
// TileRows rows, group g of row r moves to (g·TileRows + r)·32 bytes from
// the tile's start. tmp is scratch of TileRows·cols/2 bytes, grown when
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
				d := (g*TileRows + r) * tileGroup
				*(*[tileGroup]byte)(tmp[d : d+tileGroup]) = *(*[tileGroup]byte)(row[g*tileGroup : g*tileGroup+tileGroup])
			}
		}
		copy(src, tmp)
	}
	return tmp
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
	off := r % TileRows * tileGroup
	for g := range rb / tileGroup {
		s := g*TileRows*tileGroup + off
		*(*[tileGroup]byte)(buf[g*tileGroup : g*tileGroup+tileGroup]) = *(*[tileGroup]byte)(tile[s : s+tileGroup])
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
