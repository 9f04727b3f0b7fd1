package family

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sluicelm/sluice/internal/format"
)

// NameQwen3Next is qwen3_next (Qwen3-Next): Qwen3.5-MoE's blocks — gated
// DeltaNet and gated attention layers, zero-centred RMSNorm, a
// sigmoid-gated shared expert — with the DeltaNet input projections fused
// per key-head group in the checkpoint. The packer splits them into
// Qwen3.5's layout, so a packed qwen3_next model is Qwen3.5's tensor list
// and block order; only the router's renormalisation follows the config.
const NameQwen3Next = "qwen3_next"

var qwen3Next = Family{
	Name:       NameQwen3Next,
	ModelTypes: []string{"qwen3_next"},
	Parse:      parseQwen3Next,
	Build:      buildQwen35MoE,
	Dense:      qwen3NextDense,
	Describe: func(c *format.Config) []string {
		d := qwen35MoE.Describe(c)
		d[1] += "; in_proj_qkvz / in_proj_ba split at pack time"
		d[3] = fmt.Sprintf("router         softmax over all experts, top-%d%s", c.TopK, map[bool]string{true: " renormalised", false: ""}[c.NormTopK])
		return d
	},
}

// qwen3NextConfig is config.json of qwen3_next. Parse fills it with
// transformers' defaults (Qwen3NextConfig) first, so an absent key means
// what it means there.
type qwen3NextConfig struct {
	qwen35MoEConfig
	NormTopK          *bool `json:"norm_topk_prob"`
	DecoderSparseStep int   `json:"decoder_sparse_step"`
	MLPOnlyLayers     []int `json:"mlp_only_layers"`
	// The MTP head's layer count: transformers ignores the head (it drops
	// mtp.* on load), so the hub's configs do not name it; hf.Open turns
	// it on when the checkpoint holds mtp.* tensors.
	NextN *int `json:"num_nextn_predict_layers"`
}

func parseQwen3Next(raw []byte) (format.Config, error) {
	partial, sparse, topk := 0.25, 1, true
	var r qwen3NextConfig
	r.Vocab, r.Hidden, r.Layers, r.Heads, r.KVHeads, r.HeadDim = 151936, 2048, 48, 16, 2, 256
	r.RMSEps, r.MaxPos, r.HiddenAct = 1e-6, 32768, "silu"
	r.PartialRotary, r.NormTopK, r.DecoderSparseStep = &partial, &topk, sparse
	r.FullAttnInterval, r.ConvKernel = 4, 4
	r.LinearKeyDim, r.LinearValueDim, r.LinearKeyHeads, r.LinearValueHeads = 128, 128, 16, 32
	r.MoEInter, r.SharedInter, r.TopK, r.NumExperts = 512, 512, 10, 512
	if err := json.Unmarshal(raw, &r); err != nil {
		return format.Config{}, err
	}
	if len(r.MLPOnlyLayers) > 0 {
		return format.Config{}, fmt.Errorf("mlp_only_layers %v (dense MLP layers) is not supported by %s", r.MLPOnlyLayers, NameQwen3Next)
	}
	if r.DecoderSparseStep != 1 {
		return format.Config{}, fmt.Errorf("decoder_sparse_step = %d (dense MLP layers) is not supported by %s (want 1)", r.DecoderSparseStep, NameQwen3Next)
	}
	if r.NextN != nil {
		if r.MTPLayers != 0 && r.MTPLayers != *r.NextN {
			return format.Config{}, fmt.Errorf("num_nextn_predict_layers = %d and mtp_num_hidden_layers = %d disagree", *r.NextN, r.MTPLayers)
		}
		r.MTPLayers = *r.NextN
	}
	c, err := r.config(NameQwen3Next)
	if err != nil {
		return c, err
	}
	c.NormTopK = r.NormTopK == nil || *r.NormTopK
	return c, nil
}

// qwen3NextDense reads the DeltaNet input projections out of the fused
// checkpoint tensors; every other tensor is read as is.
//
// in_proj_qkvz holds, per key head g, the rows [q_g (dk) ‖ k_g (dk) ‖
// v_g (r·dv) ‖ z_g (r·dv)], r = value heads per key head, where v_g and z_g
// are value heads g·r … g·r+r-1; in_proj_ba holds, per key head, [b_g (r)
// ‖ a_g (r)] (transformers' fix_query_key_value_ordering). Qwen3.5's
// blocks take q of every head, then k, then v as in_proj_qkv (the order
// the conv runs over, which conv1d's weight already follows), z, b and a
// apart, all in value-head order.
func qwen3NextDense(src Checkpoint, c *format.Config, s format.Spec) ([]float32, error) {
	i := strings.Index(s.Name, "linear_attn.in_proj_")
	if i < 0 || src.Has(s.Name) {
		return src.Float32(s.Name, s.Shape)
	}
	p, part := s.Name[:i], s.Name[i+len("linear_attn.in_proj_"):]
	nk, dk, dv := c.LinearKeyHeads, c.LinearKeyDim, c.LinearValueDim
	r := c.LinearValueHeads / nk
	H := c.Hidden
	// copyRows appends, for each key head, n rows from offset off of its
	// group of g rows in fused.
	copyRows := func(dst, fused []float32, g, off, n int) []float32 {
		for k := 0; k < nk; k++ {
			dst = append(dst, fused[(k*g+off)*H:(k*g+off+n)*H]...)
		}
		return dst
	}
	switch part {
	case "qkv.weight", "z.weight":
		g := 2*dk + 2*r*dv
		fused, err := src.Float32(p+"linear_attn.in_proj_qkvz.weight", []int{nk * g, H})
		if err != nil {
			return nil, err
		}
		out := make([]float32, 0, s.Shape[0]*H)
		if part == "z.weight" {
			return copyRows(out, fused, g, 2*dk+r*dv, r*dv), nil
		}
		out = copyRows(out, fused, g, 0, dk)
		out = copyRows(out, fused, g, dk, dk)
		return copyRows(out, fused, g, 2*dk, r*dv), nil
	case "b.weight", "a.weight":
		fused, err := src.Float32(p+"linear_attn.in_proj_ba.weight", []int{nk * 2 * r, H})
		if err != nil {
			return nil, err
		}
		off := 0
		if part == "a.weight" {
			off = r
		}
		return copyRows(make([]float32, 0, nk*r*H), fused, 2*r, off, r), nil
	}
	return src.Float32(s.Name, s.Shape)
}
