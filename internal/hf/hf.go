// Package hf reads a Hugging Face checkpoint directory: config.json (flat or
// nested under text_config), generation_config.json, and sharded safetensors,
// and presents its tensors under the canonical names of format.DenseSpecs,
// whatever prefix or expert layout (per-expert or fused 3-D) it used. All
// checkpoint surgery happens here, once, for the packer.
package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/safetensors"
)

// Checkpoint is an opened Hugging Face model directory.
type Checkpoint struct {
	Dir    string
	Config format.Config
	ck     *safetensors.Checkpoint
	byName map[string]*safetensors.Tensor // canonical name → tensor
	fused  bool                           // experts stored as 3-D gate_up_proj / down_proj
}

// IsCheckpoint reports whether dir looks like a Hugging Face model directory.
func IsCheckpoint(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "config.json"))
	return err == nil
}

// rawConfig is config.json as written by transformers; pointer fields tell
// absent from zero.
type rawConfig struct {
	Architectures     []string         `json:"architectures"`
	ModelType         string           `json:"model_type"`
	TextConfig        *json.RawMessage `json:"text_config"`
	Hidden            int              `json:"hidden_size"`
	Layers            int              `json:"num_hidden_layers"`
	Vocab             int              `json:"vocab_size"`
	Heads             int              `json:"num_attention_heads"`
	KVHeads           int              `json:"num_key_value_heads"`
	HeadDim           int              `json:"head_dim"`
	RopeTheta         *float64         `json:"rope_theta"`
	PartialRotary     *float64         `json:"partial_rotary_factor"`
	RopeParameters    map[string]any   `json:"rope_parameters"`
	RopeScaling       map[string]any   `json:"rope_scaling"`
	RMSEps            float64          `json:"rms_norm_eps"`
	MaxPos            int              `json:"max_position_embeddings"`
	LayerTypes        []string         `json:"layer_types"`
	FullAttnInterval  int              `json:"full_attention_interval"`
	NumExperts        int              `json:"num_experts"`
	NumLocalExperts   int              `json:"num_local_experts"`
	TopK              int              `json:"num_experts_per_tok"`
	MoEInter          int              `json:"moe_intermediate_size"`
	SharedInter       int              `json:"shared_expert_intermediate_size"`
	NormTopK          *bool            `json:"norm_topk_prob"`
	DecoderSparseStep *int             `json:"decoder_sparse_step"`
	MLPOnlyLayers     []int            `json:"mlp_only_layers"`
	AttentionBias     bool             `json:"attention_bias"`
	HiddenAct         string           `json:"hidden_act"`
	TieEmbeddings     bool             `json:"tie_word_embeddings"`
	LinearKeyHeads    int              `json:"linear_num_key_heads"`
	LinearValueHeads  int              `json:"linear_num_value_heads"`
	LinearKeyDim      int              `json:"linear_key_head_dim"`
	LinearValueDim    int              `json:"linear_value_head_dim"`
	ConvKernel        int              `json:"linear_conv_kernel_dim"`
	MTPLayers         int              `json:"mtp_num_hidden_layers"`
	EOS               any              `json:"eos_token_id"`
}

// ReadConfig parses dir/config.json (and generation_config.json for the EOS
// ids) into the normalised configuration.
func ReadConfig(dir string) (format.Config, bool, error) {
	var c format.Config
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint: %v", err)
	}
	var top rawConfig
	if err := json.Unmarshal(b, &top); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	r := top
	if top.TextConfig != nil {
		r = rawConfig{}
		if err := json.Unmarshal(*top.TextConfig, &r); err != nil {
			return c, false, fmt.Errorf("checkpoint: %s: text_config: %v", p, err)
		}
		if r.EOS == nil {
			r.EOS = top.EOS
		}
		r.TieEmbeddings = r.TieEmbeddings || top.TieEmbeddings
	}
	mt := r.ModelType
	if mt == "" {
		mt = top.ModelType
	}
	switch mt {
	case "qwen3_moe":
		c.Family = format.FamilyQwen3MoE
	case "qwen3_5_moe", "qwen3_5_moe_text":
		c.Family = format.FamilyQwen35MoE
	default:
		return c, false, fmt.Errorf("checkpoint %s: model_type %q (architectures %v) is not supported: sluice runs qwen3_moe and qwen3_5_moe", dir, mt, top.Architectures)
	}
	if r.AttentionBias {
		return c, false, fmt.Errorf("checkpoint %s: attention_bias = true is not supported", dir)
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return c, false, fmt.Errorf("checkpoint %s: hidden_act %q is not supported (want silu)", dir, r.HiddenAct)
	}
	if len(r.MLPOnlyLayers) > 0 || (r.DecoderSparseStep != nil && *r.DecoderSparseStep != 1) {
		return c, false, fmt.Errorf("checkpoint %s: dense MLP layers (mlp_only_layers %v, decoder_sparse_step) are not supported", dir, r.MLPOnlyLayers)
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
			return c, false, fmt.Errorf("checkpoint %s: rope_type %q is not supported (want default)", dir, rt)
		}
	}
	c.RopeTheta = theta
	c.RotaryDim = int(float64(c.HeadDim) * partial)
	c.Experts = r.NumExperts
	if c.Experts == 0 {
		c.Experts = r.NumLocalExperts
	}
	c.TopK, c.MoEInter = r.TopK, r.MoEInter
	c.LayerTypes = r.LayerTypes
	switch c.Family {
	case format.FamilyQwen3MoE:
		c.NormTopK = r.NormTopK != nil && *r.NormTopK
		if c.LayerTypes == nil {
			for i := 0; i < c.Layers; i++ {
				c.LayerTypes = append(c.LayerTypes, format.FullAttention)
			}
		}
	case format.FamilyQwen35MoE:
		c.NormTopK = true // the qwen3_5_moe router always renormalises its top-k
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
	}
	c.EOS = eosIDs(r.EOS)
	if gb, err := os.ReadFile(filepath.Join(dir, "generation_config.json")); err == nil {
		var g struct {
			EOS any `json:"eos_token_id"`
		}
		if err := json.Unmarshal(gb, &g); err != nil {
			return c, false, fmt.Errorf("checkpoint %s: generation_config.json: %v", dir, err)
		}
		if ids := eosIDs(g.EOS); len(ids) > 0 {
			c.EOS = ids
		}
	}
	if err := c.Validate(); err != nil {
		return c, false, fmt.Errorf("checkpoint %s: %v", dir, err)
	}
	return c, r.TieEmbeddings, nil
}

func eosIDs(v any) []int {
	switch x := v.(type) {
	case float64:
		return []int{int(x)}
	case []any:
		var out []int
		for _, e := range x {
			if f, ok := e.(float64); ok {
				out = append(out, int(f))
			}
		}
		return out
	}
	return nil
}

var mtpLayer = regexp.MustCompile(`^mtp\.layers\.(\d+)\.`)

// Open reads the config and maps the safetensors of dir.
func Open(dir string) (*Checkpoint, error) {
	cfg, tie, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: dir, Config: cfg, ck: ck, byName: map[string]*safetensors.Tensor{}}
	hasMTP := false
	for name, t := range ck.Tensors {
		n := name
		switch {
		case strings.HasPrefix(n, "model.language_model."):
			n = strings.TrimPrefix(n, "model.language_model.")
		case strings.HasPrefix(n, "model.visual.") || strings.HasPrefix(n, "visual."):
			continue // the vision tower: text-only engine
		case strings.HasPrefix(n, "model."):
			n = strings.TrimPrefix(n, "model.")
		}
		if m := mtpLayer.FindStringSubmatch(n); m != nil {
			i, _ := strconv.Atoi(m[1])
			n = fmt.Sprintf("layers.%d.", cfg.Layers+i) + n[len(m[0]):]
		}
		if strings.HasPrefix(n, "mtp.") {
			hasMTP = true
		}
		if strings.HasSuffix(n, "mlp.experts.gate_up_proj") {
			c.fused = true
		}
		c.byName[n] = t
	}
	if cfg.MTPLayers > 0 && !hasMTP {
		// Config promises an MTP head the weights lack (some conversions drop
		// it): run without it rather than fail.
		c.Config.MTPLayers = 0
	}
	if emb, ok := c.byName["embed_tokens.weight"]; ok && tie {
		if _, ok := c.byName["lm_head.weight"]; !ok {
			c.byName["lm_head.weight"] = emb
		}
	}
	return c, nil
}

// Close unmaps the checkpoint.
func (c *Checkpoint) Close() error { return c.ck.Close() }

// Float32 returns the canonical tensor name converted to float32 after
// checking its shape.
func (c *Checkpoint) Float32(name string, shape []int) ([]float32, error) {
	t, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is missing", c.Dir, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, t.Shape, shape)
	}
	return t.Float32()
}

// Expert returns the gate [I][H], up [I][H] and down [H][I] matrices of
// expert e of layer l (the MTP layer is l = num_hidden_layers).
func (c *Checkpoint) Expert(l, e int) (gate, up, down []float32, err error) {
	cfg := &c.Config
	I, H := cfg.MoEInter, cfg.Hidden
	p := fmt.Sprintf("layers.%d.mlp.experts.", l)
	if t, ok := c.byName[p+"gate_up_proj"]; ok {
		if !slices.Equal(t.Shape, []int{cfg.Experts, 2 * I, H}) {
			return nil, nil, nil, fmt.Errorf("checkpoint %s: tensor %sgate_up_proj is %v, want %v", c.Dir, p, t.Shape, []int{cfg.Experts, 2 * I, H})
		}
		d, ok := c.byName[p+"down_proj"]
		if !ok {
			return nil, nil, nil, fmt.Errorf("checkpoint %s: tensor %sdown_proj is missing", c.Dir, p)
		}
		if !slices.Equal(d.Shape, []int{cfg.Experts, H, I}) {
			return nil, nil, nil, fmt.Errorf("checkpoint %s: tensor %sdown_proj is %v, want %v", c.Dir, p, d.Shape, []int{cfg.Experts, H, I})
		}
		es, esD := len(t.Data)/t.Elems(), len(d.Data)/d.Elems()
		gu := &safetensors.Tensor{Name: t.Name, DType: t.DType, Shape: []int{2 * I, H}, Data: t.Data[e*2*I*H*es : (e+1)*2*I*H*es]}
		all, err := gu.Float32()
		if err != nil {
			return nil, nil, nil, err
		}
		ds := &safetensors.Tensor{Name: d.Name, DType: d.DType, Shape: []int{H, I}, Data: d.Data[e*H*I*esD : (e+1)*H*I*esD]}
		down, err = ds.Float32()
		return all[:I*H], all[I*H:], down, err
	}
	ep := fmt.Sprintf("%s%d.", p, e)
	if gate, err = c.Float32(ep+"gate_proj.weight", []int{I, H}); err != nil {
		return
	}
	if up, err = c.Float32(ep+"up_proj.weight", []int{I, H}); err != nil {
		return
	}
	down, err = c.Float32(ep+"down_proj.weight", []int{H, I})
	return
}
