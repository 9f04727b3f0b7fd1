package experts

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/internal/testutil/ref"
)

// TestLowBits derives the 3- and 2-bit stores of a q4 model, checks that a
// widened low-bit record decodes to exactly the low-bit values, and runs a
// decode whose misses read them.
func TestLowBits(t *testing.T) {
	src := testutil.Packed(t, "tiny-qwen3-moe", 4)
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	for _, b := range []int{3, 2} {
		if err := pack.AddLowBits(context.Background(), dir, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(man.Stores) != 3 {
		t.Fatalf("%d stores, want 3", len(man.Stores))
	}
	st := &man.Stores[0]
	for _, b := range []int{3, 2} {
		low, err := LowStore(man, b)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, low.File))
		if err != nil {
			t.Fatal(err)
		}
		rec := raw[5*low.Stride : 6*low.Stride]
		wide := make([]byte, st.Stride)
		if err := expandLow(wide, rec, st, low); err != nil {
			t.Fatal(err)
		}
		for _, p := range [][2]*format.Tensor{{&st.Gate, &low.Gate}, {&st.Down, &low.Down}} {
			got := decodeTensor(wide, p[0])
			want := decodeTensor(rec, p[1])
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%d bits: value %d widened to %v, want %v", b, i, got[i], want[i])
				}
			}
		}
		m, s := loadStreamDir(t, dir, Options{Slots: 40, MissBits: b, Lookahead: true})
		c := testutil.LoadRefs(t, "tiny-qwen3-moe").Cases[0]
		greedy(t, m, c.Prompt, 8, 16)
		if s.Stats().Misses == 0 {
			t.Fatal("no misses")
		}
	}
}

func decodeTensor(rec []byte, t *format.Tensor) []float32 {
	out := make([]float32, t.Rows()*t.Cols())
	_, sb := t.Kind.Sizes(t.Rows(), t.Cols())
	sc := quant.Halves(rec[t.ScaleOffset:], int(sb/2))
	bi := quant.Halves(rec[t.BiasOffset:], int(sb/2))
	q := rec[t.Offset : t.Offset+t.Size]
	if t.Tiled {
		q = slices.Clone(q)
		kernels.UntileQ4(q, t.Rows(), t.Cols(), nil)
	}
	quant.Decode(out, q, sc, bi, t.Rows(), t.Cols(), t.Kind)
	return out
}

// TestLowBitsDirect checks that misses multiplied as low-bit records give
// the logits of the original path, which widened them to the main kind
// first (q4 here: the same values, scales and biases, and the kernels'
// q3 and q2 products are q4's arithmetic), bit for bit, at several pool
// sizes, and the same on one thread as on two. Lookahead is off: with it,
// whether a cancelled prefetch lands before its record is needed again
// decides its precision, which is timing.
func TestLowBitsDirect(t *testing.T) {
	src := testutil.Packed(t, "tiny-qwen3-moe", 4)
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	c := testutil.LoadRefs(t, "tiny-qwen3-moe").Cases[0]
	for _, b := range []int{3, 2} {
		if err := pack.AddLowBits(context.Background(), dir, b, nil); err != nil {
			t.Fatal(err)
		}
		for _, slots := range []int{8, 24, 64} {
			run := func(widen bool, threads int) ([]float32, Snapshot) {
				m, s := loadStreamDir(t, dir, Options{Slots: slots, MissBits: b, widen: widen})
				lg := decodeLogits(t, m, c.Prompt, 6, 16, threads)
				return lg, s.Stats()
			}
			want, ws := run(true, 2)
			if ws.Misses == 0 {
				t.Fatalf("%d bits, %d slots: no misses", b, slots)
			}
			m, _ := loadStreamDir(t, dir, Options{Slots: slots})
			if lossless := decodeLogits(t, m, c.Prompt, 6, 16, 2); slices.Equal(lossless, want) {
				t.Fatalf("%d bits, %d slots: the low-bit run gave the lossless logits", b, slots)
			}
			for _, v := range []struct {
				threads int
			}{{2}, {1}} {
				got, _ := run(false, v.threads)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%d bits, %d slots, %d threads: logit %d is %v, widened %v", b, slots, v.threads, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// decodeLogits prefills prompt in chunks of rows and decodes n tokens
// greedily on threads threads, returning every step's logits.
func decodeLogits(t *testing.T, m *model.Model, prompt []int, n, rows, threads int) []float32 {
	t.Helper()
	r := model.NewRunner(m, threads, rows)
	defer r.Close()
	st, err := m.NewState(len(prompt) + n)
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Config.Vocab)
	var all []float32
	toks := prompt
	for range n {
		if err := r.Forward(st, toks, logits, false); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits...)
		toks = []int{sample.Argmax(logits)}
	}
	return all
}

// TestMissBitsNLL measures what --miss-bits costs in quality: the held-out
// NLL of the reference's long prompts through a 10% pool (lookahead off,
// so that every miss of a step is read at low bits), lossless and with
// misses read at 3 and 2 bits, on the two tiny models whose experts have
// no biases. The README's figures come from its log. The bounds are loose
// (twice what was measured) and catch a broken low-bit path, whose NLL
// is far off.
func TestMissBitsNLL(t *testing.T) {
	if testing.Short() {
		t.Skip("long prompts")
	}
	for _, name := range []string{"tiny-qwen3-5-moe", "tiny-qwen3-moe"} {
		t.Run(name, func(t *testing.T) {
			src := testutil.Packed(t, name, 4)
			dir := filepath.Join(t.TempDir(), "m")
			if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
				t.Fatal(err)
			}
			refs := testutil.LoadRefs(t, name)
			nll := map[int]float64{}
			for _, b := range []int{0, 3, 2} {
				if b != 0 {
					if err := pack.AddLowBits(context.Background(), dir, b, nil); err != nil {
						t.Fatal(err)
					}
				}
				man, err := format.ReadManifest(dir)
				if err != nil {
					t.Fatal(err)
				}
				slots := max(MinSlots(&man.Config), man.ExpertLayers*man.Experts/10)
				m, s := loadStreamDir(t, dir, Options{Slots: slots, MissBits: b})
				r := model.NewRunner(m, 2, 64)
				V := m.Config.Vocab
				var sum float64
				var n int
				for _, c := range refs.Long {
					st, err := m.NewState(len(c.Prompt))
					if err != nil {
						t.Fatal(err)
					}
					out := make([]float32, len(c.Prompt)*V)
					if err := r.Forward(st, c.Prompt, out, true); err != nil {
						t.Fatal(err)
					}
					for p := 0; p+1 < len(c.Prompt); p++ {
						sum -= ref.LogSoftmax(out[p*V : (p+1)*V])[c.Prompt[p+1]]
						n++
					}
				}
				r.Close()
				if s.Stats().Misses == 0 {
					t.Fatalf("%d bits: no misses", b)
				}
				nll[b] = sum / float64(n)
			}
			d3, d2 := 100*(nll[3]/nll[0]-1), 100*(nll[2]/nll[0]-1)
			t.Logf("held-out NLL, 10%% pool: lossless %.4f, --miss-bits 3 %.4f (%+.2f%%), --miss-bits 2 %.4f (%+.2f%%)", nll[0], nll[3], d3, nll[2], d2)
			if d3 > 8 || d2 > 20 {
				t.Errorf("low-bit misses cost %+.2f%% (3 bits) and %+.2f%% (2 bits) of NLL, want at most 8%% and 20%%", d3, d2)
			}
		})
	}
}

// TestCachedLow: with --miss-bits, Cached gives a record read at low bits
// as a step returned it (the low-bit store's kind and bytes, within
// Memory), so that a device pool copying held records copies those too;
// when misses are widened first, the widened record.
func TestCachedLow(t *testing.T) {
	src := testutil.Packed(t, "tiny-qwen3-moe", 4)
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if err := pack.AddLowBits(context.Background(), dir, 3, nil); err != nil {
		t.Fatal(err)
	}
	for _, widen := range []bool{false, true} {
		m, s := loadStreamDir(t, dir, Options{Slots: 8, MissBits: 3, widen: widen})
		low, err := LowStore(m.Manifest, 3)
		if err != nil {
			t.Fatal(err)
		}
		file, err := os.ReadFile(filepath.Join(dir, low.File))
		if err != nil {
			t.Fatal(err)
		}
		ids := []int{3, 5}
		if err := s.Begin(1, ids, model.Hint{}); err != nil {
			t.Fatal(err)
		}
		got := map[int]*model.Expert{}
		for range ids {
			j, ex, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			got[ids[j]] = ex
		}
		mem := s.Memory()
		for _, e := range ids {
			ex := s.Cached(1, e)
			if ex == nil {
				t.Fatalf("widen %v: expert %d of layer 1, read at low bits, is not cached", widen, e)
			}
			if ex != got[e] {
				t.Errorf("widen %v: expert %d: Cached gives another expert than the step did", widen, e)
			}
			want := format.Q3
			if widen {
				want = m.Manifest.Stores[0].Gate.Kind
			}
			if ex.Gate.Kind != want {
				t.Errorf("widen %v: expert %d is cached as %s, want %s", widen, e, ex.Gate.Kind, want)
			}
			lo, at := uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&ex.Record[0]))
			if at < lo || at+uintptr(len(ex.Record)) > lo+uintptr(len(mem)) {
				t.Errorf("widen %v: expert %d's record lies outside the pool's memory", widen, e)
			}
			if rec := m.Manifest.Experts + e; !widen && !bytes.Equal(ex.Record[:low.Stride], file[int64(rec)*low.Stride:int64(rec+1)*low.Stride]) {
				t.Errorf("expert %d's cached record is not the low-bit file's", e)
			}
		}
	}
}
