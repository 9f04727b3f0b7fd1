package pack

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/quant"
)

// mlxNotes carries MLX-quantised tensors into the pack and keeps count of
// how each was carried, for the notice the pack prints: a 4-bit group-64
// tensor packed at --bits 4 is copied (same q, scales, biases), any other
// is dequantised exactly and encoded as --bits asks.
type mlxNotes struct {
	kind    format.Kind
	tensors map[string]hf.MLXTensor
	exact   map[string]bool // canonical name (or switch_mlp prefix) → copied without requantising
}

func newMLXNotes(ck *hf.Checkpoint, kind format.Kind) *mlxNotes {
	ts := ck.MLXTensors()
	if len(ts) == 0 {
		return nil
	}
	m := &mlxNotes{kind: kind, tensors: map[string]hf.MLXTensor{}, exact: map[string]bool{}}
	for _, t := range ts {
		m.tensors[t.Name] = t
	}
	return m
}

// dense returns dense tensor s already encoded in kind k when the
// checkpoint holds it MLX 4-bit group-64 and k is q4, nil otherwise. Only
// families that read dense tensors unconverted qualify.
func (m *mlxNotes) dense(ck *hf.Checkpoint, c *format.Config, s format.Spec, k format.Kind) (*quant.Encoded, error) {
	if m == nil || k != format.Q4 || len(s.Shape) != 2 {
		return nil, nil
	}
	if f, err := family.Named(c.Family); err != nil || f.Dense != nil {
		return nil, nil
	}
	enc, ok, err := ck.Q4(s.Name, s.Shape, -1)
	if err != nil || !ok {
		return nil, err
	}
	m.exact[s.Name] = true
	return enc, nil
}

// experts returns the exact source of expert records, or nil when the
// store is not q4 or the checkpoint not MLX.
func (m *mlxNotes) experts(ck *hf.Checkpoint, k format.Kind) exactSource {
	if m == nil || k != format.Q4 {
		return nil
	}
	return func(l, e int) ([3]*quant.Encoded, bool, error) {
		enc, ok, err := ck.ExpertQ4(l, e)
		// A layer counts as copied only if every expert was.
		key := fmt.Sprintf("layers.%d.mlp.switch_mlp.", l)
		if prev, seen := m.exact[key]; !seen || prev {
			m.exact[key] = ok
		}
		return enc, ok, err
	}
}

// report writes one line per way the MLX tensors were carried over.
func (m *mlxNotes) report(w io.Writer) {
	if m == nil {
		return
	}
	if w == nil {
		w = os.Stderr
	}
	copied := 0
	requant := map[[2]int]int{}
	for n, t := range m.tensors {
		if i := strings.Index(n, "switch_mlp."); m.exact[n] || i >= 0 && m.exact[n[:i+len("switch_mlp.")]] {
			copied++
			continue
		}
		requant[[2]int{t.Bits, t.Group}]++
	}
	if copied > 0 {
		fmt.Fprintf(w, "pack: %d MLX 4-bit group-64 tensors copied as q4 without requantising\n", copied)
	}
	keys := make([][2]int, 0, len(requant))
	for k := range requant {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		fmt.Fprintf(w, "pack: %d MLX %d-bit group-%d tensors dequantised exactly, then stored as the pack stores them (requantised to %s where that kind is quantised)\n", requant[k], k[0], k[1], m.kind)
	}
}
