// Package family holds one file per model family: its config.json fields,
// its tensor list and its block order, built from the shared blocks of
// package block. Only this package names families; adding one touches its
// file, its test and the list below.
package family

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
)

// Family is one supported architecture.
type Family struct {
	// Name is the family's name in manifests (format.Config.Family).
	Name string
	// ModelTypes are the config.json model_type values it serves.
	ModelTypes []string
	// Parse reads config.json (the text config, when nested) into the
	// normalised config, refusing keys or values it cannot run exactly.
	Parse func(configJSON []byte) (format.Config, error)
	// Build declares the dense tensors on t, in pack order, and returns
	// the model's blocks (bound when t binds, zero weights when it only
	// records specs).
	Build func(c *format.Config, t *block.Tensors) (*Arch, error)
	// Expert converts one expert of a checkpoint into the record's
	// matrices; nil means the layouts every Qwen checkpoint uses
	// (ExpertSource.Expert).
	Expert func(src Checkpoint, c *format.Config, layer, expert int) (Expert, error)
	// Dense converts one dense tensor of a checkpoint; nil reads it as is.
	Dense func(src Checkpoint, c *format.Config, s format.Spec) ([]float32, error)
	// Describe lists the family's blocks and options for inspect.
	Describe func(c *format.Config) []string
}

// Describe lists c's blocks and options, one "what  how" line each.
func Describe(c *format.Config) []string {
	f, err := Named(c.Family)
	if err != nil || f.Describe == nil {
		return nil
	}
	return f.Describe(c)
}

// All lists the families sluice runs.
var All = []*Family{&qwen3MoE, &qwen35MoE, &gptOSS, &deepSeek, &qwen3Next, &glm4MoE}

// Lookup returns the family serving a config.json model_type.
func Lookup(modelType string) (*Family, error) {
	for _, f := range All {
		if slices.Contains(f.ModelTypes, modelType) {
			return f, nil
		}
	}
	var names []string
	for _, f := range All {
		names = append(names, f.ModelTypes...)
	}
	return nil, fmt.Errorf("model_type %q is not supported (sluice runs %s)", modelType, strings.Join(names, ", "))
}

// Named returns the family of a manifest's family name.
func Named(name string) (*Family, error) {
	for _, f := range All {
		if f.Name == name {
			return f, nil
		}
	}
	return nil, fmt.Errorf("family %q is not supported", name)
}

// Arch is a built model: its blocks in order and what its state holds.
type Arch struct {
	Embed, LMHead block.Weight
	Norm          block.Norm // the final norm
	Layers        []block.Layer
	MTP           *block.MTP // nil when the model has none
	Rope          block.Rope // the rotary tables every attention layer uses
	States        []block.StateSpec
	MTPState      block.StateSpec // the MTP layer's KV, when MTP is set
}

// Forward runs the trunk layers over one step.
func (a *Arch) Forward(b block.Backend) error { return block.Forward(b, a.Layers) }

// Specs lists the dense tensors of c's family in pack order.
func Specs(c *format.Config) ([]format.Spec, error) {
	f, err := Named(c.Family)
	if err != nil {
		return nil, err
	}
	t := block.Specs()
	if _, err := f.Build(c, t); err != nil {
		return nil, err
	}
	return t.List(), nil
}

// Expert is one expert's matrices as the packer writes them: gate and up
// [inter][hidden], down [hidden][inter], and their biases when the family
// has them.
type Expert struct {
	Gate, Up, Down             []float32
	GateBias, UpBias, DownBias []float32
}

// Checkpoint is what a family's expert conversion reads: tensors by
// canonical name, whole or one slice of the first dimension.
type Checkpoint interface {
	Float32(name string, shape []int) ([]float32, error)
	// Slice returns sub-tensor i of the first dimension of name, whose
	// full shape must be shape.
	Slice(name string, shape []int, i int) ([]float32, error)
	// Raw returns sub-tensor i of the first dimension of name as stored
	// (for packed formats such as MXFP4), with its dtype.
	Raw(name string, shape []int, i int) (dtype string, data []byte, err error)
	// Has reports whether the checkpoint holds the tensor.
	Has(name string) bool
}

// DenseOf reads dense tensor s of a checkpoint as c's family packs it.
func DenseOf(src Checkpoint, c *format.Config, s format.Spec) ([]float32, error) {
	f, err := Named(c.Family)
	if err != nil {
		return nil, err
	}
	if f.Dense != nil {
		return f.Dense(src, c, s)
	}
	return src.Float32(s.Name, s.Shape)
}

// ExpertOf converts expert e of layer l of a checkpoint.
func ExpertOf(src Checkpoint, c *format.Config, l, e int) (Expert, error) {
	f, err := Named(c.Family)
	if err != nil {
		return Expert{}, err
	}
	if f.Expert != nil {
		return f.Expert(src, c, l, e)
	}
	return qwenExpert(src, c, l, e)
}

// qwenExpert reads the two expert layouts of Qwen checkpoints: one tensor
// per expert and projection, or fused 3-D gate_up_proj [E][2I][H] (gate
// rows first) and down_proj [E][H][I].
func qwenExpert(src Checkpoint, c *format.Config, l, e int) (Expert, error) {
	I, H := c.MoEInter, c.Hidden
	p := fmt.Sprintf("layers.%d.mlp.experts.", l)
	var x Expert
	if src.Has(p + "gate_up_proj") {
		all, err := src.Slice(p+"gate_up_proj", []int{c.Experts, 2 * I, H}, e)
		if err != nil {
			return x, err
		}
		x.Gate, x.Up = all[:I*H], all[I*H:]
		x.Down, err = src.Slice(p+"down_proj", []int{c.Experts, H, I}, e)
		return x, err
	}
	ep := fmt.Sprintf("%s%d.", p, e)
	var err error
	if x.Gate, err = src.Float32(ep+"gate_proj.weight", []int{I, H}); err != nil {
		return x, err
	}
	if x.Up, err = src.Float32(ep+"up_proj.weight", []int{I, H}); err != nil {
		return x, err
	}
	x.Down, err = src.Float32(ep+"down_proj.weight", []int{H, I})
	return x, err
}

// strictKeys refuses any key of raw that known does not list, naming it:
// a key sluice does not understand may change the math.
func strictKeys(what string, raw []byte, known ...string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	var bad []string
	for k := range m {
		if !slices.Contains(known, k) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("%s: unsupported key(s) %s", what, strings.Join(bad, ", "))
	}
	return nil
}
