package experts

import "testing"

// TestLookTrial: the trial times pairs of windows with and without
// predictions and runs the faster way once the difference is clear, for
// longer after each pair that confirms it (up to lookRunMax), and the
// shortest run again once the other way is clearly faster; steps of
// another row count (a prefill chunk), idle gaps and steps that asked
// nothing are not timed. Where the times cannot tell the ways apart, it
// predicts if the prefetches are used more often than wasted.
func TestLookTrial(t *testing.T) {
	clock := int64(1e9)
	// trial gives a stream whose trial has just begun, on clock.
	trial := func() *Stream {
		s := &Stream{o: Options{Lookahead: true}, now: func() int64 { return clock }}
		s.stats.init(2, 16, 4)
		s.trial.begin()
		return s
	}
	s := trial()
	// step runs one step of rows rows taking onNs with predictions and
	// offNs without, and reports whether it predicted.
	step := func(rows int, onNs, offNs int64) bool {
		on := s.Predicting(rows)
		if s.Predicting(rows) != on {
			t.Fatal("Predicting changed inside a step")
		}
		if on {
			clock += onNs
		} else {
			clock += offNs
		}
		s.stepLookahead()
		return on
	}
	// runs steps until the trial starts a run, and returns how many steps
	// that took and the run's way.
	settle := func(onNs, offNs int64) (int, bool) {
		n := 0
		for s.trial.window != 0 {
			step(1, onNs, offNs)
			if n++; n > 10*lookWindow*lookPairs {
				t.Fatal("no run after 10 trials' steps")
			}
		}
		return n, s.trial.on
	}
	step(1, 0, 0) // the first step is untimed
	// Predicting clearly slower: the first run, after one pair, is
	// without.
	n, on := settle(100e6, 90e6)
	if on || n != 2*lookWindow {
		t.Fatalf("first run: predicting %v after %d steps, want false after %d", on, n, 2*lookWindow)
	}
	if g := s.stats.LookGainNs.Load(); g != -10e6 {
		t.Errorf("gain %d ns, want -10 ms", g)
	}
	// Each confirming pair doubles the run, up to lookRunMax.
	want := lookRun
	for range 7 {
		k := 0
		for s.trial.window == 0 {
			if step(1, 100e6, 90e6) {
				t.Fatal("predicted in a run without")
			}
			k++
		}
		if k != want {
			t.Fatalf("run of %d steps, want %d", k, want)
		}
		if n, on = settle(100e6, 90e6); on || n != 2*lookWindow {
			t.Fatalf("after a pair of %d steps: predicting %v", n, on)
		}
		want = min(2*want, lookRunMax)
	}
	st := s.Stats()
	if st.LookSteps == 0 || st.LookPaused*2 < st.LookSteps {
		t.Errorf("counters: %d steps, %d paused", st.LookSteps, st.LookPaused)
	}
	// Prefill chunks, idle gaps and steps without predictions asked
	// change nothing: the run goes on, the estimate stays.
	left, all := s.trial.left, s.trial.all
	step(512, 500e6, 500e6)
	clock += 2 * adaptMaxGap
	step(1, 100e6, 90e6)
	s.stepLookahead()
	if s.trial.left != left-1 || s.trial.all != all {
		t.Errorf("untimed steps: %d left (was %d), sums %v (was %v)", s.trial.left, left, s.trial.all, all)
	}
	// Predicting faster now: the trial turns within lookPairs pairs and
	// runs the shortest run again.
	for s.trial.window == 0 {
		step(1, 80e6, 90e6)
	}
	turned := false
	for range lookPairs {
		if _, on = settle(80e6, 90e6); on {
			turned = true
			break
		}
		for s.trial.window == 0 {
			step(1, 80e6, 90e6)
		}
	}
	if !turned || s.trial.left != lookRun || s.trial.run != lookRun {
		t.Fatalf("predicting faster: on %v, run of %d (%d left), want on and %d", turned, s.trial.run, s.trial.left, lookRun)
	}
	// A pair whose second window has steps of another row count (verify
	// steps of 2 rows) times only the first count, and is dropped.
	s.trial.startPair()
	for s.trial.window == 1 {
		step(1, 80e6, 90e6)
	}
	for range lookWindow - 1 {
		step(2, 80e6, 90e6)
	}
	if p := s.trial.pair.n; p != [2]float64{0, lookWindow} {
		t.Errorf("mixed rows: timed %v steps", p)
	}
	all = s.trial.all
	step(2, 80e6, 90e6)
	if s.trial.window != 1 || s.trial.all != all {
		t.Errorf("a pair timed one way only: window %d after it, sums %v (were %v)", s.trial.window, s.trial.all, all)
	}
	// Row counts that change with every step: after lookPairs dropped
	// pairs, a run the way before (predicting).
	for k := 0; s.trial.window != 0; k++ {
		if k > 2*lookWindow*lookPairs {
			t.Fatal("no run while every pair is dropped")
		}
		step(1+k%4, 80e6, 90e6)
	}
	if !s.trial.on || s.trial.all != all {
		t.Errorf("after dropped pairs: predicting %v, sums %v (were %v)", s.trial.on, s.trial.all, all)
	}
	// Noisy steps, as fast either way: no difference is clear, so the
	// first run waits for lookPairs pairs.
	noisy := trial()
	k := 0
	for ; noisy.trial.window != 0; k++ {
		noisy.Predicting(1)
		clock += int64(80e6 + 40e6*(k%2))
		noisy.stepLookahead()
	}
	if k != 1+2*lookWindow*lookPairs {
		t.Errorf("noisy steps: first run after %d steps, want %d", k, 1+2*lookWindow*lookPairs)
	}
	if noisy.trial.on {
		t.Error("noisy steps, no prefetch used: the first run predicts")
	}
	// As fast either way, the way is the prefetches' usefulness: a run
	// predicting while they are mostly used, without once the reads
	// they waste outnumber them.
	for _, c := range []struct {
		useful, wasted int64
		want           bool
	}{{3, 1, true}, {1, 3, false}, {5, 0, true}} {
		for n := 0; ; n++ {
			if n > 1024+2*lookWindow*lookPairs {
				t.Fatalf("%d used, %d wasted a step: no run predicting %v", c.useful, c.wasted, c.want)
			}
			if noisy.Predicting(1) {
				noisy.stats.LookUseful.Add(c.useful)
				noisy.stats.LookWasted.Add(c.wasted)
			}
			clock += int64(80e6 + 40e6*(n%2))
			noisy.stepLookahead()
			if noisy.trial.window == 0 && noisy.trial.left == noisy.trial.run && noisy.trial.on == c.want {
				break
			}
		}
	}
	// A clear difference in time outweighs the prefetches' usefulness,
	// and a prefill chunk's prefetches (nearly all used) do not count:
	// the first run of each fresh trial is without predictions.
	for _, c := range []struct {
		what             string
		prefill          bool
		onNs, offNs      int64
		useful, wasted   int64
		pUseful, pWasted int64 // a prefill chunk's, every fourth step
	}{
		{"predicting clearly slower, prefetches all used", false, 100e6, 90e6, 5, 0, 0, 0},
		{"as fast, decode prefetches mostly wasted between used prefill ones", true, 0, 0, 1, 3, 100, 0},
	} {
		tr := trial()
		for n := 0; tr.trial.window != 0; n++ {
			if n > 20*lookWindow*lookPairs {
				t.Fatalf("%s: no run", c.what)
			}
			rows, u, w := 1, c.useful, c.wasted
			if c.prefill && n%4 == 3 {
				rows, u, w = 512, c.pUseful, c.pWasted
			}
			on := tr.Predicting(rows)
			if on {
				tr.stats.LookUseful.Add(u)
				tr.stats.LookWasted.Add(w)
			}
			switch {
			case c.onNs == 0:
				clock += int64(80e6 + 40e6*(n%2))
			case on:
				clock += c.onNs
			default:
				clock += c.offNs
			}
			tr.stepLookahead()
		}
		if tr.trial.on {
			t.Errorf("%s: the first run predicts", c.what)
		}
	}
	// Off: nothing counted.
	off := &Stream{now: func() int64 { return clock }}
	off.stats.init(1, 8, 1)
	off.stepLookahead()
	if off.stats.LookSteps.Load() != 0 {
		t.Fatal("counted a step with the lookahead off")
	}
}
