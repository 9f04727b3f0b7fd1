package family

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// NameGLM4MoE is glm4_moe (GLM-4.5, GLM-4.5-Air): grouped-query
// attention with q/k/v biases, optional per-head q/k RMSNorm and a rope
// over the first half of each head (rotate-half, as Llama), leading dense
// MLP layers, then DeepSeek-V3's MoE: a sigmoid router with a correction
// bias for the choice, group-limited top-k, routed scaling and a shared
// expert. Its MTP module is stored as the layer num_hidden_layers, laid out
// as DeepSeek-V3's (eh_proj, enorm, hnorm, shared_head), and drafts tokens
// when the checkpoint carries it.
const NameGLM4MoE = "glm4_moe"

var glm4MoE = Family{
	Name:       NameGLM4MoE,
	ModelTypes: []string{"glm4_moe"},
	Parse:      parseGLM4MoE,
	Build:      buildGLM4MoE,
	Describe:   describeGLM4MoE,
}

// glm4MoEConfig is config.json of glm4_moe; pointers tell absent from
// zero where transformers' default is not Go's zero.
type glm4MoEConfig struct {
	Hidden          int            `json:"hidden_size"`
	Layers          int            `json:"num_hidden_layers"`
	Vocab           int            `json:"vocab_size"`
	Heads           int            `json:"num_attention_heads"`
	KVHeads         int            `json:"num_key_value_heads"`
	HeadDim         int            `json:"head_dim"`
	Inter           int            `json:"intermediate_size"`
	MoEInter        int            `json:"moe_intermediate_size"`
	Experts         int            `json:"n_routed_experts"`
	SharedExperts   *int           `json:"n_shared_experts"`
	TopK            int            `json:"num_experts_per_tok"`
	Groups          *int           `json:"n_group"`
	TopGroups       *int           `json:"topk_group"`
	NormTopK        *bool          `json:"norm_topk_prob"`
	RoutedScale     *float64       `json:"routed_scaling_factor"`
	FirstDense      *int           `json:"first_k_dense_replace"`
	RMSEps          *float64       `json:"rms_norm_eps"`
	MaxPos          int            `json:"max_position_embeddings"`
	RopeTheta       *float64       `json:"rope_theta"`
	PartialRotary   *float64       `json:"partial_rotary_factor"`
	RopeParameters  map[string]any `json:"rope_parameters"`
	RopeScaling     map[string]any `json:"rope_scaling"`
	AttentionBias   bool           `json:"attention_bias"`
	QKNorm          bool           `json:"use_qk_norm"`
	HiddenAct       string         `json:"hidden_act"`
	NextNPredictors int            `json:"num_nextn_predict_layers"`
	Quantization    map[string]any `json:"quantization_config"`
}

// glm4MoEKeys are the config.json keys glm4_moe understands; any other is
// refused by name. The ones not in glm4MoEConfig change nothing at
// inference (training settings, token ids read elsewhere, bookkeeping).
var glm4MoEKeys = []string{
	"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
	"intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
	"n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace", "rms_norm_eps",
	"max_position_embeddings", "rope_theta", "partial_rotary_factor", "rope_parameters", "rope_scaling",
	"attention_bias", "use_qk_norm", "hidden_act", "num_nextn_predict_layers", "quantization_config",
	"model_type", "architectures", "tie_word_embeddings", "eos_token_id", "bos_token_id", "pad_token_id",
	"attention_dropout", "initializer_range", "router_aux_loss_coef", "output_router_logits", "use_cache",
	"transformers_version", "dtype", "torch_dtype",
}

// GLM4MoEArch is what glm4_moe keeps beyond format.Config (the JSON of its
// Config.Arch; the GGUF writer reads it too).
type GLM4MoEArch struct {
	Inter       int     `json:"intermediate_size"`
	Groups      int     `json:"n_group"`
	TopGroups   int     `json:"topk_group"`
	RoutedScale float64 `json:"routed_scaling_factor"`
	QKNorm      bool    `json:"use_qk_norm"`
	AttnBias    bool    `json:"attention_bias"`
}

func parseGLM4MoE(raw []byte) (format.Config, error) {
	c := format.Config{Family: NameGLM4MoE}
	if err := strictKeys("glm4_moe config", raw, glm4MoEKeys...); err != nil {
		return c, err
	}
	var r glm4MoEConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return c, err
	}
	if err := deepSeekFP8(r.Quantization); err != nil {
		return c, err
	}
	// transformers' Glm4MoeConfig defaults.
	a := GLM4MoEArch{Inter: r.Inter, Groups: 1, TopGroups: 1, RoutedScale: 1, QKNorm: r.QKNorm, AttnBias: r.AttentionBias}
	if r.Groups != nil {
		a.Groups = *r.Groups
	}
	if r.TopGroups != nil {
		a.TopGroups = *r.TopGroups
	}
	if r.RoutedScale != nil {
		a.RoutedScale = *r.RoutedScale
	}
	shared, first := 1, 1
	if r.SharedExperts != nil {
		shared = *r.SharedExperts
	}
	if r.FirstDense != nil {
		first = *r.FirstDense
	}
	switch {
	case r.HiddenAct != "" && r.HiddenAct != "silu":
		return c, fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	case r.HeadDim <= 0:
		// Glm4MoeAttention reads head_dim with a fallback whose value has
		// changed between transformers versions: refuse rather than guess.
		return c, fmt.Errorf("head_dim = %d: glm4_moe needs head_dim given in config.json", r.HeadDim)
	case r.Experts <= 0 || r.TopK <= 0 || r.TopK > r.Experts:
		return c, fmt.Errorf("n_routed_experts %d, num_experts_per_tok %d invalid", r.Experts, r.TopK)
	case a.Groups <= 0 || a.Groups > 64 || r.Experts%a.Groups != 0 || a.TopGroups <= 0 || a.TopGroups > a.Groups:
		return c, fmt.Errorf("n_group %d, topk_group %d: want 1 ≤ topk_group ≤ n_group ≤ 64 dividing n_routed_experts %d", a.Groups, a.TopGroups, r.Experts)
	case r.Experts/a.Groups < 2:
		return c, fmt.Errorf("n_routed_experts / n_group = %d: group scores need two experts a group", r.Experts/a.Groups)
	case a.TopGroups*r.Experts/a.Groups < r.TopK:
		return c, fmt.Errorf("topk_group %d of n_group %d keep fewer experts than num_experts_per_tok %d", a.TopGroups, a.Groups, r.TopK)
	case shared < 0:
		return c, fmt.Errorf("n_shared_experts = %d, want ≥ 0", shared)
	case first < 0:
		return c, fmt.Errorf("first_k_dense_replace = %d, want ≥ 0", first)
	case first > 0 && r.Inter <= 0:
		return c, fmt.Errorf("intermediate_size = %d: the %d leading dense layers need it", r.Inter, first)
	case r.NextNPredictors < 0 || r.NextNPredictors > 1:
		return c, fmt.Errorf("num_nextn_predict_layers = %d, sluice supports 0 or 1 (the released checkpoints have 1)", r.NextNPredictors)
	}
	c.Hidden, c.Layers, c.Vocab = r.Hidden, r.Layers, r.Vocab
	c.Heads, c.KVHeads, c.HeadDim = r.Heads, r.KVHeads, r.HeadDim
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	c.RMSEps = 1e-5
	if r.RMSEps != nil {
		c.RMSEps = *r.RMSEps
	}
	c.MaxPos = r.MaxPos
	c.Experts, c.TopK, c.MoEInter = r.Experts, r.TopK, r.MoEInter
	c.SharedInter = r.MoEInter * shared
	c.NormTopK = r.NormTopK == nil || *r.NormTopK
	c.FirstDense = min(first, c.Layers)
	c.MTPLayers = r.NextNPredictors
	for range c.Layers {
		c.LayerTypes = append(c.LayerTypes, format.FullAttention)
	}
	theta, partial, err := glm4MoERope(&r)
	if err != nil {
		return c, err
	}
	c.RopeTheta = theta
	// transformers: int(head_dim * partial_rotary_factor), rotated as halves.
	c.RotaryDim = int(float64(c.HeadDim) * partial)
	if c.RotaryDim <= 0 || c.RotaryDim%2 != 0 {
		return c, fmt.Errorf("partial_rotary_factor %g of head_dim %d gives %d rotary dims, want an even number > 0", partial, c.HeadDim, c.RotaryDim)
	}
	c.Arch, err = json.Marshal(a)
	return c, err
}

// glm4MoERope reads the rope: the default rotary embedding only, its theta
// and partial_rotary_factor from rope_parameters (transformers 5) or the
// top-level keys (earlier configs); the two must agree when both are given.
func glm4MoERope(r *glm4MoEConfig) (theta, partial float64, err error) {
	theta, partial = 10000, 0.5
	if r.RopeTheta != nil {
		theta = *r.RopeTheta
	}
	if r.PartialRotary != nil {
		partial = *r.PartialRotary
	}
	for _, p := range []struct {
		name string
		m    map[string]any
	}{{"rope_scaling", r.RopeScaling}, {"rope_parameters", r.RopeParameters}} {
		for _, k := range []string{"rope_type", "type"} {
			if v, ok := p.m[k]; ok && v != "default" {
				return 0, 0, fmt.Errorf("%s.%s %v is not supported by %s (want default)", p.name, k, v, NameGLM4MoE)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(p.m)) {
			v := p.m[k]
			switch k {
			case "rope_type", "type":
			case "rope_theta":
				f, ok := v.(float64)
				if !ok {
					return 0, 0, fmt.Errorf("%s.rope_theta = %v, want a number", p.name, v)
				}
				theta = f
			case "partial_rotary_factor":
				f, ok := v.(float64)
				if !ok {
					return 0, 0, fmt.Errorf("%s.partial_rotary_factor = %v, want a number", p.name, v)
				}
				if r.PartialRotary != nil && *r.PartialRotary != f {
					return 0, 0, fmt.Errorf("%s.partial_rotary_factor %g disagrees with partial_rotary_factor %g", p.name, f, *r.PartialRotary)
				}
				partial = f
			default:
				return 0, 0, fmt.Errorf("%s.%s is not supported with the default rope", p.name, k)
			}
		}
	}
	if partial <= 0 || partial > 1 {
		return 0, 0, fmt.Errorf("partial_rotary_factor = %g, want in (0, 1]", partial)
	}
	return theta, partial, nil
}

func buildGLM4MoE(c *format.Config, t *block.Tensors) (*Arch, error) {
	var ac GLM4MoEArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return nil, fmt.Errorf("glm4_moe arch config: %v", err)
	}
	H, hd := c.Hidden, c.HeadDim
	a := &Arch{Embed: t.Mat("embed_tokens.weight", c.Vocab, H), Rope: defaultRope(c)}
	kv := block.StateSpec{Kind: block.KV, KVWidth: c.KVHeads * hd}
	layer := func(l int) (block.Layer, block.StateSpec) {
		p := fmt.Sprintf("layers.%d.", l)
		q := p + "self_attn."
		L := block.Layer{In: rmsNorm(c, t.Vec(p+"input_layernorm.weight", H), false),
			Post: rmsNorm(c, t.Vec(p+"post_attention_layernorm.weight", H), false)}
		at := &block.Attn{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: hd, Rope: &a.Rope,
			Scale: float32(1 / math.Sqrt(float64(hd)))}
		at.Q = t.Mat(q+"q_proj.weight", c.Heads*hd, H)
		if ac.AttnBias {
			at.QB = t.Vec(q+"q_proj.bias", c.Heads*hd)
		}
		at.K = t.Mat(q+"k_proj.weight", c.KVHeads*hd, H)
		if ac.AttnBias {
			at.KB = t.Vec(q+"k_proj.bias", c.KVHeads*hd)
		}
		at.V = t.Mat(q+"v_proj.weight", c.KVHeads*hd, H)
		if ac.AttnBias {
			at.VB = t.Vec(q+"v_proj.bias", c.KVHeads*hd)
		}
		at.O = t.Mat(q+"o_proj.weight", H, c.Heads*hd) // no bias, whatever attention_bias says
		if ac.QKNorm {
			qn := rmsNorm(c, t.Vec(q+"q_norm.weight", hd), false)
			kn := rmsNorm(c, t.Vec(q+"k_norm.weight", hd), false)
			at.QNorm, at.KNorm = &qn, &kn
		}
		L.Mixer = at
		if l < c.FirstDense {
			L.FFN = swiGLU(t, p+"mlp.", ac.Inter, H)
		} else {
			L.FFN = groupedMoE(c, t, p, l, ac.Groups, ac.TopGroups, ac.RoutedScale)
		}
		return L, kv
	}
	stack(c, t, a, layer)
	if c.MTPLayers > 0 {
		// The same module as DeepSeek-V3's (vLLM's and SGLang's glm4_moe_mtp
		// run it as deepseek_mtp does), over this family's decoder layer.
		deepSeekMTP(c, t, a, layer)
	}
	return a, nil
}

func describeGLM4MoE(c *format.Config) []string {
	var ac GLM4MoEArch
	json.Unmarshal(c.Arch, &ac)
	attn := "grouped-query"
	if ac.AttnBias {
		attn += ", q/k/v biases"
	}
	if ac.QKNorm {
		attn += ", q/k RMSNorm per head"
	}
	d := []string{
		fmt.Sprintf("attention      %s, %d heads / %d kv heads of %d", attn, c.Heads, c.KVHeads, c.HeadDim),
		fmt.Sprintf("rope           default, theta %g, first %d of %d dims (rotate-half)", c.RopeTheta, c.RotaryDim, c.HeadDim),
		fmt.Sprintf("dense layers   %d leading (intermediate %d)", c.FirstDense, ac.Inter),
		fmt.Sprintf("router         sigmoid + correction bias, top-%d of %d groups, top-%d%s, scale %g", ac.TopGroups, ac.Groups, c.TopK,
			map[bool]string{true: " renormalised", false: ""}[c.NormTopK], ac.RoutedScale),
		fmt.Sprintf("experts        SwiGLU, shared expert of %d", c.SharedInter),
	}
	if c.MTPLayers > 0 {
		d = append(d, "mtp            one layer (speculative drafts)")
	}
	return d
}
