package model

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/kernels"
)

// The MTP head of qwen3_5_moe predicts the token after next. Row j of it
// pairs the trunk's final-normed hidden state h_j with the embedding of the
// token at j+1:
//
//	z = fc([pre_fc_norm_embedding(embed(t_{j+1})) ‖ pre_fc_norm_hidden(h_j)])
//	z = decoder_layer(z) at rotary position j+1, attending to MTP rows 0..j
//	logits = lm_head(mtp.norm(z))   predicts t_{j+2}
//
// The decoder layer is a full-attention MoE layer whose experts are stored as
// layer num_hidden_layers; it has its own KV cache (State.mk/mv), one row per
// trunk position. For chained drafts the head is fed its own post-norm
// output in place of h_j.

// mtpScratch holds the MTP head's buffers beyond the runner's shared ones.
type mtpScratch struct {
	in     []float32     // [rows][2*hidden] normed embedding ‖ normed hidden
	out    []float32     // [rows][hidden] post-norm outputs (the chained drafts' hidden)
	follow FollowScratch // rows gathered for MTPFollow
}

func (r *Runner) mtpInit() {
	if r.mtp.in != nil {
		return
	}
	H := r.M.Config.Hidden
	r.mtp.in = make([]float32, r.MaxRows*2*H)
	r.mtp.out = make([]float32, r.MaxRows*H)
}

// MTPForward runs nb MTP rows at cache rows pos..pos+nb-1 of st (rotary
// positions pos+1..): row i pairs hidden[i] ([nb][hidden]) with toks[i].
// It neither reads nor moves st.MTPPos, so it serves chained drafts that
// must not count as consumed. With out non-nil it writes the logits of every
// row ([nb][vocab]) when all is true, else of the last row ([vocab]). The
// post-norm outputs are kept until the next call (MTPHidden). hidden may be
// a slice of Hidden or MTPHidden.
func (r *Runner) MTPForward(st *State, pos int, hidden []float32, toks []int, out []float32, all bool) error {
	m := r.M
	mt := m.MTP
	if err := m.CheckMTPRows(st, pos, hidden, toks, out, all, r.MaxRows); err != nil {
		return err
	}
	c := &m.Config
	H, V := c.Hidden, c.Vocab
	nb := len(toks)
	r.mtpInit()
	in := r.mtp.in
	ne, nh := &mt.NormEmbed, &mt.NormHidden
	for i, t := range toks {
		e := r.y[i*H : (i+1)*H]
		m.Arch.Embed.Mat.Row(e, t)
		kernels.RMSNorm(in[2*i*H:(2*i+1)*H], e, ne.W, ne.Eps, ne.ZeroCentred)
		kernels.RMSNorm(in[(2*i+1)*H:(2*i+2)*H], hidden[i*H:(i+1)*H], nh.W, nh.Eps, nh.ZeroCentred)
		r.positions[i] = pos + 1 + i
	}
	r.Pool.MatMul(r.x, &mt.FC.Mat, in, nb)
	r.ropeTables(nb)
	r.st, r.pos, r.nb = st, pos, nb
	defer func() { r.st = nil }()
	L := &mt.Layer
	r.Norm(&L.In, false)
	L.Mixer.Mix(r, len(m.Arch.Layers)) // the MTP layer's own cache
	r.Norm(&L.Post, true)
	if err := L.FFN.Forward(r); err != nil {
		return err
	}
	mo := r.mtp.out
	r.norm(mo, r.x, r.y, &mt.Norm, nb)
	switch {
	case out == nil:
	case all:
		r.Pool.MatMul(out[:nb*V], &m.Arch.LMHead.Mat, mo, nb)
	default:
		r.Pool.MatMul(out[:V], &m.Arch.LMHead.Mat, mo[(nb-1)*H:nb*H], 1)
	}
	return nil
}

// CheckMTPRows checks the arguments of an MTPForward (as any backend takes
// them) against m, st and a runner of maxRows rows.
func (m *Model) CheckMTPRows(st *State, pos int, hidden []float32, toks []int, out []float32, all bool, maxRows int) error {
	if m.MTP == nil {
		return fmt.Errorf("mtp: the model has no MTP head")
	}
	c := &m.Config
	H, V := c.Hidden, c.Vocab
	nb := len(toks)
	switch {
	case nb == 0 || nb > maxRows:
		return fmt.Errorf("mtp: %d rows, want 1..%d", nb, maxRows)
	case pos < 0 || pos+nb > st.Ctx:
		return fmt.Errorf("mtp: rows %d..%d outside the context of %d", pos, pos+nb-1, st.Ctx)
	case len(hidden) < nb*H:
		return fmt.Errorf("mtp: %d hidden values for %d rows of %d", len(hidden), nb, H)
	case out != nil && (all && len(out) < nb*V || !all && len(out) < V):
		return fmt.Errorf("mtp: logits buffer too small")
	case st.mk == nil:
		return fmt.Errorf("mtp: the state has no MTP cache")
	}
	for _, t := range toks {
		if t < 0 || t >= V {
			return fmt.Errorf("mtp: token id %d outside the vocabulary [0,%d)", t, V)
		}
	}
	return nil
}

// MTPHidden returns the post-norm output of row i of the last MTPForward:
// the hidden state a chained draft feeds back into the head.
func (r *Runner) MTPHidden(i int) []float32 {
	H := r.M.Config.Hidden
	return r.mtp.out[i*H : (i+1)*H]
}

// MTPFollow brings st's MTP cache up to the trunk after a trunk step. The
// last step of the runner consumed tokens (its rows 0..len-1, now ending at
// st.Pos, after any Commit); next is the token after them, or -1 when it is
// not known yet. It runs the MTP rows that became computable, in batches:
// row base-1 (base = st.Pos-len(tokens)) from the hidden state saved in st,
// unless already computed with the same token, then one row per step row
// but the last, and the last too when next >= 0. The last step row's hidden
// state is saved in st for the row that waits for its token. With next >= 0
// and out non-nil, the logits of the last row ([vocab]: the head's
// prediction of the token after next) go to out, and MTPHidden(0) is that
// row's post-norm output.
//
// With tokens empty it runs row st.Pos-1 alone from the saved hidden state
// and next (the first draft after a prefill). Rows below that a state never
// computed (one prefilled with drafts off) stay stale: drafts get worse,
// never the tokens, since every draft is verified.
func (r *Runner) MTPFollow(st *State, tokens []int, next int, out []float32) error {
	if r.M.MTP == nil {
		return fmt.Errorf("mtp: the model has no MTP head")
	}
	r.mtpInit()
	return FollowMTP(r, st, tokens, next, out, r.MaxRows, r.Hidden, &r.mtp.follow)
}

// MTPRows runs rows of a model's MTP head: model.Runner, or a GPU backend.
type MTPRows interface {
	// MTPForward is model.Runner.MTPForward.
	MTPForward(st *State, pos int, hidden []float32, toks []int, out []float32, all bool) error
	// MTPHidden is model.Runner.MTPHidden: writable, so that a follow can
	// move its last row's output to row 0.
	MTPHidden(i int) []float32
}

// FollowScratch holds a follow's gathered rows: [rows][hidden] and [rows].
type FollowScratch struct {
	Hid []float32
	Tok []int
}

// FollowMTP is MTPFollow over any runner f of maxRows rows: last(i) is row
// i of the trunk step that consumed tokens (the runner's final-normed
// hidden state), sc the scratch it gathers rows into (allocated on first
// use). The state's bookkeeping (MTPPos, the saved hidden state) is the
// same whichever runner keeps the head's cache.
func FollowMTP(f MTPRows, st *State, tokens []int, next int, out []float32, maxRows int, last func(i int) []float32, sc *FollowScratch) error {
	if st.mk == nil {
		return fmt.Errorf("mtp: the state has no MTP cache")
	}
	H := len(st.mh)
	nt := len(tokens)
	base := st.Pos - nt
	if base < 0 || nt > maxRows {
		return fmt.Errorf("mtp: follow of %d tokens at position %d", nt, st.Pos)
	}
	if out != nil && next < 0 {
		return fmt.Errorf("mtp: logits asked for without the next token")
	}
	if len(sc.Hid) < maxRows*H {
		sc.Hid, sc.Tok = make([]float32, maxRows*H), make([]int, maxRows)
	}
	tokAt := func(p int) int { // the token at trunk position p in [base, base+nt]
		if p-base < nt {
			return tokens[p-base]
		}
		return next
	}
	start := max(base-1, 0)
	if nt > 0 && base > 0 && st.MTPPos == base && st.mtpTok == tokens[0] {
		start = base // row base-1 is already there, with the same token
	}
	end := base + nt - 1 // rows [start, end)
	if next >= 0 {
		end++
	}
	for lo := start; lo < end; {
		n := min(maxRows, end-lo)
		for i := 0; i < n; i++ {
			j := lo + i
			src := st.mh
			if j >= base {
				src = last(j - base)
			}
			copy(sc.Hid[i*H:(i+1)*H], src)
			sc.Tok[i] = tokAt(j + 1)
		}
		var o []float32
		if lo+n == end {
			o = out
		}
		if err := f.MTPForward(st, lo, sc.Hid[:n*H], sc.Tok[:n], o, false); err != nil {
			return err
		}
		if o != nil && n > 1 {
			// Callers chain from row 0: move the last row's output there.
			copy(f.MTPHidden(0), f.MTPHidden(n-1))
		}
		lo += n
	}
	if end > start {
		st.MTPPos, st.mtpTok = end, tokAt(end)
	} else if st.MTPPos > end {
		st.MTPPos = end
	}
	if nt > 0 {
		copy(st.mh, last(nt-1))
	}
	return nil
}
