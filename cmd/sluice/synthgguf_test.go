package main

import (
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
)

// TestSynthGGUFQwen35 writes a small qwen3_5_moe model as a qwen35moe GGUF
// and reads it back: the metadata llama.cpp's loader reads, every tensor
// it creates with the shape it expects (both derived here from the
// config), nothing else (no MTP layer), and the converter's transforms on
// the values: norms 1+w, A = -exp(A_log), the DeltaNet's value heads in
// tiled order (value head j of key head k at j·keyHeads+k) in every tensor
// that has them, everything else bit for bit.
func TestSynthGGUFQwen35(t *testing.T) {
	f := writeQwen3Hybrid(t, family.NameQwen35MoE)
	cfg := &f.m.Config
	const a = "qwen35moe."
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	f.keys(qwen3HybridKeys(cfg, "qwen35moe"))
	if s, _ := f.g.Get(a + "rope.dimension_sections").([]int32); len(s) != 4 {
		t.Errorf("rope.dimension_sections = %v, want 4 sections", f.g.Get(a+"rope.dimension_sections"))
	}

	// The tensors llama.cpp's qwen35moe creates, with ggml dims.
	f.tensors(qwen3HybridTensors(cfg, map[string][]uint64{"ssm_beta.weight": dims(H, nv), "ssm_alpha.weight": dims(H, nv)}),
		"blk.1.ssm_conv1d.weight", "blk.1.ssm_a", "blk.1.ssm_dt.bias", "blk.1.ssm_norm.weight", "blk.1.attn_norm.weight",
		"blk.1.ffn_gate_inp.weight")
	if t.Failed() {
		return
	}

	// Values: what qwen3next converts alike, then the DeltaNet's tensors,
	// whose value heads are in tiled order. srcHead is the source value
	// head of value head h.
	f.qwen3HybridValues()
	srcHead := func(h int) int { return h%nk*(nv/nk) + h/nk }
	vRow := func(r int) int { return srcHead(r/vd)*vd + r%vd }
	qkvRow := func(r int) int {
		if r < 2*nk*kd {
			return r
		}
		return 2*nk*kd + vRow(r-2*nk*kd)
	}
	f.mapped("blk.1.ssm_a", "layers.1.linear_attn.A_log", nil, srcHead, func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	f.mapped("blk.1.ssm_dt.bias", "layers.1.linear_attn.dt_bias", nil, srcHead, nil)
	f.mapped("blk.1.attn_qkv.weight", "layers.1.linear_attn.in_proj_qkv.weight", qkvRow, nil, nil)
	f.mapped("blk.1.ssm_conv1d.weight", "layers.1.linear_attn.conv1d.weight", qkvRow, nil, nil)
	f.mapped("blk.1.attn_gate.weight", "layers.1.linear_attn.in_proj_z.weight", vRow, nil, nil)
	f.mapped("blk.1.ssm_beta.weight", "layers.1.linear_attn.in_proj_b.weight", srcHead, nil, nil)
	f.mapped("blk.1.ssm_alpha.weight", "layers.1.linear_attn.in_proj_a.weight", srcHead, nil, nil)
	f.mapped("blk.1.ssm_out.weight", "layers.1.linear_attn.out_proj.weight", nil, vRow, nil)
}
