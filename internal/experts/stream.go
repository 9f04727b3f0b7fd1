// Package experts streams routed experts from a packed model's expert store
// into a fixed-size pool of slots, so that a model larger than memory runs
// with only its dense weights and a bounded share of its experts resident.
//
// The pool is one anonymous mapping cut into slots of the record stride
// (a multiple of 4096, so each slot is an aligned O_DIRECT target). A miss
// is one pread of one record by one of a fixed set of reader goroutines.
// Everything else (the record → slot table, eviction, lookahead accounting)
// belongs to the goroutine that runs the forward pass, which is the only
// caller of Begin, Next and Prefetch: readers touch nothing but the slot
// they were handed, and report back on a channel, so the pool needs no
// locks and the channel receive orders the slot's bytes before their use.
//
// Which experts are resident changes only speed, never results: the forward
// sums expert outputs in router order whatever order they arrive in.
package experts

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/platform"
)

// Options configure a Stream.
type Options struct {
	Slots   int // pool slots; at least MinSlots
	Readers int // reader goroutines, i.e. the queue depth of misses; 0 = DefaultReaders
	// PrefetchReaders of the readers also take prefetches; 0 = follow
	// the disk: the smaller of prefetchReaders and Readers while the reads
	// take most of its bandwidth, all of them while it has room
	// (adaptReaders).
	PrefetchReaders int
	Lookahead       bool    // accept next-layer predictions and prefetch them
	Policy          Policy  // eviction policy; "" = LRU
	Prefetch        int     // prefetches issued and not yet landed at most; 0 = 2·Readers
	MissBits        int     // 0 = lossless; 3 or 2: demand misses read the low-bit store (lossy)
	CutWeak         float32 // 0 = off; else cut late misses whose weight is below this in every row (lossy)
	Buffered        bool    // never use O_DIRECT (tests; filesystems without it are detected anyway)
	Log             io.Writer
	// Tile rearranges each main-kind record as it lands into the tiled
	// layout that this CPU's decode kernel reads faster
	// (kernels.TiledQ4, model.TileRecord): the readers do it, one pass
	// over a record they just read, while the forward computes. That
	// pass costs more than the faster reads of a record that is soon
	// evicted save, so it is for a pool that keeps what it reads.
	Tile bool
	// LookDepth is how many layers ahead the lookahead reads (1 to
	// MaxLookDepth): the next layer's predictions, and with 2 also the
	// layer after it; 0 = DefaultLookDepth.
	LookDepth int

	// widen makes a low-bit miss widen into the main kind before use,
	// sluice's original path, which tests compare the direct one with.
	widen bool
	// goroutineReads reads in the reader goroutines even where the
	// kernel's asynchronous reads would serve (kernelReads): tests run
	// both ways.
	goroutineReads bool
	// lookAlways keeps the lookahead predicting at every step instead of
	// timing the steps both ways (lookTrial): a test's hit rates must not
	// depend on how fast its machine computes. The gates still choose
	// which predictions are read.
	lookAlways bool
}

// DefaultReaders is the default queue depth, chosen by BenchmarkQueueDepth
// on this machine class: random O_DIRECT reads of 32 KiB records gave 383,
// 590, 705, 857, 948 and 967 MB/s at depths 1, 2, 4, 8, 16 and 32, so 8
// reaches 89% of the plateau; 2 MiB records ran at 1.1–1.4 GB/s at every
// depth. Each reader also holds a pool slot in flight, so past 8 the slots
// cost more than the few percent of bandwidth they buy.
const DefaultReaders = 8

// prefetchReaders is how many readers take prefetches; the others read
// demand misses only. A prefetch cannot be taken back once its read has
// started, so with every reader free to take one, a layer's misses queued
// behind the next layer's prefetches: on the 48-layer qwen3-30b-a3b synth
// at a 4% pool, a miss waited 3.0 ms (median) for a reader to start it
// with all 8 taking prefetches, 1.4 ms with 2, and decode ran 7–20%
// faster in four alternating pairs (the README has the runs). Two reads
// in flight already reach this machine class's disk bandwidth for
// 2.5 MiB records (BenchmarkQueueDepth), so two readers lose the
// prefetches nothing. A faster disk wants more (Options.PrefetchReaders):
// on a 2-core Zen 5 whose disk read 5-7 GB/s, all 8 readers taking
// prefetches decoded the 40-layer qwen3.5-35b-a3b synth under a 25% cap
// faster in 8 of 10 alternating pairs (median 1.10x), with less io wait
// in 9. Which of the two a disk wants is what adaptReaders decides.
const prefetchReaders = 2

// DefaultLookDepth is the lookahead's reach by default: predictions two
// layers ahead as well as one, each layer's router applied to the hidden
// state two layers before it. A layer's own reads wait for its router,
// and so does the next layer's prediction; what the disk reads while the
// layer's experts, the next layer's mixer and its router compute is
// whatever was queued before. With the second layer's guesses queued
// behind the first's, the disk has work through that gap. On the
// 40-layer qwen3.5-35b-a3b synth (router-routed), the top 8 of a layer's
// router applied one, two and three layers early held 76%, 67% and 61%
// of the experts the layer then chose (128 tokens); with a disk reading
// about 2.2 GB/s, depth 2 decoded 1.09x as fast as depth 1 under a 22%
// pool (means of four alternating pairs, faster in three) and 1.05x under
// a 9% pool (faster in all four), reading 2% more (README, "Reading two
// layers ahead").
const DefaultLookDepth = 2

// MaxLookDepth is the farthest the lookahead may read ahead.
const MaxLookDepth = 3

// With Options.PrefetchReaders 0, the prefetch readers follow the disk.
// A prefetch is a guess: the next layer's 6th to 8th most likely experts
// are used with a precision near one half. Where the reads already take
// most of what the disk can deliver, a wasted read delays the demand
// misses behind it, and a queue that cancels the guesses a step does not
// reach in time (two prefetch readers) is the better filter: on a 2-core
// Zen 4 whose decode read at 73-76% of the disk's bandwidth at depth 8
// (25% and 10% caps), 2 prefetch readers decoded the 40-layer
// qwen3.5-35b-a3b synth under the 25% cap faster than 8 in each of three
// alternating pairs. Where the disk has bandwidth to spare and each read
// waits on latency, the guesses cost little: on a Zen 5 whose decode read at about a third of its 6 GB/s,
// all 8 readers taking prefetches decoded faster (median 1.10x). So over
// each window of adaptWindow of step time the stream sets the bytes it
// read against the throughput the disk gave from deepReads reads in
// flight until none was (the disk's bandwidth under load, learnt from the
// stream's own reads, so no probe spends memory or time and a disk that
// slows down is seen): below utilLow every reader takes prefetches, above
// utilHigh prefetchReaders again, and between the two the count stays, so
// that the extra reads of the wider count cannot flip it back and forth.
const (
	adaptWindow = int64(time.Second)
	// adaptMaxGap: a longer gap between two steps is idle time (between
	// requests, say), which would read as an idle disk; the window
	// starts again after it.
	adaptMaxGap = int64(time.Second)
	deepReads   = 4
	// deepMin is the least time under load a window needs for its
	// estimate of the disk's bandwidth; a window with less keeps the
	// estimate of the windows before.
	deepMin  = int64(20 * time.Millisecond)
	utilLow  = 0.5
	utilHigh = 0.7
)

// nextPreLimit is the prefetch readers' count after a window whose reads
// took the share util of the disk's bandwidth: all of them when the disk
// had room, base when it had little, cur in between.
func nextPreLimit(cur, base, all int, util float64) int {
	switch {
	case util < utilLow:
		return all
	case util > utilHigh:
		return base
	}
	return cur
}

// slot states.
const (
	free uint8 = iota
	loading
	ready
)

// slot is one record-sized buffer of the pool.
type slot struct {
	rec      int32 // record id held or being read; -1 when free
	state    uint8
	held     bool         // the current step needs it: never evicted
	low      bool         // holds a low-bit (lossy) copy
	demand   int32        // position in the current step's ids waiting for it, or -1
	pre      bool         // read by a prefetch not yet used
	cut      bool         // its demand was cut; the read lands as a plain pool entry
	last     int64        // clock of last use (eviction)
	ex       model.Expert // the slot viewed as a main-store record
	exLow    model.Expert // viewed as a low-bit record (MissBits)
	cancel   atomic.Bool  // a queued prefetch that is no longer wanted
	buf      []byte
	readLow  bool // the read in flight targets the low-bit store
	prefetch int  // layer a prefetch was issued for
	ahead    bool // a prefetch more than one layer ahead (Options.LookDepth)
	// listed says the slot is in Stream.prefs. A slot prefetched, then
	// evicted and prefetched again before accountPrefetches runs is
	// listed once, so that a kept prediction is not carried twice.
	listed bool
}

type request struct {
	slot int32
	off  int64
	low  bool
}

type completion struct {
	slot      int32
	cancelled bool
	err       error
}

// Stream is a streaming model.Provider over a fixed pool of slots.
type Stream struct {
	o       Options
	st      format.ExpertStore
	low     *format.ExpertStore // the low-bit store of MissBits, or nil
	E, L    int                 // experts per layer, expert layers
	topK    int                 // experts a row chooses
	last    int                 // the trunk's last layer: its decode step ends a token
	first   int                 // the lowest layer a step has begun: a token's first expert layer
	records int

	file, lowFile *platform.File
	direct        bool
	mem           []byte
	slots         []slot
	where         []int32 // [record] slot, or -1
	ev            evictor // the eviction policy's state
	vs            victimSet

	demand, pre chan request
	done        chan completion
	kr          *kernelReads // the kernel's asynchronous reads, or nil: the reader goroutines
	stop        context.CancelFunc
	wg          sync.WaitGroup
	inflight    int // reads issued and not yet completed
	preInflight int

	// The prefetch readers (adaptReaders): readers [0, preLimit) take
	// prefetches; closing *wake tells the waiting readers it changed.
	preLimit atomic.Int32
	wake     atomic.Pointer[chan struct{}]
	now      func() int64 // the clock, in ns; tests replace it
	lastStep int64        // when the last step began
	winWall  int64        // step time in the current window
	win      adaptMark    // the counters when the window began
	diskBW   float64      // the disk's bandwidth under load, bytes/ns; 0 = not known yet

	// The current step.
	clock   int64
	layer   int
	ids     []int
	hint    model.Hint
	readyQ  []int32 // positions of ids ready to return, in order, from readyH
	missQ   []int32 // positions of ids not yet issued for lack of a free slot, from missH
	readyH  int
	missH   int
	waiting int     // positions issued (or prefetched) and not yet returned
	slotOf  []int32 // [position] slot
	cur     int32   // slot returned by the last Next, -1
	batch   []int32 // slots returned by the last Ready
	left    int     // positions not yet returned
	prefs   []int32 // slots prefetched for the layers ahead
	keep    []int32 // accountPrefetches' scratch: prefs for layers further on
	xtok    []int   // the next token's predicted first-layer experts (prefetchNextToken)
	share   int     // pool share per layer (prefill retention)
	missOut int     // misses issued this step and not yet returned
	isMiss  []bool  // [position] issued as a miss this step
	thresh  int     // rows an expert needs this step to be in its layer's share; 0 = all are

	look *LookGate // which predictions are read ahead
	// ahead[d-2][l%d] gates the predictions made d ≥ 2 layers ahead
	// for layer l. A gate holds one prediction until its layer's step
	// scores it, and d-1 more of depth d are made before then, one for
	// each layer between; so there are d gates, each for the layers of
	// one residue.
	ahead [][]*LookGate
	trial lookTrial // whether predicting pays at all

	tracing bool  // record each step's records (RecordTrace)
	trace   Trace // what Begin was asked for while tracing

	stats Stats
}

// RecordTrace starts (clearing what was recorded) or stops recording the
// records each step asks for, for comparisons with the optimal eviction
// (BeladyHits). Recording allocates; benchmarks use it, not serving.
func (s *Stream) RecordTrace(on bool) {
	if on {
		s.trace = nil
	}
	s.tracing = on
}

// Trace returns what was recorded since RecordTrace(true).
func (s *Stream) Trace() Trace { return s.trace }

// LookaheadOn reports whether any rank of the next layer's predictions
// for layer (those made one layer ahead) is currently prefetched
// (LookGate); the deeper predictions have gates of their own.
func (s *Stream) LookaheadOn(layer int) bool {
	return s.o.Lookahead && s.look.LayerOn(layer)
}

// MinSlots is the smallest legal pool: one token's experts of one layer.
func MinSlots(c *format.Config) int { return c.TopK }

// Open starts a stream over dir's expert store with o.Slots slots.
func Open(dir string, man *format.Manifest, o Options) (*Stream, error) {
	c := &man.Config
	st := man.Stores[0]
	records := man.ExpertLayers * man.Experts
	if o.Slots < MinSlots(c) {
		return nil, fmt.Errorf("expert pool of %d slots is too small: one step needs at least %d (top-k) experts of %s each, i.e. --pool-mb %d",
			o.Slots, MinSlots(c), mib(st.Stride), (int64(MinSlots(c))*st.Stride+(1<<20)-1)>>20)
	}
	o.Slots = min(o.Slots, records)
	if o.Readers <= 0 {
		o.Readers = DefaultReaders
	}
	switch {
	case o.PrefetchReaders < 0 || o.PrefetchReaders > o.Readers:
		return nil, fmt.Errorf("prefetch readers %d outside [0, %d] (the readers)", o.PrefetchReaders, o.Readers)
	}
	if o.Prefetch <= 0 {
		// Twice the readers: only PrefetchReaders of them (2 by
		// default) take prefetches, so the rest wait queued, in slots already
		// claimed, and a queued prefetch its step turns out not to need
		// is cancelled before it is read. With 8 prefetches issued at
		// most, a layer's predictions past the eighth were dropped while
		// the first ones queued; 16 raised the 48-layer qwen3-30b-a3b
		// synth's hit rate at a 4% pool from 77% to 81%.
		o.Prefetch = 2 * o.Readers
	}
	if o.LookDepth == 0 {
		o.LookDepth = DefaultLookDepth
	}
	if o.LookDepth < 1 || o.LookDepth > MaxLookDepth {
		return nil, fmt.Errorf("lookahead depth %d outside [1, %d]", o.LookDepth, MaxLookDepth)
	}
	if o.Policy == "" {
		o.Policy = LRU
	}
	if err := o.Policy.valid(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	s := &Stream{o: o, st: st, E: man.Experts, L: man.ExpertLayers, topK: max(c.TopK, 1), records: records, cur: -1,
		last: c.Layers - 1, first: man.ExpertLayers}
	path := filepath.Join(dir, st.File)
	var err error
	var why string
	if s.file, s.direct, why, err = openRecords(path, o.Buffered); err != nil {
		return nil, err
	}
	if fi, err := s.file.Stat(); err != nil || fi.Size() < int64(records)*st.Stride {
		s.file.Close()
		return nil, fmt.Errorf("packed model %s: %s is shorter than %d records of %d bytes (truncated?)", dir, st.File, records, st.Stride)
	}
	if !s.direct && !o.Buffered {
		fmt.Fprintf(o.Log, "experts: uncached reads refused on %s (%s); reading through the page cache\n", path, why)
	}
	if o.MissBits != 0 {
		if s.low, err = LowStore(man, o.MissBits); err != nil {
			s.file.Close()
			return nil, err
		}
		lp := filepath.Join(dir, s.low.File)
		if s.lowFile, _, _, err = openRecords(lp, o.Buffered || !s.direct); err != nil {
			s.file.Close()
			return nil, fmt.Errorf("--miss-bits %d: %v (make it with `sluice pack --low-bits %d`)", o.MissBits, err, o.MissBits)
		}
	}
	if s.low != nil && s.low.Stride > st.Stride {
		s.closeFiles()
		return nil, fmt.Errorf("--miss-bits %d: low-bit records of %s do not fit the slots of %s", o.MissBits, mib(s.low.Stride), mib(st.Stride))
	}
	size := int64(o.Slots) * st.Stride
	// Anonymous memory is page-aligned, so every slot (stride a multiple
	// of 4096) is a valid O_DIRECT destination.
	if s.mem, err = platform.Alloc(int(size)); err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("expert pool of %s: %v", mib(size), err)
	}
	s.slots = make([]slot, o.Slots)
	for i := range s.slots {
		sl := &s.slots[i]
		sl.rec, sl.demand, sl.prefetch = -1, -1, -1
		sl.buf = s.mem[int64(i)*st.Stride : int64(i+1)*st.Stride]
		if sl.ex, err = model.ExpertFromRecord(sl.buf, &s.st); err != nil {
			s.Close()
			return nil, err
		}
		if o.Tile {
			sl.ex.MarkTiled()
		}
		if s.low != nil {
			// A low-bit miss lands at the start of its slot and is
			// multiplied as it is (kernels' q3 and q2 products): no
			// widening, no staging buffer. The slot keeps its full
			// size, so the pool's size and the budget do not change
			// with --miss-bits; a low-bit record uses part of a slot.
			if sl.exLow, err = model.ExpertFromRecord(sl.buf[:s.low.Stride], s.low); err != nil {
				s.Close()
				return nil, err
			}
		}
	}
	s.where = make([]int32, records)
	for i := range s.where {
		s.where[i] = -1
	}
	s.ev = newEvictor(o.Policy, s.L, s.E)
	s.vs = newVictimSet(o.Slots, s.L)
	s.slotOf = make([]int32, s.E)
	s.look = NewLookGate(s.L, c.TopK, LookMinPrecision)
	for d := 2; d <= o.LookDepth; d++ {
		gs := make([]*LookGate, d)
		for i := range gs {
			gs[i] = NewLookGate(s.L, c.TopK, LookAheadMinPrecision)
		}
		s.ahead = append(s.ahead, gs)
	}
	s.isMiss = make([]bool, s.E)
	s.readyQ = make([]int32, 0, s.E)
	s.batch = make([]int32, 0, s.E)
	s.missQ = make([]int32, 0, s.E)
	// What prefs can hold between two steps: a layer's experts, for each
	// layer the predictions reach and the one whose step settles them.
	s.prefs = make([]int32, 0, (o.LookDepth+1)*s.E)
	s.keep = make([]int32, 0, (o.LookDepth+1)*s.E)
	s.xtok = make([]int, 0, s.E)
	// The ring a prefill chunk streams through (a queue depth of slots) is
	// left out of the layers' shares.
	s.share = max(c.TopK, (o.Slots-o.Readers)/max(c.Layers, 1))
	s.stats.init(s.L, o.Slots, o.Readers)
	// Every read ever outstanding fits in the channels, so no send blocks.
	s.demand = make(chan request, o.Slots)
	s.pre = make(chan request, o.Slots)
	s.done = make(chan completion, o.Slots)
	wake := make(chan struct{})
	s.wake.Store(&wake)
	s.now = func() int64 { return time.Now().UnixNano() }
	s.trial.begin()
	pre := o.PrefetchReaders
	if pre == 0 { // following the disk, from prefetchReaders
		pre = min(prefetchReaders, o.Readers)
	}
	s.preLimit.Store(int32(pre))
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	if s.kr = s.openReads(); s.kr != nil {
		return s, nil
	}
	for i := range o.Readers {
		s.wg.Add(1)
		go s.reader(ctx, int32(i))
	}
	return s, nil
}

// Populate faults in the pool's memory, a page at a time and populateChunk
// bytes between checks of ctx, calling progress (when not nil) after each
// chunk. Until then a slot's first read faults its pages in inside the
// read, during decode: the kernel zeroes them and, with the rest of the
// memory in use, compacts memory for their huge pages. Under the 10% cap
// on the 48-layer qwen3-30b-a3b synth, where a bench's trials touch most
// of the pool for the first time, a populated pool decoded at 8.28 and
// 8.08 tok/s against 7.09 and 7.22 (two alternating pairs). Call it once,
// before the first step.
func (s *Stream) Populate(ctx context.Context, progress func(done, total int64)) error {
	total := int64(len(s.mem))
	for off := int64(0); off < total; off += populateChunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(off+populateChunk, total)
		for i := off; i < end; i += 4096 {
			s.mem[i] = 0
		}
		if progress != nil {
			progress(end, total)
		}
	}
	return nil
}

// populateChunk is how much of the pool Populate touches between checks
// of its context: a fraction of a second.
const populateChunk = 256 << 20

// Direct reports whether misses are read with O_DIRECT.
func (s *Stream) Direct() bool { return s.direct }

// Slots is the number of pool slots.
func (s *Stream) Slots() int { return len(s.slots) }

// Stride is the size of one slot.
func (s *Stream) Stride() int64 { return s.st.Stride }

// Options returns the options in effect (defaults filled in).
func (s *Stream) Options() Options { return s.o }

// NewText tells the pool that a new, unrelated text begins (a new
// request rather than a continued one): the eviction policy's counts of
// the texts before weigh far less than the new one's (evictor.newText).
// Between steps only, as Begin.
func (s *Stream) NewText() { s.ev.newText() }

// Lookahead implements model.Prefetcher.
func (s *Stream) Lookahead() bool { return s.o.Lookahead }

// LookDepth implements model.DeepPrefetcher: how many layers ahead the
// forward predicts (Options.LookDepth).
func (s *Stream) LookDepth() int { return s.o.LookDepth }

// Memory is the pool's memory, every slot's record within it: a device
// that page-locks it copies records straight from their slots. A record
// a step returned stays put only until the stream's next Begin, Next,
// Ready or Prefetch, which may read another into its slot, or Populate
// or Close: a copy from it must be done by then.
func (s *Stream) Memory() []byte { return s.mem }

// Cached returns the expert of layer's expert e when its record is in the
// pool and read, else nil, as a step would return it (a low-bit record
// of MissBits as itself, in the low-bit store's kinds); it changes
// nothing, neither the policy's view nor the counters. The record stays
// put on the terms Memory gives.
func (s *Stream) Cached(layer, e int) *model.Expert {
	if layer < 0 || layer >= s.L || e < 0 || e >= s.E {
		return nil
	}
	si := s.where[layer*s.E+e]
	if si < 0 {
		return nil
	}
	if sl := &s.slots[si]; sl.state == ready {
		return s.expertOf(sl)
	}
	return nil
}

// expertOf is sl's expert as a step returns it: a low-bit record as
// itself unless misses are widened first.
func (s *Stream) expertOf(sl *slot) *model.Expert {
	if sl.low && !s.o.widen {
		return &sl.exLow
	}
	return &sl.ex
}

// Begin implements model.Provider.
func (s *Stream) Begin(layer int, ids []int, hint model.Hint) error {
	if layer < 0 || layer >= s.L {
		return fmt.Errorf("expert stream: layer %d outside [0,%d)", layer, s.L)
	}
	s.endStep()
	// endStep left no position waiting, so no read's error is reported
	// here; a failure to collect the kernel's reads is.
	if err := s.drain(); err != nil {
		return err
	}
	s.adaptReaders()
	s.clock++
	s.ev.tick(s.clock, layer, s.stepTokens(hint))
	if s.tracing {
		step := make([]int32, len(ids))
		for i, e := range ids {
			step[i] = int32(layer*s.E + e)
		}
		s.trace = append(s.trace, step)
	}
	s.layer, s.ids, s.hint = layer, ids, hint
	s.first = min(s.first, layer)
	s.left = len(ids)
	s.accountPrefetches(layer)
	ls := &s.stats.layers[layer]
	// Prefill retention: in a multi-row step only the layer's most-used
	// experts (its share of the pool) are stamped as recent; the rest are
	// stamped old, so the step recycles their slots first and the pool
	// keeps each layer's hot experts for decode.
	s.thresh = s.rowThreshold(hint)
	for i, e := range ids {
		if e < 0 || e >= s.E {
			return fmt.Errorf("expert stream: expert %d outside [0,%d)", e, s.E)
		}
		rec := int32(layer*s.E + e)
		rows := 1
		if hint.Rows != nil {
			rows = hint.Rows[i]
		}
		stamp := s.stamp(int32(i))
		s.ev.use(rec, rows, stamp == s.clock)
		si := s.where[rec]
		if si < 0 {
			s.missQ = append(s.missQ, int32(i))
			ls.Misses.Add(1)
			continue
		}
		sl := &s.slots[si]
		sl.held, sl.last, sl.cut = true, stamp, false
		s.vs.touch(layer)
		s.slotOf[i] = si
		ls.Hits.Add(1)
		if sl.pre {
			if sl.ahead {
				s.stats.AheadUseful.Add(1)
			}
			sl.pre, sl.ahead = false, false
			s.stats.LookUseful.Add(1)
		}
		if sl.state == ready {
			s.readyQ = append(s.readyQ, int32(i))
			ls.Landed.Add(1)
		} else {
			sl.demand = int32(i)
			s.waiting++
		}
	}
	before := s.missOut
	s.issueMisses()
	if s.missOut > before && s.kr == nil {
		// Let a reader take this thread's processor now: the readers the
		// sends woke otherwise wait for one until the forward blocks in
		// Next, with both cores computing the layer's hits, so the demand
		// reads began only once the hits were done. A runtime trace of a
		// 10% pool had them waiting about 1 ms each; yielding here cut the
		// decode's io wait from 4.5-5.9 to 1.5-3.2 ms a token (bench,
		// qwen3-30b-a3b at 48 layers).
		runtime.Gosched()
	}
	if layer == s.last {
		s.stepLookahead()
		s.prefetchNextToken()
	}
	return nil
}

// prefetchNextToken reads ahead for the next token's first expert layer
// while the last layer of a decode step (one row, as the Markov policy
// tells from the step's uses) computes. The last layer has no
// next layer to look ahead to, so without it the disk idles through the
// last layer's compute, the output head, sampling and the first layer's
// attention: 17–20 ms of a 400 ms token on the 48-layer qwen3-30b-a3b
// synth at a 4% pool, when nothing else reads. No hidden state predicts
// a token not yet sampled, but the Markov policy estimates what each
// layer chooses next from what it chose now; its most likely experts are
// prefetched under the same gate as lookahead (LookGate, per layer and
// rank), so estimates that do not pay stop being read ahead.
func (s *Stream) prefetchNextToken() {
	mk := s.ev.mk
	if mk == nil || mk.multi || !s.o.Lookahead || !s.trial.on || s.first >= s.L {
		return // not Markov, a multi-row step's, lookahead off or not paying, no layer yet
	}
	pred := mk.pred[s.first*s.E : (s.first+1)*s.E]
	ids := s.xtok[:0]
	for len(ids) < len(s.ids) {
		best := -1
		for e := range pred {
			if (best < 0 || pred[e] > pred[best]) && !slices.Contains(ids, e) {
				best = e
			}
		}
		ids = append(ids, best)
	}
	s.xtok = ids
	s.Prefetch(s.first, ids)
}

// stamp is the recency position i of the step gets: now, or, in a
// multi-row step, older than any recent step for experts outside the
// layer's most-used share.
func (s *Stream) stamp(i int32) int64 {
	if s.thresh > 0 && s.hint.Rows != nil && s.hint.Rows[i] < s.thresh {
		return s.clock - int64(4*s.L)
	}
	return s.clock
}

// stepTokens is how many rows (tokens) a step has: each chooses topK
// experts, so the hint's rows add up to that many times the rows.
func (s *Stream) stepTokens(hint model.Hint) int {
	n := 0
	for _, r := range hint.Rows {
		n += r
	}
	return max((n+s.topK-1)/s.topK, 1)
}

// rowThreshold is the row count an expert needs in a multi-row step to be
// among the layer's pool share, or 0 when every expert qualifies.
func (s *Stream) rowThreshold(h model.Hint) int {
	if h.Rows == nil {
		return 0
	}
	return ShareThreshold(h.Rows, s.share)
}

// ShareThreshold is the row count an expert of a multi-row step needs to
// be among the share experts of its layer with the most rows (the ones a
// pool keeps recent through a prefill), or 0 when there are no more than
// share: the share-th largest of rows, by counting (rows are at most a
// chunk's size).
func ShareThreshold(rows []int, share int) int {
	if len(rows) <= share {
		return 0
	}
	mx := 0
	for _, r := range rows {
		mx = max(mx, r)
	}
	for t := mx; t > 1; t-- {
		n := 0
		for _, r := range rows {
			if r >= t {
				n++
			}
		}
		if n >= share {
			return t
		}
	}
	return 0
}

// issueMisses reads queued misses into free or evictable slots.
func (s *Stream) issueMisses() {
	// At most a queue depth of misses at a time: more would not read any
	// faster, and in a prefill chunk each extra slot taken up front would
	// evict another layer's kept experts instead of recycling this step's
	// own once computed.
	for s.missH < len(s.missQ) && s.missOut < s.o.Readers {
		si := s.victim()
		if si < 0 {
			return
		}
		i := s.missQ[s.missH]
		s.missH++
		rec := int32(s.layer*s.E + s.ids[i])
		sl := s.evict(si)
		sl.rec, sl.state, sl.held, sl.demand, sl.last, sl.prefetch = rec, loading, true, i, s.stamp(i), -1
		s.vs.take(si, s.layer)
		s.where[rec] = si
		s.slotOf[i] = si
		s.waiting++
		s.missOut++
		s.isMiss[i] = true
		low := s.low != nil
		sl.readLow = low
		s.inflight++
		s.send(request{slot: si, off: int64(rec) * s.recStride(low), low: low}, false)
	}
}

// readInto gives the file a record is read from and the part of slot sl
// it lands in: the low-bit store's records fill the start of a slot.
func (s *Stream) readInto(sl *slot, low bool) (*platform.File, []byte) {
	if low {
		return s.lowFile, sl.buf[:s.low.Stride]
	}
	return s.file, sl.buf
}

func (s *Stream) recStride(low bool) int64 {
	if low {
		return s.low.Stride
	}
	return s.st.Stride
}

// touched tells the victim set that slot si changed what the policy sees
// of it (held, loading or ready, prefetched).
func (s *Stream) touched(si int32) {
	if r := s.slots[si].rec; r >= 0 {
		s.vs.touch(int(r) / s.E)
	}
}

// evict frees slot si for a new record.
func (s *Stream) evict(si int32) *slot {
	sl := &s.slots[si]
	if sl.rec >= 0 {
		s.where[sl.rec] = -1
		s.stats.Evictions.Add(1)
		s.vs.drop(si, int(sl.rec)/s.E)
	}
	sl.rec, sl.state, sl.pre, sl.cut, sl.low, sl.ahead = -1, free, false, false, false, false
	sl.cancel.Store(false)
	return sl
}

// Next implements model.Provider.
func (s *Stream) Next() (int, *model.Expert, error) {
	s.release()
	if s.left <= 0 {
		return -1, nil, fmt.Errorf("expert stream: Next after the last expert")
	}
	for {
		s.issueMisses()
		if s.readyH < len(s.readyQ) {
			i := s.readyQ[s.readyH]
			s.readyH++
			return s.deliver(i)
		}
		if s.o.CutWeak > 0 {
			if err := s.drain(); err != nil {
				return -1, nil, err
			}
			if s.readyH < len(s.readyQ) {
				continue
			}
			if i, ok := s.cutOne(); ok {
				s.left--
				s.stats.Cuts.Add(1)
				return int(i), nil, nil
			}
		}
		if s.inflight == 0 {
			return -1, nil, fmt.Errorf("expert stream: %d experts outstanding but no read in flight (pool of %d slots all held)", s.left, len(s.slots))
		}
		t0 := time.Now()
		c, _, err := s.finished(true)
		s.stats.layers[s.layer].IOWaitNs.Add(time.Since(t0).Nanoseconds())
		if err != nil {
			return -1, nil, err
		}
		if err := s.complete(c); err != nil {
			return -1, nil, err
		}
	}
}

// deliver returns position i's expert and makes its slot current.
func (s *Stream) deliver(i int32) (int, *model.Expert, error) {
	s.cur = s.slotOf[i]
	return int(i), s.take(i), nil
}

// take counts position i returned and gives its slot's expert.
func (s *Stream) take(i int32) *model.Expert {
	si := s.slotOf[i]
	s.left--
	if s.isMiss[i] {
		s.isMiss[i] = false
		s.missOut--
	}
	return s.expertOf(&s.slots[si])
}

// Ready implements model.ReadyProvider: it returns at once, with every
// expert of the step that is in memory and not yet returned (reads that
// landed included), appending their positions in ids to pos and their
// weights to ex; none when every one left is still being read. A read of
// the step that failed is returned as an error.
func (s *Stream) Ready(pos []int, ex []*model.Expert) ([]int, []*model.Expert, error) {
	s.release()
	if err := s.drain(); err != nil {
		return pos, ex, err
	}
	s.issueMisses()
	for s.readyH < len(s.readyQ) {
		i := s.readyQ[s.readyH]
		s.readyH++
		s.batch = append(s.batch, s.slotOf[i])
		pos = append(pos, int(i))
		ex = append(ex, s.take(i))
	}
	return pos, ex, nil
}

// release un-holds the slots returned by the previous Next or Ready: the
// forward is done with them, so a later miss of the same step may recycle
// them.
func (s *Stream) release() {
	if s.cur >= 0 {
		s.slots[s.cur].held = false
		s.touched(s.cur)
		s.cur = -1
	}
	for _, si := range s.batch {
		s.slots[si].held = false
		s.touched(si)
	}
	s.batch = s.batch[:0]
}

// endStep releases everything the previous step held, including what an
// aborted step (an error mid-layer) left behind.
func (s *Stream) endStep() {
	s.release()
	// Only the step's own slots can be held or waited for: each is the
	// slot of one of its positions (slotOf; a position whose miss was
	// never issued keeps an older entry, which this leaves unheld as
	// every slot is between steps). Visiting only those keeps a step's
	// cost from growing with the pool: a loop over every slot took 2% of
	// a decode's time at a 100% pool of the 48-layer qwen3-30b-a3b synth
	// (5600 slots, 48 times a token).
	for _, si := range s.slotOf[:len(s.ids)] {
		sl := &s.slots[si]
		sl.held = false
		s.touched(si)
		if sl.demand >= 0 {
			sl.demand = -1
			sl.cut = true // still loading: lands as a plain pool entry
		}
	}
	s.missOut = 0
	clear(s.isMiss)
	s.readyQ, s.readyH = s.readyQ[:0], 0
	s.missQ, s.missH = s.missQ[:0], 0
	s.waiting = 0
}

// drain processes completions that have already arrived and returns the
// first error of a read the current step was waiting for (between steps
// there is none: a failed read's slot is just freed).
func (s *Stream) drain() error {
	var first error
	for {
		c, ok, err := s.finished(false)
		if err != nil || !ok {
			return cmp.Or(first, err)
		}
		if err := s.complete(c); err != nil && first == nil {
			first = err
		}
	}
}

// complete records a finished read; a demanded slot joins the ready queue.
func (s *Stream) complete(c completion) error {
	s.inflight--
	sl := &s.slots[c.slot]
	if sl.prefetch >= 0 {
		s.preInflight--
		sl.prefetch = -1
	}
	if c.err != nil || c.cancelled {
		if c.err != nil {
			s.stats.ReadErrors.Add(1)
		}
		d := sl.demand
		s.where[sl.rec] = -1
		s.vs.drop(c.slot, int(sl.rec)/s.E)
		sl.rec, sl.state, sl.demand, sl.held, sl.pre = -1, free, -1, false, false
		sl.cancel.Store(false)
		if d >= 0 {
			s.waiting--
			if c.err == nil {
				// A cancelled prefetch that a step then needed: read it.
				s.missQ = append(s.missQ, d)
				s.stats.layers[s.layer].Misses.Add(1)
				s.stats.layers[s.layer].Hits.Add(-1)
				return nil
			}
			return fmt.Errorf("expert stream: reading layer %d expert %d: %v", s.layer, s.ids[d], c.err)
		}
		return nil
	}
	sl.state = ready
	s.touched(c.slot)
	sl.low = sl.readLow
	n := s.recStride(sl.readLow)
	s.stats.BytesRead.Add(n)
	if sl.demand >= 0 {
		s.readyQ = append(s.readyQ, sl.demand)
		s.stats.layers[s.layer].BytesRead.Add(n)
		sl.demand = -1
		s.waiting--
	}
	return nil
}

// cutOne applies --cut-weak once the resident part is done: a position
// whose read has not landed and whose weight is below the threshold in
// every row is dropped from this step.
func (s *Stream) cutOne() (int32, bool) {
	w := s.hint.MaxWeight
	if w == nil {
		return 0, false
	}
	for k := s.missH; k < len(s.missQ); k++ {
		if i := s.missQ[k]; w[i] < s.o.CutWeak {
			copy(s.missQ[s.missH+1:k+1], s.missQ[s.missH:k])
			s.missH++
			return i, true
		}
	}
	for si := range s.slots {
		sl := &s.slots[si]
		if sl.demand >= 0 && sl.state == loading && w[sl.demand] < s.o.CutWeak {
			i := sl.demand
			sl.demand, sl.held, sl.cut = -1, false, true
			s.touched(int32(si))
			s.waiting--
			if s.isMiss[i] {
				s.isMiss[i] = false
				s.missOut--
			}
			return i, true
		}
	}
	return 0, false
}

// Prefetch implements model.Prefetcher: read the predicted experts of
// layer into slots that the current step does not hold, at most
// Options.Prefetch in flight: of ids (best first; a negative one is a
// rank the caller needs no read for) those not resident whose rank the
// gate lets through (LookGate).
func (s *Stream) Prefetch(layer int, ids []int) { s.prefetch(s.look, layer, ids, false) }

// PrefetchAhead implements model.DeepPrefetcher: Prefetch for predictions
// made depth layers ahead of the current step, under their own gates
// (Stream.ahead), kept past the steps between (accountPrefetches). Depth 1
// is Prefetch; a depth beyond Options.LookDepth reads nothing.
func (s *Stream) PrefetchAhead(layer, depth int, ids []int) {
	switch {
	case depth == 1:
		s.Prefetch(layer, ids)
	case depth >= 2 && depth <= s.o.LookDepth && layer >= 0:
		s.prefetch(s.ahead[depth-2][layer%depth], layer, ids, true)
	}
}

func (s *Stream) prefetch(g *LookGate, layer int, ids []int, ahead bool) {
	if !s.o.Lookahead || layer < 0 || layer >= s.L {
		return
	}
	on := g.Predict(layer, ids, func(e int) bool { return e < s.E && s.where[layer*s.E+e] < 0 })
	s.stats.LookSkipped.Add(int64(g.WouldFetch() - len(on)))
	if ahead {
		s.stats.AheadSkipped.Add(int64(g.WouldFetch() - len(on)))
	}
	for _, e := range on {
		rec := int32(layer*s.E + e)
		if s.preInflight >= s.o.Prefetch {
			return
		}
		if s.where[rec] >= 0 {
			continue
		}
		si := s.victim()
		if si < 0 {
			return
		}
		sl := s.evict(si)
		sl.rec, sl.state, sl.pre, sl.last, sl.readLow = rec, loading, true, s.clock, false
		s.vs.take(si, layer)
		sl.prefetch, sl.ahead = layer, ahead
		s.where[rec] = si
		if !sl.listed {
			s.prefs = append(s.prefs, si)
			sl.listed = true
		}
		s.inflight++
		s.preInflight++
		s.stats.LookIssued.Add(1)
		if ahead {
			s.stats.AheadIssued.Add(1)
		}
		s.send(request{slot: si, off: int64(rec) * s.st.Stride}, true)
	}
}

// accountPrefetches settles the prefetches issued for layer as the step
// of that layer begins: those the step does not use are counted wasted,
// and those still queued are cancelled. Those issued further ahead for a
// layer still to come (PrefetchAhead) wait for its step.
func (s *Stream) accountPrefetches(layer int) {
	used := func(e int) bool { return s.isNeeded(int32(layer*s.E+e), layer) }
	s.look.Score(layer, used)
	for d, gs := range s.ahead {
		gs[layer%(d+2)].Score(layer, used)
	}
	keep := s.keep[:0]
	for _, si := range s.prefs {
		sl := &s.slots[si]
		if l := int(sl.rec) / s.E; sl.pre && sl.ahead && l > layer && l <= layer+s.o.LookDepth {
			keep = append(keep, si)
			continue
		}
		sl.listed = false
		if !sl.pre || s.isNeeded(sl.rec, layer) {
			continue // already used or evicted, or Begin counts it useful
		}
		s.stats.LookWasted.Add(1)
		if sl.ahead {
			s.stats.AheadWasted.Add(1)
		}
		sl.pre, sl.ahead = false, false
		s.touched(si)
		if sl.state == loading {
			sl.cancel.Store(true)
		}
	}
	s.prefs, s.keep = keep, s.prefs[:0]
}

func (s *Stream) isNeeded(rec int32, layer int) bool {
	if rec < 0 || int(rec)/s.E != layer {
		return false
	}
	e := int(rec) % s.E
	for _, id := range s.ids {
		if id == e {
			return true
		}
	}
	return false
}

// PrefetchReaders returns how many readers take prefetches now.
func (s *Stream) PrefetchReaders() int { return int(s.preLimit.Load()) }

// adaptReaders, as each step begins, closes the window of step time once
// it reaches adaptWindow and sets the prefetch readers' count from the
// share of the disk's bandwidth the window's reads took (nextPreLimit).
// Only with Options.PrefetchReaders 0.
func (s *Stream) adaptReaders() {
	if s.o.PrefetchReaders != 0 || s.o.Readers <= prefetchReaders {
		return
	}
	now := s.now()
	gap := now - s.lastStep
	s.lastStep = now
	w := adaptMark{s.stats.BytesRead.Load(), s.stats.DeepNs.Load(), s.stats.DeepBytes.Load()}
	if gap <= 0 || gap > adaptMaxGap {
		s.winWall, s.win = 0, w
		return
	}
	if s.winWall += gap; s.winWall < adaptWindow {
		return
	}
	if dn := w.deepNs - s.win.deepNs; dn >= deepMin {
		s.diskBW = float64(w.deepBytes-s.win.deepBytes) / float64(dn)
	}
	rate := float64(w.bytes-s.win.bytes) / float64(s.winWall)
	s.winWall, s.win = 0, w
	if s.diskBW <= 0 {
		return // no estimate of the disk yet
	}
	cur := int(s.preLimit.Load())
	next := nextPreLimit(cur, prefetchReaders, s.o.Readers, rate/s.diskBW)
	if next == cur {
		return
	}
	s.setPreLimit(next)
	s.stats.PrefetchSwitches.Add(1)
}

// adaptMark is where a window of adaptReaders began: the stream's bytes
// read, and the time and bytes under load (Stats.DeepNs).
type adaptMark struct{ bytes, deepNs, deepBytes int64 }

// setPreLimit lets readers [0, n) take prefetches and wakes the waiting
// readers to look at their role again. The count is stored before the
// channel is replaced and closed, and a reader loads the channel before
// the count, so none waits under a count it did not see.
func (s *Stream) setPreLimit(n int) {
	s.preLimit.Store(int32(n))
	if s.kr != nil {
		s.submit(false) // the kernel's reads: prefetches the limit held back
		return
	}
	wake := make(chan struct{})
	close(*s.wake.Swap(&wake))
}

// reader i serves read requests: demand misses only, or, while i is
// below preLimit, demand misses before prefetches.
func (s *Stream) reader(ctx context.Context, i int32) {
	defer s.wg.Done()
	var stage, tmp []byte
	if s.low != nil && s.o.widen {
		stage = alignedBuf(s.low.Stride)
		defer platform.Free(stage)
	}
	for {
		var r request
		wake := *s.wake.Load()
		if i >= s.preLimit.Load() {
			select {
			case r = <-s.demand:
			case <-wake:
				continue // preLimit changed: look again
			case <-ctx.Done():
				return
			}
		} else {
			select {
			case r = <-s.demand:
			default:
				select {
				case r = <-s.demand:
				case r = <-s.pre:
				case <-wake:
					continue
				case <-ctx.Done():
					return
				}
			}
		}
		sl := &s.slots[r.slot]
		if sl.cancel.Load() {
			s.done <- completion{slot: r.slot, cancelled: true}
			continue
		}
		var err error
		n := s.recStride(r.low)
		s.stats.readStart()
		switch {
		case r.low && s.o.widen:
			if err = preadFull(s.lowFile, stage, r.off); err == nil {
				err = expandLow(sl.buf, stage, &s.st, s.low)
			}
		default:
			f, buf := s.readInto(sl, r.low)
			err = preadFull(f, buf, r.off)
		}
		s.stats.readEnd(n)
		if err == nil && s.o.Tile && (!r.low || s.o.widen) {
			tmp, err = model.TileRecord(sl.buf, &s.st, tmp)
		}
		s.done <- completion{slot: r.slot, err: err}
	}
}

// Close stops the readers and releases the pool.
func (s *Stream) Close() error {
	if s.stop == nil {
		s.closeFiles()
		if s.mem != nil {
			platform.Free(s.mem)
			s.mem = nil
		}
		return nil
	}
	for i := range s.slots {
		s.slots[i].cancel.Store(true)
	}
	// Wait for what is in flight before the slots' memory goes away.
	var werr error
	for s.inflight > 0 {
		if _, ok, err := s.finished(true); !ok {
			// The kernel's reads failed to report: the memory they
			// write to is not released.
			werr = cmp.Or(err, fmt.Errorf("expert stream: %d reads unaccounted for", s.inflight))
			break
		}
		s.inflight--
	}
	s.stop()
	s.wg.Wait()
	s.stop = nil
	if s.kr != nil {
		// io_destroy returns once the kernel's reads are done with the
		// pool; if it fails, the pool's memory is not released.
		if err := s.kr.r.Close(); err != nil {
			s.closeFiles()
			s.mem = nil
			return cmp.Or(werr, err)
		}
	} else if werr != nil {
		s.closeFiles()
		s.mem = nil
		return werr
	}
	s.closeFiles()
	err := platform.Free(s.mem)
	s.mem = nil
	return cmp.Or(werr, err)
}

func (s *Stream) closeFiles() {
	if s.file != nil {
		s.file.Close()
	}
	if s.lowFile != nil {
		s.lowFile.Close()
	}
}

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

var (
	_ model.Provider      = (*Stream)(nil)
	_ model.ReadyProvider = (*Stream)(nil)
	_ model.Prefetcher    = (*Stream)(nil)
	_ model.LookWeigher   = (*Stream)(nil)
)
