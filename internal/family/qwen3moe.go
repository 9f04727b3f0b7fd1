package family

import (
	"encoding/json"
	"fmt"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// NameQwen3MoE is qwen3_moe: attention with per-head q/k norms, a softmax
// router and SwiGLU experts, plain RMSNorm.
const NameQwen3MoE = "qwen3_moe"

var qwen3MoE = Family{
	Name:       NameQwen3MoE,
	ModelTypes: []string{"qwen3_moe"},
	Parse:      parseQwen3MoE,
	Build:      buildQwen3MoE,
	Describe: func(c *format.Config) []string {
		return []string{"attention      grouped-query, q/k RMSNorm per head, rope theta " + fmt.Sprint(c.RopeTheta),
			fmt.Sprintf("router         softmax over all experts, top-%d%s", c.TopK, map[bool]string{true: " renormalised", false: ""}[c.NormTopK]),
			"experts        SwiGLU"}
	},
}

// qwen3MoEConfig is config.json of qwen3_moe; pointers tell absent from
// zero.
type qwen3MoEConfig struct {
	qwenCommon
	NumExperts        int   `json:"num_experts"`
	NumLocalExperts   int   `json:"num_local_experts"`
	NormTopK          *bool `json:"norm_topk_prob"`
	DecoderSparseStep *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers     []int `json:"mlp_only_layers"`
}

func parseQwen3MoE(raw []byte) (format.Config, error) {
	var r qwen3MoEConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return format.Config{}, err
	}
	if len(r.MLPOnlyLayers) > 0 || (r.DecoderSparseStep != nil && *r.DecoderSparseStep != 1) {
		return format.Config{}, fmt.Errorf("dense MLP layers (mlp_only_layers %v, decoder_sparse_step) are not supported", r.MLPOnlyLayers)
	}
	c, err := r.qwenCommon.config(NameQwen3MoE)
	if err != nil {
		return c, err
	}
	c.Experts = r.NumExperts
	if c.Experts == 0 {
		c.Experts = r.NumLocalExperts
	}
	c.NormTopK = r.NormTopK != nil && *r.NormTopK
	if c.LayerTypes == nil {
		for i := 0; i < c.Layers; i++ {
			c.LayerTypes = append(c.LayerTypes, format.FullAttention)
		}
	}
	for i, t := range c.LayerTypes {
		if t != format.FullAttention {
			return c, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, t, NameQwen3MoE)
		}
	}
	return c, nil
}

func buildQwen3MoE(c *format.Config, t *block.Tensors) (*Arch, error) {
	a := &Arch{Embed: t.Mat("embed_tokens.weight", c.Vocab, c.Hidden), Rope: defaultRope(c)}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		L := block.Layer{In: rmsNorm(c, t.Vec(p+"input_layernorm.weight", c.Hidden), false),
			Post: rmsNorm(c, t.Vec(p+"post_attention_layernorm.weight", c.Hidden), false)}
		L.Mixer = qwenAttn(c, t, p, &a.Rope, false, false)
		L.FFN = &block.MoE{Layer: l, Router: t.F32(p+"mlp.gate.weight", c.Experts, c.Hidden), NormTopK: c.NormTopK}
		a.Layers = append(a.Layers, L)
		a.States = append(a.States, block.StateSpec{Kind: block.KV, KVWidth: c.KVHeads * c.HeadDim})
	}
	linkPre(a.Layers)
	a.Norm = rmsNorm(c, t.Vec("norm.weight", c.Hidden), false)
	a.LMHead = t.Mat("lm_head.weight", c.Vocab, c.Hidden)
	return a, nil
}
