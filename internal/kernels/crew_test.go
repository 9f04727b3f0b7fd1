package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/format"
)

// firstDiff is the first index where got and want differ in their bits,
// or -1.
func firstDiff(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// crewMats are products of every kind the crew splits, with row counts
// that are not multiples of a chunk or of a tile.
func crewMats(t *testing.T, r *rand.Rand) []Mat {
	var ms []Mat
	for _, k := range []format.Kind{format.Q4, format.Q8, format.BF16, format.F32, format.Q3, format.MXFP4} {
		rows, cols := 777, 512
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = float32(r.NormFloat64()) * 0.05
		}
		var m Mat
		if k == format.MXFP4 {
			m, _ = mxMat(t, w, rows, cols)
		} else {
			m, _ = encodeMat(t, w, rows, cols, k)
		}
		ms = append(ms, m)
	}
	return ms
}

// stallUntilStolen makes thread 0 of c, after each chunk of its own, wait
// until some chunk has been taken since *since (at most 10 s): a slow
// owner whose rows the other threads must take, whatever the machine's
// speed.
func stallUntilStolen(c *Crew, since *uint64) {
	// A helper that finds nothing to take yet (thread 0 has not started,
	// on a loaded machine) keeps looking.
	c.patience = 10 * time.Second
	c.hookChunk = func(self int) {
		if self != 0 {
			return
		}
		for end := time.Now().Add(10 * time.Second); c.Stolen() == *since && time.Now().Before(end); {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// TestCrewSplitProducts checks that a pool's products come out bit for bit
// as on one thread when one part's owner is slow and the other threads
// take its rows, for every kind and for one and several activation rows.
func TestCrewSplitProducts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ms := crewMats(t, r)
	for _, threads := range []int{2, 3} {
		p := NewPool(threads)
		defer p.Close()
		// The dispatcher's part stalls: the workers finish theirs and take
		// chunks from the back of it.
		var before uint64
		stallUntilStolen(p.crew, &before)
		for _, m := range ms {
			for _, nb := range []int{1, 3} {
				x := randVec(r, nb*m.Cols)
				want := make([]float32, nb*m.Rows)
				var sc Scratch
				sc.MatMul(want, &m, x, nb)
				got := make([]float32, nb*m.Rows)
				before = p.crew.Stolen()
				p.MatMul(got, &m, x, nb)
				if p.crew.Stolen() == before {
					t.Errorf("%d threads, %v, %d rows: no chunk was taken from the slow part", threads, m.Kind, nb)
				}
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("%d threads, %v, %d rows: element %d is %v, on one thread %v", threads, m.Kind, nb, i, got[i], want[i])
				}
			}
		}
	}
}

// ownTask gives each thread products of its own through a Scratch joined
// to the pool's crew, as the MoE block's experts run: thread i computes
// products[j] for every j ≡ i mod threads.
type ownTask struct {
	p       *Pool
	sc      []Scratch
	ms      []Mat
	x, outs [][]float32
}

func (t *ownTask) Run(lo, hi int) {
	defer t.p.Crew().Done(lo, t.sc[lo].Rooms())
	for j := lo; j < len(t.ms); j += t.p.Threads() {
		t.sc[lo].MatMul(t.outs[j], &t.ms[j], t.x[j], 1)
	}
}

// TestCrewOwnProducts checks products that threads run on their own
// Scratches: a thread with fewer of them takes rows of the others', and
// every output is the one-thread result bit for bit.
func TestCrewOwnProducts(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ms := crewMats(t, r)
	for _, threads := range []int{2, 4} {
		p := NewPool(threads)
		defer p.Close()
		// Thread 0 holds the most products, and stalls.
		var before uint64
		stallUntilStolen(p.crew, &before)
		task := &ownTask{p: p, sc: make([]Scratch, threads), ms: ms}
		for i := range task.sc {
			task.sc[i].Join(p.Crew(), i)
		}
		want := make([][]float32, len(ms))
		for j := range ms {
			task.x = append(task.x, randVec(r, ms[j].Cols))
			task.outs = append(task.outs, make([]float32, ms[j].Rows))
			want[j] = make([]float32, ms[j].Rows)
			var sc Scratch
			sc.MatMul(want[j], &ms[j], task.x[j], 1)
		}
		before = p.crew.Stolen()
		p.ParallelCrew(threads, 1, task)
		if p.crew.Stolen() == before {
			t.Errorf("%d threads: no chunk was taken from another thread's product", threads)
		}
		for j := range ms {
			if i := firstDiff(task.outs[j], want[j]); i >= 0 {
				t.Fatalf("%d threads, product %d (%v): element %d is %v, on one thread %v", threads, j, ms[j].Kind, i, task.outs[j][i], want[j][i])
			}
		}
	}
}

// TestCrewStress runs many small split and own products with owners
// delayed at random, so that claims from the front and the back race on
// every chunk; run it under -race too. Every output must match one thread
// (the tests above make sure that chunks are taken).
func TestCrewStress(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ms := crewMats(t, r)[:2]
	p := NewPool(3)
	defer p.Close()
	var n atomic.Int64
	p.crew.hookChunk = func(self int) {
		if n.Add(1)%3 == int64(self%3) {
			time.Sleep(time.Duration(n.Load()%50) * time.Microsecond)
		}
	}
	task := &ownTask{p: p, sc: make([]Scratch, 3)}
	for i := range task.sc {
		task.sc[i].Join(p.Crew(), i)
	}
	for round := range 40 {
		m := ms[round%len(ms)]
		x := randVec(r, m.Cols)
		want := make([]float32, m.Rows)
		var sc Scratch
		sc.MatMul(want, &m, x, 1)
		got := make([]float32, m.Rows)
		p.MatMul(got, &m, x, 1)
		task.ms = []Mat{m, m, m, m, m}
		task.x = [][]float32{x, x, x, x, x}
		task.outs = make([][]float32, 5)
		for j := range task.outs {
			task.outs[j] = make([]float32, m.Rows)
		}
		p.ParallelCrew(3, 1, task)
		for j, out := range append(task.outs, got) {
			if i := firstDiff(out, want); i >= 0 {
				t.Fatalf("round %d, output %d: element %d is %v, on one thread %v", round, j, i, out[i], want[i])
			}
		}
	}
}

func TestCrewRanges(t *testing.T) {
	for _, c := range [][2]int{{0, 0}, {0, 1}, {16, 777}, {1 << 20, 1<<31 - 1}} {
		if lo, hi := unpackRange(packRange(c[0], c[1])); lo != c[0] || hi != c[1] {
			t.Errorf("pack(%d, %d) unpacks to %d, %d", c[0], c[1], lo, hi)
		}
	}
	for _, w := range []Mat{{Rows: 768, Cols: 2048, Kind: format.Q4}, {Rows: 2048, Cols: 768, Kind: format.Q4}, {Rows: 128, Cols: 2048, Kind: format.F32}, {Rows: 10, Cols: 1 << 16, Kind: format.BF16}} {
		ch := crewChunk(&w, 1)
		if ch < 16 || ch%16 != 0 {
			t.Errorf("%s: a chunk of %d rows", fmt.Sprint(w.Rows, "x", w.Cols, " ", w.Kind), ch)
		}
	}
}

// TestCrewOneProcessor runs the crew with more threads than Go has
// processors: a thread waiting for a thief that has no processor must
// give it one, and every product must still come out as on one thread.
func TestCrewOneProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := rand.New(rand.NewPCG(9, 10))
	ms := crewMats(t, r)
	p := NewPool(3)
	defer p.Close()
	task := &ownTask{p: p, sc: make([]Scratch, 3), ms: ms}
	for i := range task.sc {
		task.sc[i].Join(p.Crew(), i)
	}
	for round := range 5 {
		task.x, task.outs = nil, nil
		for j := range ms {
			task.x = append(task.x, randVec(r, ms[j].Cols))
			task.outs = append(task.outs, make([]float32, ms[j].Rows))
		}
		p.ParallelCrew(3, 1, task)
		for j := range ms {
			want := make([]float32, ms[j].Rows)
			var sc Scratch
			sc.MatMul(want, &ms[j], task.x[j], 1)
			got := make([]float32, ms[j].Rows)
			p.MatMul(got, &ms[j], task.x[j], 1)
			for k, out := range [][]float32{task.outs[j], got} {
				if i := firstDiff(out, want); i >= 0 {
					t.Fatalf("round %d, product %d, output %d: element %d is %v, on one thread %v", round, j, k, i, out[i], want[i])
				}
			}
		}
	}
}

// TestCrewLateWorker follows a worker that wakes only after the
// dispatcher has taken its part, as a worker parked through an expert's
// read does: the dispatcher must take the part at once rather than wait
// its patience for rows that no thread has published, and the worker,
// finding its part taken, must take rows of it. The results are the
// one-thread ones bit for bit.
func TestCrewLateWorker(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	m := crewMats(t, r)[0]
	p := NewPool(2)
	defer p.Close()
	// Waiting out the patience would take 10 s; the worker waits for the
	// dispatcher to start on its part for 3 s at most.
	p.crew.patience = 10 * time.Second
	var late, started, timedOut atomic.Bool
	p.hookClaim = func(int) {
		if !late.Load() {
			return
		}
		end := time.Now().Add(3 * time.Second)
		for !started.Load() && time.Now().Before(end) {
			time.Sleep(20 * time.Microsecond)
		}
		timedOut.Store(!started.Load())
	}
	// Part 1's owner marks that it started, then holds on to its first
	// chunk until a chunk is taken (at most 2 s), so that the worker has
	// rows left to take whatever the machine's speed.
	var before atomic.Uint64
	p.crew.hookChunk = func(self int) {
		if self != 1 || !late.Load() || started.Swap(true) {
			return
		}
		for end := time.Now().Add(2 * time.Second); p.crew.Stolen() == before.Load() && time.Now().Before(end); {
			time.Sleep(20 * time.Microsecond)
		}
	}
	x := randVec(r, m.Cols)
	want := make([]float32, m.Rows)
	var sc Scratch
	sc.MatMul(want, &m, x, 1)
	for round := range 3 {
		got := make([]float32, m.Rows)
		started.Store(false)
		timedOut.Store(false)
		before.Store(p.crew.Stolen())
		late.Store(true)
		p.MatMul(got, &m, x, 1)
		late.Store(false)
		if timedOut.Load() {
			t.Fatalf("round %d: the dispatcher did not start on the late worker's part within 3 s", round)
		}
		if p.crew.Stolen() == before.Load() {
			t.Errorf("round %d: the late worker took no rows of its part", round)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("round %d: element %d is %v, on one thread %v", round, i, got[i], want[i])
		}
	}
}
