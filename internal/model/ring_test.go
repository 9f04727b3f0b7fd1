package model

import (
	"math"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/testutil"
)

// TestSlidingRing runs gpt-oss's sliding-window layers over a ring that
// wraps (window + 8 rows) and requires the logits of a full-length cache
// bit for bit, in chunks of 8 rows and token by token; a state copied
// mid-sequence continues identically; a step wider than the ring's slack
// is refused.
func TestSlidingRing(t *testing.T) {
	const name = "tiny-gpt-oss"
	m := load(t, name, 16)
	c := testutil.LoadRefs(t, name).Cases[3] // 153 tokens, window 32
	V := m.Config.Vocab
	run := func(maxBatch, rows int) ([]float32, *State) {
		r := NewRunner(m, 2, rows)
		defer r.Close()
		m.MaxBatch = maxBatch
		st, err := m.NewState(len(c.Prompt) + 8)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(c.Prompt)*V)
		if err := r.Forward(st, c.Prompt, out, true); err != nil {
			t.Fatal(err)
		}
		return out, st
	}
	want, _ := run(1024, 64) // ring of ctx rows: never wraps
	for _, v := range []struct{ maxBatch, rows int }{{8, 8}, {8, 1}} {
		got, st := run(v.maxBatch, v.rows)
		if st.kvRows[0] != m.Config.SlidingWindow+8 {
			t.Fatalf("layer 0 ring has %d rows, want window+8", st.kvRows[0])
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("ring, rows %d: logit %d (pos %d) = %v, full cache %v", v.rows, i, i/V, got[i], want[i])
			}
		}
	}

	r := NewRunner(m, 2, 8)
	defer r.Close()
	m.MaxBatch = 8
	a, _ := m.NewState(256)
	la, lb := make([]float32, V), make([]float32, V)
	if err := r.Forward(a, c.Prompt[:100], la, false); err != nil {
		t.Fatal(err)
	}
	for _, ctx := range []int{256, 120} {
		b, _ := m.NewState(ctx)
		if err := b.CopyFrom(a); err != nil {
			t.Fatal(err)
		}
		a2, _ := m.NewState(256)
		a2.CopyFrom(a)
		if err := r.Forward(a2, c.Prompt[100:120], la, false); err != nil {
			t.Fatal(err)
		}
		if err := r.Forward(b, c.Prompt[100:120], lb, false); err != nil {
			t.Fatal(err)
		}
		for i := range la {
			if la[i] != lb[i] {
				t.Fatalf("copy into ctx %d: logit %d: original %v, resumed copy %v", ctx, i, la[i], lb[i])
			}
		}
	}

	wide := NewRunner(m, 2, 64)
	defer wide.Close()
	m.MaxBatch = 8
	st, _ := m.NewState(256)
	if err := wide.Forward(st, c.Prompt[:64], la, false); err == nil || !strings.Contains(err.Error(), "ring") {
		t.Errorf("64-row step over a ring of window+8: err %v, want a ring error", err)
	}
}
