// Package hf reads a Hugging Face checkpoint directory: config.json (flat or
// nested under text_config), generation_config.json, and sharded safetensors,
// and presents its tensors under the canonical names of the family's tensor
// list, whatever prefix it used. Checkpoint surgery (expert layouts)
// happens once, for the packer, in the family's expert conversion.
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

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/safetensors"
)

// Checkpoint is an opened Hugging Face model directory.
type Checkpoint struct {
	Dir    string
	Config format.Config
	ck     *safetensors.Checkpoint
	byName map[string]*safetensors.Tensor // canonical name → tensor
	mlx    map[string]*mlxQuant           // canonical name → MLX-quantised weight
	shift  map[string]bool                // norm weights mlx-lm stored plus one
	// NoMTP is set when config.json declares an MTP layer the weights do
	// not carry: the checkpoint is read without it (Config.MTPLayers 0).
	NoMTP bool
}

// IsCheckpoint reports whether dir looks like a Hugging Face model directory.
func IsCheckpoint(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "config.json"))
	return err == nil
}

// topConfig is the part of config.json hf itself reads: the nesting, the
// model type, the EOS ids and the embedding tie. Everything else belongs to
// the family (package family).
type topConfig struct {
	Architectures []string         `json:"architectures"`
	ModelType     string           `json:"model_type"`
	TextConfig    *json.RawMessage `json:"text_config"`
	TieEmbeddings bool             `json:"tie_word_embeddings"`
	EOS           any              `json:"eos_token_id"`
}

// ReadConfig parses dir/config.json (and generation_config.json for the EOS
// ids) into the normalised configuration, through the family its
// model_type names.
func ReadConfig(dir string) (format.Config, bool, error) {
	var c format.Config
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint: %v", err)
	}
	var top topConfig
	if err := json.Unmarshal(b, &top); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	r, raw := top, []byte(b)
	if top.TextConfig != nil {
		raw = *top.TextConfig
		r = topConfig{}
		if err := json.Unmarshal(raw, &r); err != nil {
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
	f, err := family.Lookup(mt)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint %s: %v (architectures %v)", dir, err, top.Architectures)
	}
	if c, err = f.Parse(raw); err != nil {
		return c, false, fmt.Errorf("checkpoint %s: %v", dir, err)
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
	c := &Checkpoint{Dir: dir, Config: cfg, ck: ck, byName: map[string]*safetensors.Tensor{},
		mlx: map[string]*mlxQuant{}, shift: map[string]bool{}}
	hasMTP := false
	for name, t := range ck.Tensors {
		n := name
		switch {
		case strings.HasPrefix(n, "language_model.model."): // mlx-lm's Qwen3.5
			n = strings.TrimPrefix(n, "language_model.model.")
		case strings.HasPrefix(n, "language_model."):
			n = strings.TrimPrefix(n, "language_model.")
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
		if strings.HasPrefix(n, "mtp.") || strings.HasPrefix(n, fmt.Sprintf("layers.%d.", cfg.Layers)) {
			hasMTP = true // Qwen3.5's mtp.*, or DeepSeek-V3's layer num_hidden_layers
		}
		c.byName[n] = t
	}
	if err := c.bindMLX(); err != nil {
		ck.Close()
		return nil, err
	}
	if cfg.Family == family.NameQwen3Next && cfg.MTPLayers == 0 && hasMTP {
		// transformers drops Qwen3-Next's mtp.* on load and the hub's
		// config.json does not count the head: the weights say it is there.
		c.Config.MTPLayers = 1
	}
	if cfg.MTPLayers > 0 && !hasMTP {
		// Config promises an MTP head the weights lack (some conversions drop
		// it): run without it rather than fail.
		c.Config.MTPLayers, c.NoMTP = 0, true
	}
	if emb, ok := c.byName["embed_tokens.weight"]; ok && tie {
		if _, ok := c.byName["lm_head.weight"]; !ok {
			c.byName["lm_head.weight"] = emb
			if q := c.mlx["embed_tokens.weight"]; q != nil {
				c.mlx["lm_head.weight"] = q
			}
		}
	}
	return c, nil
}

// Close unmaps the checkpoint.
func (c *Checkpoint) Close() error { return c.ck.Close() }

// Float32 returns the canonical tensor name converted to float32 after
// checking its shape.
func (c *Checkpoint) Float32(name string, shape []int) ([]float32, error) {
	if q := c.mlx[name]; q != nil {
		if !slices.Equal(q.shape, shape) {
			return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, q.shape, shape)
		}
		return q.dequant(-1), nil
	}
	t, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is missing", c.Dir, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, t.Shape, shape)
	}
	var v []float32
	var err error
	if isFP8(t) {
		v, err = c.fp8Float32(name, t) // fp8.go
	} else {
		v, err = t.Float32()
	}
	if err == nil && c.shift[name] {
		for i := range v {
			v[i]--
		}
	}
	return v, err
}

// Has reports whether the checkpoint holds the canonical tensor name.
func (c *Checkpoint) Has(name string) bool {
	_, ok := c.byName[name]
	return ok
}

// Slice returns sub-tensor i of the first dimension of the canonical
// tensor name, converted to float32, after checking its full shape.
func (c *Checkpoint) Slice(name string, shape []int, i int) ([]float32, error) {
	if q := c.mlx[name]; q != nil {
		if !slices.Equal(q.shape, shape) {
			return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, q.shape, shape)
		}
		if i < 0 || i >= shape[0] {
			return nil, fmt.Errorf("checkpoint %s: tensor %s has no slice %d", c.Dir, name, i)
		}
		return q.dequant(i), nil
	}
	t, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is missing", c.Dir, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, t.Shape, shape)
	}
	if i < 0 || i >= shape[0] {
		return nil, fmt.Errorf("checkpoint %s: tensor %s has no slice %d", c.Dir, name, i)
	}
	if isFP8(t) {
		return nil, fmt.Errorf("checkpoint %s: tensor %s: %s in a %d-dimensional tensor is not supported (block-scaled FP8 weights are matrices)", c.Dir, name, t.DType, len(shape))
	}
	n := t.Elems() / shape[0]
	es := len(t.Data) / t.Elems()
	sub := &safetensors.Tensor{Name: t.Name, DType: t.DType, Shape: shape[1:], Data: t.Data[i*n*es : (i+1)*n*es]}
	return sub.Float32()
}

// Raw returns sub-tensor i of the first dimension of the canonical tensor
// name as stored, with its dtype, after checking its full shape.
func (c *Checkpoint) Raw(name string, shape []int, i int) (string, []byte, error) {
	if c.mlx[name] != nil {
		return "", nil, fmt.Errorf("checkpoint %s: tensor %s is MLX-quantised, not in the layout this family converts", c.Dir, name)
	}
	t, ok := c.byName[name]
	if !ok {
		return "", nil, fmt.Errorf("checkpoint %s: tensor %s is missing", c.Dir, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return "", nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, t.Shape, shape)
	}
	if i < 0 || i >= shape[0] || len(t.Data)%shape[0] != 0 {
		return "", nil, fmt.Errorf("checkpoint %s: tensor %s has no slice %d", c.Dir, name, i)
	}
	n := len(t.Data) / shape[0]
	return t.DType, t.Data[i*n : (i+1)*n], nil
}

// Expert returns the gate [I][H], up [I][H] and down [H][I] matrices of
// expert e of layer l (the MTP layer is l = num_hidden_layers), converted
// by the family from the checkpoint's layout.
func (c *Checkpoint) Expert(l, e int) (gate, up, down []float32, err error) {
	x, err := c.ExpertFull(l, e)
	return x.Gate, x.Up, x.Down, err
}

// ExpertFull is Expert with the biases of families that have them.
func (c *Checkpoint) ExpertFull(l, e int) (family.Expert, error) {
	if x, ok, err := c.switchExpert(l, e); ok {
		return x, err
	}
	return family.ExpertOf(c, &c.Config, l, e)
}
