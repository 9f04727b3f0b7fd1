//go:build linux

package cuda

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// smallInts is n random integers in -m..m as floats: their products and
// sums are exact, so the GPU's scores equal the CPU's whatever the order,
// with many ties.
func smallInts(r *rand.Rand, n, m int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.IntN(2*m+1) - m)
	}
	return v
}

// TestIndexSelect checks the lightning indexer's choice against the CPU's
// (model.TopK, sorted): every position while a row has at most TopK, else
// the TopK best scores with ties to the lower position, for scores that
// are exact on both sides and tie often; rows below and above TopK in one
// step; and the same choice with the position read from the device (a
// recorded step).
func TestIndexSelect(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(11, 1))
		for _, c := range []struct{ pos, rows, heads, dim, topK int }{
			{60, 6, 4, 32, 64}, {1000, 3, 4, 32, 64}, {300, 2, 8, 64, 256}, {5000, 2, 2, 128, 2048}, {9, 1, 64, 128, 2048},
		} {
			n := c.pos + c.rows
			stride := n + 7
			q := smallInts(r, c.rows*c.heads*c.dim, 2)
			k := smallInts(r, n*c.dim, 1)
			w := smallInts(r, c.rows*c.heads, 3)
			want := make([][]int, c.rows)
			for i := range c.rows {
				m := c.pos + i + 1
				if m <= c.topK {
					want[i] = make([]int, m)
					for t := range m {
						want[i][t] = t
					}
					continue
				}
				sc := make([]float32, m)
				for t := range m {
					var v float32
					for h := range c.heads {
						d := kernels.Dot(q[(i*c.heads+h)*c.dim:(i*c.heads+h+1)*c.dim], k[t*c.dim:(t+1)*c.dim])
						v += w[i*c.heads+h] * max(d, 0)
					}
					sc[t] = v
				}
				want[i] = make([]int, c.topK)
				model.TopK(want[i], sc, make([]int, c.topK))
				slices.Sort(want[i])
			}
			qd, kd, wd := up(e, q), up(e, k), up(e, w)
			x := Index{Pos: c.pos, Rows: c.rows, Heads: c.heads, Dim: c.dim, TopK: c.topK, Stride: stride, Scale: 1, WScale: 1}
			for _, dev := range []bool{false, true} {
				if dev {
					x.PosDev, x.MaxPos = up(e, []int32{int32(c.pos)}), n
				}
				sel, sc := e.alloc(4*c.rows*c.topK), e.alloc(4*c.rows*stride)
				must(e.k.IndexSelect(e.s, sel, sc, qd, kd, wd, x))
				got := down[int32](e, sel, c.rows*c.topK)
				for i := range c.rows {
					g := got[i*c.topK : i*c.topK+len(want[i])]
					for j, p := range want[i] {
						if int(g[j]) != p {
							t.Fatalf("pos %d row %d of %d, top %d (position on the device: %v): selection differs at %d: got %v, want %v",
								c.pos, i, c.rows, c.topK, dev, j, g[j:min(j+8, len(g))], want[i][j:min(j+8, len(want[i]))])
						}
					}
				}
			}
		}
	})
}

// TestAttendLatent checks DeepSeek's absorbed attention, one latent head
// whose value is the key's first dims, over every position and over an
// indexer's selection, against kernels.AttendLatent within float32
// rounding, and AttendLatent (several heads a block) against Attend bit
// for bit; and the absorb, W_v and layer norm kernels against their CPU
// counterparts.
func TestAttendLatent(t *testing.T) {
	defer func(n, w int) { latentMinBlocks, latentWideBlocks = n, w }(latentMinBlocks, latentWideBlocks)
	// Several heads a block, however small the step: on 128 threads
	// (latentMinBlocks 0), then on 512.
	kinds := []struct {
		what string
		min  int
	}{{"eight heads a block", 0}, {"eight heads a block on 512 threads", 1 << 30}}
	latentWideBlocks = 0
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(11, 2))
		const nb, heads, kvl, rope, nope, vd = 5, 4, 128, 32, 48, 40
		const w = kvl + rope
		for _, c := range []struct{ pos, topK int }{{37, 0}, {600, 0}, {600, 64}, {900, 300}} {
			n := c.pos + nb
			q := randF32(r, nb*heads*w, 1)
			kc := randF32(r, n*w, 1)
			var sel []int32
			if c.topK > 0 {
				sel = make([]int32, nb*c.topK)
				for i := range nb {
					m := c.pos + i + 1
					ps := r.Perm(m)[:min(m, c.topK)]
					slices.Sort(ps)
					for j, p := range ps {
						sel[i*c.topK+j] = int32(p)
					}
				}
			}
			scale := float32(0.07)
			want := make([]float32, nb*heads*kvl)
			sc := make([]float32, n)
			for i := range nb {
				var rs []int
				if sel != nil {
					for _, p := range sel[i*c.topK : i*c.topK+min(c.pos+i+1, c.topK)] {
						rs = append(rs, int(p))
					}
				}
				for h := range heads {
					kernels.AttendLatent(want[(i*heads+h)*kvl:(i*heads+h+1)*kvl], q[(i*heads+h)*w:(i*heads+h+1)*w], kc, w, rs, c.pos+i+1, scale, sc)
				}
			}
			a := Attn{Pos: c.pos, Rows: nb, Heads: heads, KVHeads: 1, HeadDim: w, VDim: kvl, QRow: heads * w, QHead: w, ORow: heads * kvl, Scale: scale}
			if sel != nil {
				a.Sel, a.TopK = up(e, sel), c.topK
			}
			kd, qd := up(e, kc), up(e, q)
			od := e.alloc(4 * nb * heads * kvl)
			must(e.k.Attend(e.s, od, qd, kd, kd, e.alloc(AttendScratch(a)), a))
			what := fmt.Sprintf("latent attention pos=%d top %d", c.pos, c.topK)
			got := down[float32](e, od, nb*heads*kvl)
			e.close(what, got, want, 2e-6)
			e.grouped(what, a, got, func(g Attn, o, scr uintptr) error { return e.k.Attend(e.s, o, qd, kd, kd, scr, g) })
			for _, k := range kinds {
				latentMinBlocks = k.min
				must(e.k.AttendLatent(e.s, od, qd, kd, e.alloc(AttendScratch(a)), a))
				e.exact(what+": "+k.what, down[float32](e, od, nb*heads*kvl), got)
				e.grouped(what+", "+k.what, a, got, func(g Attn, o, scr uintptr) error { return e.k.AttendLatent(e.s, o, qd, kd, scr, g) })
			}
			// Recorded: the position on the device, a grid for more
			// positions, a head a block and 512 threads both launched,
			// gated at 10 rows·chunks (pos 37's 5 rows read one chunk,
			// the others' two or three).
			latentWideBlocks = 10
			r := a
			r.PosDev, r.MaxPos = up(e, []int32{int32(c.pos)}), n+700
			if _, fn, gate := latentPlan(r); gate != 10 || fn != "mla_attend_wide" {
				t.Fatalf("recorded: %q gated at %d, want mla_attend_wide at 10", fn, gate)
			}
			must(e.k.AttendLatent(e.s, od, qd, kd, e.alloc(AttendScratch(r)), r))
			e.exact(what+", recorded", down[float32](e, od, nb*heads*kvl), got)
			latentWideBlocks = 0
		}
		// More heads than a block takes, and not a multiple of it.
		{
			const nh, pos = 20, 300
			n := pos + nb
			q, kc := randF32(r, nb*nh*w, 1), randF32(r, n*w, 1)
			a := Attn{Pos: pos, Rows: nb, Heads: nh, KVHeads: 1, HeadDim: w, VDim: kvl, QRow: nh * w, QHead: w, ORow: nh * kvl, Scale: 0.05}
			qd, kd := up(e, q), up(e, kc)
			o1, o2 := e.alloc(4*nb*nh*kvl), e.alloc(4*nb*nh*kvl)
			must(e.k.Attend(e.s, o1, qd, kd, kd, e.alloc(AttendScratch(a)), a))
			for _, k := range kinds {
				latentMinBlocks = k.min
				must(e.k.AttendLatent(e.s, o2, qd, kd, e.alloc(AttendScratch(a)), a))
				e.exact("latent attention, 20 heads: "+k.what, down[float32](e, o2, nb*nh*kvl), down[float32](e, o1, nb*nh*kvl))
			}
		}

		// The indexer's key norm.
		const rows, dim = 7, 128
		x, gw, gb := randF32(r, rows*dim, 3), randF32(r, dim, 1), randF32(r, dim, 1)
		for i := range x[:dim] {
			x[i] += 5 // a row far from zero mean
		}
		wantN := make([]float32, rows*dim)
		for i := range rows {
			kernels.LayerNorm(wantN[i*dim:(i+1)*dim], x[i*dim:(i+1)*dim], gw, gb, 1e-6)
		}
		xd := up(e, x)
		must(e.k.LayerNorm(e.s, xd, xd, up(e, gw), up(e, gb), rows, dim, 1e-6))
		e.close("layer_norm", down[float32](e, xd, rows*dim), wantN, 1e-6)
	})
}

// TestHeads checks the products a head at a time of DeepSeek's W_k and
// W_v: float32 (HeadF32, over strided rows, against MatF32 a head and a
// row at a time, exactly) and quantised (MatEx over HeadTab's entries, one
// slot a (row, head), against the CPU's product of each head's rows: q4
// exactly, q8 within rounding), and CopyRows.
func TestHeads(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(12, 3))
		const nb, heads = 3, 5
		for _, sh := range [][2]int{{64, 32}, {40, 128}, {512, 128}, {128, 512}} {
			O, C := sh[0], sh[1]
			// float32, x rows (i, h) C+7 floats apart, out rows O+3.
			w := randF32(r, heads*O*C, 1)
			xs, os := C+7, O+3
			x := randF32(r, nb*heads*xs, 1)
			wd, xd := up(e, w), up(e, x)
			out := e.alloc(4 * nb * heads * os)
			must(e.k.HeadF32(e.s, out, wd, xd, Heads{Rows: nb, Heads: heads, O: O, C: C, XRow: heads * xs, XHead: xs, ORow: heads * os, OHead: os}))
			got := down[float32](e, out, nb*heads*os)
			one := e.alloc(4 * O)
			for i := range nb {
				for h := range heads {
					k := i*heads + h
					must(e.k.MatF32(e.s, one, wd+uintptr(4*h*O*C), O, C, xd+uintptr(4*k*xs), 1))
					e.exact(fmt.Sprintf("head_f32 [%d %d] row %d head %d", O, C, i, h), got[k*os:k*os+O], down[float32](e, one, O))
				}
			}
			if C%64 != 0 {
				continue
			}
			for _, kind := range []format.Kind{format.Q4, format.Q8} {
				q := newQMat(e, r, heads*O, C, kind)
				xq := randF32(r, nb*heads*C, 2)
				want := make([]float32, nb*heads*O)
				var sc kernels.Scratch
				for k := range nb * heads {
					v, ok := q.m.View((k%heads)*O, (k%heads+1)*O)
					if !ok {
						t.Fatalf("no view of head %d's rows", k%heads)
					}
					sc.MatMul(want[k*O:(k+1)*O], &v, xq[k*C:(k+1)*C], 1)
				}
				name := map[format.Kind]string{format.Q4: "q4", format.Q8: "q8"}[kind]
				tab, err := HeadTab(name, q.w, heads)
				must(err)
				ids := make([]int32, nb*heads)
				for k := range ids {
					ids[k] = int32(k % heads)
				}
				n := nb * heads
				a := Acts{X: up(e, xq), XSum: e.alloc(4 * n * C / 64), Rows: n, Cols: C}
				if kind == format.Q4 {
					a.X8, a.XS = e.alloc(n*C), e.alloc(4*n*C/64)
				}
				must(e.k.PrepQ4(e.s, a))
				od := e.alloc(4 * n * O)
				must(e.k.MatEx(e.s, name, od, up(e, tab), up(e, ids), O, a, n, true))
				what, got := fmt.Sprintf("%s [%d %d] a head a slot", name, O, C), down[float32](e, od, n*O)
				if kind == format.Q4 {
					e.exact(what, got, want) // q4's integer design: the CPU's bits
					if GemmCols(C) {
						for _, bn := range []int{32, 64} {
							must(e.k.MatQ4Heads(e.s, od, up(e, tab), heads, O, a, bn))
							e.exact(fmt.Sprintf("q4 [%d %d] a head at a time, tiled by %d", O, C, bn), down[float32](e, od, n*O), want)
						}
					}
				} else {
					e.close(what, got, want, 2e-6) // q8 sums in another order
				}
			}
		}
		// The tiled product a head at a time over more token rows than a
		// tile, with outputs that are not whole tiles, against the CPU.
		{
			const nb, heads, O, C = 70, 3, 200, 256
			q := newQMat(e, r, heads*O, C, format.Q4)
			xq := randF32(r, nb*heads*C, 2)
			n := nb * heads
			want := make([]float32, n*O)
			var sc kernels.Scratch
			for k := range n {
				v, _ := q.m.View((k%heads)*O, (k%heads+1)*O)
				sc.MatMul(want[k*O:(k+1)*O], &v, xq[k*C:(k+1)*C], 1)
			}
			tab, err := HeadTab("q4", q.w, heads)
			must(err)
			a := Acts{X: up(e, xq), X8: e.alloc(n * C), XS: e.alloc(4 * n * C / 64), XSum: e.alloc(4 * n * C / 64), Rows: n, Cols: C}
			must(e.k.PrepQ4(e.s, a))
			od := e.alloc(4 * n * O)
			for _, bn := range []int{32, 64} {
				must(e.k.MatQ4Heads(e.s, od, up(e, tab), heads, O, a, bn))
				e.exact(fmt.Sprintf("q4 [%d %d] x %d heads x %d rows, tiled by %d", O, C, heads, nb, bn), down[float32](e, od, n*O), want)
			}
			if err := e.k.MatQ4Heads(e.s, od, up(e, tab), heads, O, Acts{Rows: n, Cols: 192}, 32); err == nil {
				t.Error("MatQ4Heads took 192 columns")
			}
		}
		if _, err := HeadTab("q4", Q4{Rows: 10, Cols: 64}, 3); err == nil {
			t.Error("HeadTab split 10 rows into 3 heads")
		}
		src := randF32(r, 7*20, 1)
		dst := e.alloc(4 * 7 * 12)
		must(e.k.CopyRows(e.s, dst, 12, up(e, src), 20, 7, 9))
		got := down[float32](e, dst, 7*12)
		for i := range 7 {
			e.exact(fmt.Sprintf("copy_rows row %d", i), got[i*12:i*12+9], src[i*20:i*20+9])
		}
	})
}

// TestLatentPlan: AttendLatent takes eight heads a block on 128 threads
// with 1024 blocks of work or more, on 512 from 256, a head a block below;
// a recorded step launches a head a block and 512 threads, gated at 256
// blocks' worth of rows·chunks; heads of 2048 dims go four a block (32 KiB
// of queries). Needs no GPU.
func TestLatentPlan(t *testing.T) {
	ds := Attn{Heads: 128, KVHeads: 1, HeadDim: 576, VDim: 512}
	const narrow, wide = "mla_attend_part", "mla_attend_wide"
	for _, c := range []struct {
		pos, rows int
		dev       bool
		hb        int
		want      string
		gate      int
	}{{0, 64, false, 8, narrow, 0}, {0, 32, false, 8, wide, 0}, {0, 15, false, 1, "", 0}, {100, 1, false, 1, "", 0}, {1000, 1, false, 1, "", 0},
		{4095, 1, false, 8, wide, 0}, {16383, 1, false, 8, narrow, 0}, {4095, 1, true, 8, wide, 16}, {99, 4, true, 8, wide, 16},
		{2000, 16, false, 8, narrow, 0}, {2000, 4, false, 8, wide, 0}, {3840, 256, false, 8, narrow, 0}} {
		a := ds
		a.Pos, a.Rows = c.pos, c.rows
		if c.dev {
			a.PosDev, a.MaxPos = 1, 8192
		}
		if hb, fn, gate := latentPlan(a); hb != c.hb || fn != c.want || gate != c.gate {
			t.Errorf("pos %d, %d rows, position on the device %v: %d heads a block on %q gated at %d, want %d on %q at %d",
				c.pos, c.rows, c.dev, hb, fn, gate, c.hb, c.want, c.gate)
		}
	}
	if hb, fn, _ := latentPlan(Attn{Heads: 64, KVHeads: 1, HeadDim: 2048, Rows: 256}); hb != 4 || fn != narrow {
		t.Errorf("heads of 2048 dims: %d a block on %s, want 4 on %s (32 KiB of queries)", hb, fn, narrow)
	}
	if _, _, gate := latentPlan(Attn{Heads: 128, KVHeads: 1, HeadDim: 576, Rows: 1, PosDev: 1, MaxPos: 64}); gate != 16 {
		t.Errorf("a recorded step is gated at %d rows·chunks, want 16", gate)
	}
}

// TestAttendScratchFor: the attention's scratch is what one launch needs
// while that is at most AttendScratchMax, else AttendScratchMax or a
// recorded step's whole rows; a scratch that holds no row, or fewer rows
// than a recorded step has, is refused. Needs no GPU.
func TestAttendScratchFor(t *testing.T) {
	small := Attn{Pos: 4096, Rows: 64, Heads: 32, KVHeads: 4, HeadDim: 128}
	if got, want := AttendScratchFor(small, 1), AttendScratch(small); got != want {
		t.Errorf("small: %d bytes, want all of %d", got, want)
	}
	ds := Attn{Pos: 32768, Rows: 256, Heads: 128, KVHeads: 1, HeadDim: 576, VDim: 512}
	if got := AttendScratchFor(ds, 1); got != AttendScratchMax {
		t.Errorf("DeepSeek-V3, 256 rows over 32K positions: %d bytes, want %d (of %d)", got, AttendScratchMax, AttendScratch(ds))
	}
	if got, want := AttendScratchFor(ds, 64), 64*ds.rowParts(); got != want {
		t.Errorf("with 64 rows recorded together: %d bytes, want %d", got, want)
	}
	groups := 0
	a := ds
	a.Scratch = AttendScratchMax
	if err := a.groups(0, 0, func(b Attn, q, o uintptr) error {
		if AttendScratch(b) > a.Scratch {
			t.Errorf("a group of %d rows at %d needs %d bytes of %d", b.Rows, b.Pos, AttendScratch(b), a.Scratch)
		}
		groups++
		return nil
	}); err != nil || groups < 2 {
		t.Errorf("%d groups, %v", groups, err)
	}
	a.Scratch = a.rowParts() - 4
	if err := a.groups(0, 0, func(Attn, uintptr, uintptr) error { return nil }); err == nil {
		t.Error("a scratch short of one row: no error")
	}
	rec := ds
	rec.Rows, rec.PosDev, rec.MaxPos, rec.Scratch = 4, 1, 32768, 2*ds.rowParts()
	if err := rec.groups(0, 0, func(Attn, uintptr, uintptr) error { return nil }); err == nil {
		t.Error("a recorded step of 4 rows in a scratch of 2: no error")
	}
}

// TestAttnChecks checks that attention shapes the kernels can't take are
// refused before a launch: attend_part wraps a ring's chunk at most once,
// so a ring needs a window no longer than the ring less the step's rows.
func TestAttnChecks(t *testing.T) {
	ok := Attn{Pos: 300, Rows: 6, Heads: 8, KVHeads: 2, HeadDim: 64, Window: 128, Ring: 134}
	if _, err := ok.chunks(); err != nil {
		t.Fatalf("a window of 128 in a ring of 134: %v", err)
	}
	for _, c := range []struct {
		what string
		edit func(*Attn)
	}{
		{"a ring without a window", func(a *Attn) { a.Window = 0 }},
		{"a ring shorter than the window and the step", func(a *Attn) { a.Ring = 133 }},
		{"a negative window", func(a *Attn) { a.Window, a.Ring = -1, 0 }},
		{"heads not a multiple of the kv heads", func(a *Attn) { a.KVHeads = 3 }},
		{"values wider than the keys", func(a *Attn) { a.VDim = 65 }},
		{"a selection with a window", func(a *Attn) { a.Sel, a.TopK = 1, 64 }},
		{"a selection without its count", func(a *Attn) { a.Window, a.Ring, a.Sel = 0, 0, 1 }},
		{"more than 1024 chunks", func(a *Attn) { a.Window, a.Ring, a.Pos = 0, 0, 1024*256 }},
	} {
		a := ok
		c.edit(&a)
		if _, err := a.chunks(); err == nil {
			t.Errorf("%s: no error", c.what)
		}
	}
}
