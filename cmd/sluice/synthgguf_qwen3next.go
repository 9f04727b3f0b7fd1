package main

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
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
// dims, with no M-RoPE sections. As for qwen35moe: norms 1+w but for the
// DeltaNet's gated norm, A = -exp(A_log), the conv kernel as {K,
// channels}, the attention's q projection whole (query ‖ gate per head), no
// MTP layer (the converter's --no-mtp; llama.cpp does not need it).
func (p *ggufPlan) qwen3Next() error {
	c := &p.m.Config
	const arch = "qwen3next"
	nk, nv, kd, vd := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim
	if kd != vd {
		return fmt.Errorf("gguf: DeltaNet key and value heads of %d and %d: llama.cpp's %s takes one head size", kd, vd, arch)
	}
	if nk <= 0 || nv%nk != 0 {
		return fmt.Errorf("gguf: %d value heads over %d key heads", nv, nk)
	}
	if c.SharedInter <= 0 {
		return fmt.Errorf("gguf: llama.cpp's %s requires a shared expert", arch)
	}
	if !c.NormTopK {
		return fmt.Errorf("gguf: llama.cpp's %s always renormalises the top-%d router weights, this model does not", arch, c.TopK)
	}
	interval, err := fullAttentionInterval(c.LayerTypes)
	if err != nil {
		return err
	}
	p.header(arch)
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".expert_shared_feed_forward_length", Value: uint32(c.SharedInter)},
		gguf.KV{Key: arch + ".rope.dimension_count", Value: uint32(c.RotaryDim)},
		gguf.KV{Key: arch + ".ssm.conv_kernel", Value: uint32(c.ConvKernel)},
		gguf.KV{Key: arch + ".ssm.state_size", Value: uint32(kd)},
		gguf.KV{Key: arch + ".ssm.group_count", Value: uint32(nk)},
		gguf.KV{Key: arch + ".ssm.time_step_rank", Value: uint32(nv)},
		gguf.KV{Key: arch + ".ssm.inner_size", Value: uint32(vd * nv)},
		gguf.KV{Key: arch + ".full_attention_interval", Value: uint32(interval)},
	)
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
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b, s := fmt.Sprintf("blk.%d.", l), fmt.Sprintf("layers.%d.", l)
		type t = struct {
			name, src string
			x         ggufXform
		}
		ts := []t{{"attn_norm.weight", "input_layernorm.weight", ggufPlusOne},
			{"post_attention_norm.weight", "post_attention_layernorm.weight", ggufPlusOne}}
		if c.LayerTypes[l] == format.FullAttention {
			ts = append(ts, t{"attn_q.weight", "self_attn.q_proj.weight", ggufXform{}},
				t{"attn_k.weight", "self_attn.k_proj.weight", ggufXform{}},
				t{"attn_v.weight", "self_attn.v_proj.weight", ggufXform{}},
				t{"attn_output.weight", "self_attn.o_proj.weight", ggufXform{}},
				t{"attn_q_norm.weight", "self_attn.q_norm.weight", ggufPlusOne},
				t{"attn_k_norm.weight", "self_attn.k_norm.weight", ggufPlusOne})
		} else {
			la := s + "linear_attn."
			a := p.byName[la+"in_proj_a.weight"]
			if a == nil {
				return fmt.Errorf("gguf: model has no tensor %sin_proj_a.weight", la)
			}
			ts = append(ts, t{"attn_qkv.weight", "linear_attn.in_proj_qkv.weight", ggufXform{}},
				t{"attn_gate.weight", "linear_attn.in_proj_z.weight", ggufXform{}},
				t{"ssm_conv1d.weight", "linear_attn.conv1d.weight", ggufXform{dims: []uint64{uint64(c.ConvKernel), uint64(2*nk*kd + nv*vd)}}},
				t{"ssm_dt.bias", "linear_attn.dt_bias", ggufXform{}},
				t{"ssm_a", "linear_attn.A_log", ggufNegExp},
				t{"ssm_ba.weight", "linear_attn.in_proj_b.weight", ggufXform{more: []*format.Tensor{a}, rows: ba}},
				t{"ssm_norm.weight", "linear_attn.norm.weight", ggufXform{}},
				t{"ssm_out.weight", "linear_attn.out_proj.weight", ggufXform{}})
		}
		ts = append(ts, t{"ffn_gate_inp.weight", "mlp.gate.weight", ggufXform{}})
		for _, x := range ts {
			if err := p.add(b+x.name, s+x.src, x.x); err != nil {
				return err
			}
		}
		p.addExperts(b, l)
		if err := p.add(b+"ffn_gate_inp_shexp.weight", s+"mlp.shared_expert_gate.weight", ggufXform{dims: []uint64{uint64(c.Hidden)}}); err != nil {
			return err
		}
		if err := p.addAll(b, s+"mlp.shared_expert.", [][2]string{{"ffn_gate_shexp", "gate_proj"},
			{"ffn_up_shexp", "up_proj"}, {"ffn_down_shexp", "down_proj"}}); err != nil {
			return err
		}
	}
	if err := p.add("output_norm.weight", "norm.weight", ggufPlusOne); err != nil {
		return err
	}
	return p.add("output.weight", "lm_head.weight", ggufXform{})
}
