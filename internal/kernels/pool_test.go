package kernels

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// countTask records how often each index ran.
type countTask struct{ hits []atomic.Int32 }

func (t *countTask) Run(lo, hi int) {
	for i := lo; i < hi; i++ {
		t.hits[i].Add(1)
	}
}

// Every index of every operation runs exactly once, whichever thread takes
// a part: with more threads than cores, the dispatcher often runs parts of
// workers that have not been scheduled yet.
func TestPoolEachIndexOnce(t *testing.T) {
	done := make(chan string, 1)
	go func() {
		for _, threads := range []int{2, 3, 8} {
			p := NewPool(threads)
			task := &countTask{hits: make([]atomic.Int32, 100)}
			// Many short operations: a worker still looking at one operation
			// while the next is dispatched is what this exercises (it once
			// lost a completion and hung the dispatcher).
			for op := 0; op < 50000; op++ {
				n := 1 + op%100
				p.Parallel(n, 1, task)
				for i := range task.hits[:n] {
					if h := task.hits[i].Swap(0); h != 1 {
						done <- fmt.Sprintf("threads %d, op %d: index %d of %d ran %d times", threads, op, i, n, h)
						return
					}
				}
			}
			p.Close()
		}
		done <- ""
	}()
	select {
	case msg := <-done:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the pool hung")
	}
}

// nopTask does nothing: BenchmarkPoolDispatch times the hand-off alone.
type nopTask struct{}

func (nopTask) Run(lo, hi int) {}

// BenchmarkPoolDispatch is the cost of one operation's hand-off to the
// workers and back (an empty part per thread): the per-op overhead of a
// decode step, which runs Dispatches-per-token of them.
func BenchmarkPoolDispatch(b *testing.B) {
	p := NewPool(0)
	defer p.Close()
	var t nopTask
	for b.Loop() {
		p.Parallel(p.Threads(), 1, t)
	}
}

// slowPartTask counts like countTask and sleeps in the part starting at
// index slow (none when 0), so the dispatcher waits long enough to park;
// the other parts spin briefly.
type slowPartTask struct {
	countTask
	slow atomic.Int32
}

func (t *slowPartTask) Run(lo, hi int) {
	if s := int(t.slow.Load()); s > 0 && lo == s {
		time.Sleep(500 * time.Microsecond)
	} else if lo > 0 {
		// The workers' parts take a while, so the dispatcher (part 0)
		// ends up waiting for one of them.
		for start := time.Now(); time.Since(start) < 20*time.Microsecond; {
		}
	}
	t.countTask.Run(lo, hi)
}

// A worker that reports the last part of one operation done and then loses
// its core must not wake the dispatcher out of a later operation: the
// dispatcher would return before every part ran, and the next operation's
// count would go wrong and hang it. In even operations every part is quick,
// the dispatcher sees them done while it spins, and the hook stalls the
// worker that reported last right after it reported; in the odd operation
// that follows, the other worker's part is slow, so the dispatcher parks
// while the stalled worker is still on its way out of the previous one.
func TestPoolLateWorkerWake(t *testing.T) {
	var stalled atomic.Int32
	done := make(chan string, 1)
	go func() {
		p := NewPool(3)
		defer p.Close()
		p.hookDone = func(worker, left int) {
			if left == 0 && stalled.CompareAndSwap(0, int32(worker)) {
				time.Sleep(150 * time.Microsecond)
			}
		}
		task := &slowPartTask{countTask: countTask{hits: make([]atomic.Int32, 3)}}
		for op := 0; op < 4000; op++ {
			task.slow.Store(0)
			if op%2 == 1 {
				if w := stalled.Load(); w > 0 {
					task.slow.Store(3 - w) // worker w's part is [w, w+1)
				}
			} else {
				stalled.Store(0)
			}
			p.Parallel(3, 1, task)
			if op%2 == 1 {
				stalled.Store(-1) // no stall until the next even operation
			}
			for i := range task.hits {
				if h := task.hits[i].Swap(0); h != 1 {
					done <- fmt.Sprintf("op %d: index %d ran %d times by the time Parallel returned", op, i, h)
					return
				}
			}
		}
		done <- ""
	}()
	select {
	case msg := <-done:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(time.Minute):
		t.Fatal("the pool hung")
	}
}

// waitTask's part 0 returns only once part 1 has run, so the dispatcher
// (which runs part 0) can never find part 1 unclaimed.
type waitTask struct{ ran atomic.Bool }

func (t *waitTask) Run(lo, hi int) {
	if lo > 0 {
		t.ran.Store(true)
		return
	}
	for !t.ran.Load() {
		runtime.Gosched()
	}
}

// TestPoolSelfRuns: SelfRuns counts exactly the workers' parts the
// dispatcher ran: every one when the worker cannot run before the
// dispatcher's own part ends (one processor), none when the dispatcher's
// part waits for the worker's.
func TestPoolSelfRuns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := NewPool(2)
	defer p.Close()
	task := &countTask{hits: make([]atomic.Int32, 2)}
	for range 50 {
		// Let the worker run until it parks: the dispatcher then runs
		// from a fresh time slice, which the runtime does not preempt
		// within the few microseconds the operation takes.
		runtime.Gosched()
		p.Parallel(2, 1, task)
	}
	if d, s := p.Dispatches(), p.SelfRuns(); d != 50 || s != 50 {
		t.Fatalf("one processor: %d dispatches, %d self-runs; want 50 and 50", d, s)
	}
	runtime.GOMAXPROCS(2)
	for range 50 {
		w := &waitTask{}
		p.Parallel(2, 1, w)
	}
	if d, s := p.Dispatches(), p.SelfRuns(); d != 100 || s != 50 {
		t.Fatalf("dispatcher waiting for the worker: %d dispatches, %d self-runs; want 100 and 50", d, s)
	}
}

// busyTask spins for d in each part.
type busyTask struct{ d time.Duration }

func (t *busyTask) Run(lo, hi int) {
	for end := time.Now().Add(t.d); time.Now().Before(end); {
	}
}

// BenchmarkPoolAfterIdle dispatches a two-part operation of 200 µs a part
// after 1 ms with nothing to do, as a streamed decode dispatches an
// expert's product once its read lands: the workers have parked by then.
// self-runs/op is the share of the worker's parts the dispatcher ran
// because the worker had not woken by the end of its own part.
func BenchmarkPoolAfterIdle(b *testing.B) {
	p := NewPool(2)
	defer p.Close()
	t := &busyTask{d: 200 * time.Microsecond}
	s0 := p.SelfRuns()
	for b.Loop() {
		time.Sleep(time.Millisecond)
		p.Parallel(2, 1, t)
	}
	b.ReportMetric(float64(p.SelfRuns()-s0)/float64(b.N), "self-runs/op")
}

// idleTask's part 0 (the dispatcher's) waits until part 1 has begun, and
// part 1 until the pool's idle hook has run (or a second has passed), so
// that the dispatcher always finishes first, whatever the scheduler does.
type idleTask struct{ begun, idled atomic.Bool }

func (t *idleTask) Run(lo, hi int) {
	if lo > 0 {
		t.begun.Store(true)
		for start := time.Now(); !t.idled.Load() && time.Since(start) < time.Second; {
			runtime.Gosched()
		}
		t.idled.Store(false)
		return
	}
	for !t.begun.Load() {
		runtime.Gosched()
	}
	t.begun.Store(false)
}

// TestPoolIdle: the idle hook runs once an operation while a worker's part
// is still running, on the dispatching goroutine (before Parallel
// returns), and not once unset.
func TestPoolIdle(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	task := &idleTask{}
	var calls int
	in := false
	p.SetIdle(func() {
		if !in {
			t.Error("idle hook outside Parallel")
		}
		calls++
		task.idled.Store(true)
	})
	for range 10 {
		in = true
		p.Parallel(2, 1, task)
		in = false
	}
	if calls != 10 {
		t.Errorf("idle hook ran %d times in 10 operations with a slow worker, want 10", calls)
	}
	p.SetIdle(nil)
	task.idled.Store(true) // no hook to let part 1 go
	p.Parallel(2, 1, task)
	if calls != 10 {
		t.Errorf("idle hook ran %d times after SetIdle(nil)", calls-10)
	}
}
