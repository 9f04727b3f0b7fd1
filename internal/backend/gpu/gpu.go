//go:build linux

// Package gpu runs the forward pass of a loaded model on an NVIDIA GPU:
// the family's block order drives Runner (a block.Backend) exactly as it
// drives the CPU's model.Runner. Dense weights, each sequence's KV cache
// and DeltaNet state and all scratch live in device memory, allocated when
// the model loads (a sequence's state when it first runs); a step
// allocates nothing on the device. The routed experts live there too when
// they fit, else they stream through a device pool filled from the host's
// experts (pool.go). The host does what is cheap and sequential: the
// embedding rows and rotary tables of the step's tokens, and, once per
// MoE layer, the grouping of rows by expert (the chosen experts come back
// to the host, which picks the weights to multiply and, with a pool,
// their slots).
package gpu

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"unsafe"
	"weak"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// mat is a matrix in device memory.
type mat struct {
	kind       format.Kind
	rows, cols int
	q, s, b    uintptr // quantised: codes, scales, biases
	p          uintptr // bf16 or f32 values
	bias       uintptr // f32 [rows] added to every product (an expert's bias), 0 when none
}

// expert is one routed expert on the device.
type expert struct{ gate, up, down mat }

// dstate is one sequence's state on the device.
type dstate struct {
	graph     *graph            // the recorded decode step (one row), over this state's buffers
	vgraph    map[int]*graph    // recorded verify steps, by rows
	mgraph    map[mtpKey]*graph // recorded MTP head rows (mtp.go)
	ctx       int
	pos       int       // positions the device state holds
	kc, vc    []uintptr // per layer, then the MTP layer's (index len(layers)) when the model has one
	ring      []int     // per layer as kc: a sliding window's ring of rows (position p at row p % ring), 0 for a plain cache
	conv, rec []uintptr
	convN     []int // floats of conv and rec per layer
	recN      []int
	buf       cuda.Buf
}

// Runner is the CUDA backend of one model on one GPU. Like model.Runner it
// serves one step at a time.
type Runner struct {
	M   *model.Model // the model, whose blocks drive the backend
	Dev *cuda.Device // the GPU; the caller owns it (Close leaves it open)
	k   *cuda.Kernels
	s   cuda.Stream

	maxRows, H, V, E, K, I int
	ctx                    int // the most positions a sequence state may hold
	nstates                int // the most sequence states at once (Config.States)
	xl                     int // expert layers: the trunk's, then the MTP layer's when there is one

	mtp mtpHead // the MTP head and the speculative verify (mtp.go)
	mla mlaBufs // DeepSeek's latent attention's scratch (mla.go)
	hyb hybrid  // the CPU's share of a decode step's pool misses (hybrid.go)

	mats    map[*block.Weight]mat
	vecs    map[*float32]uintptr
	mlaTab  map[*block.MLA]mlaTabs // each latent attention's W_k and W_v tables (mla.go)
	headOf  uintptr                // int32 [slots]: slot k's head, k % heads (headTabs)
	experts []expert               // [layer*E + e]; nil when they stream through pool
	// pool, when the experts do not all live in device memory, holds the
	// ones the router asked for lately (pool.go); waveSlot is its scratch.
	pool      *vpool
	streaming bool // the experts stream through pool
	waveSlot  []int
	weights   []cuda.Buf
	// Per expert layer, the device tables of expert addresses [E][3]
	// (gate, up, down) that a recorded decode step reads the router's
	// choice through; exKind is their kind ("" when a recorded step cannot
	// run these experts).
	tabGate, tabUp, tabDown []uintptr
	// tabBias, when the experts carry biases, is per expert layer the
	// device table [E+1][3] of their addresses (gate, up, down; 0 for the
	// shared expert's slot).
	tabBias    []uintptr
	exKind     string
	posK       uintptr // int32 [Rows·K+1] = 0, 1, ...: a recorded step's combine order
	rowOf      uintptr // int32 [Rows·K+1] = j/K: the row slot j of a recorded multi-row step reads
	idsG       uintptr // int32 [K+1]: a recorded one-row step's experts, then E (the shared expert)
	sharedSlot bool    // the shared expert runs as slot K of a recorded step
	posDev     uintptr // int32 [Rows]: the positions of a recorded step's rows

	// NoGraphs turns off recording and replaying the decode step (one row
	// per step): every op is then launched from the host.
	NoGraphs bool
	graphing bool // a decode step is being recorded
	// Replays and the kernels they ran, for the launch counts.
	replays, replayed uint64

	// Device scratch.
	scratch                  cuda.Buf
	x, h, y, final, cos, sin uintptr
	q, kk, v, o, attS        uintptr
	attSBytes                int // attS's size: the attention takes its rows in groups that fit
	qkv, z, db, da, dno      uintptr
	rl, ids, w, gidx, posd   uintptr
	rl2, ids2, w2            uintptr // the next layer's router on this layer's input (the pool's lookahead)
	gin, g, u, outk          uintptr
	sg, su, shared, sgate    uintptr
	logits, am               uintptr
	x8, xs, xsum             uintptr
	tiles                    uintptr // cuda.Tile [rows·K]: a prefill chunk's experts' tiles (groupedExperts)

	// Pinned host memory: the step's inputs and what comes back.
	pin                    cuda.Host
	px, pcos, psin         []float32
	pids, pgidx, ppos, pam []int32
	pids2                  []int32 // the lookahead's ids
	pw                     []float32
	plog                   cuda.Host
	offX, offCos, offSin   int
	offIds, offW, offGidx  int
	offPos, offAm, offPosW int
	offIds2, offTiles      int
	ptiles                 []cuda.Tile

	// Host grouping of a step's rows by expert.
	grp model.ExpertGroups

	mu     sync.Mutex
	states map[weak.Pointer[model.State]]*dstate

	// The step in flight.
	cur     *dstate
	pos, nb int
	err     error

	prof *profile // phase timing, nil unless EnableProfile

	// The forward call in flight, for fwdFn (a method value made once, so
	// that handing a step to the device thread allocates nothing).
	fa    fwdArgs
	fwdFn func() error
}

type fwdArgs struct {
	st          *model.State
	tokens      []int
	out         []float32
	all, argmax bool
	best        int
	bestAll     []int // with all and argmax: every row's choice
}

var _ block.Backend = (*Runner)(nil)

// Supported reports why m cannot run on the GPU backend, or nil.
func Supported(m *model.Model) error {
	c := &m.Config
	// qwen3_next is packed into qwen3_5_moe's tensors and block order.
	switch c.Family {
	case "qwen3_moe", "qwen3_5_moe", "qwen3_next", "glm4_moe", "gpt_oss", "deepseek_v32":
	default:
		return fmt.Errorf("the GPU backend runs qwen3_moe, qwen3_5_moe, qwen3_next, glm4_moe, gpt_oss and deepseek_v32; %s runs on the CPU only", c.Family)
	}
	layers := allLayers(m)
	if !slices.ContainsFunc(layers, func(L block.Layer) bool { return L.MoE() != nil }) {
		return fmt.Errorf("the model has no MoE layer")
	}
	for i := range layers {
		L := &layers[i]
		switch x := L.Mixer.(type) {
		case *block.Attn:
			if (x.QNorm == nil) != (x.KNorm == nil) {
				return fmt.Errorf("layer %d: attention variant not supported on the GPU", i)
			}
		case *block.DeltaNet:
			if x.KeyDim != 32 && x.KeyDim != 64 && x.KeyDim != 128 {
				return fmt.Errorf("layer %d: DeltaNet key dim %d not supported on the GPU (32, 64 or 128)", i, x.KeyDim)
			}
		case *block.MLA:
			if x.Index != nil && x.Index.TopK < 1 {
				return fmt.Errorf("layer %d: an indexer keeping %d positions", i, x.Index.TopK)
			}
		default:
			return fmt.Errorf("layer %d: mixer %T not supported on the GPU", i, L.Mixer)
		}
		if _, ok := L.FFN.(*block.MLP); ok {
			continue // a dense layer: SwiGLU
		}
		moe := L.MoE()
		ok := moe != nil && (moe.Act == block.SwiGLU || moe.Act == block.ClampedSwiGLU)
		if ok {
			switch moe.Score {
			case block.SoftmaxTopK:
			case block.SigmoidGroups:
				ok = c.Experts <= 1024 && moe.Groups >= 1 && moe.Groups <= 64
			case block.TopKSoftmax:
				ok = c.Experts <= 1024
			default:
				ok = false
			}
		}
		if !ok {
			return fmt.Errorf("layer %d: feed-forward block not supported on the GPU", i)
		}
	}
	if c.TopK > 32 {
		return fmt.Errorf("top-%d routing not supported on the GPU (at most 32)", c.TopK)
	}
	if m.Manifest != nil && len(m.Manifest.Stores) > 0 {
		if k := m.Manifest.Stores[0].Kind; k == format.MXFP4 {
			// The release's gpt-oss experts, kept MXFP4 by pack at 4 bits:
			// the device has no kernel for them.
			return fmt.Errorf("%s experts run on the CPU only; a pack at --bits 8 runs on the GPU", k)
		}
	}
	return nil
}

// plainSwiGLU reports whether every MoE of layers runs SwiGLU.
func plainSwiGLU(layers []block.Layer) bool {
	return !slices.ContainsFunc(layers, func(L block.Layer) bool { m := L.MoE(); return m != nil && m.Act != block.SwiGLU })
}

// allLayers is m's trunk, then its MTP layer when it has one: the layers
// whose weights and experts live on the device.
func allLayers(m *model.Model) []block.Layer {
	layers := m.Arch.Layers
	if m.MTP != nil {
		layers = append(layers[:len(layers):len(layers)], m.MTP.Layer)
	}
	return layers
}

// NeedBytes is the device memory m's weights need: dense weights and every
// expert of the MoE layers (scratch and each sequence's state come on
// top). A dense layer's records are holes in the store, never uploaded.
func NeedBytes(m *model.Model) (dense, experts int64) {
	dense = m.Manifest.DenseBytes
	n := 0
	for _, L := range allLayers(m) {
		if L.MoE() != nil {
			n++
		}
	}
	for _, st := range m.Manifest.Stores[:1] {
		experts = int64(n) * int64(m.Manifest.Experts) * st.Stride
	}
	return dense, experts
}

// Config says how a Runner is laid out on its device.
type Config struct {
	Rows int // the most rows a step takes
	Ctx  int // the most positions a sequence state may hold
	// PoolBytes or PoolShare (of the expert store), when set, stream the
	// routed experts through a device pool of that size, filled from the
	// model's host provider (m.Experts) as the router asks for them. When
	// neither is set every expert is uploaded if they fit in device
	// memory, else the pool takes what the rest leaves.
	PoolBytes int64
	PoolShare float64
	// Policy is the pool's eviction policy ("" is the host pool's
	// default); NoLookahead turns off the decode's copies of the next
	// layer's predicted experts (--lookahead=false, as on the CPU).
	Policy      experts.Policy
	NoLookahead bool
	// VRAMBytes, when set, is the most device memory the runner takes
	// (--vram-gb): the weights, scratch, the sequences' states and the
	// pool, which gets what the rest leaves. Unset, it is what the device
	// has free when New begins.
	VRAMBytes int64
	// States is the most sequence states used at once (a server's
	// slots; 0 is 1): each takes device memory when it first runs, so the
	// pool leaves room for them all.
	States int
	// Drafts is the most MTP drafts a speculative step verifies (0: no
	// speculative decoding). The verify's per-row DeltaNet snapshots,
	// Drafts of each recurrent layer's state, are allocated with the
	// scratch; the pool leaves room for them.
	Drafts int
	// CPUShare is the share of a decode step's pool misses, per layer,
	// that the host computes on its CPU from the host's copy of the
	// record instead of copying it to a slot (0: none; q4 experts only,
	// whose CPU product is the GPU's bit for bit), on CPUThreads threads
	// (0: half the CPUs). While the CPU multiplies, the GPU copies and
	// multiplies the rest. CPUAuto has a cost model pick each layer's
	// share instead, from the CPU's measured time per expert and the
	// link's per record (CPUShare is then unused); with experts of other
	// kinds it does nothing.
	CPUShare   float64
	CPUAuto    bool
	CPUThreads int
}

// ScratchReserve is what New keeps free beside the weights for scratch,
// sequence states and the driver.
const ScratchReserve = 256 << 20

// New uploads m to dev and prepares scratch for steps of up to c.Rows
// rows over sequences of up to c.Ctx positions. The routed experts are
// uploaded whole or stream through a pool (Config); a pool smaller than
// one token's experts of a layer is refused, saying what is needed.
func New(dev *cuda.Device, m *model.Model, cfg Config) (*Runner, error) {
	if err := Supported(m); err != nil {
		return nil, err
	}
	c := &m.Config
	r := &Runner{M: m, Dev: dev, maxRows: max(cfg.Rows, 1), ctx: max(cfg.Ctx, 1), H: c.Hidden, V: c.Vocab, E: c.Experts, K: c.TopK,
		I: c.MoEInter, nstates: max(cfg.States, 1), mats: map[*block.Weight]mat{}, vecs: map[*float32]uintptr{}, mlaTab: map[*block.MLA]mlaTabs{},
		states: map[weak.Pointer[model.State]]*dstate{}, xl: len(m.Arch.Layers)}
	if m.MTP != nil {
		r.xl++
		r.mtp.drafts = max(min(cfg.Drafts, r.maxRows-1), 0)
	}
	if cfg.Drafts < 0 {
		return nil, fmt.Errorf("gpu: %d drafts per step: want 0 or more", cfg.Drafts)
	}
	if cfg.CPUShare < 0 || cfg.CPUShare > 1 || math.IsNaN(cfg.CPUShare) {
		return nil, fmt.Errorf("gpu: a CPU share of the misses of %g: want 0..1", cfg.CPUShare)
	}
	// The CPU's buffers are laid out with the scratch.
	r.hyb.share, r.hyb.auto = cfg.CPUShare, cfg.CPUAuto
	r.fwdFn = r.doForward
	err := dev.Do(func() error {
		free0, _, err := dev.MemInfo()
		if err != nil {
			return err
		}
		budget := free0
		if cfg.VRAMBytes > 0 {
			budget = min(free0, cfg.VRAMBytes)
		}
		if r.streaming, err = r.wantPool(cfg, budget); err != nil {
			return err
		}
		if r.k, err = cuda.LoadKernels(dev); err != nil {
			return err
		}
		if r.s, err = dev.NewStream(); err != nil {
			return err
		}
		if err := r.upload(); err != nil {
			return err
		}
		if err := r.alloc(); err != nil || !r.streaming {
			return err
		}
		// The pool takes what the dense weights, the kernels and the
		// scratch left of the budget.
		free, _, err := dev.MemInfo()
		if err != nil {
			return err
		}
		slots, lay, rec, err := r.poolPlan(cfg, min(free, budget-(free0-free)))
		if err != nil {
			return err
		}
		if err := r.newPool(slots, lay, rec, cfg.Policy); err != nil {
			return err
		}
		r.pool.noLookahead = cfg.NoLookahead
		return r.newHybrid(cfg)
	})
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("gpu: %w", err)
	}
	return r, nil
}

func gib(n int64) float64 { return float64(n) / (1 << 30) }

// wantPool reports whether the experts stream through a pool: when one
// is asked for, or when they do not fit beside the dense weights, scratch
// and the sequences' states in budget bytes. It refuses a budget that does
// not hold the dense weights beside one token's experts of a layer.
func (r *Runner) wantPool(cfg Config, budget int64) (bool, error) {
	if cfg.PoolBytes < 0 || cfg.PoolShare < 0 || cfg.PoolShare > 1 {
		return false, fmt.Errorf("GPU expert pool: %d bytes or a share of %g: want a positive size or a share in (0,1]", cfg.PoolBytes, cfg.PoolShare)
	}
	if cfg.VRAMBytes < 0 {
		return false, fmt.Errorf("GPU memory budget of %d bytes: want a positive size", cfg.VRAMBytes)
	}
	dense, exps := NeedBytes(r.M)
	var stride int64
	if st := r.M.Manifest.Stores; len(st) > 0 {
		stride = st[0].Stride
	}
	if least := dense + r.reserve() + int64(r.K)*stride; least > budget {
		what := fmt.Sprintf("%s has %.2f GiB free", r.Dev.Name, gib(budget))
		if cfg.VRAMBytes > 0 && cfg.VRAMBytes == budget {
			what = fmt.Sprintf("--vram-gb gives %.2f GiB", gib(budget))
		}
		return false, fmt.Errorf("the dense weights (%.2f GiB), scratch and %d sequence state(s) (%.2f GiB) and one token's experts of a layer (%d records, %.2f GiB) need %.2f GiB on the GPU, and %s (use --device cpu)",
			gib(dense), r.nstates, gib(r.reserve()), r.K, gib(int64(r.K)*stride), gib(least), what)
	}
	// A host provider that gives low-bit records for its misses
	// (--miss-bits) is read through the pool, slot by slot, as the CPU's
	// pool reads it: an upload of every expert would take them at low bits.
	return cfg.PoolBytes > 0 || cfg.PoolShare > 0 || lowBits(r.M.Experts) != 0 || dense+exps+r.reserve() > budget, nil
}

// reserve is what the device must keep free beside the weights: scratch
// and the driver's margin (ScratchReserve), the sequences' states and a
// speculative verify's snapshots.
func (r *Runner) reserve() int64 { return ScratchReserve + r.stateBytes() + r.snapBytes() }

// stateBytes is the device memory of the sequences' states (Config.States)
// at the runner's context length.
func (r *Runner) stateBytes() int64 {
	var mtp *block.StateSpec
	if r.M.MTP != nil {
		mtp = &r.M.Arch.MTPState
	}
	// The host's layout, rings of window + the runner's rows (cacheRows),
	// without the host's copy of the MTP head's hidden row.
	return int64(r.nstates) * model.StatesBytes(r.M.Arch.States, mtp, r.ctx, r.maxRows, 0)
}

// cacheRows is a layer's cache rows on the device: the host's layout
// (model.CacheRows), with rings of window + the runner's rows.
func (r *Runner) cacheRows(sp block.StateSpec, ctx int) int {
	return model.CacheRows(sp, ctx, r.maxRows)
}

// latentWidths is the floats a position takes in a layer's two caches:
// keys and values alike, or for a latent layer the latent and the
// indexer's key (0 without an indexer).
func latentWidths(sp block.StateSpec) (kw, vw int) {
	if sp.Kind == block.Latent {
		return sp.KVWidth, sp.IndexWidth
	}
	return sp.KVWidth, sp.KVWidth
}

// ringRuns calls f(p, n) for runs of the positions a..b-1 that lie in
// consecutive rows both of a cache of dr rows and of one of sr rows (a
// ring holds position p at row p % rows; 0 rows: a plain cache, position
// p at row p).
func ringRuns(a, b, dr, sr int, f func(p, n int) error) error {
	for p := a; p < b; {
		n := b - p
		if dr > 0 {
			n = min(n, dr-p%dr)
		}
		if sr > 0 {
			n = min(n, sr-p%sr)
		}
		if err := f(p, n); err != nil {
			return err
		}
		p += n
	}
	return nil
}

// ringRow is position p's row in a cache of rows rows (0: a plain cache).
func ringRow(p, rows int) int {
	if rows > 0 {
		return p % rows
	}
	return p
}

// poolPlan sizes the pool, given the device memory free once the dense
// weights and the scratch are in place: slots records of rec bytes laid
// out as lay, as asked, or what the free memory holds beside the
// sequences' states.
func (r *Runner) poolPlan(cfg Config, free int64) (slots int, lay [3]matOffsets, rec int, err error) {
	if lay, rec, err = storeLayout(r.M); err != nil {
		return 0, lay, 0, err
	}
	records := r.xl * r.E
	state := r.stateBytes()
	room := fmt.Sprintf("%s has %.2f GiB free", r.Dev.Name, gib(free))
	if cfg.VRAMBytes > 0 {
		room = fmt.Sprintf("%.2f GiB of --vram-gb are left", gib(free))
	}
	switch {
	case cfg.PoolShare > 0:
		slots = int(cfg.PoolShare * float64(records))
	case cfg.PoolBytes > 0:
		slots = int(cfg.PoolBytes / int64(rec))
	default:
		slots = int(max(free-state-ScratchReserve, 0) / int64(rec))
	}
	slots = min(slots, records)
	if slots < r.K {
		return 0, lay, 0, fmt.Errorf("a GPU expert pool needs at least %d records (one token's experts of a layer, %.2f GiB) and got room or a request for %d; "+
			"with the dense weights and scratch in place %s, and the sequences' states need %.2f GiB (use --device cpu to stream experts on the CPU)",
			r.K, gib(int64(r.K*rec)), slots, room, gib(state))
	}
	if need := int64(slots)*int64(rec) + state + ScratchReserve; need > free {
		return 0, lay, 0, fmt.Errorf("a GPU expert pool of %d records (%.2f GiB) and the sequences' states (%.2f GiB) need %.2f GiB, and with the dense weights and scratch in place %s; ask for a smaller --gpu-pool-mb",
			slots, gib(int64(slots)*int64(rec)), gib(state), gib(need), room)
	}
	return slots, lay, rec, nil
}

// countUses adds a wave's hits and misses to ps.
func countUses(ps *experts.DevicePool, decode bool, hits, misses int) {
	ps.Hits += uint64(hits)
	ps.Misses += uint64(misses)
	if decode {
		ps.DecodeHits += uint64(hits)
		ps.DecodeMisses += uint64(misses)
	}
}

// countCopy adds a copy of bytes into a slot to ps.
func countCopy(ps *experts.DevicePool, decode bool, bytes uint64, low bool) {
	if low {
		ps.LowCopies++
	}
	ps.BytesUp += bytes
	if decode {
		ps.DecodeBytesUp += bytes
	}
}

// NewText tells the expert pool that a new, unrelated text begins: the
// eviction counts of the texts before weigh far less than the new one's
// (experts.Stream.NewText). Nothing without a pool.
func (r *Runner) NewText() {
	r.Dev.Do(func() error {
		if p := r.pool; p != nil {
			p.tab.ev.NewText()
		}
		return nil
	})
}

// Pool reports the expert pool's figures.
func (r *Runner) Pool() experts.DevicePool {
	var ps experts.DevicePool
	r.Dev.Do(func() error {
		if p := r.pool; p != nil {
			ps = p.stats
			ps.Slots, ps.RecordBytes = p.slots, p.rec
			c := &r.hyb.cost
			ps.CPUFirstMS, ps.CPUExpertMS, ps.CPULeadMS, ps.CopyRecordMS = c.first.get(), c.next.get(), c.lead.get(), c.copyMSB*c.recBytes
		}
		return nil
	})
	ps.Records = r.xl * r.E
	return ps
}

// arena lays out host slices in one device buffer.
type arena struct {
	size int
	srcs []piece
}

type piece struct {
	off int
	b   []byte
	// tiled, when set, is a tiled q4 matrix (the CPU's layout) whose
	// weights b are: they go up row-major, through a copy made as the
	// piece is committed, one matrix at a time.
	tiled *kernels.Mat
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// put reserves room for b (256-byte aligned) and returns its offset.
func (a *arena) put(b []byte) int {
	off := a.size
	a.srcs = append(a.srcs, piece{off: off, b: b})
	a.size += (len(b) + 255) &^ 255
	return off
}

// commit allocates the buffer and copies every piece in.
func (a *arena) commit(d *cuda.Device) (cuda.Buf, error) {
	buf, err := d.Alloc(max(a.size, 256))
	if err != nil {
		return buf, err
	}
	for _, p := range a.srcs {
		if p.tiled != nil {
			p.b = p.tiled.FlatQ()
		}
		if len(p.b) > 0 {
			if err := cuda.Upload(d, buf, p.off, p.b); err != nil {
				d.Free(buf)
				return cuda.Buf{}, err
			}
		}
	}
	return buf, nil
}

// matOffsets is a mat whose addresses are arena offsets until committed.
type matOffsets struct {
	m       mat
	q, s, b int
	p       int
	bias    int // the bias vector's offset; 0 for none (a matrix's data comes first)
}

func putMat(a *arena, km *kernels.Mat) matOffsets {
	o := matOffsets{m: mat{kind: km.Kind, rows: km.Rows, cols: km.Cols}}
	switch km.Kind {
	case format.Q4, format.Q8:
		q := len(a.srcs)
		o.q, o.s, o.b = a.put(km.Q), a.put(bytesOf(km.Scales)), a.put(bytesOf(km.Biases))
		if km.Tiled {
			// The device's kernels read rows in place.
			a.srcs[q].tiled = km
		}
	case format.BF16:
		o.p = a.put(bytesOf(km.BF16))
	default:
		o.p = a.put(bytesOf(km.F32))
	}
	return o
}

func (o matOffsets) at(base uintptr) mat {
	m := o.m
	switch m.kind {
	case format.Q4, format.Q8, format.Q3, format.Q2:
		m.q, m.s, m.b = base+uintptr(o.q), base+uintptr(o.s), base+uintptr(o.b)
	default:
		m.p = base + uintptr(o.p)
	}
	if o.bias > 0 {
		m.bias = base + uintptr(o.bias)
	}
	return m
}

// upload copies the dense weights and every expert to the device.
func (r *Runner) upload() error {
	a := r.M.Arch
	var ar arena
	mats := map[*block.Weight]matOffsets{}
	vecs := map[*float32]int{}
	w := func(x *block.Weight) {
		if x.Present() {
			mats[x] = putMat(&ar, &x.Mat)
		}
	}
	v := func(x []float32) {
		if len(x) > 0 {
			if _, ok := vecs[&x[0]]; !ok {
				vecs[&x[0]] = ar.put(bytesOf(x))
			}
		}
	}
	w(&a.LMHead)
	v(a.Norm.W)
	if mt := r.M.MTP; mt != nil {
		w(&mt.FC)
		v(mt.NormEmbed.W)
		v(mt.NormHidden.W)
		v(mt.Norm.W)
	}
	mlp := func(m *block.MLP) {
		w(&m.Gate)
		w(&m.Up)
		w(&m.Down)
	}
	layers := allLayers(r.M)
	for i := range layers {
		L := &layers[i]
		v(L.In.W)
		v(L.Post.W)
		switch x := L.Mixer.(type) {
		case *block.Attn:
			w(&x.Q)
			w(&x.K)
			w(&x.V)
			w(&x.O)
			v(x.QB)
			v(x.KB)
			v(x.VB)
			v(x.OB)
			v(x.Sinks)
			if x.QNorm != nil {
				v(x.QNorm.W)
				v(x.KNorm.W)
			}
		case *block.MLA:
			uploadMLA(x, w, v)
		case *block.DeltaNet:
			w(&x.QKV)
			w(&x.Z)
			w(&x.B)
			w(&x.A)
			w(&x.Out)
			v(x.ConvT)
			v(x.ALog)
			v(x.DtBias)
			v(x.GNorm.W)
		}
		switch f := L.FFN.(type) {
		case *block.MLP:
			mlp(f)
		case *block.MoE:
			w(&f.Router)
			v(f.RouterBias)
			v(f.Correction)
			if f.Shared != nil {
				mlp(f.Shared)
				w(&f.SharedGate)
			}
		}
	}
	buf, err := ar.commit(r.Dev)
	if err != nil {
		return err
	}
	r.weights = append(r.weights, buf)
	for k, o := range mats {
		r.mats[k] = o.at(buf.Ptr)
	}
	for k, o := range vecs {
		r.vecs[k] = buf.Ptr + uintptr(o)
	}
	if err := r.headTabs(layers); err != nil {
		return err
	}

	if r.streaming {
		return nil // experts stream; a recorded step needs them resident
	}
	// Experts: every record of the trunk's layers and the MTP layer's,
	// through the resident provider's views of experts.bin.
	prov, err := model.NewResidentProvider(r.M)
	if err != nil {
		return err
	}
	defer prov.Close()
	all := make([]int, r.E)
	for e := range all {
		all[e] = e
	}
	var ea arena
	offs := make([][3]matOffsets, r.xl*r.E)
	first := -1 // the first MoE layer
	for l := 0; l < r.xl; l++ {
		if layers[l].MoE() == nil {
			continue // a dense layer: its records are holes
		}
		if first < 0 {
			first = l
		}
		if err := prov.Begin(l, all, model.Hint{}); err != nil {
			return err
		}
		for range all {
			e, ex, err := prov.Next()
			if err != nil {
				return err
			}
			o := [3]matOffsets{putMat(&ea, &ex.Gate), putMat(&ea, &ex.Up), putMat(&ea, &ex.Down)}
			if ex.GateBias != nil {
				o[0].bias, o[1].bias, o[2].bias = ea.put(bytesOf(ex.GateBias)), ea.put(bytesOf(ex.UpBias)), ea.put(bytesOf(ex.DownBias))
			}
			offs[l*r.E+e] = o
		}
	}
	ebuf, err := ea.commit(r.Dev)
	if err != nil {
		return fmt.Errorf("experts (%.2f GiB): %w; expert streaming on the GPU is not available yet", gib(int64(ea.size)), err)
	}
	r.weights = append(r.weights, ebuf)
	r.experts = make([]expert, len(offs))
	for i, o := range offs {
		r.experts[i] = expert{o[0].at(ebuf.Ptr), o[1].at(ebuf.Ptr), o[2].at(ebuf.Ptr)}
	}
	ex0 := &r.experts[first*r.E]
	r.exKind = exKinds[ex0.gate.kind] // "" for a kind MatEx does not take
	// The shared expert joins the routed ones in a recorded one-row step
	// as entry E of every table (slot K, with id E), when it has their
	// shape and kind: one launch per product serves both.
	r.sharedSlot = true
	for i := range layers {
		m := layers[i].MoE()
		if m == nil {
			continue
		}
		sh := m.Shared
		if sh == nil || sh.Inter != r.I || r.wmat(&sh.Gate).kind != ex0.gate.kind ||
			r.wmat(&sh.Up).kind != ex0.up.kind || r.wmat(&sh.Down).kind != ex0.down.kind {
			r.sharedSlot = false
		}
	}
	// The address tables, one [E+1][3] per expert layer (the MTP layer's
	// too) and matrix; the identity order (a recorded step's combine
	// order, row j of the experts' outputs for slot j) and each slot's row
	// (j/K, the row a recorded multi-row step gathers for slot j); the
	// ids of a one-row step (the router writes the first K; id E, the
	// shared expert, stays in slot K); the positions of a recorded step's
	// rows.
	nx := r.xl
	E1 := r.E + 1
	tabs := make([]uint64, 3*nx*E1*3)
	biased := ex0.gate.bias != 0
	var btabs []uint64 // [nx][E1][3]
	if biased {
		btabs = make([]uint64, nx*E1*3)
	}
	put := func(j, l, e int, m mat) {
		t := tabs[j*3*nx*E1+3*(l*E1+e):]
		if m.kind == format.Q4 || m.kind == format.Q8 {
			t[0], t[1], t[2] = uint64(m.q), uint64(m.s), uint64(m.b)
		} else {
			t[0] = uint64(m.p)
		}
	}
	for l := 0; l < nx; l++ {
		m := layers[l].MoE()
		if m == nil {
			continue // a dense layer: no table is read
		}
		for e := 0; e < r.E; e++ {
			ex := &r.experts[l*r.E+e]
			put(0, l, e, ex.gate)
			put(1, l, e, ex.up)
			put(2, l, e, ex.down)
			if biased {
				b := btabs[3*(l*E1+e):]
				b[0], b[1], b[2] = uint64(ex.gate.bias), uint64(ex.up.bias), uint64(ex.down.bias)
			}
		}
		if sh := m.Shared; r.sharedSlot {
			put(0, l, r.E, r.wmat(&sh.Gate))
			put(1, l, r.E, r.wmat(&sh.Up))
			put(2, l, r.E, r.wmat(&sh.Down))
		}
	}
	RK := r.maxRows*r.K + 1
	ident, rowOf := make([]int32, RK), make([]int32, RK)
	for j := range RK {
		ident[j], rowOf[j] = int32(j), int32(j/r.K)
	}
	idsG := make([]int32, r.K+1)
	idsG[r.K] = int32(r.E)
	var ta arena
	toff := ta.put(bytesOf(tabs))
	poff := ta.put(bytesOf(ident))
	roff := ta.put(bytesOf(rowOf))
	ioff := ta.put(bytesOf(idsG))
	doff := ta.put(make([]byte, 4*r.maxRows))
	boff := 0
	if biased {
		boff = ta.put(bytesOf(btabs))
	}
	tbuf, err := ta.commit(r.Dev)
	if err != nil {
		return err
	}
	r.weights = append(r.weights, tbuf)
	per := 3 * E1 * 8 // bytes of one layer's table
	for l := 0; l < nx; l++ {
		base := tbuf.Ptr + uintptr(toff)
		r.tabGate = append(r.tabGate, base+uintptr(l*per))
		r.tabUp = append(r.tabUp, base+uintptr(nx*per+l*per))
		r.tabDown = append(r.tabDown, base+uintptr(2*nx*per+l*per))
		if biased {
			r.tabBias = append(r.tabBias, tbuf.Ptr+uintptr(boff+l*per))
		}
	}
	r.posK = tbuf.Ptr + uintptr(poff)
	r.rowOf = tbuf.Ptr + uintptr(roff)
	r.posDev = tbuf.Ptr + uintptr(doff)
	r.idsG = tbuf.Ptr + uintptr(ioff)
	return nil
}

// alloc sizes the scratch for maxRows rows.
func (r *Runner) alloc() error {
	c := &r.M.Config
	R, H, K := r.maxRows, r.H, r.K
	I := max(c.MoEInter, c.SharedInter)
	mlpI := c.SharedInter // the widest shared expert or dense layer
	for _, L := range allLayers(r.M) {
		if m, ok := L.FFN.(*block.MLP); ok {
			mlpI = max(mlpI, m.Inter)
		}
	}
	qw := 2 * c.Heads * c.HeadDim
	kvw := c.KVHeads * c.HeadDim
	kd, vd := c.LinearKeyHeads*c.LinearKeyDim, c.LinearValueHeads*c.LinearValueDim
	cd := 2*kd + vd
	rh := r.M.Arch.Rope.Dim / 2
	wide := max(H, c.Heads*c.HeadDim, vd, I, mlpI)
	if r.M.MTP != nil {
		wide = max(wide, 2*H) // the MTP head's input
	}
	mla := firstMLA(allLayers(r.M))
	if mla != nil {
		wide = max(wide, mla.QLora, mla.Heads*mla.V) // q_b's and o_proj's inputs
		wide = max(wide, mla.Heads*mla.KVLora)       // W_v's, a head a row
	}
	acts := max((R*K+1)*max(H, I), R*wide)
	// A recorded step's rows (a decode's, a verify's) share one launch.
	whole := r.mtp.drafts + 1
	attS := cuda.AttendScratchFor(cuda.Attn{Pos: r.ctx, Rows: R, Heads: c.Heads, HeadDim: c.HeadDim}, whole)
	var sz int
	f := func(floats int) int { // reserve floats, 256-byte aligned
		off := sz
		sz += (4*max(floats, 1) + 255) &^ 255
		return off
	}
	offs := []*uintptr{}
	sizes := []int{}
	add := func(p *uintptr, floats int) { offs = append(offs, p); sizes = append(sizes, f(floats)) }
	add(&r.x, R*H)
	add(&r.h, R*H)
	add(&r.y, R*H)
	add(&r.final, R*H)
	add(&r.cos, R*rh)
	add(&r.sin, R*rh)
	add(&r.q, R*qw)
	add(&r.kk, R*kvw)
	add(&r.v, R*kvw)
	add(&r.o, R*c.Heads*c.HeadDim)
	if mla != nil {
		attS = max(attS, mlaScratch(mla, &r.mla, R, r.ctx, whole, add))
	}
	r.attSBytes = attS
	add(&r.attS, attS/4)
	add(&r.qkv, R*cd)
	add(&r.z, R*vd)
	add(&r.db, R*c.LinearValueHeads)
	add(&r.da, R*c.LinearValueHeads)
	add(&r.dno, R*vd)
	add(&r.rl, R*r.E)
	add(&r.rl2, r.E)
	add(&r.ids2, K)
	add(&r.w2, K)
	add(&r.ids, R*K)
	add(&r.w, R*K)
	add(&r.gidx, R*K)
	add(&r.posd, R*K)
	add(&r.gin, R*K*H)
	add(&r.g, (R*K+1)*I) // +1: the shared expert's row of a recorded step
	add(&r.u, (R*K+1)*I)
	add(&r.outk, (R*K+1)*H)
	add(&r.sg, R*mlpI)
	add(&r.su, R*mlpI)
	add(&r.shared, R*H)
	add(&r.sgate, R)
	add(&r.logits, R*r.V)
	add(&r.am, R)
	add(&r.x8, acts/4+1)
	add(&r.xs, acts/64)
	add(&r.xsum, acts/64)
	add(&r.tiles, 4*R*K)
	if r.M.MTP != nil {
		add(&r.mtp.in, R*2*H)
		add(&r.mtp.out, R*H)
	}
	buf, err := r.Dev.Alloc(sz)
	if err != nil {
		return fmt.Errorf("scratch (%.2f GiB): %w", gib(int64(sz)), err)
	}
	r.scratch = buf
	for i, p := range offs {
		*p = buf.Ptr + uintptr(sizes[i])
	}

	// Pinned host memory, in 4-byte words.
	var hw int
	h := func(words int) int { off := hw; hw += (words + 15) &^ 15; return off * 4 }
	r.offX, r.offCos, r.offSin = h(R*H), h(R*rh), h(R*rh)
	r.offIds, r.offW, r.offGidx, r.offPos, r.offAm, r.offPosW = h(R*K), h(R*K), h(R*K), h(R*K), h(R), h(R)
	r.offIds2, r.offTiles = h(K), h(4*R*K)
	if r.M.MTP != nil {
		r.mtp.offIn, r.mtp.offOut, r.mtp.offHid = h(R*2*H), h(R*H), h(R*H)
	}
	if r.hyb.on() {
		r.hyb.offH, r.hyb.offOut = h(H), h(K*H)
	}
	if r.pin, err = r.Dev.AllocHost(hw * 4); err != nil {
		return err
	}
	f32 := r.pin.F32()
	i32 := unsafe.Slice((*int32)(unsafe.Pointer(&f32[0])), len(f32))
	r.px = f32[r.offX/4 : r.offX/4+R*H]
	r.pcos = f32[r.offCos/4 : r.offCos/4+R*rh]
	r.psin = f32[r.offSin/4 : r.offSin/4+R*rh]
	r.pids = i32[r.offIds/4 : r.offIds/4+R*K]
	r.pw = f32[r.offW/4 : r.offW/4+R*K]
	r.pgidx = i32[r.offGidx/4 : r.offGidx/4+R*K]
	r.ppos = i32[r.offPos/4 : r.offPos/4+R*K]
	r.pam = i32[r.offAm/4 : r.offAm/4+R]
	r.pids2 = i32[r.offIds2/4 : r.offIds2/4+K]
	r.ptiles = unsafe.Slice((*cuda.Tile)(unsafe.Pointer(&i32[r.offTiles/4])), R*K)
	if r.hyb.on() {
		r.hyb.h = f32[r.hyb.offH/4 : r.hyb.offH/4+H]
		r.hyb.out = f32[r.hyb.offOut/4 : r.hyb.offOut/4+K*H]
	}
	if r.M.MTP != nil {
		r.mtp.pin = f32[r.mtp.offIn/4 : r.mtp.offIn/4+R*2*H]
		r.mtp.pout = f32[r.mtp.offOut/4 : r.mtp.offOut/4+R*H]
		r.mtp.phid = f32[r.mtp.offHid/4 : r.mtp.offHid/4+R*H]
		phid := r.mtp.phid
		r.mtp.row = func(i int) []float32 { return phid[i*H : (i+1)*H] }
	}
	if r.plog, err = r.Dev.AllocHost(4 * R * r.V); err != nil {
		return err
	}
	r.waveSlot = make([]int, r.E)
	r.grp = model.NewExpertGroups(r.E, R*K)
	return r.allocSnap()
}

// Close frees everything the runner holds on the device.
func (r *Runner) Close() {
	if r.Dev == nil {
		return
	}
	r.Dev.Do(func() error {
		r.Dev.Sync()
		r.mu.Lock()
		for k, ds := range r.states {
			r.destroy(ds)
			r.Dev.Free(ds.buf)
			delete(r.states, k)
		}
		r.mu.Unlock()
		for _, b := range r.weights {
			r.Dev.Free(b)
		}
		r.weights = nil
		r.Dev.Free(r.scratch)
		r.scratch = cuda.Buf{}
		r.Dev.Free(r.mtp.snap)
		r.mtp.snap = cuda.Buf{}
		if r.hyb.pool != nil {
			r.hyb.pool.Close()
			r.hyb.pool = nil
		}
		for i, e := range r.hyb.copyEv {
			r.Dev.DestroyEvent(e)
			r.hyb.copyEv[i] = cuda.Event{}
		}
		r.Dev.FreeHost(r.pin)
		r.Dev.FreeHost(r.plog)
		r.closePool()
		r.pin, r.plog = cuda.Host{}, cuda.Host{}
		r.Dev.DestroyStream(r.s)
		r.s = cuda.Stream{}
		if r.k != nil {
			r.k.Close()
			r.k = nil
		}
		return nil
	})
}

// Rows is the most rows a step takes.
func (r *Runner) Rows() int { return r.maxRows }

// Launches is the number of launches the host made so far: kernels, and
// replays of recorded steps (one each).
func (r *Runner) Launches() uint64 {
	var n uint64
	r.Dev.Do(func() error { n = r.Dev.Launches + r.replays; return nil })
	return n
}

// Kernels is the number of kernels run so far, launched or replayed.
func (r *Runner) Kernels() uint64 {
	var n uint64
	r.Dev.Do(func() error { n = r.Dev.Launches + r.replayed; return nil })
	return n
}

// SetGraphs turns recording and replaying the one-row step on or off
// (on by default).
func (r *Runner) SetGraphs(on bool) { r.NoGraphs = !on }

// state returns st's device state, allocating it on first use (once per
// sequence state, never per step). A device state is freed when st is
// garbage collected.
func (r *Runner) state(st *model.State) (*dstate, error) {
	wp := weak.Make(st)
	r.mu.Lock()
	ds := r.states[wp]
	r.mu.Unlock()
	if ds != nil {
		return ds, nil
	}
	if st.Ctx > r.ctx {
		return nil, fmt.Errorf("gpu: a sequence state of %d positions exceeds the %d the GPU backend was opened for", st.Ctx, r.ctx)
	}
	a := r.M.Arch
	ds = &dstate{ctx: st.Ctx}
	var sz int
	type slot struct {
		p *uintptr
		n int
	}
	var slots []slot
	n := len(a.States)
	ds.kc, ds.vc, ds.conv, ds.rec = make([]uintptr, n+1), make([]uintptr, n+1), make([]uintptr, n), make([]uintptr, n)
	ds.convN, ds.recN, ds.ring = make([]int, n), make([]int, n), make([]int, n+1)
	for l, sp := range a.States {
		switch sp.Kind {
		case block.KV, block.Ring:
			rows := r.cacheRows(sp, st.Ctx)
			if rows < st.Ctx {
				ds.ring[l] = rows
			}
			slots = append(slots, slot{&ds.kc[l], rows * sp.KVWidth}, slot{&ds.vc[l], rows * sp.KVWidth})
		case block.Recurrent:
			ds.convN[l], ds.recN[l] = sp.ConvFloats, sp.RecFloats
			slots = append(slots, slot{&ds.conv[l], sp.ConvFloats}, slot{&ds.rec[l], sp.RecFloats})
		case block.Latent:
			slots = append(slots, slot{&ds.kc[l], st.Ctx * sp.KVWidth}, slot{&ds.vc[l], st.Ctx * sp.IndexWidth})
		default:
			return nil, fmt.Errorf("gpu: state kind %d not supported", sp.Kind)
		}
	}
	if r.M.MTP != nil {
		kw, vw := latentWidths(a.MTPState)
		slots = append(slots, slot{&ds.kc[n], st.Ctx * kw}, slot{&ds.vc[n], st.Ctx * vw})
	}
	offs := make([]int, len(slots))
	for i, s := range slots {
		offs[i] = sz
		sz += (4*max(s.n, 1) + 255) &^ 255
	}
	buf, err := r.Dev.Alloc(sz)
	if err != nil {
		return nil, fmt.Errorf("gpu: sequence state of %d positions (%.2f GiB): %w", st.Ctx, gib(int64(sz)), err)
	}
	ds.buf = buf
	for i, s := range slots {
		*s.p = buf.Ptr + uintptr(offs[i])
	}
	ds.pos = -1 // reset on the first step
	r.mu.Lock()
	r.states[wp] = ds
	r.mu.Unlock()
	runtime.AddCleanup(st, func(wp weak.Pointer[model.State]) { r.release(wp) }, wp)
	return ds, nil
}

// CopyState makes dst's device state an exact copy of src's first src.Pos
// positions, as model.State.CopyFrom (which the caller runs too) does on
// the host: the keys and values of those positions and every recurrent
// state, copied on the device. The server saves and resumes prompt
// prefixes with it. src must have run on this backend up to src.Pos.
func (r *Runner) CopyState(dst, src *model.State) error {
	if dst == src {
		return nil
	}
	return r.Dev.Do(func() error {
		r.mu.Lock()
		sds := r.states[weak.Make(src)]
		r.mu.Unlock()
		if sds == nil || sds.pos != src.Pos {
			return fmt.Errorf("gpu: copying a sequence state at position %d whose GPU copy is not there", src.Pos)
		}
		if src.Pos > dst.Ctx {
			return fmt.Errorf("gpu: %d positions do not fit a state of %d", src.Pos, dst.Ctx)
		}
		dds, err := r.state(dst)
		if err != nil {
			return err
		}
		dds.pos = -2 // until the copies are done
		for l, sp := range r.M.Arch.States {
			var err error
			switch {
			case sp.Kind == block.KV || sp.Kind == block.Ring:
				// A ring holds the last positions only: those both rings
				// hold (a plain cache's ring size is 0: every position).
				dr, sr := dds.ring[l], sds.ring[l]
				hold := src.Pos
				for _, rows := range []int{dr, sr} {
					if rows > 0 {
						hold = min(hold, rows)
					}
				}
				a := src.Pos - hold
				w := 4 * sp.KVWidth
				err = ringRuns(a, src.Pos, dr, sr, func(p, n int) error {
					do, so := uintptr(w*ringRow(p, dr)), uintptr(w*ringRow(p, sr))
					if err := r.Dev.CopyDAsync(dds.kc[l]+do, sds.kc[l]+so, n*w, r.s); err != nil {
						return err
					}
					return r.Dev.CopyDAsync(dds.vc[l]+do, sds.vc[l]+so, n*w, r.s)
				})
			case sp.Kind == block.Latent:
				kw, vw := latentWidths(sp)
				if err = r.Dev.CopyDAsync(dds.kc[l], sds.kc[l], 4*src.Pos*kw, r.s); err == nil && vw > 0 {
					err = r.Dev.CopyDAsync(dds.vc[l], sds.vc[l], 4*src.Pos*vw, r.s)
				}
			case sds.conv[l] != 0:
				if err = r.Dev.CopyDAsync(dds.conv[l], sds.conv[l], 4*sds.convN[l], r.s); err == nil {
					err = r.Dev.CopyDAsync(dds.rec[l], sds.rec[l], 4*sds.recN[l], r.s)
				}
			}
			if err != nil {
				return err
			}
		}
		if nl := len(r.M.Arch.States); r.M.MTP != nil {
			kw, vw := latentWidths(r.M.Arch.MTPState)
			n := 4 * min(src.MTPPos, dst.Ctx)
			if err := r.Dev.CopyDAsync(dds.kc[nl], sds.kc[nl], n*kw, r.s); err != nil {
				return err
			}
			if err := r.Dev.CopyDAsync(dds.vc[nl], sds.vc[nl], n*vw, r.s); err != nil {
				return err
			}
		}
		if err := r.Dev.SyncStream(r.s); err != nil {
			return err
		}
		dds.pos = src.Pos
		return nil
	})
}

// Release frees st's device state now, rather than once st is garbage
// collected: the server's prefix cache drops states whose device memory
// the collector, paced by the host's heap, might not return in time. st
// must not run on the backend again (a later step finds no device copy
// of its positions and fails).
func (r *Runner) Release(st *model.State) { r.release(weak.Make(st)) }

// release frees the device state of a collected (or released) sequence
// state; a second call for the same state does nothing.
func (r *Runner) release(wp weak.Pointer[model.State]) {
	r.mu.Lock()
	ds := r.states[wp]
	delete(r.states, wp)
	r.mu.Unlock()
	if ds != nil && r.scratch.Ptr != 0 {
		r.Dev.Do(func() error {
			r.destroy(ds)
			return r.Dev.Free(ds.buf)
		})
	}
}

// Forward consumes tokens at positions st.Pos.. and advances st, as
// model.Runner.Forward: logits of every token into out when all, else of
// the last one. The result does not depend on the chunking.
func (r *Runner) Forward(st *model.State, tokens []int, out []float32, all bool) error {
	_, err := r.forward(st, tokens, out, all, false, nil)
	return err
}

// ForwardArgmax is Forward that returns the last token's greedy choice
// (the lowest id among the largest logits), computed on the device: no
// logits come back to the host.
func (r *Runner) ForwardArgmax(st *model.State, tokens []int) (int, error) {
	return r.forward(st, tokens, nil, false, true, nil)
}

// ForwardArgmaxAll is Forward that writes every token's greedy choice
// into best ([len(tokens)]), computed on the device: a greedy verify's
// rows, with no logits brought back.
func (r *Runner) ForwardArgmaxAll(st *model.State, tokens, best []int) error {
	if len(best) < len(tokens) {
		return fmt.Errorf("forward: %d choices for %d tokens", len(best), len(tokens))
	}
	_, err := r.forward(st, tokens, nil, true, true, best)
	return err
}

func (r *Runner) forward(st *model.State, tokens []int, out []float32, all, argmax bool, bestAll []int) (int, error) {
	V := r.V
	if len(tokens) == 0 {
		return 0, fmt.Errorf("forward: no tokens")
	}
	if st.Pos+len(tokens) > st.Ctx {
		return 0, fmt.Errorf("forward: %d tokens at position %d exceed the context of %d", len(tokens), st.Pos, st.Ctx)
	}
	for _, t := range tokens {
		if t < 0 || t >= V {
			return 0, fmt.Errorf("forward: token id %d outside the vocabulary [0,%d)", t, V)
		}
	}
	if !argmax && (all && len(out) < len(tokens)*V || !all && len(out) < V) {
		return 0, fmt.Errorf("forward: logits buffer too small")
	}
	r.fa = fwdArgs{st: st, tokens: tokens, out: out, all: all, argmax: argmax, bestAll: bestAll}
	err := r.Dev.Do(r.fwdFn)
	best := r.fa.best
	r.fa = fwdArgs{}
	return best, err
}

// doForward runs r.fa on the device thread.
func (r *Runner) doForward() error {
	st, tokens, out, all, argmax := r.fa.st, r.fa.tokens, r.fa.out, r.fa.all, r.fa.argmax
	V := r.V
	ds, err := r.state(st)
	if err != nil {
		return err
	}
	if st.Pos == 0 {
		if err := r.reset(ds); err != nil {
			return err
		}
	} else if ds.pos != st.Pos {
		return fmt.Errorf("gpu: the sequence state is at position %d but its GPU copy at %d: a state copied, restored or rolled back on the host alone (copy states with Engine.CopyState, end verifies with the backend's Commit)", st.Pos, ds.pos)
	}
	for done := 0; done < len(tokens); {
		nb := min(r.maxRows, len(tokens)-done)
		last := done+nb == len(tokens)
		var dst []float32
		switch {
		case argmax:
		case all:
			dst = out[done*V : (done+nb)*V]
		case last:
			dst = out[:V]
		}
		// Unknown until the step completes (step sets it): after an error,
		// or a panic the device thread turned into one, the next step must
		// start the sequence over.
		ds.pos = -2
		if err := r.step(ds, st, tokens[done:done+nb], dst, all, argmax && (last || all)); err != nil {
			return err
		}
		if argmax && all {
			for i := range nb {
				b, err := choice(r.pam[i], st.Pos-nb+i)
				if err != nil {
					return err
				}
				r.fa.bestAll[done+i] = b
			}
		}
		done += nb
	}
	if argmax {
		b, err := choice(r.pam[0], st.Pos-1)
		if err != nil {
			return err
		}
		r.fa.best = b
	}
	return nil
}

// choice is the device argmax's pick for the logits at position pos: the
// kernel writes -1 where the largest logit is not finite (NaN throughout,
// or an overflow), which the CPU's decode refuses too, since falling back
// to a token would read as a real answer.
func choice(v int32, pos int) (int, error) {
	if v < 0 {
		return 0, fmt.Errorf("the logits at position %d are not finite: the model's weights may be corrupt", pos)
	}
	return int(v), nil
}

// reset zeroes a sequence's DeltaNet state for position 0.
func (r *Runner) reset(ds *dstate) error {
	if err := r.Dev.SyncStream(r.s); err != nil {
		return err
	}
	for l := range ds.conv {
		if ds.conv[l] != 0 {
			if err := r.Dev.Fill32(ds.conv[l], 0, ds.convN[l]); err != nil {
				return err
			}
			if err := r.Dev.Fill32(ds.rec[l], 0, ds.recN[l]); err != nil {
				return err
			}
		}
	}
	ds.pos = 0
	return r.Dev.Sync()
}

// step runs one batch of nb ≤ maxRows rows (on the device thread).
func (r *Runner) step(ds *dstate, st *model.State, tokens []int, logits []float32, all, argmax bool) error {
	a := r.M.Arch
	H, V := r.H, r.V
	nb := len(tokens)
	rp := &a.Rope
	rh := rp.Dim / 2
	for i, t := range tokens {
		a.Embed.Mat.Row(r.px[i*H:(i+1)*H], t)
		cos, sin := r.pcos[i*rh:(i+1)*rh], r.psin[i*rh:(i+1)*rh]
		kernels.RopeTable(cos, sin, st.Pos+i, rp.InvFreq)
		if rp.Scale != 1 {
			kernels.Scale(cos, rp.Scale)
			kernels.Scale(sin, rp.Scale)
		}
	}
	r.cur, r.pos, r.nb, r.err = ds, st.Pos, nb, nil
	defer func() { r.cur = nil }()
	r.mark("upload")
	r.check(r.Dev.UploadAsync(r.x, r.pin, r.offX, 4*nb*H, r.s))
	if rh > 0 {
		r.check(r.Dev.UploadAsync(r.cos, r.pin, r.offCos, 4*nb*rh, r.s))
		r.check(r.Dev.UploadAsync(r.sin, r.pin, r.offSin, 4*nb*rh, r.s))
	}
	// A speculative verify armed for this state and these rows, whose
	// logits all come back.
	verify := nb > 1 && r.mtp.rows == nb && r.mtp.owner == ds && r.mtp.base == st.Pos && all && (logits != nil || argmax)
	if !r.NoGraphs && r.exKind != "" && (nb == 1 && (argmax || logits != nil) || verify) {
		// A one-row step, and a verify of each size, is recorded once per
		// sequence state and replayed: its positions go to the device,
		// which reads them in the cache append and the attention, and the
		// experts are multiplied on the router's choice without a round
		// trip to the host.
		r.setPosDev(st.Pos, nb)
		g := ds.graph
		if nb > 1 {
			g = ds.vgraph[nb]
		}
		if g == nil {
			var err error
			if g, err = r.record(ds, nb); err != nil {
				return err
			}
		}
		r.mark("graph")
		r.check(r.Dev.LaunchGraph(g.g, r.s))
		r.replays++
		r.replayed += g.nodes
		r.mark("download")
		switch {
		case argmax:
			r.check(r.Dev.DownloadAsync(r.pin, r.offAm, r.am, 4*nb, r.s))
		case nb > 1:
			r.check(r.Dev.DownloadAsync(r.plog, 0, r.logits, 4*nb*V, r.s))
		default:
			r.check(r.Dev.DownloadAsync(r.plog, 0, r.logits, 4*V, r.s))
		}
	} else {
		if err := r.tail(nb, argmax, logits != nil, all); err != nil {
			return err
		}
		switch {
		case argmax && all:
			r.mark("download")
			r.check(r.Dev.DownloadAsync(r.pin, r.offAm, r.am, 4*nb, r.s))
		case argmax:
			r.mark("download")
			r.check(r.Dev.DownloadAsync(r.pin, r.offAm, r.am, 4, r.s))
		case logits == nil:
		case all:
			r.mark("download")
			r.check(r.Dev.DownloadAsync(r.plog, 0, r.logits, 4*nb*V, r.s))
		default:
			r.mark("download")
			r.check(r.Dev.DownloadAsync(r.plog, 0, r.logits, 4*V, r.s))
		}
	}
	r.mark("")
	if err := r.Dev.SyncStream(r.s); err != nil {
		return err
	}
	if r.err != nil {
		return r.err
	}
	r.prof.collect(r)
	r.collectWaits()
	if logits != nil {
		copy(logits, r.plog.F32()[:len(logits)])
	}
	r.mtp.last, r.mtp.lastBase, r.mtp.lastRows = ds, st.Pos, nb
	st.Pos += nb
	ds.pos = st.Pos
	return nil
}

// tail queues the forward from the rows in x to the logits (and, for
// argmax, the last row's greedy choice, or with all every row's).
func (r *Runner) tail(nb int, argmax, logits, all bool) error {
	a := r.M.Arch
	H, V := r.H, r.V
	if err := a.Forward(r); err != nil {
		return err
	}
	if r.err != nil {
		return r.err
	}
	r.mark("lm_head")
	n := &a.Norm
	r.check(r.k.RMSNorm(r.s, r.final, r.x, r.y, r.vecs[&n.W[0]], nb, H, H, n.Eps, n.ZeroCentred))
	lm := r.mats[&a.LMHead]
	rows := 1
	switch {
	case all && (logits || argmax):
		rows = nb
		r.mul(r.logits, lm, r.final, nb, H)
	case argmax || logits:
		r.mul(r.logits, lm, r.final+uintptr(4*(nb-1)*H), 1, H)
	}
	if argmax {
		r.check(r.k.Argmax(r.s, r.logits, r.am, rows, V))
	}
	return r.err
}

// graph is a recorded step and the kernels it runs.
type graph struct {
	g     *cuda.Graph
	nodes uint64
}

// record captures a step of nb rows over ds's buffers: for one row (the
// decode step, ds.graph) the forward, the last row's logits and their
// argmax; for more (a verify, ds.vgraph[nb]) the forward and every row's
// logits and argmax, with the verify's snapshots.
func (r *Runner) record(ds *dstate, nb int) (*graph, error) {
	g, err := r.capture(func() error { return r.tail(nb, true, true, nb > 1) })
	if err != nil {
		return nil, fmt.Errorf("gpu: recording a step of %d rows: %w", nb, err)
	}
	if nb == 1 {
		ds.graph = g
	} else {
		if ds.vgraph == nil {
			ds.vgraph = map[int]*graph{}
		}
		ds.vgraph[nb] = g
	}
	return g, nil
}

// capture records what body queues on the stream into a graph.
func (r *Runner) capture(body func() error) (*graph, error) {
	if err := r.Dev.BeginCapture(r.s); err != nil {
		return nil, err
	}
	r.graphing = true
	l0 := r.Dev.Launches
	err := body()
	r.graphing = false
	nodes := r.Dev.Launches - l0
	r.Dev.Launches = l0 // recorded, not launched
	g, err2 := r.Dev.EndCapture(r.s)
	if err == nil {
		err = err2
	}
	if err != nil {
		if g != nil {
			r.Dev.DestroyGraph(g)
		}
		return nil, err
	}
	return &graph{g, nodes}, nil
}

// setPosDev queues the positions pos..pos+nb-1 of a recorded step's rows.
func (r *Runner) setPosDev(pos, nb int) {
	b := r.pin.Slice()[r.offPosW:]
	for i := range nb {
		*(*int32)(unsafe.Pointer(&b[4*i])) = int32(pos + i)
	}
	r.check(r.Dev.UploadAsync(r.posDev, r.pin, r.offPosW, 4*nb, r.s))
}

// destroy frees ds's recorded steps.
func (r *Runner) destroy(ds *dstate) {
	if ds.graph != nil {
		r.Dev.DestroyGraph(ds.graph.g)
	}
	for _, g := range ds.vgraph {
		r.Dev.DestroyGraph(g.g)
	}
	for _, g := range ds.mgraph {
		r.Dev.DestroyGraph(g.g)
	}
	ds.graph, ds.vgraph, ds.mgraph = nil, nil, nil
}

// check keeps the first error of the step: Backend ops return none.
func (r *Runner) check(err error) {
	if err != nil && r.err == nil {
		r.err = err
	}
}

// acts are prepared activations of rows rows of cols floats at x.
type acts struct {
	x          uintptr
	rows, cols int
}

// prepare quantises the activations for products with matrices of kind k.
func (r *Runner) prepare(x uintptr, rows, cols int, k format.Kind) acts {
	if k == format.Q4 || k == format.Q8 {
		r.check(r.k.PrepQ4(r.s, cuda.Acts{X: x, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: rows, Cols: cols}))
	}
	return acts{x, rows, cols}
}

// mulPrepared writes out = W·rows from..from+n of a (already prepared).
func (r *Runner) mulPrepared(out uintptr, w mat, a acts, from, n int) {
	C := a.cols
	switch w.kind {
	case format.Q4, format.Q8:
		ac := cuda.Acts{X: a.x + uintptr(4*from*C), X8: r.x8 + uintptr(from*C), XS: r.xs + uintptr(4*from*(C/64)),
			XSum: r.xsum + uintptr(4*from*(C/64)), Rows: n, Cols: C}
		q := cuda.Q4{Rows: w.rows, Cols: w.cols, Q: w.q, Scales: w.s, Biases: w.b}
		if w.kind == format.Q4 {
			r.check(r.k.MatQ4(r.s, out, q, ac))
		} else {
			r.check(r.k.MatQ8(r.s, out, q, ac))
		}
	case format.Q3, format.Q2:
		// Low-bit pool records (--miss-bits), whose activations were
		// prepared as q4's.
		ac := cuda.Acts{X: a.x + uintptr(4*from*C), X8: r.x8 + uintptr(from*C), XS: r.xs + uintptr(4*from*(C/64)),
			XSum: r.xsum + uintptr(4*from*(C/64)), Rows: n, Cols: C}
		r.check(r.k.MatLow(r.s, out, cuda.Q4{Rows: w.rows, Cols: w.cols, Q: w.q, Scales: w.s, Biases: w.b}, ac, w.kind.Bits()))
	case format.BF16:
		r.check(r.k.MatBF16(r.s, out, w.p, w.rows, w.cols, a.x+uintptr(4*from*C), n))
	default:
		r.check(r.k.MatF32(r.s, out, w.p, w.rows, w.cols, a.x+uintptr(4*from*C), n))
	}
	if w.bias != 0 {
		r.check(r.k.AddRows(r.s, out, w.bias, n, w.rows))
	}
}

// mul writes out = W·x for nb rows of cols floats.
func (r *Runner) mul(out uintptr, w mat, x uintptr, nb, cols int) {
	if w.cols != cols {
		r.check(fmt.Errorf("gpu: product of a [%d %d] matrix with %d columns", w.rows, w.cols, cols))
		return
	}
	r.mulPrepared(out, w, r.prepare(x, nb, cols, w.kind), 0, nb)
}

func (r *Runner) wmat(w *block.Weight) mat { return r.mats[w] }

// Norm implements block.Backend.
func (r *Runner) Norm(n *block.Norm, add bool) {
	r.mark("norm")
	var y uintptr
	if add {
		y = r.y
	}
	r.check(r.k.RMSNorm(r.s, r.h, r.x, y, r.vecs[&n.W[0]], r.nb, r.H, r.H, n.Eps, n.ZeroCentred))
}

func qwidth(L *block.Attn) (qw, qstride int) {
	qw, qstride = L.Heads*L.HeadDim, L.HeadDim
	if L.Gate {
		qw, qstride = 2*qw, 2*L.HeadDim
	}
	return qw, qstride
}

// Project implements block.Backend.
func (r *Runner) Project(L *block.Attn) {
	r.mark("attn_proj")
	a := r.prepare(r.h, r.nb, r.H, r.wmat(&L.Q).kind)
	r.mulPrepared(r.q, r.wmat(&L.Q), a, 0, r.nb)
	if r.wmat(&L.K).kind != r.wmat(&L.Q).kind {
		a = r.prepare(r.h, r.nb, r.H, r.wmat(&L.K).kind)
	}
	r.mulPrepared(r.kk, r.wmat(&L.K), a, 0, r.nb)
	r.mulPrepared(r.v, r.wmat(&L.V), a, 0, r.nb)
	r.bias(r.q, L.QB)
	r.bias(r.kk, L.KB)
	r.bias(r.v, L.VB)
}

// bias adds b, when present, to each of the step's rows of x.
func (r *Runner) bias(x uintptr, b []float32) {
	if len(b) > 0 {
		p, ok := r.vecs[&b[0]]
		if !ok {
			r.check(fmt.Errorf("gpu: a bias of %d floats is not on the device", len(b)))
			return
		}
		r.check(r.k.AddRows(r.s, x, p, r.nb, len(b)))
	}
}

// Prep implements block.Backend.
func (r *Runner) Prep(L *block.Attn, cache int) {
	r.mark("attn_prep")
	nb, hd := r.nb, L.HeadDim
	qw, qstride := qwidth(L)
	kvw := L.KVHeads * hd
	rh := r.M.Arch.Rope.Dim / 2
	if qn, kn := L.QNorm, L.KNorm; qn != nil {
		r.check(r.k.RMSNorm(r.s, r.q, r.q, 0, r.vecs[&qn.W[0]], nb*L.Heads, hd, qstride, qn.Eps, qn.ZeroCentred))
		r.check(r.k.RMSNorm(r.s, r.kk, r.kk, 0, r.vecs[&kn.W[0]], nb*L.KVHeads, hd, hd, kn.Eps, kn.ZeroCentred))
	}
	if rh > 0 {
		r.check(r.k.Rope(r.s, r.q, r.cos, r.sin, nb, L.Heads, qw, qstride, rh))
		r.check(r.k.Rope(r.s, r.kk, r.cos, r.sin, nb, L.KVHeads, kvw, hd, rh))
	}
	ds := r.cur
	ring := ds.ring[cache]
	if r.graphing {
		for i := range nb {
			o := uintptr(4 * i * kvw)
			r.check(r.k.KVAppend(r.s, ds.kc[cache], ds.vc[cache], r.kk+o, r.v+o, r.posDev+uintptr(4*i), kvw, ring))
		}
		return
	}
	r.check(ringRuns(r.pos, r.pos+nb, ring, 0, func(p, n int) error {
		do, so := uintptr(4*kvw*ringRow(p, ring)), uintptr(4*kvw*(p-r.pos))
		if err := r.Dev.CopyDAsync(ds.kc[cache]+do, r.kk+so, 4*n*kvw, r.s); err != nil {
			return err
		}
		return r.Dev.CopyDAsync(ds.vc[cache]+do, r.v+so, 4*n*kvw, r.s)
	}))
}

// Attend implements block.Backend.
func (r *Runner) Attend(L *block.Attn, cache int) {
	r.mark("attend")
	qw, qstride := qwidth(L)
	ds := r.cur
	at := cuda.Attn{Pos: r.pos, Rows: r.nb,
		Heads: L.Heads, KVHeads: L.KVHeads, HeadDim: L.HeadDim, QRow: qw, QHead: qstride, ORow: L.Heads * L.HeadDim,
		Scale: L.Scale, Gated: L.Gate, Window: L.Window, Ring: ds.ring[cache], Scratch: r.attSBytes}
	if len(L.Sinks) > 0 {
		at.Sinks = r.vecs[&L.Sinks[0]]
	}
	if r.graphing {
		at.PosDev, at.MaxPos = r.posDev, ds.ctx
	}
	r.check(r.k.Attend(r.s, r.o, r.q, ds.kc[cache], ds.vc[cache], r.attS, at))
}

// AttnOut implements block.Backend.
func (r *Runner) AttnOut(L *block.Attn) {
	r.mark("attn_out")
	r.mul(r.y, r.wmat(&L.O), r.o, r.nb, L.Heads*L.HeadDim)
	r.bias(r.y, L.OB)
}

func dnShape(d *block.DeltaNet) cuda.DN {
	return cuda.DN{KeyHeads: d.KeyHeads, ValueHeads: d.ValueHeads, KeyDim: d.KeyDim, ValueDim: d.ValueDim}
}

// DNProject implements block.Backend.
func (r *Runner) DNProject(d *block.DeltaNet) {
	r.mark("dn_proj")
	a := r.prepare(r.h, r.nb, r.H, r.wmat(&d.QKV).kind)
	r.mulPrepared(r.qkv, r.wmat(&d.QKV), a, 0, r.nb)
	if r.wmat(&d.Z).kind != r.wmat(&d.QKV).kind {
		a = r.prepare(r.h, r.nb, r.H, r.wmat(&d.Z).kind)
	}
	r.mulPrepared(r.z, r.wmat(&d.Z), a, 0, r.nb)
	r.mul(r.db, r.wmat(&d.B), r.h, r.nb, r.H)
	r.mul(r.da, r.wmat(&d.A), r.h, r.nb, r.H)
}

// Conv implements block.Backend.
func (r *Runner) Conv(d *block.DeltaNet, cache int) {
	r.mark("dn_conv")
	snap, n := r.snapAt(cache, true)
	r.check(r.k.DNConv(r.s, r.qkv, r.cur.conv[cache], r.vecs[&d.ConvT[0]], r.nb, dnShape(d).Conv(), d.Kernel, snap, n))
}

// DNPrep implements block.Backend.
func (r *Runner) DNPrep(d *block.DeltaNet) {
	r.mark("dn_prep")
	qscale := float32(1 / math.Sqrt(float64(d.KeyDim)))
	r.check(r.k.DNPrep(r.s, r.qkv, r.db, r.da, r.vecs[&d.ALog[0]], r.vecs[&d.DtBias[0]], r.nb, dnShape(d), qscale))
}

// DeltaRule implements block.Backend.
func (r *Runner) DeltaRule(d *block.DeltaNet, cache int) {
	r.mark("dn_rule")
	snap, n := r.snapAt(cache, false)
	r.check(r.k.DNRule(r.s, r.cur.rec[cache], r.qkv, r.da, r.db, r.dno, r.nb, dnShape(d), snap, n))
}

// DNGate implements block.Backend.
func (r *Runner) DNGate(d *block.DeltaNet) {
	r.mark("dn_gate")
	g := &d.GNorm
	nv, dv := d.ValueHeads, d.ValueDim
	r.check(r.k.RMSNorm(r.s, r.dno, r.dno, 0, r.vecs[&g.W[0]], r.nb*nv, dv, dv, g.Eps, g.ZeroCentred))
	r.check(r.k.SwiGLU(r.s, r.dno, r.z, r.dno, r.nb*nv*dv))
}

// DNOut implements block.Backend.
func (r *Runner) DNOut(d *block.DeltaNet) {
	r.mark("dn_out")
	r.mul(r.y, r.wmat(&d.Out), r.dno, r.nb, d.ValueHeads*d.ValueDim)
}

// RouterLogits implements block.Backend.
func (r *Runner) RouterLogits(m *block.MoE) {
	r.mark("router")
	r.mul(r.rl, r.wmat(&m.Router), r.h, r.nb, r.H)
	r.bias(r.rl, m.RouterBias)
}

// Route implements block.Backend.
func (r *Runner) Route(m *block.MoE) {
	ids := r.ids
	if r.graphing && r.nb == 1 {
		ids = r.idsG
	}
	r.route(m, r.rl, ids, r.w, r.nb)
}

// route writes the top-k choice of nb rows of router logits into ids and
// w, by m's rule (the softmax and sigmoid rules leave their scores in
// place of the logits).
func (r *Runner) route(m *block.MoE, logits, ids, w uintptr, nb int) {
	switch m.Score {
	case block.SigmoidGroups:
		g := cuda.Groups{Corr: r.vecs[&m.Correction[0]], Groups: m.Groups, Top: m.TopGroups, Norm: m.NormTopK, Scale: m.Scale}
		r.check(r.k.RouteGroups(r.s, logits, logits, ids, w, nb, r.E, r.K, g))
	case block.TopKSoftmax:
		r.check(r.k.RouteTopK(r.s, logits, ids, w, nb, r.E, r.K))
	default:
		r.check(r.k.Route(r.s, logits, logits, ids, w, nb, r.E, r.K, m.NormTopK))
	}
}

// act writes the experts' activation of n floats of gate and up into dst,
// by m's rule.
func (r *Runner) act(m *block.MoE, dst, gate, up uintptr, n int) {
	if m.Act == block.ClampedSwiGLU {
		r.check(r.k.ClampedSwiGLU(r.s, dst, gate, up, n))
		return
	}
	r.check(r.k.SwiGLU(r.s, dst, gate, up, n))
}

// Experts implements block.Backend: the chosen experts come back to the
// host, which groups the rows by expert in first-use order (as the CPU
// does); the rows are gathered on the device and each expert multiplies
// its rows, its outputs landing in consecutive rows of outk.
func (r *Runner) Experts(m *block.MoE) error {
	nb, K, H, I := r.nb, r.K, r.H, r.I
	if r.graphing {
		r.expertsOnDevice(m)
		if !r.sharedSlot || nb > 1 {
			r.shared1(m)
		} else if m.SharedGate.Present() {
			r.mul(r.sgate, r.wmat(&m.SharedGate), r.h, 1, H)
		}
		return r.err
	}
	next := r.lookahead(m)
	r.mark("route_sync")
	r.check(r.Dev.DownloadAsync(r.pin, r.offIds, r.ids, 4*nb*K, r.s))
	if next >= 0 {
		r.check(r.Dev.DownloadAsync(r.pin, r.offIds2, r.ids2, 4*K, r.s))
	}
	if r.pool != nil && r.pool.cutWeak > 0 {
		// The host's pool drops late misses by their routing weights.
		r.check(r.Dev.DownloadAsync(r.pin, r.offW, r.w, 4*nb*K, r.s))
	}
	if r.hyb.pool != nil && nb == 1 {
		// The CPU multiplies some misses: it needs the layer's input.
		r.check(r.Dev.DownloadAsync(r.pin, r.hyb.offH, r.h, 4*H, r.s))
	}
	if err := r.Dev.SyncStream(r.s); err != nil {
		return err
	}
	r.collectWaits()
	r.mark("experts")
	n := nb * K
	if err := model.GroupChoices(&r.grp, r.pids[:n]); err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	for di, e := range r.grp.Distinct {
		for j, rk := range r.grp.Members(e) {
			r.pgidx[r.grp.Base[di]+j] = int32(rk / K)
			r.ppos[rk] = int32(r.grp.Base[di] + j)
		}
	}
	r.check(r.Dev.UploadAsync(r.gidx, r.pin, r.offGidx, 4*n, r.s))
	r.check(r.Dev.UploadAsync(r.posd, r.pin, r.offPos, 4*n, r.s))
	r.check(r.k.GatherRows(r.s, r.gin, r.h, r.gidx, n, H))
	if r.pool != nil {
		r.pooledExperts(m)
		if next >= 0 {
			r.prefetch(next) // nothing after an error
		}
		if r.err != nil {
			// Whatever failed, some copies may be queued that no product
			// waits for: forget every slot's record.
			r.poolFail(r.err)
		}
		r.shared1(m)
		return r.err
	}
	if r.groupedExperts(m, n) {
		r.shared1(m)
		return r.err
	}
	exps := r.experts[m.Layer*r.E:]
	kind := exps[r.grp.Distinct[0]].gate.kind
	a := r.prepare(r.gin, n, H, kind)
	for di, e := range r.grp.Distinct {
		ex := &exps[e]
		b, rows := r.grp.Base[di], r.grp.Rows[di]
		r.mulPrepared(r.g+uintptr(4*b*I), ex.gate, a, b, rows)
		r.mulPrepared(r.u+uintptr(4*b*I), ex.up, a, b, rows)
	}
	r.act(m, r.g, r.g, r.u, n*I)
	a = r.prepare(r.g, n, I, kind)
	for di, e := range r.grp.Distinct {
		b, rows := r.grp.Base[di], r.grp.Rows[di]
		r.mulPrepared(r.outk+uintptr(4*b*H), exps[e].down, a, b, rows)
	}
	r.shared1(m)
	return r.err
}

// groupedExperts multiplies a batched step's resident q4 experts over
// the rows the host grouped (r.grp.Distinct, r.base, r.grp.Rows; the n rows
// gathered in gin) with the tiled kernel, one launch per product for
// every expert: tiles of up to bn rows of one expert each, through the
// layer's address tables. Each row's products are the bits of its
// expert's own (MatQ4's). It reports false, doing nothing, where the
// kernel does not apply: other kinds, biases, or hidden and expert widths
// that are not whole stages of 128 columns.
func (r *Runner) groupedExperts(m *block.MoE, n int) bool {
	H, I := r.H, r.I
	ex := &r.experts[m.Layer*r.E+r.grp.Distinct[0]]
	if r.nb < groupedRows || ex.gate.kind != format.Q4 || ex.up.kind != format.Q4 || ex.down.kind != format.Q4 ||
		r.tabBias != nil || r.tabGate == nil || !cuda.GemmCols(H) || !cuda.GemmCols(I) {
		return false
	}
	bn := cuda.GemmRows(n / len(r.grp.Distinct))
	nt := 0
	for di, e := range r.grp.Distinct {
		b, rows := r.grp.Base[di], r.grp.Rows[di]
		for j := 0; j < rows; j += bn {
			r.ptiles[nt] = cuda.Tile{E: int32(e), First: int32(b + j), Rows: int32(min(bn, rows-j)), Step: 1}
			nt++
		}
	}
	r.check(r.Dev.UploadAsync(r.tiles, r.pin, r.offTiles, 16*nt, r.s))
	l := m.Layer
	a := r.prepare(r.gin, n, H, format.Q4)
	x := cuda.Acts{X: a.x, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: n, Cols: H}
	r.check(r.k.MatQ4Groups(r.s, r.g, r.tabGate[l], r.tiles, nt, bn, I, x))
	r.check(r.k.MatQ4Groups(r.s, r.u, r.tabUp[l], r.tiles, nt, bn, I, x))
	r.act(m, r.g, r.g, r.u, n*I)
	r.prepare(r.g, n, I, format.Q4)
	g := cuda.Acts{X: r.g, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: n, Cols: I}
	r.check(r.k.MatQ4Groups(r.s, r.outk, r.tabDown[l], r.tiles, nt, bn, H, g))
	return true
}

// groupedRows is the fewest rows a step takes its experts in one launch
// a product (groupedExperts) from; with fewer the one-matrix kernels run
// an expert at a time.
const groupedRows = 8

// expertsOnDevice multiplies the rows' experts on the router's choice on
// the device (recorded steps): slot k's outputs land in row k of outk,
// which is where the host's grouping puts them for one row too. With more
// rows (a verify) each row's K slots are slots of their own, over a copy of
// their row: each product is the one-row kernel's, so a row's bits are
// those of a one-row step.
func (r *Runner) expertsOnDevice(m *block.MoE) {
	K, H, I := r.K, r.H, r.I
	// One row: every slot reads it, and slot K may be the shared expert.
	x, xrows, ids, n, own := r.h, 1, r.idsG, K, false
	if nb := r.nb; nb > 1 {
		n = nb * K
		r.check(r.k.GatherRows(r.s, r.gin, r.h, r.rowOf, n, H))
		x, xrows, ids, own = r.gin, n, r.ids, true
	} else if m.Shared != nil && r.sharedSlot {
		n++ // slot K: the shared expert, id E
	}
	l := m.Layer
	x8 := cuda.Acts{X: x, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: xrows, Cols: H}
	if r.exKind != "bf16" {
		r.check(r.k.PrepQ4(r.s, x8))
	}
	r.check(r.k.MatEx(r.s, r.exKind, r.g, r.tabGate[l], ids, I, x8, n, own))
	r.check(r.k.MatEx(r.s, r.exKind, r.u, r.tabUp[l], ids, I, x8, n, own))
	if r.tabBias != nil {
		r.check(r.k.AddEx(r.s, r.g, r.tabBias[l], ids, 0, I, n))
		r.check(r.k.AddEx(r.s, r.u, r.tabBias[l], ids, 1, I, n))
	}
	r.act(m, r.g, r.g, r.u, n*I)
	g8 := cuda.Acts{X: r.g, X8: r.x8, XS: r.xs, XSum: r.xsum, Rows: n, Cols: I}
	if r.exKind != "bf16" {
		r.check(r.k.PrepQ4(r.s, g8))
	}
	r.check(r.k.MatEx(r.s, r.exKind, r.outk, r.tabDown[l], ids, H, g8, n, true))
	if r.tabBias != nil {
		r.check(r.k.AddEx(r.s, r.outk, r.tabBias[l], ids, 2, H, n))
	}
}

// shared1 computes the shared expert and its gate of every row.
func (r *Runner) shared1(m *block.MoE) {
	if sh := m.Shared; sh != nil {
		r.mark("shared")
		r.mlp(r.shared, sh)
		if m.SharedGate.Present() {
			r.mul(r.sgate, r.wmat(&m.SharedGate), r.h, r.nb, r.H)
		}
	}
}

// mlp writes out = down(silu(gate(H))·up(H)) for the step's rows.
func (r *Runner) mlp(out uintptr, m *block.MLP) {
	nb := r.nb
	gw := r.wmat(&m.Gate)
	a := r.prepare(r.h, nb, r.H, gw.kind)
	r.mulPrepared(r.sg, gw, a, 0, nb)
	if uw := r.wmat(&m.Up); uw.kind != gw.kind {
		a = r.prepare(r.h, nb, r.H, uw.kind)
	}
	r.mulPrepared(r.su, r.wmat(&m.Up), a, 0, nb)
	r.check(r.k.SwiGLU(r.s, r.sg, r.sg, r.su, nb*m.Inter))
	r.mul(out, r.wmat(&m.Down), r.sg, nb, m.Inter)
}

// Combine implements block.Backend.
func (r *Runner) Combine(m *block.MoE) {
	r.mark("combine")
	mode := 0
	if m.Shared != nil {
		mode = 1
		if m.SharedGate.Present() {
			mode = 2
		}
	}
	pos, shared := r.posd, r.shared
	if r.graphing {
		pos = r.posK
		if r.sharedSlot && r.nb == 1 {
			shared = r.outk + uintptr(4*r.K*r.H) // slot K
		}
	}
	r.check(r.k.MoECombine(r.s, r.y, r.outk, pos, r.w, shared, r.sgate, r.nb, r.K, r.H, mode))
}

// Dense implements block.Backend: a dense layer's MLP, as a shared expert.
func (r *Runner) Dense(m *block.MLP) {
	r.mark("dense")
	r.mlp(r.y, m)
}

// Emit implements block.Backend: tracing is a CPU feature.
func (r *Runner) Emit(name string, layer int, b block.Buf) {}
