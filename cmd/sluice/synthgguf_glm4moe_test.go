package main

import (
	"fmt"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// glm4MoETestConfig is a small glm4_moe config.json: a dense layer first,
// q/k/v biases, q/k norms, two shared experts, an MTP layer.
const glm4MoETestConfig = `{"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 128,
	 "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_nextn_predict_layers": 1, "num_attention_heads": 4,
	 "num_key_value_heads": 2, "head_dim": 32, "partial_rotary_factor": 0.5, "n_routed_experts": 4,
	 "n_shared_experts": 2, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
	 "routed_scaling_factor": 1.5, "first_k_dense_replace": 1, "vocab_size": 96, "rms_norm_eps": 1e-5,
	 "max_position_embeddings": 4096, "rope_theta": 1000000, "attention_bias": true, "use_qk_norm": true}`

// TestSynthGGUFGLM4MoE writes a small glm4_moe model (a dense layer first,
// q/k/v biases, q/k norms, a shared expert, an MTP layer) as a glm4moe GGUF
// and reads it back: the metadata llama.cpp's loader reads, exactly the
// tensors it creates with the dims it expects (derived here from the
// config), no MTP layer, and every tensor's values from its source.
func TestSynthGGUFGLM4MoE(t *testing.T) {
	fam, _ := family.Named(family.NameGLM4MoE)
	cfg, err := fam.Parse([]byte(glm4MoETestConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := writeGGUF(t, cfg, func(dense []byte, src map[string]*format.Tensor) {
		setVec(dense, src, "layers.1.input_layernorm.weight")
		setVec(dense, src, "layers.1.mlp.gate.e_score_correction_bias")
	})
	const a = "glm4moe."
	u := func(v int) uint32 { return uint32(v) }
	H, hd, E := cfg.Hidden, cfg.HeadDim, cfg.Experts
	f.keys(map[string]any{
		"general.architecture": "glm4moe", "general.file_type": u(2), a + "block_count": u(3), a + "embedding_length": u(H),
		a + "feed_forward_length": u(128), a + "attention.head_count": u(4), a + "attention.head_count_kv": u(2),
		a + "attention.key_length": u(hd), a + "attention.value_length": u(hd), a + "rope.dimension_count": u(16),
		a + "rope.freq_base": float32(1e6), a + "attention.layer_norm_rms_epsilon": float32(1e-5),
		a + "expert_count": u(E), a + "expert_used_count": u(2), a + "expert_feed_forward_length": u(64),
		a + "expert_shared_count": u(2), a + "leading_dense_block_count": u(1), a + "expert_gating_func": u(2),
		a + "expert_weights_scale": float32(1.5), a + "expert_weights_norm": true, a + "vocab_size": u(96),
		a + "nextn_predict_layers": nil,
	})
	q, kv := cfg.Heads*hd, cfg.KVHeads*hd
	want := map[string][]uint64{"token_embd.weight": dims(H, 96), "output_norm.weight": dims(H), "output.weight": dims(H, 96)}
	for l := 0; l < cfg.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		w := map[string][]uint64{"attn_norm.weight": dims(H), "attn_q.weight": dims(H, q), "attn_k.weight": dims(H, kv),
			"attn_v.weight": dims(H, kv), "attn_q.bias": dims(q), "attn_k.bias": dims(kv), "attn_v.bias": dims(kv),
			"attn_output.weight": dims(q, H), "attn_q_norm.weight": dims(hd), "attn_k_norm.weight": dims(hd),
			"post_attention_norm.weight": dims(H)}
		if l == 0 {
			w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"] = dims(H, 128), dims(H, 128), dims(128, H)
		} else {
			w["ffn_gate_inp.weight"], w["exp_probs_b.bias"] = dims(H, E), dims(E)
			w["ffn_gate_exps.weight"], w["ffn_up_exps.weight"], w["ffn_down_exps.weight"] = dims(H, 64, E), dims(H, 64, E), dims(64, H, E)
			w["ffn_gate_shexp.weight"], w["ffn_up_shexp.weight"], w["ffn_down_shexp.weight"] = dims(H, 128), dims(H, 128), dims(128, H)
		}
		for k, v := range w {
			want[b+k] = v
		}
	}
	f.tensors(want, "blk.1.ffn_gate_inp.weight", "blk.1.exp_probs_b.bias", "blk.1.attn_q.bias")
	if t.Failed() {
		return
	}
	for _, n := range [][2]string{{"attn_norm.weight", "input_layernorm.weight"}, {"attn_q.weight", "self_attn.q_proj.weight"},
		{"attn_k.bias", "self_attn.k_proj.bias"}, {"attn_v.bias", "self_attn.v_proj.bias"}, {"attn_q.bias", "self_attn.q_proj.bias"},
		{"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
		{"post_attention_norm.weight", "post_attention_layernorm.weight"}, {"ffn_gate_inp.weight", "mlp.gate.weight"},
		{"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"}, {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"}} {
		f.same("blk.1."+n[0], "layers.1."+n[1], nil)
	}
	f.same("blk.0.ffn_up.weight", "layers.0.mlp.up_proj.weight", nil)
	f.same("token_embd.weight", "embed_tokens.weight", nil)
	f.same("output.weight", "lm_head.weight", nil)
	f.experts("blk.2.ffn_gate_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Gate })
	f.experts("blk.2.ffn_down_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Down })
}
