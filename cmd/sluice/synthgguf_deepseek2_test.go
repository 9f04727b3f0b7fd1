package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// TestSynthGGUFDeepSeek2 writes a small DeepSeek-V3 (its config.json with
// small sizes: MLA, a dense layer first, grouped sigmoid routing, a shared
// expert, yarn, an MTP layer) as a deepseek2 GGUF and reads it back: the
// metadata llama.cpp's loader reads, every tensor it creates with the
// shape it expects (both derived here from the config), nothing else (no
// MTP layer), and the converter's transforms on the values: the rope rows
// of q_b and kv_a back in the checkpoint's interleaved order, the
// correction bias as exp_probs_b, everything else (k_b and v_b, which the
// pack holds split as llama.cpp does) bit for bit.
func TestSynthGGUFDeepSeek2(t *testing.T) {
	var hf map[string]any
	if err := json.Unmarshal([]byte(deepSeekV3Config), &hf); err != nil {
		t.Fatal(err)
	}
	const H, nh, qLora, kvl, nope, rope, V, inter, moeInter, E, groups, topGroups = 64, 2, 64, 64, 32, 16, 32, 128, 64, 8, 4, 2
	for k, v := range map[string]any{"hidden_size": H, "num_hidden_layers": 3, "num_attention_heads": nh, "num_key_value_heads": nh,
		"q_lora_rank": qLora, "kv_lora_rank": kvl, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": V,
		"intermediate_size": inter, "moe_intermediate_size": moeInter, "n_routed_experts": E, "n_group": groups,
		"topk_group": topGroups, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "vocab_size": 96} {
		hf[k] = v
	}
	raw0, _ := json.Marshal(hf)
	fam, _ := family.Named(family.NameDeepSeek)
	cfg, err := fam.Parse(raw0)
	if err != nil {
		t.Fatal(err)
	}
	// Distinct values where synth writes a constant, so that the order shows.
	f := writeGGUF(t, cfg, func(dense []byte, src map[string]*format.Tensor) {
		setVec(dense, src, "layers.2.mlp.gate.e_score_correction_bias")
	})

	const a = "deepseek2."
	u := func(v int) uint32 { return uint32(v) }
	y := hf["rope_scaling"].(map[string]any)
	f.keys(map[string]any{
		"general.architecture": "deepseek2", "general.file_type": u(2), a + "block_count": u(cfg.Layers),
		a + "context_length": u(int(hf["max_position_embeddings"].(float64))), a + "embedding_length": u(H),
		a + "feed_forward_length": u(inter), a + "attention.head_count": u(nh), a + "attention.head_count_kv": u(1),
		a + "attention.key_length": u(kvl + rope), a + "attention.value_length": u(kvl),
		a + "attention.key_length_mla": u(nope + rope), a + "attention.value_length_mla": u(V),
		a + "attention.q_lora_rank": u(qLora), a + "attention.kv_lora_rank": u(kvl), a + "rope.dimension_count": u(rope),
		a + "rope.freq_base": float32(hf["rope_theta"].(float64)), a + "attention.layer_norm_rms_epsilon": float32(1e-6),
		a + "expert_count": u(E), a + "expert_used_count": u(2), a + "expert_feed_forward_length": u(moeInter),
		a + "expert_shared_count": u(1), a + "expert_group_count": u(groups), a + "expert_group_used_count": u(topGroups),
		a + "expert_gating_func": u(2), a + "expert_weights_scale": float32(2.5), a + "expert_weights_norm": true,
		a + "leading_dense_block_count": u(1), a + "vocab_size": u(96),
		a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": float32(y["factor"].(float64)),
		a + "rope.scaling.original_context_length": u(int(y["original_max_position_embeddings"].(float64))),
		a + "rope.scaling.yarn_beta_fast":          float32(y["beta_fast"].(float64)),
		a + "rope.scaling.yarn_beta_slow":          float32(y["beta_slow"].(float64)),
		a + "rope.scaling.yarn_log_multiplier":     float32(0.1 * y["mscale_all_dim"].(float64)),
		a + "nextn_predict_layers":                 nil,
	})

	// The tensors llama.cpp's deepseek2 creates, with ggml dims.
	want := map[string][]uint64{"token_embd.weight": dims(H, 96), "output_norm.weight": dims(H), "output.weight": dims(H, 96)}
	for l := 0; l < cfg.Layers; l++ {
		w := map[string][]uint64{"attn_norm.weight": dims(H), "attn_q_a_norm.weight": dims(qLora), "attn_kv_a_norm.weight": dims(kvl),
			"attn_q_a.weight": dims(H, qLora), "attn_q_b.weight": dims(qLora, nh*(nope+rope)), "attn_kv_a_mqa.weight": dims(H, kvl+rope),
			"attn_k_b.weight": dims(nope, kvl, nh), "attn_v_b.weight": dims(kvl, V, nh), "attn_output.weight": dims(nh*V, H),
			"ffn_norm.weight": dims(H)}
		if l < 1 {
			w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"] = dims(H, inter), dims(H, inter), dims(inter, H)
		} else {
			for k, v := range map[string][]uint64{"ffn_gate_inp.weight": dims(H, E), "exp_probs_b.bias": dims(E),
				"ffn_gate_exps.weight": dims(H, moeInter, E), "ffn_up_exps.weight": dims(H, moeInter, E),
				"ffn_down_exps.weight": dims(moeInter, H, E), "ffn_gate_shexp.weight": dims(H, moeInter),
				"ffn_up_shexp.weight": dims(H, moeInter), "ffn_down_shexp.weight": dims(moeInter, H)} {
				w[k] = v
			}
		}
		for k, v := range w {
			want[fmt.Sprintf("blk.%d.%s", l, k)] = v
		}
	}
	f.tensors(want)
	if t.Failed() {
		return
	}

	// Values: rows of GGUF tensors against rows of the sources.
	// sluice packs rope pair p as rows (p, p+rope/2) of the rope part; the
	// checkpoint and llama.cpp hold it as rows (2p, 2p+1).
	ropeRow := func(r int) int { return r/2 + r%2*rope/2 }
	qk := nope + rope
	f.mapped("blk.1.attn_q_b.weight", "layers.1.self_attn.q_b_proj.weight", func(r int) int {
		if h, o := r/qk, r%qk; o >= nope {
			r = h*qk + nope + ropeRow(o-nope)
		}
		return r
	}, nil, nil)
	f.mapped("blk.0.attn_kv_a_mqa.weight", "layers.0.self_attn.kv_a_proj_with_mqa.weight", func(r int) int {
		if r >= kvl {
			r = kvl + ropeRow(r-kvl)
		}
		return r
	}, nil, nil)
	// k_b [head][kvl][nope] and v_b [head][V][kvl] are the pack's split of
	// kv_b_proj (family.TestDeepSeekKVBSplit), as they are.
	f.same("blk.1.attn_k_b.weight", family.KBName(1), nil)
	f.same("blk.0.attn_v_b.weight", family.VBName(0), nil)
	for _, n := range [][2]string{{"blk.2.exp_probs_b.bias", "layers.2.mlp.gate.e_score_correction_bias"},
		{"blk.2.ffn_gate_inp.weight", "layers.2.mlp.gate.weight"}, {"blk.1.attn_q_a.weight", "layers.1.self_attn.q_a_proj.weight"},
		{"blk.1.attn_output.weight", "layers.1.self_attn.o_proj.weight"}, {"blk.0.ffn_down.weight", "layers.0.mlp.down_proj.weight"},
		{"blk.2.ffn_up_shexp.weight", "layers.2.mlp.shared_experts.up_proj.weight"}, {"token_embd.weight", "embed_tokens.weight"},
		{"output.weight", "lm_head.weight"}} {
		f.same(n[0], n[1], nil)
	}

	// Expert e of layer l is record l·E+e.
	f.experts("blk.2.ffn_gate_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Gate })
}
