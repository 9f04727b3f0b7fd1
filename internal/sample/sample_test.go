package sample

import (
	"math"
	"runtime"
	"strings"
	"testing"
)

func mustNew(t *testing.T, p Params, vocab int) *Sampler {
	t.Helper()
	s, err := New(p, vocab)
	if err != nil {
		t.Fatalf("New(%+v): %v", p, err)
	}
	return s
}

// randLogits returns deterministic pseudo-random logits in [-5, 5).
func randLogits(seed uint64, n int) []float32 {
	var r rng
	r.seed(seed)
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.float64()*10 - 5)
	}
	return x
}

func softmax64(x []float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, v)
	}
	out := make([]float64, len(x))
	sum := 0.0
	for i, v := range x {
		out[i] = math.Exp(v - m)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// chiSquare returns the Pearson statistic of counts against probabilities,
// over the cells with nonzero expectation, and fails if a zero-probability
// cell was hit.
func chiSquare(t *testing.T, counts []int, p []float64, draws int) float64 {
	t.Helper()
	x2 := 0.0
	for i, c := range counts {
		e := p[i] * float64(draws)
		if e == 0 {
			if c != 0 {
				t.Fatalf("token %d has probability 0 but was drawn %d times", i, c)
			}
			continue
		}
		d := float64(c) - e
		x2 += d * d / e
	}
	return x2
}

// chi2Crit999 holds the 0.999 quantile of chi-square by degrees of freedom.
// The draws are seeded so the tests are deterministic; the bound only has to
// be one a correct sampler passes and a wrong distribution cannot.
var chi2Crit999 = map[int]float64{1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}

func TestRNGGolden(t *testing.T) {
	// Published first output of splitmix64 from state 0.
	st := uint64(0)
	if got := splitmix64(&st); got != 0xe220a8397b1dcdaf {
		t.Fatalf("splitmix64(0) = %#x, want 0xe220a8397b1dcdaf", got)
	}
	// Frozen stream: changing it silently changes every seeded generation.
	var r rng
	r.seed(42)
	// Values cross-checked against an independent Python implementation.
	want := []uint64{0x15780b2e0c2ec716, 0x6104d9866d113a7e, 0xae17533239e499a1}
	for i, w := range want {
		if got := r.next(); got != w {
			t.Fatalf("rng(42) output %d = %#x, want %#x", i, got, w)
		}
	}
}

func TestGreedyArgmax(t *testing.T) {
	s := mustNew(t, Params{}, 0)
	for seed := uint64(0); seed < 50; seed++ {
		x := randLogits(seed, 1000)
		if got, want := s.Sample(x, nil), Argmax(x); got != want {
			t.Fatalf("seed %d: greedy %d, argmax %d", seed, got, want)
		}
	}
	tie := []float32{1, 3, -2, 3, 3}
	if got := s.Sample(tie, nil); got != 1 {
		t.Fatalf("greedy tie: got %d, want 1", got)
	}
	if got := Argmax(tie); got != 1 {
		t.Fatalf("Argmax tie: got %d, want 1", got)
	}
	nan := float32(math.NaN())
	if got := Argmax([]float32{nan, 2, nan, 5, 5}); got != 3 {
		t.Fatalf("Argmax with NaN: got %d, want 3", got)
	}
	if got := Argmax(nil); got != -1 {
		t.Fatalf("Argmax(nil) = %d, want -1", got)
	}
	if got := s.Sample([]float32{nan, 1, nan}, nil); got != 1 {
		t.Fatalf("greedy with NaN: got %d, want 1", got)
	}
}

// TestGreedyPick: plain greedy's scan of the logits picks what argmax64
// picks on distribution's working copy (NaN read as -Inf), also on
// logits of NaN and infinities and on degenerate rows.
func TestGreedyPick(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	working := func(x []float32) int {
		z := make([]float64, len(x))
		for i, v := range x {
			z[i] = float64(v)
			if v != v {
				z[i] = math.Inf(-1)
			}
		}
		return argmax64(z)
	}
	rows := [][]float32{{nan, -inf}, {nan, nan}, {-inf, -inf, nan}, {nan, -inf, 2}, {inf, 1, inf}, {-inf, inf}, {3}}
	for seed := uint64(0); seed < 40; seed++ {
		x := randLogits(seed, 500)
		var r rng
		r.seed(seed + 1000)
		for range int(seed % 6) {
			x[int(r.float64()*float64(len(x)))] = []float32{nan, inf, -inf}[int(r.float64()*3)]
		}
		rows = append(rows, x)
	}
	for i, x := range rows {
		if got, want := greedyPick(x), working(x); got != want {
			t.Fatalf("row %d: greedyPick %d, working copy's argmax %d", i, got, want)
		}
	}
}

func drawSeq(t *testing.T, p Params, x []float32, n int) []int {
	s := mustNew(t, p, len(x))
	out := make([]int, n)
	for i := range out {
		out[i] = s.Sample(x, nil)
	}
	return out
}

func TestSeedDeterminism(t *testing.T) {
	x := randLogits(7, 512)
	configs := []Params{
		{Temperature: 1},
		{Temperature: 0.8, TopK: 40},
		{Temperature: 1.2, TopP: 0.9},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.7, TopK: 100, TopP: 0.95, MinP: 0.01},
	}
	for _, p := range configs {
		p.Seed = 1234
		a := drawSeq(t, p, x, 1000)
		b := drawSeq(t, p, x, 1000)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%+v: draw %d differs: %d vs %d", p, i, a[i], b[i])
			}
		}
		p.Seed = 1235
		c := drawSeq(t, p, x, 1000)
		same := 0
		for i := range a {
			if a[i] == c[i] {
				same++
			}
		}
		if same == len(a) {
			t.Fatalf("%+v: seeds 1234 and 1235 gave identical sequences", p)
		}
	}
}

func TestFiltersDegenerateToGreedy(t *testing.T) {
	x := randLogits(99, 2000)
	want := Argmax(x)
	for _, temp := range []float64{0.1, 1, 5, 100} {
		for _, p := range []Params{
			{Temperature: temp, TopK: 1},
			{Temperature: temp, TopP: 1e-9},
			{Temperature: temp, MinP: 1},
		} {
			s := mustNew(t, p, len(x))
			for i := 0; i < 200; i++ {
				if got := s.Sample(x, nil); got != want {
					t.Fatalf("%+v: got %d, want argmax %d", p, got, want)
				}
			}
		}
	}
}

func TestEmpiricalSoftmax(t *testing.T) {
	x := []float32{1.0, 2.0, 0.5, -1.0, 1.5}
	x64 := make([]float64, len(x))
	for i, v := range x {
		x64[i] = float64(v)
	}
	want := softmax64(x64)
	const draws = 200000
	s := mustNew(t, Params{Temperature: 1, Seed: 5}, len(x))
	counts := make([]int, len(x))
	for i := 0; i < draws; i++ {
		counts[s.Sample(x, nil)]++
	}
	if x2 := chiSquare(t, counts, want, draws); x2 > chi2Crit999[4] {
		t.Fatalf("chi-square %.2f > %.2f; counts %v, want p %v", x2, chi2Crit999[4], counts, want)
	}

	// Top-k=2 keeps ids 1 and 4 (logits 2.0, 1.5) with ratio e^0.5.
	s = mustNew(t, Params{Temperature: 1, TopK: 2, Seed: 6}, len(x))
	clear(counts)
	for i := 0; i < draws; i++ {
		counts[s.Sample(x, nil)]++
	}
	p1 := 1 / (1 + math.Exp(-0.5))
	wantK := []float64{0, p1, 0, 0, 1 - p1}
	if x2 := chiSquare(t, counts, wantK, draws); x2 > chi2Crit999[1] {
		t.Fatalf("top-k=2 chi-square %.2f; counts %v, want p %v", x2, counts, wantK)
	}
}

// TestTopKTies checks that top-k breaks ties by the lowest id, so the kept
// set is deterministic.
func TestTopKTies(t *testing.T) {
	x := []float32{1, 5, 5, 0, 5, 5, 2}
	for k, wantKept := range map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 4}, 5: {1, 2, 4, 5, 6}} {
		s := mustNew(t, Params{Temperature: 1, TopK: k}, len(x))
		probs := make([]float32, len(x))
		s.Probs(probs, x, nil)
		kept := []int{}
		for i, v := range probs {
			if v > 0 {
				kept = append(kept, i)
			}
		}
		if len(kept) != len(wantKept) {
			t.Fatalf("top-k=%d kept %v, want %v", k, kept, wantKept)
		}
		for i := range kept {
			if kept[i] != wantKept[i] {
				t.Fatalf("top-k=%d kept %v, want %v", k, kept, wantKept)
			}
		}
	}
}

// TestTopPTies checks that the nucleus breaks ties by the lowest id, both
// after top-k (heap order) and on its own (radix order), including -0 vs +0.
func TestTopPTies(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, tc := range []struct {
		x    []float32
		p    Params
		want int
	}{
		{[]float32{0, 5, 5, 5}, Params{Temperature: 1, TopK: 2, TopP: 0.1}, 1},
		{[]float32{5, 5, 5, 5, 5, 5, 0}, Params{Temperature: 1, TopK: 4, TopP: 0.1}, 0},
		{[]float32{1, 5, 5, 5, 5, 5, 5, 5}, Params{Temperature: 1, TopK: 5, TopP: 0.1}, 1},
		{[]float32{0, 5, 5, 5}, Params{Temperature: 1, TopP: 0.1}, 1},
		{[]float32{-3, 5, 1, 5, 5}, Params{Temperature: 1, TopP: 0.1}, 1},
		{[]float32{-1, 0, negZero, -3}, Params{Temperature: 1, TopP: 0.1}, 1},
		{[]float32{-1, negZero, 0, -3}, Params{Temperature: 1, TopP: 0.1}, 1},
	} {
		s := mustNew(t, tc.p, len(tc.x))
		for i := 0; i < 100; i++ {
			if got := s.Sample(tc.x, nil); got != tc.want {
				t.Fatalf("x=%v %+v: got %d, want %d", tc.x, tc.p, got, tc.want)
			}
		}
	}
}

// TestProbsMatchesSample checks that Probs describes exactly what Sample
// draws from, for a combination of all filters, and that it matches an
// independent reference computation.
func TestProbsMatchesSample(t *testing.T) {
	x := []float32{3, 2.5, 2.5, 1, 0, -1, 2.9, 0.2}
	p := Params{Temperature: 0.9, TopK: 6, TopP: 0.8, MinP: 0.2, Seed: 11}
	s := mustNew(t, p, len(x))
	probs := make([]float32, len(x))
	s.Probs(probs, x, nil)

	// Reference: top-6 by logit = ids 0,6,1,2,3,7; softmax at T=0.9;
	// nucleus to 0.8; min-p 0.2 of max; renormalise.
	order := []int{0, 6, 1, 2, 3, 7}
	w := make([]float64, len(order))
	sum := 0.0
	for i, id := range order {
		w[i] = math.Exp((float64(x[id]) - 3) / 0.9)
		sum += w[i]
	}
	cum, keep := 0.0, 0
	for keep < len(order) {
		cum += w[keep]
		keep++
		if cum >= 0.8*sum {
			break
		}
	}
	ref := make([]float64, len(x))
	tot := 0.0
	for i := 0; i < keep; i++ {
		if w[i] >= 0.2*w[0] {
			ref[order[i]] = w[i]
			tot += w[i]
		}
	}
	total := float32(0)
	for i := range ref {
		ref[i] /= tot
		if math.Abs(float64(probs[i])-ref[i]) > 1e-6 {
			t.Fatalf("Probs[%d] = %v, reference %v (all %v vs %v)", i, probs[i], ref[i], probs, ref)
		}
		total += probs[i]
	}
	if math.Abs(float64(total)-1) > 1e-5 {
		t.Fatalf("Probs sum to %v", total)
	}

	const draws = 200000
	counts := make([]int, len(x))
	for i := 0; i < draws; i++ {
		counts[s.Sample(x, nil)]++
	}
	dof := -1
	for _, r := range ref {
		if r > 0 {
			dof++
		}
	}
	if x2 := chiSquare(t, counts, ref, draws); x2 > chi2Crit999[dof] {
		t.Fatalf("chi-square %.2f > %.2f; counts %v, want %v", x2, chi2Crit999[dof], counts, ref)
	}

	// Greedy Probs is one-hot on the (lowest-id) argmax.
	g := mustNew(t, Params{}, len(x))
	g.Probs(probs, []float32{1, 4, 4, 0}, nil)
	for i, v := range probs {
		want := float32(0)
		if i == 1 {
			want = 1
		}
		if v != want {
			t.Fatalf("greedy Probs = %v, want one-hot at 1", probs)
		}
	}
}

// TestTopPLargeVocab checks the pre-cut nucleus path against a brute-force
// full sort on a vocabulary large enough for the cut to matter.
func TestTopPLargeVocab(t *testing.T) {
	x := randLogits(3, 50000)
	for i := 0; i < 50; i++ {
		x[i*7] += 8 // a few dominant tokens so the nucleus is small
	}
	x[10] = x[7] // an exact tie across ids
	for _, topP := range []float64{0.3, 0.9, 0.999, 0.9999999} {
		p := Params{Temperature: 1, TopP: topP}
		s := mustNew(t, p, len(x))
		got := make([]float32, len(x))
		s.Probs(got, x, nil)

		ids := make([]int, len(x))
		for i := range ids {
			ids[i] = i
		}
		// Insertion into a sorted order by (logit desc, id asc).
		sortInts(ids, func(a, b int) bool {
			return x[a] > x[b] || (x[a] == x[b] && a < b)
		})
		w := make([]float64, len(x))
		sum := 0.0
		m := float64(x[ids[0]])
		for _, id := range ids {
			w[id] = math.Exp(float64(x[id]) - m)
			sum += w[id]
		}
		cum, keep := 0.0, 0
		for keep < len(ids) {
			cum += w[ids[keep]]
			keep++
			if cum >= topP*sum {
				break
			}
		}
		for r, id := range ids {
			want := 0.0
			if r < keep {
				want = w[id] / cum
			}
			if math.Abs(float64(got[id])-want) > 1e-7 {
				t.Fatalf("top_p %v: token %d (rank %d, keep %d) got %v want %v", topP, id, r, keep, got[id], want)
			}
		}
	}
}

func sortInts(a []int, less func(a, b int) bool) {
	// A plain merge sort keeps the reference independent of the code under
	// test, which uses sort.Sort.
	if len(a) < 2 {
		return
	}
	mid := len(a) / 2
	l := append([]int(nil), a[:mid]...)
	r := append([]int(nil), a[mid:]...)
	sortInts(l, less)
	sortInts(r, less)
	i, j := 0, 0
	for k := range a {
		if j >= len(r) || (i < len(l) && !less(r[j], l[i])) {
			a[k] = l[i]
			i++
		} else {
			a[k] = r[j]
			j++
		}
	}
}

func TestPenalties(t *testing.T) {
	x := []float32{2, -2, 1, 0.5, 0}
	hist := []int{0, 1, 1, 4, -3, 99} // out-of-range ids are ignored

	s := mustNew(t, Params{Temperature: 1, RepetitionPenalty: 2}, len(x))
	s.distribution(x, hist)
	want := []float64{1, -4, 1, 0.5, 0}
	for i, w := range want {
		if s.z[i] != w {
			t.Fatalf("repetition: z = %v, want %v", s.z[:len(x)], want)
		}
	}

	s = mustNew(t, Params{Temperature: 1, PresencePenalty: 0.5, FrequencyPenalty: 0.25}, len(x))
	s.distribution(x, hist)
	want = []float64{2 - 0.5 - 0.25, -2 - 0.5 - 0.5, 1, 0.5, -0.5 - 0.25}
	for i, w := range want {
		if math.Abs(s.z[i]-w) > 1e-12 {
			t.Fatalf("presence/frequency: z = %v, want %v", s.z[:len(x)], want)
		}
	}

	s = mustNew(t, Params{Temperature: 1, RepetitionPenalty: 2, PresencePenalty: 1, FrequencyPenalty: 0.5}, len(x))
	s.distribution(x, hist)
	want = []float64{1 - 1 - 0.5, -4 - 1 - 1, 1, 0.5, 0 - 1 - 0.5}
	for i, w := range want {
		if math.Abs(s.z[i]-w) > 1e-12 {
			t.Fatalf("combined: z = %v, want %v", s.z[:len(x)], want)
		}
	}
	// Counts must be reset between calls: the next call sees id 1 once.
	s.distribution(x, []int{1})
	want = []float64{2, -4 - 1 - 0.5, 1, 0.5, 0}
	for i, w := range want {
		if math.Abs(s.z[i]-w) > 1e-12 {
			t.Fatalf("penalty leaked into the next call: z = %v, want %v", s.z[:len(x)], want)
		}
	}

	// The caller's logits are untouched, and greedy honours penalties.
	y := []float32{3, 2.5, 0}
	g := mustNew(t, Params{RepetitionPenalty: 1.5}, len(y))
	if got := g.Sample(y, []int{0}); got != 1 {
		t.Fatalf("greedy with repetition penalty: got %d, want 1", got)
	}
	if y[0] != 3 {
		t.Fatalf("Sample modified logits: %v", y)
	}
}

func TestAcceptDraft(t *testing.T) {
	p := []float32{0.1, 0.2, 0.3, 0.4}
	q := []float32{0.4, 0.3, 0.2, 0.1}
	pp := []float64{0.1, 0.2, 0.3, 0.4}
	s := mustNew(t, Params{Temperature: 1, Seed: 77}, len(p))
	const draws = 200000
	counts := make([]int, len(p))
	accepted := 0
	for i := 0; i < draws; i++ {
		x := s.SampleFrom(q)
		tok, ok := s.AcceptDraft(p, q, x)
		if ok {
			accepted++
			if tok != x {
				t.Fatalf("accepted token %d != draft %d", tok, x)
			}
		}
		counts[tok]++
	}
	if x2 := chiSquare(t, counts, pp, draws); x2 > chi2Crit999[3] {
		t.Fatalf("speculative output chi-square %.2f; counts %v, want p %v", x2, counts, pp)
	}
	// The acceptance rate is sum(min(p, q)) = 0.6.
	if rate := float64(accepted) / draws; math.Abs(rate-0.6) > 0.01 {
		t.Fatalf("acceptance rate %.4f, want 0.6", rate)
	}

	for i := 0; i < 10000; i++ {
		x := s.SampleFrom(p)
		if tok, ok := s.AcceptDraft(p, p, x); !ok || tok != x {
			t.Fatalf("p == q: draft %d rejected (got %d, %v)", x, tok, ok)
		}
	}

	// A draft the target forbids is always replaced.
	pz := []float32{0, 0.5, 0.5, 0}
	for i := 0; i < 1000; i++ {
		tok, ok := s.AcceptDraft(pz, q, 0)
		if ok || (tok != 1 && tok != 2) {
			t.Fatalf("forbidden draft: got %d, %v", tok, ok)
		}
	}
	// Out-of-range drafts do not panic and fall back to p.
	if tok, ok := s.AcceptDraft(p, q, 17); ok || tok < 0 || tok >= len(p) {
		t.Fatalf("out-of-range draft: got %d, %v", tok, ok)
	}
	if tok, ok := s.AcceptDraft(nil, nil, 0); ok || tok != -1 {
		t.Fatalf("empty p: got %d, %v", tok, ok)
	}
}

func TestSampleFrom(t *testing.T) {
	s := mustNew(t, Params{Temperature: 1, Seed: 3}, 0)
	probs := []float32{0.5, 0, float32(math.NaN()), 0.25, -1, 0.25}
	want := []float64{0.5, 0, 0, 0.25, 0, 0.25}
	const draws = 100000
	counts := make([]int, len(probs))
	for i := 0; i < draws; i++ {
		counts[s.SampleFrom(probs)]++
	}
	if x2 := chiSquare(t, counts, want, draws); x2 > chi2Crit999[2] {
		t.Fatalf("SampleFrom chi-square %.2f; counts %v", x2, counts)
	}
	if got := s.SampleFrom(nil); got != -1 {
		t.Fatalf("SampleFrom(nil) = %d", got)
	}
	if got := s.SampleFrom([]float32{0, 0, 0}); got != 0 {
		t.Fatalf("SampleFrom(zeros) = %d", got)
	}
}

// TestCheckRepetitionPenalty checks the one rule the CLI and the API
// apply to a repetition penalty a user gives: (0, 10], 1 = off, 0 refused.
func TestCheckRepetitionPenalty(t *testing.T) {
	for _, r := range []float64{0, -1, math.NaN(), math.Inf(1), 10.5} {
		if err := CheckRepetitionPenalty(r); err == nil || !strings.Contains(err.Error(), "repetition_penalty must be in (0, 10] (1 = off)") {
			t.Errorf("CheckRepetitionPenalty(%v) = %v", r, err)
		}
	}
	for _, r := range []float64{0.5, 1, 1.1, 10} {
		if err := CheckRepetitionPenalty(r); err != nil {
			t.Errorf("CheckRepetitionPenalty(%v) = %v", r, err)
		}
	}
}

func TestValidate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	bad := []Params{
		{Temperature: -0.1},
		{Temperature: nan},
		{Temperature: inf},
		{TopK: -1},
		{TopP: 1.01},
		{TopP: -0.1},
		{TopP: nan},
		{MinP: 1.5},
		{MinP: -0.01},
		{MinP: nan},
		{RepetitionPenalty: -1},
		{RepetitionPenalty: nan},
		{RepetitionPenalty: inf},
		{RepetitionPenalty: 10.5},
		{PresencePenalty: nan},
		{FrequencyPenalty: -inf},
	}
	for _, p := range bad {
		if err := p.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want error", p)
		}
		if _, err := New(p, 10); err == nil {
			t.Errorf("New(%+v) accepted invalid params", p)
		}
	}
	good := []Params{
		{},
		{Temperature: 0.7, TopK: 50, TopP: 0.95, MinP: 0.05, RepetitionPenalty: 1.1, PresencePenalty: -2, FrequencyPenalty: 2},
		{Temperature: 1, TopP: 1, MinP: 1, RepetitionPenalty: 0},
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
	if _, err := New(Params{}, -1); err == nil {
		t.Error("New accepted a negative vocab")
	}
	if !(Params{}).Greedy() || (Params{Temperature: 0.5}).Greedy() {
		t.Error("Greedy() wrong")
	}
}

func TestBadInputNoPanic(t *testing.T) {
	s := mustNew(t, Params{Temperature: 1, TopK: 3, TopP: 0.5}, 4)
	if got := s.Sample(nil, []int{1, 2}); got != -1 {
		t.Fatalf("Sample(nil) = %d, want -1", got)
	}
	ninf := float32(math.Inf(-1))
	if got := s.Sample([]float32{ninf, ninf}, nil); got != 0 {
		t.Fatalf("all -Inf: got %d, want 0", got)
	}
	// Masked tokens are never drawn; +Inf wins outright.
	masked := []float32{ninf, 1, float32(math.NaN()), 1}
	for i := 0; i < 1000; i++ {
		if got := s.Sample(masked, []int{-1, 1 << 40}); got != 1 && got != 3 {
			t.Fatalf("drew masked token %d", got)
		}
	}
	if got := s.Sample([]float32{1, float32(math.Inf(1)), 2}, nil); got != 1 {
		t.Fatalf("+Inf logit: got %d, want 1", got)
	}
	// A larger vocab than New was told about grows the scratch.
	big := randLogits(1, 100)
	if got := s.Sample(big, []int{5, 99}); got < 0 || got >= len(big) {
		t.Fatalf("grown vocab: got %d", got)
	}
	short := make([]float32, 2)
	s.Probs(short, big, nil) // must not panic
	s.Probs(nil, big, nil)
}

func TestZeroAllocs(t *testing.T) {
	const vocab = 32000
	x := randLogits(5, vocab)
	hist := make([]int, 300)
	for i := range hist {
		hist[i] = (i * 97) % vocab
	}
	dst := make([]float32, vocab)
	p4 := []float32{0.1, 0.2, 0.3, 0.4}
	q4 := []float32{0.4, 0.3, 0.2, 0.1}
	for _, p := range []Params{
		{},
		{Temperature: 1},
		{Temperature: 0.8, TopK: 40},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 0.8, TopP: 0.9999999},
		{Temperature: 0.8, TopK: 200, TopP: 0.9, MinP: 0.05},
		{Temperature: 1, MinP: 0.1, RepetitionPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.2},
	} {
		s := mustNew(t, p, vocab)
		s.Sample(x, hist)
		if a := testing.AllocsPerRun(100, func() { s.Sample(x, hist) }); a != 0 {
			t.Errorf("%+v: Sample allocs %v", p, a)
		}
		if a := testing.AllocsPerRun(100, func() { s.Probs(dst, x, hist) }); a != 0 {
			t.Errorf("%+v: Probs allocs %v", p, a)
		}
		if a := testing.AllocsPerRun(100, func() { s.AcceptDraft(p4, q4, 0) }); a != 0 {
			t.Errorf("%+v: AcceptDraft allocs %v", p, a)
		}
	}
}

func TestLogSoftmax(t *testing.T) {
	cases := [][]float32{
		{1, 2, 3, 4},
		{0},
		{1000, 999, -1000, 0},
		{-50, -50, -50},
		randLogits(8, 1000),
	}
	for _, x := range cases {
		dst := make([]float32, len(x))
		LogSoftmax(dst, x)
		m := math.Inf(-1)
		for _, v := range x {
			m = math.Max(m, float64(v))
		}
		s := 0.0
		for _, v := range x {
			s += math.Exp(float64(v) - m)
		}
		lse := m + math.Log(s)
		for i, v := range x {
			ref := float64(v) - lse
			// float32 output cannot be closer than half an ulp, which
			// exceeds 1e-6 once |ref| >= 16, hence the relative slack.
			if d := math.Abs(float64(dst[i]) - ref); d > 1e-6*math.Max(1, math.Abs(ref)) {
				t.Fatalf("x=%v: dst[%d]=%v ref %v (diff %g)", x[:min(len(x), 4)], i, dst[i], ref, d)
			}
		}
	}
	ninf := float32(math.Inf(-1))
	dst := make([]float32, 3)
	LogSoftmax(dst, []float32{ninf, 0, 0})
	if !math.IsInf(float64(dst[0]), -1) || math.Abs(float64(dst[1])+math.Ln2) > 1e-6 {
		t.Fatalf("with -Inf: %v", dst)
	}
	LogSoftmax(dst, []float32{ninf, ninf, ninf})
	for _, v := range dst {
		if !math.IsInf(float64(v), -1) {
			t.Fatalf("all -Inf: %v", dst)
		}
	}
	LogSoftmax(dst[:1], []float32{1, 2, 3}) // short dst must not panic
	LogSoftmax(dst, nil)
}

func benchSample(b *testing.B, p Params) {
	const vocab = 128000
	x := randLogits(1, vocab)
	hist := make([]int, 1000)
	for i := range hist {
		hist[i] = (i * 7919) % vocab
	}
	s, err := New(p, vocab)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Sample(x, hist)
	}
}

func BenchmarkSampleGreedy(b *testing.B) { benchSample(b, Params{RepetitionPenalty: 1.1}) }
func BenchmarkSamplePlain(b *testing.B)  { benchSample(b, Params{Temperature: 1}) }
func BenchmarkSampleTopK(b *testing.B)   { benchSample(b, Params{Temperature: 0.8, TopK: 50}) }
func BenchmarkSampleTopP(b *testing.B)   { benchSample(b, Params{Temperature: 0.8, TopP: 0.95}) }
func BenchmarkSampleTopPWide(b *testing.B) {
	// High temperature on flat logits defeats the pre-cut: worst case.
	benchSample(b, Params{Temperature: 5, TopP: 0.999})
}

// TestScratchBytes: what a sampler holds after sampling with every step on
// (penalties, top-k, top-p, min-p) is within ScratchBytes, which the
// memory budget counts for each sequence.
func TestScratchBytes(t *testing.T) {
	const V = 100000
	logits := make([]float32, V)
	for i := range logits {
		logits[i] = float32(i%977) / 97
	}
	p := Params{Temperature: 0.8, TopK: V, TopP: 0.95, MinP: 0.01, RepetitionPenalty: 1.1, PresencePenalty: 0.5, FrequencyPenalty: 0.5, Seed: 1}
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	s, err := New(p, V)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.Sample(logits, []int{1, 2, 3, 2})
	}
	runtime.GC()
	runtime.ReadMemStats(&b)
	got, want := int64(b.HeapAlloc)-int64(a.HeapAlloc), ScratchBytes(V)
	if got > want+4096 || got < want*9/10 {
		t.Errorf("a sampler over %d tokens holds %d bytes, ScratchBytes says %d", V, got, want)
	}
	runtime.KeepAlive(s)
}
