package hf

// MLX checkpoints (mlx-lm's convert and quantize): config.json carries
// "quantization" (and the same under "quantization_config") with the
// default group_size and bits, and per-module overrides (a module path
// mapping to its own {group_size, bits}, or to false when it stays
// unquantised). A quantised Linear or Embedding X stores X.weight as uint32
// words, element k of a row at bits [k*bits, (k+1)*bits) of the row's
// little-endian bit stream (mlx's pack_and_quantize: q_j shifted left by
// j*bits), and X.scales and X.biases per group of group_size consecutive
// elements, in the model's float dtype; w = scale*q + bias. mlx-lm also
// renames: experts are stacked under mlp.switch_mlp.{gate,up,down}_proj
// ([E][out][in]), Qwen3.5 lives under language_model.model. with its
// zero-centred norm weights shifted by +1 (mlx uses a plain RMSNorm) and
// its conv1d weights as [C][K][1].

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
)

// mlxQuant is one MLX-quantised weight.
type mlxQuant struct {
	raw         string // checkpoint name of the weight
	w, s, b     *safetensors.Tensor
	bits, group int
	shape       []int // dequantised shape
}

// MLXTensor describes an MLX-quantised tensor of the checkpoint.
type MLXTensor struct {
	Name        string // canonical name
	Bits, Group int
}

// mlxSpec is one quantisation setting of config.json.
type mlxSpec struct {
	Bits  int `json:"bits"`
	Group int `json:"group_size"`
}

// mlxConfig is config.json's MLX quantisation: the default and the
// per-module overrides (nil: the module is not quantised).
type mlxConfig struct {
	def     mlxSpec
	modules map[string]*mlxSpec
}

// readMLXConfig returns the MLX quantisation of config.json, or nil when
// it declares none (a quantization_config with a quant_method is another
// format's, read elsewhere).
func readMLXConfig(dir string) (*mlxConfig, error) {
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %v", p, err)
	}
	field := "quantization"
	raw, ok := top[field]
	if !ok {
		field = "quantization_config"
		if raw, ok = top[field]; !ok {
			return nil, nil
		}
	}
	var q map[string]json.RawMessage
	if err := json.Unmarshal(raw, &q); err != nil {
		return nil, nil // not an object: not MLX's
	}
	if _, other := q["quant_method"]; other {
		return nil, nil
	}
	if _, ok := q["bits"]; !ok {
		return nil, nil
	}
	c := &mlxConfig{modules: map[string]*mlxSpec{}}
	for k, v := range q {
		switch k {
		case "bits":
			if err := json.Unmarshal(v, &c.def.Bits); err != nil {
				return nil, fmt.Errorf("checkpoint %s: config.json %s.bits: %v", dir, field, err)
			}
		case "group_size":
			if err := json.Unmarshal(v, &c.def.Group); err != nil {
				return nil, fmt.Errorf("checkpoint %s: config.json %s.group_size: %v", dir, field, err)
			}
		case "mode":
			var m string
			if err := json.Unmarshal(v, &m); err != nil || m != "affine" {
				return nil, fmt.Errorf("checkpoint %s: config.json %s.mode %s: only MLX's affine quantisation is supported", dir, field, v)
			}
		default:
			if string(v) == "false" {
				c.modules[k] = nil
				continue
			}
			s := &mlxSpec{}
			if err := json.Unmarshal(v, s); err != nil || s.Bits == 0 {
				return nil, fmt.Errorf("checkpoint %s: config.json %s.%s: want false or {\"group_size\", \"bits\"}, have %s", dir, field, k, v)
			}
			if s.Group == 0 {
				s.Group = c.def.Group
			}
			if err := s.check(); err != nil {
				return nil, fmt.Errorf("checkpoint %s: config.json %s.%s: %v", dir, field, k, err)
			}
			c.modules[k] = s
		}
	}
	if c.def.Group == 0 {
		c.def.Group = 64 // mlx's default
	}
	if err := c.def.check(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: config.json %s: %v", dir, field, err)
	}
	return c, nil
}

// check refuses the widths and group sizes whose layout sluice does not
// read: mlx packs 3, 5 and 6 bits across word boundaries.
func (s *mlxSpec) check() error {
	switch s.Bits {
	case 2, 4, 8:
	default:
		return fmt.Errorf("bits %d is not supported (MLX affine quantisation of 2, 4 or 8 bits)", s.Bits)
	}
	switch s.Group {
	case 32, 64, 128:
	default:
		return fmt.Errorf("group_size %d is not supported (32, 64 or 128)", s.Group)
	}
	return nil
}

// bindMLX finds the MLX-quantised weights of the checkpoint, checks them
// against config.json and against each other, and takes their scales and
// biases out of the tensor list.
func (c *Checkpoint) bindMLX() error {
	cfg, err := readMLXConfig(c.Dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(c.byName))
	for n := range c.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := c.byName[n]
		if t.DType != "U32" || !strings.HasSuffix(n, ".weight") {
			continue
		}
		if cfg == nil {
			return fmt.Errorf("checkpoint %s: tensor %s is uint32 (MLX-quantised) but config.json has no \"quantization\"", c.Dir, t.Name)
		}
		rawBase := strings.TrimSuffix(t.Name, ".weight")
		base := strings.TrimSuffix(n, ".weight")
		spec, over := cfg.modules[rawBase]
		if !over {
			spec = &cfg.def
		}
		if spec == nil {
			return fmt.Errorf("checkpoint %s: tensor %s is uint32 but config.json quantization.%s is false", c.Dir, t.Name, rawBase)
		}
		q := &mlxQuant{raw: t.Name, w: t, bits: spec.Bits, group: spec.Group}
		if q.s = c.byName[base+".scales"]; q.s == nil {
			return fmt.Errorf("checkpoint %s: tensor %s is MLX-quantised but %s.scales is missing", c.Dir, t.Name, rawBase)
		}
		if q.b = c.byName[base+".biases"]; q.b == nil {
			return fmt.Errorf("checkpoint %s: tensor %s is MLX-quantised but %s.biases is missing (only affine quantisation is supported)", c.Dir, t.Name, rawBase)
		}
		if err := q.check(); err != nil {
			return fmt.Errorf("checkpoint %s: %v", c.Dir, err)
		}
		delete(c.byName, base+".scales")
		delete(c.byName, base+".biases")
		c.mlx[n] = q
	}
	for _, n := range names {
		if c.mlx[strings.TrimSuffix(strings.TrimSuffix(n, ".scales"), ".biases")+".weight"] != nil {
			continue
		}
		if _, ok := c.byName[n]; ok && cfg != nil && strings.HasSuffix(n, ".scales") {
			return fmt.Errorf("checkpoint %s: tensor %s has no uint32 weight beside it", c.Dir, c.byName[n].Name)
		}
	}
	c.unshiftMLXNorms()
	return nil
}

// check verifies the shapes and dtypes of the three tensors and sets the
// dequantised shape.
func (q *mlxQuant) check() error {
	w, s, b := q.w, q.s, q.b
	for _, t := range []*safetensors.Tensor{s, b} {
		switch t.DType {
		case "BF16", "F16", "F32":
		default:
			return fmt.Errorf("tensor %s is %s, want BF16, F16 or F32", t.Name, t.DType)
		}
	}
	nd := len(w.Shape)
	if nd == 0 || len(s.Shape) != nd || !slices.Equal(s.Shape, b.Shape) || !slices.Equal(w.Shape[:nd-1], s.Shape[:nd-1]) {
		return fmt.Errorf("tensor %s %v: scales %v and biases %v do not match it", w.Name, w.Shape, s.Shape, b.Shape)
	}
	cols := w.Shape[nd-1] * 32 / q.bits
	if s.Shape[nd-1]*q.group != cols {
		return fmt.Errorf("tensor %s %v holds %d columns at %d bits, but %s %v covers %d in groups of %d (config.json bits or group_size wrong?)",
			w.Name, w.Shape, cols, q.bits, s.Name, s.Shape, s.Shape[nd-1]*q.group, q.group)
	}
	q.shape = append(slices.Clone(w.Shape[:nd-1]), cols)
	return nil
}

// unshiftMLXNorms undoes mlx-lm's Qwen3.5 sanitize: it stores conv1d as
// [C][K][1] (the bytes of [C][1][K]) and the zero-centred norm weights
// plus one. The conv1d shape is the mark of a sanitized checkpoint, as
// mlx-lm itself decides. Subtracting 1 in float32 is exact, so 1+w is the
// stored weight bit for bit.
func (c *Checkpoint) unshiftMLXNorms() {
	shifted := false
	for n, t := range c.byName {
		if strings.HasSuffix(n, ".conv1d.weight") && len(t.Shape) == 3 && t.Shape[2] == 1 && t.Shape[1] > 1 {
			c.byName[n] = &safetensors.Tensor{Name: t.Name, DType: t.DType, Shape: []int{t.Shape[0], 1, t.Shape[1]}, Data: t.Data, File: t.File}
			shifted = true
		}
	}
	if !shifted {
		return
	}
	for n := range c.byName {
		for _, sfx := range []string{".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight"} {
			if strings.HasSuffix(n, sfx) {
				c.shift[n] = true
			}
		}
		if n == "norm.weight" {
			c.shift[n] = true
		}
	}
}

// MLXTensors lists the MLX-quantised tensors, by canonical name.
func (c *Checkpoint) MLXTensors() []MLXTensor {
	var out []MLXTensor
	for n, q := range c.mlx {
		out = append(out, MLXTensor{Name: n, Bits: q.bits, Group: q.group})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// mlxSlice returns the float32 values of an MLX-quantised tensor, whole
// (i < 0) or its sub-tensor i of the first dimension.
func (q *mlxQuant) dequant(i int) []float32 {
	wd, sd, bd := q.w.Data, q.s.Data, q.b.Data
	n := 1
	for _, d := range q.shape {
		n *= d
	}
	if i >= 0 {
		n /= q.shape[0]
		wd = wd[i*len(wd)/q.shape[0] : (i+1)*len(wd)/q.shape[0]]
		sd = sd[i*len(sd)/q.shape[0] : (i+1)*len(sd)/q.shape[0]]
		bd = bd[i*len(bd)/q.shape[0] : (i+1)*len(bd)/q.shape[0]]
	}
	scales, biases := floats(q.s.DType, sd), floats(q.b.DType, bd)
	out := make([]float32, n)
	mask := uint32(1)<<q.bits - 1
	for k := range out {
		bit := k * q.bits // never straddles a word: bits divides 32
		w := uint32(wd[bit>>5<<2]) | uint32(wd[bit>>5<<2+1])<<8 | uint32(wd[bit>>5<<2+2])<<16 | uint32(wd[bit>>5<<2+3])<<24
		v := w >> (bit & 31) & mask
		g := k / q.group
		out[k] = float32(scales[g]*float32(v)) + biases[g] // as quant.Decode: product rounded first
	}
	return out
}

// q4 returns the tensor (i < 0) or its sub-tensor i as sluice's q4
// encoding, the same q, scales and biases, when it is 4-bit group-64.
func (q *mlxQuant) q4(i int) (*quant.Encoded, bool) {
	if q.bits != 4 || q.group != format.GroupSize {
		return nil, false
	}
	wd, sd, bd := q.w.Data, q.s.Data, q.b.Data
	if i >= 0 {
		wd = wd[i*len(wd)/q.shape[0] : (i+1)*len(wd)/q.shape[0]]
		sd = sd[i*len(sd)/q.shape[0] : (i+1)*len(sd)/q.shape[0]]
		bd = bd[i*len(bd)/q.shape[0] : (i+1)*len(bd)/q.shape[0]]
	}
	const G = format.GroupSize
	e := &quant.Encoded{Values: make([]byte, len(wd)), Scales: floats(q.s.DType, sd), Biases: floats(q.b.DType, bd)}
	if !halfExact(e, wd) {
		return nil, false
	}
	// MLX: byte k/2 of the group holds element k, low nibble first.
	// sluice q4: byte j holds elements j (low) and j+G/2 (high).
	for g := 0; g < len(wd)/(G/2); g++ {
		src, dst := wd[g*G/2:(g+1)*G/2], e.Values[g*G/2:(g+1)*G/2]
		for j := 0; j < G/2; j++ {
			lo := src[j/2] >> (4 * (j & 1)) & 15
			hi := src[(j+G/2)/2] >> (4 * ((j + G/2) & 1)) & 15
			dst[j] = lo | hi<<4
		}
	}
	return e, true
}

// halfExact rounds e's scales and biases to halves, the packed format's,
// and reports whether every weight still dequantises to the same float32
// (MLX's codes wd, 4 bits, group 64). bf16 ones are halves unless beyond
// the half's range; MLX gives a constant group a scale of 1e-7, not a
// half, but its codes are all 0 and the value is the bias alone.
func halfExact(e *quant.Encoded, wd []byte) bool {
	const G = format.GroupSize
	for g, sc := range e.Scales {
		bi := e.Biases[g]
		s16, b16 := quant.RoundF16(sc), quant.RoundF16(bi)
		if s16 == sc && b16 == bi {
			continue
		}
		for _, w := range wd[g*G/2 : (g+1)*G/2] {
			for _, q := range [2]float32{float32(w & 15), float32(w >> 4)} {
				if float32(s16*q)+b16 != float32(sc*q)+bi {
					return false
				}
			}
		}
		e.Scales[g], e.Biases[g] = s16, b16
	}
	return true
}

// floats widens bf16, f16 or f32 bytes to float32 exactly.
func floats(dtype string, b []byte) []float32 {
	t := &safetensors.Tensor{DType: dtype, Data: b}
	es := 2
	if dtype == "F32" {
		es = 4
	}
	t.Shape = []int{len(b) / es}
	v, _ := t.Float32() // dtype checked when bound
	return v
}

// Q4 returns canonical tensor name, whole (i < 0) or its sub-tensor i of
// the first dimension, as sluice's q4 encoding when the checkpoint stores
// it MLX-quantised at 4 bits in groups of 64: the same q, scales and
// biases (as halves, the packed format's), so it decodes to the same values
// without requantising. ok is false for any other tensor, and for one that
// halves would change (see halfExact).
func (c *Checkpoint) Q4(name string, shape []int, i int) (e *quant.Encoded, ok bool, err error) {
	q := c.mlx[name]
	if q == nil || c.shift[name] {
		return nil, false, nil
	}
	if !slices.Equal(q.shape, shape) {
		return nil, false, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v", c.Dir, name, q.shape, shape)
	}
	if i >= shape[0] {
		return nil, false, fmt.Errorf("checkpoint %s: tensor %s has no slice %d", c.Dir, name, i)
	}
	if e, ok = q.q4(i); ok {
		c.use(name)
	}
	return e, ok, nil
}

// switchPrefix is where mlx-lm stacks a layer's experts.
func switchPrefix(l int) string { return fmt.Sprintf("layers.%d.mlp.switch_mlp.", l) }

// switchExpert reads expert e of layer l from mlx-lm's switch_mlp stacks
// ([E][I][H] gate and up, [E][H][I] down); ok is false when the layer
// has none.
func (c *Checkpoint) switchExpert(l, e int) (x family.Expert, ok bool, err error) {
	p := switchPrefix(l)
	if !c.Has(p + "gate_proj.weight") {
		return x, false, nil
	}
	if c.Config.ExpertBias {
		return x, true, fmt.Errorf("checkpoint %s: MLX switch_mlp experts with biases (%s) are not supported", c.Dir, c.Config.Family)
	}
	E, I, H := c.Config.Experts, c.Config.MoEInter, c.Config.Hidden
	if x.Gate, err = c.Slice(p+"gate_proj.weight", []int{E, I, H}, e); err != nil {
		return x, true, err
	}
	if x.Up, err = c.Slice(p+"up_proj.weight", []int{E, I, H}, e); err != nil {
		return x, true, err
	}
	x.Down, err = c.Slice(p+"down_proj.weight", []int{E, H, I}, e)
	return x, true, err
}

// ExpertQ4 returns expert e of layer l as sluice's q4 encodings of gate,
// up and down when the checkpoint stacks it under switch_mlp at MLX 4-bit
// group 64 (see Q4); ok is false otherwise.
func (c *Checkpoint) ExpertQ4(l, e int) (m [3]*quant.Encoded, ok bool, err error) {
	p := switchPrefix(l)
	E, I, H := c.Config.Experts, c.Config.MoEInter, c.Config.Hidden
	if c.Config.ExpertBias {
		return m, false, nil
	}
	for k, s := range []struct {
		n     string
		shape []int
	}{{"gate_proj.weight", []int{E, I, H}}, {"up_proj.weight", []int{E, I, H}}, {"down_proj.weight", []int{E, H, I}}} {
		if m[k], ok, err = c.Q4(p+s.n, s.shape, e); !ok || err != nil {
			return m, false, err
		}
	}
	return m, true, nil
}
