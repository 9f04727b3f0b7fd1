package main

import (
	"fmt"
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// TestSynthGGUFQwen35 writes a small qwen3_5_moe model as a qwen35moe GGUF
// and reads it back: the metadata llama.cpp's loader reads, every tensor
// it creates with the shape it expects (both derived here from the
// config), nothing else (no MTP layer), and the converter's transforms on
// the values: norms 1+w, A = -exp(A_log), the DeltaNet's value heads in
// tiled order (value head j of key head k at j·keyHeads+k) in every tensor
// that has them, everything else bit for bit.
func TestSynthGGUFQwen35(t *testing.T) {
	lin, full := format.LinearAttention, format.FullAttention
	cfg := format.Config{Family: family.NameQwen35MoE, Hidden: 64, Layers: 4, Vocab: 96, Heads: 2, KVHeads: 1, HeadDim: 64,
		RotaryDim: 16, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 4096, Experts: 4, TopK: 2, MoEInter: 64, SharedInter: 128,
		NormTopK: true, LinearKeyHeads: 2, LinearValueHeads: 6, LinearKeyDim: 32, LinearValueDim: 32, ConvKernel: 4,
		MTPLayers: 1, LayerTypes: []string{lin, lin, lin, full}}
	// Distinct per-head values where synth writes constants, so that the
	// order and the transforms show.
	f := writeGGUF(t, cfg, func(dense []byte, src map[string]*format.Tensor) {
		for _, n := range []string{"layers.1.linear_attn.A_log", "layers.1.linear_attn.dt_bias", "layers.1.input_layernorm.weight"} {
			setVec(dense, src, n)
		}
	})

	const a = "qwen35moe."
	u := func(v int) uint32 { return uint32(v) }
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	f.keys(map[string]any{
		"general.architecture": "qwen35moe", a + "block_count": u(cfg.Layers), a + "embedding_length": u(H),
		a + "attention.head_count": u(cfg.Heads), a + "attention.head_count_kv": u(cfg.KVHeads),
		a + "attention.key_length": u(cfg.HeadDim), a + "attention.value_length": u(cfg.HeadDim),
		a + "rope.dimension_count": u(cfg.RotaryDim), a + "rope.freq_base": float32(cfg.RopeTheta),
		a + "attention.layer_norm_rms_epsilon": float32(cfg.RMSEps), a + "expert_count": u(cfg.Experts),
		a + "expert_used_count": u(cfg.TopK), a + "expert_feed_forward_length": u(cfg.MoEInter),
		a + "expert_shared_feed_forward_length": u(cfg.SharedInter), a + "ssm.conv_kernel": u(cfg.ConvKernel),
		a + "ssm.state_size": u(kd), a + "ssm.group_count": u(nk), a + "ssm.time_step_rank": u(nv),
		a + "ssm.inner_size": u(nv * vd), a + "full_attention_interval": u(4), "general.file_type": u(2),
		a + "nextn_predict_layers": nil,
	})
	if s, _ := f.g.Get(a + "rope.dimension_sections").([]int32); len(s) != 4 {
		t.Errorf("rope.dimension_sections = %v, want 4 sections", f.g.Get(a+"rope.dimension_sections"))
	}

	// The tensors llama.cpp's qwen35moe creates, with ggml dims.
	conv := 2*nk*kd + nv*vd
	want := map[string][]uint64{"token_embd.weight": dims(H, cfg.Vocab), "output_norm.weight": dims(H), "output.weight": dims(H, cfg.Vocab)}
	for l := 0; l < cfg.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		w := map[string][]uint64{"attn_norm.weight": dims(H), "post_attention_norm.weight": dims(H),
			"ffn_gate_inp.weight": dims(H, cfg.Experts), "ffn_gate_exps.weight": dims(H, cfg.MoEInter, cfg.Experts),
			"ffn_up_exps.weight": dims(H, cfg.MoEInter, cfg.Experts), "ffn_down_exps.weight": dims(cfg.MoEInter, H, cfg.Experts),
			"ffn_gate_inp_shexp.weight": dims(H), "ffn_gate_shexp.weight": dims(H, cfg.SharedInter),
			"ffn_up_shexp.weight": dims(H, cfg.SharedInter), "ffn_down_shexp.weight": dims(cfg.SharedInter, H)}
		if cfg.LayerTypes[l] == full {
			q := cfg.Heads * cfg.HeadDim
			for k, v := range map[string][]uint64{"attn_q.weight": dims(H, 2*q), "attn_k.weight": dims(H, cfg.KVHeads*cfg.HeadDim),
				"attn_v.weight": dims(H, cfg.KVHeads*cfg.HeadDim), "attn_output.weight": dims(q, H),
				"attn_q_norm.weight": dims(cfg.HeadDim), "attn_k_norm.weight": dims(cfg.HeadDim)} {
				w[k] = v
			}
		} else {
			for k, v := range map[string][]uint64{"attn_qkv.weight": dims(H, conv), "attn_gate.weight": dims(H, nv*vd),
				"ssm_conv1d.weight": dims(cfg.ConvKernel, conv), "ssm_dt.bias": dims(nv), "ssm_a": dims(nv),
				"ssm_beta.weight": dims(H, nv), "ssm_alpha.weight": dims(H, nv), "ssm_norm.weight": dims(vd),
				"ssm_out.weight": dims(nv*vd, H)} {
				w[k] = v
			}
		}
		for k, v := range w {
			want[b+k] = v
		}
	}
	f.tensors(want, "blk.1.ssm_conv1d.weight", "blk.1.ssm_a", "blk.1.ssm_dt.bias", "blk.1.ssm_norm.weight",
		"blk.1.attn_norm.weight", "blk.1.ffn_gate_inp.weight")
	if t.Failed() {
		return
	}

	// Values: rows of GGUF tensors against rows of the sources.
	// srcHead is the source value head of value head h in tiled order.
	srcHead := func(h int) int { return h%nk*(nv/nk) + h/nk }
	vRow := func(r int) int { return srcHead(r/vd)*vd + r%vd }
	qkvRow := func(r int) int {
		if r < 2*nk*kd {
			return r
		}
		return 2*nk*kd + vRow(r-2*nk*kd)
	}
	plus1 := func(v float32) float32 { return 1 + v }
	f.same("blk.1.attn_norm.weight", "layers.1.input_layernorm.weight", plus1)
	f.same("blk.3.attn_q_norm.weight", "layers.3.self_attn.q_norm.weight", plus1)
	f.same("output_norm.weight", "norm.weight", plus1)
	f.same("blk.1.ssm_norm.weight", "layers.1.linear_attn.norm.weight", nil)
	f.mapped("blk.1.ssm_a", "layers.1.linear_attn.A_log", nil, srcHead, func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	f.mapped("blk.1.ssm_dt.bias", "layers.1.linear_attn.dt_bias", nil, srcHead, nil)
	f.mapped("blk.1.attn_qkv.weight", "layers.1.linear_attn.in_proj_qkv.weight", qkvRow, nil, nil)
	f.mapped("blk.1.ssm_conv1d.weight", "layers.1.linear_attn.conv1d.weight", qkvRow, nil, nil)
	f.mapped("blk.1.attn_gate.weight", "layers.1.linear_attn.in_proj_z.weight", vRow, nil, nil)
	f.mapped("blk.1.ssm_beta.weight", "layers.1.linear_attn.in_proj_b.weight", srcHead, nil, nil)
	f.mapped("blk.1.ssm_alpha.weight", "layers.1.linear_attn.in_proj_a.weight", srcHead, nil, nil)
	f.mapped("blk.1.ssm_out.weight", "layers.1.linear_attn.out_proj.weight", nil, vRow, nil)
	f.same("blk.3.attn_q.weight", "layers.3.self_attn.q_proj.weight", nil)
	f.same("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight", nil)
	f.same("blk.2.ffn_gate_inp.weight", "layers.2.mlp.gate.weight", nil)
	f.same("blk.2.ffn_gate_inp_shexp.weight", "layers.2.mlp.shared_expert_gate.weight", nil)
	f.same("blk.2.ffn_down_shexp.weight", "layers.2.mlp.shared_expert.down_proj.weight", nil)
	f.same("token_embd.weight", "embed_tokens.weight", nil)

	// Expert e of layer l is record l·E+e.
	f.experts("blk.2.ffn_down_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Down })
}
