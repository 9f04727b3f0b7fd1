//go:build linux

package gpu

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// Hybrid decode: a miss of the GPU's pool lies in host memory (the store,
// or the host's streaming pool) before it crosses PCIe. Multiplying it
// there, on the host's CPU, reads it at the memory's speed instead of the
// link's, while the GPU copies and multiplies the other misses. For q4
// experts the CPU's product is the GPU's bit for bit (the same int8
// activations and integer dots; SwiGLU too, internal/cuda's tests), so
// which side computed an expert does not change the logits. The layer's
// normed input row comes back with the router's choice; each CPU expert's
// output row goes up into its place among the experts' outputs before the
// combine.

// hybrid is the runner's CPU side of a decode step's misses.
type hybrid struct {
	share float64       // Config.CPUShare
	auto  bool          // Config.CPUAuto: the cost model picks each layer's share
	pool  *kernels.Pool // the CPU's threads; nil when no miss is computed there
	// Pinned: the layer's input row, and the wave's CPU outputs [K][hidden].
	offH, offOut int
	h, out       []float32
	g, u         []float32       // [moe_inter] scratch
	n            int             // CPU outputs of the wave so far
	done         int             // of them, those computed (flushCPU)
	todo         []*model.Expert // [n] their host experts
	rows         []int           // [n] their rows of outk
	cost         hybridCost
	// The wave's copies on the copy stream, timed for the cost model.
	copyEv    [2]cuda.Event
	copyStart time.Time // when the wave's first copy was queued; zero if none was
	copyArmed bool      // copyEv[0] is recorded
	copyBytes uint64    // what the timed copies moved; 0 when none are
}

// hybridCost is the cost model of Config.CPUAuto: the CPU's time for
// the first expert of a flush (its threads wake) and for each one after,
// and the time the device thread takes to queue a wave's GPU work before
// the CPU starts on its misses, each the median of its recent samples;
// the link's time per record, a running average; and the split of a
// layer's misses that balances the two sides (costSplit).
type hybridCost struct {
	first    recent  // ms for a flush's first expert on the CPU (its threads wake)
	next     recent  // ms for each further one
	lead     recent  // ms from a wave's first copy to the CPU's start
	copyMSB  float64 // ms per byte copied to the device; 0 = unmeasured
	recBytes float64 // the bytes of a copied miss's record, on average
	idle     int     // layers planned since the CPU last took a miss
	every    int     // layers between probes now (probeEvery doubling)
}

// recent is one of the CPU's figures: the median of its last recentN
// samples. A product the scheduler preempted, or the first to touch its
// records, can take ten times the usual; a running average would carry
// such a sample for many layers, and as it then gives the CPU nothing
// but rare probes, it could keep the CPU out of a whole run.
type recent struct {
	v [recentN]float64
	n int // samples so far
}

const recentN = 5

func (m *recent) add(x float64) {
	m.v[m.n%recentN] = x
	m.n++
}

// get is the median of the samples held (of an even count, the lower
// one, so that a probe after an outlier lets the CPU show its speed);
// 0 before the first.
func (m *recent) get() float64 {
	k := min(m.n, recentN)
	if k == 0 {
		return 0
	}
	var s [recentN]float64
	copy(s[:k], m.v[:k])
	slices.Sort(s[:k])
	return s[(k-1)/2]
}

// probeEvery and maxProbeEvery bound how many layers with misses the model
// lets pass with none on the CPU before it gives the CPU a probe anyway
// (two misses: the first's time and a further one's), to keep its figures
// of the CPU current: the interval starts at the first and doubles with
// each probe that changes nothing, up to the second, so that a CPU slower
// than the link costs next to nothing.
const (
	probeEvery    = 64
	maxProbeEvery = 4096
)

// observe adds one measurement v to the running average *avg.
func observe(avg *float64, v float64) {
	if *avg == 0 {
		*avg = v
		return
	}
	*avg = 0.8**avg + 0.2*v
}

// costSplit is how many of a layer's n misses the CPU takes, at first ms
// for its first expert and next ms for each further one, starting lead ms
// after the copies begin, against cp ms a record over the link: as both
// run at once, the k whose slower side, max(lead + first + (k−1)·next,
// (n−k)·cp), is the shortest (the fewest on a tie).
func costSplit(n int, cp, first, next, lead float64) int {
	if n <= 0 || cp <= 0 || first <= 0 || next <= 0 {
		return 0
	}
	best, at := float64(n)*cp, 0
	for k := 1; k <= n; k++ {
		if span := max(lead+first+float64(k-1)*next, float64(n-k)*cp); span < best {
			best, at = span, k
		}
	}
	return at
}

// plan is how many of a layer's n decode misses the CPU takes under the
// cost model: a probe while the CPU's first expert is unmeasured or a
// probe is due, none while the link's speed is unmeasured.
func (c *hybridCost) plan(n int) int {
	if n == 0 {
		return 0
	}
	if c.every == 0 {
		c.every = probeEvery
	}
	first, next := c.first.get(), c.next.get()
	if first == 0 {
		return min(n, 2)
	}
	if next == 0 {
		// Every flush so far computed one expert (each before a
		// provider call, through the host's streaming pool): a further
		// one costs at most a first.
		next = first
	}
	k := costSplit(n, c.copyMSB*c.recBytes, first, next, c.lead.get())
	switch {
	case k > 0:
		c.idle, c.every = 0, probeEvery
	case c.idle+1 >= c.every:
		c.idle, c.every, k = 0, min(2*c.every, maxProbeEvery), min(n, 2)
	default:
		c.idle++
	}
	return k
}

// newHybrid starts the CPU's threads when misses may be computed there:
// a pool of q4 records and a share asked for.
func (r *Runner) newHybrid(cfg Config) error {
	p := r.pool
	if !r.hyb.on() || p == nil {
		return nil
	}
	for _, o := range p.lay {
		var why string
		switch {
		case o.m.kind != format.Q4:
			why = fmt.Sprintf("the CPU computes misses of q4 experts only (these are %s): its product is then the GPU's bit for bit", o.m.kind)
		case o.bias != 0 || !plainSwiGLU(allLayers(r.M)):
			// The CPU's product of a miss adds no biases and runs SwiGLU.
			why = "the CPU computes misses of experts without biases, with SwiGLU, only"
		default:
			continue
		}
		if r.hyb.auto {
			r.hyb.auto = false // the cost model's choice: the GPU computes them all
			return nil
		}
		return errors.New(why)
	}
	hy := &r.hyb
	for i := range hy.copyEv {
		var err error
		if hy.copyEv[i], err = r.Dev.NewEvent(); err != nil {
			return err
		}
	}
	threads := cfg.CPUThreads
	if threads <= 0 {
		// A one-row product from host memory is bound by the memory,
		// and every thread spins a while after each product: on the
		// H200 machine's 16 cores, 8 threads took 0.33 ms an expert
		// and decoded a 0.5 share 1.6× faster than 16 (0.54 ms).
		threads = max(1, runtime.NumCPU()/2)
	}
	hy.pool = kernels.NewPool(threads)
	hy.g, hy.u = make([]float32, r.I), make([]float32, r.I)
	hy.rows, hy.todo = make([]int, 0, r.K), make([]*model.Expert, 0, r.K)
	return nil
}

// on reports whether the CPU may compute misses: a share or the cost
// model asked for.
func (hy *hybrid) on() bool { return hy.share > 0 || hy.auto }

// cpuMisses is how many of a layer's n misses the CPU computes.
func (r *Runner) cpuMisses(decode bool, n int) int {
	hy := &r.hyb
	switch {
	case hy.pool == nil || !decode:
		return 0
	case hy.auto:
		return hy.cost.plan(n)
	}
	return min(n, int(math.Round(hy.share*float64(n))))
}

// takeMiss gives the wave's miss j (wave w0), whose host record is ex, to
// the CPU: the next CPU output row is its, computed by flushCPU.
func (r *Runner) takeMiss(w0, j int, ex *model.Expert) error {
	p, hy := r.pool, &r.hyb
	if ex == nil {
		return fmt.Errorf("the host provider cut expert %d, and --cut-weak is off", p.missIDs[j])
	}
	if hy.n == r.K || len(hy.h) == 0 {
		return fmt.Errorf("more CPU experts than a decode row has (%d)", r.K)
	}
	i := p.missAt[j]
	hy.rows = append(hy.rows[:hy.n], r.grp.Base[w0+i])
	hy.todo = append(hy.todo[:hy.n], ex)
	hy.n++
	p.isCPU[i] = true
	p.stats.CPUComputed++
	return nil
}

// flushCPU multiplies the CPU's misses taken and not yet computed into
// their output rows. The device thread runs it once the GPU has the
// wave's work queued, so the two compute at once; and before the host's
// provider is called again, when the records lie in its streaming pool,
// which that call may recycle.
func (r *Runner) flushCPU() {
	hy, H := &r.hyb, r.H
	if hy.done == hy.n {
		return
	}
	t0, first := time.Now(), hy.done
	if first == 0 && !hy.copyStart.IsZero() {
		hy.cost.lead.add(msSince(hy.copyStart, t0))
	}
	for c := first; c < hy.n; c++ {
		ex := hy.todo[c]
		out := hy.out[c*H : (c+1)*H]
		hy.pool.MatMul2(hy.g, &ex.Gate, hy.u, &ex.Up, hy.h, 1)
		kernels.SwiGLU(hy.g, hy.g, hy.u)
		hy.pool.MatMul(out, &ex.Down, hy.g, 1)
		hy.todo[c] = nil
		t1 := time.Now()
		if c == first {
			// The threads slept since the last flush, whether of
			// this wave or of the one before.
			hy.cost.first.add(msSince(t0, t1))
		} else {
			hy.cost.next.add(msSince(t0, t1))
		}
		t0 = t1
	}
	hy.done = hy.n
}

// uploadCPUOutputs computes the wave's CPU misses left and queues their
// outputs into their rows of outk, ahead of the combine. The pinned rows
// are not written again before the next layer's route sync, which waits
// for these copies.
func (r *Runner) uploadCPUOutputs() {
	r.flushCPU()
	hy, H := &r.hyb, r.H
	for c := range hy.n {
		r.check(r.Dev.UploadAsync(r.outk+uintptr(4*hy.rows[c]*H), r.pin, hy.offOut+4*c*H, 4*H, r.s))
	}
}

// resetCopies forgets the last wave's copy timing as a wave begins.
func (hy *hybrid) resetCopies() {
	hy.copyArmed, hy.copyBytes, hy.copyStart = false, 0, time.Time{}
}

// timeCopies records the start of the wave's copies on the copy stream,
// as the first is queued (behind the stream's wait for the products
// queued before them), for the cost model when it runs and the wave is a
// decode's; and the host's time then, the CPU's lead's start. Without the
// CPU's threads it does nothing.
func (r *Runner) timeCopies(decode bool) {
	hy := &r.hyb
	if hy.pool == nil {
		return
	}
	hy.copyStart = time.Now()
	if hy.auto && decode {
		hy.copyArmed = r.Dev.Record(hy.copyEv[0], r.pool.cs) == nil
	}
}

// copiesTimed records the end of the wave's copies, copies records that
// moved n bytes, while the timing stands: the copies were queued back to
// back (copyArmed is cleared where the stream may have idled between
// them, waiting for the host).
func (r *Runner) copiesTimed(n uint64, copies int) {
	hy := &r.hyb
	if hy.copyArmed && n > 0 && copies > 0 && r.Dev.Record(hy.copyEv[1], r.pool.cs) == nil {
		hy.copyBytes = n
		// A miss's record: whole, or smaller at the low bits of
		// --miss-bits.
		observe(&hy.cost.recBytes, float64(n)/float64(copies))
	}
	hy.copyArmed = false
}

// collectCopyTime adds the last wave's timed copies to the cost model,
// once the stream that waited for them has synced.
func (r *Runner) collectCopyTime() {
	hy := &r.hyb
	if hy.copyBytes == 0 {
		return
	}
	if ms, err := r.Dev.Elapsed(hy.copyEv[0], hy.copyEv[1]); err == nil && ms > 0 {
		observe(&hy.cost.copyMSB, float64(ms)/float64(hy.copyBytes))
	}
	hy.copyBytes = 0
}

// msSince is the time from t0 to t1 in ms.
func msSince(t0, t1 time.Time) float64 { return float64(t1.Sub(t0).Nanoseconds()) / 1e6 }
