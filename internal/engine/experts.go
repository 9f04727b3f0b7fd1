package engine

import (
	"context"
	"fmt"
	"io"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/sample"
)

// ExpertOptions choose how routed experts are served. With no pool or
// memory size and enough memory, the store is mapped whole; otherwise
// experts stream through a fixed pool.
type ExpertOptions struct {
	PoolBytes       int64          // --pool-mb: stream through a pool of this size
	PoolShare       float64        // --pool-mb N%: a pool of this share (0..1] of the expert store
	MemoryBytes     int64          // --memory-gb: total budget; the pool gets what the rest leaves
	NoLookahead     bool           // --lookahead=false
	LookDepth       int            // --lookahead-depth; 0 = experts.DefaultLookDepth
	Policy          experts.Policy // --evict; "" = experts.DefaultPolicy
	MissBits        int            // --miss-bits 3|2 (lossy)
	CutWeak         float64        // --cut-weak W (lossy)
	Readers         int            // reader goroutines; 0 = default
	PrefetchReaders int            // of which take prefetches too; 0 = follow the disk
	Log             io.Writer      // notes (O_DIRECT refused); nil = silent
	// GPUPoolBytes or GPUPoolShare (--gpu-pool-mb) stream the experts on
	// the GPU through a device pool of that size, filled from the host's
	// (the resident store, or the pool above); unset, the GPU holds every
	// expert when they fit and a pool of what is left when they do not.
	GPUPoolBytes int64
	GPUPoolShare float64
	// VRAMBytes (--vram-gb) is the most device memory the GPU backend
	// takes; 0 is what the device has free.
	VRAMBytes int64
	// GPUCPUShare (--gpu-cpu-share) is the share of a decode step's GPU
	// pool misses, per layer, that the host's CPU computes from host
	// memory instead of copying them to the GPU (q4 experts; the same
	// bits either way); 0 copies every miss. GPUCPUAuto (--gpu-cpu-share
	// auto, the CLI's default) has a cost model pick each layer's share
	// from the CPU's measured time per expert and the link's per record,
	// where the GPU streams q4 experts through a pool (elsewhere it does
	// nothing).
	GPUCPUShare float64
	GPUCPUAuto  bool
}

// maxCPUDrafts is the most drafts a step verifies on the CPU when the
// engine was opened for fewer (Options.Drafts): a generation may ask for
// drafts the engine was not opened with, and the memory budget counts
// their buffers ahead. MTP heads are trained to draft one to a few tokens.
const maxCPUDrafts = 8

// draftCap is the most drafts a step verifies on the CPU: a verify is one
// batch of chunk rows at most.
func draftCap(o Options, chunk int) int { return max(min(chunk-1, max(o.Drafts, maxCPUDrafts)), 0) }

// scoreRows is the rows a chunk of Score takes: the prefill's chunk with
// Options.AllLogits, else as many as a sequence's speculative buffers
// (callerBytes), which Score, holding no sequence, may take instead.
func scoreRows(o Options, chunk int) int {
	if o.AllLogits {
		return chunk
	}
	return min(chunk, specRows(draftCap(o, chunk)))
}

// callerBytes is what the engine's callers hold over the vocabulary
// beyond the runner's scratch, which the memory budget counts with it: for
// each sequence (Options.States, at least one) its row of logits, its
// sampler's scratch and a speculative step's buffers at draftCap drafts
// (specRows); for Score a chunk of rows (scoreRows) and a row
// of log-probabilities. The runner's scratch had counted a chunk's rows of
// logits, 150 MiB of a 150k-vocabulary model's 230 at 256 rows, taken
// from the pool though only Score with AllLogits holds them.
func callerBytes(c *format.Config, o Options, chunk int) int64 {
	seq := experts.LogitBytes(c, 1+specRows(draftCap(o, chunk))) + sample.ScratchBytes(c.Vocab)
	return max(int64(max(o.States, 1))*seq, experts.LogitBytes(c, scoreRows(o, chunk)+1))
}

// memAvailable is experts.Available, replaced in tests.
var memAvailable = experts.Available

// openExperts sets m.Experts: the resident mapping or a streaming pool.
// avail is the memory the process could use before m's dense weights were
// loaded (from availFrom; -1 when the platform gives no figure).
func openExperts(ctx context.Context, m *model.Model, o Options, avail int64, availFrom string) (*experts.Stream, string, error) {
	c := &m.Config
	xo := o.Experts
	ctxLen := o.Ctx
	if ctxLen <= 0 {
		ctxLen = 4096
		if c.MaxPos > 0 && c.MaxPos < ctxLen {
			ctxLen = c.MaxPos
		}
	}
	rows := o.ChunkRows
	if rows <= 0 {
		rows = defaultChunk
	}
	st := &m.Manifest.Stores[0]
	records := m.Manifest.ExpertLayers * m.Manifest.Experts
	if xo.PoolShare > 0 {
		xo.PoolBytes = max(int64(xo.PoolShare*float64(records))*st.Stride, int64(experts.MinSlots(c))*st.Stride)
	}
	b := experts.Budget{PoolBytes: xo.PoolBytes, MemoryBytes: xo.MemoryBytes, DenseBytes: m.DenseBytes(),
		StateBytes: experts.StateBytes(c, ctxLen), ScratchBytes: experts.ScratchBytes(c, rows, o.Threads, ctxLen) + callerBytes(c, o, rows),
		PolicyBytes: experts.PolicyBytes(xo.Policy, m.Manifest.ExpertLayers, m.Manifest.Experts),
		Avail:       avail, AvailFrom: availFrom}
	plan, err := b.Size(c, st, records)
	if err != nil {
		return nil, "", err
	}
	if plan.Resident && xo.MissBits != 0 && !mayUseGPU(o) {
		// Every expert fits in memory, so on the CPU no record is ever
		// read again after its first read: low bits would only make those
		// first reads lossy for nothing. Map them whole instead, and leave
		// the model directory as it is (deriving the low-bit store writes
		// a file and rewrites the manifest). On a GPU the flag still acts
		// on the device pool's copies, which need the host's pool.
		if xo.Log != nil {
			fmt.Fprintf(xo.Log, "note: --miss-bits %d is unused: every expert fits in memory (give --pool-mb to stream them)\n", xo.MissBits)
		}
		xo.MissBits = 0
	}
	lossy := xo.MissBits != 0 || xo.CutWeak > 0
	if plan.Resident && !lossy {
		prov, err := model.OpenResident(ctx, m, o.Progress)
		if err != nil {
			return nil, "", err
		}
		m.Experts = prov
		return nil, plan.Why, nil
	}
	if plan.Resident {
		// The lossy options act on misses, so they need the pool; give
		// it every record.
		plan.Slots = records
		plan.Why = fmt.Sprintf("pool of all %d records (lossy options need the pool)", records)
	}
	if xo.MissBits != 0 {
		k, err := format.LowKind(xo.MissBits)
		if err != nil {
			return nil, "", fmt.Errorf("--miss-bits: %v", err)
		}
		if _, ok := m.Manifest.Store(k); !ok {
			// On first use: derive the low-bit store from the main one.
			if xo.Log != nil {
				fmt.Fprintf(xo.Log, "experts: writing the %d-bit expert store of %s (once)\n", xo.MissBits, m.Dir)
			}
			if err := pack.AddLowBits(context.Background(), m.Dir, xo.MissBits, nil); err != nil {
				return nil, "", fmt.Errorf("--miss-bits %d: %v", xo.MissBits, err)
			}
			man, err := format.ReadManifest(m.Dir)
			if err != nil {
				return nil, "", err
			}
			m.Manifest.Stores = man.Stores
		}
	}
	pol := xo.Policy
	if pol == "" {
		pol = experts.DefaultPolicy
	}
	s, err := experts.Open(m.Dir, m.Manifest, experts.Options{Slots: plan.Slots, Readers: xo.Readers, PrefetchReaders: xo.PrefetchReaders, Lookahead: !xo.NoLookahead,
		LookDepth: xo.LookDepth, Policy: pol, MissBits: xo.MissBits, CutWeak: float32(xo.CutWeak), Log: xo.Log,
		// Tiling a record costs a pass over it as it lands: it pays where
		// the record then stays, not in a pool that evicts (under a
		// memory cap the user CPU went up by 47 and 49 ms a token in two
		// pairs of runs; MXFP4 records of a gpt-oss-20b synth, whose
		// tiled kernel is 1.7x the row kernel, decoded at 7.94 against
		// 9.84 tok/s under a 25% cap and 2.63 against 4.86 under 10%).
		// A store packed tiled (pack.LayoutTiled) needs no pass: its
		// records land as the kernel reads them, and Tile leaves them be.
		Tile: kernels.TiledKind(m.Manifest.Stores[0].Kind) && plan.Slots >= records})
	if err != nil {
		return nil, "", err
	}
	var progress func(done, total int64)
	if w := o.Progress; w != nil && int64(s.Slots())*s.Stride() >= 1<<30 {
		progress = func(done, total int64) {
			fmt.Fprintf(w, "\rallocating the expert pool: %.1f of %.1f GiB", float64(done)/(1<<30), float64(total)/(1<<30))
			if done == total {
				fmt.Fprintln(w)
			}
		}
	}
	if err := s.Populate(ctx, progress); err != nil {
		s.Close()
		return nil, "", err
	}
	m.Experts = s
	why := plan.Why
	how := platform.UncachedName
	if s.KernelReads() {
		how += " (asynchronous)"
	}
	if !s.Direct() {
		how = "buffered reads"
	}
	la := fmt.Sprintf("lookahead on (%d layers ahead)", s.Options().LookDepth)
	if s.Options().LookDepth == 1 {
		la = "lookahead on (the next layer)"
	}
	if xo.NoLookahead {
		la = "lookahead off"
	}
	pre := "prefetching as the disk allows"
	if n := s.Options().PrefetchReaders; n > 0 {
		pre = fmt.Sprintf("%d prefetching", n)
	}
	why += fmt.Sprintf("; %s, %d readers (%s), evict %s, %s", how, s.Options().Readers, pre, pol, la)
	if xo.MissBits != 0 {
		why += fmt.Sprintf(", misses read at %d bits (lossy)", xo.MissBits)
	}
	if xo.CutWeak > 0 {
		why += fmt.Sprintf(", cut-weak %.3g (lossy)", xo.CutWeak)
	}
	return s, why, nil
}

// ExpertStats are what the expert pool did for one generation.
type ExpertStats struct {
	PoolSlots        int     `json:"pool_slots"`
	Hits             int64   `json:"hits"`
	Misses           int64   `json:"misses"`
	BytesRead        int64   `json:"bytes_read"`
	IOWaitMS         float64 `json:"io_wait_ms"`
	HitRate          float64 `json:"hit_rate"`
	PrefillBytesRead int64   `json:"prefill_bytes_read"`
	DecodeBytesRead  int64   `json:"decode_bytes_read"`
	DecodeHitRate    float64 `json:"decode_hit_rate"`
	Cuts             int64   `json:"cuts,omitempty"`
}

// GPUPoolStats are what the GPU's expert pool did for one generation: the
// uses it held and those copied in from host memory (the host's own pool,
// when experts stream there too, is Stats.Experts), over the generation
// and its decode, and the decode's lookahead copies.
type GPUPoolStats struct {
	Slots         int     `json:"slots"`
	Hits          uint64  `json:"hits"`
	Misses        uint64  `json:"misses"`
	HitRate       float64 `json:"hit_rate"`
	BytesCopied   uint64  `json:"bytes_copied"`
	DecodeHitRate float64 `json:"decode_hit_rate"`
	// DecodeBytesCopied is what the decode copied into the pool,
	// lookahead copies included.
	DecodeBytesCopied uint64 `json:"decode_bytes_copied"`
	Prefetched        uint64 `json:"prefetched"`
	PrefetchUsed      uint64 `json:"prefetch_used"`
	// PrefetchSkipped counts the would-be lookahead copies held back
	// because their rank's predictions in their layer were not paying.
	PrefetchSkipped uint64 `json:"prefetch_skipped"`
	// CPUComputed counts the misses the host's CPU multiplied instead of
	// copying them (--gpu-cpu-share).
	CPUComputed uint64 `json:"cpu_computed"`
	// CPUFirstMS, CPUExpertMS, CPULeadMS and CopyRecordMS are the cost
	// model's figures at the end (--gpu-cpu-share): ms to multiply a
	// flush's first expert on the CPU and each further one, ms from a
	// wave's first copy to the CPU's start (each the median of recent
	// samples), ms to copy a record to the GPU (auto only); 0 where
	// unmeasured.
	CPUFirstMS   float64 `json:"cpu_first_ms,omitempty"`
	CPUExpertMS  float64 `json:"cpu_ms_per_expert,omitempty"`
	CPULeadMS    float64 `json:"cpu_lead_ms,omitempty"`
	CopyRecordMS float64 `json:"copy_ms_per_record,omitempty"`
	// LowCopies counts the records copied at the low bits of --miss-bits.
	LowCopies uint64 `json:"low_copies,omitempty"`
	// CopyWaitMS is the time the GPU's compute waited for the misses'
	// copies (its decode's part in DecodeCopyWaitMS).
	CopyWaitMS       float64 `json:"copy_wait_ms"`
	DecodeCopyWaitMS float64 `json:"decode_copy_wait_ms"`
}

// fillGPUPoolStats sets s.GPUPool from the GPU pool's counters at the start
// of a generation and after its prefill.
func (e *Engine) fillGPUPoolStats(s *Stats, start, afterPrefill DevicePool) {
	now, ok := e.DevicePool()
	if !ok || now.Slots == 0 {
		return
	}
	rate := func(h, m uint64) float64 {
		if h+m == 0 {
			return 0
		}
		return float64(h) / float64(h+m)
	}
	g := &GPUPoolStats{Slots: now.Slots, Hits: now.Hits - start.Hits, Misses: now.Misses - start.Misses,
		BytesCopied: now.BytesUp - start.BytesUp, Prefetched: now.Prefetched - start.Prefetched,
		PrefetchUsed: now.PrefetchUsed - start.PrefetchUsed, PrefetchSkipped: now.PrefetchSkipped - start.PrefetchSkipped, CPUComputed: now.CPUComputed - start.CPUComputed,
		CPUFirstMS: now.CPUFirstMS, CPUExpertMS: now.CPUExpertMS, CPULeadMS: now.CPULeadMS, CopyRecordMS: now.CopyRecordMS,
		LowCopies: now.LowCopies - start.LowCopies, CopyWaitMS: now.CopyWaitMS - start.CopyWaitMS}
	g.HitRate = rate(g.Hits, g.Misses)
	if afterPrefill.Slots > 0 {
		// Everything after the prefill is the decode's, its verify
		// batches and the head's rows included.
		g.DecodeHitRate = rate(now.Hits-afterPrefill.Hits, now.Misses-afterPrefill.Misses)
		g.DecodeBytesCopied = now.BytesUp - afterPrefill.BytesUp
		g.DecodeCopyWaitMS = now.CopyWaitMS - afterPrefill.CopyWaitMS
	}
	s.GPUPool = g
}

// LookaheadStats count next-layer prefetches: issued, used by the layer
// they were issued for, and read for nothing.
type LookaheadStats struct {
	Issued int64 `json:"issued"`
	Useful int64 `json:"useful"`
	Wasted int64 `json:"wasted"`
}

// expertSnap is the pool's counters at a point of a sequence (zero value
// when experts are resident).
func (e *Engine) expertSnap() experts.Snapshot {
	if e.Stream == nil {
		return experts.Snapshot{}
	}
	return e.Stream.Stats()
}

// fillExpertStats sets s.Experts and s.Lookahead from the counters at the
// sequence's start, after its prefill, and now.
func (e *Engine) fillExpertStats(s *Stats, start, afterPrefill experts.Snapshot) {
	if e.Stream == nil {
		return
	}
	now := e.Stream.Stats()
	d := now.Sub(start)
	s.Experts = &ExpertStats{PoolSlots: d.PoolSlots, Hits: d.Hits, Misses: d.Misses, BytesRead: d.BytesRead,
		IOWaitMS: d.IOWaitMS, HitRate: d.HitRate(), Cuts: d.Cuts}
	if afterPrefill.Layers != nil {
		s.Experts.PrefillBytesRead = afterPrefill.BytesRead - start.BytesRead
		s.Experts.DecodeBytesRead = now.BytesRead - afterPrefill.BytesRead
		s.Experts.DecodeHitRate = now.Sub(afterPrefill).HitRate()
	} else {
		s.Experts.PrefillBytesRead = d.BytesRead
	}
	if e.Stream.Lookahead() {
		s.Lookahead = &LookaheadStats{Issued: d.LookIssued, Useful: d.LookUseful, Wasted: d.LookWasted}
	}
}
