package experts

import (
	"sync/atomic"
	"time"
)

// LayerStats count one expert layer's demand.
type LayerStats struct {
	Hits      atomic.Int64 // experts a step found resident or already being read
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
	// layer's predictions were not paying (Stream.LookaheadOn).
	LookSkipped atomic.Int64
	Cuts        atomic.Int64
	ReadErrors  atomic.Int64
	// Wall time with at least one read in flight: bytes over this is
	// the bandwidth the reads achieved.
	ReadBusyNs atomic.Int64
	active     atomic.Int64
	busySince  atomic.Int64
}

// readStart and readEnd bracket one read, accumulating ReadBusyNs.
func (s *Stats) readStart() {
	if s.active.Add(1) == 1 {
		s.busySince.Store(time.Now().UnixNano())
	}
}

func (s *Stats) readEnd() {
	now := time.Now().UnixNano()
	if s.active.Add(-1) == 0 {
		s.ReadBusyNs.Add(now - s.busySince.Load())
	}
}

func (s *Stats) init(layers, slots int) {
	s.Slots = slots
	s.layers = make([]LayerStats, layers)
}

// Snapshot is a plain copy of the counters.
type Snapshot struct {
	PoolSlots  int             `json:"pool_slots"`
	Hits       int64           `json:"hits"`
	Misses     int64           `json:"misses"`
	BytesRead  int64           `json:"bytes_read"`
	IOWaitMS   float64         `json:"io_wait_ms"`
	Evictions  int64           `json:"evictions"`
	Cuts       int64           `json:"cuts,omitempty"`
	ReadBusyMS float64         `json:"read_busy_ms"`
	LookIssued int64           `json:"-"`
	LookUseful int64           `json:"-"`
	LookWasted int64           `json:"-"`
	LookSkip   int64           `json:"-"`
	Layers     []LayerSnapshot `json:"-"`
}

// LayerSnapshot is one layer's counters.
type LayerSnapshot struct {
	Hits      int64   `json:"hits"`
	Misses    int64   `json:"misses"`
	BytesRead int64   `json:"bytes_read"`
	IOWaitMS  float64 `json:"io_wait_ms"`
}

// Stats returns a snapshot of the counters. It allocates (the per-layer
// slice) and may be called from any goroutine.
func (s *Stream) Stats() Snapshot {
	st := &s.stats
	o := Snapshot{PoolSlots: st.Slots, BytesRead: st.BytesRead.Load(), Evictions: st.Evictions.Load(), Cuts: st.Cuts.Load(),
		LookIssued: st.LookIssued.Load(), LookUseful: st.LookUseful.Load(), LookWasted: st.LookWasted.Load(), LookSkip: st.LookSkipped.Load(), ReadBusyMS: float64(st.ReadBusyNs.Load()) / 1e6}
	o.Layers = make([]LayerSnapshot, len(st.layers))
	for i := range st.layers {
		l := &st.layers[i]
		ls := LayerSnapshot{Hits: l.Hits.Load(), Misses: l.Misses.Load(), BytesRead: l.BytesRead.Load(), IOWaitMS: float64(l.IOWaitNs.Load()) / 1e6}
		o.Layers[i] = ls
		o.Hits += ls.Hits
		o.Misses += ls.Misses
		o.IOWaitMS += ls.IOWaitMS
	}
	return o
}

// Sub returns the counters accumulated since an earlier snapshot.
func (a Snapshot) Sub(b Snapshot) Snapshot {
	o := Snapshot{PoolSlots: a.PoolSlots, Hits: a.Hits - b.Hits, Misses: a.Misses - b.Misses, BytesRead: a.BytesRead - b.BytesRead,
		IOWaitMS: a.IOWaitMS - b.IOWaitMS, Evictions: a.Evictions - b.Evictions, Cuts: a.Cuts - b.Cuts,
		LookIssued: a.LookIssued - b.LookIssued, LookUseful: a.LookUseful - b.LookUseful, LookWasted: a.LookWasted - b.LookWasted, LookSkip: a.LookSkip - b.LookSkip, ReadBusyMS: a.ReadBusyMS - b.ReadBusyMS}
	if len(a.Layers) == len(b.Layers) {
		o.Layers = make([]LayerSnapshot, len(a.Layers))
		for i := range a.Layers {
			x, y := a.Layers[i], b.Layers[i]
			o.Layers[i] = LayerSnapshot{x.Hits - y.Hits, x.Misses - y.Misses, x.BytesRead - y.BytesRead, x.IOWaitMS - y.IOWaitMS}
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
