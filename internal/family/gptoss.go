package family

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// NameGPTOSS is gpt_oss: attention with q/k/v/o biases and per-head sinks,
// sliding-window layers alternating with full ones, YaRN rope, a router
// with a bias and a softmax over its top-k logits, and experts with biases
// and a clamped SwiGLU.
const NameGPTOSS = "gpt_oss"

var gptOSS = Family{
	Name:       NameGPTOSS,
	ModelTypes: []string{"gpt_oss"},
	Parse:      parseGPTOSS,
	Build:      buildGPTOSS,
	Expert:     gptOSSExpert,
	Describe:   describeGPTOSS,
}

func describeGPTOSS(c *format.Config) []string {
	var ac GPTOSSArch
	json.Unmarshal(c.Arch, &ac)
	y := &ac.Rope
	r := yarnRope(y, c.HeadDim)
	return []string{
		fmt.Sprintf("attention      grouped-query, q/k/v/o biases, a sink per head, window %d on sliding_attention layers (KV ring of window + batch rows)", c.SlidingWindow),
		fmt.Sprintf("rope           yarn: theta %g, factor %g, original %d, beta %g/%g, truncate %v; attention factor %.4f",
			y.Theta, y.Factor, y.OrigMaxPos, y.BetaFast, y.BetaSlow, y.Truncate, r.Scale),
		fmt.Sprintf("router         biased logits, softmax over the top-%d", c.TopK),
		"experts        biases, clamped SwiGLU (alpha 1.702, limit 7, (up+1))",
	}
}

// gptOSSConfig is config.json of gpt_oss (transformers' GptOssConfig and
// the original release's keys).
type gptOSSConfig struct {
	Hidden          int            `json:"hidden_size"`
	Layers          int            `json:"num_hidden_layers"`
	Vocab           int            `json:"vocab_size"`
	Heads           int            `json:"num_attention_heads"`
	KVHeads         int            `json:"num_key_value_heads"`
	HeadDim         int            `json:"head_dim"`
	Inter           int            `json:"intermediate_size"`
	Quantization    map[string]any `json:"quantization_config"`
	Experts         int            `json:"num_local_experts"`
	TopK            int            `json:"num_experts_per_tok"`
	ExpertsPerToken int            `json:"experts_per_token"`
	SlidingWindow   *int           `json:"sliding_window"`
	LayerTypes      []string       `json:"layer_types"`
	RMSEps          *float64       `json:"rms_norm_eps"`
	MaxPos          int            `json:"max_position_embeddings"`
	RopeTheta       *float64       `json:"rope_theta"`
	RopeParameters  map[string]any `json:"rope_parameters"`
	RopeScaling     map[string]any `json:"rope_scaling"`
	AttentionBias   *bool          `json:"attention_bias"`
	HiddenAct       string         `json:"hidden_act"`
	SwigluLimit     *float64       `json:"swiglu_limit"`
}

// gptOSSKeys are the config.json keys gpt_oss understands; any other is
// refused by name. The ones not in gptOSSConfig change nothing at
// inference (training settings, token ids read elsewhere, bookkeeping).
var gptOSSKeys = []string{
	"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
	"intermediate_size", "num_local_experts", "num_experts_per_tok", "experts_per_token", "sliding_window",
	"layer_types", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling",
	"attention_bias", "hidden_act", "swiglu_limit", "quantization_config",
	"model_type", "architectures", "tie_word_embeddings", "eos_token_id", "bos_token_id", "pad_token_id",
	"attention_dropout", "initializer_range", "router_aux_loss_coef", "output_router_logits", "use_cache",
	"transformers_version", "dtype", "torch_dtype", "initial_context_length",
}

// Yarn is the YaRN rope as transformers computes it
// (_compute_yarn_parameters), kept in the manifest's arch config.
type Yarn struct {
	Theta           float64  `json:"rope_theta"`
	Factor          float64  `json:"factor"`
	OrigMaxPos      int      `json:"original_max_position_embeddings"`
	BetaFast        float64  `json:"beta_fast"`
	BetaSlow        float64  `json:"beta_slow"`
	Truncate        bool     `json:"truncate"`
	AttentionFactor *float64 `json:"attention_factor,omitempty"`
	Mscale          float64  `json:"mscale,omitempty"`
	MscaleAllDim    float64  `json:"mscale_all_dim,omitempty"`
}

// GPTOSSArch is what gpt_oss keeps beyond format.Config (the JSON of its
// Config.Arch; the GGUF writer reads it too).
type GPTOSSArch struct {
	Rope Yarn `json:"rope"`
}

// yarnKeys are the rope_parameters keys the YaRN rope implements.
var yarnKeys = []string{"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
	"beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"}

func parseGPTOSS(raw []byte) (format.Config, error) {
	c := format.Config{Family: NameGPTOSS}
	if err := strictKeys("gpt_oss config", raw, gptOSSKeys...); err != nil {
		return c, err
	}
	var r gptOSSConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return c, err
	}
	if q := r.Quantization; q != nil {
		// MXFP4 experts (the release's checkpoints) are dequantised by
		// the packer, exactly; any other quantisation is refused.
		if m, _ := q["quant_method"].(string); m != "mxfp4" {
			return c, fmt.Errorf("quantization_config.quant_method %q is not supported (want mxfp4)", q["quant_method"])
		}
		for k := range q {
			if k != "quant_method" && k != "modules_to_not_convert" {
				return c, fmt.Errorf("quantization_config.%s is not supported", k)
			}
		}
	}
	if r.AttentionBias != nil && !*r.AttentionBias {
		return c, fmt.Errorf("attention_bias = false is not supported by %s", NameGPTOSS)
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return c, fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	}
	if r.SwigluLimit != nil && *r.SwigluLimit != 7 {
		return c, fmt.Errorf("swiglu_limit = %v is not supported (the clamp is 7)", *r.SwigluLimit)
	}
	c.Hidden, c.Layers, c.Vocab = r.Hidden, r.Layers, r.Vocab
	c.Heads, c.KVHeads, c.HeadDim = r.Heads, r.KVHeads, r.HeadDim
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	c.RMSEps = 1e-5
	if r.RMSEps != nil {
		c.RMSEps = *r.RMSEps
	}
	c.MaxPos = r.MaxPos
	c.Experts, c.TopK, c.MoEInter = r.Experts, r.TopK, r.Inter
	if c.TopK == 0 {
		c.TopK = r.ExpertsPerToken
	}
	c.ExpertBias = true
	c.SlidingWindow = 128
	if r.SlidingWindow != nil {
		c.SlidingWindow = *r.SlidingWindow
	}
	c.LayerTypes = r.LayerTypes
	if c.LayerTypes == nil {
		for i := 0; i < c.Layers; i++ {
			t := format.FullAttention
			if i%2 == 0 {
				t = format.SlidingAttention
			}
			c.LayerTypes = append(c.LayerTypes, t)
		}
	}
	for i, t := range c.LayerTypes {
		if t != format.FullAttention && t != format.SlidingAttention {
			return c, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, t, NameGPTOSS)
		}
	}
	if slices.Contains(c.LayerTypes, format.SlidingAttention) && c.SlidingWindow <= 0 {
		return c, fmt.Errorf("sliding_window = %d, want > 0", c.SlidingWindow)
	}
	y, err := parseYarn(r.RopeParameters, r.RopeScaling, r.RopeTheta, r.MaxPos, true)
	if err != nil {
		return c, err
	}
	c.RopeTheta, c.RotaryDim = y.Theta, c.HeadDim
	if c.Arch, err = json.Marshal(GPTOSSArch{Rope: y}); err != nil {
		return c, err
	}
	return c, nil
}

// parseYarn reads rope_parameters (or the older rope_scaling), refusing
// any rope but YaRN and any key YaRN does not implement. gptOSS supplies
// GptOssConfig's defaults (theta 150000, the release's YaRN) for what the
// config leaves out.
func parseYarn(params, scaling map[string]any, theta *float64, maxPos int, gptOSS bool) (Yarn, error) {
	y := Yarn{Theta: 10000, BetaFast: 32, BetaSlow: 1, Truncate: true}
	if gptOSS {
		y.Theta = 150000
	}
	if theta != nil {
		y.Theta = *theta
	}
	rp := params
	if rp == nil {
		rp = scaling
	}
	if rp == nil && gptOSS {
		// transformers' GptOssConfig default.
		rp = map[string]any{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
			"truncate": false, "original_max_position_embeddings": 4096.0}
	}
	for k := range rp {
		if !slices.Contains(yarnKeys, k) {
			return y, fmt.Errorf("rope_parameters.%s is not supported", k)
		}
	}
	rt, _ := rp["rope_type"].(string)
	if rt == "" {
		rt, _ = rp["type"].(string)
	}
	if rt != "yarn" {
		return y, fmt.Errorf("rope_parameters.rope_type %q is not supported (want yarn)", rt)
	}
	num := func(k string, dst *float64) error {
		v, ok := rp[k]
		if !ok || v == nil {
			return nil
		}
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("rope_parameters.%s = %v, want a number", k, v)
		}
		*dst = f
		return nil
	}
	var orig float64
	for _, kv := range []struct {
		k string
		d *float64
	}{{"rope_theta", &y.Theta}, {"factor", &y.Factor}, {"beta_fast", &y.BetaFast}, {"beta_slow", &y.BetaSlow},
		{"original_max_position_embeddings", &orig}, {"mscale", &y.Mscale}, {"mscale_all_dim", &y.MscaleAllDim}} {
		if err := num(kv.k, kv.d); err != nil {
			return y, err
		}
	}
	if v, ok := rp["attention_factor"]; ok && v != nil {
		var af float64
		if err := num("attention_factor", &af); err != nil {
			return y, err
		}
		y.AttentionFactor = &af
	}
	if v, ok := rp["truncate"]; ok {
		b, ok := v.(bool)
		if !ok {
			return y, fmt.Errorf("rope_parameters.truncate = %v, want a boolean", v)
		}
		y.Truncate = b
	}
	y.OrigMaxPos = int(orig)
	if y.OrigMaxPos <= 0 {
		y.OrigMaxPos = maxPos
	}
	if y.Factor <= 0 && y.OrigMaxPos > 0 {
		y.Factor = float64(maxPos) / float64(y.OrigMaxPos)
	}
	if y.Factor <= 0 || y.OrigMaxPos <= 0 || y.Theta <= 0 {
		return y, fmt.Errorf("rope_parameters: yarn needs factor, original_max_position_embeddings and rope_theta > 0")
	}
	// transformers versions differ on whether factor or
	// max_position_embeddings / original_max_position_embeddings scales
	// the attention: refuse configs where the two disagree.
	if maxPos > 0 && math.Abs(float64(maxPos)/float64(y.OrigMaxPos)-y.Factor) > 1e-9 {
		return y, fmt.Errorf("rope_parameters.factor %v disagrees with max_position_embeddings / original_max_position_embeddings = %d / %d",
			y.Factor, maxPos, y.OrigMaxPos)
	}
	return y, nil
}

// yarnRope computes inv_freq and the attention factor as transformers'
// _compute_yarn_parameters does, in float32 where it uses float32.
func yarnRope(y *Yarn, dim int) block.Rope {
	mscale := func(scale, m float64) float64 {
		if scale <= 1 {
			return 1
		}
		return float64(0.1*m*math.Log(scale)) + 1 // the product rounded, as Python does (Go would fuse it on arm64)
	}
	af := mscale(y.Factor, 1)
	switch {
	case y.AttentionFactor != nil:
		af = *y.AttentionFactor
	case y.Mscale != 0 && y.MscaleAllDim != 0:
		af = mscale(y.Factor, y.Mscale) / mscale(y.Factor, y.MscaleAllDim)
	}
	corr := func(rot float64) float64 {
		return float64(dim) * math.Log(float64(y.OrigMaxPos)/(rot*2*math.Pi)) / (2 * math.Log(y.Theta))
	}
	low, high := corr(y.BetaFast), corr(y.BetaSlow)
	if y.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(dim-1))
	if low == high {
		high += 0.001 // transformers' guard against a zero-width ramp
	}
	inv := make([]float32, dim/2)
	for i := range inv {
		pos := float32(math.Pow(y.Theta, float64(float32(2*i)/float32(dim))))
		ext := 1 / pos
		itp := 1 / (float32(y.Factor) * pos)
		ramp := (float32(i) - float32(low)) / float32(high-low)
		ramp = min(max(ramp, 0), 1)
		ef := 1 - ramp
		inv[i] = float32(itp*(1-ef)) + float32(ext*ef) // rounded products, as torch computes it, on every CPU
	}
	return block.Rope{Dim: dim, InvFreq: inv, Scale: float32(af)}
}

func buildGPTOSS(c *format.Config, t *block.Tensors) (*Arch, error) {
	var ac GPTOSSArch
	if err := json.Unmarshal(c.Arch, &ac); err != nil {
		return nil, fmt.Errorf("gpt_oss arch config: %v", err)
	}
	H, hd := c.Hidden, c.HeadDim
	a := &Arch{Embed: t.Mat("embed_tokens.weight", c.Vocab, H), Rope: yarnRope(&ac.Rope, hd)}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		L := block.Layer{In: rmsNorm(c, t.Vec(p+"input_layernorm.weight", H), false),
			Post: rmsNorm(c, t.Vec(p+"post_attention_layernorm.weight", H), false)}
		at := &block.Attn{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: hd, Rope: &a.Rope,
			Scale: float32(1 / math.Sqrt(float64(hd)))}
		at.Q = t.Mat(p+"self_attn.q_proj.weight", c.Heads*hd, H)
		at.QB = t.Vec(p+"self_attn.q_proj.bias", c.Heads*hd)
		at.K = t.Mat(p+"self_attn.k_proj.weight", c.KVHeads*hd, H)
		at.KB = t.Vec(p+"self_attn.k_proj.bias", c.KVHeads*hd)
		at.V = t.Mat(p+"self_attn.v_proj.weight", c.KVHeads*hd, H)
		at.VB = t.Vec(p+"self_attn.v_proj.bias", c.KVHeads*hd)
		at.O = t.Mat(p+"self_attn.o_proj.weight", H, c.Heads*hd)
		at.OB = t.Vec(p+"self_attn.o_proj.bias", H)
		at.Sinks = t.Vec(p+"self_attn.sinks", c.Heads)
		st := block.StateSpec{Kind: block.KV, KVWidth: c.KVHeads * hd}
		if c.LayerTypes[l] == format.SlidingAttention {
			at.Window = c.SlidingWindow
			st.Kind, st.Window = block.Ring, c.SlidingWindow
		}
		L.Mixer = at
		L.FFN = &block.MoE{Layer: l, Score: block.TopKSoftmax, Act: block.ClampedSwiGLU,
			Router:     t.F32(p+"mlp.router.weight", c.Experts, H),
			RouterBias: t.Vec(p+"mlp.router.bias", c.Experts)}
		a.Layers = append(a.Layers, L)
		a.States = append(a.States, st)
	}
	linkPre(a.Layers)
	a.Norm = rmsNorm(c, t.Vec("norm.weight", H), false)
	a.LMHead = t.Mat("lm_head.weight", c.Vocab, H)
	return a, nil
}

// gptOSSExpert converts one expert of the fused checkpoint layout:
// gate_up_proj [E][hidden][2·inter] with gate and up interleaved along the
// last dimension (even channels gate, odd up), down_proj [E][inter][hidden]
// (both transposed against sluice's [out][in]), and their biases.
func gptOSSExpert(src Checkpoint, c *format.Config, l, e int) (Expert, error) {
	I, H, E := c.MoEInter, c.Hidden, c.Experts
	p := fmt.Sprintf("layers.%d.mlp.experts.", l)
	var x Expert
	if src.Has(p + "gate_up_proj_blocks") {
		return gptOSSMXFP4Expert(src, c, l, e)
	}
	gu, err := src.Slice(p+"gate_up_proj", []int{E, H, 2 * I}, e)
	if err != nil {
		return x, err
	}
	gub, err := src.Slice(p+"gate_up_proj_bias", []int{E, 2 * I}, e)
	if err != nil {
		return x, err
	}
	down, err := src.Slice(p+"down_proj", []int{E, I, H}, e)
	if err != nil {
		return x, err
	}
	if x.DownBias, err = src.Slice(p+"down_proj_bias", []int{E, H}, e); err != nil {
		return x, err
	}
	x.Gate, x.Up = make([]float32, I*H), make([]float32, I*H)
	x.GateBias, x.UpBias = make([]float32, I), make([]float32, I)
	for i := 0; i < I; i++ {
		for h := 0; h < H; h++ {
			x.Gate[i*H+h] = gu[h*2*I+2*i]
			x.Up[i*H+h] = gu[h*2*I+2*i+1]
		}
		x.GateBias[i], x.UpBias[i] = gub[2*i], gub[2*i+1]
	}
	x.Down = make([]float32, H*I)
	for i := 0; i < I; i++ {
		for h := 0; h < H; h++ {
			x.Down[h*I+i] = down[i*H+h]
		}
	}
	return x, nil
}

// fp4 are the E2M1 values of MXFP4's 4-bit codes.
var fp4 = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// mxfp4Rows dequantises MXFP4 rows: blocks [rows][cols/32][16] bytes (two
// codes a byte, the low nibble first) and scales [rows][cols/32] (E8M0,
// 2^(s−127)), as transformers' convert_moe_packed_tensors reads them. Every
// value is exact in float32.
func mxfp4Rows(blocks, scales []byte, rows, cols int) ([]float32, error) {
	if cols%32 != 0 || len(blocks) != rows*cols/2 || len(scales) != rows*cols/32 {
		return nil, fmt.Errorf("mxfp4: %d block and %d scale bytes for [%d][%d]", len(blocks), len(scales), rows, cols)
	}
	out := make([]float32, rows*cols)
	for g, s := range scales {
		m := float32(math.Ldexp(1, int(s)-127))
		for k, b := range blocks[g*16 : (g+1)*16] {
			out[g*32+2*k] = fp4[b&15] * m
			out[g*32+2*k+1] = fp4[b>>4] * m
		}
	}
	return out, nil
}

// gptOSSMXFP4Expert converts one expert of the release's MXFP4 layout:
// gate_up_proj_blocks [E][2·inter][hidden/32][16] and _scales (rows
// interleaved gate, up), down_proj_blocks [E][hidden][inter/32][16] and
// _scales, already [out][in]; the biases as in the bf16 layout.
func gptOSSMXFP4Expert(src Checkpoint, c *format.Config, l, e int) (Expert, error) {
	I, H, E := c.MoEInter, c.Hidden, c.Experts
	p := fmt.Sprintf("layers.%d.mlp.experts.", l)
	var x Expert
	read := func(proj string, rows, cols int) ([]float32, error) {
		bt, b, err := src.Raw(p+proj+"_blocks", []int{E, rows, cols / 32, 16}, e)
		if err != nil {
			return nil, err
		}
		st, s, err := src.Raw(p+proj+"_scales", []int{E, rows, cols / 32}, e)
		if err != nil {
			return nil, err
		}
		if bt != "U8" || st != "U8" {
			return nil, fmt.Errorf("%s%s_blocks/_scales are %s/%s, want U8", p, proj, bt, st)
		}
		return mxfp4Rows(b, s, rows, cols)
	}
	gu, err := read("gate_up_proj", 2*I, H)
	if err != nil {
		return x, err
	}
	if x.Down, err = read("down_proj", H, I); err != nil {
		return x, err
	}
	gub, err := src.Slice(p+"gate_up_proj_bias", []int{E, 2 * I}, e)
	if err != nil {
		return x, err
	}
	if x.DownBias, err = src.Slice(p+"down_proj_bias", []int{E, H}, e); err != nil {
		return x, err
	}
	x.Gate, x.Up = make([]float32, I*H), make([]float32, I*H)
	x.GateBias, x.UpBias = make([]float32, I), make([]float32, I)
	for i := 0; i < I; i++ {
		copy(x.Gate[i*H:(i+1)*H], gu[2*i*H:(2*i+1)*H])
		copy(x.Up[i*H:(i+1)*H], gu[(2*i+1)*H:(2*i+2)*H])
		x.GateBias[i], x.UpBias[i] = gub[2*i], gub[2*i+1]
	}
	return x, nil
}

// MXFP4Experts reports whether the checkpoint's routed experts are MXFP4
// (gpt-oss's release layout, *_blocks and *_scales), which the packer can
// keep as format.MXFP4 records without loss.
func MXFP4Experts(src Checkpoint, c *format.Config) bool {
	return c.Family == NameGPTOSS && src.Has(fmt.Sprintf("layers.%d.mlp.experts.gate_up_proj_blocks", c.FirstDense))
}
