//go:build linux

package gpu

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// Speculative decoding on the GPU. The MTP head runs on the device beside
// the trunk: its weights upload with the dense ones, its experts are the
// expert layer after the trunk's (resident, or through the same pool), and
// its KV cache is one more attention cache in each sequence's device
// state. The host keeps the head's bookkeeping in model.State (MTPPos, the
// saved hidden state) through model.FollowMTP, as on the CPU, so that what
// a draft is does not depend on where it ran.
//
// A verify of rows rows is one step (rows ≤ Rows). While one is armed
// (Speculate), the conv and delta-rule kernels also write each recurrent
// layer's state after every row but the last into the runner's snapshot
// buffer (Config.Drafts states of each layer, allocated with the scratch),
// and Commit copies back the one after the last kept row. One buffer
// serves every sequence: a verify is armed for one state at a time.

// mtpHead is the runner's MTP and verify state.
type mtpHead struct {
	drafts int // most drafts a verify holds snapshots for (0: none)

	in, out uintptr // device scratch: [rows][2·hidden] input, [rows][hidden] post-norm output
	// Pinned host memory: the input as the host builds it, the post-norm
	// outputs (MTPHidden) and the trunk rows a follow reads.
	offIn, offOut, offHid int
	pin, pout, phid       []float32
	row                   func(i int) []float32 // phid's row i, for FollowMTP (made once)
	follow                model.FollowScratch
	greedy                greedyRows // MTPFollowArgmax's view of the runner

	// The last trunk step: its state, first position and rows (a follow
	// reads its final-normed rows).
	last               *dstate
	lastBase, lastRows int

	// The verify's snapshots: per recurrent layer, [drafts] conv
	// histories and [drafts] recurrent states; the armed verify's state,
	// first position and rows.
	snap      cuda.Buf
	conv, rec []uintptr
	owner     *dstate
	base      int
	rows      int
}

// snapBytes is the device memory of the verify's snapshots.
func (r *Runner) snapBytes() int64 {
	if r.mtp.drafts == 0 {
		return 0
	}
	var n int64
	for _, sp := range r.M.Arch.States {
		n += int64(sp.ConvFloats + sp.RecFloats)
	}
	return 4 * int64(r.mtp.drafts) * n
}

// allocSnap allocates the verify's snapshots (nothing when no drafts were
// asked for, or the model has no recurrent layers).
func (r *Runner) allocSnap() error {
	m := &r.mtp
	if r.snapBytes() == 0 {
		return nil
	}
	states := r.M.Arch.States
	m.conv, m.rec = make([]uintptr, len(states)), make([]uintptr, len(states))
	offs := make([]int, 2*len(states))
	var sz int
	for l, sp := range states {
		offs[2*l] = sz
		sz += (4*m.drafts*sp.ConvFloats + 255) &^ 255
		offs[2*l+1] = sz
		sz += (4*m.drafts*sp.RecFloats + 255) &^ 255
	}
	buf, err := r.Dev.Alloc(sz)
	if err != nil {
		return fmt.Errorf("verify snapshots for %d drafts (%.2f GiB): %w", m.drafts, gib(int64(sz)), err)
	}
	m.snap = buf
	for l, sp := range states {
		if sp.RecFloats > 0 {
			m.conv[l], m.rec[l] = buf.Ptr+uintptr(offs[2*l]), buf.Ptr+uintptr(offs[2*l+1])
		}
	}
	return nil
}

// snapAt returns where the step's rows save recurrent layer l's conv
// history (conv) or state, and how many rows save: none unless a verify
// is armed for the step's state; the verify's last row never, its state
// being the current one when every draft is kept.
func (r *Runner) snapAt(l int, conv bool) (uintptr, int) {
	m := &r.mtp
	if m.rows == 0 || m.owner != r.cur || r.graphing && r.nb != m.rows {
		return 0, 0 // a recorded one-row step never keeps snapshots
	}
	j := r.pos - m.base // verify rows before this step
	n := min(m.rows-1-j, r.nb)
	if n <= 0 || j < 0 {
		return 0, 0
	}
	if conv {
		return m.conv[l] + uintptr(4*j*r.cur.convN[l]), n
	}
	return m.rec[l] + uintptr(4*j*r.cur.recN[l]), n
}

// MaxDrafts is the most drafts a verify may hold: Config.Drafts, within
// the step's rows; 0 when the model has no MTP head.
func (r *Runner) MaxDrafts() int { return r.mtp.drafts }

// Speculate arms per-row snapshots for a verify of rows tokens of st, as
// model.State.Speculate does on the host: the next Forward (rows tokens,
// one step) keeps the recurrent state after each row but the last, and
// Commit keeps any prefix of the rows.
func (r *Runner) Speculate(st *model.State, rows int) error {
	m := &r.mtp
	switch {
	case rows < 1:
		return fmt.Errorf("gpu: speculate over %d rows", rows)
	case rows-1 > m.drafts:
		return fmt.Errorf("gpu: a verify of %d drafts, and the backend was opened for %d (Config.Drafts)", rows-1, m.drafts)
	case st.Pos+rows > st.Ctx:
		return fmt.Errorf("gpu: a verify of %d rows at position %d exceeds the context of %d", rows, st.Pos, st.Ctx)
	}
	return r.Dev.Do(func() error {
		ds, err := r.state(st)
		if err != nil {
			return err
		}
		if st.Pos > 0 && ds.pos != st.Pos {
			return fmt.Errorf("gpu: a verify at position %d of a state whose GPU copy is at %d", st.Pos, ds.pos)
		}
		m.owner, m.base, m.rows = ds, st.Pos, rows
		return nil
	})
}

// Commit ends the verify Speculate armed, keeping its first n rows: st.Pos
// becomes the armed position + n and every recurrent layer returns, on the
// device, to its state after row n-1. Keys and values past the new
// position are overwritten before they are read.
func (r *Runner) Commit(st *model.State, n int) error {
	m := &r.mtp
	return r.Dev.Do(func() error {
		ds, err := r.state(st)
		if err != nil {
			return err
		}
		if m.rows == 0 || m.owner != ds {
			return fmt.Errorf("gpu: commit without a speculative verify of this state")
		}
		done := st.Pos - m.base
		m.rows, m.owner = 0, nil
		if ds.pos != st.Pos {
			return fmt.Errorf("gpu: commit after a verify that did not complete (state at %d, its GPU copy at %d)", st.Pos, ds.pos)
		}
		if n < 1 || n > done {
			return fmt.Errorf("gpu: commit of %d rows, the verify consumed %d", n, done)
		}
		if n < done {
			for l := range ds.conv {
				if ds.conv[l] == 0 {
					continue
				}
				cw, rw := 4*ds.convN[l], 4*ds.recN[l]
				if err := r.Dev.CopyDAsync(ds.conv[l], m.conv[l]+uintptr((n-1)*cw), cw, r.s); err != nil {
					return err
				}
				if err := r.Dev.CopyDAsync(ds.rec[l], m.rec[l]+uintptr((n-1)*rw), rw, r.s); err != nil {
					return err
				}
			}
			if err := r.Dev.SyncStream(r.s); err != nil {
				ds.pos = -2
				return err
			}
		}
		st.Pos = m.base + n
		ds.pos = st.Pos
		return nil
	})
}

// MTPForward runs nb MTP rows at cache rows pos..pos+nb-1 of st on the
// device, as model.Runner.MTPForward: row i pairs hidden[i] ([nb][hidden],
// on the host) with toks[i]; the logits of every row (all) or of the last
// go to out when it is not nil, and the post-norm outputs to MTPHidden.
func (r *Runner) MTPForward(st *model.State, pos int, hidden []float32, toks []int, out []float32, all bool) error {
	_, err := r.mtpForward(st, pos, hidden, toks, out, all, false)
	return err
}

// MTPForwardArgmax is MTPForward that returns the last row's greedy choice,
// computed on the device: no logits come back to the host.
func (r *Runner) MTPForwardArgmax(st *model.State, pos int, hidden []float32, toks []int) (int, error) {
	return r.mtpForward(st, pos, hidden, toks, nil, false, true)
}

func (r *Runner) mtpForward(st *model.State, pos int, hidden []float32, toks []int, out []float32, all, argmax bool) (int, error) {
	if err := r.M.CheckMTPRows(st, pos, hidden, toks, out, all, r.maxRows); err != nil {
		return 0, err
	}
	best := 0
	err := r.Dev.Do(func() error {
		ds, err := r.state(st)
		if err != nil {
			return err
		}
		if ds.pos != st.Pos {
			return fmt.Errorf("gpu: MTP rows for a state at position %d whose GPU copy is at %d", st.Pos, ds.pos)
		}
		best, err = r.mtpRows(ds, pos, hidden, toks, out, all, argmax)
		return err
	})
	return best, err
}

// mtpKey names a recorded run of the MTP head: its rows, and which logits
// it computes (0: none, 1: the last row's, 2: every row's).
type mtpKey struct{ rows, logits int }

// mtpRows runs the head over nb rows and waits for its outputs (on the
// device thread). With every expert resident and at most a verify's rows,
// it is recorded once per state, row count and logits wanted, and replayed
// (positions read on the device, as the decode step's), like the step.
func (r *Runner) mtpRows(ds *dstate, pos int, hidden []float32, toks []int, out []float32, all, argmax bool) (int, error) {
	a, m := r.M.Arch, &r.mtp
	H, V, nb := r.H, r.V, len(toks)
	rp := &a.Rope
	rh := rp.Dim / 2
	for i, t := range toks {
		in := m.pin[2*i*H : 2*(i+1)*H]
		a.Embed.Mat.Row(in[:H], t)
		copy(in[H:], hidden[i*H:(i+1)*H])
		cos, sin := r.pcos[i*rh:(i+1)*rh], r.psin[i*rh:(i+1)*rh]
		kernels.RopeTable(cos, sin, pos+1+i, rp.InvFreq)
		if rp.Scale != 1 {
			kernels.Scale(cos, rp.Scale)
			kernels.Scale(sin, rp.Scale)
		}
	}
	key := mtpKey{rows: nb}
	switch {
	case argmax:
		key.logits = 1
	case out == nil:
	case all:
		key.logits = 2
	default:
		key.logits = 1
	}
	r.cur, r.pos, r.nb, r.err = ds, pos, nb, nil
	defer func() { r.cur = nil }()
	r.mark("mtp_in")
	r.check(r.Dev.UploadAsync(m.in, r.pin, m.offIn, 4*nb*2*H, r.s))
	if rh > 0 {
		r.check(r.Dev.UploadAsync(r.cos, r.pin, r.offCos, 4*nb*rh, r.s))
		r.check(r.Dev.UploadAsync(r.sin, r.pin, r.offSin, 4*nb*rh, r.s))
	}
	if !r.NoGraphs && r.exKind != "" && nb <= m.drafts+1 {
		r.setPosDev(pos, nb)
		g := ds.mgraph[key]
		if g == nil {
			var err error
			if g, err = r.capture(func() error { return r.mtpBody(nb, key.logits) }); err != nil {
				return 0, fmt.Errorf("gpu: recording %d MTP rows: %w", nb, err)
			}
			if ds.mgraph == nil {
				ds.mgraph = map[mtpKey]*graph{}
			}
			ds.mgraph[key] = g
		}
		r.mark("mtp_graph")
		r.check(r.Dev.LaunchGraph(g.g, r.s))
		r.replays++
		r.replayed += g.nodes
	} else if err := r.mtpBody(nb, key.logits); err != nil {
		return 0, err
	}
	r.mark("download")
	r.check(r.Dev.DownloadAsync(r.pin, m.offOut, m.out, 4*nb*H, r.s))
	lw := [3]int{0, V, nb * V}[key.logits]
	if argmax {
		lw = 0
		r.check(r.Dev.DownloadAsync(r.pin, r.offAm, r.am, 4, r.s))
	}
	if lw > 0 {
		r.check(r.Dev.DownloadAsync(r.plog, 0, r.logits, 4*lw, r.s))
	}
	r.mark("")
	if err := r.Dev.SyncStream(r.s); err != nil {
		return 0, err
	}
	if r.err != nil {
		return 0, r.err
	}
	r.prof.collect(r)
	r.collectWaits()
	copy(out[:lw], r.plog.F32()[:lw])
	if !argmax {
		return 0, nil
	}
	return choice(r.pam[0], pos+len(toks))
}

// mtpBody queues the head over the nb rows of its input in m.in: the two
// norms, fc, the decoder layer, the final norm into m.out, and the logits
// (0: none, 1: the last row's, with its greedy choice in r.am, 2: every
// row's) into r.logits.
func (r *Runner) mtpBody(nb, logits int) error {
	a, mt, m := r.M.Arch, r.M.MTP, &r.mtp
	H := r.H
	ne, nh := &mt.NormEmbed, &mt.NormHidden
	r.check(r.k.RMSNorm(r.s, m.in, m.in, 0, r.vecs[&ne.W[0]], nb, H, 2*H, ne.Eps, ne.ZeroCentred))
	r.check(r.k.RMSNorm(r.s, m.in+uintptr(4*H), m.in+uintptr(4*H), 0, r.vecs[&nh.W[0]], nb, H, 2*H, nh.Eps, nh.ZeroCentred))
	r.mul(r.x, r.mats[&mt.FC], m.in, nb, 2*H)
	L := &mt.Layer
	r.Norm(&L.In, false)
	L.Mixer.Mix(r, len(a.Layers)) // the MTP layer's own cache
	r.Norm(&L.Post, true)
	if err := L.FFN.Forward(r); err != nil {
		r.check(err)
	}
	r.mark("mtp_head")
	n := &mt.Norm
	r.check(r.k.RMSNorm(r.s, m.out, r.x, r.y, r.vecs[&n.W[0]], nb, H, H, n.Eps, n.ZeroCentred))
	lm := r.mats[&a.LMHead]
	switch logits {
	case 2:
		r.mul(r.logits, lm, m.out, nb, H)
	case 1:
		r.mul(r.logits, lm, m.out+uintptr(4*(nb-1)*H), 1, H)
		r.check(r.k.Argmax(r.s, r.logits, r.am, 1, r.V))
	}
	return r.err
}

// MTPHidden returns the post-norm output of row i of the last MTPForward
// (host memory, valid until the next call).
func (r *Runner) MTPHidden(i int) []float32 {
	return r.mtp.pout[i*r.H : (i+1)*r.H]
}

// MTPFollow brings st's MTP cache up to the trunk after a trunk step, as
// model.Runner.MTPFollow: tokens are the rows of the runner's last step
// that st kept (all of them, or a verify's first rows after Commit).
func (r *Runner) MTPFollow(st *model.State, tokens []int, next int, out []float32) error {
	return r.follow(r, st, tokens, next, out)
}

// follow is MTPFollow through f: the runner, or its greedy view.
func (r *Runner) follow(f model.MTPRows, st *model.State, tokens []int, next int, out []float32) error {
	if r.M.MTP == nil {
		return fmt.Errorf("mtp: the model has no MTP head")
	}
	m := &r.mtp
	if nt := len(tokens); nt > 0 {
		err := r.Dev.Do(func() error {
			ds, err := r.state(st)
			if err != nil {
				return err
			}
			if m.last != ds || ds.pos != st.Pos || m.lastBase != st.Pos-nt || nt > m.lastRows {
				return fmt.Errorf("gpu: an MTP follow of %d tokens ending at %d that are not the last step's rows", nt, st.Pos)
			}
			if err := r.Dev.DownloadAsync(r.pin, m.offHid, r.final, 4*nt*r.H, r.s); err != nil {
				return err
			}
			return r.Dev.SyncStream(r.s)
		})
		if err != nil {
			return err
		}
	}
	return model.FollowMTP(f, st, tokens, next, out, r.maxRows, m.row, &m.follow)
}

// MTPFollowArgmax is MTPFollow that returns the greedy choice of the head's
// last row (the token after next), computed on the device: no logits come
// back to the host. next must be known.
func (r *Runner) MTPFollowArgmax(st *model.State, tokens []int, next int) (int, error) {
	if next < 0 {
		return 0, fmt.Errorf("mtp: a greedy choice asked for without the next token")
	}
	g := &r.mtp.greedy
	g.r, g.best = r, -1
	if err := r.follow(g, st, tokens, next, greedyOut); err != nil {
		return 0, err
	}
	if g.best < 0 {
		return 0, fmt.Errorf("mtp: the follow ran no row for the next token")
	}
	return g.best, nil
}

// greedyOut marks, for FollowMTP, the row whose logits are wanted; the
// greedy view computes its choice instead.
var greedyOut = make([]float32, 0)

// greedyRows is the runner as model.MTPRows for MTPFollowArgmax: a row
// asked for logits (greedyOut) gives its greedy choice.
type greedyRows struct {
	r    *Runner
	best int
}

func (g *greedyRows) MTPForward(st *model.State, pos int, hidden []float32, toks []int, out []float32, all bool) error {
	if out == nil {
		return g.r.MTPForward(st, pos, hidden, toks, nil, false)
	}
	var err error
	g.best, err = g.r.MTPForwardArgmax(st, pos, hidden, toks)
	return err
}

func (g *greedyRows) MTPHidden(i int) []float32 { return g.r.MTPHidden(i) }
