package format

import "fmt"

// Spec is one dense tensor a family needs: its canonical name (the
// checkpoint's name without the "model." or "model.language_model." prefix,
// with "mtp.layers.0." renamed "layers.<num_hidden_layers>."), its shape, and
// whether the packer quantises it. Norms, gates and routers stay float32:
// they are small, and routing decisions are sensitive to their precision.
type Spec struct {
	Name  string
	Shape []int
	Quant bool
}

// DenseSpecs lists every dense tensor of the model in pack order.
func DenseSpecs(c *Config) []Spec {
	H := c.Hidden
	var s []Spec
	add := func(name string, quant bool, shape ...int) { s = append(s, Spec{name, shape, quant}) }
	add("embed_tokens.weight", true, c.Vocab, H)
	for l := 0; l < c.ExpertLayers(); l++ {
		p := fmt.Sprintf("layers.%d.", l)
		add(p+"input_layernorm.weight", false, H)
		add(p+"post_attention_layernorm.weight", false, H)
		if l >= c.Layers || c.LayerTypes[l] == FullAttention {
			qRows := c.Heads * c.HeadDim
			if c.Family == FamilyQwen35MoE {
				qRows *= 2 // query and output gate, interleaved per head
			}
			add(p+"self_attn.q_proj.weight", true, qRows, H)
			add(p+"self_attn.k_proj.weight", true, c.KVHeads*c.HeadDim, H)
			add(p+"self_attn.v_proj.weight", true, c.KVHeads*c.HeadDim, H)
			add(p+"self_attn.o_proj.weight", true, H, c.Heads*c.HeadDim)
			add(p+"self_attn.q_norm.weight", false, c.HeadDim)
			add(p+"self_attn.k_norm.weight", false, c.HeadDim)
		} else {
			kd, vd := c.LinearKeyHeads*c.LinearKeyDim, c.LinearValueHeads*c.LinearValueDim
			add(p+"linear_attn.in_proj_qkv.weight", true, 2*kd+vd, H)
			add(p+"linear_attn.in_proj_z.weight", true, vd, H)
			add(p+"linear_attn.in_proj_b.weight", false, c.LinearValueHeads, H)
			add(p+"linear_attn.in_proj_a.weight", false, c.LinearValueHeads, H)
			add(p+"linear_attn.conv1d.weight", false, 2*kd+vd, 1, c.ConvKernel)
			add(p+"linear_attn.A_log", false, c.LinearValueHeads)
			add(p+"linear_attn.dt_bias", false, c.LinearValueHeads)
			add(p+"linear_attn.norm.weight", false, c.LinearValueDim)
			add(p+"linear_attn.out_proj.weight", true, H, vd)
		}
		add(p+"mlp.gate.weight", false, c.Experts, H)
		if c.SharedInter > 0 {
			add(p+"mlp.shared_expert.gate_proj.weight", true, c.SharedInter, H)
			add(p+"mlp.shared_expert.up_proj.weight", true, c.SharedInter, H)
			add(p+"mlp.shared_expert.down_proj.weight", true, H, c.SharedInter)
			add(p+"mlp.shared_expert_gate.weight", false, 1, H)
		}
	}
	add("norm.weight", false, H)
	add("lm_head.weight", true, c.Vocab, H)
	if c.MTPLayers > 0 {
		add("mtp.fc.weight", true, H, 2*H)
		add("mtp.pre_fc_norm_embedding.weight", false, H)
		add("mtp.pre_fc_norm_hidden.weight", false, H)
		add("mtp.norm.weight", false, H)
	}
	return s
}
