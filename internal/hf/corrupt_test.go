package hf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCorruptConfig: a broken config.json is an error naming config.json
// and the key at fault, before the family allocates from its numbers.
func TestCorruptConfig(t *testing.T) {
	type edit func(m map[string]any)
	set := func(k string, v any) edit { return func(m map[string]any) { m[k] = v } }
	del := func(k string) edit { return func(m map[string]any) { delete(m, k) } }
	for _, tc := range []struct {
		name, model string
		edit        edit
		want        []string
	}{
		{"missing-hidden", "tiny-qwen3-moe", del("hidden_size"), []string{"hidden_size"}},
		{"missing-layers", "tiny-gpt-oss", del("num_hidden_layers"), []string{"num_hidden_layers"}},
		{"missing-vocab", "tiny-deepseek-v32", del("vocab_size"), []string{"vocab_size"}},
		{"zero-hidden", "tiny-qwen3-moe", set("hidden_size", 0), []string{"hidden_size", "0"}},
		{"negative-hidden", "tiny-qwen3-5-moe", set("hidden_size", -256), []string{"hidden_size", "-256"}},
		{"zero-layers", "tiny-qwen3-moe", set("num_hidden_layers", 0), []string{"num_hidden_layers"}},
		{"negative-layers", "tiny-deepseek-v32", set("num_hidden_layers", -6), []string{"num_hidden_layers", "-6"}},
		// The family built one layer type per layer before Validate ran.
		{"huge-layers", "tiny-qwen3-moe", set("num_hidden_layers", 1e12), []string{"num_hidden_layers", "1000000000000"}},
		{"zero-heads", "tiny-qwen3-moe", set("num_attention_heads", 0), []string{"num_attention_heads"}},
		{"negative-heads", "tiny-gpt-oss", set("num_attention_heads", -4), []string{"num_attention_heads", "-4"}},
		{"zero-experts", "tiny-qwen3-moe", set("num_experts", 0), []string{"num_experts"}},
		{"negative-experts", "tiny-gpt-oss", set("num_local_experts", -64), []string{"num_local_experts", "-64"}},
		{"negative-routed-experts", "tiny-deepseek-v32", set("n_routed_experts", -64), []string{"n_routed_experts"}},
		{"zero-topk", "tiny-qwen3-5-moe", set("num_experts_per_tok", 0), []string{"num_experts_per_tok"}},
		{"negative-topk", "tiny-qwen3-moe", set("num_experts_per_tok", -1), []string{"num_experts_per_tok", "-1"}},
		{"topk-above-experts", "tiny-gpt-oss", set("num_experts_per_tok", 65), []string{"num_experts_per_tok", "65", "64"}},
		{"topk-above-experts-ds", "tiny-deepseek-v32", set("num_experts_per_tok", 65), []string{"num_experts_per_tok", "65"}},
		{"zero-moe-inter", "tiny-qwen3-moe", set("moe_intermediate_size", 0), []string{"moe_intermediate_size"}},
		{"negative-moe-inter", "tiny-deepseek-v32", set("moe_intermediate_size", -64), []string{"moe_intermediate_size", "-64"}},
		// gpt-oss's expert size is intermediate_size.
		{"negative-inter", "tiny-gpt-oss", set("intermediate_size", -64), []string{"intermediate_size", "-64"}},
		{"zero-inter-ds", "tiny-deepseek-v32", set("intermediate_size", 0), []string{"intermediate_size"}},
		{"negative-shared-inter", "tiny-qwen3-5-moe", set("shared_expert_intermediate_size", -1), []string{"shared_expert_intermediate_size"}},
		{"zero-vocab", "tiny-qwen3-moe", set("vocab_size", 0), []string{"vocab_size"}},
		{"negative-vocab", "tiny-qwen3-5-moe", set("vocab_size", -4096), []string{"vocab_size", "-4096"}},
		{"huge-vocab", "tiny-qwen3-moe", set("vocab_size", 1e15), []string{"vocab_size"}},
		{"negative-head-dim", "tiny-qwen3-moe", set("head_dim", -64), []string{"head_dim", "-64"}},
		// hidden_size / num_attention_heads truncated: 256/3 gave 85.
		{"hidden-not-divisible", "tiny-qwen3-moe", func(m map[string]any) {
			delete(m, "head_dim")
			delete(m, "num_key_value_heads")
			m["num_attention_heads"] = 3
		}, []string{"hidden_size 256", "num_attention_heads 3", "head_dim"}},
		// 256/6 = 42, even: Validate passed and the model had 252-wide heads.
		{"hidden-not-divisible-even", "tiny-qwen3-moe", func(m map[string]any) {
			delete(m, "head_dim")
			delete(m, "num_key_value_heads")
			m["num_attention_heads"] = 6
		}, []string{"hidden_size 256", "num_attention_heads 6"}},
		{"hidden-not-divisible-null-head-dim", "tiny-gpt-oss", func(m map[string]any) {
			m["head_dim"] = nil
			m["num_key_value_heads"] = 3
			m["num_attention_heads"] = 3
		}, []string{"hidden_size 256", "num_attention_heads 3"}},
		{"unknown-model-type", "tiny-qwen3-moe", set("model_type", "mixtral"), []string{"config.json", `"mixtral"`, "not supported"}},
		{"model-type-missing", "tiny-gpt-oss", del("model_type"), []string{"config.json", "no model_type", "GptOssForCausalLM"}},
		{"model-type-number", "tiny-qwen3-moe", set("model_type", 3), []string{"config.json", "model_type"}},
		{"architectures-string", "tiny-qwen3-moe", set("architectures", "Qwen3MoeForCausalLM"), []string{"config.json", "architectures"}},
		// Wrong JSON types.
		{"hidden-string", "tiny-qwen3-moe", set("hidden_size", "256"), []string{"config.json", "hidden_size", `"256"`}},
		{"layers-string", "tiny-deepseek-v32", set("num_hidden_layers", "6"), []string{"num_hidden_layers"}},
		{"experts-bool", "tiny-gpt-oss", set("num_local_experts", true), []string{"num_local_experts"}},
		{"hidden-fraction", "tiny-qwen3-5-moe", set("hidden_size", 256.5), []string{"hidden_size", "256.5"}},
		{"topk-array", "tiny-qwen3-moe", set("num_experts_per_tok", []any{4}), []string{"num_experts_per_tok"}},
		// json.Unmarshal read null as absent: qwen3_next's default, or 0.
		{"hidden-null", "tiny-qwen3-moe", set("hidden_size", nil), []string{"hidden_size", "null"}},
		// A string or fractional eos_token_id was dropped or truncated.
		{"eos-string", "tiny-qwen3-moe", set("eos_token_id", "4093"), []string{"config.json", "eos_token_id"}},
		{"eos-fraction", "tiny-qwen3-moe", set("eos_token_id", 4093.5), []string{"eos_token_id"}},
		{"eos-negative-in-list", "tiny-qwen3-moe", set("eos_token_id", []any{4093, -1}), []string{"eos_token_id", "-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t, tc.model)
			tc.edit(cfg)
			_, _, err := ReadConfig(configDir(t, cfg, nil))
			if err == nil {
				t.Fatal("ReadConfig succeeded, want an error")
			}
			for _, w := range append([]string{"config.json"}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestCorruptConfigFiles: config.json or its text_config that is not a
// JSON object, and a wrong generation_config.json eos_token_id.
func TestCorruptConfigFiles(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"empty", ""},
		{"truncated", `{"model_type": "qwen3_moe", "hidden_size": 2`},
		{"null", `null`},
		{"array", `[{"model_type": "qwen3_moe"}]`},
		{"string", `"qwen3_moe"`},
		{"text-config-array", `{"model_type": "qwen3_5_moe", "text_config": []}`},
		{"text-config-string", `{"model_type": "qwen3_5_moe", "text_config": "x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := ReadConfig(dir)
			if err == nil || !strings.Contains(err.Error(), "config.json") {
				t.Fatalf("err = %v, want one naming config.json", err)
			}
			if !strings.Contains(err.Error(), "JSON") && !strings.Contains(err.Error(), "json") {
				t.Errorf("error %q does not say the JSON is wrong", err)
			}
		})
	}
	t.Run("generation-eos-string", func(t *testing.T) {
		dir := configDir(t, baseConfig(t, "tiny-qwen3-moe"), map[string]any{"eos_token_id": "2"})
		_, _, err := ReadConfig(dir)
		if err == nil || !strings.Contains(err.Error(), "generation_config.json") || !strings.Contains(err.Error(), "eos_token_id") {
			t.Fatalf("err = %v, want one naming generation_config.json and eos_token_id", err)
		}
	})
}

// TestSharedConfigsStillRead: the stricter checks accept the shared
// checkpoints' configs, and a null head_dim (transformers' "derive it")
// where hidden_size divides.
func TestSharedConfigsStillRead(t *testing.T) {
	for _, m := range []string{"tiny-deepseek-v32", "tiny-gpt-oss", "tiny-qwen3-5-moe", "tiny-qwen3-moe"} {
		if _, _, err := ReadConfig(modelDir(t, m)); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	cfg := baseConfig(t, "tiny-qwen3-moe")
	cfg["head_dim"] = nil
	if c, _, err := ReadConfig(configDir(t, cfg, nil)); err != nil || c.HeadDim != c.Hidden/c.Heads {
		t.Errorf("null head_dim: %+v, %v", c, err)
	}
}
