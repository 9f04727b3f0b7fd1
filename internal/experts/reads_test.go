package experts

import (
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/model"
)

// TestPoll: between calls into the stream, Poll takes the reads the kernel
// has finished and submits queued ones in the places they free. With one
// read at a time, a step's first miss (the step issues its misses a queue
// depth at a time) and the next layer's prefetches queued behind it are
// all read by polling alone, one after another; the step then gets every
// expert.
func TestPoll(t *testing.T) {
	m, s := loadStream(t, "tiny-qwen3-moe", 4, Options{Slots: 64, Readers: 1, Lookahead: true})
	if s.kr == nil {
		t.Skip("no asynchronous kernel reads here")
	}
	k := s.kr
	ids := make([]int, m.Config.TopK)
	for i := range ids {
		ids[i] = i
	}
	if err := s.Begin(0, ids, model.Hint{}); err != nil {
		t.Fatal(err)
	}
	s.Prefetch(1, ids)
	queued := func(i int) int { return len(k.queue[i]) - k.head[i] }
	if k.out[0] != 1 || queued(1) == 0 {
		t.Fatalf("after Begin and Prefetch: %d in flight, %d prefetches queued; want 1 and some", k.out[0], queued(1))
	}
	reads := 1 + queued(1) // the first miss (the stream issues one at a time) and the prefetches
	deadline := time.Now().Add(10 * time.Second)
	for len(k.done)-k.doneH < reads {
		if time.Now().After(deadline) {
			t.Fatalf("polling: %d of %d reads done, %d in flight, %d queued", len(k.done)-k.doneH, reads, k.out[0]+k.out[1], queued(0)+queued(1))
		}
		s.Poll()
		if q := queued(1); q > 0 && k.out[0]+k.out[1] != 1 {
			t.Fatalf("polling: %d queued with %d in flight", q, k.out[0]+k.out[1])
		}
	}
	for range ids {
		if i, ex, err := s.Next(); err != nil || ex == nil {
			t.Fatalf("Next after polling: %d, %v", i, err)
		}
	}
	if a := s.stats.active.Load(); a != 0 {
		t.Errorf("%d reads counted in flight after the step", a)
	}
	// Closed, it does nothing.
	s.Close()
	s.Poll()
}

// TestDeepReads: the disk's throughput under load counts a stretch from
// deepReads reads in flight to none, with the bytes of every read that
// ends in it; reads that never reach deepReads in flight count nothing.
func TestDeepReads(t *testing.T) {
	var s Stats
	s.init(1, 8, 8)
	const n = 1 << 20
	for range 3 { // shallow: never deepReads in flight
		s.readStart()
	}
	for range 3 {
		s.readEnd(n)
	}
	if s.DeepBytes.Load() != 0 || s.DeepNs.Load() != 0 {
		t.Fatalf("3 reads in flight counted as load: %d bytes, %d ns", s.DeepBytes.Load(), s.DeepNs.Load())
	}
	for range 8 { // a step's reads, issued together
		s.readStart()
	}
	time.Sleep(time.Millisecond)
	for range 8 {
		s.readEnd(n)
	}
	if b := s.DeepBytes.Load(); b != 8*n {
		t.Errorf("8 reads under load: %d bytes counted, want %d", b, 8*n)
	}
	if ns := s.DeepNs.Load(); ns < int64(time.Millisecond) {
		t.Errorf("8 reads under load for 1 ms: %d ns counted", ns)
	}
	if s.deep.Load() || s.active.Load() != 0 {
		t.Error("a stretch left open with no read in flight")
	}
}
