package experts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/testutil"
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
	sc := make([]float32, sb/4)
	bi := make([]float32, sb/4)
	for i := range sc {
		sc[i] = f32at(rec, t.ScaleOffset+int64(4*i))
		bi[i] = f32at(rec, t.BiasOffset+int64(4*i))
	}
	quant.Decode(out, rec[t.Offset:], sc, bi, t.Rows(), t.Cols(), t.Kind)
	return out
}

func f32at(b []byte, off int64) float32 {
	var v [1]float32
	copy(unsafeBytes(v[:]), b[off:off+4])
	return v[0]
}
