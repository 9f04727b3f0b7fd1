package family_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestFamilyList: every family is found by its name and model types, and
// an unknown model type is refused with the supported ones listed.
func TestFamilyList(t *testing.T) {
	for _, f := range family.All {
		if g, err := family.Named(f.Name); err != nil || g != f {
			t.Errorf("family.Named(%q) = %v, %v", f.Name, g, err)
		}
		for _, mt := range f.ModelTypes {
			if g, err := family.Lookup(mt); err != nil || g != f {
				t.Errorf("family.Lookup(%q) = %v, %v", mt, g, err)
			}
		}
	}
	_, err := family.Lookup("llama")
	if err == nil || !strings.Contains(err.Error(), `"llama"`) || !strings.Contains(err.Error(), "gpt_oss") {
		t.Errorf("family.Lookup(llama): %v", err)
	}
}

// parseDir parses a shared model's config.json with its family.
func parseDir(t *testing.T, name string) (format.Config, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testutil.ModelDir(t, name), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		ModelType string `json:"model_type"`
	}
	json.Unmarshal(raw, &top)
	f, err := family.Lookup(top.ModelType)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c, raw
}

// TestSpecsCoverCheckpoints: each family's tensor list names every dense
// tensor of its shared checkpoint once, with the checkpoint's shape, and
// the only tensors it leaves out are the routed experts.
func TestSpecsCoverCheckpoints(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			c, _ := parseDir(t, name)
			b, err := os.ReadFile(filepath.Join(testutil.ModelDir(t, name), "model.safetensors.index.json"))
			if err != nil {
				t.Fatal(err)
			}
			var idx struct {
				WeightMap map[string]string `json:"weight_map"`
			}
			if err := json.Unmarshal(b, &idx); err != nil {
				t.Fatal(err)
			}
			canon := map[string]bool{}
			for n := range idx.WeightMap {
				n = strings.TrimPrefix(strings.TrimPrefix(n, "model.language_model."), "model.")
				if strings.HasPrefix(n, "mtp.layers.0.") {
					n = fmt.Sprintf("layers.%d.", c.Layers) + strings.TrimPrefix(n, "mtp.layers.0.")
				}
				if p, ok := strings.CutSuffix(n, "self_attn.kv_b_proj.weight"); ok && c.Family == family.NameDeepSeek {
					// the packer splits kv_b_proj into W_k (transposed) and W_v
					canon[p+"self_attn.kv_b_proj.k_t.weight"], canon[p+"self_attn.kv_b_proj.v.weight"] = true, true
					continue
				}
				if c.Family == family.NameQwen3Next { // the packer splits the fused DeltaNet projections
					if p, ok := strings.CutSuffix(n, "in_proj_qkvz.weight"); ok {
						canon[p+"in_proj_qkv.weight"], canon[p+"in_proj_z.weight"] = true, true
						continue
					}
					if p, ok := strings.CutSuffix(n, "in_proj_ba.weight"); ok {
						canon[p+"in_proj_b.weight"], canon[p+"in_proj_a.weight"] = true, true
						continue
					}
				}
				canon[n] = true
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(canon)), func(n string) bool {
				return strings.HasPrefix(n, fmt.Sprintf("layers.%d.", c.Layers))
			}) {
				c.MTPLayers = 0 // declared but not shipped: hf.Open reads the checkpoint without it
			}
			specs, err := family.Specs(&c)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, s := range specs {
				if seen[s.Name] {
					t.Errorf("%s listed twice", s.Name)
				}
				seen[s.Name] = true
				if !canon[s.Name] {
					t.Errorf("%s is not in the checkpoint", s.Name)
				}
			}
			for n := range canon {
				if !seen[n] && !strings.Contains(n, "mlp.experts.") && !strings.HasPrefix(n, "visual.") {
					t.Errorf("checkpoint tensor %s is in no family list", n)
				}
			}
		})
	}
}

// TestGPTOSSConfig: the tiny gpt-oss config normalises as transformers
// reads it, and its rope is YaRN as _compute_yarn_parameters computes it
// (recomputed here in float64 from the formula).
func TestGPTOSSConfig(t *testing.T) {
	c, _ := parseDir(t, "tiny-gpt-oss")
	if c.Family != family.NameGPTOSS || c.Hidden != 256 || c.Layers != 6 || c.Heads != 4 || c.KVHeads != 2 || c.HeadDim != 64 ||
		c.Experts != 64 || c.TopK != 4 || c.MoEInter != 64 || c.SlidingWindow != 32 || !c.ExpertBias || c.RMSEps != 1e-5 ||
		!slices.Equal(c.LayerTypes, []string{"sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"}) {
		t.Fatalf("config %+v", c)
	}
	f, _ := family.Named(family.NameGPTOSS)
	a, err := f.Build(&c, block.Specs())
	if err != nil {
		t.Fatal(err)
	}
	// rope_theta 150000, factor 4, original 1024, beta 32/1, truncate false.
	const dim, base, factor, orig = 64.0, 150000.0, 4.0, 1024.0
	corr := func(rot float64) float64 { return dim * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(base)) }
	low, high := max(corr(32), 0), min(corr(1), dim-1)
	if math.Abs(float64(a.Rope.Scale)-(0.1*math.Log(factor)+1)) > 1e-6 {
		t.Errorf("attention factor %v, want 0.1·ln 4 + 1", a.Rope.Scale)
	}
	for i, got := range a.Rope.InvFreq {
		ext := math.Pow(base, -2*float64(i)/dim)
		ramp := min(max((float64(i)-low)/(high-low), 0), 1)
		want := ext/factor*ramp + ext*(1-ramp)
		if math.Abs(float64(got)-want) > 2e-6*want {
			t.Errorf("inv_freq[%d] = %v, want %v", i, got, want)
		}
	}
	if l := &a.Layers[0]; l.Mixer.(*block.Attn).Window != 32 || a.Layers[1].Mixer.(*block.Attn).Window != 0 {
		t.Error("sliding layers do not carry the window")
	}
	if a.States[0].Kind != block.Ring || a.States[1].Kind != block.KV {
		t.Errorf("states %+v", a.States[:2])
	}
}

// TestGPTOSSRefusals: keys and values gpt_oss does not implement are
// refused by name, never run approximately.
func TestGPTOSSRefusals(t *testing.T) {
	_, raw := parseDir(t, "tiny-gpt-oss")
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"unknown key", func(m map[string]any) { m["frobnicate"] = 1 }, "frobnicate"},
		{"fp8", func(m map[string]any) { m["quantization_config"] = map[string]any{"quant_method": "fp8"} }, "quantization_config"},
		{"mxfp4 option", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "mxfp4", "dequantize": true}
		}, "dequantize"},
		{"rope type", func(m map[string]any) { m["rope_parameters"].(map[string]any)["rope_type"] = "linear" }, "rope_type"},
		{"rope key", func(m map[string]any) { m["rope_parameters"].(map[string]any)["low_freq_factor"] = 1.0 }, "low_freq_factor"},
		{"truncate type", func(m map[string]any) { m["rope_parameters"].(map[string]any)["truncate"] = "no" }, "truncate"},
		{"factor mismatch", func(m map[string]any) { m["rope_parameters"].(map[string]any)["factor"] = 8.0 }, "factor"},
		{"no bias", func(m map[string]any) { m["attention_bias"] = false }, "attention_bias"},
		{"swiglu limit", func(m map[string]any) { m["swiglu_limit"] = 5.0 }, "swiglu_limit"},
		{"layer type", func(m map[string]any) { m["layer_types"].([]any)[0] = "linear_attention" }, "linear_attention"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			json.Unmarshal(raw, &m)
			tc.edit(m)
			b, _ := json.Marshal(m)
			f, _ := family.Named(family.NameGPTOSS)
			_, err := f.Parse(b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// fakeCheckpoint serves tensors from memory.
type fakeCheckpoint map[string]struct {
	shape []int
	v     []float32
}

func (f fakeCheckpoint) Has(name string) bool { _, ok := f[name]; return ok }

func (f fakeCheckpoint) Float32(name string, shape []int) ([]float32, error) {
	t, ok := f[name]
	if !ok || !slices.Equal(t.shape, shape) {
		return nil, fmt.Errorf("tensor %s missing or not %v", name, shape)
	}
	return t.v, nil
}

func (f fakeCheckpoint) Raw(name string, shape []int, i int) (string, []byte, error) {
	return "", nil, fmt.Errorf("no raw tensors")
}

func (f fakeCheckpoint) Slice(name string, shape []int, i int) ([]float32, error) {
	v, err := f.Float32(name, shape)
	if err != nil {
		return nil, err
	}
	n := len(v) / shape[0]
	return v[i*n : (i+1)*n], nil
}

// TestGPTOSSExpert: the fused, transposed, interleaved checkpoint layout
// becomes gate and up [inter][hidden] (even channels gate, odd up, as
// GptOssExperts._apply_gate slices them) and down [hidden][inter].
func TestGPTOSSExpert(t *testing.T) {
	const E, H, I = 2, 3, 2
	c := &format.Config{Family: family.NameGPTOSS, Experts: E, Hidden: H, MoEInter: I}
	val := func(e, a, b, k int) float32 { return float32(1000*e + 100*a + 10*b + k) }
	ck := fakeCheckpoint{}
	gu := make([]float32, E*H*2*I)
	gub := make([]float32, E*2*I)
	down := make([]float32, E*I*H)
	db := make([]float32, E*H)
	for e := 0; e < E; e++ {
		for h := 0; h < H; h++ {
			for j := 0; j < 2*I; j++ {
				gu[(e*H+h)*2*I+j] = val(e, h, j, 1)
			}
			db[e*H+h] = val(e, h, 0, 4)
		}
		for j := 0; j < 2*I; j++ {
			gub[e*2*I+j] = val(e, 0, j, 2)
		}
		for i := 0; i < I; i++ {
			for h := 0; h < H; h++ {
				down[(e*I+i)*H+h] = val(e, i, h, 3)
			}
		}
	}
	p := "layers.0.mlp.experts."
	ck[p+"gate_up_proj"] = struct {
		shape []int
		v     []float32
	}{[]int{E, H, 2 * I}, gu}
	ck[p+"gate_up_proj_bias"] = struct {
		shape []int
		v     []float32
	}{[]int{E, 2 * I}, gub}
	ck[p+"down_proj"] = struct {
		shape []int
		v     []float32
	}{[]int{E, I, H}, down}
	ck[p+"down_proj_bias"] = struct {
		shape []int
		v     []float32
	}{[]int{E, H}, db}
	x, err := family.ExpertOf(ck, c, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < I; i++ {
		for h := 0; h < H; h++ {
			if x.Gate[i*H+h] != val(1, h, 2*i, 1) || x.Up[i*H+h] != val(1, h, 2*i+1, 1) {
				t.Errorf("gate/up [%d][%d] = %v/%v", i, h, x.Gate[i*H+h], x.Up[i*H+h])
			}
			if x.Down[h*I+i] != val(1, i, h, 3) {
				t.Errorf("down [%d][%d] = %v", h, i, x.Down[h*I+i])
			}
		}
		if x.GateBias[i] != val(1, 0, 2*i, 2) || x.UpBias[i] != val(1, 0, 2*i+1, 2) {
			t.Errorf("biases %d: %v %v", i, x.GateBias[i], x.UpBias[i])
		}
	}
	if !slices.Equal(x.DownBias, db[H:]) {
		t.Errorf("down bias %v", x.DownBias)
	}
	delete(ck, p+"down_proj_bias")
	if _, err := family.ExpertOf(ck, c, 0, 1); err == nil || !strings.Contains(err.Error(), "down_proj_bias") {
		t.Errorf("missing bias: %v", err)
	}
}
