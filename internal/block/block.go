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
	// SigmoidGroups: sigmoid scores; the choice adds the correction bias,
	// keeps the TopGroups groups whose two best choices sum highest, and
	// takes the k best there; the weights are the chosen scores,
	// renormalised when NormTopK, times Scale (DeepSeek).
	SigmoidGroups
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
	// SigmoidGroups: the correction bias (choice only), the groups the
	// experts split into, how many groups stay, the weights' scale.
	Correction        []float32
	Groups, TopGroups int
	Scale             float32
	Act               Act
	Shared            *MLP   // nil when absent
	SharedGate        Weight // [1][hidden] sigmoid gate of the shared expert
}

// MLA is DeepSeek's multi-head latent attention, run absorbed: the cache
// holds one latent per position, [kv_a_layernorm(c) ‖ rope(k_rot)]
// (KVLora + RopeDim floats); each head's query becomes [W_k^T·q_nope ‖
// q_rot] over that latent, and its output W_v·(Σ p·c). The sum order is the
// same alone, in a chunk or in a verify batch.
type MLA struct {
	QA      Weight // q_a_proj [q_lora][hidden]
	QANorm  Norm   // over q_lora
	QB      Weight // q_b_proj [heads·(nope+rope)][q_lora], each head's rope part de-interleaved by the packer
	KVA     Weight // kv_a_proj_with_mqa [kv_lora+rope][hidden], rope part de-interleaved
	KVANorm Norm   // over kv_lora
	// WK and WV are kv_b_proj split by the packer: WK [heads·kv_lora][nope]
	// holds each head's W_k transposed, so that the absorb (W_k^T·q_nope)
	// is a product of rows as every other; WV [heads·v][kv_lora] holds each
	// head's W_v. Both at the pack's bits.
	WK, WV Weight
	O      Weight // [hidden][heads·v]

	Heads, Nope, RopeDim, V, KVLora, QLora int
	Rope                                   *Rope
	Scale                                  float32
	// Index selects the positions each row attends to (DeepSeek sparse
	// attention); nil attends to every position.
	Index *Indexer
}

// Indexer is DeepSeek-V3.2's lightning indexer: per position t,
// Σ_h w_h·relu(scale·q_h·k_t) with w = weights_proj(x)·heads^-½, and each
// row attends to its TopK best positions (all of them while it has no more
// than TopK), in position order.
type Indexer struct {
	WQ               Weight    // wq_b [heads·dim][q_lora]
	WK               Weight    // wk [dim][hidden]
	KNorm            []float32 // LayerNorm weight [dim]
	KBias            []float32 // LayerNorm bias [dim]
	Weights          Weight    // weights_proj [heads][hidden]
	Eps              float32
	Heads, Dim, TopK int
}

// Mix runs the latent attention over cache.
func (m *MLA) Mix(b Backend, cache int) {
	b.MLAProject(m)
	b.MLAPrep(m, cache)
	if m.Index != nil {
		b.Select(m, cache)
	}
	b.MLAAttend(m, cache)
}

// Mixer is a layer's token mixer: attention or DeltaNet.
type Mixer interface {
	Mix(b Backend, cache int)
}

// Mix runs grouped-query attention over cache: Y = attention(H).
func (a *Attn) Mix(b Backend, cache int) {
	b.Project(a)
	b.Prep(a, cache)
	b.Attend(a, cache)
	b.AttnOut(a)
}

// Mix runs the gated DeltaNet over the recurrent state cache: Y =
// deltanet(H).
func (d *DeltaNet) Mix(b Backend, cache int) {
	b.DNProject(d)
	b.Conv(d, cache)
	b.DNPrep(d)
	b.DeltaRule(d, cache)
	b.DNGate(d)
	b.DNOut(d)
}

// Forward runs the MoE: Y = moe(H).
func (m *MoE) Forward(b Backend) error {
	b.RouterLogits(m)
	b.Route(m)
	if err := b.Experts(m); err != nil {
		return err
	}
	b.Combine(m)
	return nil
}

// FFN is a layer's feed-forward block: a routed MoE or a dense MLP.
type FFN interface {
	Forward(b Backend) error
}

// Forward runs the dense MLP: Y = down(silu(gate(H))·up(H)).
func (m *MLP) Forward(b Backend) error {
	b.Dense(m)
	return nil
}

// Layer is the pre-norm decoder layer every family so far uses:
// h = In(x); x += Mixer(h); h = Post(x); x += FFN(h).
type Layer struct {
	In, Post Norm
	Mixer    Mixer
	FFN      FFN
}

// MoE returns the layer's MoE, or nil for a dense layer.
func (l *Layer) MoE() *MoE {
	m, _ := l.FFN.(*MoE)
	return m
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

// Backend runs the ops of blocks over the rows of one step. Every op is
// batch-invariant: row i's bits depend only on row i, the weights and the
// cache rows at or before its position, summed in a fixed order. Ops read
// and write the step's buffers (X, H, Y) and the block's own scratch,
// which the backend holds; a block's composition (Attn.Mix,
// DeltaNet.Mix, MoE.Forward) is the same on every backend.
type Backend interface {
	// Norm adds Y into X when add is set, then writes n(X) into H.
	Norm(n *Norm, add bool)

	// Project writes the q, k and v projections of H (plus biases).
	Project(a *Attn)
	// Prep applies the per-head norms and the rope to q and k and appends
	// the rows' keys and values to cache.
	Prep(a *Attn, cache int)
	// Attend computes each row's softmax over its positions of cache
	// (window, sinks, output gate as a says) into the attention output.
	Attend(a *Attn, cache int)
	// AttnOut writes Y = O·output (plus its bias).
	AttnOut(a *Attn)

	// MLAProject writes the latent attention's (and its indexer's)
	// projections of H.
	MLAProject(m *MLA)
	// MLAPrep norms the latents, applies the rope, absorbs W_k into the
	// queries and appends the rows' latents (and indexer keys) to cache.
	MLAPrep(m *MLA, cache int)
	// Select picks each row's positions with the indexer.
	Select(m *MLA, cache int)
	// MLAAttend attends over the selected positions of cache and writes
	// Y = O·(W_v·output).
	MLAAttend(m *MLA, cache int)

	// DNProject writes the q/k/v, z, b and a projections of H.
	DNProject(d *DeltaNet)
	// Conv runs the causal depthwise conv and SiLU over the q/k/v
	// projections, advancing cache's conv history.
	Conv(d *DeltaNet, cache int)
	// DNPrep normalises q and k per head and computes beta and the decay.
	DNPrep(d *DeltaNet)
	// DeltaRule runs the gated delta rule over the rows in order,
	// advancing cache's recurrent matrix.
	DeltaRule(d *DeltaNet, cache int)
	// DNGate applies the gated RMSNorm to the output.
	DNGate(d *DeltaNet)
	// DNOut writes Y = Out·output.
	DNOut(d *DeltaNet)

	// RouterLogits computes the router's logits of H (plus its bias).
	RouterLogits(m *MoE)
	// Route picks each row's top-k experts and their weights.
	Route(m *MoE)
	// Experts computes the routed experts (from the provider) and the
	// shared expert of every row.
	Experts(m *MoE) error
	// Combine writes Y = Σ_k w_k·expert_k(H) in router order (plus the
	// shared expert, gated when SharedGate is present).
	Combine(m *MoE)
	// Dense writes Y = mlp(H).
	Dense(m *MLP)

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
		if err := L.FFN.Forward(b); err != nil {
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
	// Latent: MLA's latent per position (KVWidth floats) and the
	// indexer's key (IndexWidth floats, 0 without an indexer).
	Latent
)

// StateSpec is one layer's state.
type StateSpec struct {
	Kind       StateKind
	KVWidth    int // KV, Ring: kv_heads·head_dim per position; Latent: the latent's width
	IndexWidth int // Latent: the indexer key's width
	Window     int // Ring
	// Latent with an indexer: the positions a step attends to at most
	// (the indexer's top-k); 0 for every position.
	Attend int
	// Recurrent: conv history and matrix sizes in floats.
	ConvFloats, RecFloats int
}
