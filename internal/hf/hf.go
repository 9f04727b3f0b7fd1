// Package hf reads a Hugging Face checkpoint directory: config.json (flat or
// nested under text_config), generation_config.json, and sharded safetensors,
// and presents its tensors under the canonical names of the family's tensor
// list, whatever prefix it used. Checkpoint surgery (expert layouts)
// happens once, for the packer, in the family's expert conversion.
package hf

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

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

	usedMu sync.Mutex
	used   map[string]bool // canonical names whose data was read (see Unused)
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
// model_type names. Every error names the file and the key at fault.
func ReadConfig(dir string) (format.Config, bool, error) {
	var c format.Config
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint: %v", err)
	}
	keys, err := object(b)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	var top topConfig
	if err := json.Unmarshal(b, &top); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	r, raw := top, []byte(b)
	if top.TextConfig != nil {
		raw = *top.TextConfig
		if keys, err = object(raw); err != nil {
			return c, false, fmt.Errorf("checkpoint: %s: text_config: %v", p, err)
		}
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
	if mt == "" {
		return c, false, fmt.Errorf("checkpoint: %s: no model_type (architectures %v): cannot tell the model family", p, top.Architectures)
	}
	f, err := family.Lookup(mt)
	if err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v (architectures %v)", p, err, top.Architectures)
	}
	// Before the family parses: it allocates per layer from these numbers,
	// and a corrupt num_hidden_layers must not be a huge allocation.
	if err := checkSizes(keys); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	if c, err = f.Parse(raw); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	if c.EOS, err = eosIDs(r.EOS); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	eosFrom := p
	gp := filepath.Join(dir, "generation_config.json")
	if gb, err := os.ReadFile(gp); err == nil {
		var g struct {
			EOS any `json:"eos_token_id"`
		}
		if err := json.Unmarshal(gb, &g); err != nil {
			return c, false, fmt.Errorf("checkpoint: %s: %v", gp, err)
		}
		ids, err := eosIDs(g.EOS)
		if err != nil {
			return c, false, fmt.Errorf("checkpoint: %s: %v", gp, err)
		}
		if len(ids) > 0 {
			c.EOS, eosFrom = ids, gp
		}
	}
	// Here rather than in Validate, to name the file and key the id came
	// from.
	for _, id := range c.EOS {
		if id >= c.Vocab && c.Vocab > 0 {
			return c, false, fmt.Errorf("checkpoint: %s: eos_token_id %d is outside the vocabulary [0, %d)", eosFrom, id, c.Vocab)
		}
	}
	// Before Validate, whose rotary-dim message would blame the truncated
	// head_dim rather than its cause.
	if err := checkHeadDim(keys, &c); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	if err := c.Validate(); err != nil {
		return c, false, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	return c, r.TieEmbeddings, nil
}

// object returns the keys of a config that must be a JSON object, their
// values undecoded, for the checks below; null decodes into an empty
// struct without error and would surface as a confusing "model_type is
// missing", so it is refused here.
func object(b []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if m == nil {
		return nil, fmt.Errorf("not a JSON object (null)")
	}
	return m, nil
}

// sizeKey is a config.json size that must be an integer in [min, max]
// when present.
type sizeKey struct {
	name     string
	min, max int64
	nullOK   bool // transformers reads null as "derive it" (head_dim, KV heads)
}

// maxDim bounds every size: far above any released model (vocabularies
// are below 2^18, hidden sizes below 2^15), low enough that nothing sized
// from it before the tensors are checked can exhaust memory.
const maxDim = 1 << 24

// sizeKeys are the sizes of every family's config.json. A family copies
// them into format.Config and may allocate from them (one entry per
// layer) before Validate runs; json.Unmarshal reads null as "absent".
var sizeKeys = []sizeKey{
	{name: "hidden_size", min: 1, max: maxDim},
	{name: "num_hidden_layers", min: 1, max: 1 << 16},
	{name: "num_attention_heads", min: 1, max: maxDim},
	{name: "num_key_value_heads", min: 1, max: maxDim, nullOK: true},
	{name: "head_dim", min: 1, max: maxDim, nullOK: true},
	{name: "vocab_size", min: 1, max: maxDim},
	{name: "num_experts", min: 1, max: 1 << 16},
	{name: "num_local_experts", min: 1, max: 1 << 16},
	{name: "n_routed_experts", min: 1, max: 1 << 16},
	{name: "num_experts_per_tok", min: 1, max: 1 << 16},
	{name: "experts_per_token", min: 1, max: 1 << 16},
	{name: "moe_intermediate_size", min: 1, max: maxDim},
	{name: "intermediate_size", min: 1, max: maxDim},
	{name: "shared_expert_intermediate_size", min: 0, max: maxDim},
}

// checkSizes checks the sizes among the config's keys m: each present one
// an integer within its bounds, so that zero, negative, fractional, string
// or absurd values are an error naming the key rather than a wrong
// division, a silent default or a huge allocation later.
func checkSizes(m map[string]json.RawMessage) error {
	for _, k := range sizeKeys {
		v, ok := m[k.name]
		if !ok {
			continue
		}
		if string(v) == "null" {
			if k.nullOK {
				continue
			}
			return fmt.Errorf("%s is null, want an integer ≥ %d", k.name, k.min)
		}
		// json.Number also takes a quoted number; a string is refused.
		var num json.Number
		if len(v) == 0 || v[0] == '"' || json.Unmarshal(v, &num) != nil {
			return fmt.Errorf("%s = %s, want an integer ≥ %d", k.name, v, k.min)
		}
		n, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil {
			return fmt.Errorf("%s = %s, want an integer ≥ %d", k.name, v, k.min)
		}
		if n < k.min || n > k.max {
			return fmt.Errorf("%s = %d, want %d ≤ %s ≤ %d", k.name, n, k.min, k.name, k.max)
		}
	}
	return nil
}

// checkHeadDim refuses a derived head_dim that truncates: the families
// that read an absent head_dim as hidden_size / num_attention_heads would
// otherwise build heads that do not tile the hidden state.
func checkHeadDim(m map[string]json.RawMessage, c *format.Config) error {
	if c.Family != family.NameQwen3MoE && c.Family != family.NameQwen35MoE && c.Family != family.NameGPTOSS {
		return nil // head_dim required, defaulted, or not hidden / heads
	}
	if c.Heads <= 0 {
		return nil // Validate reports it
	}
	if v, ok := m["head_dim"]; ok && string(v) != "null" {
		return nil
	}
	if c.Hidden%c.Heads != 0 {
		return fmt.Errorf("no head_dim, and hidden_size %d is not a multiple of num_attention_heads %d", c.Hidden, c.Heads)
	}
	return nil
}

// eosIDs reads eos_token_id: absent or null, one token id, or a list of
// them. Anything else (a string, a fraction, a negative id) is an error:
// dropped silently it would leave generation without a stop token.
func eosIDs(v any) ([]int, error) {
	id := func(x any) (int, error) {
		f, ok := x.(float64)
		if !ok || f != math.Trunc(f) || f < 0 || f >= 1<<31 {
			return 0, fmt.Errorf("eos_token_id %v is not a token id", x)
		}
		return int(f), nil
	}
	switch x := v.(type) {
	case nil:
		return nil, nil
	case []any:
		var out []int
		for _, e := range x {
			i, err := id(e)
			if err != nil {
				return nil, err
			}
			out = append(out, i)
		}
		return out, nil
	default:
		i, err := id(x)
		if err != nil {
			return nil, err
		}
		return []int{i}, nil
	}
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

// use records that the data of canonical tensor name was read. Readers
// run concurrently (pack converts experts in parallel).
func (c *Checkpoint) use(name string) {
	c.usedMu.Lock()
	if c.used == nil {
		c.used = map[string]bool{}
	}
	c.used[name] = true
	c.usedMu.Unlock()
}

// Unused returns the checkpoint's names of the tensors whose data no
// reader has asked for so far, sorted; after a whole pack, the tensors
// the model does not use. A tensor read under another name (a tied
// lm_head is the embedding) counts as used, and so do an MLX weight's
// scales and biases and an FP8 weight's scales when it was read.
func (c *Checkpoint) Unused() []string {
	c.usedMu.Lock()
	defer c.usedMu.Unlock()
	read := map[*safetensors.Tensor]bool{}
	for n := range c.used {
		if t := c.byName[n]; t != nil {
			read[t] = true
		}
		if q := c.mlx[n]; q != nil {
			read[q.w] = true
		}
	}
	var names []string
	for _, t := range c.byName {
		if !read[t] {
			names = append(names, t.Name)
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// Float32 returns the canonical tensor name converted to float32 after
// checking its shape.
func (c *Checkpoint) Float32(name string, shape []int) ([]float32, error) {
	c.use(name)
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
	c.use(name)
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
	c.use(name)
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
