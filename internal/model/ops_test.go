package model

import (
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/testutil"
)

// A runner with Ops set computes the same bits, and counts each of the
// trunk's operations once a layer that has it (norms twice a layer and
// once at the end, the logits once a step).
func TestOpsTimed(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			m := load(t, name, 4)
			r := NewRunner(m, 2, 16)
			defer r.Close()
			prompt := []int{1, 2, 3, 4, 5}
			V := m.Config.Vocab
			run := func(ops *block.OpTimes) []float32 {
				st, err := m.NewState(len(prompt) + 1)
				if err != nil {
					t.Fatal(err)
				}
				r.Ops = ops
				defer func() { r.Ops = nil }()
				out := make([]float32, V)
				if err := r.Forward(st, prompt, out, false); err != nil {
					t.Fatal(err)
				}
				if err := r.Forward(st, prompt[:1], out, false); err != nil {
					t.Fatal(err)
				}
				return out
			}
			plain := run(nil)
			var ops block.OpTimes
			timed := run(&ops)
			for i := range plain {
				if math.Float32bits(plain[i]) != math.Float32bits(timed[i]) {
					t.Fatalf("logit %d: %v timed, %v untimed", i, timed[i], plain[i])
				}
			}
			want := map[block.Op]int64{block.OpNorm: int64(2*len(m.Arch.Layers) + 1), block.OpLMHead: 1}
			for _, L := range m.Arch.Layers {
				switch L.Mixer.(type) {
				case *block.Attn:
					want[block.OpProject]++
				case *block.MLA:
					want[block.OpMLAProject]++
				case *block.DeltaNet:
					want[block.OpDNProject]++
				default:
					t.Fatalf("mixer %T", L.Mixer)
				}
				switch L.FFN.(type) {
				case *block.MoE:
					want[block.OpExperts]++
				case *block.MLP:
					want[block.OpDense]++
				default:
					t.Fatalf("ffn %T", L.FFN)
				}
			}
			for _, o := range []block.Op{block.OpNorm, block.OpLMHead, block.OpProject, block.OpMLAProject, block.OpDNProject, block.OpExperts, block.OpDense} {
				steps := int64(2) // the prompt's step and one decode step
				if got := ops.Calls[o]; got != want[o]*steps {
					t.Errorf("%s: %d calls over 2 steps, want %d", o, got, want[o]*steps)
				}
			}
			if ops.Total() <= 0 {
				t.Errorf("no time counted: %+v", ops)
			}
		})
	}
}
