package experts

import (
	"fmt"
	"runtime"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/platform"
)

// Budget sizes the pool. Exactly one of PoolBytes, MemoryBytes, or neither
// (auto) applies.
type Budget struct {
	PoolBytes   int64 // --pool-mb: the pool alone
	MemoryBytes int64 // --memory-gb: everything (dense + state + scratch + pool)
	// What else the process holds, for MemoryBytes and auto.
	DenseBytes, StateBytes, ScratchBytes int64
	PolicyBytes                          int64 // the eviction policy's state (PolicyBytes)
	// Avail, when positive, is the memory the process could use before it
	// loaded anything counted above (AvailFrom says where the figure came
	// from); auto sizing subtracts every counted byte from it. Zero reads
	// the figure when sizing, which is right only while nothing counted
	// has been loaded yet: dense weights already read into memory are gone
	// from MemAvailable, and counting them again would take their size
	// from the pool.
	Avail     int64
	AvailFrom string
}

// Overhead is what the Go runtime, the binary and the tokenizer take
// beyond the counted buffers, measured as the VmHWM of `sluice run` on the
// tiny models minus their counted bytes (about 20 MiB), with margin.
const Overhead = 48 << 20

// Plan is the pool a Budget yields.
type Plan struct {
	Slots    int    // pool slots (0 with Resident)
	Resident bool   // auto only: every expert fits, so map the store whole
	Why      string // what was chosen and from what, for the summary line
}

// Size plans the pool for a model whose expert store is st with records
// records.
func (b Budget) Size(c *format.Config, st *format.ExpertStore, records int) (Plan, error) {
	all := int64(records) * st.Stride
	fixed := b.DenseBytes + b.StateBytes + b.ScratchBytes + b.PolicyBytes + Overhead
	minSlots := MinSlots(c)
	minPool := int64(minSlots) * st.Stride
	slotsFor := func(bytes int64) int { return int(min(bytes/st.Stride, int64(records))) }
	switch {
	case b.PoolBytes > 0:
		if b.PoolBytes < minPool {
			return Plan{}, fmt.Errorf("--pool-mb %.3g is below the smallest pool, %d experts of %s = %.3g MiB", mb(b.PoolBytes), minSlots, mib(st.Stride), mb(minPool))
		}
		n := slotsFor(b.PoolBytes)
		return Plan{Slots: n, Why: fmt.Sprintf("pool %d slots (%s, %.0f%% of the experts' %s) from --pool-mb", n, mib(int64(n)*st.Stride), pct(n, records), mib(all))}, nil
	case b.MemoryBytes > 0:
		pool := b.MemoryBytes - fixed
		if pool < minPool {
			return Plan{}, fmt.Errorf("--memory-gb %.2f leaves %.1f MiB for experts after dense %s, state %s, scratch %s, eviction policy %s and runtime %s; the smallest pool is %.1f MiB (--memory-gb %.2f)",
				float64(b.MemoryBytes)/(1<<30), mb(pool), mib(b.DenseBytes), mib(b.StateBytes), mib(b.ScratchBytes), mib(b.PolicyBytes), mib(Overhead), mb(minPool), float64(fixed+minPool)/(1<<30)+0.005)
		}
		n := slotsFor(pool)
		return Plan{Slots: n, Why: fmt.Sprintf("pool %d slots (%s, %.0f%% of the experts' %s) from --memory-gb %.2f", n, mib(int64(n)*st.Stride), pct(n, records), mib(all), float64(b.MemoryBytes)/(1<<30))}, nil
	}
	avail, src := b.Avail, b.AvailFrom
	if avail <= 0 {
		avail, src = Available()
	}
	if avail <= 0 {
		return Plan{Resident: true, Why: "experts mapped whole (no memory limit found)"}, nil
	}
	// Headroom: a tenth of what is available and at least 256 MiB, for
	// the page cache of dense.bin and for other processes.
	usable := avail - max(avail/10, 256<<20)
	if fixed+all <= usable {
		return Plan{Resident: true, Why: fmt.Sprintf("experts mapped whole: %s fit in %s usable of %s", mib(all), mib(usable-fixed), src)}, nil
	}
	pool := usable - fixed
	if pool < minPool {
		return Plan{}, fmt.Errorf("%s leaves %.1f MiB for experts; the smallest pool is %.1f MiB", src, mb(pool), mb(minPool))
	}
	n := slotsFor(pool)
	return Plan{Slots: n, Why: fmt.Sprintf("pool %d slots (%s, %.0f%% of the experts' %s) auto-sized from %s", n, mib(int64(n)*st.Stride), pct(n, records), mib(all), src)}, nil
}

func mb(n int64) float64         { return float64(n) / (1 << 20) }
func pct(n, records int) float64 { return 100 * float64(n) / float64(records) }

// Available returns the memory this process may still use, with a
// description of where the figure came from (-1 when the platform gives
// none): see platform.Available.
func Available() (int64, string) { return platform.Available() }

// StateBytes is a sequence state of ctx positions as a model of c's
// family allocates it (model.StatesBytes over the family's layer states,
// with rings of window + model.DefaultMaxBatch rows): what the budget must
// leave besides the pool for each sequence. A config the family cannot
// lay out (refused later, when it loads) gets the plain-attention estimate
// of roughStateBytes.
func StateBytes(c *format.Config, ctx int) int64 {
	if f, err := family.Named(c.Family); err == nil {
		if a, err := f.Build(c, block.Specs()); err == nil {
			var mtp *block.StateSpec
			if a.MTP != nil {
				mtp = &a.MTPState
			}
			return model.StatesBytes(a.States, mtp, ctx, model.DefaultMaxBatch, c.Hidden)
		}
	}
	return roughStateBytes(c, ctx)
}

// roughStateBytes estimates a state from the config alone: every
// full-attention layer (and an MTP layer) a KV cache of ctx positions,
// every other layer a DeltaNet's conv history and recurrent matrix.
func roughStateBytes(c *format.Config, ctx int) int64 {
	var n int64
	kvw := int64(c.KVHeads * c.HeadDim)
	convDim := int64(2*c.LinearKeyHeads*c.LinearKeyDim + c.LinearValueHeads*c.LinearValueDim)
	for _, t := range c.LayerTypes {
		if t == format.FullAttention {
			n += 2 * int64(ctx) * kvw * 4
		} else {
			n += (int64(c.ConvKernel-1)*convDim + int64(c.LinearValueHeads*c.LinearKeyDim*c.LinearValueDim)) * 4
		}
	}
	if c.MTPLayers > 0 {
		n += 2 * int64(ctx) * kvw * 4
	}
	return n
}

// LogitBytes is rows rows of logits over c's vocabulary: buffers that a
// runner's callers hand Forward, which its scratch (ScratchBytes) does not
// hold.
func LogitBytes(c *format.Config, rows int) int64 {
	return 4 * int64(rows) * int64(c.Vocab)
}

// ScratchBytes bounds a runner's buffers for batches of rows rows on
// threads threads (0: one per CPU, as the runner's pool takes them) over
// ctx positions: the rows' own buffers, each thread's expert buffers and
// int8 activations, and the attention's softmax weights, which grow with
// the context. With the family's blocks (built from c, as StateBytes
// builds them) it counts the dense layers' intermediate and DeepSeek's
// latent attention too.
func ScratchBytes(c *format.Config, rows, threads, ctx int) int64 {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	r, T := int64(rows), int64(threads)
	H, E, K := int64(c.Hidden), int64(c.Experts), int64(c.TopK)
	Imoe := int64(max(c.MoEInter, c.SharedInter))
	I, wide := Imoe, max(2*H, Imoe, int64(c.Heads*c.HeadDim))
	var extra int64 // floats
	// Softmax weights, grown to a power of two of at least 4096 positions
	// per thread and head of a decode's group.
	span := int64(4096)
	for span < int64(ctx) {
		span *= 2
	}
	extra += T * 8 * span
	// Each thread's rooms for widened scales (kernels.scaleRoom floats):
	// the pool's for its part of a product, the pool's for a worker that
	// helps with a part the dispatcher took (Pool.late), and its own
	// Scratch's for the experts it runs.
	extra += T * 3 * 4096
	if f, err := family.Named(c.Family); err == nil {
		if a, err := f.Build(c, block.Specs()); err == nil {
			layers := a.Layers
			if a.MTP != nil {
				layers = append(layers[:len(layers):len(layers)], a.MTP.Layer)
			}
			mla := false
			for _, L := range layers {
				if m, ok := L.FFN.(*block.MLP); ok {
					I = max(I, int64(m.Inter))
					wide = max(wide, int64(m.Inter))
				}
				if m, ok := L.Mixer.(*block.MLA); ok && !mla {
					mla = true
					w := int64(m.KVLora + m.RopeDim)
					nh := int64(m.Heads)
					extra += r * (int64(m.QLora) + nh*int64(m.Nope+m.RopeDim) + w + nh*w + nh*int64(m.V))
					// Each thread's latent outputs, softmax weights and sums for a
					// group of 8 heads (model.latentGroup), the weights over the
					// context.
					extra += T * 8 * (int64(m.KVLora) + span + 1)
					// Each thread's head of the absorb (q_nope in, W_k^T·q_nope
					// out), and its product scratch: int8 activations (a
					// quarter float each), group scales and sums, and the
					// widened scales' room (kernels.scaleRoom).
					nk := int64(max(m.Nope, m.KVLora))
					extra += T * (r*int64(m.Nope+m.KVLora) + r*nk/4 + 2*r*nk/64 + nk + 4096)
					wide = max(wide, int64(m.QLora), nh*int64(m.V))
					if ix := m.Index; ix != nil {
						extra += r * (int64(ix.Heads*ix.Dim) + int64(ix.Dim) + int64(ix.Heads) + 2*int64(ix.TopK) + 2)
						extra += T * int64(ix.TopK) * w // each thread's copy of a row's selected latents
					}
					extra += T * span * 3 // the indexer's scores and order, per thread
				}
			}
		}
	}
	qkv := int64(max(c.Heads*c.HeadDim*2, 2*c.LinearKeyHeads*c.LinearKeyDim+c.LinearValueHeads*c.LinearValueDim))
	wide = max(wide, qkv)
	// Logits are not the runner's: Forward writes them into its caller's
	// buffer (LogitBytes).
	perRow := 8*H + 2*E + K*H + 4*I + 4*qkv + 3*H // + the MTP head's rows
	// Each thread's expert buffers (input, gate, up) and int8 activations
	// with their group scales and sums; the pool's own activations for
	// the widest product.
	perThread := r*(H+2*Imoe)*4 + r*max(H, Imoe)*9/8
	main := r * wide * 9 / 8
	return 4*r*perRow + 4*int64(c.Vocab) + 4*extra + T*perThread + main
}
