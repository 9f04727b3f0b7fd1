package family

import (
	"fmt"
	"math"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// qwenCommon is the part of config.json the Qwen MoE families share.
type qwenCommon struct {
	Hidden         int            `json:"hidden_size"`
	Layers         int            `json:"num_hidden_layers"`
	Vocab          int            `json:"vocab_size"`
	Heads          int            `json:"num_attention_heads"`
	KVHeads        int            `json:"num_key_value_heads"`
	HeadDim        int            `json:"head_dim"`
	RopeTheta      *float64       `json:"rope_theta"`
	PartialRotary  *float64       `json:"partial_rotary_factor"`
	RopeParameters map[string]any `json:"rope_parameters"`
	RopeScaling    map[string]any `json:"rope_scaling"`
	RMSEps         float64        `json:"rms_norm_eps"`
	MaxPos         int            `json:"max_position_embeddings"`
	LayerTypes     []string       `json:"layer_types"`
	TopK           int            `json:"num_experts_per_tok"`
	MoEInter       int            `json:"moe_intermediate_size"`
	AttentionBias  bool           `json:"attention_bias"`
	HiddenAct      string         `json:"hidden_act"`
}

// config fills the shared dimensions, refusing what the Qwen blocks do not
// implement (attention biases, other activations, scaled rope).
func (r *qwenCommon) config(family string) (format.Config, error) {
	c := format.Config{Family: family}
	if r.AttentionBias {
		return c, fmt.Errorf("attention_bias = true is not supported by %s", family)
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return c, fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	}
	c.Hidden, c.Layers, c.Vocab = r.Hidden, r.Layers, r.Vocab
	c.Heads, c.KVHeads, c.HeadDim = r.Heads, r.KVHeads, r.HeadDim
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	c.RMSEps = r.RMSEps
	if c.RMSEps == 0 {
		c.RMSEps = 1e-6
	}
	c.MaxPos = r.MaxPos
	theta, partial := 10000.0, 1.0
	if r.RopeTheta != nil {
		theta = *r.RopeTheta
	}
	if r.PartialRotary != nil {
		partial = *r.PartialRotary
	}
	for _, rp := range []map[string]any{r.RopeScaling, r.RopeParameters} {
		if rp == nil {
			continue
		}
		if v, ok := rp["rope_theta"].(float64); ok {
			theta = v
		}
		if v, ok := rp["partial_rotary_factor"].(float64); ok {
			partial = v
		}
		rt, _ := rp["rope_type"].(string)
		if rt == "" {
			rt, _ = rp["type"].(string)
		}
		if rt != "" && rt != "default" {
			return c, fmt.Errorf("rope_type %q is not supported by %s (want default)", rt, family)
		}
	}
	c.RopeTheta = theta
	c.RotaryDim = int(float64(c.HeadDim) * partial)
	c.TopK, c.MoEInter = r.TopK, r.MoEInter
	c.LayerTypes = r.LayerTypes
	return c, nil
}

// rmsNorm is an RMSNorm with the config's epsilon.
func rmsNorm(c *format.Config, w []float32, zeroCentred bool) block.Norm {
	return block.Norm{W: w, Eps: float32(c.RMSEps), ZeroCentred: zeroCentred}
}

// defaultRope is the plain rotary embedding: theta^(-2i/dim) over the
// first rotary_dim values of each head.
func defaultRope(c *format.Config) block.Rope {
	return block.Rope{Dim: c.RotaryDim, InvFreq: kernels.RopeFreqs(c.RotaryDim, c.RopeTheta), Scale: 1}
}

// qwenAttn declares a Qwen attention block under prefix p: q/k/v/o and
// the per-head q/k norms; gated doubles q's rows (query ‖ gate per head).
func qwenAttn(c *format.Config, t *block.Tensors, p string, rope *block.Rope, gated, zeroCentred bool) *block.Attn {
	qRows := c.Heads * c.HeadDim
	if gated {
		qRows *= 2
	}
	a := &block.Attn{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Rope: rope, Gate: gated,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim)))}
	a.Q = t.Mat(p+"self_attn.q_proj.weight", qRows, c.Hidden)
	a.K = t.Mat(p+"self_attn.k_proj.weight", c.KVHeads*c.HeadDim, c.Hidden)
	a.V = t.Mat(p+"self_attn.v_proj.weight", c.KVHeads*c.HeadDim, c.Hidden)
	a.O = t.Mat(p+"self_attn.o_proj.weight", c.Hidden, c.Heads*c.HeadDim)
	qn := rmsNorm(c, t.Vec(p+"self_attn.q_norm.weight", c.HeadDim), zeroCentred)
	kn := rmsNorm(c, t.Vec(p+"self_attn.k_norm.weight", c.HeadDim), zeroCentred)
	a.QNorm, a.KNorm = &qn, &kn
	return a
}

// linkPre points each MoE at the norm that feeds it (the lookahead of the
// previous layer applies it).
func linkPre(layers []block.Layer) {
	for i := range layers {
		if m := layers[i].MoE(); m != nil {
			m.Pre = &layers[i].Post
		}
	}
}

// swiGLU is the dense SwiGLU MLP whose projections are stored under p
// (p+"gate_proj.weight" and so on), of inter columns over hidden H: a
// dense layer's feed-forward, or a MoE's shared expert.
func swiGLU(t *block.Tensors, p string, inter, H int) *block.MLP {
	return &block.MLP{Inter: inter,
		Gate: t.Mat(p+"gate_proj.weight", inter, H),
		Up:   t.Mat(p+"up_proj.weight", inter, H),
		Down: t.Mat(p+"down_proj.weight", H, inter)}
}

// groupedMoE is DeepSeek-V3's routed MoE, which GLM-4.5 shares: sigmoid
// scores with a correction bias, the best topGroups of groups groups of
// experts, the chosen weights scaled by scale, and the shared experts
// (c.SharedInter wide, none when 0), stored under p ("model.layers.N.").
func groupedMoE(c *format.Config, t *block.Tensors, p string, l, groups, topGroups int, scale float64) *block.MoE {
	H := c.Hidden
	moe := &block.MoE{Layer: l, Score: block.SigmoidGroups, NormTopK: c.NormTopK,
		Groups: groups, TopGroups: topGroups, Scale: float32(scale)}
	moe.Router = t.F32(p+"mlp.gate.weight", c.Experts, H)
	moe.Correction = t.Vec(p+"mlp.gate.e_score_correction_bias", c.Experts)
	if c.SharedInter > 0 {
		moe.Shared = swiGLU(t, p+"mlp.shared_experts.", c.SharedInter, H)
	}
	return moe
}

// stack appends the trunk's c.Layers decoder layers, as layer builds
// each with its state, then links each MoE to its norm and adds the
// final norm and the output head.
func stack(c *format.Config, t *block.Tensors, a *Arch, layer func(int) (block.Layer, block.StateSpec)) {
	for l := 0; l < c.Layers; l++ {
		L, s := layer(l)
		a.Layers = append(a.Layers, L)
		a.States = append(a.States, s)
	}
	linkPre(a.Layers)
	a.Norm = rmsNorm(c, t.Vec("norm.weight", c.Hidden), false)
	a.LMHead = t.Mat("lm_head.weight", c.Vocab, c.Hidden)
}
