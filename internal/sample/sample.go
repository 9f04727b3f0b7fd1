// Package sample turns a model's next-token logits into a token id.
//
// The pipeline, applied in this order, roughly follows llama.cpp and vLLM:
//
//  1. penalties: repetition (HF style), then presence and frequency (OpenAI
//     style), over the ids in the caller's history;
//  2. temperature (0 means greedy: argmax of the penalised logits, lowest id
//     on ties, and nothing below applies);
//  3. top-k on the penalised logits;
//  4. softmax over the survivors, in float64;
//  5. top-p (nucleus): the shortest prefix, in order of probability
//     descending then id ascending, whose mass reaches TopP;
//  6. min-p: drop tokens whose probability is below MinP times the largest;
//  7. renormalise and draw with the sampler's seeded generator.
//
// Candidate order is a strict total order (logit descending, id ascending),
// so the result never depends on sort stability or on the platform, and a
// given Seed reproduces the same tokens everywhere.
package sample

import (
	"fmt"
	"math"
	"unsafe"
)

// Params are the user's sampling settings.
type Params struct {
	// Temperature divides the logits; 0 selects greedy decoding.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 disables it.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// mass reaches TopP; 0 and 1 disable it.
	TopP float64
	// MinP drops tokens whose probability is below MinP times that of the
	// most likely token; 0 disables it.
	MinP float64
	// RepetitionPenalty follows Hugging Face: for tokens in the history a
	// positive logit is divided by it and a non-positive one multiplied; 1
	// disables it. The zero value disables it too, so that Params{} has no
	// penalty, but a user-given penalty must pass CheckRepetitionPenalty,
	// which refuses 0.
	RepetitionPenalty float64
	// PresencePenalty follows OpenAI: it is subtracted once from the logit of
	// every token present in the history.
	PresencePenalty float64
	// FrequencyPenalty follows OpenAI: count*FrequencyPenalty is subtracted
	// from the logit of a token occurring count times in the history.
	FrequencyPenalty float64
	// Seed seeds the sampler's generator; equal seeds give equal draws.
	Seed uint64
}

// Validate reports the first setting that is out of range. Non-finite values
// are rejected everywhere because a NaN silently poisons every comparison in
// the filters instead of failing loudly.
func (p Params) Validate() error {
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("sample: temperature %v must be finite and >= 0", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("sample: top_k %d must be >= 0", p.TopK)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sample: top_p %v must be in [0, 1]", p.TopP)
	case math.IsNaN(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("sample: min_p %v must be in [0, 1]", p.MinP)
	case p.RepetitionPenalty != 0 && CheckRepetitionPenalty(p.RepetitionPenalty) != nil:
		return fmt.Errorf("sample: %v", CheckRepetitionPenalty(p.RepetitionPenalty))
	case !finite(p.PresencePenalty):
		return fmt.Errorf("sample: presence_penalty %v must be finite", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return fmt.Errorf("sample: frequency_penalty %v must be finite", p.FrequencyPenalty)
	}
	return nil
}

// MaxRepetitionPenalty is the largest repetition penalty accepted. Beyond
// it a repeated token is all but banned; larger values are more likely
// typos than intent.
const MaxRepetitionPenalty = 10

// CheckRepetitionPenalty is the one rule for a repetition penalty that a
// user gives, on the command line or through the API: a number in
// (0, MaxRepetitionPenalty], where 1 is off. 0 is refused, as Hugging Face
// refuses it: dividing by it would make no sense, and reading it as "off"
// hides a mistaken value.
func CheckRepetitionPenalty(r float64) error {
	if !(r > 0 && r <= MaxRepetitionPenalty) { // NaN too
		return fmt.Errorf("repetition_penalty must be in (0, %d] (1 = off), got %v", MaxRepetitionPenalty, r)
	}
	return nil
}

// Greedy reports whether p selects greedy decoding (temperature 0), in which
// case the filters and the seed are irrelevant.
func (p Params) Greedy() bool { return p.Temperature == 0 }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func (p Params) repetitionOn() bool {
	return p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
}

func (p Params) penaltiesOn() bool {
	return p.repetitionOn() || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
}

func (p Params) topPOn() bool { return p.TopP > 0 && p.TopP < 1 }

// Sampler draws tokens from logits. It owns its scratch so that Sample
// allocates nothing after the first call with a given vocab size. A Sampler
// holds generator state and scratch, so it is not safe for concurrent use;
// use one per sequence.
type Sampler struct {
	p   Params
	rng rng

	// z holds the working (penalised) logits in float64; working on a copy
	// keeps the caller's logits intact, so Probs and Sample may be called on
	// the same slice without penalties being applied twice.
	z []float64
	// w holds unnormalised probabilities, indexed by token id; only entries
	// of surviving candidates are meaningful.
	w []float64
	// cand lists the surviving candidate ids; its first n entries are live.
	cand []int32
	// counts and touched count history occurrences; touched remembers which
	// counts to reset so the cost is O(len(history)), not O(vocab).
	counts  []int32
	touched []int32

	// keyed and keyedTmp are the radix-sort buffers for top-p; they are
	// only allocated when top-p is on, since nothing else sorts.
	keyed    []keyed
	keyedTmp []keyed
}

// New returns a Sampler for p with scratch sized for vocab tokens. vocab may
// be 0, in which case scratch is sized on the first call.
func New(p Params, vocab int) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if vocab < 0 {
		return nil, fmt.Errorf("sample: vocab %d must be >= 0", vocab)
	}
	s := &Sampler{p: p}
	s.rng.seed(p.Seed)
	s.grow(vocab)
	return s, nil
}

// ScratchBytes is the most a Sampler over vocab tokens holds: its
// float64 working logits and weights, its int32 candidates, counts and
// touched ids, and top-p's two sort buffers of (key, id); the memory
// budget counts it for each sequence.
func ScratchBytes(vocab int) int64 {
	return int64(vocab) * (8 + 8 + 4 + 4 + 4 + 2*int64(unsafe.Sizeof(keyed{})))
}

// Params returns the settings the sampler was built with.
func (s *Sampler) Params() Params { return s.p }

// grow makes every scratch buffer hold at least v entries. Buffers only ever
// grow, so alternating vocab sizes does not reallocate.
func (s *Sampler) grow(v int) {
	if cap(s.z) >= v {
		return
	}
	s.z = make([]float64, v)
	s.w = make([]float64, v)
	s.cand = make([]int32, v)
	s.counts = make([]int32, v)
	s.touched = make([]int32, 0, v)
	if s.p.topPOn() {
		// Allocated up front rather than on the first sort, which may come
		// many tokens in, so that only the first call ever allocates.
		s.keyed = make([]keyed, v)
		s.keyedTmp = make([]keyed, v)
	}
}

// Sample picks the next token from logits given the history of token ids
// (prompt + generated) used for penalties. Greedy: argmax of the penalised
// logits with ties broken by the lowest id. logits is not modified. History
// ids outside [0, len(logits)) are ignored. It returns -1 only for empty
// logits; if every logit is -Inf or NaN it returns the argmax fallback 0.
func (s *Sampler) Sample(logits []float32, history []int) int {
	n, sum, tok := s.distribution(logits, history)
	if n == 0 {
		return tok
	}
	return s.draw(n, sum)
}

// Probs writes into dst the final distribution that Sample draws from (after
// penalties, temperature, top-k, top-p, min-p, renormalised; zeros for
// excluded tokens). For greedy, a one-hot. Speculative decoding needs this to
// accept/reject drafts. Entries of dst beyond len(logits) are zeroed and
// tokens beyond len(dst) are dropped rather than causing a panic. Probs does
// not consume randomness, so interleaving it with Sample keeps draws
// reproducible.
func (s *Sampler) Probs(dst []float32, logits []float32, history []int) {
	clear(dst)
	n, sum, tok := s.distribution(logits, history)
	if n == 0 {
		if tok >= 0 && tok < len(dst) {
			dst[tok] = 1
		}
		return
	}
	inv := 1 / sum
	for _, id := range s.cand[:n] {
		if int(id) < len(dst) {
			dst[id] = float32(s.w[id] * inv)
		}
	}
}

// distribution runs the pipeline. For a sampled distribution it returns the
// number n of survivors left in s.cand[:n], with weights in s.w and their
// total sum. For greedy or degenerate input it returns n == 0 and the token
// to emit (-1 for empty logits).
func (s *Sampler) distribution(logits []float32, history []int) (n int, sum float64, tok int) {
	v := len(logits)
	if v == 0 {
		return 0, 0, -1
	}
	if s.p.Greedy() && !s.p.penaltiesOn() {
		// Plain greedy needs no working copy: at a real vocabulary the
		// copy and the float64 scan took 2% of a decode step.
		return 0, 0, greedyPick(logits)
	}
	s.grow(v)
	z := s.z[:v]
	for i, x := range logits {
		f := float64(x)
		if math.IsNaN(f) {
			// A NaN logit is a model bug; treating it as impossible keeps
			// it from winning comparisons or spreading into the sum.
			f = math.Inf(-1)
		}
		z[i] = f
	}
	if s.p.penaltiesOn() {
		s.penalize(z, history)
	}
	if s.p.Greedy() {
		return 0, 0, argmax64(z)
	}

	cand := s.cand[:v]
	for i, f := range z {
		if math.IsInf(f, -1) {
			continue
		}
		if math.IsInf(f, 1) {
			// Clamp so that (z-max)/T is 0 for the winners rather than
			// Inf-Inf = NaN; the rest then get weight exp(-huge) = 0.
			z[i] = math.MaxFloat64
		}
		cand[n] = int32(i)
		n++
	}
	if n == 0 {
		return 0, 0, argmax64(z)
	}

	sorted := false
	if k := s.p.TopK; k > 0 && k < n {
		s.selectTopK(cand[:n], k)
		n, sorted = k, true
	}

	maxZ := z[cand[0]]
	if !sorted {
		for _, id := range cand[1:n] {
			maxZ = max(maxZ, z[id])
		}
	}
	// Every weight is exp of a non-positive number, so nothing overflows and
	// the most likely token has weight exactly 1, which min-p relies on.
	invT := 1 / s.p.Temperature
	for _, id := range cand[:n] {
		wi := math.Exp((z[id] - maxZ) * invT)
		s.w[id] = wi
		sum += wi
	}

	if s.p.topPOn() {
		n, sum = s.nucleus(cand, n, sum, sorted)
	}

	if mp := s.p.MinP; mp > 0 {
		// The maximum weight is 1 (see above) and top-p always keeps the
		// most likely token, so the min-p threshold is MinP itself.
		m := 0
		sum = 0
		for _, id := range cand[:n] {
			if s.w[id] >= mp {
				cand[m] = id
				m++
				sum += s.w[id]
			}
		}
		n = m
	}
	return n, sum, -1
}

// penalize applies the repetition, presence and frequency penalties to z for
// the ids in history, counting occurrences without allocating.
func (s *Sampler) penalize(z []float64, history []int) {
	counts := s.counts[:len(z)]
	touched := s.touched[:0]
	for _, id := range history {
		if id < 0 || id >= len(z) {
			continue
		}
		if counts[id] == 0 {
			touched = append(touched, int32(id))
		}
		counts[id]++
	}
	rp := s.p.RepetitionPenalty
	rep := s.p.repetitionOn()
	for _, id := range touched {
		f := z[id]
		if rep {
			if f > 0 {
				f /= rp
			} else {
				f *= rp
			}
		}
		f -= s.p.PresencePenalty + float64(float64(counts[id])*s.p.FrequencyPenalty) // product rounded: the same on every CPU
		if math.IsNaN(f) {
			// Only reachable when an overflowing penalty meets an infinite
			// logit (Inf-Inf); treat the token as masked rather than let
			// NaN into the comparisons.
			f = math.Inf(-1)
		}
		z[id] = f
		counts[id] = 0
	}
	s.touched = touched[:0]
}

// selectTopK leaves the k best candidates of cand, best first, in cand[:k].
// A size-k heap costs O(n log k) instead of sorting all n; with the worst
// kept at the root it doubles as a heapsort that ends best first.
func (s *Sampler) selectTopK(cand []int32, k int) {
	z := s.z
	worse := func(a, b int32) bool {
		return z[a] < z[b] || (z[a] == z[b] && a > b)
	}
	h := cand[:k]
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(h, i, worse)
	}
	for _, id := range cand[k:] {
		if worse(h[0], id) {
			h[0] = id
			siftDown(h, 0, worse)
		}
	}
	for end := k - 1; end > 0; end-- {
		h[0], h[end] = h[end], h[0]
		siftDown(h[:end], 0, worse)
	}
}

// siftDown restores the heap property (root is the worst) below i.
func siftDown(h []int32, i int, worse func(a, b int32) bool) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && worse(h[c+1], h[c]) {
			c++
		}
		if !worse(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// nucleusCuts are the weight thresholds (relative to the top token, whose
// weight is 1) tried before sorting everything; see nucleus.
var nucleusCuts = [...]float64{1e-3, 1e-6, 1e-12}

// nucleus applies top-p to cand[:n] (total weight sum) and returns the new
// count and sum. If sorted is true cand[:n] is already in order; otherwise it
// must be in id order, which the sort's tie-breaking relies on.
//
// Sorting a 250k vocabulary per token is wasteful when the nucleus is
// typically a few hundred tokens, so the tokens with weight >= t are sorted
// first. That set is a prefix of the full order, so if it reaches the target
// mass the answer is exactly what a full sort would give; otherwise a lower
// cut, and finally every candidate, is tried.
func (s *Sampler) nucleus(cand []int32, n int, sum float64, sorted bool) (int, float64) {
	target := s.p.TopP * sum
	if sorted {
		if m, cum, ok := s.prefix(cand[:n], target); ok {
			return m, cum
		}
		return n, sum
	}
	for _, t := range nucleusCuts {
		kv := s.keyed[:0]
		mass := 0.0
		for _, id := range cand[:n] {
			if s.w[id] >= t {
				kv = append(kv, keyed{key: orderKey(s.z[id]), id: id})
				mass += s.w[id]
			}
		}
		if len(kv) == n {
			break // the cut removed nothing; sort everything below
		}
		if mass < target {
			continue
		}
		if m, cum, ok := s.sortedPrefix(cand, kv, target); ok {
			return m, cum
		}
	}
	kv := s.keyed[:n]
	for i, id := range cand[:n] {
		kv[i] = keyed{key: orderKey(s.z[id]), id: id}
	}
	if m, cum, ok := s.sortedPrefix(cand, kv, target); ok {
		return m, cum
	}
	// Rounding kept the cumulative sum just below target: keep everything.
	return n, sum
}

// sortedPrefix sorts kv and, if a prefix of it reaches target, copies that
// prefix's ids into cand and returns its length and mass. cand is left
// untouched otherwise so that a lower cut can start again from id order.
func (s *Sampler) sortedPrefix(cand []int32, kv []keyed, target float64) (int, float64, bool) {
	kv = radixSort(kv, s.keyedTmp[:len(kv)])
	cum := 0.0
	for i, e := range kv {
		cum += s.w[e.id]
		if cum >= target {
			for j := range kv[:i+1] {
				cand[j] = kv[j].id
			}
			return i + 1, cum, true
		}
	}
	return len(kv), cum, false
}

// prefix returns the length and mass of the shortest prefix of sorted ids
// whose mass reaches target, and false if the whole slice falls short.
func (s *Sampler) prefix(ids []int32, target float64) (int, float64, bool) {
	cum := 0.0
	for i, id := range ids {
		cum += s.w[id]
		if cum >= target {
			return i + 1, cum, true
		}
	}
	return len(ids), cum, false
}

// keyed is a candidate with its sort key, see orderKey.
type keyed struct {
	key uint64
	id  int32
}

// orderKey maps a logit to a uint64 that sorts ascending in logit-descending
// order: the usual sign-flip trick makes float bits order as integers, and
// complementing reverses it. -0 is folded into +0 first because the two
// compare equal as floats and must tie (and fall back to id order).
func orderKey(z float64) uint64 {
	if z == 0 {
		z = 0
	}
	u := math.Float64bits(z)
	if u>>63 != 0 {
		u = ^u
	} else {
		u |= 1 << 63
	}
	return ^u
}

// radixSort sorts a by key with an LSD radix sort, using tmp (same length)
// as the other buffer, and returns whichever of the two holds the result.
// It is stable, so entries built in id order come out as (logit descending,
// id ascending), the same total order as the top-k heap. A comparison sort
// of 128k candidates took over 10ms; this is O(n) per byte of key, and bytes
// on which all keys agree (e.g. the low mantissa bits of logits that came
// from float32) are skipped.
func radixSort(a, tmp []keyed) []keyed {
	if len(a) < 2 {
		return a
	}
	for shift := uint(0); shift < 64; shift += 8 {
		var count [256]int
		for _, e := range a {
			count[byte(e.key>>shift)]++
		}
		if count[byte(a[0].key>>shift)] == len(a) {
			continue
		}
		pos := 0
		for i, c := range count {
			count[i] = pos
			pos += c
		}
		for _, e := range a {
			b := byte(e.key >> shift)
			tmp[count[b]] = e
			count[b]++
		}
		a, tmp = tmp, a
	}
	return a
}

// draw picks one of s.cand[:n] with probability proportional to its weight.
func (s *Sampler) draw(n int, sum float64) int {
	u := s.rng.float64() * sum
	acc := 0.0
	for _, id := range s.cand[:n] {
		acc += s.w[id]
		if u < acc {
			return int(id)
		}
	}
	// u*sum can round up to the accumulated total; the last candidate
	// owns that sliver.
	return int(s.cand[n-1])
}

// SampleFrom draws an index from a probability vector with the sampler's RNG
// (used to resample from the residual distribution in speculative decoding).
// probs need not be normalised; entries that are NaN, infinite or <= 0 are
// never drawn. If nothing has positive mass it returns Argmax(probs), which
// is -1 for an empty slice.
func (s *Sampler) SampleFrom(probs []float32) int {
	sum := 0.0
	for _, p := range probs {
		if usable(p) {
			sum += float64(p)
		}
	}
	if sum == 0 {
		return Argmax(probs)
	}
	u := s.rng.float64() * sum
	acc := 0.0
	last := -1
	for i, p := range probs {
		if !usable(p) {
			continue
		}
		acc += float64(p)
		last = i
		if u < acc {
			return i
		}
	}
	return last
}

func usable(p float32) bool { return p > 0 && !math.IsInf(float64(p), 1) }

// AcceptDraft implements the speculative-sampling rule: given the target
// distribution p and the draft distribution q (both full-vocab probability
// vectors) and the drafted token x, it accepts with probability
// min(1, p[x]/q[x]); on rejection it returns a token drawn from the residual
// norm(max(0, p-q)). Returns (token, accepted). The output token is then
// distributed exactly as p whenever x was drawn from q.
//
// The vocabulary is len(p); q entries past its end read as 0. An x outside
// p, or with p[x] <= 0, is rejected. If the residual has no mass (p and q
// agree up to rounding) the replacement is drawn from p itself.
func (s *Sampler) AcceptDraft(p, q []float32, x int) (int, bool) {
	// Always consume one uniform so the generator's position after a step
	// does not depend on which branch was taken.
	u := s.rng.float64()
	if x >= 0 && x < len(p) {
		px := float64(p[x])
		qx := 0.0
		if x < len(q) {
			qx = float64(q[x])
		}
		// u < 1 always, so p[x] >= q[x] > 0 accepts with certainty.
		if px > 0 && (qx <= 0 || u < px/qx) {
			return x, true
		}
	}
	// The residual is recomputed in a second pass instead of stored:
	// identical float64 operations give identical values, and no scratch
	// means no allocation for any vocabulary size.
	sum := 0.0
	for i := range p {
		sum += residual(p, q, i)
	}
	if sum == 0 || math.IsNaN(sum) || math.IsInf(sum, 0) {
		return s.SampleFrom(p), false
	}
	r := s.rng.float64() * sum
	acc := 0.0
	last := -1
	for i := range p {
		d := residual(p, q, i)
		if d == 0 {
			continue
		}
		acc += d
		last = i
		if r < acc {
			return i, false
		}
	}
	return last, false
}

// residual returns max(0, p[i]-q[i]) in float64, treating missing q as 0 and
// unusable p entries as 0.
func residual(p, q []float32, i int) float64 {
	if !usable(p[i]) {
		return 0
	}
	d := float64(p[i])
	if i < len(q) && !math.IsNaN(float64(q[i])) {
		d -= float64(q[i])
	}
	return max(d, 0)
}

// Argmax returns the index of the largest value, lowest index on ties. NaN
// entries never win unless every entry is NaN (then 0); empty input gives -1.
func Argmax(x []float32) int {
	best := -1
	for i, v := range x {
		if v != v {
			continue
		}
		if best < 0 || v > x[best] {
			best = i
		}
	}
	if best < 0 && len(x) > 0 {
		return 0
	}
	return best
}

// greedyPick is argmax64 over the working logits that distribution would
// make of x (NaN read as -Inf), read from x itself: the first index of the
// largest value, 0 when none is above -Inf.
func greedyPick(x []float32) int {
	best, bv := 0, float32(math.Inf(-1))
	for i, v := range x {
		if v > bv {
			best, bv = i, v
		}
	}
	return best
}

// argmax64 is Argmax for the float64 working logits, which never hold NaN.
func argmax64(x []float64) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// LogSoftmax writes log-probabilities of x into dst, computed in float64
// accumulation for stability (max subtraction, then log-sum-exp). Only
// min(len(dst), len(x)) entries are written. If every entry is -Inf the
// distribution is undefined and dst gets -Inf throughout; NaN inputs
// propagate as NaN.
func LogSoftmax(dst, x []float32) {
	n := min(len(dst), len(x))
	if n == 0 {
		return
	}
	m := math.Inf(-1)
	for _, v := range x {
		if f := float64(v); f > m {
			m = f
		}
	}
	if math.IsInf(m, -1) {
		for i := range dst[:n] {
			dst[i] = float32(math.Inf(-1))
		}
		return
	}
	if math.IsInf(m, 1) {
		// The +Inf entries share all the mass: log(1/count) each.
		c := 0
		for _, v := range x {
			if math.IsInf(float64(v), 1) {
				c++
			}
		}
		l := float32(-math.Log(float64(c)))
		for i, v := range x[:n] {
			if math.IsInf(float64(v), 1) {
				dst[i] = l
			} else if v != v {
				dst[i] = v
			} else {
				dst[i] = float32(math.Inf(-1))
			}
		}
		return
	}
	sum := 0.0
	for _, v := range x {
		sum += math.Exp(float64(v) - m)
	}
	lse := m + math.Log(sum)
	for i, v := range x[:n] {
		dst[i] = float32(float64(v) - lse)
	}
}
