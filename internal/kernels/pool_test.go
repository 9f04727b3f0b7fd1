package kernels

import (
	"fmt"
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
