package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
)

var (
	// errBusy is returned by submit when the slots and the queue are full.
	errBusy = errors.New("server busy: all slots and the queue are full")
	// errClosed is returned by submit once the server is shutting down.
	errClosed = errors.New("server shutting down")
)

// job is one generation request as the scheduler sees it. The handler
// creates it, submits it, and reads what the scheduler publishes into it;
// the scheduler never blocks on a slow client, it only appends under mu
// and pokes notify.
type job struct {
	ctx     context.Context // the request's context; cancelled when the client goes away
	prompt  []int
	marks   []int // prompt lengths worth a prefix-cache snapshot (message boundaries)
	opts    engine.GenOptions
	reuse   bool // may start from a cached prefix (false when penalties need the full history)
	live    bool // publishes the reply's figures with each text (sluice_stats)
	stop    stopper
	created time.Time

	notify chan struct{} // capacity 1: "something new"

	mu       sync.Mutex
	text     []byte // published text not yet taken
	ntokens  int    // tokens generated so far
	stats    replyStats
	started  bool // holds a slot
	finished bool
	res      result
}

// result is how a job ended.
type result struct {
	finish       string // "stop" or "length"
	err          error  // non-nil when the job failed or was cancelled
	promptTokens int
	cachedTokens int // prompt tokens resumed from the prefix cache
	genTokens    int
	stats        replyStats // the reply's own figures (the sluice extension)
}

func newJob(ctx context.Context, prompt []int, opts engine.GenOptions, stops []string) *job {
	return &job{ctx: ctx, prompt: prompt, opts: opts, stop: stopper{stops: stops},
		created: time.Now(), notify: make(chan struct{}, 1)}
}

func (j *job) poke() {
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// publish appends text for the handler, with the reply's figures so far.
func (j *job) publish(text string, ntokens int, st replyStats) {
	j.mu.Lock()
	j.text = append(j.text, text...)
	j.ntokens = ntokens
	j.stats = st
	j.mu.Unlock()
	j.poke()
}

// end records the result; the handler sees finished on its next take.
func (j *job) end(r result) {
	j.mu.Lock()
	j.finished, j.res = true, r
	j.mu.Unlock()
	j.poke()
}

// take returns the text published since the last take, the reply's
// figures so far, and the result once the job has finished.
func (j *job) take() (text string, finished bool, r result, st replyStats) {
	j.mu.Lock()
	defer j.mu.Unlock()
	text = string(j.text)
	j.text = j.text[:0]
	return text, j.finished, j.res, j.stats
}

// stopper cuts generated text at the first stop sequence, holding back a
// tail that could still become one, so that streamed text never shows part
// of a stop sequence.
type stopper struct {
	stops []string
	held  string
}

// add takes newly generated text and returns what may be emitted, and
// whether a stop sequence has been reached (the text before it is
// returned; the rest is dropped).
func (s *stopper) add(text string) (string, bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	buf := s.held + text
	first := -1
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		s.held = ""
		return buf[:first], true
	}
	hold := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(buf)); k > hold; k-- {
			if strings.HasSuffix(buf, st[:k]) {
				hold = k
				break
			}
		}
	}
	s.held = buf[len(buf)-hold:]
	return buf[:len(buf)-hold], false
}

// flush returns the held-back tail at the end of generation.
func (s *stopper) flush() string {
	h := s.held
	s.held = ""
	return h
}

// task is a job holding a slot: its own state and sequence.
type task struct {
	j      *job
	st     *model.State
	seq    *engine.Sequence
	fed    int // prompt tokens in st
	cached int // of which resumed from the prefix cache
	marks  []int
	first  bool // first token published
	x      replyExperts
}

// scheduler owns the engine's one runner. A single goroutine interleaves
// the active sequences: each takes a turn of a prefill chunk or a few
// decode steps, then the next. Each active sequence has its own state, so
// switching between them costs nothing; the number of live states (slots)
// is bounded, and requests beyond them wait in a bounded queue.
type scheduler struct {
	e        *engine.Engine
	slots    int
	maxQueue int
	steps    int // decode steps per turn
	prefill  int // prompt tokens per turn
	minMark  int // shortest prefix worth caching
	met      *metrics

	mu     sync.Mutex
	queue  []*job
	active int // jobs holding slots
	closed bool
	wake   chan struct{} // capacity 1

	// Owned by the loop goroutine.
	free  []*model.State
	cache *prefixCache
	done  chan struct{}
}

// submit queues j, or refuses it when the slots and the queue are full.
func (s *scheduler) submit(j *job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	if s.active+len(s.queue) >= s.slots+s.maxQueue {
		return errBusy
	}
	s.queue = append(s.queue, j)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// close refuses new jobs; the loop exits once the queue and slots drain.
// In-flight jobs continue until their contexts are cancelled.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// load reports the jobs holding slots and waiting.
func (s *scheduler) load() (active, queued int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active, len(s.queue)
}

// loop runs until close has been called and no work is left.
func (s *scheduler) loop() {
	defer close(s.done)
	var act []*task
	for {
		s.mu.Lock()
		// Drop queued jobs whose clients have gone, then fill free slots.
		q := s.queue[:0]
		for _, j := range s.queue {
			if err := j.ctx.Err(); err != nil {
				j.end(result{err: err, promptTokens: len(j.prompt)})
				continue
			}
			q = append(q, j)
		}
		clear(s.queue[len(q):])
		s.queue = q
		var admit []*job
		for len(s.queue) > 0 && s.active < s.slots {
			admit = append(admit, s.queue[0])
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.active++
		}
		if len(s.queue) == 0 {
			s.queue = nil // let the backing array go
		}
		idle := len(act) == 0 && len(admit) == 0
		closed := s.closed
		s.mu.Unlock()
		for _, j := range admit {
			// A request that starts while others run shares the expert
			// pool with them: its new text leaves their counts be.
			j.opts.KeepPoolCounts = len(act) > 0
			if t := s.start(j); t != nil {
				act = append(act, t)
			} else {
				s.release(nil)
			}
		}
		if idle {
			if closed {
				return
			}
			<-s.wake
			continue
		}
		keep := act[:0]
		for _, t := range act {
			if s.safeTurn(t) {
				keep = append(keep, t)
			} else {
				s.release(t.st)
			}
		}
		clear(act[len(keep):])
		act = keep
	}
}

// release returns a slot and its state.
func (s *scheduler) release(st *model.State) {
	if st != nil {
		s.free = append(s.free, st)
	}
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
}

// start gives j a state, resuming from the longest cached prefix of its
// prompt; it returns nil (having ended j) on failure.
func (s *scheduler) start(j *job) *task {
	if err := j.ctx.Err(); err != nil {
		j.end(result{err: err, promptTokens: len(j.prompt)})
		return nil
	}
	var st *model.State
	if n := len(s.free); n > 0 {
		st, s.free = s.free[n-1], s.free[:n-1]
	} else {
		var err error
		if st, err = s.e.NewState(); err != nil {
			j.end(result{err: fmt.Errorf("allocating a sequence state: %v", err), promptTokens: len(j.prompt)})
			return nil
		}
	}
	t := &task{j: j, st: st}
	// At least one prompt token must be fed to get the next token's
	// logits, so a cached entry may cover at most len(prompt)-1 tokens;
	// snapshots are taken one token short of a whole prompt for the same
	// reason, so a repeated prompt recomputes a single token.
	n := len(j.prompt)
	if e := s.cacheLookup(j, n-1); e != nil {
		if err := s.e.CopyState(st, e.st); err == nil {
			t.fed, t.cached = len(e.tokens), len(e.tokens)
		}
	}
	if t.fed == 0 {
		st.Reset()
	}
	if t.cached > 0 {
		s.met.cacheHits.Add(1)
		s.met.cachedTokens.Add(int64(t.cached))
	} else if s.cache != nil && j.reuse {
		s.met.cacheMisses.Add(1)
	}
	for _, m := range append(j.marks, n-1) {
		if m > t.fed && m < n && m >= s.minMark && (len(t.marks) == 0 || m > t.marks[len(t.marks)-1]) {
			t.marks = append(t.marks, m)
		}
	}
	seq, err := s.e.NewSequence(st, j.opts)
	if err != nil {
		s.free = append(s.free, st)
		j.end(result{err: err, promptTokens: n})
		return nil
	}
	t.seq = seq
	j.mu.Lock()
	j.started = true
	j.mu.Unlock()
	s.met.queueWait.observe(time.Since(j.created).Seconds())
	return t
}

func (s *scheduler) cacheLookup(j *job, limit int) *cacheEntry {
	if s.cache == nil || !j.reuse || limit < 1 {
		return nil
	}
	return s.cache.lookup(j.prompt, limit)
}

// safeTurn runs turn, turning a panic (a bug) into that request's error
// so that one bad request cannot take the server down.
func (s *scheduler) safeTurn(t *task) (alive bool) {
	defer func() {
		if r := recover(); r != nil {
			s.finish(t, fmt.Errorf("internal error: %v", r))
			alive = false
		}
	}()
	return s.turn(t)
}

// turn runs one prefill chunk or a few decode steps of t and reports
// whether t is still active.
func (s *scheduler) turn(t *task) bool {
	j := t.j
	ctx := j.ctx
	if err := ctx.Err(); err != nil {
		s.finish(t, err)
		return false
	}
	pos0 := t.st.Pos
	defer func() { s.met.forwarded(t.st.Pos - pos0) }()
	n := len(j.prompt)
	if t.fed < n {
		end := min(t.fed+s.prefill, n)
		if len(t.marks) > 0 && t.marks[0] < end {
			end = t.marks[0]
		}
		x0 := s.expertSnap()
		if err := t.seq.Prefill(ctx, j.prompt[t.fed:end]); err != nil {
			s.finish(t, err)
			return false
		}
		t.x.prefillBytes += s.expertSnap().BytesRead - x0.BytesRead
		s.met.prefillTokens.Add(int64(end - t.fed))
		t.fed = end
		if len(t.marks) > 0 && t.marks[0] == end {
			t.marks = t.marks[1:]
			s.save(j.prompt[:end], t.st)
		}
		if t.fed < n || !t.seq.Done() {
			return true
		}
	}
	for i := 0; i < s.steps && !t.seq.Done(); i++ {
		x0, p0 := s.expertSnap(), t.st.Pos
		toks, text, err := t.seq.Step(ctx)
		if err != nil {
			s.finish(t, err)
			return false
		}
		t.x.add(x0, s.expertSnap(), t.st.Pos-p0, s.met.expertsPerToken, s.e.Stream == nil)
		if !t.first && len(toks) > 0 {
			t.first = true
			s.met.ttft.observe(time.Since(j.created).Seconds())
		}
		s.met.genTokens.Add(int64(len(toks)))
		s.met.rate.add(len(toks))
		out, stopped := j.stop.add(text)
		if out != "" || len(toks) > 0 {
			j.publish(out, len(t.seq.Tokens()), s.liveStats(t))
		}
		if stopped {
			s.finishStop(t)
			return false
		}
	}
	if t.seq.Done() {
		out, stopped := j.stop.add(t.seq.Flush())
		if !stopped {
			out += j.stop.flush()
		}
		if out != "" {
			j.publish(out, len(t.seq.Tokens()), s.liveStats(t))
		}
		if stopped {
			s.finishStop(t)
			return false
		}
		s.finish(t, nil)
		return false
	}
	return true
}

// finishStop ends t at a stop sequence.
func (s *scheduler) finishStop(t *task) {
	t.j.end(result{finish: "stop", promptTokens: len(t.j.prompt), cachedTokens: t.cached, genTokens: len(t.seq.Tokens()), stats: t.stats(s.e.Stream == nil)})
	s.met.finished("stop")
}

// finish ends t with err, or normally; a normal end also saves the final
// state (the prompt and the reply so far), from which a follow-up turn of
// the conversation can resume.
func (s *scheduler) finish(t *task, err error) {
	r := result{err: err, promptTokens: len(t.j.prompt), cachedTokens: t.cached}
	if t.seq != nil {
		r.genTokens = len(t.seq.Tokens())
		r.stats = t.stats(s.e.Stream == nil)
	}
	if err != nil {
		t.j.end(r)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			s.met.finished("cancelled")
		} else {
			s.met.finished("error")
		}
		return
	}
	r.finish = "length"
	if t.seq.Stats().StopReason == "eos" {
		r.finish = "stop"
	}
	t.j.end(r)
	s.met.finished(r.finish)
	n := len(t.j.prompt)
	if s.cache != nil && t.st.Pos > n && t.st.Pos-n <= len(t.seq.Tokens()) {
		key := make([]int, 0, t.st.Pos)
		key = append(append(key, t.j.prompt...), t.seq.Tokens()[:t.st.Pos-n]...)
		s.save(key, t.st)
	}
}

// save puts a copy of st, which has consumed tokens, into the prefix cache.
func (s *scheduler) save(tokens []int, st *model.State) {
	if s.cache == nil || !s.cache.put(tokens, st) {
		return
	}
	s.met.cacheStores.Add(1)
	s.met.cacheEntries.Store(int64(len(s.cache.entries)))
	s.met.cacheBytes.Store(s.cache.used)
}
