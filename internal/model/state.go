package model

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/block"
)

// State is one sequence's memory, as the family's StateSpecs say: the KV
// cache of each attention layer (a ring of window + Model.MaxBatch rows for
// a sliding-window layer) and the conv history and recurrent matrix of each
// DeltaNet layer, plus the MTP layer's own KV cache. Everything is
// allocated once, for Ctx positions.
//
// The MTP cache holds one row per trunk position: row j pairs the trunk's
// final hidden state h_j with the token at j+1 and sits at rotary position
// j+1. Rows below MTPPos are valid; row MTPPos-1 was computed with token
// mtpTok, which may still be a sampled token the trunk has not consumed.
type State struct {
	Pos int // tokens consumed so far
	Ctx int // capacity in positions

	kc, vc [][]float32 // per layer: [rows][kv_heads*head_dim], nil for DeltaNet layers
	kvRows []int       // per layer: rows of kc/vc (Ctx, or a ring's size); position p is at row p % rows
	window []int       // per layer: a ring's window, 0 otherwise
	conv   [][]float32 // per layer: [kernel-1][conv_dim], oldest first
	rec    [][]float32 // per layer: [v_heads][k_dim][v_dim]

	MTPPos int       // MTP rows consumed
	mk, mv []float32 // MTP layer KV cache: [ctx][kv_heads*head_dim]
	mh     []float32 // [hidden] h_{Pos-1}, the trunk hidden whose MTP row may still wait for its token
	mtpTok int       // the token row MTPPos-1 was computed with

	snap snapshots // per-row DeltaNet snapshots of a speculative verify
}

// snapshots hold the DeltaNet state after each row of a verify batch but
// the last, so that Commit can roll rejected rows back. Allocated once, on
// the first Speculate, for the largest batch asked for.
type snapshots struct {
	rows int         // rows armed for the current verify; 0 = off
	base int         // Pos when armed
	cap  int         // rows the buffers hold (rows-1 snapshots are kept)
	conv [][]float32 // per layer: [cap][kernel-1][conv_dim], nil for attention layers
	rec  [][]float32 // per layer: [cap][v_heads][k_dim][v_dim]
}

// NewState allocates a sequence state for ctx positions.
func (m *Model) NewState(ctx int) (*State, error) {
	c := &m.Config
	if ctx <= 0 {
		return nil, fmt.Errorf("context length %d must be positive", ctx)
	}
	s := &State{Ctx: ctx}
	for _, sp := range m.Arch.States {
		rows, win, vw := 0, 0, sp.KVWidth
		switch sp.Kind {
		case block.KV:
			rows = ctx
		case block.Ring:
			rows, win = CacheRows(sp, ctx, m.MaxBatch), sp.Window
		case block.Latent:
			rows, vw = ctx, sp.IndexWidth
		}
		if rows > 0 {
			s.kc = append(s.kc, make([]float32, rows*sp.KVWidth))
			s.vc = append(s.vc, make([]float32, rows*vw))
			s.conv = append(s.conv, nil)
			s.rec = append(s.rec, nil)
		} else {
			s.kc = append(s.kc, nil)
			s.vc = append(s.vc, nil)
			s.conv = append(s.conv, make([]float32, sp.ConvFloats))
			s.rec = append(s.rec, make([]float32, sp.RecFloats))
		}
		s.kvRows = append(s.kvRows, rows)
		s.window = append(s.window, win)
	}
	if m.MTP != nil {
		sp := m.Arch.MTPState
		vw := sp.KVWidth
		if sp.Kind == block.Latent {
			vw = sp.IndexWidth // a latent layer's second cache holds the indexer's keys
		}
		s.mk = make([]float32, ctx*sp.KVWidth)
		s.mv = make([]float32, ctx*vw)
		s.mh = make([]float32, c.Hidden)
	}
	return s, nil
}

// CacheRows is the rows of a KV or ring layer's key (and value) cache in a
// state of ctx positions: ctx, or for a sliding window the window plus one
// step's rows (maxBatch), so that no row of a step overwrites a position
// another row of it, or a rolled-back verify's next step, still attends
// to.
func CacheRows(sp block.StateSpec, ctx, maxBatch int) int {
	if sp.Kind == block.Ring {
		return min(ctx, sp.Window+maxBatch)
	}
	return ctx
}

// StatesBytes is the memory NewState allocates for a model whose layers
// keep states (and whose MTP layer keeps mtp, when not nil) at ctx
// positions, with its rings of window + maxBatch rows and hidden floats
// for the MTP head's last hidden row; a verify's snapshots come on top.
// experts.StateBytes budgets with it before a model is loaded, and the
// GPU's states have the same layout (less the hidden row).
func StatesBytes(states []block.StateSpec, mtp *block.StateSpec, ctx, maxBatch, hidden int) int64 {
	var f int64
	for _, sp := range states {
		w := int64(sp.KVWidth)
		switch sp.Kind {
		case block.KV, block.Ring:
			f += 2 * int64(CacheRows(sp, ctx, maxBatch)) * w
		case block.Latent:
			f += int64(ctx) * (w + int64(sp.IndexWidth))
		default:
			f += int64(sp.ConvFloats + sp.RecFloats)
		}
	}
	if mtp != nil {
		vw := mtp.KVWidth
		if mtp.Kind == block.Latent {
			vw = mtp.IndexWidth
		}
		f += int64(ctx)*int64(mtp.KVWidth+vw) + int64(hidden)
	}
	return 4 * f
}

// kv returns the KV cache of layer l (l = the trunk's layer count: the MTP
// layer's) and its rows.
func (s *State) kv(l int) (kc, vc []float32, rows int) {
	if l == len(s.kc) {
		return s.mk, s.mv, s.Ctx
	}
	return s.kc[l], s.vc[l], s.kvRows[l]
}

// fits checks that a step of nb rows overwrites no ring row that a row of
// the same step still attends to.
func (s *State) fits(nb int) error {
	for l, w := range s.window {
		if w > 0 && s.kvRows[l] < s.Ctx && s.kvRows[l] < w+nb {
			return fmt.Errorf("state: a step of %d rows exceeds layer %d's ring of %d rows (window %d); make states after the runner", nb, l, s.kvRows[l], w)
		}
	}
	return nil
}

// Reset empties the state for a new sequence. KV rows need no clearing:
// positions past Pos are never read.
func (s *State) Reset() {
	s.Pos, s.MTPPos, s.mtpTok = 0, 0, 0
	s.snap.rows = 0
	for i := range s.conv {
		clear(s.conv[i])
		clear(s.rec[i])
	}
}

// StepStateBytes is the state a decode step at position pos moves
// through memory, in bytes: the cached rows it attends to, read (every
// position's keys and values; a ring's window; a latent layer's latents
// of the indexer's top-k and, past it, every position's indexer key, which
// the indexer scores), the rows it adds, written, and each DeltaNet layer's
// conv history and recurrent matrix, read and written back. The MTP
// layer's cache is left out: a step uses it only when drafting. Like a
// weight, each byte counts once a step, wherever the caches keep it.
func (m *Model) StepStateBytes(pos int) int64 {
	n := int64(pos) + 1
	var f int64
	for _, sp := range m.Arch.States {
		w := int64(sp.KVWidth)
		switch sp.Kind {
		case block.KV:
			f += 2 * (n + 1) * w
		case block.Ring:
			f += 2 * (min(n, int64(sp.Window)) + 1) * w
		case block.Latent:
			lat, keys := n, int64(0) // within the top-k the indexer scores nothing
			if sp.Attend > 0 && n > int64(sp.Attend) {
				lat, keys = int64(sp.Attend), n
			}
			f += (lat+1)*w + (keys+1)*int64(sp.IndexWidth)
		case block.Recurrent:
			f += 2 * int64(sp.ConvFloats+sp.RecFloats)
		}
	}
	return 4 * f
}

// Bytes is the memory the state holds.
func (s *State) Bytes() int64 {
	var n int
	for i := range s.kc {
		n += len(s.kc[i]) + len(s.vc[i]) + len(s.conv[i]) + len(s.rec[i])
	}
	n += len(s.mk) + len(s.mv) + len(s.mh)
	for i := range s.snap.conv {
		n += len(s.snap.conv[i]) + len(s.snap.rec[i])
	}
	return int64(n) * 4
}

// CopyFrom makes s an exact copy of src's first src.Pos positions (both
// from the same model; s.Ctx >= src.Pos). The server uses it to save and
// resume sequences and to start a request from a cached prefix.
func (s *State) CopyFrom(src *State) error {
	if len(s.kc) != len(src.kc) {
		return fmt.Errorf("state: copying between states of different models")
	}
	if src.Pos > s.Ctx {
		return fmt.Errorf("state: %d positions do not fit a context of %d", src.Pos, s.Ctx)
	}
	for i := range s.kc {
		if s.kc[i] != nil {
			rs, rd := src.kvRows[i], s.kvRows[i]
			w, vw := len(src.kc[i])/rs, len(src.vc[i])/rs
			if rs >= src.Pos && rd >= src.Pos {
				copy(s.kc[i][:src.Pos*w], src.kc[i][:src.Pos*w])
				copy(s.vc[i][:src.Pos*vw], src.vc[i][:src.Pos*vw])
				continue
			}
			// A ring: its last rows positions, each to its row in s.
			for p := max(0, src.Pos-min(rs, rd)); p < src.Pos; p++ {
				a, b := p%rs*w, p%rd*w
				copy(s.kc[i][b:b+w], src.kc[i][a:a+w])
				a, b = p%rs*vw, p%rd*vw
				copy(s.vc[i][b:b+vw], src.vc[i][a:a+vw])
			}
		} else {
			copy(s.conv[i], src.conv[i])
			copy(s.rec[i], src.rec[i])
		}
	}
	if s.mk != nil && src.mk != nil {
		w, vw := len(src.mk)/src.Ctx, len(src.mv)/src.Ctx
		n := min(src.MTPPos, s.Ctx)
		copy(s.mk[:n*w], src.mk[:n*w])
		copy(s.mv[:n*vw], src.mv[:n*vw])
		copy(s.mh, src.mh)
	}
	s.Pos, s.MTPPos, s.mtpTok = src.Pos, min(src.MTPPos, s.Ctx), src.mtpTok
	if s.mk == nil || src.mk == nil {
		s.MTPPos = 0
	}
	s.snap.rows = 0
	return nil
}

// Speculate arms per-row snapshots for a verify batch of rows tokens: the
// next Forward (of at most rows tokens, in one step or several) records the
// DeltaNet conv history and recurrent state after each row but the last,
// and Commit then keeps any prefix of the batch. Snapshot memory is
// allocated on the first call for a given batch size and reused; plain
// forwards, without Speculate, record nothing.
func (s *State) Speculate(rows int) error {
	if rows < 1 {
		return fmt.Errorf("state: speculate over %d rows", rows)
	}
	if s.Pos+rows > s.Ctx {
		return fmt.Errorf("state: a verify of %d rows at position %d exceeds the context of %d", rows, s.Pos, s.Ctx)
	}
	if need := rows - 1; need > s.snap.cap {
		if s.snap.conv == nil {
			s.snap.conv = make([][]float32, len(s.conv))
			s.snap.rec = make([][]float32, len(s.rec))
		}
		for i := range s.conv {
			if s.conv[i] != nil {
				s.snap.conv[i] = make([]float32, need*len(s.conv[i]))
				s.snap.rec[i] = make([]float32, need*len(s.rec[i]))
			}
		}
		s.snap.cap = need
	}
	s.snap.rows, s.snap.base = rows, s.Pos
	return nil
}

// Commit ends a speculative verify begun by Speculate, keeping its first n
// rows: Pos becomes the armed position + n and every DeltaNet layer returns
// to its state after row n-1. KV rows past the new Pos need no clearing;
// they are overwritten before they are read.
func (s *State) Commit(n int) error {
	sp := &s.snap
	if sp.rows == 0 {
		return fmt.Errorf("state: commit without a speculative verify")
	}
	done := s.Pos - sp.base
	sp.rows = 0
	if n < 1 || n > done {
		return fmt.Errorf("state: commit of %d rows, the verify consumed %d", n, done)
	}
	if n < done {
		for i := range s.conv {
			if s.conv[i] == nil {
				continue
			}
			cw, rw := len(s.conv[i]), len(s.rec[i])
			copy(s.conv[i], sp.conv[i][(n-1)*cw:n*cw])
			copy(s.rec[i], sp.rec[i][(n-1)*rw:n*rw])
		}
	}
	s.Pos = sp.base + n
	return nil
}

// snapRow returns where row i of the current step saves its DeltaNet state
// for layer l (conv history and recurrent matrix), or nils when no snapshot
// is wanted for it: when not speculating, and for the verify's last row,
// whose state is the current one if everything is accepted.
func (s *State) snapRow(l, i int) (conv, rec []float32) {
	sp := &s.snap
	if sp.rows == 0 {
		return nil, nil
	}
	j := s.Pos - sp.base + i
	if j >= sp.rows-1 || sp.conv[l] == nil {
		return nil, nil
	}
	cw, rw := len(s.conv[l]), len(s.rec[l])
	return sp.conv[l][j*cw : (j+1)*cw], sp.rec[l][j*rw : (j+1)*rw]
}
