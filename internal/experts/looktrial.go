package experts

// lookTrial decides whether the lookahead predicts at all by timing the
// steps both ways. A prediction is the next layer's router and a norm, on
// the decode's critical path at every layer of every step; its reads take
// disk bandwidth and the readers' processor time from the misses, and the
// slots they fill evict records that might have hit. What that costs and
// what the useful prefetches save both depend on the disk, the pool and
// the routes: on the 48-layer qwen3-30b-a3b synth with a fast disk the
// lookahead decoded slower than none in 9 of 10 alternating pairs, and a
// gate that valued only the predictions' own time against their useful
// reads still predicted where it did not pay (README, "The lookahead
// costs more than it saves"). So the stream measures the whole effect
// instead of modelling it: it runs pairs of windows of lookWindow steps,
// one predicting and one not (in turn first), and sets the mean step
// times with and without predictions against each other, over the pairs
// so far with each older pair's steps weighing lookKeep times the next
// one's. Once the difference is at least twice its standard error, or
// after lookPairs pairs, it runs the faster way for a stretch, then times
// another pair. The stretch is lookRun steps, twice the last one after
// a pair that confirms the way, up to lookRunMax, so that where one way
// is plainly faster the trials' own cost (a window in the slower way)
// fades, and back to lookRun when the way changes. Where the timing
// cannot tell the ways apart (after lookPairs pairs, or a pair after a
// run), the trial predicts if its prefetches were used more often than
// read for nothing, counted over the decode steps since it began (those
// of at most lookMaxRows rows), each earlier pair's and the run before
// it weighing lookKeep times the next's: at equal speed the way
// whose steps wait on fewer misses is the one that holds up when the
// disk slows (another process reading, a page cache gone cold), and its
// extra reads cost the disk less than one a miss it hides (where they
// are more, the trial pauses: tiny-qwen3-5-moe's decode wasted 1.4 reads
// a useful one, the 48-layer qwen3-30b-a3b synth's about 20). Only steps
// of the pair's row count are timed (a prefill chunk is not a decode
// step), and a gap longer than adaptMaxGap is idle time, not a step; a pair with
// fewer than half its steps timed on either side is dropped. What is
// predicted never changes the logits.
type lookTrial struct {
	on      bool // whether the steps predict now
	left    int  // steps left in the current window or run
	window  int  // 0: a run; 1, 2: a pair's first, second window
	first   bool // whether the current pair's first window predicts
	rows    int  // the row count the pair times (0: not yet seen)
	pairs   int  // pairs timed since the last run's way was chosen
	run     int  // the last run's length, steps (0: none yet)
	runOn   bool // and whether it predicted (true before the first)
	dropped int  // pairs dropped in a row
	// The timed steps: the current pair's, and the weighted sums over
	// the pairs before.
	pair, all lookSums
	// The prefetches used and wasted in the timed kind of step since the
	// last pair ended, the weighted sums over the pairs before, and the
	// counters' values at the last step.
	use, allUse, seen [2]int64
	last              int64 // when the last step ended (s.now), 0 before the first
	maxRows           int   // the largest row count Predicting saw this step
}

// lookSums are timed steps without [0] and with [1] predictions: how
// many, their time and their squared time, in ms.
type lookSums struct{ n, sum, sq [2]float64 }

// The lookahead's trial: steps a window lasts, the most pairs timed before
// a run, the weight of each older pair, the steps of the shortest and
// longest runs, and the most rows of a step it times.
const (
	lookWindow  = 8
	lookPairs   = 3
	lookKeep    = 0.5
	lookRun     = 64
	lookRunMax  = 1024
	lookMaxRows = 16
)

// Predicting implements model.LookWeigher: whether the step, of rows rows,
// makes predictions (lookTrial).
func (s *Stream) Predicting(rows int) bool {
	t := &s.trial
	t.maxRows = max(t.maxRows, rows)
	return t.on
}

// stepLookahead ends a step (as the last layer's begins) for lookTrial,
// and sets whether the next one predicts.
func (s *Stream) stepLookahead() {
	if !s.o.Lookahead {
		return
	}
	t := &s.trial
	now := s.now()
	gap, rows, first := now-t.last, t.maxRows, t.last == 0
	t.last, t.maxRows = now, 0
	s.stats.LookSteps.Add(1)
	if !t.on {
		s.stats.LookPaused.Add(1)
	}
	if s.o.lookAlways { // predict at every step, untimed
		t.on = true
		return
	}
	// The prefetches settled during the step count where it is one the
	// trial would time (a prefill chunk's predictions, a union over its
	// rows, are nearly all used, and would outweigh a decode's waste).
	use := [2]int64{s.stats.LookUseful.Load(), s.stats.LookWasted.Load()}
	if rows > 0 && rows <= lookMaxRows {
		for i := range 2 {
			t.use[i] += use[i] - t.seen[i]
		}
	}
	t.seen = use
	if first || rows == 0 || gap <= 0 || gap > adaptMaxGap {
		// The first step, a step without predictions asked for (a model
		// whose forward does not weigh them), or idle time: untimed, and
		// the windows wait.
		return
	}
	if t.window > 0 && rows <= lookMaxRows {
		if t.rows == 0 {
			t.rows = rows
		}
		if rows == t.rows {
			i, ms := 0, float64(gap)/1e6
			if t.on {
				i = 1
			}
			t.pair.n[i]++
			t.pair.sum[i] += ms
			t.pair.sq[i] += ms * ms
		}
	}
	if t.left--; t.left > 0 {
		return
	}
	switch t.window {
	case 0:
		t.startPair()
	case 1:
		t.window, t.on, t.left = 2, !t.first, lookWindow
	case 2:
		s.endPair()
	}
}

// begin starts the trial: a pair, predicting first.
func (t *lookTrial) begin() {
	t.runOn = true
	t.startPair()
}

// startPair begins a pair of windows, the first predicting when the last
// pair's first did not.
func (t *lookTrial) startPair() {
	t.first = !t.first
	t.window, t.on, t.left = 1, t.first, lookWindow
	t.rows, t.pair = 0, lookSums{}
}

// endPair weighs a pair's windows and either starts another pair or a run.
func (s *Stream) endPair() {
	t := &s.trial
	if t.pair.n[0] < lookWindow/2 || t.pair.n[1] < lookWindow/2 {
		// Too few steps timed (the row counts change from step to
		// step): try again, and after lookPairs such pairs run the
		// way before (predicting, at first) rather than trial forever.
		if t.dropped++; t.dropped < lookPairs {
			t.startPair()
			return
		}
		t.dropped, t.pairs = 0, 0
		t.run = max(t.run, lookRun)
		t.window, t.on, t.left = 0, t.runOn, t.run
		return
	}
	t.dropped = 0
	a := &t.all
	for i := range 2 {
		a.n[i] = lookKeep*a.n[i] + t.pair.n[i]
		a.sum[i] = lookKeep*a.sum[i] + t.pair.sum[i]
		a.sq[i] = lookKeep*a.sq[i] + t.pair.sq[i]
		t.allUse[i] = int64(lookKeep*float64(t.allUse[i])) + t.use[i]
	}
	t.use = [2]int64{}
	t.pairs++
	// The mean step time each way, the variance of a step about it, and
	// the standard error of the difference of the means.
	var mean, se2 [2]float64
	for i := range 2 {
		mean[i] = a.sum[i] / a.n[i]
		se2[i] = max(a.sq[i]/a.n[i]-mean[i]*mean[i], 0) / a.n[i]
	}
	d := mean[1] - mean[0] // ms a step predicting adds
	clear := d*d > 4*(se2[0]+se2[1])
	s.stats.LookGainNs.Store(int64(-d * 1e6))
	if !clear && t.run == 0 && t.pairs < lookPairs {
		t.startPair()
		return
	}
	on := d < 0
	if !clear {
		on = t.allUse[0] > t.allUse[1] // within its error: predict if mostly used
	}
	if t.run == 0 || on != t.runOn {
		t.run = lookRun
	} else {
		t.run = min(2*t.run, lookRunMax)
	}
	t.window, t.on, t.runOn, t.left, t.pairs = 0, on, on, t.run, 0
}
