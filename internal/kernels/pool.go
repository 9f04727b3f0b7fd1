package kernels

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sluicelm/sluice/internal/format"
)

// Task is a unit of parallel work over an index range.
type Task interface {
	Run(lo, hi int)
}

type span struct{ lo, hi int }

// Pool is a persistent set of worker goroutines that split each operation
// of a step by output rows. A decode step of a small model is a few hundred
// operations of a few microseconds each, so the hand-off must cost far less
// than a goroutine wake-up: workers spin on a generation counter for a short
// while after each operation and only then park on a channel. Tasks are
// pointers to structs the pool owns, so dispatching allocates nothing. A Pool
// runs one operation at a time: it belongs to one engine.
//
// A part goes to whichever thread claims it first: its worker, or the
// dispatching thread once it has finished its own part. When another
// process holds a core, a worker may not run for a whole scheduler tick;
// the dispatcher then does that worker's part itself instead of waiting,
// so a loaded machine slows a step down to one thread's speed rather than
// to one tick per operation. Which thread runs a part changes no result.
type Pool struct {
	n       int
	gen     atomic.Uint64  // bumped once per dispatched operation
	pending atomic.Int32   // parts still running the current operation, | mainParkedBit
	spans   []span         // per worker: its part of the current operation
	claims  []atomic.Int32 // per worker: 1 once someone has taken its part
	parked  []atomic.Bool
	wake    []chan struct{}
	closed  atomic.Bool
	task    Task
	// patience is how long an idle worker polls before parking, in ns
	// (spinFor unless SetPatience changed it).
	patience atomic.Int64
	// The dispatching thread parks the same way while it waits for the
	// workers (spinning only pays while every thread has a core): it sets
	// mainParkedBit in pending, and the worker whose decrement leaves just
	// that bit wakes it.
	mainWake chan struct{}

	sc Scratch
	// crew shares the rows of the pool's products between its threads, and
	// is there for tasks whose threads run products of their own
	// (Scratch.Join).
	crew  *Crew
	crewT crewTask
	// crewOp says the current operation's parts share their products
	// through the crew (ParallelCrew): a worker whose part the
	// dispatcher took helps with it instead (Crew.help). late are the
	// workers' rooms for widened scales when they do.
	crewOp atomic.Bool
	late   [][][]float32
	// hookDone, set by tests only (before the first operation), runs in a
	// worker right after it reports its part done: it widens the window in
	// which the dispatcher may already be on its next operation.
	hookDone func(worker, left int)
	// hookClaim, set by tests only, runs in a worker just before it
	// claims its part: a worker that wakes late.
	hookClaim func(worker int)
	// idle, when set (SetIdle), runs on the dispatching goroutine once an
	// operation, when its own parts are done and a worker's is not.
	idle func()
	// dispatches counts operations handed to the workers (Parallel calls
	// that split), for the per-token figures of sluice bench.
	dispatches uint64
	// selfRuns counts the workers' parts the dispatcher ran itself because
	// their worker had not started them: near zero when every thread has
	// a core, and most of them when the workers sleep between operations
	// or lose their cores (to other processes, or to the kernel's work for
	// the expert reads).
	selfRuns uint64
}

// Dispatches is the number of operations split across threads so far.
// Read it between steps, on the dispatching goroutine.
func (p *Pool) Dispatches() uint64 { return p.dispatches }

// SelfRuns is the number of workers' parts the dispatching thread ran
// itself so far, out of Dispatches × (Threads − 1) parts. Read it between
// steps, on the dispatching goroutine.
func (p *Pool) SelfRuns() uint64 { return p.selfRuns }

// mainParkedBit in Pool.pending says the dispatcher is parked on mainWake.
const mainParkedBit = 1 << 30

// spinFor is how long an idle worker polls before parking: longer than the
// gap between two operations of a step, shorter than anything a user would
// notice as a busy core.
const spinFor = 50 * time.Microsecond

// NewPool starts threads-1 workers (the caller is the last thread); threads
// <= 0 means one per CPU.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	p := &Pool{n: threads, spans: make([]span, threads), claims: make([]atomic.Int32, threads), parked: make([]atomic.Bool, threads), mainWake: make(chan struct{}, 1)}
	// Every channel exists before any worker runs: a worker reads p.wake
	// while parking.
	p.wake = make([]chan struct{}, threads-1)
	for i := range p.wake {
		p.wake[i] = make(chan struct{}, 1)
	}
	p.sc.rooms = make([][]float32, threads)
	for i := range p.sc.rooms {
		p.sc.rooms[i] = make([]float32, scaleRoom)
	}
	p.patience.Store(int64(spinFor))
	p.crew = NewCrew(threads)
	p.late = make([][][]float32, threads)
	for i := range p.late {
		p.late[i] = [][]float32{make([]float32, scaleRoom)}
	}
	for i := 1; i < threads; i++ {
		go p.worker(i)
	}
	return p
}

// SetPatience sets how long an idle worker polls for the next operation
// before it parks: spinFor by default, and never less (the crew's
// patience within an operation is not changed). A worker that parked is woken
// through the scheduler, which on a virtual machine whose idle processors
// halt took hundreds of microseconds (experts.ReadSpin): a decode that
// waits for the disk between operations keeps its workers awake through
// such waits with a patience as long as them.
func (p *Pool) SetPatience(d time.Duration) { p.patience.Store(int64(max(d, spinFor))) }

// SetIdle sets f to run on the dispatching goroutine while it waits for a
// worker's part of an operation (once an operation, after its own parts),
// or unsets it with nil. The expert stream uses it to hand the disk its
// next read as soon as one finishes, rather than at the forward's next
// call into the stream, up to a layer's compute later
// (experts.Stream.Poll). f must be quick and must not dispatch. Set it
// between operations, on the dispatching goroutine.
func (p *Pool) SetIdle(f func()) { p.idle = f }

// Crew is the pool's crew, for tasks whose threads run products of their
// own: each such thread's Scratch joins it under the index of the part it
// runs.
func (p *Pool) Crew() *Crew { return p.crew }

// Threads is the number of threads the pool splits work across.
func (p *Pool) Threads() int { return p.n }

func (p *Pool) worker(i int) {
	// Start from generation 0, not the current one: an operation may have
	// been dispatched before this goroutine first ran.
	var seen uint64
	for {
		g := p.gen.Load()
		if g == seen {
			start := time.Now()
			for spins := 0; g == seen; spins++ {
				if spins&255 == 255 && time.Since(start) > time.Duration(p.patience.Load()) {
					// Park; re-check after announcing it so that a dispatch
					// racing with us is never missed.
					p.parked[i].Store(true)
					if g = p.gen.Load(); g == seen {
						<-p.wake[i-1]
						g = p.gen.Load()
					} else if !p.parked[i].CompareAndSwap(true, false) {
						<-p.wake[i-1] // the dispatcher saw us parked and sent a wake: consume it
					}
					break
				}
				g = p.gen.Load()
			}
			if g == seen {
				continue
			}
		}
		seen = g
		if p.closed.Load() {
			return
		}
		if p.hookClaim != nil {
			p.hookClaim(i)
		}
		if !p.claims[i].CompareAndSwap(0, 1) {
			// The dispatcher took this part (and counts it). Take rows
			// of it, or of any part still running: self -1 leaves no
			// slot out, since the dispatcher now owns this worker's.
			if p.crewOp.Load() {
				p.crew.help(-1, p.late[i])
			}
			continue
		}
		if p.crewOp.Load() && p.spans[i].hi > p.spans[i].lo {
			p.crew.unclaimed.Add(-1)
		}
		if s := p.spans[i]; s.hi > s.lo {
			p.task.Run(s.lo, s.hi)
		}
		// Whether the dispatcher is parked is read in the same atomic
		// operation that reports the part done: once the count reaches
		// zero the dispatcher may be on its next operation, and a wake
		// decided after that would wake it out of the wrong one.
		left := p.pending.Add(-1)
		if p.hookDone != nil {
			p.hookDone(i, int(left&^mainParkedBit))
		}
		if left == mainParkedBit {
			p.mainWake <- struct{}{}
		}
	}
}

// Close stops the workers.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	p.gen.Add(1)
	for i := 1; i < p.n; i++ {
		if p.parked[i].CompareAndSwap(true, false) {
			p.wake[i-1] <- struct{}{}
		}
	}
	p.n = 1
}

// split is how Parallel divides [0,n): parts of step indices.
func (p *Pool) split(n, grain int) (parts, step int) {
	parts = p.n
	if grain < 1 {
		grain = 1
	}
	if m := (n + grain - 1) / grain; m < parts {
		parts = m
	}
	if parts < 1 {
		parts = 1
	}
	return parts, (n + parts - 1) / parts
}

// Part is the index of the part of Parallel(n, grain, ...) starting at lo:
// a task uses it to pick per-thread scratch.
func (p *Pool) Part(n, grain, lo int) int {
	_, step := p.split(n, grain)
	return lo / max(step, 1)
}

// Parallel runs t over [0,n) split into contiguous parts of at least grain
// indices, one per thread.
func (p *Pool) Parallel(n, grain int, t Task) {
	parts, step := p.split(n, grain)
	if parts <= 1 {
		t.Run(0, n)
		return
	}
	p.task = t
	p.dispatches++
	for i := 1; i < p.n; i++ {
		lo, hi := min(i*step, n), min((i+1)*step, n)
		if i >= parts {
			lo, hi = n, n
		}
		p.spans[i] = span{lo, hi}
	}
	// pending is set before any part can be claimed: a worker still
	// looking at the previous operation may claim a part as soon as its
	// claim resets, and its decrement must not be overwritten.
	p.pending.Store(int32(p.n - 1))
	for i := 1; i < p.n; i++ {
		p.claims[i].Store(0)
	}
	p.gen.Add(1)
	for i := 1; i < p.n; i++ {
		if p.parked[i].CompareAndSwap(true, false) {
			p.wake[i-1] <- struct{}{}
		}
	}
	t.Run(0, min(step, n))
	for i := 1; i < p.n; i++ {
		// A worker that has not started yet has probably lost its core,
		// or is still waking.
		if p.claims[i].CompareAndSwap(0, 1) {
			p.selfRuns++
			if s := p.spans[i]; s.hi > s.lo {
				if p.crewOp.Load() {
					p.crew.unclaimed.Add(-1)
					p.crew.disp.Store(int32(i))
				}
				t.Run(s.lo, s.hi)
			}
			p.pending.Add(-1)
		}
	}
	if p.idle != nil && p.pending.Load() != 0 {
		p.idle()
	}
	// The other parts are as long as ours, so they usually finish within
	// microseconds: spin briefly, then park (a worker that lost its core to
	// another process may take a scheduler tick).
	start := time.Now()
	for spins := 0; p.pending.Load() != 0; spins++ {
		if spins&255 == 255 && time.Since(start) > spinFor {
			if left := p.pending.Load(); left != 0 && p.pending.CompareAndSwap(left, left|mainParkedBit) {
				<-p.mainWake // sent by the worker whose decrement leaves just the bit
				break
			}
		}
	}
	p.task = nil
}

type matmulTask struct {
	out, x, xsum, xs []float32
	x8               []int8
	x8p              []int8  // q3, q2 with the kernel: x8 permuted by lowPerm; tiled MXFP4: by mxPermX
	sx12             []int32 // MXFP4 with AVX-512: 12·Σx8 a block
	xperm            uint8   // MXFP4: x8p's order, mxPermTiled or mxPermRowsOrder (0: none)
	w                *Mat
	nb               int
	// rooms are the parts' rooms for widened scales (the Scratch's), and
	// step the rows of a part (0: one part), which tell a part its room.
	rooms [][]float32
	step  int
	// pair, when set, is a second range of rows each part computes with
	// its own (q4RowsPaired): a decode's q4 product as two streams.
	pair taskPair
}

// taskPair is a product's second range of rows: rows [lo+off, hi+off) of
// w into out (w's rows, as matmulTask.out), for each part's [lo,hi).
type taskPair struct {
	w   *Mat
	out []float32
	off int
}

// pairQ4 reports whether a product of nb rows with w runs as pairs of row
// ranges, two tiles a step of the decode kernel (q4RowsPaired): for a
// decode's tiled q4 matrices where q4RowsMode asks for it (not by
// default: see q4RowsMode). The results are the same bits either way.
func pairQ4(w *Mat, nb int) bool {
	return nb == 1 && w.Kind == format.Q4 && w.Tiled && useAVX2 && q4RowsTiles &&
		q4RowsMode&q4RowsPairs != 0 && q4PairMode(q4RowsMode|q4RowsTiled)
}

// runHalves runs the prepared product s.mm (w) through run (rows: the
// rows to split across threads), paired where pairQ4 allows: rows [0,h)
// with [h,2h), h half of w's rows in whole tiles, then the rows past 2h
// (where w's rows are not whole pairs of tiles) on the calling thread.
func (s *Scratch) runHalves(w *Mat, run func(rows int)) {
	h := w.Rows / 2 / TileRows * TileRows
	if h == 0 || !pairQ4(w, s.mm.nb) {
		run(w.Rows)
		return
	}
	s.mm.pair = taskPair{w: w, out: s.mm.out, off: h}
	run(h)
	if 2*h < w.Rows {
		// The parts are done: the first part's room is free (step 0 picks
		// it), where the part that row 2h falls in may have none.
		s.mm.pair, s.mm.step = taskPair{}, 0
		s.mm.Run(2*h, w.Rows)
	}
	s.mm.pair = taskPair{}
}

// pairTwo pairs the prepared product s.mm (w1) with w2 row for row, into
// out2, where both have the same shape and pairQ4 allows (an expert's
// gate and up projections): one pass over both.
func (s *Scratch) pairTwo(w1, w2 *Mat, out2 []float32) bool {
	if w2.Rows != w1.Rows || w2.Cols != w1.Cols || w2.Kind != w1.Kind || w2.Tiled != w1.Tiled || !pairQ4(w1, s.mm.nb) {
		return false
	}
	s.mm.pair = taskPair{w: w2, out: out2[:s.mm.nb*w2.Rows]}
	return true
}

// room is the room for widened scales of the part that starts at row lo.
func (t *matmulTask) room(lo int) *[]float32 {
	part := 0
	if t.step > 0 {
		part = lo / t.step
	}
	if part >= len(t.rooms) {
		return new([]float32) // a task built by hand (tests): a room of its own
	}
	return &t.rooms[part]
}

func (t *matmulTask) Run(lo, hi int) {
	w := t.w
	C := w.Cols
	ng := C / format.GroupSize
	if w.Kind == format.MXFP4 {
		t.runMXFP4(lo, hi) // mxfp4.go
		return
	}
	if w.Kind == format.Q3 || w.Kind == format.Q2 {
		t.runLow(lo, hi) // lowbit.go
		return
	}
	if w.Kind == format.Q4 && useAVX2 && hi > lo && ng > 0 && t.nb > 0 {
		// Tiles of weight rows against every activation row (q4tile.go).
		t.runQ4(lo, hi)
		return
	}
	if useAVX2 && C%16 == 0 && hi > lo {
		// One kind switch per part rather than per dot product: for the
		// small matrices of a decode step the dispatch is a visible cost.
		// The kernels are the ones dotRow calls, so results are identical.
		x, out := t.x, t.out
		switch w.Kind {
		case format.Q8:
			_ = w.Q[hi*C-1]
			room := t.room(lo)
			step := rowsPerWiden(ng, 1)
			for c0 := lo; c0 < hi; c0 += step {
				c1 := min(c0+step, hi)
				s, b := w.widen(room, c0, c1)
				for o := c0; o < c1; o++ {
					i := (o - c0) * ng
					for r := 0; r < t.nb; r++ {
						out[r*w.Rows+o] = dotQ8AVX2(&w.Q[o*C], &s[i], &b[i], &x[r*C], &t.xsum[r*ng], ng)
					}
				}
			}
			return
		case format.BF16:
			_ = w.BF16[hi*C-1]
			for o := lo; o < hi; o++ {
				for r := 0; r < t.nb; r++ {
					out[r*w.Rows+o] = dotBF16AVX2(&w.BF16[o*C], &x[r*C], C)
				}
			}
			return
		case format.F32:
			// Slicing checks out's length without reading an element that
			// another thread's part is writing.
			_, out = w.F32[hi*C-1], out[:t.nb*w.Rows]
			for o := lo; o < hi; o++ {
				r := 0
				for ; r+4 <= t.nb; r += 4 {
					dotF32x4AVX2(&w.F32[o*C], &x[r*C], 4*C, C, &out[r*w.Rows+o], 4*w.Rows)
				}
				for ; r < t.nb; r++ {
					out[r*w.Rows+o] = dotF32AVX2(&w.F32[o*C], &x[r*C], C)
				}
			}
			return
		}
	}
	if w.Kind == format.Q4 || w.Kind == format.Q8 {
		// The Go twins (the kernels took these kinds above): each row's
		// scales widened once for all its activation rows.
		room := t.room(lo)
		var qb [rowQRoom]byte
		for o := lo; o < hi; o++ {
			s, b := w.widen(room, o, o+1)
			var q []byte
			if w.Kind == format.Q4 {
				q = w.rowQ4(o, qb[:])
			}
			for r := 0; r < t.nb; r++ {
				xsum := t.xsum[r*ng : (r+1)*ng]
				if w.Kind == format.Q8 {
					t.out[r*w.Rows+o] = dotQ8(w.Q[o*C:(o+1)*C], s, b, t.x[r*C:(r+1)*C], xsum)
					continue
				}
				t.out[r*w.Rows+o] = dotQ4I8(q, s, b,
					t.x8[r*C:(r+1)*C], t.xs[r*ng:(r+1)*ng], xsum)
			}
		}
		return
	}
	for o := lo; o < hi; o++ {
		for r := 0; r < t.nb; r++ {
			t.out[r*w.Rows+o] = w.dotRow(o, t.x[r*C:(r+1)*C], nil)
		}
	}
}

// MatMul computes out[r] = W·x[r] for nb rows: out is [nb][W.Rows], x is
// [nb][W.Cols].
//
// q4 products use int8 activations (quantised per group of 64, symmetric)
// and integer dot products: one row at a time, 1.4–1.6× faster than
// dequantising the weights to float and using FMA, and 3–4× with the 8-row
// decode kernel (BenchmarkQ4Designs), for a held-out NLL cost well inside
// the q4 budget (TestQuantisedNLL). q8, bf16 and f32 keep
// float activations: 8-bit weights times int8 would overflow VPMADDUBSW's
// int16 pairs, and bf16 is the exact mode.
func (p *Pool) MatMul(out []float32, w *Mat, x []float32, nb int) {
	p.sc.prepare(out, w, x, nb)
	// Below ~16K multiply-adds per part, waking a worker costs more than it saves.
	grain := max(1, 16384/(w.Cols*nb))
	p.sc.runHalves(w, func(rows int) { p.run(rows, grain) })
	p.sc.mm = matmulTask{}
}

// run splits the prepared product p.sc.mm over the threads, parts sharing
// their last rows through the crew.
func (p *Pool) run(rows, grain int) {
	_, p.sc.mm.step = p.split(rows, grain)
	p.crewT = crewTask{c: p.crew, mm: &p.sc.mm}
	p.ParallelCrew(rows, grain, &p.crewT)
	p.crewT = crewTask{}
}

// ParallelCrew is Parallel for a task whose parts share their products
// through the pool's crew: each part calls Crew.Done once it has no work
// of its own left. The crew expects every part before any is dispatched,
// so that a part done early keeps helping until the slowest has started
// and finished.
func (p *Pool) ParallelCrew(n, grain int, t Task) {
	parts, step := p.split(n, grain)
	p.crew.expect(parts)
	if parts > 1 {
		w := 0 // the workers' non-empty parts
		for i := 1; i < parts; i++ {
			if i*step < n {
				w++
			}
		}
		p.crew.unclaimed.Store(int32(w))
		p.crew.disp.Store(0)
		p.crewOp.Store(true)
		defer p.crewOp.Store(false)
	}
	p.Parallel(n, grain, t)
}

// Scratch holds the activation buffers of a product (group sums, int8
// activations). A Pool has one; a task that runs many small products on
// every thread at once gives each thread its own and calls Scratch.MatMul.
type Scratch struct {
	mm    matmulTask
	xsum  []float32
	x8    []int8      // [rows][cols] int8 activations for q4 products
	x8p   []int8      // x8 permuted for the low-bit kernel or the tiled MXFP4 one
	sx12  []int32     // the tiled MXFP4 kernel's block sums
	xs    []float32   // [rows][cols/64] their scales
	rooms [][]float32 // per part: widened scales and biases (half.go)
	// crew, when set (Join), shares this thread's products with the other
	// threads of a parallel task as thread self.
	crew *Crew
	self int
}

// prepare computes the activation side of out = W·x and sets up s.mm.
func (s *Scratch) prepare(out []float32, w *Mat, x []float32, nb int) {
	x8, xs := s.activations(w, x, nb)
	var x8p []int8
	if (w.Kind == format.Q3 || w.Kind == format.Q2) && lowAsm() {
		if cap(s.x8p) < len(x8) {
			s.x8p = make([]int8, len(x8))
		}
		x8p = s.x8p[:len(x8)]
		permuteLow(x8p, x8, w.Kind.Bits())
	}
	var sx12 []int32
	var xperm uint8
	if w.Kind == format.MXFP4 && useVNNI && w.Cols%format.GroupSize == 0 {
		// The decode kernels' activations, or the batched kernel's block
		// sums: once a product, not once a part.
		if cap(s.x8p) < len(x8) {
			s.x8p = make([]int8, len(x8))
		}
		nblk := w.Cols / format.MXBlock
		if cap(s.sx12) < nb*nblk {
			s.sx12 = make([]int32, nb*nblk)
		}
		x8p, sx12 = s.x8p[:len(x8)], s.sx12[:nb*nblk]
		prep := mxPrepX
		xperm = mxPermTiled
		if !w.Tiled && nb < mxTileMinRows {
			prep, xperm = mxPrepRows, mxPermRowsOrder
		}
		for r := range nb {
			prep(x8p[r*w.Cols:(r+1)*w.Cols], sx12[r*nblk:(r+1)*nblk], x8[r*w.Cols:(r+1)*w.Cols])
		}
	}
	if s.rooms == nil {
		s.rooms = [][]float32{make([]float32, scaleRoom)}
	}
	s.mm = matmulTask{out: out[:nb*w.Rows], x: x[:nb*w.Cols], xsum: s.xsum, xs: xs, x8: x8, x8p: x8p, sx12: sx12, xperm: xperm, w: w, nb: nb, rooms: s.rooms}
}

// activations computes what a product with w needs of x: group sums for
// quantised kinds, int8 activations and scales for q4, q3 and q2.
func (s *Scratch) activations(w *Mat, x []float32, nb int) (x8 []int8, xs []float32) {
	if w.Kind.Quantised() || w.Kind == format.MXFP4 {
		C := w.Cols
		ng := C / format.GroupSize
		s.xsum = grow(s.xsum, nb*ng)
		for r := 0; r < nb; r++ {
			GroupSums(s.xsum[r*ng:(r+1)*ng], x[r*C:(r+1)*C])
		}
		if w.Kind == format.Q4 || w.Kind == format.Q3 || w.Kind == format.Q2 || w.Kind == format.MXFP4 {
			if cap(s.x8) < nb*C {
				s.x8 = make([]int8, nb*C)
			}
			s.xs = grow(s.xs, nb*ng)
			x8, xs = s.x8[:nb*C], s.xs
			for r := 0; r < nb; r++ {
				QuantizeRow8(x8[r*C:(r+1)*C], xs[r*ng:(r+1)*ng], x[r*C:(r+1)*C])
			}
		}
	}
	return x8, xs
}

// MatMul2 computes out1 = W1·x and out2 = W2·x, preparing x once; W1 and W2
// must have the same kind and columns (gate and up, or q and k).
func (s *Scratch) MatMul2(out1 []float32, w1 *Mat, out2 []float32, w2 *Mat, x []float32, nb int) {
	if w1.Kind != w2.Kind || w1.Cols != w2.Cols {
		s.MatMul(out1, w1, x, nb)
		s.MatMul(out2, w2, x, nb)
		return
	}
	s.prepare(out1, w1, x, nb)
	if s.pairTwo(w1, w2, out2) {
		s.run(w1.Rows)
		s.mm = matmulTask{}
		return
	}
	s.runHalves(w1, s.run)
	s.mm.w, s.mm.out = w2, out2[:nb*w2.Rows]
	s.runHalves(w2, s.run)
	s.mm = matmulTask{}
}

// run computes the prepared product s.mm, through the crew if s has one.
func (s *Scratch) run(rows int) {
	if s.crew != nil {
		s.crew.own(s.self, &s.mm, 0, rows)
		return
	}
	s.mm.Run(0, rows)
}

// MatMul2 is Scratch.MatMul2 over the pool's threads.
func (p *Pool) MatMul2(out1 []float32, w1 *Mat, out2 []float32, w2 *Mat, x []float32, nb int) {
	if w1.Kind != w2.Kind || w1.Cols != w2.Cols {
		p.MatMul(out1, w1, x, nb)
		p.MatMul(out2, w2, x, nb)
		return
	}
	p.sc.prepare(out1, w1, x, nb)
	grain := max(1, 16384/(w1.Cols*nb))
	if p.sc.pairTwo(w1, w2, out2) {
		p.run(w1.Rows, grain)
		p.sc.mm = matmulTask{}
		return
	}
	run := func(rows int) { p.run(rows, grain) }
	p.sc.runHalves(w1, run)
	p.sc.mm.w, p.sc.mm.out = w2, out2[:nb*w2.Rows]
	p.sc.runHalves(w2, run)
	p.sc.mm = matmulTask{}
}

// MatMul is Pool.MatMul on the calling thread alone; its results are
// bit-identical to the pool's (a product is split by output rows, which
// changes no element's arithmetic).
func (s *Scratch) MatMul(out []float32, w *Mat, x []float32, nb int) {
	s.prepare(out, w, x, nb)
	s.runHalves(w, s.run)
	s.mm = matmulTask{}
}

// grow returns b with length n, reallocating only when its capacity is short.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
