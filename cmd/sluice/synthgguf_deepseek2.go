package main

import (
	"encoding/json"
	"fmt"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/gguf"
)

// deepSeek2 plans llama.cpp's deepseek2 as convert_hf_to_gguf.py writes it
// for DeepSeek-V3 (DeepseekV2Model): MLA as MQA over one latent "head"
// (head_count_kv 1, key_length kv_lora+rope, value_length kv_lora, the
// per-head sizes as key/value_length_mla); kv_b_proj split per head into
// attn_k_b, transposed ([head][kv_lora][nope], which the absorbed query
// multiplies) and attn_v_b ([head][v][kv_lora]), as sluice packs it; the router's correction
// bias as exp_probs_b; sigmoid gating, groups, the weights' norm and scale
// as metadata; yarn with the attention's mscale as yarn_log_multiplier
// (0.1·mscale_all_dim, which llama.cpp divides by 0.1 again). sluice packs
// the rope rows of q_b_proj and kv_a_proj_with_mqa de-interleaved (evens,
// then odds: a half-split rope); llama.cpp rotates adjacent pairs, as the
// checkpoint stores them, so those rows go back to the checkpoint's
// interleaved order. No MTP
// layer (the converter skips it too), and no V3.2 indexer, which only
// llama.cpp's deepseek32 has.
func (p *ggufPlan) deepSeek2() error {
	c := &p.m.Config
	const arch = "deepseek2"
	var a family.DeepSeekArch
	if err := json.Unmarshal(c.Arch, &a); err != nil {
		return fmt.Errorf("gguf: %s arch config: %v", c.Family, err)
	}
	if a.IndexTopK > 0 {
		return fmt.Errorf("gguf: a sparse-attention indexer (DeepSeek-V3.2) is not llama.cpp's %s", arch)
	}
	if a.RopeDim%2 != 0 || c.Heads <= 0 {
		return fmt.Errorf("gguf: rope dims %d over %d heads", a.RopeDim, c.Heads)
	}
	if c.MoEInter <= 0 || c.SharedInter%c.MoEInter != 0 {
		return fmt.Errorf("gguf: shared expert of %d is not whole experts of %d", c.SharedInter, c.MoEInter)
	}
	p.header(arch)
	// The header's generic values, which MLA and the dense layers change.
	for k, v := range map[string]uint32{"feed_forward_length": uint32(a.Inter), "attention.head_count_kv": 1,
		"attention.key_length": uint32(a.KVLora + a.RopeDim), "attention.value_length": uint32(a.KVLora)} {
		p.set(arch+"."+k, v)
	}
	if y := a.Yarn; y != nil {
		// llama.cpp takes mscale = mscale_all_dim (the releases' configs)
		// and truncates the correction range; anything else would be a
		// different rope or attention scale.
		if y.AttentionFactor != nil || y.Mscale != y.MscaleAllDim || y.MscaleAllDim == 0 || !y.Truncate {
			return fmt.Errorf("gguf: yarn with attention_factor %v, mscale %g, mscale_all_dim %g, truncate %v: llama.cpp's %s computes another rope",
				y.AttentionFactor, y.Mscale, y.MscaleAllDim, y.Truncate, arch)
		}
		p.kvs = append(p.kvs,
			gguf.KV{Key: arch + ".rope.scaling.type", Value: "yarn"},
			gguf.KV{Key: arch + ".rope.scaling.factor", Value: float32(y.Factor)},
			gguf.KV{Key: arch + ".rope.scaling.original_context_length", Value: uint32(y.OrigMaxPos)},
			gguf.KV{Key: arch + ".rope.scaling.yarn_beta_fast", Value: float32(y.BetaFast)},
			gguf.KV{Key: arch + ".rope.scaling.yarn_beta_slow", Value: float32(y.BetaSlow)},
			gguf.KV{Key: arch + ".rope.scaling.yarn_log_multiplier", Value: float32(0.1 * y.MscaleAllDim)})
	}
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".expert_group_count", Value: uint32(a.Groups)},
		gguf.KV{Key: arch + ".expert_group_used_count", Value: uint32(a.TopGroups)},
		gguf.KV{Key: arch + ".expert_gating_func", Value: uint32(2)}, // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
		gguf.KV{Key: arch + ".leading_dense_block_count", Value: uint32(c.FirstDense)},
		gguf.KV{Key: arch + ".attention.q_lora_rank", Value: uint32(a.QLora)},
		gguf.KV{Key: arch + ".attention.kv_lora_rank", Value: uint32(a.KVLora)},
		gguf.KV{Key: arch + ".attention.key_length_mla", Value: uint32(a.Nope + a.RopeDim)},
		gguf.KV{Key: arch + ".attention.value_length_mla", Value: uint32(a.V)},
		gguf.KV{Key: arch + ".expert_shared_count", Value: uint32(c.SharedInter / c.MoEInter)},
		gguf.KV{Key: arch + ".expert_weights_scale", Value: float32(a.RoutedScale)},
		gguf.KV{Key: arch + ".rope.dimension_count", Value: uint32(a.RopeDim)},
	)
	if c.NormTopK {
		p.kvs = append(p.kvs, gguf.KV{Key: arch + ".expert_weights_norm", Value: true})
	}

	qk, nh, kvl := a.Nope+a.RopeDim, c.Heads, a.KVLora
	// interleave[j] is the packed row of rope row j: pair i, rotated as
	// (i, i+rope/2) in sluice, is rows (2i, 2i+1) in llama.cpp.
	interleave := func(rows []int, at int) {
		for j := 0; j < a.RopeDim; j++ {
			rows[at+j] = at + j/2 + j%2*(a.RopeDim/2)
		}
	}
	identity := func(n int) []int {
		r := make([]int, n)
		for i := range r {
			r[i] = i
		}
		return r
	}
	dims := func(x ...int) []uint64 {
		r := make([]uint64, len(x))
		for i, v := range x {
			r[i] = uint64(v)
		}
		return r
	}
	qRows := identity(nh * qk)
	for h := 0; h < nh; h++ {
		interleave(qRows, h*qk+a.Nope)
	}
	kvaRows := identity(kvl + a.RopeDim)
	interleave(kvaRows, kvl)
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b, s := fmt.Sprintf("blk.%d.", l), fmt.Sprintf("layers.%d.", l)
		sa := s + "self_attn."
		if err := p.addEach(b, "", []ggufNamed{
			{"attn_norm.weight", s + "input_layernorm.weight", ggufXform{}},
			{"attn_q_a.weight", sa + "q_a_proj.weight", ggufXform{}},
			{"attn_q_a_norm.weight", sa + "q_a_layernorm.weight", ggufXform{}},
			{"attn_q_b.weight", sa + "q_b_proj.weight", ggufXform{rows: qRows}},
			{"attn_kv_a_mqa.weight", sa + "kv_a_proj_with_mqa.weight", ggufXform{rows: kvaRows}},
			{"attn_kv_a_norm.weight", sa + "kv_a_layernorm.weight", ggufXform{}},
			{"attn_k_b.weight", family.KBName(l), ggufXform{dims: dims(a.Nope, kvl, nh)}},
			{"attn_v_b.weight", family.VBName(l), ggufXform{dims: dims(kvl, a.V, nh)}},
			{"attn_output.weight", sa + "o_proj.weight", ggufXform{}},
			{"ffn_norm.weight", s + "post_attention_layernorm.weight", ggufXform{}},
		}); err != nil {
			return err
		}
		if err := p.sigmoidMoE(b, s, l); err != nil {
			return err
		}
	}
	return p.addAll("", "", [][2]string{{"output_norm", "norm"}, {"output", "lm_head"}})
}
