package experts

import (
	"fmt"
	"strings"
)

// Policy chooses which pool slot a new record replaces.
type Policy string

// Eviction policies.
const (
	// LRU evicts the least recently used record.
	LRU Policy = "lru"
	// FLRU is frequency-weighted LRU: a record's recency is credited with
	// one token's worth of layer steps per recent use (use counts halve
	// every 64 tokens), so experts the router keeps coming back to outlive
	// a burst of one-off ones.
	FLRU Policy = "flru"
	// LRFU ranks a record by its uses weighted by how recent they are (a
	// use counts half as much 32 tokens later: LRFU's combined recency and
	// frequency), scaled by how soon its layer comes round again: of two
	// records used alike, the one whose layer runs next stays. Recency in
	// layer steps, as LRU and FLRU count it, is the wrong way round for a
	// decode, which visits the layers in a cycle: the record used longest
	// ago is the one of the next layer, needed first.
	LRFU Policy = "lrfu"
	// Markov ranks a record by the probability that its layer's next
	// decode step chooses it, learned online from what the layer chose one
	// token after choosing each expert (a first-order Markov chain per
	// layer, its counts drawn towards LRFU's decayed frequencies), scaled
	// as LRFU scales by how soon the layer comes round again. Experts
	// that follow the ones just chosen stay, where LRFU, which knows only
	// how often and how lately each was chosen, would evict them. Where
	// a layer repeats the experts it just chose more often than their
	// frequencies explain (its excess repeat rate, learned as it runs),
	// the estimate leans that much towards them, so that at a change of
	// text the new text's experts are kept from the first token rather
	// than once the old text's counts have aged.
	Markov Policy = "markov"
)

// Policies lists the valid policies.
var Policies = []Policy{LRU, FLRU, LRFU, Markov}

func (p Policy) valid() error {
	for _, q := range Policies {
		if p == q {
			return nil
		}
	}
	names := make([]string, len(Policies))
	for i, q := range Policies {
		names[i] = string(q)
	}
	return fmt.Errorf("eviction policy %q unknown (want %s)", p, strings.Join(names, ", "))
}

// lrfuGrowth is 2^(1/32), the factor by which LRFU's weight of a use
// grows each token: weighting later uses up instead of decaying every
// record's count down (forward decay) keeps an update O(1), and a multiply
// by a constant, unlike exp or log, rounds the same on every platform.
// Half-lives of 20 to 65 tokens hit within 1% of each other on the
// recorded routes; 32 is between.
const lrfuGrowth = 1.0218971486541166

// lrfuWindow is how many tokens' uses LRFU's decay weighs as much as a
// use now: a record used on every token has a count of about lrfuWindow
// times the weight of a use (1 + 1/g + 1/g² + … with g = lrfuGrowth).
const lrfuWindow = 1 / (1 - 1/lrfuGrowth)

// lrfuRescale bounds the weight: past it every count and the weight are
// scaled down by it, exactly (a power of two), once every 1920 tokens.
const lrfuRescale = 0x1p60

// evictor is a policy's state and scoring, shared by the Stream and by
// SimulateHits so that the offline replay ranks slots exactly as the pool
// does.
type evictor struct {
	p      Policy
	L, E   int
	credit float64   // FLRU: one token's worth of steps per use
	freq   []float32 // [record] use count, halved every 64 tokens (FLRU)
	key    []float64 // [record] sum of the weights of its uses (LRFU)
	w      float64   // weight of a use now (LRFU)
	perRow float64   // weight of one row of the current step's uses, in uses (rowWeight)
	last   int       // the last step's layer (L before the first)
	scale  []float64 // [layer] LRFU's scale of a record of the layer during the current step
	mk     *markov   // Markov's state; it also keeps LRFU's
	// changed[l] says the bases of layer l's records may have changed
	// since victimSet last looked, all that every layer's may have.
	changed []bool
	all     bool
}

func newEvictor(p Policy, L, E int) evictor {
	v := evictor{p: p, L: L, E: E, credit: float64(L), freq: make([]float32, L*E), w: 1, perRow: 1, last: L, changed: make([]bool, L)}
	if p == LRFU || p == Markov {
		v.key = make([]float64, L*E)
		v.scale = make([]float64, L)
	}
	if p == Markov {
		v.mk = newMarkov(L, E)
	}
	return v
}

// evictorBytes is what policy p's state takes for L layers of E experts,
// for the memory budget.
func evictorBytes(p Policy, L, E int) int64 {
	n := int64(L)*int64(E)*(4+8) + int64(L)*(8+1) // freq, key; scale, changed
	if p == Markov {
		n += markovBytes(L, E)
	}
	return n
}

// tick moves the policy to layer step clock, a step of layer of tokens
// rows (rowWeight). A pass through the layers (a token, or a prefill
// chunk) starts where the layer does not follow the last step's: at layer
// 0, or at the first expert layer of a model whose leading layers are
// dense (DeepSeek's, GLM's), which never take a step. Passes counted at
// layer 0 alone never came for those: LRFU's weight never grew, so its
// counts (and Markov's estimates, which start from them) kept no recency
// at all.
func (v *evictor) tick(clock int64, layer, tokens int) {
	v.rowWeight(tokens)
	start := layer <= v.last
	v.last = layer
	if v.mk != nil {
		v.mk.tick(v, layer, start)
	}
	if v.scale != nil {
		// Linear from 1 (the next layer) down to 1/2 (this one, whose
		// next use is a whole token away): a use's weight doubles in 32
		// tokens, so the scale moves a record by at most 32 tokens of
		// age, and only between records of like counts.
		for l := range v.scale {
			d := (l - layer + v.L) % v.L
			if d == 0 {
				d = v.L
			}
			v.scale[l] = 1 - float64(d)/float64(2*v.L)
		}
	}
	if clock%int64(64*v.L) == 0 {
		// Halve use counts every 64 tokens so that frequency follows
		// the recent past (FLRU).
		for i := range v.freq {
			v.freq[i] *= 0.5
		}
		v.rebased(FLRU)
	}
	if v.key != nil && start {
		v.grow(lrfuGrowth)
	}
}

// rebased says that, under policy p, every record's base has changed
// (counts halved or divided, a use's weight grown): when p is the
// evictor's, victimSet rescans every layer at its next eviction instead
// of the layers it was told of.
func (v *evictor) rebased(p Policy) { v.all = v.all || v.p == p }

// grow multiplies the weight of a use by f (at most lrfuRescale),
// rescaling every count once the weight passes lrfuRescale.
func (v *evictor) grow(f float64) {
	v.rebased(LRFU) // a prefetched record's base has a use's weight in it
	v.w *= f
	if v.w >= lrfuRescale {
		for i := range v.key {
			v.key[i] /= lrfuRescale
		}
		v.w /= lrfuRescale
	}
}

// newTextAge is how much less than a use now a use of the text before a
// new, unrelated one weighs (newText): eight half-lives of LRFU's decay
// (256 tokens), and eight of FLRU's halvings. On bench decodes of the
// four trained tiny models (each trial a new random text through one
// pool), a 10% pool hit 0.94, 0.94, 0.98 and 0.88 of the optimum with it
// against 0.89, 0.90, 0.92 and 0.85 without; 2^6 and 2^7 fell between,
// and forgetting all of it (2^31) hit as 2^8 does. The router-routed
// synth, whose random texts all route alike, loses by it at a 5% pool
// (hit rate 0.81 to 0.79) and gains at 10% (0.962 to 0.975).
const newTextAge = 0x1p8

// newText starts a new, unrelated text (a new request, not a continued
// one): the uses counted so far weigh newTextAge times less against the
// new text's. They were the old text's: without it, an expert the new
// text chose on every token ranked below one the old text chose on every
// token for the new text's first 32 tokens (LRFU's half-life), and the
// Markov estimates start from LRFU's counts. The counts stay as
// tie-breakers among experts the new text has not used. Markov's
// transition counts are kept: which expert follows which is the model's,
// not the text's.
func (v *evictor) newText() {
	for i := range v.freq {
		v.freq[i] /= newTextAge
	}
	v.rebased(FLRU)
	if v.key != nil {
		v.grow(newTextAge)
	}
}

// use counts rows uses of rec by the current step; recent is false for a
// prefill expert outside its layer's share, which LRFU then does not
// credit, so that its slot is recycled first (as LRU's old stamp does).
func (v *evictor) use(rec int32, rows int, recent bool) {
	v.changed[int(rec)/v.E] = true
	v.freq[rec] += float32(rows)
	if v.key != nil && recent {
		u := float64(float64(rows) * v.perRow)
		v.key[rec] += float64(u * v.w)
	}
	if v.mk != nil {
		v.mk.use(rec, rows)
	}
}

// rowWeight sets what a row of the current step's uses weighs in LRFU's
// counts (which Markov's estimates start from), for a step of that many
// tokens (rows): one use up to lrfuWindow rows, and past that lrfuWindow
// uses shared among the rows. A prefill chunk is many tokens at once; counted
// a use a row, the experts its text chose most outweighed the decode's
// own uses for about 200 tokens (a 256-row chunk's favourite, chosen by
// 100 rows, needs 100 decode uses at one weight, and the weight doubles
// every 32 tokens), where the decode chose differently. Had its tokens
// come one at a time, the decay would have left no more than lrfuWindow
// of them at full weight. A decode step of several sequences (a few
// rows) still counts each row.
func (v *evictor) rowWeight(tokens int) {
	v.perRow = 1
	if t := float64(tokens); t > lrfuWindow {
		v.perRow = lrfuWindow / t
	}
}

// score ranks a resident record for eviction during the current step: the
// lowest goes first. last is the step that last used it; pre says a
// prefetch read it for a step still to come, which LRFU counts as a use
// now so that the next miss does not evict it before that step.
func (v *evictor) score(rec int32, last int64, pre bool) float64 {
	v.prepare()
	return float64(v.base(rec, last, pre) * v.layerScale(int(rec)/v.E))
}

// prepare brings the policy's estimates up to date with the current step
// before records are scored (Markov learns from the step once, before its
// first eviction).
func (v *evictor) prepare() {
	if v.mk != nil {
		v.mk.finish(v)
	}
}

// base is the part of rec's score that is its own: score is base times
// its layer's scale (layerScale), which the policy changes for every
// layer at every step; a base changes only with a use of the record, a
// step's estimates for its layer (changed) or a new token (all).
func (v *evictor) base(rec int32, last int64, pre bool) float64 {
	switch v.p {
	case LRU:
		return float64(last)
	case FLRU:
		// The conversion keeps the compiler from fusing the multiply
		// and add, so arm64 ranks as amd64 does.
		return float64(last) + float64(v.credit*float64(v.freq[rec]))
	case Markov:
		p := v.mk.pred[rec]
		if pre {
			p++
		}
		return p
	}
	k := v.key[rec]
	if pre {
		k += v.w
	}
	return k
}

// layerScale is what the bases of layer l's records are multiplied by
// during the current step: how soon the layer comes round again for LRFU
// and Markov, 1 for LRU and FLRU.
func (v *evictor) layerScale(l int) float64 {
	if v.scale == nil {
		return 1
	}
	return v.scale[l]
}

// victim returns a free slot, else the slot the policy evicts among those
// neither held by the current step nor being read; -1 when there is none
// (victimSet: the lowest free slot first, else the lowest score, ties to
// the lower base, then the lower slot).
func (s *Stream) victim() int32 {
	si := s.vs.pick(&s.ev, s.evictable)
	if victimCheck != nil {
		victimCheck(s, si)
	}
	return si
}

// victimCheck, set by tests only, sees every victim the stream picks.
var victimCheck func(s *Stream, si int32)

// evictable is what victimSet asks of slot si.
func (s *Stream) evictable(si int32) (rec int32, last int64, pre, ok bool) {
	sl := &s.slots[si]
	return sl.rec, sl.last, sl.pre, !sl.held && sl.state == ready
}

// DefaultPolicy is the eviction policy when none is asked for: Markov hit
// at least as often as every other policy on every recorded decode at
// every pool size (TestPolicyTable requires it; the README has the table).
const DefaultPolicy = Markov

// PolicyBytes is what policy p's state takes for a model of layers expert
// layers of experts experts: the memory budget counts it.
func PolicyBytes(p Policy, layers, experts int) int64 {
	if p == "" {
		p = DefaultPolicy
	}
	return evictorBytes(p, layers, experts)
}

// Evictor is a policy's state and ranking for a pool kept outside this
// package (the GPU's expert pool), driven as the Stream drives its own:
// Tick at every layer step, Use for each record the step asks for, and
// Score to rank the resident records when one must go.
type Evictor struct{ v evictor }

// NewEvictor returns policy p's state ("" is DefaultPolicy) for layers
// expert layers of experts experts.
func NewEvictor(p Policy, layers, experts int) (*Evictor, error) {
	if p == "" {
		p = DefaultPolicy
	}
	if err := p.valid(); err != nil {
		return nil, err
	}
	return &Evictor{newEvictor(p, layers, experts)}, nil
}

// Layers is the expert layers the policy ranks.
func (e *Evictor) Layers() int { return e.v.L }

// Tick moves the policy to layer step clock (counted from 1), a step of
// layer of tokens rows.
func (e *Evictor) Tick(clock int64, layer, tokens int) { e.v.tick(clock, layer, tokens) }

// Use counts rows uses of record rec (layer·experts + expert) by the
// current step; recent is false for a prefill's expert outside its
// layer's share of the pool, to be recycled first.
func (e *Evictor) Use(rec int32, rows int, recent bool) { e.v.use(rec, rows, recent) }

// NewText starts a new, unrelated text: the uses counted so far weigh
// far less than the new text's (Stream.NewText).
func (e *Evictor) NewText() { e.v.newText() }

// Score ranks resident record rec, last used at step last (0: recycle
// first), for eviction during the current step: the lowest goes first.
func (e *Evictor) Score(rec int32, last int64) float64 { return e.v.score(rec, last, false) }
