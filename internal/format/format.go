// Package format is the one contract between the packer and the runtime: the
// normalised model configuration, the manifest of a packed directory, and the
// layout of an expert record.
//
// A packed model is a directory:
//
//	manifest.json   this package's Manifest
//	dense.bin       every non-expert tensor, each 64-byte aligned
//	experts.bin     one record per (layer, expert), record id = layer*E + e,
//	                the MTP layer last; the stride is a multiple of 4096 so a
//	                record is one aligned O_DIRECT read
//	tokenizer.json, tokenizer_config.json, config.json, generation_config.json
//
// Matrices are row-major [rows][cols]: rows are outputs, cols the input
// dimension that quantisation groups run along.
package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Version is bumped whenever the bytes written by the packer change meaning.
// Format 2: the family's tensor list and expert layout come from package
// family (expert records may carry biases). Format 3: quantisation scales
// and biases are IEEE half precision (2 bytes each, little-endian), not
// float32: a 4-bit weight then costs 4.5 bits rather than 5, and a decode
// step, which streams every weight once, reads 10% fewer bytes. Format 4:
// a q4 tensor may be stored tiled (Tensor.Tiled), in the layout the CPU's
// decode kernel reads best; a format-3 directory, whose tensors are all
// row-major, reads unchanged (MinVersion).
const Version = 4

// MinVersion is the oldest format this sluice reads: format 4 only added
// a field, so what format 3 wrote means what it meant.
const MinVersion = 3

// VersionOf is the format a packer writes for a model with these expert
// stores: Version where one holds tiled matrices, else MinVersion, whose
// readers (every sluice since format 3) read the directory as it is.
func VersionOf(stores []ExpertStore) int {
	for i := range stores {
		if stores[i].Tiled() {
			return Version
		}
	}
	return MinVersion
}

// TileRows is the rows of a tile in the tiled q4 layout (Tensor.Tiled).
const TileRows = 8

// GroupSize is the quantisation group along the input dimension.
const GroupSize = 64

// RecordAlign is the alignment of expert records (O_DIRECT needs 4096).
const RecordAlign = 4096

// DenseAlign is the alignment of every tensor in dense.bin.
const DenseAlign = 64

// Layer kinds of Config.LayerTypes.
const (
	FullAttention    = "full_attention"
	LinearAttention  = "linear_attention"
	SlidingAttention = "sliding_attention"
)

// Config is the model configuration after normalisation: the dimensions
// the engine needs, whatever nesting or naming the checkpoint used. What
// only one family reads (its blocks' options) is that family's own config
// struct, kept as JSON in Arch; package family parses and builds both.
type Config struct {
	Family     string   `json:"family"`
	Hidden     int      `json:"hidden_size"`
	Layers     int      `json:"num_hidden_layers"`
	Vocab      int      `json:"vocab_size"`
	Heads      int      `json:"num_attention_heads"`
	KVHeads    int      `json:"num_key_value_heads"`
	HeadDim    int      `json:"head_dim"`
	RotaryDim  int      `json:"rotary_dim"`
	RopeTheta  float64  `json:"rope_theta"`
	RMSEps     float64  `json:"rms_norm_eps"`
	MaxPos     int      `json:"max_position_embeddings"`
	LayerTypes []string `json:"layer_types"`

	Experts     int  `json:"num_experts"`
	TopK        int  `json:"num_experts_per_tok"`
	MoEInter    int  `json:"moe_intermediate_size"`
	SharedInter int  `json:"shared_expert_intermediate_size"`
	NormTopK    bool `json:"norm_topk_prob"`

	LinearKeyHeads   int `json:"linear_num_key_heads"`
	LinearValueHeads int `json:"linear_num_value_heads"`
	LinearKeyDim     int `json:"linear_key_head_dim"`
	LinearValueDim   int `json:"linear_value_head_dim"`
	ConvKernel       int `json:"linear_conv_kernel_dim"`

	MTPLayers int   `json:"mtp_num_hidden_layers"`
	EOS       []int `json:"eos_token_ids"`

	// ExpertBias: expert records carry float32 biases after each
	// projection.
	ExpertBias bool `json:"expert_bias,omitempty"`
	// FirstDense leading layers have a dense MLP and no experts: their
	// expert records are holes in the file, never read.
	FirstDense int `json:"first_k_dense_replace,omitempty"`
	// SlidingWindow is the window of sliding_attention layers.
	SlidingWindow int `json:"sliding_window,omitempty"`
	// Arch is the family's own parsed config (package family).
	Arch ArchJSON `json:"arch,omitempty"`
}

// ArchJSON is a family's own config as compact JSON: decoding compacts it,
// so a config reads back equal from an indented manifest.
type ArchJSON []byte

// MarshalJSON implements json.Marshaler.
func (a ArchJSON) MarshalJSON() ([]byte, error) {
	if len(a) == 0 {
		return []byte("null"), nil
	}
	return a, nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (a *ArchJSON) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = nil
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	*a = buf.Bytes()
	return nil
}

// ExpertLayers is the number of expert layers stored: trunk plus MTP.
func (c *Config) ExpertLayers() int { return c.Layers + c.MTPLayers }

// Validate checks that the shared dimensions are consistent; each family
// checks its own options when it parses or builds.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("config: "+f, a...) }
	if c.Family == "" {
		return bad("no family")
	}
	for _, f := range []struct {
		n string
		v int
	}{{"hidden_size", c.Hidden}, {"num_hidden_layers", c.Layers}, {"vocab_size", c.Vocab},
		{"num_attention_heads", c.Heads}, {"num_key_value_heads", c.KVHeads}, {"head_dim", c.HeadDim},
		{"num_experts", c.Experts}, {"num_experts_per_tok", c.TopK}, {"moe_intermediate_size", c.MoEInter}} {
		if f.v <= 0 {
			return bad("%s = %d, want > 0", f.n, f.v)
		}
	}
	if c.Heads%c.KVHeads != 0 {
		return bad("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	}
	if c.TopK > c.Experts {
		return bad("num_experts_per_tok %d > num_experts %d", c.TopK, c.Experts)
	}
	if c.RotaryDim <= 0 || c.RotaryDim > c.HeadDim || c.RotaryDim%2 != 0 {
		return bad("rotary dim %d invalid for head_dim %d", c.RotaryDim, c.HeadDim)
	}
	if len(c.LayerTypes) != c.Layers {
		return bad("layer_types has %d entries, want num_hidden_layers = %d", len(c.LayerTypes), c.Layers)
	}
	for i, t := range c.LayerTypes {
		if t != FullAttention && t != LinearAttention && t != SlidingAttention {
			return bad("layer_types[%d] = %q unsupported", i, t)
		}
		if t == SlidingAttention && c.SlidingWindow <= 0 {
			return bad("layer_types[%d] = %s needs sliding_window > 0", i, t)
		}
	}
	// An id outside the vocabulary can never be sampled: generation would
	// run to the length limit, and a negative one would index out of range.
	for i, id := range c.EOS {
		if id < 0 || id >= c.Vocab {
			return bad("eos_token_ids[%d] = %d, outside the vocabulary [0, %d)", i, id, c.Vocab)
		}
	}
	if c.MTPLayers < 0 || c.MTPLayers > 1 {
		return bad("mtp_num_hidden_layers = %d, sluice supports 0 or 1", c.MTPLayers)
	}
	// The rotary frequencies are theta^(-2i/d) and a norm divides by
	// sqrt(mean(x²)+eps): a theta <= 0 or a negative eps makes them NaN or
	// infinite, and the model would then emit token 0 forever, which
	// looks like output.
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return bad("rope_theta = %g, want a finite number > 0", c.RopeTheta)
	}
	if !(c.RMSEps >= 0) || math.IsInf(c.RMSEps, 0) {
		return bad("rms_norm_eps = %g, want a finite number >= 0", c.RMSEps)
	}
	return nil
}

// Kind is how a tensor's values are stored.
type Kind string

// Storage kinds. Q8 and Q4 are affine, w ≈ scale*q + bias per group of
// GroupSize along the row, q unsigned; scales and biases are float32
// [rows][cols/GroupSize]. Q4 packs a group's 64 values in 32 bytes: byte j
// holds q[j] in its low nibble and q[j+32] in its high nibble, so a SIMD
// kernel expands one 32-byte load into two contiguous halves.
const (
	F32  Kind = "f32"
	BF16 Kind = "bf16"
	Q8   Kind = "q8"
	Q4   Kind = "q4"
	// Q3 and Q2 exist only as low-bit copies of the expert store
	// (experts3.bin, experts2.bin) that lossy miss reads use; the runtime
	// multiplies them as they are, with q4's arithmetic. A group's 64
	// values are a little-endian bit stream: value i is bits
	// [i*b, (i+1)*b).
	Q3 Kind = "q3"
	Q2 Kind = "q2"
	// MXFP4 is the OCP microscaling format gpt-oss's checkpoints ship
	// their experts in, kept as is: per row, blocks of MXBlock values,
	// each an E2M1 code (4 bits) times the block's E8M0 scale 2^(s−127).
	// The values part holds the codes, [rows][cols/2] bytes (byte k of a
	// block holds value 2k in its low nibble and 2k+1 in its high one,
	// the checkpoint's order), followed by the scales, [rows][cols/32]
	// bytes: 4.25 bits per weight, no float scales or biases.
	MXFP4 Kind = "mxfp4"
)

// MXBlock is the number of values sharing one MXFP4 scale.
const MXBlock = 32

// LowKind maps --low-bits / --miss-bits to the kind of a low-bit store.
func LowKind(bits int) (Kind, error) {
	switch bits {
	case 3:
		return Q3, nil
	case 2:
		return Q2, nil
	}
	return "", fmt.Errorf("low bits %d unsupported (want 3 or 2)", bits)
}

// LowStoreFile names the low-bit copy of the expert store.
func LowStoreFile(bits int) string { return fmt.Sprintf("experts%d.bin", bits) }

// Store returns the expert store of kind k, if the manifest lists one.
func (m *Manifest) Store(k Kind) (*ExpertStore, bool) {
	for i := range m.Stores {
		if m.Stores[i].Kind == k {
			return &m.Stores[i], true
		}
	}
	return nil, false
}

// KindForBits maps --bits to the storage kind of quantised matrices.
func KindForBits(bits int) (Kind, error) {
	switch bits {
	case 16:
		return BF16, nil
	case 8:
		return Q8, nil
	case 4:
		return Q4, nil
	}
	return "", fmt.Errorf("bits %d unsupported (want 16, 8 or 4)", bits)
}

// Bits is the number of bits per value of the kind (excluding scales).
func (k Kind) Bits() int {
	switch k {
	case F32:
		return 32
	case BF16:
		return 16
	case Q8:
		return 8
	case Q4, MXFP4:
		return 4
	case Q3:
		return 3
	case Q2:
		return 2
	}
	return 0
}

// Quantised reports whether the kind carries scales and biases.
func (k Kind) Quantised() bool { return k == Q8 || k == Q4 || k == Q3 || k == Q2 }

// Sizes returns the bytes of the values and of the scales (the biases are the
// same size as the scales) of a [rows][cols] matrix of kind k. Scales and
// biases are halves, one of each per group.
func (k Kind) Sizes(rows, cols int) (values, scales int64) {
	n := int64(rows) * int64(cols)
	values = n * int64(k.Bits()) / 8
	if k == MXFP4 {
		values += n / MXBlock // the E8M0 scales follow the codes
	}
	if k.Quantised() {
		scales = int64(rows) * int64(cols/GroupSize) * 2
	}
	return
}

// Tensor locates one tensor of dense.bin, or one projection inside an expert
// record (offsets then relative to the record).
type Tensor struct {
	Name        string `json:"name,omitempty"`
	Kind        Kind   `json:"kind"`
	Shape       []int  `json:"shape"`
	Offset      int64  `json:"offset"`
	Size        int64  `json:"size"`
	ScaleOffset int64  `json:"scale_offset,omitempty"`
	BiasOffset  int64  `json:"bias_offset,omitempty"`
	// Tiled says a q4 tensor's values are stored tiled rather than row
	// after row: within each whole tile of TileRows rows, group g's bytes
	// take the TileRows·32 bytes at g·TileRows·32 from the tile's start,
	// and in them bytes 8k..8k+7 of row r sit at k·64 + r·8 (the rows
	// after the last whole tile stay row-major). The scales and biases
	// keep their order. A streamed expert pool computes such records
	// without the rearranging pass a row-major record would need first
	// (kernels.TileQ4 writes the layout; kernels.Mat.Tiled reads it).
	Tiled bool `json:"tiled,omitempty"`
}

// Rows and Cols view the shape as a matrix: the last dimension is Cols.
func (t *Tensor) Rows() int {
	r := 1
	for _, d := range t.Shape[:len(t.Shape)-1] {
		r *= d
	}
	return r
}

// Cols is the last dimension.
func (t *Tensor) Cols() int { return t.Shape[len(t.Shape)-1] }

// End is one past the last byte the tensor uses.
func (t *Tensor) End() int64 {
	_, s := t.Kind.Sizes(t.Rows(), t.Cols())
	e := t.Offset + t.Size
	if t.Kind.Quantised() {
		e = max(e, t.ScaleOffset+s, t.BiasOffset+s)
	}
	return e
}

// ExpertStore is one file of expert records.
type ExpertStore struct {
	File   string `json:"file"`
	Kind   Kind   `json:"kind"`
	Stride int64  `json:"stride"`
	Gate   Tensor `json:"gate"` // [moe_inter][hidden]
	Up     Tensor `json:"up"`   // [moe_inter][hidden]
	Down   Tensor `json:"down"` // [hidden][moe_inter]
	// Biases of the three projections (float32), when Config.ExpertBias.
	GateBias *Tensor `json:"gate_bias,omitempty"` // [moe_inter]
	UpBias   *Tensor `json:"up_bias,omitempty"`   // [moe_inter]
	DownBias *Tensor `json:"down_bias,omitempty"` // [hidden]
}

// Tiled reports whether any of the store's matrices is stored tiled
// (Tensor.Tiled).
func (st *ExpertStore) Tiled() bool { return st.Gate.Tiled || st.Up.Tiled || st.Down.Tiled }

// Manifest describes a packed model directory.
type Manifest struct {
	Format       int           `json:"format"`
	Family       string        `json:"family"`
	Config       Config        `json:"config"`
	Bits         int           `json:"bits"`
	GroupSize    int           `json:"group_size"`
	Dense        []Tensor      `json:"dense"`
	DenseBytes   int64         `json:"dense_bytes"`
	ExpertLayers int           `json:"expert_layers"`
	Experts      int           `json:"experts"`
	Stores       []ExpertStore `json:"stores"`
}

// ExpertRecordLayout returns the record layout of kind k for the config:
// gate, up, down back to back, then their float32 biases when the config
// has them, each part 64-byte aligned, the stride rounded up to
// RecordAlign.
func ExpertRecordLayout(c *Config, k Kind, file string) ExpertStore {
	st := ExpertStore{File: file, Kind: k}
	var off int64
	place := func(rows, cols int) Tensor {
		t := Tensor{Kind: k, Shape: []int{rows, cols}}
		v, s := k.Sizes(rows, cols)
		t.Offset, t.Size = off, v
		off = alignUp(off+v, DenseAlign)
		if k.Quantised() {
			t.ScaleOffset = off
			off = alignUp(off+s, DenseAlign)
			t.BiasOffset = off
			off = alignUp(off+s, DenseAlign)
		}
		return t
	}
	st.Gate = place(c.MoEInter, c.Hidden)
	st.Up = place(c.MoEInter, c.Hidden)
	st.Down = place(c.Hidden, c.MoEInter)
	if c.ExpertBias {
		vec := func(n int) *Tensor {
			t := &Tensor{Kind: F32, Shape: []int{n}, Offset: off, Size: int64(4 * n)}
			off = alignUp(off+t.Size, DenseAlign)
			return t
		}
		st.GateBias, st.UpBias, st.DownBias = vec(c.MoEInter), vec(c.MoEInter), vec(c.Hidden)
	}
	st.Stride = alignUp(off, RecordAlign)
	return st
}

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

// AlignUp rounds x up to a multiple of a.
func AlignUp(x, a int64) int64 { return alignUp(x, a) }

// ManifestFile is the manifest's name inside a packed directory.
const ManifestFile = "manifest.json"

// packedWeights are weight files only a packed directory holds.
var packedWeights = []string{"dense.bin", "experts.bin"}

// CheckComplete returns an error when dir holds a packed model's weight
// files but no manifest.json, and nil otherwise. Such a directory is a
// packed model left incomplete (an interrupted copy, a deleted manifest);
// the packer copies config.json into it, so without this check it would be
// taken for a Hugging Face checkpoint and blamed for missing safetensors.
func CheckComplete(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, ManifestFile)); err == nil {
		return nil
	}
	for _, f := range packedWeights {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%s missing: %s is not a complete packed model (it holds %s)", ManifestFile, dir, f)
		}
	}
	return nil
}

// ReadManifest loads and checks dir/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	p := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("packed model: %v", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("packed model: %s: %v", p, err)
	}
	if m.Format < MinVersion || m.Format > Version {
		return nil, fmt.Errorf("packed model %s has format %d, this sluice reads formats %d to %d: repack it with `sluice pack --force`", dir, m.Format, MinVersion, Version)
	}
	if err := m.Config.Validate(); err != nil {
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	if len(m.Stores) == 0 {
		return nil, fmt.Errorf("packed model %s: manifest lists no expert store", dir)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("packed model %s: %s: %v", dir, ManifestFile, err)
	}
	// The packer copies the checkpoint's generation_config.json beside the
	// manifest, whose eos_token_ids were read from it. A copy that is no
	// longer JSON means the directory was damaged after packing, which is
	// said rather than ignored; a missing one is fine.
	gp := filepath.Join(dir, GenerationConfigFile)
	if gb, err := os.ReadFile(gp); err == nil {
		if !json.Valid(gb) {
			return nil, fmt.Errorf("packed model %s: %s is not valid JSON", dir, gp)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	return &m, nil
}

// GenerationConfigFile is the checkpoint's generation settings, copied
// into a packed directory.
const GenerationConfigFile = "generation_config.json"

// maxElems bounds a tensor's element count, far above any real tensor
// (2^48 values), so that its byte sizes and Rows*Cols cannot overflow.
const maxElems = 1 << 48

// check verifies what the loaders take on trust from the manifest: they
// slice every tensor out of its weight file or record and index records
// by layer*Experts + e, so a tensor outside its bytes, a size that
// disagrees with its shape, or counts that disagree with the config
// would panic or compute with the wrong bytes. The files' lengths are
// checked where they are opened.
func (m *Manifest) check() error {
	c := &m.Config
	if m.Family != c.Family {
		return fmt.Errorf("family %q, but its config says %q", m.Family, c.Family)
	}
	if m.GroupSize != GroupSize {
		// The kernels use GroupSize whatever the manifest says.
		return fmt.Errorf("group_size %d, this sluice reads %d", m.GroupSize, GroupSize)
	}
	if m.Experts != c.Experts || m.ExpertLayers != c.ExpertLayers() {
		return fmt.Errorf("experts %d, expert_layers %d, but the config has %d experts in %d layers (%d trunk + %d MTP)",
			m.Experts, m.ExpertLayers, c.Experts, c.ExpertLayers(), c.Layers, c.MTPLayers)
	}
	if m.DenseBytes < 0 {
		return fmt.Errorf("dense_bytes = %d, want >= 0", m.DenseBytes)
	}
	for i := range m.Dense {
		t := &m.Dense[i]
		if err := t.check(m.DenseBytes); err != nil {
			return fmt.Errorf("dense.bin tensor %q: %v", t.Name, err)
		}
	}
	records, ok := mul(int64(m.ExpertLayers), int64(m.Experts))
	if !ok {
		return fmt.Errorf("%d expert layers of %d experts overflow", m.ExpertLayers, m.Experts)
	}
	for i := range m.Stores {
		st := &m.Stores[i]
		if err := st.check(c, records); err != nil {
			return fmt.Errorf("expert store %q: %v", st.File, err)
		}
	}
	return nil
}

// check verifies a store's file name, stride and record layout against
// the config, for records records.
func (st *ExpertStore) check(c *Config, records int64) error {
	if !filepath.IsLocal(st.File) {
		return fmt.Errorf("file name must be local to the packed directory")
	}
	if st.Kind.Bits() == 0 {
		return fmt.Errorf("kind %q unknown", st.Kind)
	}
	if st.Stride <= 0 || st.Stride%RecordAlign != 0 {
		return fmt.Errorf("stride %d, want a positive multiple of %d", st.Stride, RecordAlign)
	}
	if _, ok := mul(records, st.Stride); !ok {
		return fmt.Errorf("%d records of stride %d overflow", records, st.Stride)
	}
	for _, p := range []struct {
		name string
		t    *Tensor
		kind Kind
		want []int
	}{{"gate", &st.Gate, st.Kind, []int{c.MoEInter, c.Hidden}}, {"up", &st.Up, st.Kind, []int{c.MoEInter, c.Hidden}},
		{"down", &st.Down, st.Kind, []int{c.Hidden, c.MoEInter}},
		{"gate_bias", st.GateBias, F32, []int{c.MoEInter}}, {"up_bias", st.UpBias, F32, []int{c.MoEInter}},
		{"down_bias", st.DownBias, F32, []int{c.Hidden}}} {
		bias := p.kind == F32
		switch {
		case bias && p.t == nil && c.ExpertBias:
			return fmt.Errorf("%s missing, but the config has expert biases", p.name)
		case bias && p.t != nil && !c.ExpertBias:
			// The runtime would add it: the config is the authority.
			return fmt.Errorf("%s present, but the config has no expert biases", p.name)
		case p.t == nil:
			continue
		}
		if p.t.Kind != p.kind {
			return fmt.Errorf("%s is %s, want %s", p.name, p.t.Kind, p.kind)
		}
		if !slices.Equal(p.t.Shape, p.want) {
			return fmt.Errorf("%s is %v, want %v for the config", p.name, p.t.Shape, p.want)
		}
		if err := p.t.check(st.Stride); err != nil {
			return fmt.Errorf("%s: %v", p.name, err)
		}
	}
	return nil
}

// check verifies that t's shape, kind and size agree, and that every part
// of it (values, and the scales and biases of a quantised kind) lies
// inside [0, limit).
func (t *Tensor) check(limit int64) error {
	if len(t.Shape) == 0 {
		return fmt.Errorf("no shape")
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d <= 0 || n > maxElems/int64(d) {
			return fmt.Errorf("shape %v invalid", t.Shape)
		}
		n *= int64(d)
	}
	if t.Kind.Bits() == 0 {
		return fmt.Errorf("kind %q unknown", t.Kind)
	}
	g := GroupSize // a quantised kind's group; MXFP4's block is smaller
	if t.Kind == MXFP4 {
		g = MXBlock
	}
	if (t.Kind.Quantised() || t.Kind == MXFP4) && t.Cols()%g != 0 {
		return fmt.Errorf("%s shape %v: %d columns not a multiple of %d", t.Kind, t.Shape, t.Cols(), g)
	}
	if t.Tiled && (t.Kind != Q4 || t.Rows() < TileRows) {
		return fmt.Errorf("tiled, but only q4 matrices of %d rows or more are stored tiled (%s %v)", TileRows, t.Kind, t.Shape)
	}
	v, s := t.Kind.Sizes(t.Rows(), t.Cols())
	if t.Size != v {
		return fmt.Errorf("size %d, want %d for %s %v", t.Size, v, t.Kind, t.Shape)
	}
	type part struct {
		name   string
		off, n int64
	}
	parts := []part{{"offset", t.Offset, v}}
	if t.Kind.Quantised() {
		parts = append(parts, part{"scale_offset", t.ScaleOffset, s}, part{"bias_offset", t.BiasOffset, s})
	}
	for _, p := range parts {
		// Compared without adding, which could overflow.
		if p.off < 0 || p.n > limit || p.off > limit-p.n {
			return fmt.Errorf("%s %d + %d bytes lies outside the %d bytes available", p.name, p.off, p.n, limit)
		}
	}
	return nil
}

// mul is a*b for non-negative a and b, and whether it fits in an int64.
func mul(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || (a != 0 && b > math.MaxInt64/a) {
		return 0, false
	}
	return a * b, true
}

// Find returns the dense tensor of that name.
func (m *Manifest) Find(name string) (*Tensor, bool) {
	for i := range m.Dense {
		if m.Dense[i].Name == name {
			return &m.Dense[i], true
		}
	}
	return nil, false
}
