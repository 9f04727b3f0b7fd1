package main

import (
	"encoding/json"
	"fmt"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
)

// gptOSS plans llama.cpp's gpt-oss as convert_hf_to_gguf.py writes
// gpt-oss (GptOssModel): the checkpoint's tensors renamed, every
// projection's bias, the sinks as attn_sinks, the router's bias as
// ffn_gate_inp.bias, the experts' gate and up (which the checkpoint
// interleaves and sluice's records hold apart) and their biases stacked;
// metadata for the sliding window and the YaRN rope. MXFP4 experts (synth
// at 4 bits, as the release) stay MXFP4, as the converter keeps the
// release's; q8 ones become Q8_0. llama.cpp places the
// sliding-window layers by a period of 2 (layers 0, 2, ... slide), and
// takes YaRN's attention factor from the scaling factor alone, so other
// layer patterns and explicit factors are refused.
func (p *ggufPlan) gptOSS() error {
	c := &p.m.Config
	const arch = "gpt-oss"
	var ac family.GPTOSSArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return fmt.Errorf("gguf: gpt_oss arch config: %v", err)
	}
	y := &ac.Rope
	if y.AttentionFactor != nil || y.Mscale != 0 || y.MscaleAllDim != 0 {
		return fmt.Errorf("gguf: YaRN with an explicit attention factor or mscale: llama.cpp's %s derives it from the factor", arch)
	}
	for i, t := range c.LayerTypes {
		if (t == format.SlidingAttention) != (i%2 == 0) {
			return fmt.Errorf("gguf: layer types %v: llama.cpp's %s slides on the even layers", c.LayerTypes, arch)
		}
	}
	p.header(arch)
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".attention.sliding_window", Value: uint32(c.SlidingWindow)},
		gguf.KV{Key: arch + ".rope.scaling.type", Value: "yarn"},
		gguf.KV{Key: arch + ".rope.scaling.factor", Value: float32(y.Factor)},
		gguf.KV{Key: arch + ".rope.scaling.original_context_length", Value: uint32(y.OrigMaxPos)},
		gguf.KV{Key: arch + ".rope.scaling.yarn_beta_fast", Value: float32(y.BetaFast)},
		gguf.KV{Key: arch + ".rope.scaling.yarn_beta_slow", Value: float32(y.BetaSlow)},
	)
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b, s := fmt.Sprintf("blk.%d.", l), fmt.Sprintf("layers.%d.", l)
		if err := p.addAll(b, s, [][2]string{{"attn_norm", "input_layernorm"}, {"post_attention_norm", "post_attention_layernorm"},
			{"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"}, {"attn_v", "self_attn.v_proj"},
			{"attn_output", "self_attn.o_proj"}, {"ffn_gate_inp", "mlp.router"}}); err != nil {
			return err
		}
		for _, n := range [][2]string{{"attn_q.bias", "self_attn.q_proj.bias"}, {"attn_k.bias", "self_attn.k_proj.bias"},
			{"attn_v.bias", "self_attn.v_proj.bias"}, {"attn_output.bias", "self_attn.o_proj.bias"},
			{"attn_sinks.weight", "self_attn.sinks"}, {"ffn_gate_inp.bias", "mlp.router.bias"}} {
			if err := p.add(b+n[0], s+n[1], ggufXform{}); err != nil {
				return err
			}
		}
		p.addExperts(b, l)
	}
	return p.addAll("", "", [][2]string{{"output_norm", "norm"}, {"output", "lm_head"}})
}
