package model

import (
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
)

const mtpModel = "tiny-qwen3-5-moe"

// top2Gap is the difference between the two largest values of x.
func top2Gap(x []float32) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	for _, v := range x {
		f := float64(v)
		if f > a {
			a, b = f, a
		} else if f > b {
			b = f
		}
	}
	return a - b
}

// TestMTPMatchesReference runs the head over every reference prompt in
// exact mode (row t: h_t with token t+1 at position t+1) and requires the
// reference's mtp_argmax, except where our own top two logits are within
// 1e-3 (the reference keeps no MTP logits to judge its ties by).
func TestMTPMatchesReference(t *testing.T) {
	m := load(t, mtpModel, 16)
	if m.MTP == nil {
		t.Fatal("no MTP head loaded")
	}
	refs := testutil.LoadRefs(t, mtpModel)
	r := NewRunner(m, 2, 160)
	defer r.Close()
	H, V := m.Config.Hidden, m.Config.Vocab
	var rows, ties int
	for ci, c := range refs.Cases {
		T := len(c.Prompt)
		if T > r.MaxRows || len(c.MTPArgmax) != T-1 {
			t.Fatalf("case %d: %d tokens, %d mtp_argmax", ci, T, len(c.MTPArgmax))
		}
		st, _ := m.NewState(T)
		if err := r.Forward(st, c.Prompt, make([]float32, V), false); err != nil {
			t.Fatal(err)
		}
		hid := append([]float32(nil), r.final[:(T-1)*H]...)
		out := make([]float32, (T-1)*V)
		if err := r.MTPForward(st, 0, hid, c.Prompt[1:], out, true); err != nil {
			t.Fatal(err)
		}
		for i, want := range c.MTPArgmax {
			row := out[i*V : (i+1)*V]
			rows++
			if got := sample.Argmax(row); got != want {
				if top2Gap(row) > 1e-3 {
					t.Errorf("case %d row %d: MTP argmax %d, want %d", ci, i, got, want)
				}
				ties++
			}
		}
	}
	t.Logf("%d MTP rows, %d near-tie mismatches", rows, ties)
}

// TestMTPFollowChunked: the head fed chunk by chunk (MTPFollow after each
// trunk step, the last row's token arriving later) fills the same cache and
// gives bit-identical logits to one batch over the whole prompt.
func TestMTPFollowChunked(t *testing.T) {
	m := load(t, mtpModel, 4)
	p := testutil.LoadRefs(t, mtpModel).Cases[0].Prompt
	T := len(p)
	H, V := m.Config.Hidden, m.Config.Vocab
	one := NewRunner(m, 2, 128)
	defer one.Close()
	a, _ := m.NewState(T)
	if err := one.Forward(a, p, make([]float32, V), false); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, (T-1)*V)
	if err := one.MTPForward(a, 0, one.final[:(T-1)*H], p[1:], want, true); err != nil {
		t.Fatal(err)
	}
	for _, rows := range []int{1, 7, 64} {
		r := NewRunner(m, 2, rows)
		b, _ := m.NewState(T)
		for i := 0; i < T-1; i += rows {
			j := min(i+rows, T-1)
			if err := r.Forward(b, p[i:j], make([]float32, V), false); err != nil {
				t.Fatal(err)
			}
			if err := r.MTPFollow(b, p[i:j], -1, nil); err != nil {
				t.Fatal(err)
			}
		}
		if b.MTPPos != T-2 {
			t.Fatalf("rows %d: MTPPos %d after the prefill of %d tokens, want %d", rows, b.MTPPos, T-1, T-2)
		}
		got := make([]float32, V)
		if err := r.MTPFollow(b, nil, p[T-1], got); err != nil {
			t.Fatal(err)
		}
		r.Close()
		if b.MTPPos != T-1 {
			t.Fatalf("rows %d: MTPPos %d, want %d", rows, b.MTPPos, T-1)
		}
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(want[(T-2)*V+i]) {
				t.Fatalf("rows %d: last MTP logit %d = %v, one batch %v", rows, i, v, want[(T-2)*V+i])
			}
		}
		w := len(a.mk) / a.Ctx
		for i := 0; i < (T-1)*w; i++ {
			if a.mk[i] != b.mk[i] || a.mv[i] != b.mv[i] {
				t.Fatalf("rows %d: MTP cache differs at row %d", rows, i/w)
			}
		}
	}
}

// TestSpeculateCommit: a verify batch of 5 rows committed to its first n
// rows continues bit-identically to a state that consumed only those n
// tokens, for every n, and the MTP rows MTPFollow adds after the commit are
// those of plain decoding.
func TestSpeculateCommit(t *testing.T) {
	m := load(t, mtpModel, 4)
	p := testutil.LoadRefs(t, mtpModel).Cases[1].Prompt
	V := m.Config.Vocab
	r := NewRunner(m, 2, 16)
	defer r.Close()
	const P, D = 40, 4
	batch := p[P : P+D+1]
	for n := 1; n <= D+1; n++ {
		// Plain: prefill P, then the kept tokens one by one, then next.
		a, _ := m.NewState(128)
		la := make([]float32, V)
		for i := 0; i < P+n; i += 16 {
			if err := r.Forward(a, p[i:min(i+16, P+n)], la, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Forward(a, []int{p[P+n]}, la, false); err != nil {
			t.Fatal(err)
		}
		// Speculative: prefill P, verify the batch, commit n, then the same token.
		b, _ := m.NewState(128)
		lb := make([]float32, V)
		for i := 0; i < P; i += 16 {
			if err := r.Forward(b, p[i:min(i+16, P)], lb, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Speculate(D + 1); err != nil {
			t.Fatal(err)
		}
		if err := r.Forward(b, batch, make([]float32, (D+1)*V), true); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(n); err != nil {
			t.Fatal(err)
		}
		if b.Pos != P+n {
			t.Fatalf("n %d: Pos %d after commit, want %d", n, b.Pos, P+n)
		}
		if err := r.Forward(b, []int{p[P+n]}, lb, false); err != nil {
			t.Fatal(err)
		}
		for i := range la {
			if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
				t.Fatalf("n %d: logit %d after rollback = %v, plain %v", n, i, lb[i], la[i])
			}
		}
		for li := range a.rec {
			for i := range a.rec[li] {
				if a.rec[li][i] != b.rec[li][i] {
					t.Fatalf("n %d: layer %d recurrent state differs", n, li)
				}
			}
			for i := range a.conv[li] {
				if a.conv[li][i] != b.conv[li][i] {
					t.Fatalf("n %d: layer %d conv history differs", n, li)
				}
			}
		}
	}
}

// TestMTPAfterCommit: after a verify committed to n rows, MTPFollow over the
// kept tokens and the next one leaves the head exactly where a plain,
// token-by-token decode with MTPFollow after every step leaves it, although
// a chained draft row wrote into the cache past the kept rows.
func TestMTPAfterCommit(t *testing.T) {
	m := load(t, mtpModel, 4)
	p := testutil.LoadRefs(t, mtpModel).Cases[1].Prompt
	V := m.Config.Vocab
	r := NewRunner(m, 2, 16)
	defer r.Close()
	const P, D = 30, 3
	prefill := func(st *State) {
		for i := 0; i < P; i += 16 {
			j := min(i+16, P)
			if err := r.Forward(st, p[i:j], make([]float32, V), false); err != nil {
				t.Fatal(err)
			}
			if err := r.MTPFollow(st, p[i:j], -1, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for n := 1; n <= D+1; n++ {
		a, _ := m.NewState(64)
		prefill(a)
		want := make([]float32, V)
		for i := 0; i < n; i++ {
			if err := r.Forward(a, p[P+i:P+i+1], make([]float32, V), false); err != nil {
				t.Fatal(err)
			}
			var o []float32
			if i == n-1 {
				o = want
			}
			nx := p[P+i+1]
			if err := r.MTPFollow(a, p[P+i:P+i+1], nx, o); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := m.NewState(64)
		prefill(b)
		// The first draft row, then a chained row that must be overwritten.
		first := make([]float32, V)
		if err := r.MTPFollow(b, nil, p[P], first); err != nil {
			t.Fatal(err)
		}
		if err := r.MTPForward(b, P, r.MTPHidden(0), []int{7}, first, false); err != nil {
			t.Fatal(err)
		}
		if err := b.Speculate(D + 1); err != nil {
			t.Fatal(err)
		}
		if err := r.Forward(b, p[P:P+D+1], make([]float32, (D+1)*V), true); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(n); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, V)
		if err := r.MTPFollow(b, p[P:P+n], p[P+n], got); err != nil {
			t.Fatal(err)
		}
		if a.MTPPos != b.MTPPos || a.MTPPos != P+n {
			t.Fatalf("n %d: MTPPos plain %d, speculative %d, want %d", n, a.MTPPos, b.MTPPos, P+n)
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d: MTP logit %d = %v, plain %v", n, i, got[i], want[i])
			}
		}
		w := len(a.mk) / a.Ctx
		for i := 0; i < a.MTPPos*w; i++ {
			if a.mk[i] != b.mk[i] || a.mv[i] != b.mv[i] {
				t.Fatalf("n %d: MTP cache row %d differs", n, i/w)
			}
		}
	}
}

// TestSpecAllocs: after the first verify, a speculative step (chained
// draft, verify with snapshots, commit, MTP catch-up) allocates nothing.
func TestSpecAllocs(t *testing.T) {
	m := load(t, mtpModel, 4)
	V := m.Config.Vocab
	r := NewRunner(m, 2, 16)
	defer r.Close()
	st, _ := m.NewState(4096)
	logits := make([]float32, 4*V)
	mlog := make([]float32, V)
	toks := []int{5, 6, 7, 8}
	if err := r.Forward(st, []int{1, 2, 3}, logits, false); err != nil {
		t.Fatal(err)
	}
	if err := r.MTPFollow(st, []int{1, 2, 3}, 5, mlog); err != nil {
		t.Fatal(err)
	}
	step := func() {
		if err := r.MTPForward(st, st.Pos, r.MTPHidden(0), toks[1:2], mlog, false); err != nil {
			t.Fatal(err)
		}
		if err := st.Speculate(4); err != nil {
			t.Fatal(err)
		}
		if err := r.Forward(st, toks, logits, true); err != nil {
			t.Fatal(err)
		}
		if err := st.Commit(2); err != nil {
			t.Fatal(err)
		}
		if err := r.MTPFollow(st, toks[:2], 5, mlog); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if allocs := testing.AllocsPerRun(20, step); allocs != 0 {
		t.Errorf("speculative step allocates %.1f times", allocs)
	}
}

// TestMTPErrors: misuse is an error, not a panic.
func TestMTPErrors(t *testing.T) {
	m := load(t, "tiny-qwen3-moe", 4)
	r := NewRunner(m, 1, 4)
	defer r.Close()
	st, _ := m.NewState(16)
	if m.MTP != nil {
		t.Fatal("tiny-qwen3-moe has no MTP head")
	}
	if err := r.MTPFollow(st, nil, 1, nil); err == nil {
		t.Error("MTPFollow without an MTP head: no error")
	}
	if err := st.Commit(1); err == nil {
		t.Error("Commit without Speculate: no error")
	}
	m2 := load(t, mtpModel, 4)
	r2 := NewRunner(m2, 1, 4)
	defer r2.Close()
	st2, _ := m2.NewState(16)
	H := m2.Config.Hidden
	for name, f := range map[string]func() error{
		"too many rows":  func() error { return r2.MTPForward(st2, 0, make([]float32, 5*H), make([]int, 5), nil, false) },
		"past context":   func() error { return r2.MTPForward(st2, 16, make([]float32, H), []int{1}, nil, false) },
		"bad token":      func() error { return r2.MTPForward(st2, 0, make([]float32, H), []int{-1}, nil, false) },
		"short hidden":   func() error { return r2.MTPForward(st2, 0, make([]float32, H-1), []int{1}, nil, false) },
		"logits no next": func() error { return r2.MTPFollow(st2, nil, -1, make([]float32, m2.Config.Vocab)) },
		"speculate 0":    func() error { return st2.Speculate(0) },
		"speculate ctx":  func() error { return st2.Speculate(17) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := st2.Speculate(3); err != nil {
		t.Fatal(err)
	}
	if err := r2.Forward(st2, []int{1, 2}, make([]float32, 2*m2.Config.Vocab), true); err != nil {
		t.Fatal(err)
	}
	if err := st2.Commit(3); err == nil {
		t.Error("Commit of more rows than the verify consumed: no error")
	}
}
