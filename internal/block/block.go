// Package block holds the seam between a family's block order and the
// machine that runs it: the shared blocks a family is built from (norms,
// attention variants, gated DeltaNet, MoE with a routing rule, the MTP
// head), the tensor list that drives pack, load and shape checks, and the
// Backend interface a family's Forward calls.
//
// A block is a value: its weights and its options, set once by the family
// when the model loads. A family never sees SIMD, threads or devices: its
// Forward is a fixed sequence of Backend calls that branches on the config
// only, so a device backend can record it once per batch size and replay it.
package block

import (
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// Weight is one bound matrix: its manifest entry (what a device backend
// uploads) and the CPU view over the mapped file. The zero Weight is absent.
type Weight struct {
	T   *format.Tensor
	Mat kernels.Mat
}

// Present reports whether the weight was bound.
func (w *Weight) Present() bool { return w.T != nil }

// Norm is an RMSNorm over a row: x/rms(x)·w, or x/rms(x)·(1+w) when the
// checkpoint stores the weight zero-centred.
type Norm struct {
	W           []float32
	Eps         float32
	ZeroCentred bool
}

// Rope is a rotary embedding over the first Dim values of each head, the
// two halves rotated against each other. InvFreq has Dim/2 entries; the
// tables are multiplied by Scale (YaRN's attention factor; 1 otherwise).
type Rope struct {
	Dim     int
	InvFreq []float32
	Scale   float32
}

// Attn is grouped-query attention. q, k and v are projections of the
// normed input (plus their biases when present), the per-head norms apply
// when set, then the rope, then the softmax over the cache in position
// order; o is projected back (plus its bias).
type Attn struct {
	Q, K, V, O              Weight
	QB, KB, VB, OB          []float32 // projection biases, nil when absent
	QNorm, KNorm            *Norm     // per-head norms over head_dim, nil when absent
	Heads, KVHeads, HeadDim int
	Rope                    *Rope
	Scale                   float32 // on q·k
	// Gate: q carries a sigmoid output gate per head, [query ‖ gate] per
	// head, multiplied into the attention output before o.
	Gate bool
	// Sinks: one learned logit per head that joins every softmax and
	// takes its share of the weight, contributing no value.
	Sinks []float32
	// Window > 0 attends to the last Window positions only (the row's own
	// included); the layer's cache is then a ring (StateSpec.Ring).
	Window int
}

// DeltaNet is the gated DeltaNet mixer: causal depthwise conv over the
// q/k/v projections, the gated delta rule per value head, and a gated
// RMSNorm of the output.
type DeltaNet struct {
	QKV, Z, B, A Weight    // QKV [2*kd+vd][hidden], Z [vd][hidden], B, A [nv][hidden]
	Conv         []float32 // [2*kd+vd][kernel]
	ConvT        []float32 // [kernel][2*kd+vd]: Conv by tap, for channel-contiguous passes
	ALog, DtBias []float32 // [nv]
	GNorm        Norm      // over v_head_dim
	Out          Weight    // [hidden][vd]

	KeyHeads, ValueHeads, KeyDim, ValueDim, Kernel int
}

// Score is how a router turns logits into the weights of its top k.
type Score int

const (
	// SoftmaxTopK: softmax over every expert, the k largest, renormalised
	// when MoE.NormTopK (Qwen).
	SoftmaxTopK Score = iota
	// TopKSoftmax: the k largest logits, softmax over those k (gpt-oss).
	TopKSoftmax
)

// Act is the activation between an expert's gate/up and down projections.
type Act int

const (
	// SwiGLU: silu(gate)·up.
	SwiGLU Act = iota
	// ClampedSwiGLU: gate clamped above at 7, up to ±7, then
	// gate·sigmoid(1.702·gate)·(up+1) (gpt-oss).
	ClampedSwiGLU
)

// MLP is a dense gated MLP (the shared expert).
type MLP struct {
	Gate, Up, Down Weight
	Inter          int
}

// MoE is a routed mixture of experts. Experts come from the Provider under
// expert layer Layer; the routed outputs are summed in router order.
type MoE struct {
	Layer      int
	Pre        *Norm // the norm that feeds it (the lookahead applies it)
	Router     Weight
	RouterBias []float32 // added to the logits, nil when absent
	Score      Score
	NormTopK   bool
	Act        Act
	Shared     *MLP   // nil when absent
	SharedGate Weight // [1][hidden] sigmoid gate of the shared expert
}

// Mixer is a layer's token mixer: attention or DeltaNet.
type Mixer interface {
	Mix(b Backend, cache int)
}

// Mix runs the attention over cache.
func (a *Attn) Mix(b Backend, cache int) { b.Attention(a, cache) }

// Mix runs the DeltaNet over the recurrent state cache.
func (d *DeltaNet) Mix(b Backend, cache int) { b.DeltaNet(d, cache) }

// Layer is the pre-norm decoder layer every family so far uses:
// h = In(x); x += Mixer(h); h = Post(x); x += MoE(h).
type Layer struct {
	In, Post Norm
	Mixer    Mixer
	MoE      MoE
}

// MTP is a multi-token-prediction head (Qwen3.5): fc over the normed
// embedding of the next token and the normed trunk hidden, one decoder
// layer with its own KV cache, a final norm and the shared lm_head.
type MTP struct {
	FC                    Weight
	NormEmbed, NormHidden Norm
	Norm                  Norm
	Layer                 Layer
}

// Buf names one of the step's [rows][hidden] buffers.
type Buf int

const (
	// X is the residual stream.
	X Buf = iota
	// H is the normed input of the current block.
	H
	// Y is the output of the last block, not yet added to X.
	Y
)

// Backend runs blocks over the rows of one step. Every op is
// batch-invariant: row i's bits depend only on row i, the weights and the
// cache rows at or before its position, summed in a fixed order.
type Backend interface {
	// Norm adds Y into X when add is set, then writes n(X) into H.
	Norm(n *Norm, add bool)
	// Attention writes attention(H) into Y, appending the rows' keys and
	// values to cache.
	Attention(a *Attn, cache int)
	// DeltaNet writes deltanet(H) into Y, advancing the recurrent state
	// cache.
	DeltaNet(d *DeltaNet, cache int)
	// MoE writes moe(H) into Y.
	MoE(m *MoE) error
	// Emit reports buffer b under a name of refs/layers (a no-op unless
	// tracing).
	Emit(name string, layer int, b Buf)
}

// Forward runs layers over the step: the shared pre-norm block order, with
// the trace names of refs/layers.
func Forward(b Backend, layers []Layer) error {
	for i := range layers {
		L := &layers[i]
		b.Norm(&L.In, i > 0) // the previous layer's residual add, fused into this norm
		if i > 0 {
			b.Emit("layer_out", i-1, X)
		}
		b.Emit("input_norm", i, H)
		L.Mixer.Mix(b, i)
		b.Emit("mixer_out", i, Y)
		b.Norm(&L.Post, true)
		b.Emit("post_norm", i, H)
		if err := b.MoE(&L.MoE); err != nil {
			return err
		}
		b.Emit("moe_out", i, Y)
	}
	return nil
}

// StateKind is what a layer keeps between steps.
type StateKind int

const (
	// KV: every position's keys and values.
	KV StateKind = iota
	// Ring: keys and values of the last Window positions plus room for one
	// batch, so that no row of a batch overwrites a row another row of the
	// same batch still attends to.
	Ring
	// Recurrent: the DeltaNet conv history and recurrent matrix.
	Recurrent
)

// StateSpec is one layer's state.
type StateSpec struct {
	Kind    StateKind
	KVWidth int // KV, Ring: kv_heads·head_dim per position
	Window  int // Ring
	// Recurrent: conv history and matrix sizes in floats.
	ConvFloats, RecFloats int
}
