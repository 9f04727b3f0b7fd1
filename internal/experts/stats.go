package experts

import (
	"sync/atomic"
	"time"
)

// LayerStats count one expert layer's demand.
type LayerStats struct {
	Hits      atomic.Int64 // experts a step found resident or already being read
	Landed    atomic.Int64 // of the hits, those whose read had landed: no wait
	Misses    atomic.Int64 // experts a step had to read
	BytesRead atomic.Int64 // bytes of demand reads
	IOWaitNs  atomic.Int64 // time the forward waited for reads
}

// Stats are the stream's counters since it opened. They are atomics so
// that a server can read them while a step runs.
type Stats struct {
	Slots      int
	layers     []LayerStats
	BytesRead  atomic.Int64 // all reads, prefetches included
	Evictions  atomic.Int64
	LookIssued atomic.Int64
	LookUseful atomic.Int64
	LookWasted atomic.Int64
	// LookSkipped counts predicted records not prefetched because their
	// rank's predictions in their layer were not paying (LookGate).
	LookSkipped atomic.Int64
	// Of the four counts above, those of predictions made two or more
	// layers ahead (Options.LookDepth): whether the deeper guesses pay
	// is told apart from the next layer's.
	AheadIssued, AheadUseful, AheadWasted, AheadSkipped atomic.Int64
	// LookSteps counts the steps the lookahead's trial saw (lookTrial),
	// LookPaused those it spent without predictions; LookGainNs is the
	// trial's estimate of the step time predicting saves (negative: adds),
	// in ns.
	LookSteps  atomic.Int64
	LookPaused atomic.Int64
	LookGainNs atomic.Int64
	Cuts       atomic.Int64
	ReadErrors atomic.Int64
	// Wall time with at least one read in flight: bytes over this is
	// the bandwidth the reads achieved.
	ReadBusyNs atomic.Int64
	// The disk's throughput under load, which the reads' rate is set
	// against (adaptReaders): the wall time of the stretches that begin
	// when deepReads reads are in flight and end when none is, and the
	// bytes of the reads that ended in them. A stretch ends at none in
	// flight, not at fewer than deepReads: reads issued together (a
	// step's misses, its prefetches) are served side by side and end
	// close together, and ending the stretch as the count fell below
	// deepReads left the last deepReads-1 reads' bytes out of the time
	// that served them, 3 of a step's 8 reads on the 48-layer
	// qwen3-30b-a3b synth (it read 1.0-1.6 GB/s under load that way,
	// against 1.7-2.5 GB/s over all the time with reads in flight).
	DeepNs    atomic.Int64
	DeepBytes atomic.Int64
	// PrefetchSwitches counts the changes of the prefetch readers' count
	// (adaptReaders).
	PrefetchSwitches atomic.Int64
	active           atomic.Int64
	busySince        atomic.Int64
	deepSince        atomic.Int64
	deep             atomic.Bool // in such a stretch
	deepReads        int64
}

// readStart and readEnd bracket one read of n bytes, accumulating
// ReadBusyNs, DeepNs and DeepBytes.
func (s *Stats) readStart() {
	a := s.active.Add(1)
	if a == 1 || a == s.deepReads {
		now := time.Now().UnixNano()
		if a == 1 {
			s.busySince.Store(now)
		}
		if a == s.deepReads && !s.deep.Load() {
			s.deepSince.Store(now)
			s.deep.Store(true)
		}
	}
}

func (s *Stats) readEnd(n int64) {
	now := time.Now().UnixNano()
	a := s.active.Add(-1) + 1 // in flight with this one
	if s.deep.Load() {
		s.DeepBytes.Add(n)
	}
	if a == 1 {
		s.ReadBusyNs.Add(now - s.busySince.Load())
		if s.deep.CompareAndSwap(true, false) {
			s.DeepNs.Add(now - s.deepSince.Load())
		}
	}
}

func (s *Stats) init(layers, slots, readers int) {
	s.Slots = slots
	s.deepReads = int64(max(min(deepReads, readers), 1))
	s.layers = make([]LayerStats, layers)
}

// Snapshot is a plain copy of the counters.
type Snapshot struct {
	PoolSlots  int     `json:"pool_slots"`
	Hits       int64   `json:"hits"`
	Landed     int64   `json:"landed"` // of the hits, those already read (LayerStats.Landed)
	Misses     int64   `json:"misses"`
	BytesRead  int64   `json:"bytes_read"`
	IOWaitMS   float64 `json:"io_wait_ms"`
	Evictions  int64   `json:"evictions"`
	Cuts       int64   `json:"cuts,omitempty"`
	ReadBusyMS float64 `json:"read_busy_ms"`
	// PrefetchReaders is how many readers took prefetches when the
	// snapshot was taken; PrefetchSwitches how often that count changed.
	PrefetchReaders int `json:"prefetch_readers"`
	// The time with at least 4 reads in flight and the bytes of the reads
	// that ended in it (Stats.DeepNs, DeepBytes).
	DeepMS           float64 `json:"deep_ms"`
	DeepBytes        int64   `json:"deep_bytes"`
	PrefetchSwitches int64   `json:"prefetch_switches"`
	LookIssued       int64   `json:"-"`
	LookUseful       int64   `json:"-"`
	LookWasted       int64   `json:"-"`
	LookSkip         int64   `json:"-"`
	// Of those, the predictions made two or more layers ahead.
	AheadIssued int64           `json:"-"`
	AheadUseful int64           `json:"-"`
	AheadWasted int64           `json:"-"`
	AheadSkip   int64           `json:"-"`
	LookSteps   int64           `json:"-"`
	LookPaused  int64           `json:"-"`
	LookGainMS  float64         `json:"-"` // the trial's estimate when taken (Sub keeps the later)
	Layers      []LayerSnapshot `json:"-"`
}

// LayerSnapshot is one layer's counters.
type LayerSnapshot struct {
	Hits      int64   `json:"hits"`
	Landed    int64   `json:"landed"`
	Misses    int64   `json:"misses"`
	BytesRead int64   `json:"bytes_read"`
	IOWaitMS  float64 `json:"io_wait_ms"`
}

// Stats returns a snapshot of the counters. It allocates (the per-layer
// slice) and may be called from any goroutine.
func (s *Stream) Stats() Snapshot {
	st := &s.stats
	o := Snapshot{PoolSlots: st.Slots, BytesRead: st.BytesRead.Load(), Evictions: st.Evictions.Load(), Cuts: st.Cuts.Load(),
		LookIssued: st.LookIssued.Load(), LookUseful: st.LookUseful.Load(), LookWasted: st.LookWasted.Load(), LookSkip: st.LookSkipped.Load(), LookSteps: st.LookSteps.Load(), LookPaused: st.LookPaused.Load(), LookGainMS: float64(st.LookGainNs.Load()) / 1e6, ReadBusyMS: float64(st.ReadBusyNs.Load()) / 1e6,
		AheadIssued: st.AheadIssued.Load(), AheadUseful: st.AheadUseful.Load(), AheadWasted: st.AheadWasted.Load(), AheadSkip: st.AheadSkipped.Load(),
		PrefetchReaders: s.PrefetchReaders(), PrefetchSwitches: st.PrefetchSwitches.Load(),
		DeepMS: float64(st.DeepNs.Load()) / 1e6, DeepBytes: st.DeepBytes.Load()}
	o.Layers = make([]LayerSnapshot, len(st.layers))
	for i := range st.layers {
		l := &st.layers[i]
		ls := LayerSnapshot{Hits: l.Hits.Load(), Landed: l.Landed.Load(), Misses: l.Misses.Load(), BytesRead: l.BytesRead.Load(), IOWaitMS: float64(l.IOWaitNs.Load()) / 1e6}
		o.Layers[i] = ls
		o.Hits += ls.Hits
		o.Landed += ls.Landed
		o.Misses += ls.Misses
		o.IOWaitMS += ls.IOWaitMS
	}
	return o
}

// Sub returns the counters accumulated since an earlier snapshot.
func (a Snapshot) Sub(b Snapshot) Snapshot {
	o := Snapshot{PoolSlots: a.PoolSlots, Hits: a.Hits - b.Hits, Landed: a.Landed - b.Landed, Misses: a.Misses - b.Misses, BytesRead: a.BytesRead - b.BytesRead,
		IOWaitMS: a.IOWaitMS - b.IOWaitMS, Evictions: a.Evictions - b.Evictions, Cuts: a.Cuts - b.Cuts,
		LookIssued: a.LookIssued - b.LookIssued, LookUseful: a.LookUseful - b.LookUseful, LookWasted: a.LookWasted - b.LookWasted, LookSkip: a.LookSkip - b.LookSkip, LookSteps: a.LookSteps - b.LookSteps, LookPaused: a.LookPaused - b.LookPaused, LookGainMS: a.LookGainMS, ReadBusyMS: a.ReadBusyMS - b.ReadBusyMS,
		AheadIssued: a.AheadIssued - b.AheadIssued, AheadUseful: a.AheadUseful - b.AheadUseful, AheadWasted: a.AheadWasted - b.AheadWasted, AheadSkip: a.AheadSkip - b.AheadSkip,
		PrefetchReaders: a.PrefetchReaders, PrefetchSwitches: a.PrefetchSwitches - b.PrefetchSwitches,
		DeepMS: a.DeepMS - b.DeepMS, DeepBytes: a.DeepBytes - b.DeepBytes}
	if len(a.Layers) == len(b.Layers) {
		o.Layers = make([]LayerSnapshot, len(a.Layers))
		for i := range a.Layers {
			x, y := a.Layers[i], b.Layers[i]
			o.Layers[i] = LayerSnapshot{x.Hits - y.Hits, x.Landed - y.Landed, x.Misses - y.Misses, x.BytesRead - y.BytesRead, x.IOWaitMS - y.IOWaitMS}
		}
	}
	return o
}

// HitRate is hits / (hits + misses), 1 when nothing was asked.
func (a Snapshot) HitRate() float64 {
	if a.Hits+a.Misses == 0 {
		return 1
	}
	return float64(a.Hits) / float64(a.Hits+a.Misses)
}

// LandedRate is the share of requests whose record had landed, 1 when
// nothing was asked: HitRate less the hits on reads still in flight (a
// prefetch, or an earlier step's read). A replay of the requests
// (SimulateHits, BeladyHits) reads nothing ahead and has no such hits;
// with reads ahead the pool may land more than its optimum hits.
func (a Snapshot) LandedRate() float64 {
	if a.Hits+a.Misses == 0 {
		return 1
	}
	return float64(a.Landed) / float64(a.Hits+a.Misses)
}

// DevicePool is what a GPU's expert pool holds and did so far: Slots
// records of the model's Records (0 slots: every expert resident on the
// device); the experts found in a slot (Hits) or copied into one from the
// host (Misses) and the bytes those copies moved, in all steps and in
// one-row (decode) steps; the records the decode's lookahead copied in
// (counted in BytesUp) and those a step then used; whether the copies
// come straight from page-locked host memory, the host's store held whole
// or its streaming pool (HostPinned, which also lets the decode look a
// layer ahead), and if not why (PinNote). It lives
// here, beside the host pool's Stats, so that builds without the GPU
// backend name it too.
type DevicePool struct {
	Slots, Records, RecordBytes             int
	Hits, Misses, BytesUp                   uint64
	DecodeHits, DecodeMisses, DecodeBytesUp uint64
	Prefetched, PrefetchUsed                uint64
	PrefetchSkipped                         uint64  // would-be lookahead copies held back: their rank's predictions did not pay
	CPUComputed                             uint64  // misses the host's CPU computed instead of copying them
	LowCopies                               uint64  // records copied at the low bits of --miss-bits (lossy)
	CopyWaitMS, DecodeCopyWaitMS            float64 // the compute stream's waits for the misses' copies
	// The hybrid cost model's figures (--gpu-cpu-share), running
	// averages of what it measured: ms to multiply a wave's first
	// expert on the CPU (its threads wake) and each further one, ms from
	// a wave's first copy to the CPU's start, ms to copy one record to
	// the device (auto only); 0 where unmeasured.
	CPUFirstMS, CPUExpertMS, CPULeadMS, CopyRecordMS float64
	HostPinned                                       bool
	PinNote                                          string
}
