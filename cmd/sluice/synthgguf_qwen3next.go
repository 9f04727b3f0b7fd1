package main

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/format"
)

// qwen3Next plans llama.cpp's qwen3next as convert_hf_to_gguf.py writes it
// (Qwen3NextModel). It differs from qwen35moe (see qwen35MoE) where the
// checkpoints differ: the converter splits in_proj_qkvz into attn_qkv (q of
// every key head, then k, then v) and attn_gate (z), which is the split
// sluice's pack already holds, and keeps in_proj_ba fused as ssm_ba (per
// key head, its value heads' b rows then their a rows), which is rebuilt
// here from sluice's in_proj_b and in_proj_a. The value heads stay grouped
// by key head everywhere (qwen3next's graph repeats each key head over its
// group), so nothing is reordered; the rope is plain NeoX over the rotary
// dims, with no M-RoPE sections. As for qwen35moe (qwen3Hybrid plans what
// the two share): norms 1+w but for the DeltaNet's gated norm,
// A = -exp(A_log), the conv kernel as {K, channels}, the attention's q
// projection whole (query ‖ gate per head), no MTP layer (the converter's
// --no-mtp; llama.cpp does not need it).
func (p *ggufPlan) qwen3Next() error {
	c := &p.m.Config
	const arch = "qwen3next"
	if c.SharedInter <= 0 {
		return fmt.Errorf("gguf: llama.cpp's %s requires a shared expert", arch)
	}
	if !c.NormTopK {
		return fmt.Errorf("gguf: llama.cpp's %s always renormalises the top-%d router weights, this model does not", arch, c.TopK)
	}
	return p.qwen3Hybrid(arch, nil, func(c *format.Config) func(b, la string) error {
		nk, nv, kd, vd := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim
		// ssm_ba's rows over in_proj_b's nv rows then in_proj_a's: for key
		// head k, b then a of its r value heads k·r … k·r+r-1.
		r := nv / nk
		ba := make([]int, 0, 2*nv)
		for k := 0; k < nk; k++ {
			for _, off := range []int{0, nv} {
				for j := 0; j < r; j++ {
					ba = append(ba, off+k*r+j)
				}
			}
		}
		return func(b, la string) error {
			a := p.byName[la+"in_proj_a.weight"]
			if a == nil {
				return fmt.Errorf("gguf: model has no tensor %sin_proj_a.weight", la)
			}
			return p.addEach(b, la, []ggufNamed{
				{"attn_qkv.weight", "in_proj_qkv.weight", ggufXform{}},
				{"attn_gate.weight", "in_proj_z.weight", ggufXform{}},
				{"ssm_conv1d.weight", "conv1d.weight", ggufXform{dims: []uint64{uint64(c.ConvKernel), uint64(2*nk*kd + nv*vd)}}},
				{"ssm_dt.bias", "dt_bias", ggufXform{}},
				{"ssm_a", "A_log", ggufNegExp},
				{"ssm_ba.weight", "in_proj_b.weight", ggufXform{more: []*format.Tensor{a}, rows: ba}},
				{"ssm_norm.weight", "norm.weight", ggufXform{}},
				{"ssm_out.weight", "out_proj.weight", ggufXform{}},
			})
		}
	})
}
