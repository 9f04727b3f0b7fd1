package kernels

import (
	"runtime"
	"sync"

	"github.com/sluicelm/sluice/internal/format"
)

// Task is a unit of parallel work over an index range.
type Task interface {
	Run(lo, hi int)
}

type span struct{ lo, hi int }

// Pool is a persistent set of worker goroutines that split each operation
// of a step by output rows. Persistent workers avoid a goroutine per op;
// tasks are pointers to structs the pool owns, so dispatching allocates
// nothing. A Pool runs one operation at a time: it belongs to one engine.
type Pool struct {
	n    int
	work []chan span
	wg   sync.WaitGroup
	task Task

	mm   matmulTask
	xsum []float32
}

// NewPool starts threads-1 workers (the caller is the last thread); threads
// <= 0 means one per CPU.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	p := &Pool{n: threads}
	for i := 1; i < threads; i++ {
		c := make(chan span)
		p.work = append(p.work, c)
		go p.worker(c)
	}
	return p
}

// Threads is the number of threads the pool splits work across.
func (p *Pool) Threads() int { return p.n }

func (p *Pool) worker(c chan span) {
	for s := range c {
		p.task.Run(s.lo, s.hi)
		p.wg.Done()
	}
}

// Close stops the workers.
func (p *Pool) Close() {
	for _, c := range p.work {
		close(c)
	}
	p.work = nil
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
	p.wg.Add(parts - 1)
	for i := 1; i < parts; i++ {
		lo, hi := i*step, min((i+1)*step, n)
		p.work[i-1] <- span{lo, hi}
	}
	t.Run(0, min(step, n))
	p.wg.Wait()
	p.task = nil
}

type matmulTask struct {
	out, x, xsum []float32
	w            *Mat
	nb           int
}

func (t *matmulTask) Run(lo, hi int) {
	w := t.w
	ng := w.Cols / format.GroupSize
	for o := lo; o < hi; o++ {
		for r := 0; r < t.nb; r++ {
			var xs []float32
			if w.Kind.Quantised() {
				xs = t.xsum[r*ng : (r+1)*ng]
			}
			t.out[r*w.Rows+o] = w.dotRow(o, t.x[r*w.Cols:(r+1)*w.Cols], xs)
		}
	}
}

// MatMul computes out[r] = W·x[r] for nb rows: out is [nb][W.Rows], x is
// [nb][W.Cols].
func (p *Pool) MatMul(out []float32, w *Mat, x []float32, nb int) {
	if w.Kind.Quantised() {
		ng := w.Cols / format.GroupSize
		p.xsum = grow(p.xsum, nb*ng)
		for r := 0; r < nb; r++ {
			GroupSums(p.xsum[r*ng:(r+1)*ng], x[r*w.Cols:(r+1)*w.Cols])
		}
	}
	p.mm = matmulTask{out: out[:nb*w.Rows], x: x[:nb*w.Cols], xsum: p.xsum, w: w, nb: nb}
	// Below ~16K multiply-adds per part, waking a worker costs more than it saves.
	grain := max(1, 16384/(w.Cols*nb))
	p.Parallel(w.Rows, grain, &p.mm)
	p.mm = matmulTask{}
}

// grow returns b with length n, reallocating only when its capacity is short.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
