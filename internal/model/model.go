// Package model loads a packed model and runs its forward pass over a batch
// of consecutive token rows. A family differs only in its blocks: qwen3_moe
// is attention + MoE with plain RMSNorm; qwen3_5_moe mixes gated attention
// and gated DeltaNet layers, zero-centred RMSNorm, a shared expert, and an
// MTP layer stored as the extra layer index num_hidden_layers.
package model

import (
	"fmt"
	"path/filepath"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
)

// Layer holds one decoder layer's dense weights.
type Layer struct {
	Index    int
	Attn     bool      // full attention (else gated DeltaNet)
	InNorm   []float32 // [hidden]
	PostNorm []float32 // [hidden]

	// Attention.
	Q, K, V, O   kernels.Mat // Q [heads*head_dim(*2 with gate)][hidden], K,V [kv*head_dim][hidden], O [hidden][heads*head_dim]
	QNorm, KNorm []float32   // [head_dim]

	// Gated DeltaNet.
	QKV, Z, B, A kernels.Mat // QKV [2*kd+vd][hidden], Z [vd][hidden], B, A [nv][hidden]
	Conv         []float32   // [2*kd+vd][kernel]
	ConvT        []float32   // [kernel][2*kd+vd]: Conv by tap, for channel-contiguous passes
	ALog, DtBias []float32   // [nv]
	GNorm        []float32   // [v_head_dim]
	Out          kernels.Mat // [hidden][vd]

	// MoE.
	Router                           kernels.Mat // [experts][hidden] f32
	SharedGate, SharedUp, SharedDown kernels.Mat // [shared][hidden], [shared][hidden], [hidden][shared]
	SharedExpertGate                 kernels.Mat // [1][hidden] f32
	HasShared                        bool
}

// MTPHead is the multi-token-prediction head of qwen3_5_moe.
type MTPHead struct {
	FC         kernels.Mat // [hidden][2*hidden]
	NormEmbed  []float32   // [hidden]
	NormHidden []float32   // [hidden]
	Norm       []float32   // [hidden]
	Layer      *Layer
}

// Model is a loaded packed model: dense weights mapped read-only, experts
// reached through a Provider.
type Model struct {
	Dir      string
	Manifest *format.Manifest
	Config   format.Config
	Embed    kernels.Mat // [vocab][hidden]
	LMHead   kernels.Mat // [vocab][hidden]
	Norm     []float32   // [hidden]
	Layers   []Layer     // trunk layers
	MTP      *MTPHead    // nil when the model has none
	Experts  Provider

	dense []byte
}

// Load maps dir/dense.bin and builds the layer views. Experts are served by
// a Provider the caller sets (NewResidentProvider maps experts.bin whole).
func Load(dir string) (*Model, error) {
	man, err := format.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	dense, err := mapFile(filepath.Join(dir, "dense.bin"))
	if err != nil {
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	m := &Model{Dir: dir, Manifest: man, Config: man.Config, dense: dense}
	if int64(len(dense)) < man.DenseBytes {
		m.Close()
		return nil, fmt.Errorf("packed model %s: dense.bin has %d bytes, manifest says %d (truncated?)", dir, len(dense), man.DenseBytes)
	}
	if err := m.bind(); err != nil {
		m.Close()
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	return m, nil
}

func mapFile(path string) ([]byte, error) { return platform.MapFile(path) }

// Close releases the mapped weights and the expert provider.
func (m *Model) Close() error {
	if m.Experts != nil {
		m.Experts.Close()
		m.Experts = nil
	}
	if m.dense != nil {
		err := platform.Unmap(m.dense)
		m.dense = nil
		return err
	}
	return nil
}

// binder resolves manifest tensors against DenseSpecs, checking shapes.
type binder struct {
	m     *Model
	specs map[string]format.Spec
	err   error
}

func (b *binder) mat(name string) kernels.Mat {
	if b.err != nil {
		return kernels.Mat{}
	}
	t, ok := b.m.Manifest.Find(name)
	if !ok {
		b.err = fmt.Errorf("tensor %s is missing from the manifest", name)
		return kernels.Mat{}
	}
	if s, ok := b.specs[name]; ok && !equalShape(s.Shape, t.Shape) {
		b.err = fmt.Errorf("tensor %s is %v, want %v", name, t.Shape, s.Shape)
		return kernels.Mat{}
	}
	mt, err := kernels.MatFrom(b.m.dense, t)
	if err != nil {
		b.err = err
	}
	return mt
}

// vec returns a float32 tensor as a flat slice.
func (b *binder) vec(name string) []float32 {
	mt := b.mat(name)
	if b.err == nil && mt.Kind != format.F32 {
		b.err = fmt.Errorf("tensor %s is %s, want f32", name, mt.Kind)
	}
	return mt.F32
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (m *Model) bind() error {
	c := &m.Config
	b := &binder{m: m, specs: map[string]format.Spec{}}
	for _, s := range format.DenseSpecs(c) {
		b.specs[s.Name] = s
	}
	m.Embed = b.mat("embed_tokens.weight")
	m.LMHead = b.mat("lm_head.weight")
	m.Norm = b.vec("norm.weight")
	layer := func(l int) Layer {
		p := fmt.Sprintf("layers.%d.", l)
		L := Layer{Index: l, Attn: l >= c.Layers || c.LayerTypes[l] == format.FullAttention}
		L.InNorm = b.vec(p + "input_layernorm.weight")
		L.PostNorm = b.vec(p + "post_attention_layernorm.weight")
		if L.Attn {
			L.Q = b.mat(p + "self_attn.q_proj.weight")
			L.K = b.mat(p + "self_attn.k_proj.weight")
			L.V = b.mat(p + "self_attn.v_proj.weight")
			L.O = b.mat(p + "self_attn.o_proj.weight")
			L.QNorm = b.vec(p + "self_attn.q_norm.weight")
			L.KNorm = b.vec(p + "self_attn.k_norm.weight")
		} else {
			L.QKV = b.mat(p + "linear_attn.in_proj_qkv.weight")
			L.Z = b.mat(p + "linear_attn.in_proj_z.weight")
			L.B = b.mat(p + "linear_attn.in_proj_b.weight")
			L.A = b.mat(p + "linear_attn.in_proj_a.weight")
			L.Conv = b.vec(p + "linear_attn.conv1d.weight")
			if K := c.ConvKernel; K > 0 {
				cd := len(L.Conv) / K
				L.ConvT = make([]float32, len(L.Conv))
				for ch := 0; ch < cd; ch++ {
					for j := 0; j < K; j++ {
						L.ConvT[j*cd+ch] = L.Conv[ch*K+j]
					}
				}
			}
			L.ALog = b.vec(p + "linear_attn.A_log")
			L.DtBias = b.vec(p + "linear_attn.dt_bias")
			L.GNorm = b.vec(p + "linear_attn.norm.weight")
			L.Out = b.mat(p + "linear_attn.out_proj.weight")
		}
		L.Router = b.mat(p + "mlp.gate.weight")
		if c.SharedInter > 0 {
			L.HasShared = true
			L.SharedGate = b.mat(p + "mlp.shared_expert.gate_proj.weight")
			L.SharedUp = b.mat(p + "mlp.shared_expert.up_proj.weight")
			L.SharedDown = b.mat(p + "mlp.shared_expert.down_proj.weight")
			L.SharedExpertGate = b.mat(p + "mlp.shared_expert_gate.weight")
		}
		return L
	}
	for l := 0; l < c.Layers; l++ {
		m.Layers = append(m.Layers, layer(l))
	}
	if c.MTPLayers > 0 {
		ml := layer(c.Layers)
		m.MTP = &MTPHead{
			FC:         b.mat("mtp.fc.weight"),
			NormEmbed:  b.vec("mtp.pre_fc_norm_embedding.weight"),
			NormHidden: b.vec("mtp.pre_fc_norm_hidden.weight"),
			Norm:       b.vec("mtp.norm.weight"),
			Layer:      &ml,
		}
	}
	return b.err
}

// DenseBytes is the size of the resident dense weights.
func (m *Model) DenseBytes() int64 { return m.Manifest.DenseBytes }
