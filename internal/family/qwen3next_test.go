package family_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// qwen3NextWith is tiny-qwen3-next's config.json with keys set (a nil
// value deletes the key).
func qwen3NextWith(t *testing.T, set map[string]any) []byte {
	t.Helper()
	_, raw := parseDir(t, "tiny-qwen3-next")
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, _ := json.Marshal(m)
	return b
}

func parseQwen3Next(t *testing.T, set map[string]any) (format.Config, error) {
	t.Helper()
	f, err := family.Lookup("qwen3_next")
	if err != nil {
		t.Fatal(err)
	}
	return f.Parse(qwen3NextWith(t, set))
}

// TestQwen3NextConfig: the test model's config, and transformers' defaults
// (Qwen3NextConfig) where a key is absent: a quarter of head_dim rotated,
// every fourth layer full attention, the router renormalised.
func TestQwen3NextConfig(t *testing.T) {
	c, _ := parseDir(t, "tiny-qwen3-next")
	if c.Family != family.NameQwen3Next || c.RotaryDim != 16 || !c.NormTopK || c.MTPLayers != 0 ||
		c.LinearKeyHeads != 2 || c.LinearValueHeads != 4 || c.SharedInter != 64 || c.Experts != 32 ||
		!slices.Equal(c.LayerTypes, []string{"linear_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"}) {
		t.Errorf("tiny-qwen3-next: %+v", c)
	}
	d, err := parseQwen3Next(t, map[string]any{"partial_rotary_factor": nil, "rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1e7},
		"layer_types": nil, "num_hidden_layers": 8, "norm_topk_prob": nil, "head_dim": nil})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"linear_attention", "linear_attention", "linear_attention", "full_attention"}
	if d.HeadDim != 256 || d.RotaryDim != 64 || d.RopeTheta != 1e7 || !d.NormTopK || !slices.Equal(d.LayerTypes, append(want, want...)) {
		t.Errorf("defaults: head_dim %d, rotary %d, theta %g, norm_topk %v, layer types %v", d.HeadDim, d.RotaryDim, d.RopeTheta, d.NormTopK, d.LayerTypes)
	}
	if d, err := parseQwen3Next(t, map[string]any{"norm_topk_prob": false}); err != nil || d.NormTopK {
		t.Errorf("norm_topk_prob false: %v, %v", d.NormTopK, err)
	}
	if d, err := parseQwen3Next(t, map[string]any{"num_nextn_predict_layers": 1}); err != nil || d.MTPLayers != 1 {
		t.Errorf("num_nextn_predict_layers 1: %d MTP layers, %v", d.MTPLayers, err)
	}
}

// TestQwen3NextRefusals: what Qwen3-Next's blocks here do not run is
// refused with the field named.
func TestQwen3NextRefusals(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"mlp_only_layers": []int{0}}, "mlp_only_layers"},
		{map[string]any{"decoder_sparse_step": 2}, "decoder_sparse_step"},
		{map[string]any{"attention_bias": true}, "attention_bias"},
		{map[string]any{"hidden_act": "gelu"}, "hidden_act"},
		{map[string]any{"rope_parameters": map[string]any{"rope_type": "yarn", "factor": 4.0}}, "yarn"},
		{map[string]any{"layer_types": []string{"linear_attention", "sliding_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"}}, "sliding_attention"},
		{map[string]any{"linear_num_value_heads": 3}, "linear_num_value_heads"},
		{map[string]any{"num_nextn_predict_layers": 2}, "mtp_num_hidden_layers"},
		{map[string]any{"num_nextn_predict_layers": 1, "mtp_num_hidden_layers": 2}, "num_nextn_predict_layers"},
	} {
		_, err := parseQwen3Next(t, tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.set, err, tc.want)
		}
	}
}
