package engine_test

import (
	"context"
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestLayoutsAgree runs one model packed with row-major and with tiled q4
// expert records (pack.Options.Layout) and requires the same logits, bit
// for bit, at every prompt position and decode step: held whole (laid
// out as this CPU prefers on load), streamed through a pool that computes
// each record as the disk gave it, and with misses read at 3 bits (the
// low-bit store derived from the main records; lookahead off there).
func TestLayoutsAgree(t *testing.T) {
	const name = "tiny-qwen3-moe"
	c := testutil.LoadRefs(t, name).Cases[1]
	for _, v := range []struct {
		name string
		xo   engine.ExpertOptions
	}{
		{"resident", engine.ExpertOptions{}},
		{"pool 25%", engine.ExpertOptions{PoolShare: 0.25}},
		// Lookahead off: with it, whether a cancelled prefetch lands
		// before its record is needed decides the record's bits, which
		// is timing (as in experts.TestLowBitsDirect).
		{"pool 25% misses at 3 bits", engine.ExpertOptions{PoolShare: 0.25, MissBits: 3, NoLookahead: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			var want []float32
			for _, lay := range []string{pack.LayoutRows, pack.LayoutTiled} {
				dir := testutil.PackedLayout(t, name, 4, lay)
				if v.xo.MissBits != 0 {
					dir = testutil.CopyDir(t, dir) // the low-bit store is written beside
				}
				e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 2, Device: "cpu", Experts: v.xo})
				if err != nil {
					t.Fatal(err)
				}
				if (e.Stream != nil) != (v.xo.PoolShare > 0) {
					t.Fatalf("%s: streaming %v (%s)", lay, e.Stream != nil, e.ExpertPlan)
				}
				got := layoutLogits(t, e, c.Prompt, 8)
				e.Close()
				if want == nil {
					want = got
					continue
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("logit %d: %v tiled, %v row-major", i, got[i], want[i])
					}
				}
			}
		})
	}
}

// layoutLogits is the logits of every prompt position, then of n greedy
// decode steps one token at a time.
func layoutLogits(t *testing.T, e *engine.Engine, prompt []int, n int) []float32 {
	t.Helper()
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	V := e.Model.Config.Vocab
	out := make([]float32, len(prompt)*V)
	if err := e.Fwd.Forward(st, prompt, out, true); err != nil {
		t.Fatal(err)
	}
	last := out[len(out)-V:]
	for range n {
		tok := 0
		for i, x := range last {
			if x > last[tok] {
				tok = i
			}
		}
		step := make([]float32, V)
		if err := e.Fwd.Forward(st, []int{tok}, step, false); err != nil {
			t.Fatal(err)
		}
		out, last = append(out, step...), step
	}
	return out
}
