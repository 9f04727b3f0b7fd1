package model

import "fmt"

// State is one sequence's memory: the KV cache of each attention layer and
// the conv history and recurrent matrix of each DeltaNet layer, plus the
// MTP layer's own KV cache. Everything is allocated once, for Ctx positions.
type State struct {
	Pos int // tokens consumed so far
	Ctx int // capacity in positions

	kc, vc [][]float32 // per layer: [ctx][kv_heads*head_dim], nil for DeltaNet layers
	conv   [][]float32 // per layer: [kernel-1][conv_dim], oldest first
	rec    [][]float32 // per layer: [v_heads][k_dim][v_dim]

	MTPPos int       // MTP rows consumed
	mk, mv []float32 // MTP layer KV cache
}

// NewState allocates a sequence state for ctx positions.
func (m *Model) NewState(ctx int) (*State, error) {
	c := &m.Config
	if ctx <= 0 {
		return nil, fmt.Errorf("context length %d must be positive", ctx)
	}
	s := &State{Ctx: ctx}
	kvw := c.KVHeads * c.HeadDim
	convDim := 2*c.LinearKeyHeads*c.LinearKeyDim + c.LinearValueHeads*c.LinearValueDim
	for _, L := range m.Layers {
		if L.Attn {
			s.kc = append(s.kc, make([]float32, ctx*kvw))
			s.vc = append(s.vc, make([]float32, ctx*kvw))
			s.conv = append(s.conv, nil)
			s.rec = append(s.rec, nil)
		} else {
			s.kc = append(s.kc, nil)
			s.vc = append(s.vc, nil)
			s.conv = append(s.conv, make([]float32, (c.ConvKernel-1)*convDim))
			s.rec = append(s.rec, make([]float32, c.LinearValueHeads*c.LinearKeyDim*c.LinearValueDim))
		}
	}
	if m.MTP != nil {
		s.mk = make([]float32, ctx*kvw)
		s.mv = make([]float32, ctx*kvw)
	}
	return s, nil
}

// Reset empties the state for a new sequence. KV rows need no clearing:
// positions past Pos are never read.
func (s *State) Reset() {
	s.Pos, s.MTPPos = 0, 0
	for i := range s.conv {
		clear(s.conv[i])
		clear(s.rec[i])
	}
}

// Bytes is the memory the state holds.
func (s *State) Bytes() int64 {
	var n int
	for i := range s.kc {
		n += len(s.kc[i]) + len(s.vc[i]) + len(s.conv[i]) + len(s.rec[i])
	}
	n += len(s.mk) + len(s.mv)
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
			w := len(src.kc[i]) / src.Ctx
			copy(s.kc[i][:src.Pos*w], src.kc[i][:src.Pos*w])
			copy(s.vc[i][:src.Pos*w], src.vc[i][:src.Pos*w])
		} else {
			copy(s.conv[i], src.conv[i])
			copy(s.rec[i], src.rec[i])
		}
	}
	if s.mk != nil && src.mk != nil {
		w := len(src.mk) / src.Ctx
		n := min(src.MTPPos, s.Ctx)
		copy(s.mk[:n*w], src.mk[:n*w])
		copy(s.mv[:n*w], src.mv[:n*w])
	}
	s.Pos, s.MTPPos = src.Pos, src.MTPPos
	return nil
}
