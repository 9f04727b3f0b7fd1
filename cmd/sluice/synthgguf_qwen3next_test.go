package main

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// q3nCheckpoint is a checkpoint of named float tensors, for reading a
// GGUF tensor back as the checkpoint tensor it was converted from.
type q3nCheckpoint struct {
	family.Checkpoint
	t map[string][]float32
}

func (c q3nCheckpoint) Has(name string) bool { return c.t[name] != nil }
func (c q3nCheckpoint) Float32(name string, _ []int) ([]float32, error) {
	if c.t[name] == nil {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return c.t[name], nil
}

// TestSynthGGUFQwen3Next writes a small qwen3_next model as a qwen3next
// GGUF and reads it back: the metadata llama.cpp's loader reads, every
// tensor it creates with the shape it expects (both derived here from the
// config), nothing else (no MTP layer), and the converter's transforms on
// the values: norms 1+w, A = -exp(A_log), ssm_ba the checkpoint's fused
// in_proj_ba (the family's packer, reading it as in_proj_ba, gives back
// the pack's in_proj_b and in_proj_a), everything else bit for bit, with
// the value heads in the checkpoint's order.
func TestSynthGGUFQwen3Next(t *testing.T) {
	lin, full := format.LinearAttention, format.FullAttention
	cfg := format.Config{Family: family.NameQwen3Next, Hidden: 64, Layers: 4, Vocab: 96, Heads: 2, KVHeads: 1, HeadDim: 64,
		RotaryDim: 16, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 4096, Experts: 4, TopK: 2, MoEInter: 64, SharedInter: 128,
		NormTopK: true, LinearKeyHeads: 2, LinearValueHeads: 6, LinearKeyDim: 32, LinearValueDim: 32, ConvKernel: 4,
		MTPLayers: 1, LayerTypes: []string{lin, lin, lin, full}}
	// Distinct values where synth writes constants, so that the transforms
	// and any reordering show.
	f := writeGGUF(t, cfg, func(dense []byte, src map[string]*format.Tensor) {
		for _, n := range []string{"layers.1.linear_attn.A_log", "layers.1.linear_attn.dt_bias", "layers.1.input_layernorm.weight"} {
			setVec(dense, src, n)
		}
	})

	const a = "qwen3next."
	u := func(v int) uint32 { return uint32(v) }
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	f.keys(map[string]any{
		"general.architecture": "qwen3next", a + "block_count": u(cfg.Layers), a + "embedding_length": u(H),
		a + "attention.head_count": u(cfg.Heads), a + "attention.head_count_kv": u(cfg.KVHeads),
		a + "attention.key_length": u(cfg.HeadDim), a + "attention.value_length": u(cfg.HeadDim),
		a + "rope.dimension_count": u(cfg.RotaryDim), a + "rope.freq_base": float32(cfg.RopeTheta),
		a + "attention.layer_norm_rms_epsilon": float32(cfg.RMSEps), a + "expert_count": u(cfg.Experts),
		a + "expert_used_count": u(cfg.TopK), a + "expert_feed_forward_length": u(cfg.MoEInter),
		a + "expert_shared_feed_forward_length": u(cfg.SharedInter), a + "ssm.conv_kernel": u(cfg.ConvKernel),
		a + "ssm.state_size": u(kd), a + "ssm.group_count": u(nk), a + "ssm.time_step_rank": u(nv),
		a + "ssm.inner_size": u(nv * vd), a + "full_attention_interval": u(4), "general.file_type": u(2),
		a + "nextn_predict_layers": nil, a + "rope.dimension_sections": nil,
	})

	// The tensors llama.cpp's qwen3next creates, with ggml dims.
	conv, q, kv := 2*nk*kd+nv*vd, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	want := map[string][]uint64{"token_embd.weight": dims(H, cfg.Vocab), "output_norm.weight": dims(H), "output.weight": dims(H, cfg.Vocab)}
	for l := 0; l < cfg.Layers; l++ {
		w := map[string][]uint64{"attn_norm.weight": dims(H), "post_attention_norm.weight": dims(H),
			"ffn_gate_inp.weight": dims(H, cfg.Experts), "ffn_gate_exps.weight": dims(H, cfg.MoEInter, cfg.Experts),
			"ffn_up_exps.weight": dims(H, cfg.MoEInter, cfg.Experts), "ffn_down_exps.weight": dims(cfg.MoEInter, H, cfg.Experts),
			"ffn_gate_inp_shexp.weight": dims(H), "ffn_gate_shexp.weight": dims(H, cfg.SharedInter),
			"ffn_up_shexp.weight": dims(H, cfg.SharedInter), "ffn_down_shexp.weight": dims(cfg.SharedInter, H)}
		if cfg.LayerTypes[l] == full {
			w["attn_q.weight"], w["attn_k.weight"], w["attn_v.weight"] = dims(H, 2*q), dims(H, kv), dims(H, kv)
			w["attn_output.weight"], w["attn_q_norm.weight"], w["attn_k_norm.weight"] = dims(q, H), dims(cfg.HeadDim), dims(cfg.HeadDim)
		} else {
			w["attn_qkv.weight"], w["attn_gate.weight"], w["ssm_conv1d.weight"] = dims(H, conv), dims(H, nv*vd), dims(cfg.ConvKernel, conv)
			w["ssm_dt.bias"], w["ssm_a"], w["ssm_ba.weight"] = dims(nv), dims(nv), dims(H, 2*nv)
			w["ssm_norm.weight"], w["ssm_out.weight"] = dims(vd), dims(nv*vd, H)
		}
		for k, v := range w {
			want[fmt.Sprintf("blk.%d.%s", l, k)] = v
		}
	}
	f.tensors(want, "blk.1.ssm_conv1d.weight", "blk.1.ssm_a", "blk.1.ssm_dt.bias", "blk.1.ssm_ba.weight",
		"blk.1.ssm_norm.weight", "blk.1.attn_norm.weight", "blk.1.ffn_gate_inp.weight")
	if t.Failed() {
		return
	}

	// Values: rows of GGUF tensors against rows of the sources.
	plus1 := func(v float32) float32 { return 1 + v }
	f.same("blk.1.attn_norm.weight", "layers.1.input_layernorm.weight", plus1)
	f.same("blk.1.post_attention_norm.weight", "layers.1.post_attention_layernorm.weight", plus1)
	f.same("blk.3.attn_q_norm.weight", "layers.3.self_attn.q_norm.weight", plus1)
	f.same("blk.3.attn_k_norm.weight", "layers.3.self_attn.k_norm.weight", plus1)
	f.same("output_norm.weight", "norm.weight", plus1)
	f.same("blk.1.ssm_norm.weight", "layers.1.linear_attn.norm.weight", nil)
	f.same("blk.1.ssm_a", "layers.1.linear_attn.A_log", func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	for gn, sn := range map[string]string{"ssm_dt.bias": "linear_attn.dt_bias", "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
		"ssm_conv1d.weight": "linear_attn.conv1d.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
		"ssm_out.weight": "linear_attn.out_proj.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
		"ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight", "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"} {
		f.same("blk.1."+gn, "layers.1."+sn, nil)
	}
	f.same("blk.3.attn_q.weight", "layers.3.self_attn.q_proj.weight", nil)
	f.same("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight", nil)
	f.same("token_embd.weight", "embed_tokens.weight", nil)
	f.same("output.weight", "lm_head.weight", nil)

	// ssm_ba read as the checkpoint's in_proj_ba.
	ck := q3nCheckpoint{t: map[string][]float32{"layers.1.linear_attn.in_proj_ba.weight": slices.Concat(f.rows("blk.1.ssm_ba.weight")...)}}
	for _, n := range []string{"layers.1.linear_attn.in_proj_b.weight", "layers.1.linear_attn.in_proj_a.weight"} {
		v, err := family.DenseOf(ck, &cfg, format.Spec{Name: n, Shape: f.src[n].Shape})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, slices.Concat(f.source(n)...)) {
			t.Errorf("blk.1.ssm_ba read as in_proj_ba does not give %s", n)
		}
	}

	// Expert e of layer l is record l·E+e.
	f.experts("blk.2.ffn_gate_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Gate })
	f.experts("blk.2.ffn_up_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Up })
	f.experts("blk.2.ffn_down_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Down })
}
