package family_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
)

// TestGLM4MoEConfig: the tiny GLM-4.5 config normalises as transformers
// reads it (rotary dim int(64·0.5), eps 1e-5, shared expert of
// moe_intermediate_size), and its blocks carry the config's options: q/k/v
// biases without an o bias, no q/k norms, a dense first layer, DeepSeek's
// router.
func TestGLM4MoEConfig(t *testing.T) {
	c, _ := parseDir(t, "tiny-glm4-moe")
	if c.Family != family.NameGLM4MoE || c.Hidden != 256 || c.Layers != 6 || c.Heads != 4 || c.KVHeads != 2 || c.HeadDim != 64 ||
		c.RotaryDim != 32 || c.RopeTheta != 10000 || c.RMSEps != 1e-5 || c.Experts != 32 || c.TopK != 4 || c.MoEInter != 64 ||
		c.SharedInter != 64 || !c.NormTopK || c.FirstDense != 1 || c.MTPLayers != 1 || c.Validate() != nil {
		t.Fatalf("config %+v (%v)", c, c.Validate())
	}
	f, _ := family.Named(family.NameGLM4MoE)
	a, err := f.Build(&c, block.Specs())
	if err != nil {
		t.Fatal(err)
	}
	if mlp, ok := a.Layers[0].FFN.(*block.MLP); !ok || mlp.Inter != 512 {
		t.Errorf("layer 0 FFN %T %+v, want a dense MLP of 512", a.Layers[0].FFN, a.Layers[0].FFN)
	}
	for l := 1; l < c.Layers; l++ {
		m := a.Layers[l].MoE()
		if m == nil || m.Score != block.SigmoidGroups || m.Groups != 1 || m.TopGroups != 1 || m.Scale != 2.5 || !m.NormTopK ||
			m.Shared == nil || m.Shared.Inter != 64 || m.SharedGate.Present() || m.Pre != &a.Layers[l].Post {
			t.Errorf("layer %d MoE %+v", l, m)
		}
	}
	at := a.Layers[1].Mixer.(*block.Attn)
	if at.QNorm != nil || at.KNorm != nil || at.Gate || at.Window != 0 || at.Rope.Dim != 32 {
		t.Errorf("attention %+v", at)
	}
	if want := float32(1 / math.Sqrt(64)); at.Scale != want {
		t.Errorf("scale %v, want %v", at.Scale, want)
	}
	if a.MTP == nil || a.MTPState.Kind != block.KV || a.MTPState.KVWidth != 128 || a.MTP.Layer.MoE() == nil {
		t.Errorf("MTP %+v, state %+v", a.MTP, a.MTPState)
	}
	specs, err := family.Specs(&c)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range specs {
		names[s.Name] = true
	}
	for _, n := range []string{"layers.1.self_attn.q_proj.bias", "layers.1.self_attn.k_proj.bias", "layers.1.self_attn.v_proj.bias",
		"layers.6.eh_proj.weight", "layers.6.shared_head.norm.weight"} {
		if !names[n] {
			t.Errorf("%s not declared", n)
		}
	}
	for _, n := range []string{"layers.1.self_attn.o_proj.bias", "layers.1.self_attn.q_norm.weight", "layers.0.mlp.gate.weight"} {
		if names[n] {
			t.Errorf("%s declared", n)
		}
	}
}

// TestGLM4MoEVariants: the options the released checkpoints use beyond the
// tiny model's: use_qk_norm declares per-head norms over head_dim,
// attention_bias false drops the biases, num_nextn_predict_layers 0 drops
// the MTP layer, the pre-5 config keys (top-level rope_theta and
// partial_rotary_factor, rope_scaling null) read as rope_parameters do.
func TestGLM4MoEVariants(t *testing.T) {
	_, raw := parseDir(t, "tiny-glm4-moe")
	f, _ := family.Named(family.NameGLM4MoE)
	var m map[string]any
	json.Unmarshal(raw, &m)
	m["use_qk_norm"] = true
	m["attention_bias"] = false
	m["num_nextn_predict_layers"] = 0
	delete(m, "rope_parameters")
	m["rope_scaling"] = nil
	m["rope_theta"] = 1e6
	m["first_k_dense_replace"] = 3
	b, _ := json.Marshal(m)
	c, err := f.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 1e6 || c.RotaryDim != 32 || c.MTPLayers != 0 || c.FirstDense != 3 {
		t.Fatalf("config %+v", c)
	}
	a, err := f.Build(&c, block.Specs())
	if err != nil {
		t.Fatal(err)
	}
	at := a.Layers[3].Mixer.(*block.Attn)
	if at.QNorm == nil || at.KNorm == nil || at.QNorm.Eps != 1e-5 || at.QNorm.ZeroCentred || at.QB != nil || a.MTP != nil {
		t.Errorf("attention %+v, MTP %v", at, a.MTP != nil)
	}
	if a.Layers[2].MoE() != nil || a.Layers[3].MoE() == nil {
		t.Error("first_k_dense_replace 3: layers 0-2 dense, 3 on MoE")
	}
	specs, _ := family.Specs(&c)
	var qn, bias int
	for _, s := range specs {
		if strings.HasSuffix(s.Name, "self_attn.q_norm.weight") && len(s.Shape) == 1 && s.Shape[0] == 64 {
			qn++
		}
		if strings.HasSuffix(s.Name, "_proj.bias") {
			bias++
		}
	}
	if qn != c.Layers || bias != 0 {
		t.Errorf("%d q_norm weights of [64], %d biases; want %d and 0", qn, bias, c.Layers)
	}
}

// TestGLM4MoERefusals: what glm4_moe does not implement is refused with an
// error naming the field.
func TestGLM4MoERefusals(t *testing.T) {
	_, raw := parseDir(t, "tiny-glm4-moe")
	f, _ := family.Named(family.NameGLM4MoE)
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"unknown key", func(m map[string]any) { m["frobnicate"] = 1 }, "frobnicate"},
		{"mlp layer types", func(m map[string]any) { m["mlp_layer_types"] = []any{"dense"} }, "mlp_layer_types"},
		{"quantization", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "compressed-tensors"}
		}, "quantization_config"},
		{"activation", func(m map[string]any) { m["hidden_act"] = "gelu" }, "hidden_act"},
		{"no head_dim", func(m map[string]any) { delete(m, "head_dim") }, "head_dim"},
		{"two mtp modules", func(m map[string]any) { m["num_nextn_predict_layers"] = 2 }, "num_nextn_predict_layers = 2"},
		{"rope type", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
		}, "rope_type"},
		{"rope scaling", func(m map[string]any) { m["rope_scaling"] = map[string]any{"type": "linear", "factor": 2.0} }, "rope_scaling.type"},
		{"rope key", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}
		}, "factor"},
		{"partial disagrees", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
		}, "partial_rotary_factor"},
		{"odd rotary dim", func(m map[string]any) {
			m["partial_rotary_factor"] = 0.5
			m["head_dim"] = 6
		}, "partial_rotary_factor"},
		{"groups", func(m map[string]any) { m["topk_group"] = 2 }, "topk_group"},
		{"groups too few experts", func(m map[string]any) {
			m["n_group"] = 16 // two experts a group, one group kept: 2 < top-4
			m["topk_group"] = 1
		}, "num_experts_per_tok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			json.Unmarshal(raw, &m)
			tc.edit(m)
			b, _ := json.Marshal(m)
			if _, err := f.Parse(b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}
