package main

import (
	"encoding/json"
	"fmt"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/gguf"
)

// glm4MoE plans llama.cpp's glm4moe as convert_hf_to_gguf.py writes
// GLM-4.5 (Glm4MoeModel): the checkpoint's tensors renamed, q/k/v biases
// as attn_{q,k,v}.bias, the leading dense layers' MLP as ffn_{gate,up,down},
// then the router as ffn_gate_inp with its correction bias as
// exp_probs_b.bias, the routed experts stacked and the shared experts as
// ffn_*_shexp; metadata for the sigmoid router (expert_gating_func 2),
// the routed scale, renormalisation, the leading dense layers and the
// rope over the first rotary_dim dims of each head (rotated as halves,
// llama.cpp's NEOX for this architecture). No MTP layer: nextn_predict_layers
// is left out, so llama.cpp expects none. llama.cpp's glm4moe routes
// without groups, so only n_group = 1 (GLM-4.5's) can be written.
func (p *ggufPlan) glm4MoE() error {
	c := &p.m.Config
	const arch = "glm4moe"
	var ac family.GLM4MoEArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return fmt.Errorf("gguf: glm4_moe arch config: %v", err)
	}
	if ac.Groups != 1 {
		return fmt.Errorf("gguf: %d router groups: llama.cpp's %s routes without groups", ac.Groups, arch)
	}
	if c.SharedInter%c.MoEInter != 0 {
		return fmt.Errorf("gguf: shared expert of %d is not whole experts of %d", c.SharedInter, c.MoEInter)
	}
	p.header(arch)
	p.set(arch+".feed_forward_length", uint32(ac.Inter))
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".rope.dimension_count", Value: uint32(c.RotaryDim)},
		gguf.KV{Key: arch + ".expert_shared_count", Value: uint32(c.SharedInter / c.MoEInter)},
		gguf.KV{Key: arch + ".leading_dense_block_count", Value: uint32(c.FirstDense)},
		gguf.KV{Key: arch + ".expert_gating_func", Value: uint32(2)}, // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
		gguf.KV{Key: arch + ".expert_weights_scale", Value: float32(ac.RoutedScale)},
		gguf.KV{Key: arch + ".expert_weights_norm", Value: c.NormTopK},
	)
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b, s := fmt.Sprintf("blk.%d.", l), fmt.Sprintf("layers.%d.", l)
		names := [][2]string{{"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
			{"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"post_attention_norm", "post_attention_layernorm"}}
		if ac.QKNorm {
			names = append(names, [2]string{"attn_q_norm", "self_attn.q_norm"}, [2]string{"attn_k_norm", "self_attn.k_norm"})
		}
		if err := p.addAll(b, s, names); err != nil {
			return err
		}
		if ac.AttnBias {
			for _, n := range []string{"q", "k", "v"} {
				if err := p.add(b+"attn_"+n+".bias", s+"self_attn."+n+"_proj.bias", ggufXform{}); err != nil {
					return err
				}
			}
		}
		if err := p.sigmoidMoE(b, s, l); err != nil {
			return err
		}
	}
	return p.addAll("", "", [][2]string{{"output_norm", "norm"}, {"output", "lm_head"}})
}
