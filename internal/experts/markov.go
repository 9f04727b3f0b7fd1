package experts

import "slices"

// The Markov policy's constants, chosen on the decode traces of
// TestPolicyTable at a 10% pool: pseudo-counts 1 to 64, prior weights 0 to
// 4, layer-order scales from 0.3 to 0.7 and conditioning also on the
// previous layer's choices in the same token all hit within 0.01× of
// Belady's of each other.
const (
	mkAlpha = 8.0     // pseudo-count of the frequency prior in a transition estimate
	mkGamma = 0.75    // weight of the prior added to the estimate
	mkHalve = 1 << 16 // tokens between halvings of the transition counts
)

// The excess repeat rate's constants, chosen on the same traces and on
// the decodes of three successive bench trials (different random texts)
// of a router-routed 48-layer Qwen3-30B-A3B synth, replayed in turn
// through one pool of 5 or 9% of its experts. Every setting tried (scales
// 0.5 to 4, windows of 16 and 32 steps, floors of 0 to 0.3) lifted that
// synth's later trials from 0.87 to 0.92–0.97 of their requests hit at 9%
// (0.64 to 0.69–0.76 at 5%). With no floor, or one of 0.05, or a scale of
// 4, another policy hit more than Markov on some trace at some pool size
// (by 0.01–0.16%); at a floor of 0.1, scales 1.5 to 3 lose nowhere, and 2
// is the largest that lowers no mean fraction of the optimum.
const (
	mkRhoScale  = 2.0  // weight of the excess repeat rate above the floor
	mkRhoFloor  = 0.1  // excess repeat rate that moves nothing
	mkRhoWindow = 16.0 // steps of a layer the excess repeat rate averages
)

// markov is the Markov policy's state: per layer, how often its router
// chose expert b one token after choosing expert a, and, for every
// record, the estimated probability that its layer's next decode step
// chooses it.
type markov struct {
	L, E int
	tok  int64
	// trans[l·E·E + a·E + b] counts layer l choosing b one token after a;
	// from[l·E + a] counts the tokens after layer l chose a.
	trans, from []float32
	// prev[l] is what layer l chose on its last decode step, nil after a
	// multi-row (prefill) step, whose choices are many tokens'.
	prev, prevBuf [][]int32
	cur           []int32 // the current step's choices
	mark          []int64 // [record] the step that last added it to cur
	step          int64
	layer         int       // the current step's layer, -1 before the first
	pending       bool      // the current step has not been learned from yet
	multi         bool      // the current step has a record used by several rows
	pred          []float64 // [record] estimated probability of use on its layer's next step
	rho           []float64 // [layer] excess repeat rate (learnRepeats)
	prior         []float64 // [expert] scratch
}

func newMarkov(L, E int) *markov {
	m := &markov{L: L, E: E, trans: make([]float32, L*E*E), from: make([]float32, L*E),
		prev: make([][]int32, L), prevBuf: make([][]int32, L), mark: make([]int64, L*E),
		layer: -1, pred: make([]float64, L*E), prior: make([]float64, E), rho: make([]float64, L)}
	for i := range m.mark {
		m.mark[i] = -1
	}
	return m
}

// markovBytes is what the Markov policy's state takes for L layers of E
// experts, for the memory budget.
func markovBytes(L, E int) int64 {
	return int64(L)*int64(E)*(int64(E)*4+4+8+8) + int64(E)*8 + int64(L)*8
}

// use notes that the current step chose rec for rows rows.
func (m *markov) use(rec int32, rows int) {
	m.multi = m.multi || rows > 1
	m.pending = true
	if m.mark[rec] != m.step {
		m.mark[rec] = m.step
		m.cur = append(m.cur, rec%int32(m.E))
	}
}

// tick starts a step of layer, after learning from the one before;
// start says it begins a pass through the layers (evictor.tick).
func (m *markov) tick(v *evictor, layer int, start bool) {
	m.finish(v)
	m.step++
	m.cur, m.multi, m.layer = m.cur[:0], false, layer
	if start {
		m.tok++
		if m.tok%mkHalve == 0 {
			// Halving keeps the float32 counts exact (far below 2^24)
			// and lets the transitions follow a changing text.
			for _, t := range [][]float32{m.trans, m.from} {
				for i := range t {
					t[i] *= 0.5
				}
			}
		}
	}
}

// finish learns from the current step, once, and estimates its layer's
// records for the layer's next step: called before the step's first
// eviction, so that the step's own choices already inform it.
func (m *markov) finish(v *evictor) {
	if !m.pending || m.layer < 0 {
		return
	}
	m.pending = false
	l, E := m.layer, m.E
	m.frequencies(v, l)
	if m.multi {
		m.prev[l] = nil
	} else {
		if p := m.prev[l]; p != nil {
			m.learnRepeats(l, p)
			for _, a := range p {
				m.from[l*E+int(a)]++
				row := m.trans[(l*E+int(a))*E:][:E]
				for _, b := range m.cur {
					row[b]++
				}
			}
		}
		m.prevBuf[l] = append(m.prevBuf[l][:0], m.cur...)
		m.prev[l] = m.prevBuf[l]
	}
	m.estimate(l, float64(max(len(m.cur), 1)))
	v.changed[l] = true
}

// frequencies sets prior to each of layer l's experts' share of LRFU's
// decayed uses of the layer (uniform before any use).
func (m *markov) frequencies(v *evictor, l int) {
	E := m.E
	prior, keys := m.prior, v.key[l*E:(l+1)*E]
	var ksum float64
	for _, k := range keys {
		ksum += k
	}
	for e := range prior {
		if ksum > 0 {
			prior[e] = keys[e] / ksum
		} else {
			prior[e] = 1 / float64(E)
		}
	}
}

// learnRepeats updates layer l's excess repeat rate from its previous
// decode step's choices p and the current step's: the share of p chosen
// again, less the share the frequencies alone expect (each expert's
// chance of being among the step's k choices, k times its share, at most
// one). Frequent experts repeat because they are frequent; what repeats
// beyond that is the layer keeping to the experts it just chose, which
// a transition count learns only per expert, after that expert has been
// seen: at a change of text (a new request, or a new bench trial) the
// counts and frequencies of the old text's experts outrank the new
// text's until they age, even where a layer keeps almost every expert
// from one token to the next.
func (m *markov) learnRepeats(l int, p []int32) {
	k := float64(len(m.cur))
	var ex float64
	for _, a := range p {
		ex -= min(1, float64(k*m.prior[a]))
		if slices.Contains(m.cur, a) {
			ex++
		}
	}
	// Rounded before the add: arm64 would fuse it (the division by a
	// power of two is a multiply), and what is evicted must not depend on
	// the CPU.
	m.rho[l] += float64((ex/float64(len(p)) - m.rho[l]) / mkRhoWindow)
}

// estimate sets pred for layer l's records from prior (frequencies): the
// mean over the experts a the layer chose last of the smoothed P(b | a),
// which draws towards a base rate with mkAlpha pseudo-counts, plus
// mkGamma times the base rate; k choices a step. The base rate is the
// frequencies, with a share of the probability moved onto the experts
// the layer chose last in proportion to its excess repeat rate.
func (m *markov) estimate(l int, k float64) {
	E := m.E
	prior := m.prior
	if p := m.prev[l]; len(p) > 0 && m.rho[l] > mkRhoFloor {
		r := min(1, (m.rho[l]-mkRhoFloor)*mkRhoScale)
		for e := range prior {
			prior[e] *= 1 - r
		}
		for _, a := range p {
			prior[a] += r / float64(len(p))
		}
	}
	pred := m.pred[l*E : (l+1)*E]
	for e := range pred {
		pred[e] = float64(float64(mkGamma*k) * prior[e])
	}
	p := m.prev[l]
	if len(p) == 0 {
		for e := range pred {
			pred[e] += float64(k * prior[e])
		}
		return
	}
	inv := 1 / float64(len(p))
	for _, a := range p {
		row := m.trans[(l*E+int(a))*E:][:E]
		d := inv / (float64(m.from[l*E+int(a)]) + mkAlpha)
		for e := range pred {
			pred[e] += float64(float64(float64(row[e])+float64(float64(mkAlpha*k)*prior[e])) * d)
		}
	}
}
