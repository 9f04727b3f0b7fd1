package main

import (
	"fmt"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
)

// gptOSSTestConfig is a small gpt_oss config.json: sliding and full
// layers, YaRN.
const gptOSSTestConfig = `{"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 96,
	 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "num_local_experts": 4,
	 "num_experts_per_tok": 2, "sliding_window": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
	 "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 128,
	 "beta_fast": 32, "beta_slow": 1, "truncate": false}}`

// TestSynthGGUFGPTOSS writes a small gpt_oss model (sliding and full
// layers, YaRN, biases everywhere, sinks) as a gpt-oss GGUF and reads it
// back: the metadata llama.cpp's loader reads, exactly the tensors it
// creates with the dims it expects (derived here from the config), and
// every tensor's values from its source, the experts' biases included.
func TestSynthGGUFGPTOSS(t *testing.T) {
	fam, _ := family.Named(family.NameGPTOSS)
	cfg, err := fam.Parse([]byte(gptOSSTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := writeGGUF(t, cfg, nil)
	const a = "gpt-oss."
	u := func(v int) uint32 { return uint32(v) }
	H, hd, E, I := cfg.Hidden, cfg.HeadDim, cfg.Experts, cfg.MoEInter
	f.keys(map[string]any{
		"general.architecture": "gpt-oss", a + "block_count": u(2), a + "embedding_length": u(H),
		a + "feed_forward_length": u(I), a + "expert_feed_forward_length": u(I), a + "attention.head_count": u(4),
		a + "attention.head_count_kv": u(2), a + "attention.key_length": u(hd), a + "attention.value_length": u(hd),
		a + "rope.freq_base": float32(150000), a + "attention.layer_norm_rms_epsilon": float32(1e-5),
		a + "expert_count": u(E), a + "expert_used_count": u(2), a + "attention.sliding_window": u(8),
		a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": float32(32),
		a + "rope.scaling.original_context_length": u(128), a + "rope.scaling.yarn_beta_fast": float32(32),
		a + "rope.scaling.yarn_beta_slow": float32(1),
	})
	q, kv := cfg.Heads*hd, cfg.KVHeads*hd
	want := map[string][]uint64{"token_embd.weight": dims(H, 96), "output_norm.weight": dims(H), "output.weight": dims(H, 96)}
	for l := 0; l < cfg.Layers; l++ {
		for k, v := range map[string][]uint64{"attn_norm.weight": dims(H), "post_attention_norm.weight": dims(H),
			"attn_q.weight": dims(H, q), "attn_k.weight": dims(H, kv), "attn_v.weight": dims(H, kv), "attn_output.weight": dims(q, H),
			"attn_q.bias": dims(q), "attn_k.bias": dims(kv), "attn_v.bias": dims(kv), "attn_output.bias": dims(H),
			"attn_sinks.weight": dims(4), "ffn_gate_inp.weight": dims(H, E), "ffn_gate_inp.bias": dims(E),
			"ffn_gate_exps.weight": dims(H, I, E), "ffn_up_exps.weight": dims(H, I, E), "ffn_down_exps.weight": dims(I, H, E),
			"ffn_gate_exps.bias": dims(I, E), "ffn_up_exps.bias": dims(I, E), "ffn_down_exps.bias": dims(H, E)} {
			want[fmt.Sprintf("blk.%d.%s", l, k)] = v
		}
	}
	f.tensors(want, "blk.1.ffn_gate_inp.weight", "blk.1.attn_sinks.weight", "blk.1.ffn_up_exps.bias")
	if t.Failed() {
		return
	}
	// At 4 bits the experts are MXFP4, as the release's, in both files.
	if k := f.m.Stores[0].Kind; k != format.MXFP4 {
		t.Fatalf("synth's gpt-oss experts are %s, want mxfp4", k)
	}
	for _, n := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} {
		if tt := f.got["blk.0."+n+".weight"]; tt.Type != gguf.MXFP4 {
			t.Errorf("%s is %s, want MXFP4", n, tt.Type)
		}
	}
	f.keys(map[string]any{"general.file_type": uint32(38)})
	for _, n := range [][2]string{{"attn_norm.weight", "input_layernorm.weight"}, {"attn_k.weight", "self_attn.k_proj.weight"},
		{"attn_q.bias", "self_attn.q_proj.bias"}, {"attn_k.bias", "self_attn.k_proj.bias"}, {"attn_v.bias", "self_attn.v_proj.bias"},
		{"attn_output.bias", "self_attn.o_proj.bias"}, {"attn_output.weight", "self_attn.o_proj.weight"},
		{"attn_sinks.weight", "self_attn.sinks"}, {"post_attention_norm.weight", "post_attention_layernorm.weight"},
		{"ffn_gate_inp.weight", "mlp.router.weight"}, {"ffn_gate_inp.bias", "mlp.router.bias"}} {
		f.same("blk.1."+n[0], "layers.1."+n[1], nil)
	}
	f.same("token_embd.weight", "embed_tokens.weight", nil)
	for n, pick := range map[string]func(*format.ExpertStore) *format.Tensor{
		"ffn_gate_exps.weight": func(s *format.ExpertStore) *format.Tensor { return &s.Gate },
		"ffn_up_exps.weight":   func(s *format.ExpertStore) *format.Tensor { return &s.Up },
		"ffn_down_exps.weight": func(s *format.ExpertStore) *format.Tensor { return &s.Down },
		"ffn_gate_exps.bias":   func(s *format.ExpertStore) *format.Tensor { return s.GateBias },
		"ffn_up_exps.bias":     func(s *format.ExpertStore) *format.Tensor { return s.UpBias },
		"ffn_down_exps.bias":   func(s *format.ExpertStore) *format.Tensor { return s.DownBias },
	} {
		f.experts("blk.1."+n, 1, pick)
	}
}
