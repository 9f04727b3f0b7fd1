package kernels

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sluicelm/sluice/internal/format"
)

// Crew lets the threads of one parallel operation take over each other's
// last rows. A thread that owns a product (its part of a split product, or
// a whole expert's) takes its rows a chunk at a time from the front; a
// thread with nothing left of its own takes chunks from the back of the
// others' products. Without it a decode step at real shapes spent 8.5% of
// its time with one thread waiting at the end of an operation: halves of a
// product that stream from memory at different speeds, and the last whole
// expert of a layer running on one thread while the other waited (sluice
// bench on a 48-layer Qwen3-30B-A3B shape: 23 µs a split product and 52 µs
// a layer on average). Each output row is computed by the same kernel
// whichever thread takes it, so no result changes.
type Crew struct {
	slots   []crewSlot
	members atomic.Int32 // threads still working through work of their own
	// unclaimed counts the workers' non-empty parts of the pool's current
	// operation that no thread has claimed yet (Pool.ParallelCrew).
	unclaimed atomic.Int32
	// disp is the part the dispatching thread is running.
	disp   atomic.Int32
	stolen atomic.Uint64
	// patience is how long help spins without finding rows to take.
	patience time.Duration
	// hookChunk, set by tests only, runs in an owner after each chunk of
	// its own: a slow owner, whose rows the others then take.
	hookChunk func(self int)
}

// Stolen is the number of chunks threads have taken from others' products.
func (c *Crew) Stolen() uint64 { return c.stolen.Load() }

// crewSlot is one thread's product as the others see it. rng packs the rows
// no thread has taken yet, lo<<32 | hi; busy counts threads inside a steal
// (from before the load their claim is based on until their rows are
// done), so that the owner reuses its buffers only once busy is zero.
type crewSlot struct {
	rng   atomic.Uint64
	busy  atomic.Int32
	chunk int
	task  *matmulTask // written before rng is published, read after a claim
	_     [64]byte    // keep slots on separate cache lines
}

// NewCrew makes a crew for threads threads.
func NewCrew(threads int) *Crew {
	return &Crew{slots: make([]crewSlot, max(threads, 1)), patience: spinFor}
}

// crewChunk is the rows of w one claim takes: about 64 KB of weights, a
// few microseconds from memory, so the last chunk of an operation is short
// against the waits it saves and the claims (an atomic operation each) are
// a fraction of a percent; a multiple of 16, the decode kernels' tiles.
func crewChunk(w *Mat, nb int) int {
	rowBytes := w.Cols * 4
	switch w.Kind {
	case format.Q4:
		rowBytes = w.Cols/2 + w.Cols/format.GroupSize*4
	case format.Q8:
		rowBytes = w.Cols + w.Cols/format.GroupSize*8
	case format.BF16:
		rowBytes = w.Cols * 2
	case format.Q3, format.Q2, format.MXFP4:
		rowBytes = w.Cols/2 + w.Cols/format.GroupSize*4
	}
	rows := (64 << 10) / max(rowBytes*max(nb, 1), 1)
	return max(16, rows&^15)
}

func packRange(lo, hi int) uint64     { return uint64(lo)<<32 | uint64(hi) }
func unpackRange(v uint64) (int, int) { return int(v >> 32), int(v & 0xffffffff) }

// own runs rows [lo,hi) of t as thread self's product: published for the
// others to take chunks from the back, taken a chunk at a time from the
// front. It returns once every row is done, by whichever thread.
func (c *Crew) own(self int, t *matmulTask, lo, hi int) {
	sl := &c.slots[self]
	sl.task = t
	sl.chunk = crewChunk(t.w, t.nb)
	if t.pair.w != nil {
		// Each row brings its pair's: the same bytes a claim.
		sl.chunk = max(16, sl.chunk/2&^15)
	}
	sl.rng.Store(packRange(lo, hi))
	for {
		v := sl.rng.Load()
		a, b := unpackRange(v)
		if a >= b {
			break
		}
		e := min(b, a+sl.chunk)
		if sl.rng.CompareAndSwap(v, packRange(e, b)) {
			t.Run(a, e)
			if c.hookChunk != nil {
				c.hookChunk(self)
			}
		}
	}
	for spins := 0; sl.busy.Load() != 0; spins++ {
		// A thief is finishing rows of ours (a few microseconds), or is
		// about to find nothing left. Should it have lost its processor,
		// let it have this one now and then.
		if spins&1023 == 1023 {
			runtime.Gosched()
		}
	}
	sl.task = nil
}

// steal takes one chunk from the back of thread i's product and runs it
// with room as its room for widened scales. It reports whether it did.
func (c *Crew) steal(i int, room [][]float32) bool {
	sl := &c.slots[i]
	if a, b := unpackRange(sl.rng.Load()); a >= b {
		return false
	}
	sl.busy.Add(1)
	defer sl.busy.Add(-1)
	for {
		v := sl.rng.Load()
		a, b := unpackRange(v)
		if a >= b {
			return false
		}
		s := a
		if b-a > sl.chunk {
			// Keep the owner's front on a tile boundary.
			s = a + (b-a-sl.chunk)&^15
		}
		if sl.rng.CompareAndSwap(v, packRange(a, s)) {
			t := *sl.task
			t.rooms, t.step = room, 0
			t.Run(s, b)
			c.stolen.Add(1)
			return true
		}
	}
}

// help takes chunks of the other threads' products while any of them is
// still working through its own work, and gives up after c.patience
// without finding any (a thread that lost its core; the caller's barrier
// sees to it). The dispatching thread (Crew.disp) gives up at once when a
// worker's part has not been claimed: no rows of it are there to take,
// and the barrier runs it now rather than after the patience. That is
// the common case while experts stream: the workers park while the
// decode waits for a read, and a parked worker can take longer to wake
// than the part it is woken for (BenchmarkPoolAfterIdle: on a 2-core VM
// the dispatcher ran 50-78% of the worker's 200 µs parts dispatched after
// 1 ms idle). The worker, once up, takes rows of its part from the back
// (Pool.worker).
func (c *Crew) help(self int, room [][]float32) {
	idle := time.Time{}
	for spins := 0; ; spins++ {
		stole := false
		for i := range c.slots {
			if i != self && c.steal(i, room) {
				stole = true
			}
		}
		switch {
		case stole:
			idle = time.Time{}
		case c.members.Load() == 0:
			return
		case self == int(c.disp.Load()) && c.unclaimed.Load() > 0:
			return
		case spins&255 == 255:
			if idle.IsZero() {
				idle = time.Now()
			} else if time.Since(idle) > c.patience {
				return
			}
		}
	}
}

// Join makes s thread i of c: its products are then shared with the crew
// (Pool.ParallelCrew and Crew.Done frame the threads' own work).
func (s *Scratch) Join(c *Crew, i int) {
	s.crew, s.self = c, i
	if s.rooms == nil {
		s.rooms = [][]float32{make([]float32, scaleRoom)}
	}
}

// Rooms is s's room for widened scales, for Crew.Done.
func (s *Scratch) Rooms() [][]float32 { return s.rooms }

// expect says that n threads are about to work through work of their own,
// each calling Done once it has none left: until then the others help
// with their products rather than stop. Pool.ParallelCrew sets it before
// the operation is dispatched, so that a thread done early does not stop
// helping before a slower one has even started.
func (c *Crew) expect(n int) { c.members.Store(int32(n)) }

// Done says that thread i has no work of its own left, then helps the
// others with their products (room: its room for widened scales,
// Scratch.Rooms) until every expected thread is done and no product is
// left to take.
func (c *Crew) Done(i int, room [][]float32) {
	c.members.Add(-1)
	c.help(i, room)
}

// crewTask is a product split across a pool's threads with a crew: each
// part owns its rows and helps the other parts when done.
type crewTask struct {
	c  *Crew
	mm *matmulTask
}

func (t *crewTask) Run(lo, hi int) {
	part := 0
	if t.mm.step > 0 {
		part = lo / t.mm.step
	}
	c := t.c
	c.own(part, t.mm, lo, hi)
	c.Done(part, t.mm.rooms[part:part+1])
}
