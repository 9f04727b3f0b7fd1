package family

import (
	"encoding/json"
	"fmt"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// NameQwen35MoE is qwen3_5_moe: gated attention and gated DeltaNet layers,
// zero-centred RMSNorm, a sigmoid-gated shared expert beside the routed
// ones, and an MTP head stored as the extra layer num_hidden_layers.
const NameQwen35MoE = "qwen3_5_moe"

var qwen35MoE = Family{
	Name:       NameQwen35MoE,
	ModelTypes: []string{"qwen3_5_moe", "qwen3_5_moe_text"},
	Parse:      parseQwen35MoE,
	Build:      buildQwen35MoE,
	Describe: func(c *format.Config) []string {
		d := []string{"attention      grouped-query with a sigmoid output gate, q/k RMSNorm per head, partial rope (" + fmt.Sprint(c.RotaryDim) + " dims)",
			fmt.Sprintf("deltanet       %d key / %d value heads of %d/%d, conv kernel %d", c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim, c.ConvKernel),
			"norms          zero-centred RMSNorm (x·(1+w))",
			fmt.Sprintf("router         softmax over all experts, top-%d renormalised", c.TopK),
			fmt.Sprintf("experts        SwiGLU, sigmoid-gated shared expert of %d", c.SharedInter)}
		if c.MTPLayers > 0 {
			d = append(d, "mtp            one layer (speculative drafts)")
		}
		return d
	},
}

// qwen35MoEConfig is the text config.json of qwen3_5_moe.
type qwen35MoEConfig struct {
	qwenCommon
	NumExperts       int `json:"num_experts"`
	NumLocalExperts  int `json:"num_local_experts"`
	SharedInter      int `json:"shared_expert_intermediate_size"`
	FullAttnInterval int `json:"full_attention_interval"`
	LinearKeyHeads   int `json:"linear_num_key_heads"`
	LinearValueHeads int `json:"linear_num_value_heads"`
	LinearKeyDim     int `json:"linear_key_head_dim"`
	LinearValueDim   int `json:"linear_value_head_dim"`
	ConvKernel       int `json:"linear_conv_kernel_dim"`
	MTPLayers        int `json:"mtp_num_hidden_layers"`
}

func parseQwen35MoE(raw []byte) (format.Config, error) {
	var r qwen35MoEConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return format.Config{}, err
	}
	c, err := r.config(NameQwen35MoE)
	c.NormTopK = true // the qwen3_5_moe router always renormalises its top-k
	return c, err
}

// config fills the hybrid (DeltaNet + gated attention) dimensions that
// qwen3_5_moe and qwen3_next share, refusing what their blocks do not run.
func (r *qwen35MoEConfig) config(family string) (format.Config, error) {
	c, err := r.qwenCommon.config(family)
	if err != nil {
		return c, err
	}
	c.Experts = r.NumExperts
	if c.Experts == 0 {
		c.Experts = r.NumLocalExperts
	}
	c.SharedInter = r.SharedInter
	c.LinearKeyHeads, c.LinearValueHeads = r.LinearKeyHeads, r.LinearValueHeads
	c.LinearKeyDim, c.LinearValueDim, c.ConvKernel = r.LinearKeyDim, r.LinearValueDim, r.ConvKernel
	c.MTPLayers = r.MTPLayers
	if c.LayerTypes == nil && r.FullAttnInterval > 0 {
		for i := 0; i < c.Layers; i++ {
			t := format.LinearAttention
			if (i+1)%r.FullAttnInterval == 0 {
				t = format.FullAttention
			}
			c.LayerTypes = append(c.LayerTypes, t)
		}
	}
	for i, t := range c.LayerTypes {
		if t != format.FullAttention && t != format.LinearAttention {
			return c, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, t, family)
		}
	}
	for _, f := range []struct {
		n string
		v int
	}{{"linear_num_key_heads", c.LinearKeyHeads}, {"linear_num_value_heads", c.LinearValueHeads},
		{"linear_key_head_dim", c.LinearKeyDim}, {"linear_value_head_dim", c.LinearValueDim}, {"linear_conv_kernel_dim", c.ConvKernel}} {
		if f.v <= 0 {
			return c, fmt.Errorf("%s = %d, want > 0", f.n, f.v)
		}
	}
	if c.LinearValueHeads%c.LinearKeyHeads != 0 {
		return c, fmt.Errorf("linear_num_value_heads %d not a multiple of linear_num_key_heads %d", c.LinearValueHeads, c.LinearKeyHeads)
	}
	if c.MTPLayers < 0 || c.MTPLayers > 1 {
		return c, fmt.Errorf("mtp_num_hidden_layers = %d, sluice supports 0 or 1", c.MTPLayers)
	}
	return c, nil
}

func buildQwen35MoE(c *format.Config, t *block.Tensors) (*Arch, error) {
	H := c.Hidden
	a := &Arch{Embed: t.Mat("embed_tokens.weight", c.Vocab, H), Rope: defaultRope(c)}
	kd, vd := c.LinearKeyHeads*c.LinearKeyDim, c.LinearValueHeads*c.LinearValueDim
	layer := func(l int) block.Layer {
		p := fmt.Sprintf("layers.%d.", l)
		L := block.Layer{In: rmsNorm(c, t.Vec(p+"input_layernorm.weight", H), true),
			Post: rmsNorm(c, t.Vec(p+"post_attention_layernorm.weight", H), true)}
		if l >= c.Layers || c.LayerTypes[l] == format.FullAttention {
			L.Mixer = qwenAttn(c, t, p, &a.Rope, true, true)
		} else {
			d := &block.DeltaNet{KeyHeads: c.LinearKeyHeads, ValueHeads: c.LinearValueHeads,
				KeyDim: c.LinearKeyDim, ValueDim: c.LinearValueDim, Kernel: c.ConvKernel}
			d.QKV = t.Mat(p+"linear_attn.in_proj_qkv.weight", 2*kd+vd, H)
			d.Z = t.Mat(p+"linear_attn.in_proj_z.weight", vd, H)
			d.B = t.F32(p+"linear_attn.in_proj_b.weight", c.LinearValueHeads, H)
			d.A = t.F32(p+"linear_attn.in_proj_a.weight", c.LinearValueHeads, H)
			d.Conv = t.Vec(p+"linear_attn.conv1d.weight", 2*kd+vd, 1, c.ConvKernel)
			if K := c.ConvKernel; K > 0 && d.Conv != nil {
				cd := len(d.Conv) / K
				d.ConvT = make([]float32, len(d.Conv))
				for ch := 0; ch < cd; ch++ {
					for j := 0; j < K; j++ {
						d.ConvT[j*cd+ch] = d.Conv[ch*K+j]
					}
				}
			}
			d.ALog = t.Vec(p+"linear_attn.A_log", c.LinearValueHeads)
			d.DtBias = t.Vec(p+"linear_attn.dt_bias", c.LinearValueHeads)
			d.GNorm = rmsNorm(c, t.Vec(p+"linear_attn.norm.weight", c.LinearValueDim), false)
			d.Out = t.Mat(p+"linear_attn.out_proj.weight", H, vd)
			L.Mixer = d
		}
		moe := &block.MoE{Layer: l, Router: t.F32(p+"mlp.gate.weight", c.Experts, H), NormTopK: c.NormTopK || c.Family == NameQwen35MoE}
		L.FFN = moe
		if c.SharedInter > 0 {
			moe.Shared = swiGLU(t, p+"mlp.shared_expert.", c.SharedInter, H)
			moe.SharedGate = t.F32(p+"mlp.shared_expert_gate.weight", 1, H)
		}
		return L
	}
	for l := 0; l < c.Layers; l++ {
		a.Layers = append(a.Layers, layer(l))
		if c.LayerTypes[l] == format.FullAttention {
			a.States = append(a.States, block.StateSpec{Kind: block.KV, KVWidth: c.KVHeads * c.HeadDim})
		} else {
			a.States = append(a.States, block.StateSpec{Kind: block.Recurrent,
				ConvFloats: (c.ConvKernel - 1) * (2*kd + vd), RecFloats: c.LinearValueHeads * c.LinearKeyDim * c.LinearValueDim})
		}
	}
	linkPre(a.Layers)
	var mtpLayer block.Layer
	if c.MTPLayers > 0 {
		mtpLayer = layer(c.Layers)
	}
	a.Norm = rmsNorm(c, t.Vec("norm.weight", H), true)
	a.LMHead = t.Mat("lm_head.weight", c.Vocab, H)
	if c.MTPLayers > 0 {
		a.MTP = &block.MTP{FC: t.Mat("mtp.fc.weight", H, 2*H),
			NormEmbed:  rmsNorm(c, t.Vec("mtp.pre_fc_norm_embedding.weight", H), true),
			NormHidden: rmsNorm(c, t.Vec("mtp.pre_fc_norm_hidden.weight", H), true),
			Norm:       rmsNorm(c, t.Vec("mtp.norm.weight", H), true),
			Layer:      mtpLayer}
		a.MTP.Layer.MoE().Pre = &a.MTP.Layer.Post
		a.MTPState = block.StateSpec{Kind: block.KV, KVWidth: c.KVHeads * c.HeadDim}
	}
	return a, nil
}
