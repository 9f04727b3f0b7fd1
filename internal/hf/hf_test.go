package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/safetensors"
	"github.com/sluicelm/sluice/internal/testutil/jsonfile"
)

// modelDir is ../shared/models/<name> beside the repository (testutil cannot
// be imported here: it imports the packer, which imports this package).
func modelDir(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "models", name)
	if _, err := os.Stat(filepath.Join(p, "config.json")); err != nil {
		t.Fatalf("shared model %s not found: %v", name, err)
	}
	return p
}

// baseConfig returns a fresh copy of a shared model's config.json.
func baseConfig(t testing.TB, model string) map[string]any {
	return jsonfile.Read(t, filepath.Join(modelDir(t, model), "config.json"))
}

// configDir writes config.json (and generation_config.json unless gen is nil)
// into a fresh directory.
func configDir(t testing.TB, cfg, gen map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	jsonfile.Write(t, filepath.Join(dir, "config.json"), cfg)
	if gen != nil {
		jsonfile.Write(t, filepath.Join(dir, "generation_config.json"), gen)
	}
	return dir
}

// nest moves every field but a few top-level ones under text_config, as the
// multimodal qwen3_5_moe checkpoints do.
func nest(cfg map[string]any) map[string]any {
	text := map[string]any{}
	for k, v := range cfg {
		text[k] = v
	}
	text["model_type"] = "qwen3_5_moe_text"
	return map[string]any{
		"architectures":       []any{"Qwen3_5MoeForConditionalGeneration"},
		"model_type":          "qwen3_5_moe",
		"text_config":         text,
		"tie_word_embeddings": false,
		"vision_config":       map[string]any{"depth": 2, "hidden_size": 64},
	}
}

func TestReadConfigShared(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  format.Config
	}{
		{"tiny-qwen3-5-moe", format.Config{
			Family: family.NameQwen35MoE, Hidden: 256, Layers: 6, Vocab: 4096, Heads: 4, KVHeads: 2, HeadDim: 64,
			RotaryDim: 16, RopeTheta: 10000, RMSEps: 1e-6, MaxPos: 4096,
			LayerTypes: []string{"linear_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"},
			Experts:    64, TopK: 4, MoEInter: 64, SharedInter: 64, NormTopK: true,
			LinearKeyHeads: 2, LinearValueHeads: 4, LinearKeyDim: 64, LinearValueDim: 64, ConvKernel: 4,
			MTPLayers: 1, EOS: []int{4093, 4095},
		}},
		{"tiny-qwen3-moe", format.Config{
			Family: family.NameQwen3MoE, Hidden: 256, Layers: 6, Vocab: 4096, Heads: 4, KVHeads: 2, HeadDim: 64,
			RotaryDim: 64, RopeTheta: 10000, RMSEps: 1e-6, MaxPos: 4096,
			LayerTypes: []string{"full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"},
			Experts:    64, TopK: 4, MoEInter: 64, NormTopK: true,
			EOS: []int{4093, 4095},
		}},
	} {
		t.Run(tc.model, func(t *testing.T) {
			got, tie, err := ReadConfig(modelDir(t, tc.model))
			if err != nil {
				t.Fatal(err)
			}
			if tie {
				t.Error("tie_word_embeddings reported true, config says false")
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ReadConfig:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReadConfigNestedEqualsFlat(t *testing.T) {
	flat, _, err := ReadConfig(modelDir(t, "tiny-qwen3-5-moe"))
	if err != nil {
		t.Fatal(err)
	}
	gen := jsonfile.Read(t, filepath.Join(modelDir(t, "tiny-qwen3-5-moe"), "generation_config.json"))
	nested, tie, err := ReadConfig(configDir(t, nest(baseConfig(t, "tiny-qwen3-5-moe")), gen))
	if err != nil {
		t.Fatal(err)
	}
	if tie {
		t.Error("nested config: tie reported true")
	}
	if !reflect.DeepEqual(flat, nested) {
		t.Errorf("nested config differs:\n flat   %+v\n nested %+v", flat, nested)
	}

	// Only the top level names the model type; the text config has none.
	cfg := nest(baseConfig(t, "tiny-qwen3-5-moe"))
	delete(cfg["text_config"].(map[string]any), "model_type")
	c, _, err := ReadConfig(configDir(t, cfg, gen))
	if err != nil || c.Family != family.NameQwen35MoE {
		t.Errorf("text_config without model_type: family %q, err %v", c.Family, err)
	}

	// tie_word_embeddings at the top level only still ties.
	cfg = nest(baseConfig(t, "tiny-qwen3-5-moe"))
	cfg["tie_word_embeddings"] = true
	if _, tie, err := ReadConfig(configDir(t, cfg, gen)); err != nil || !tie {
		t.Errorf("top-level tie_word_embeddings: tie %v, err %v", tie, err)
	}
}

func TestReadConfigNumExpertsAlias(t *testing.T) {
	want, _, err := ReadConfig(modelDir(t, "tiny-qwen3-moe"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, "tiny-qwen3-moe")
	cfg["num_experts"] = cfg["num_local_experts"]
	delete(cfg, "num_local_experts")
	got, _, err := ReadConfig(configDir(t, cfg, jsonfile.Read(t, filepath.Join(modelDir(t, "tiny-qwen3-moe"), "generation_config.json"))))
	if err != nil {
		t.Fatal(err)
	}
	if got.Experts != 64 || !reflect.DeepEqual(got, want) {
		t.Errorf("num_experts instead of num_local_experts:\n got %+v\nwant %+v", got, want)
	}
}

func TestReadConfigRope(t *testing.T) {
	// rope_theta and partial_rotary_factor at the top level, no rope_parameters.
	cfg := baseConfig(t, "tiny-qwen3-5-moe")
	delete(cfg, "rope_parameters")
	cfg["rope_theta"] = 5e6
	cfg["partial_rotary_factor"] = 0.5
	c, _, err := ReadConfig(configDir(t, cfg, nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 5e6 || c.RotaryDim != 32 {
		t.Errorf("top-level rope: theta %g rotary %d, want 5e6 32", c.RopeTheta, c.RotaryDim)
	}
	// rope_parameters override the top level.
	cfg["rope_parameters"] = map[string]any{"rope_theta": 1e6, "partial_rotary_factor": 0.25, "rope_type": "default"}
	if c, _, err = ReadConfig(configDir(t, cfg, nil)); err != nil || c.RopeTheta != 1e6 || c.RotaryDim != 16 {
		t.Errorf("rope_parameters: theta %g rotary %d err %v, want 1e6 16", c.RopeTheta, c.RotaryDim, err)
	}
	// Neither: defaults 10000 and the full head.
	q := baseConfig(t, "tiny-qwen3-moe")
	delete(q, "rope_parameters")
	if c, _, err = ReadConfig(configDir(t, q, nil)); err != nil || c.RopeTheta != 10000 || c.RotaryDim != 64 {
		t.Errorf("no rope fields: theta %g rotary %d err %v, want 10000 64", c.RopeTheta, c.RotaryDim, err)
	}
	// Legacy rope_scaling with type "default" is accepted.
	q["rope_scaling"] = map[string]any{"type": "default", "rope_theta": 2e4}
	if c, _, err = ReadConfig(configDir(t, q, nil)); err != nil || c.RopeTheta != 2e4 {
		t.Errorf("rope_scaling default: theta %g err %v", c.RopeTheta, err)
	}
}

func TestReadConfigLayerTypesFromInterval(t *testing.T) {
	want, _, err := ReadConfig(modelDir(t, "tiny-qwen3-5-moe"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, "tiny-qwen3-5-moe")
	delete(cfg, "layer_types") // full_attention_interval 3 gives the same list
	got, _, err := ReadConfig(configDir(t, cfg, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.LayerTypes, want.LayerTypes) {
		t.Errorf("layer types from interval %v, want %v", got.LayerTypes, want.LayerTypes)
	}
}

func TestEOS(t *testing.T) {
	cfg := baseConfig(t, "tiny-qwen3-5-moe")
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		gen  map[string]any
		want []int
	}{
		{"generation-list", cfg, map[string]any{"eos_token_id": []any{4093, 4095}}, []int{4093, 4095}},
		{"generation-scalar", cfg, map[string]any{"eos_token_id": 4094}, []int{4094}},
		{"generation-without-eos", cfg, map[string]any{"do_sample": false}, []int{4093}},
		{"no-generation-config", cfg, nil, []int{4093}},
		{"nested-top-level-eos", func() map[string]any {
			n := nest(baseConfig(t, "tiny-qwen3-5-moe"))
			delete(n["text_config"].(map[string]any), "eos_token_id")
			n["eos_token_id"] = []any{1, 2}
			return n
		}(), nil, []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := ReadConfig(configDir(t, tc.cfg, tc.gen))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.EOS, tc.want) {
				t.Errorf("EOS = %v, want %v", c.EOS, tc.want)
			}
		})
	}
}

// TestEOSOutsideVocab checks that an eos_token_id no token can reach is
// refused, naming the file it came from: generation would never stop on it.
func TestEOSOutsideVocab(t *testing.T) {
	cfg := baseConfig(t, "tiny-qwen3-5-moe")
	cfg["eos_token_id"] = 999999
	if _, _, err := ReadConfig(configDir(t, cfg, nil)); err == nil || !strings.Contains(err.Error(), "config.json: eos_token_id 999999 is outside the vocabulary") {
		t.Errorf("config.json eos 999999: err = %v", err)
	}
	cfg = baseConfig(t, "tiny-qwen3-5-moe")
	if _, _, err := ReadConfig(configDir(t, cfg, map[string]any{"eos_token_id": []any{1, 999999}})); err == nil || !strings.Contains(err.Error(), "generation_config.json: eos_token_id 999999 is outside the vocabulary") {
		t.Errorf("generation_config.json eos 999999: err = %v", err)
	}
}

func TestReadConfigErrors(t *testing.T) {
	type edit func(m map[string]any)
	set := func(k string, v any) edit { return func(m map[string]any) { m[k] = v } }
	for _, tc := range []struct {
		name  string
		model string
		edit  edit
		want  []string
	}{
		{"model-type-llama", "tiny-qwen3-5-moe", set("model_type", "llama"), []string{`"llama"`, "not supported"}},
		{"model-type-llama-qwen3", "tiny-qwen3-moe", set("model_type", "llama"), []string{`"llama"`}},
		{"model-type-missing", "tiny-qwen3-moe", func(m map[string]any) { delete(m, "model_type") }, []string{"model_type"}},
		{"rope-yarn", "tiny-qwen3-5-moe", set("rope_parameters", map[string]any{"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), []string{"yarn"}},
		{"rope-scaling-linear", "tiny-qwen3-moe", func(m map[string]any) {
			delete(m, "rope_parameters")
			m["rope_scaling"] = map[string]any{"type": "linear", "factor": 2.0}
		}, []string{"linear"}},
		{"attention-bias", "tiny-qwen3-moe", set("attention_bias", true), []string{"attention_bias"}},
		{"mlp-only-layers", "tiny-qwen3-moe", set("mlp_only_layers", []any{0, 3}), []string{"mlp_only_layers", "[0 3]"}},
		{"decoder-sparse-step", "tiny-qwen3-moe", set("decoder_sparse_step", 2), []string{"decoder_sparse_step"}},
		{"topk-gt-experts", "tiny-qwen3-moe", set("num_experts_per_tok", 65), []string{"num_experts_per_tok", "65", "64"}},
		{"topk-gt-experts-35", "tiny-qwen3-5-moe", set("num_experts_per_tok", 128), []string{"num_experts_per_tok", "128"}},
		{"hidden-act", "tiny-qwen3-moe", set("hidden_act", "gelu"), []string{"gelu"}},
		{"no-experts", "tiny-qwen3-moe", func(m map[string]any) { delete(m, "num_local_experts") }, []string{"num_experts"}},
		{"kv-heads", "tiny-qwen3-moe", set("num_key_value_heads", 3), []string{"num_key_value_heads"}},
		{"layer-types-length", "tiny-qwen3-5-moe", set("layer_types", []any{"full_attention"}), []string{"layer_types"}},
		{"layer-type-unknown", "tiny-qwen3-5-moe", set("layer_types", []any{"full_attention", "full_attention", "sliding_attention", "full_attention", "full_attention", "full_attention"}), []string{"sliding_attention"}},
		{"linear-attention-in-qwen3", "tiny-qwen3-moe", set("layer_types", []any{"linear_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"}), []string{"linear_attention"}},
		{"mtp-2", "tiny-qwen3-5-moe", set("mtp_num_hidden_layers", 2), []string{"mtp_num_hidden_layers"}},
		{"linear-heads", "tiny-qwen3-5-moe", set("linear_num_value_heads", 3), []string{"linear_num_value_heads"}},
		{"rope-theta-0", "tiny-qwen3-moe", set("rope_parameters", map[string]any{"rope_theta": 0, "rope_type": "default"}), []string{"rope_theta = 0", "> 0"}},
		{"rope-theta-negative", "tiny-qwen3-moe", func(m map[string]any) {
			delete(m, "rope_parameters")
			m["rope_theta"] = -5
		}, []string{"rope_theta = -5"}},
		{"rope-theta-negative-35", "tiny-qwen3-5-moe", set("rope_parameters", map[string]any{"rope_theta": -1, "rope_type": "default"}), []string{"rope_theta = -1"}},
		{"rope-theta-0-gpt-oss", "tiny-gpt-oss", func(m map[string]any) { m["rope_parameters"].(map[string]any)["rope_theta"] = 0 }, []string{"rope_theta"}},
		{"rope-theta-0-deepseek", "tiny-deepseek-v32", set("rope_parameters", map[string]any{"rope_theta": 0, "rope_type": "default"}), []string{"rope_theta = 0"}},
		{"rms-eps-negative", "tiny-qwen3-moe", set("rms_norm_eps", -1), []string{"rms_norm_eps = -1"}},
		{"rms-eps-negative-gpt-oss", "tiny-gpt-oss", set("rms_norm_eps", -1e-5), []string{"rms_norm_eps = -1e-05"}},
		{"rotary-odd", "tiny-qwen3-5-moe", set("rope_parameters", map[string]any{"partial_rotary_factor": 0.3, "rope_type": "default"}), []string{"rotary"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t, tc.model)
			tc.edit(cfg)
			dir := configDir(t, cfg, nil)
			_, _, err := ReadConfig(dir)
			if err == nil {
				t.Fatal("ReadConfig succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	t.Run("nested-llama", func(t *testing.T) {
		cfg := nest(baseConfig(t, "tiny-qwen3-5-moe"))
		cfg["text_config"].(map[string]any)["model_type"] = "llama"
		if _, _, err := ReadConfig(configDir(t, cfg, nil)); err == nil || !strings.Contains(err.Error(), "llama") {
			t.Errorf("nested model_type llama: err = %v", err)
		}
	})
	t.Run("nested-yarn", func(t *testing.T) {
		cfg := nest(baseConfig(t, "tiny-qwen3-5-moe"))
		cfg["text_config"].(map[string]any)["rope_parameters"] = map[string]any{"rope_type": "yarn"}
		if _, _, err := ReadConfig(configDir(t, cfg, nil)); err == nil || !strings.Contains(err.Error(), "yarn") {
			t.Errorf("nested yarn: err = %v", err)
		}
	})
	t.Run("no-config", func(t *testing.T) {
		if _, _, err := ReadConfig(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("missing config.json: err = %v", err)
		}
	})
	t.Run("bad-json", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o644)
		if _, _, err := ReadConfig(dir); err == nil || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("bad config.json: err = %v", err)
		}
	})
	t.Run("bad-generation-config", func(t *testing.T) {
		dir := configDir(t, baseConfig(t, "tiny-qwen3-moe"), nil)
		os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte("[}"), 0o644)
		if _, _, err := ReadConfig(dir); err == nil || !strings.Contains(err.Error(), "generation_config.json") {
			t.Errorf("bad generation_config.json: err = %v", err)
		}
	})
	t.Run("open-propagates", func(t *testing.T) {
		cfg := baseConfig(t, "tiny-qwen3-moe")
		cfg["model_type"] = "llama"
		if _, err := Open(configDir(t, cfg, nil)); err == nil || !strings.Contains(err.Error(), "llama") {
			t.Errorf("Open with model_type llama: err = %v", err)
		}
	})
}

func TestIsCheckpoint(t *testing.T) {
	if !IsCheckpoint(modelDir(t, "tiny-qwen3-moe")) {
		t.Error("shared model not recognised")
	}
	if IsCheckpoint(t.TempDir()) {
		t.Error("empty dir recognised as a checkpoint")
	}
}

// TestOpenShared checks the canonical names of the shared checkpoint: no
// "model." prefix, the MTP layer renamed layers.<num_hidden_layers>, and every
// tensor the packer asks for present with its shape.
func TestOpenShared(t *testing.T) {
	c, err := Open(modelDir(t, "tiny-qwen3-5-moe"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Config.MTPLayers != 1 || c.Config.ExpertLayers() != 7 {
		t.Fatalf("MTPLayers %d ExpertLayers %d, want 1 7", c.Config.MTPLayers, c.Config.ExpertLayers())
	}
	for n := range c.byName {
		if strings.HasPrefix(n, "model.") || strings.HasPrefix(n, "mtp.layers.") {
			t.Errorf("non-canonical name %s", n)
		}
	}
	for _, n := range []string{"embed_tokens.weight", "lm_head.weight", "norm.weight", "mtp.fc.weight",
		"layers.6.self_attn.q_proj.weight", "layers.6.mlp.experts.gate_up_proj", "layers.0.mlp.experts.63.down_proj.weight"} {
		if _, ok := c.byName[n]; !ok {
			t.Errorf("canonical tensor %s missing", n)
		}
	}
	specs, err := family.Specs(&c.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		v, err := c.Float32(s.Name, s.Shape)
		if err != nil {
			t.Fatal(err)
		}
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		if len(v) != n {
			t.Fatalf("%s: %d values, want %d", s.Name, len(v), n)
		}
	}
	I, H := c.Config.MoEInter, c.Config.Hidden
	for l := 0; l < c.Config.ExpertLayers(); l++ {
		for _, e := range []int{0, 17, 63} {
			g, u, d, err := c.Expert(l, e)
			if err != nil {
				t.Fatalf("Expert(%d, %d): %v", l, e, err)
			}
			if len(g) != I*H || len(u) != I*H || len(d) != H*I {
				t.Fatalf("Expert(%d, %d): sizes %d %d %d", l, e, len(g), len(u), len(d))
			}
		}
	}
	if _, err := c.Float32("layers.0.self_attn.nope", []int{1}); err == nil || !strings.Contains(err.Error(), "layers.0.self_attn.nope") {
		t.Errorf("missing tensor: err = %v", err)
	}
	if _, err := c.Float32("norm.weight", []int{128}); err == nil || !strings.Contains(err.Error(), "[256]") || !strings.Contains(err.Error(), "[128]") {
		t.Errorf("wrong shape: err = %v", err)
	}
}

func bf16At(t *safetensors.Tensor, i int) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
}

// TestExpertFusedMTP reads the fused MTP experts straight from the raw bytes:
// gate is rows [0, I) of gate_up_proj[e], up rows [I, 2I), down down_proj[e].
func TestExpertFusedMTP(t *testing.T) {
	c, err := Open(modelDir(t, "tiny-qwen3-5-moe"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	E, I, H := c.Config.Experts, c.Config.MoEInter, c.Config.Hidden
	gu := c.ck.Tensors["mtp.layers.0.mlp.experts.gate_up_proj"]
	dn := c.ck.Tensors["mtp.layers.0.mlp.experts.down_proj"]
	if gu == nil || dn == nil || gu.DType != "BF16" {
		t.Fatal("shared model lacks the fused bf16 MTP experts")
	}
	for _, e := range []int{0, 1, 38, E - 1} {
		g, u, d, err := c.Expert(c.Config.Layers, e)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < I*H; i++ {
			if want := bf16At(gu, e*2*I*H+i); g[i] != want {
				t.Fatalf("expert %d gate[%d] = %g, want %g", e, i, g[i], want)
			}
			if want := bf16At(gu, e*2*I*H+I*H+i); u[i] != want {
				t.Fatalf("expert %d up[%d] = %g, want %g", e, i, u[i], want)
			}
			if want := bf16At(dn, e*H*I+i); d[i] != want {
				t.Fatalf("expert %d down[%d] = %g, want %g", e, i, d[i], want)
			}
		}
	}
}

// TestExpertFusedEqualsPerExpert fuses the per-expert trunk tensors of one
// layer in memory and checks Expert returns the same matrices either way.
func TestExpertFusedEqualsPerExpert(t *testing.T) {
	c, err := Open(modelDir(t, "tiny-qwen3-5-moe"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	E, I, H := c.Config.Experts, c.Config.MoEInter, c.Config.Hidden
	const l = 4
	var gu, dn []byte
	for e := 0; e < E; e++ {
		p := fmt.Sprintf("layers.%d.mlp.experts.%d.", l, e)
		gu = append(gu, c.byName[p+"gate_proj.weight"].Data...)
		gu = append(gu, c.byName[p+"up_proj.weight"].Data...)
	}
	for e := 0; e < E; e++ {
		dn = append(dn, c.byName[fmt.Sprintf("layers.%d.mlp.experts.%d.down_proj.weight", l, e)].Data...)
	}
	fused := &Checkpoint{Dir: c.Dir, Config: c.Config, byName: map[string]*safetensors.Tensor{
		fmt.Sprintf("layers.%d.mlp.experts.gate_up_proj", l): {Name: "gate_up_proj", DType: "BF16", Shape: []int{E, 2 * I, H}, Data: gu},
		fmt.Sprintf("layers.%d.mlp.experts.down_proj", l):    {Name: "down_proj", DType: "BF16", Shape: []int{E, H, I}, Data: dn},
	}}
	for e := 0; e < E; e++ {
		g0, u0, d0, err := c.Expert(l, e)
		if err != nil {
			t.Fatal(err)
		}
		g1, u1, d1, err := fused.Expert(l, e)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(g0, g1) || !slices.Equal(u0, u1) || !slices.Equal(d0, d1) {
			t.Fatalf("layer %d expert %d: fused and per-expert matrices differ", l, e)
		}
	}

	// Wrong fused shapes and a missing down_proj are reported by name.
	bad := func(mut func(m map[string]*safetensors.Tensor), want ...string) {
		t.Helper()
		m := map[string]*safetensors.Tensor{}
		for k, v := range fused.byName {
			cp := *v
			m[k] = &cp
		}
		mut(m)
		f := &Checkpoint{Dir: c.Dir, Config: c.Config, byName: m}
		_, _, _, err := f.Expert(l, 0)
		if err == nil {
			t.Fatalf("Expert on a malformed fused layer succeeded, want error mentioning %v", want)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
	}
	gk, dk := fmt.Sprintf("layers.%d.mlp.experts.gate_up_proj", l), fmt.Sprintf("layers.%d.mlp.experts.down_proj", l)
	bad(func(m map[string]*safetensors.Tensor) { m[gk].Shape = []int{E, I, 2 * H} }, gk, "[64 64 512]", "[64 128 256]")
	bad(func(m map[string]*safetensors.Tensor) { m[dk].Shape = []int{E, I, H} }, dk, "[64 64 256]", "[64 256 64]")
	bad(func(m map[string]*safetensors.Tensor) { delete(m, dk) }, dk, "missing")
	// Per-expert: a missing projection is named.
	pe := map[string]*safetensors.Tensor{}
	for k, v := range c.byName {
		pe[k] = v
	}
	delete(pe, "layers.1.mlp.experts.7.up_proj.weight")
	if _, _, _, err := (&Checkpoint{Dir: c.Dir, Config: c.Config, byName: pe}).Expert(1, 7); err == nil || !strings.Contains(err.Error(), "layers.1.mlp.experts.7.up_proj.weight") {
		t.Errorf("missing per-expert up_proj: err = %v", err)
	}
}

type rawTensor struct {
	DType string
	Shape []int
	Data  []byte
}

// writeSafetensors writes a single safetensors file from name → tensor.
func writeSafetensors(t testing.TB, path string, ts map[string]rawTensor) {
	t.Helper()
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	hdr := map[string]any{}
	var size int64
	for _, n := range names {
		hdr[n] = map[string]any{"dtype": ts[n].DType, "shape": ts[n].Shape, "data_offsets": []int64{size, size + int64(len(ts[n].Data))}}
		size += int64(len(ts[n].Data))
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	if _, err := f.Write(append(w, hb...)); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := f.Write(ts[n].Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenTiedAndVision rewrites tiny-qwen3-moe with tied embeddings (no
// lm_head), a "model.language_model." prefix and vision-tower tensors that
// must be ignored.
func TestOpenTiedAndVision(t *testing.T) {
	src := modelDir(t, "tiny-qwen3-moe")
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ts := map[string]rawTensor{}
	for n, tn := range ck.Tensors {
		if n == "lm_head.weight" {
			continue
		}
		ts["model.language_model."+strings.TrimPrefix(n, "model.")] = rawTensor{tn.DType, tn.Shape, tn.Data}
	}
	ts["model.visual.blocks.0.attn.qkv.weight"] = rawTensor{"BF16", []int{2, 2}, make([]byte, 8)}
	ts["visual.merger.weight"] = rawTensor{"BF16", []int{2}, make([]byte, 4)}
	dir := t.TempDir()
	writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
	cfg := baseConfig(t, "tiny-qwen3-moe")
	cfg["tie_word_embeddings"] = true
	jsonfile.Write(t, filepath.Join(dir, "config.json"), cfg)

	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for n := range c.byName {
		if strings.Contains(n, "visual") || strings.HasPrefix(n, "model.") {
			t.Errorf("unexpected canonical name %s", n)
		}
	}
	emb, err := c.Float32("embed_tokens.weight", []int{4096, 256})
	if err != nil {
		t.Fatal(err)
	}
	head, err := c.Float32("lm_head.weight", []int{4096, 256})
	if err != nil {
		t.Fatalf("tied lm_head: %v", err)
	}
	if !slices.Equal(emb, head) {
		t.Error("tied lm_head differs from embed_tokens")
	}
	orig, err := ck.Tensors["model.embed_tokens.weight"].Float32()
	if err != nil || !slices.Equal(orig, emb) {
		t.Errorf("embed_tokens after renaming differs from the original (err %v)", err)
	}
	specs, err := family.Specs(&c.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if _, err := c.Float32(s.Name, s.Shape); err != nil {
			t.Fatal(err)
		}
	}
}
