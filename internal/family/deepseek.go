package family

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// NameDeepSeek is DeepSeek-V3 and V3.2 (and Kimi K2, a V3): multi-head
// latent attention (run absorbed, one latent per position in the cache),
// with V3.2's lightning indexer choosing the positions each row attends
// to, leading dense MLP layers, and MoE layers with a sigmoid,
// group-limited router and a shared expert. A checkpoint with
// num_nextn_predict_layers 1 carries an MTP module stored as the layer
// num_hidden_layers, which drafts tokens for speculative decoding.
const NameDeepSeek = "deepseek_v32"

var deepSeek = Family{
	Name:       NameDeepSeek,
	ModelTypes: []string{"deepseek_v32", "deepseek_v3", "kimi_k2"},
	Parse:      parseDeepSeek,
	Build:      buildDeepSeek,
	Dense:      deepSeekDense,
	Describe:   describeDeepSeek,
}

// deepSeekConfig is config.json of deepseek_v32.
type deepSeekConfig struct {
	ModelType       string         `json:"model_type"`
	Hidden          int            `json:"hidden_size"`
	Layers          int            `json:"num_hidden_layers"`
	Vocab           int            `json:"vocab_size"`
	Heads           int            `json:"num_attention_heads"`
	Inter           int            `json:"intermediate_size"`
	MoEInter        int            `json:"moe_intermediate_size"`
	Experts         int            `json:"n_routed_experts"`
	SharedExperts   int            `json:"n_shared_experts"`
	TopK            int            `json:"num_experts_per_tok"`
	Groups          int            `json:"n_group"`
	TopGroups       int            `json:"topk_group"`
	NormTopK        *bool          `json:"norm_topk_prob"`
	RoutedScale     *float64       `json:"routed_scaling_factor"`
	ScoringFunc     string         `json:"scoring_func"`
	TopKMethod      string         `json:"topk_method"`
	KVLora          int            `json:"kv_lora_rank"`
	QLora           *int           `json:"q_lora_rank"`
	RopeDim         int            `json:"qk_rope_head_dim"`
	NopeDim         int            `json:"qk_nope_head_dim"`
	VDim            int            `json:"v_head_dim"`
	IndexTopK       int            `json:"index_topk"`
	IndexHeadDim    int            `json:"index_head_dim"`
	IndexHeads      int            `json:"index_n_heads"`
	FirstDense      *int           `json:"first_k_dense_replace"`
	MLPLayerTypes   []string       `json:"mlp_layer_types"`
	LayerTypes      []string       `json:"layer_types"`
	RMSEps          *float64       `json:"rms_norm_eps"`
	MaxPos          int            `json:"max_position_embeddings"`
	RopeTheta       *float64       `json:"rope_theta"`
	RopeParameters  map[string]any `json:"rope_parameters"`
	RopeScaling     map[string]any `json:"rope_scaling"`
	AttentionBias   bool           `json:"attention_bias"`
	MLPBias         bool           `json:"mlp_bias"`
	HiddenAct       string         `json:"hidden_act"`
	NextNPredictors int            `json:"num_nextn_predict_layers"`
	MoELayerFreq    *int           `json:"moe_layer_freq"`
	Quantization    map[string]any `json:"quantization_config"`
}

// deepSeekKeys are the config.json keys deepseek_v32 understands.
var deepSeekKeys = []string{
	"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
	"qk_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
	"num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
	"topk_method", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
	"index_topk", "index_head_dim", "index_n_heads", "first_k_dense_replace", "mlp_layer_types", "layer_types",
	"rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling", "attention_bias",
	"mlp_bias", "hidden_act", "num_nextn_predict_layers", "moe_layer_freq", "ep_size", "quantization_config",
	"model_type", "architectures", "tie_word_embeddings", "eos_token_id", "bos_token_id", "pad_token_id",
	"attention_dropout", "initializer_range", "aux_loss_alpha", "seq_aux", "use_cache", "transformers_version",
	"dtype", "torch_dtype", "auto_map", "pretraining_tp",
}

// DeepSeekArch is what deepseek_v32 keeps beyond format.Config (the JSON
// of its Config.Arch; the GGUF writer reads it too).
type DeepSeekArch struct {
	QLora        int     `json:"q_lora_rank"`
	KVLora       int     `json:"kv_lora_rank"`
	Nope         int     `json:"qk_nope_head_dim"`
	RopeDim      int     `json:"qk_rope_head_dim"`
	V            int     `json:"v_head_dim"`
	Inter        int     `json:"intermediate_size"`
	Groups       int     `json:"n_group"`
	TopGroups    int     `json:"topk_group"`
	RoutedScale  float64 `json:"routed_scaling_factor"`
	IndexTopK    int     `json:"index_topk"`
	IndexHeads   int     `json:"index_n_heads"`
	IndexHeadDim int     `json:"index_head_dim"`
	Yarn         *Yarn   `json:"yarn,omitempty"`
}

func parseDeepSeek(raw []byte) (format.Config, error) {
	c := format.Config{Family: NameDeepSeek}
	if err := strictKeys("deepseek_v32 config", raw, deepSeekKeys...); err != nil {
		return c, err
	}
	var r deepSeekConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return c, err
	}
	if err := deepSeekFP8(r.Quantization); err != nil {
		return c, err
	}
	switch {
	case r.MoELayerFreq != nil && *r.MoELayerFreq != 1:
		return c, fmt.Errorf("moe_layer_freq = %d is not supported (want 1)", *r.MoELayerFreq)
	case r.AttentionBias:
		return c, fmt.Errorf("attention_bias = true is not supported by %s", NameDeepSeek)
	case r.MLPBias:
		return c, fmt.Errorf("mlp_bias = true is not supported by %s", NameDeepSeek)
	case r.HiddenAct != "" && r.HiddenAct != "silu":
		return c, fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	case r.ScoringFunc != "" && r.ScoringFunc != "sigmoid":
		return c, fmt.Errorf("scoring_func %q is not supported (want sigmoid)", r.ScoringFunc)
	case r.TopKMethod != "" && r.TopKMethod != "noaux_tc":
		return c, fmt.Errorf("topk_method %q is not supported (want noaux_tc)", r.TopKMethod)
	case r.QLora == nil || *r.QLora <= 0:
		return c, fmt.Errorf("q_lora_rank absent: the unfactored query projection is not supported")
	case r.ModelType == "deepseek_v32" && (r.IndexTopK <= 0 || r.IndexHeads <= 0 || r.IndexHeadDim < r.RopeDim):
		return c, fmt.Errorf("index_topk %d, index_n_heads %d, index_head_dim %d: deepseek_v32 wants a sparse-attention indexer", r.IndexTopK, r.IndexHeads, r.IndexHeadDim)
	case r.ModelType != "deepseek_v32" && r.IndexTopK != 0:
		return c, fmt.Errorf("index_topk in a %s config: the indexer is deepseek_v32's", r.ModelType)
	case r.Groups <= 0 || r.Groups > 64 || r.Experts%r.Groups != 0 || r.TopGroups <= 0 || r.TopGroups > r.Groups:
		return c, fmt.Errorf("n_group %d, topk_group %d: want 1 ≤ topk_group ≤ n_group ≤ 64 dividing n_routed_experts %d", r.Groups, r.TopGroups, r.Experts)
	case r.Experts/r.Groups < 2:
		return c, fmt.Errorf("n_routed_experts / n_group = %d: group scores need two experts a group", r.Experts/r.Groups)
	case r.KVLora <= 0 || r.NopeDim <= 0 || r.VDim <= 0 || r.RopeDim <= 0 || r.RopeDim%2 != 0:
		return c, fmt.Errorf("kv_lora_rank %d, qk_nope_head_dim %d, v_head_dim %d, qk_rope_head_dim %d invalid", r.KVLora, r.NopeDim, r.VDim, r.RopeDim)
	}
	if r.NextNPredictors < 0 || r.NextNPredictors > 1 {
		return c, fmt.Errorf("num_nextn_predict_layers = %d, sluice supports 0 or 1 (the released checkpoints have 1)", r.NextNPredictors)
	}
	for i, t := range r.LayerTypes {
		if t != "deepseek_sparse_attention" {
			return c, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, t, NameDeepSeek)
		}
	}
	c.Hidden, c.Layers, c.Vocab = r.Hidden, r.Layers, r.Vocab
	c.Heads, c.KVHeads, c.HeadDim, c.RotaryDim = r.Heads, r.Heads, r.RopeDim, r.RopeDim
	c.RMSEps = 1e-6
	if r.RMSEps != nil {
		c.RMSEps = *r.RMSEps
	}
	c.MaxPos = r.MaxPos
	c.Experts, c.TopK, c.MoEInter = r.Experts, r.TopK, r.MoEInter
	c.SharedInter = r.MoEInter * r.SharedExperts
	c.NormTopK = r.NormTopK == nil || *r.NormTopK
	first := 3
	if r.FirstDense != nil {
		first = *r.FirstDense
	}
	if r.MLPLayerTypes != nil {
		first = 0
		for first < len(r.MLPLayerTypes) && r.MLPLayerTypes[first] == "dense" {
			first++
		}
		for i, t := range r.MLPLayerTypes {
			if (i < first) != (t == "dense") || (t != "dense" && t != "sparse") {
				return c, fmt.Errorf("mlp_layer_types[%d] = %q: only leading dense layers are supported", i, t)
			}
		}
	}
	c.FirstDense = min(first, c.Layers)
	c.MTPLayers = r.NextNPredictors
	for range c.Layers {
		c.LayerTypes = append(c.LayerTypes, format.FullAttention)
	}
	a := DeepSeekArch{QLora: *r.QLora, KVLora: r.KVLora, Nope: r.NopeDim, RopeDim: r.RopeDim, V: r.VDim, Inter: r.Inter,
		Groups: r.Groups, TopGroups: r.TopGroups, RoutedScale: 1, IndexTopK: r.IndexTopK, IndexHeads: r.IndexHeads, IndexHeadDim: r.IndexHeadDim}
	if r.RoutedScale != nil {
		a.RoutedScale = *r.RoutedScale
	}
	c.RopeTheta = 10000
	if r.RopeTheta != nil {
		c.RopeTheta = *r.RopeTheta
	}
	rp := r.RopeParameters
	if rp == nil {
		rp = r.RopeScaling
	}
	rt, _ := rp["rope_type"].(string)
	if rt == "" {
		rt, _ = rp["type"].(string)
	}
	switch rt {
	case "", "default":
		for k, v := range rp {
			switch k {
			case "rope_type", "type":
			case "rope_theta":
				f, ok := v.(float64)
				if !ok {
					return c, fmt.Errorf("rope_parameters.rope_theta = %v, want a number", v)
				}
				c.RopeTheta = f
			default:
				return c, fmt.Errorf("rope_parameters.%s is not supported with the default rope", k)
			}
		}
	case "yarn":
		y, err := parseYarn(r.RopeParameters, r.RopeScaling, r.RopeTheta, r.MaxPos, false)
		if err != nil {
			return c, err
		}
		a.Yarn, c.RopeTheta = &y, y.Theta
	default:
		return c, fmt.Errorf("rope_parameters.rope_type %q is not supported (want default or yarn)", rt)
	}
	var err error
	c.Arch, err = json.Marshal(a)
	return c, err
}

func buildDeepSeek(c *format.Config, t *block.Tensors) (*Arch, error) {
	var ac DeepSeekArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return nil, fmt.Errorf("deepseek_v32 arch config: %v", err)
	}
	H, nh := c.Hidden, c.Heads
	qk := ac.Nope + ac.RopeDim
	a := &Arch{Embed: t.Mat("embed_tokens.weight", c.Vocab, H)}
	scale := 1 / math.Sqrt(float64(qk))
	if y := ac.Yarn; y != nil {
		a.Rope = yarnRope(y, ac.RopeDim)
		if y.MscaleAllDim != 0 && y.Factor > 1 {
			m := float64(0.1*y.MscaleAllDim*math.Log(y.Factor)) + 1 // product rounded: the same on every CPU
			scale *= m * m
		}
	} else {
		a.Rope = defaultRope(c)
	}
	layer := func(l int) (block.Layer, block.StateSpec) {
		p := fmt.Sprintf("layers.%d.", l)
		L := block.Layer{In: rmsNorm(c, t.Vec(p+"input_layernorm.weight", H), false),
			Post: rmsNorm(c, t.Vec(p+"post_attention_layernorm.weight", H), false)}
		m := &block.MLA{Heads: nh, Nope: ac.Nope, RopeDim: ac.RopeDim, V: ac.V, KVLora: ac.KVLora, QLora: ac.QLora,
			Rope: &a.Rope, Scale: float32(scale)}
		q := p + "self_attn."
		m.QA = t.Mat(q+"q_a_proj.weight", ac.QLora, H)
		m.QANorm = rmsNorm(c, t.Vec(q+"q_a_layernorm.weight", ac.QLora), false)
		m.QB = t.Mat(q+"q_b_proj.weight", nh*qk, ac.QLora)
		m.KVA = t.Mat(q+"kv_a_proj_with_mqa.weight", ac.KVLora+ac.RopeDim, H)
		m.KVANorm = rmsNorm(c, t.Vec(q+"kv_a_layernorm.weight", ac.KVLora), false)
		if t.Has(q + "kv_b_proj.weight") {
			t.Fail(fmt.Errorf("%skv_b_proj.weight is packed whole, in float32, as earlier sluice versions did; this one reads it split into %s and %s at the pack's bits: repack the model with `sluice pack --force`", q, KBName(l), VBName(l)))
		}
		m.WK = t.Mat(KBName(l), nh*ac.KVLora, ac.Nope)
		m.WV = t.Mat(VBName(l), nh*ac.V, ac.KVLora)
		m.O = t.Mat(q+"o_proj.weight", H, nh*ac.V)
		if ac.IndexTopK > 0 {
			ix := &block.Indexer{Heads: ac.IndexHeads, Dim: ac.IndexHeadDim, TopK: ac.IndexTopK, Eps: 1e-6}
			ix.WQ = t.Mat(q+"indexer.wq_b.weight", ac.IndexHeads*ac.IndexHeadDim, ac.QLora)
			ix.WK = t.Mat(q+"indexer.wk.weight", ac.IndexHeadDim, H)
			ix.KNorm = t.Vec(q+"indexer.k_norm.weight", ac.IndexHeadDim)
			ix.KBias = t.Vec(q+"indexer.k_norm.bias", ac.IndexHeadDim)
			ix.Weights = t.F32(q+"indexer.weights_proj.weight", ac.IndexHeads, H)
			m.Index = ix
		}
		L.Mixer = m
		if l < c.FirstDense {
			L.FFN = swiGLU(t, p+"mlp.", ac.Inter, H)
		} else {
			L.FFN = groupedMoE(c, t, p, l, ac.Groups, ac.TopGroups, ac.RoutedScale)
		}
		iw, attend := 0, 0
		if m.Index != nil {
			iw, attend = ac.IndexHeadDim, m.Index.TopK
		}
		return L, block.StateSpec{Kind: block.Latent, KVWidth: ac.KVLora + ac.RopeDim, IndexWidth: iw, Attend: attend}
	}
	stack(c, t, a, layer)
	if c.MTPLayers > 0 {
		deepSeekMTP(c, t, a, layer)
	}
	return a, nil
}

// deepSeekMTP builds DeepSeek-V3's MTP module, stored as layer
// num_hidden_layers:
//
//	z = eh_proj([enorm(embed(t_{j+1})) ‖ hnorm(h_j)])
//	z = decoder_layer(z)   (MLA + MoE, its own latent cache)
//	logits = shared_head.head(shared_head.norm(z))
//
// h_j is the trunk's final-normed hidden state, as in the inference engines
// the module was released for (vLLM and SGLang feed it the main model's
// normed output), the same contract as qwen3_5_moe's head, so block.MTP and
// the engine's speculative path serve both. The module's embed_tokens and
// shared_head.head are copies of the trunk's (the technical report shares
// them), so the trunk's are used and the copies are not packed.
func deepSeekMTP(c *format.Config, t *block.Tensors, a *Arch, layer func(int) (block.Layer, block.StateSpec)) {
	H := c.Hidden
	p := fmt.Sprintf("layers.%d.", c.Layers)
	L, s := layer(c.Layers)
	a.MTP = &block.MTP{FC: t.Mat(p+"eh_proj.weight", H, 2*H),
		NormEmbed:  rmsNorm(c, t.Vec(p+"enorm.weight", H), false),
		NormHidden: rmsNorm(c, t.Vec(p+"hnorm.weight", H), false),
		Norm:       rmsNorm(c, t.Vec(p+"shared_head.norm.weight", H), false),
		Layer:      L}
	if moe := a.MTP.Layer.MoE(); moe != nil {
		moe.Pre = &a.MTP.Layer.Post
	}
	a.MTPState = s
}

// deepSeekDense de-interleaves the rope part of the query and latent
// projections once, at pack time: DeepSeek rotates pairs (x0, x1), (x2,
// x3)… and returns them as [even rotated ‖ odd rotated], which is the
// half-split rope of the rows reordered evens first. q and k get the same
// order, so every q·k is unchanged.
func deepSeekDense(src Checkpoint, c *format.Config, s format.Spec) ([]float32, error) {
	var ac DeepSeekArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return nil, err
	}
	if kb, vb := hasSuffix(s.Name, kbSuffix), hasSuffix(s.Name, vbSuffix); kb || vb {
		return splitKVB(src, c, &ac, s.Name, kb)
	}
	v, err := src.Float32(s.Name, s.Shape)
	if err != nil {
		return nil, err
	}
	cols := s.Shape[len(s.Shape)-1]
	deinterleave := func(row0 int) {
		rows := slices.Clone(v[row0*cols : (row0+ac.RopeDim)*cols])
		for j := 0; j < ac.RopeDim; j++ {
			dst := j/2 + (j%2)*(ac.RopeDim/2) // even j first, then odd
			copy(v[(row0+dst)*cols:(row0+dst+1)*cols], rows[j*cols:(j+1)*cols])
		}
	}
	switch {
	case hasSuffix(s.Name, "self_attn.q_b_proj.weight"):
		qk := ac.Nope + ac.RopeDim
		for h := 0; h < c.Heads; h++ {
			deinterleave(h*qk + ac.Nope)
		}
	case hasSuffix(s.Name, "self_attn.kv_a_proj_with_mqa.weight"):
		deinterleave(ac.KVLora)
	}
	return v, nil
}

// kv_b_proj's two parts as the pack holds them (block.MLA's WK and WV):
// not checkpoint tensors, the packer derives them from kv_b_proj.
const (
	kbSuffix = "self_attn.kv_b_proj.k_t.weight"
	vbSuffix = "self_attn.kv_b_proj.v.weight"
)

// KBName is the packed name of layer l's W_k, transposed per head
// ([heads·kv_lora][nope]); the MTP layer's is layer Layers.
func KBName(l int) string { return fmt.Sprintf("layers.%d.%s", l, kbSuffix) }

// VBName is the packed name of layer l's W_v ([heads·v][kv_lora]).
func VBName(l int) string { return fmt.Sprintf("layers.%d.%s", l, vbSuffix) }

// splitKVB reads kv_b_proj [heads·(nope+v)][kv_lora] of the layer that
// name belongs to and returns each head's W_k transposed ([kv_lora][nope]
// a head: kb) or its W_v rows ([v][kv_lora] a head).
func splitKVB(src Checkpoint, c *format.Config, ac *DeepSeekArch, name string, kb bool) ([]float32, error) {
	suf := vbSuffix
	if kb {
		suf = kbSuffix
	}
	whole := name[:len(name)-len(suf)] + "self_attn.kv_b_proj.weight"
	nh, kvl, nope, v := c.Heads, ac.KVLora, ac.Nope, ac.V
	w, err := src.Float32(whole, []int{nh * (nope + v), kvl})
	if err != nil {
		return nil, err
	}
	if !kb {
		out := make([]float32, 0, nh*v*kvl)
		for h := 0; h < nh; h++ {
			out = append(out, w[(h*(nope+v)+nope)*kvl:(h+1)*(nope+v)*kvl]...)
		}
		return out, nil
	}
	out := make([]float32, nh*kvl*nope)
	for h := 0; h < nh; h++ {
		for n := 0; n < nope; n++ {
			row := w[(h*(nope+v)+n)*kvl : (h*(nope+v)+n+1)*kvl]
			for j, x := range row {
				out[(h*kvl+j)*nope+n] = x
			}
		}
	}
	return out, nil
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

func describeDeepSeek(c *format.Config) []string {
	var ac DeepSeekArch
	json.Unmarshal(c.Arch, &ac)
	rope := fmt.Sprintf("default, theta %g", c.RopeTheta)
	if y := ac.Yarn; y != nil {
		rope = fmt.Sprintf("yarn: theta %g, factor %g, original %d", y.Theta, y.Factor, y.OrigMaxPos)
	}
	index, iw := "none: every row attends to every position", 0
	if ac.IndexTopK > 0 {
		index = fmt.Sprintf("%d heads of %d, each row attends to its top %d positions", ac.IndexHeads, ac.IndexHeadDim, ac.IndexTopK)
		iw = ac.IndexHeadDim
	}
	d := []string{
		fmt.Sprintf("attention      latent (MLA, absorbed): q_lora %d, kv_lora %d, nope %d + rope %d, v %d; cache %d floats a position",
			ac.QLora, ac.KVLora, ac.Nope, ac.RopeDim, ac.V, ac.KVLora+ac.RopeDim+iw),
		"indexer        " + index,
		"rope           " + rope,
		fmt.Sprintf("dense layers   %d leading (intermediate %d)", c.FirstDense, ac.Inter),
		fmt.Sprintf("router         sigmoid + correction bias, top-%d of %d groups, top-%d, scale %g", ac.TopGroups, ac.Groups, c.TopK, ac.RoutedScale),
		fmt.Sprintf("experts        SwiGLU, shared expert of %d", c.SharedInter),
	}
	if c.MTPLayers > 0 {
		d = append(d, "mtp            one layer (speculative drafts)")
	}
	return d
}

// deepSeekFP8 checks quantization_config: the releases' block-scaled FP8
// (float8_e4m3fn weights, a float32 weight_scale_inv per 128×128 block),
// which the packer dequantises exactly (package hf); anything else is
// refused. activation_scheme and scale_fmt describe how DeepSeek's own
// kernels quantise activations and round the scales they compute, which
// dequantising the stored weights does not involve.
func deepSeekFP8(q map[string]any) error {
	if q == nil {
		return nil
	}
	if m, _ := q["quant_method"].(string); m != "fp8" {
		return fmt.Errorf("quantization_config.quant_method %v is not supported (want fp8)", q["quant_method"])
	}
	bs, _ := q["weight_block_size"].([]any)
	if len(bs) != 2 || bs[0] != float64(128) || bs[1] != float64(128) {
		return fmt.Errorf("quantization_config.weight_block_size %v is not supported (want [128, 128])", q["weight_block_size"])
	}
	for k, v := range q {
		switch k {
		case "quant_method", "weight_block_size":
		case "fmt":
			if v != "e4m3" {
				return fmt.Errorf("quantization_config.fmt %v is not supported (want e4m3)", v)
			}
		case "activation_scheme":
			if v != "dynamic" {
				return fmt.Errorf("quantization_config.activation_scheme %v is not supported (want dynamic)", v)
			}
		case "scale_fmt":
			if v != nil && v != "ue8m0" {
				return fmt.Errorf("quantization_config.scale_fmt %v is not supported (want ue8m0 or none)", v)
			}
		default:
			return fmt.Errorf("quantization_config.%s is not supported", k)
		}
	}
	return nil
}
