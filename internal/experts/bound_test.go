package experts

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A routeModel draws decodes that share two statistics with a recorded
// one and hold nothing else an online policy could learn from: each
// layer's expert frequencies and how often a layer repeats the experts it
// chose a token before. At each layer a token chooses K distinct experts,
// expert e with probability (1-keep)·freq[e] + keep·[e was chosen a token
// before] (freq sums to K over the layer, as the recorded shares do). The
// frequencies are those of the whole decode, so an online policy knows
// from the start what the recorded decode only reveals as it runs.
type routeModel struct {
	L, E, K int
	freq    [][]float64 // [layer][expert] the share of tokens that chose it
	keep    []float64   // [layer] the weight of the previous token's choices
}

// fitRouteModel returns x's frequencies and, when repeats, each layer's
// keep weight set so that the model repeats a token's choices at the next
// token as often as x does; otherwise every keep is 0 and tokens route
// independently.
func fitRouteModel(x routeTrace, repeats bool) routeModel {
	md := routeModel{L: x.L, E: x.E, K: x.K, freq: make([][]float64, x.L), keep: make([]float64, x.L)}
	T := len(x.tr) / x.L
	for l := range md.freq {
		md.freq[l] = make([]float64, x.E)
	}
	for _, step := range x.tr {
		for _, r := range step {
			md.freq[int(r)/x.E][int(r)%x.E] += 1 / float64(T)
		}
	}
	if !repeats {
		return md
	}
	// A layer repeats a share keep + (1-keep)·o of the previous token's
	// choices, where o is the frequency they carry: solve for keep.
	again := make([]float64, x.L) // [layer] choices repeated at the next token
	carry := make([]float64, x.L) // [layer] the frequencies of the previous choices
	for i := x.L; i < len(x.tr); i++ {
		l := int(x.tr[i][0]) / x.E
		prev := x.tr[i-x.L]
		for _, r := range x.tr[i] {
			if slices.Contains(prev, r) {
				again[l]++
			}
		}
		for _, p := range prev {
			carry[l] += md.freq[l][int(p)%x.E]
		}
	}
	for l := range md.keep {
		n := float64(x.K * (T - 1))
		r, o := again[l]/n, carry[l]/n
		md.keep[l] = max(0, (r-o)/(1-o))
	}
	return md
}

// draw returns T tokens drawn from md (seeded) and, for each of slots, a
// bound on the hits that any policy which cannot see the future expects
// on such a decode with a pool of that many slots, fetching on demand as
// the Stream does (Belady's optimum sees the future and is not bound by
// it). Why it bounds: a record of layer l enters the pool only at layer
// l's step, a miss, so the records of layer l resident at its step of
// token t were all resident just before token t's first step, when the
// pool held at most slots records. At that point the model's chances of
// each expert being chosen at token t (q below) are fixed by what token
// t-1 chose, and the hits expected at layer l are the sum of q over its
// resident records: at most the slots largest q over all layers together.
// The bound is that sum, summed along the drawn decode.
func (md routeModel) draw(T int, seed uint64, slots []int) (Trace, []float64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	bound := make([]float64, len(slots))
	var tr Trace
	prev := make([][]int32, md.L)
	q := make([][]float64, md.L)
	all := make([]float64, 0, md.L*md.E)
	for l := range q {
		q[l] = make([]float64, md.E)
	}
	for range T {
		all = all[:0]
		for l := range q {
			for e, f := range md.freq[l] {
				q[l][e] = f
				if prev[l] != nil {
					q[l][e] *= 1 - md.keep[l]
				}
			}
			for _, r := range prev[l] {
				q[l][int(r)%md.E] += md.keep[l]
			}
			all = append(all, q[l]...)
		}
		slices.Sort(all)
		for i, s := range slots {
			for _, v := range all[max(len(all)-s, 0):] {
				bound[i] += v
			}
		}
		for l := range q {
			step := choose(rng, q[l], md.K, int32(l*md.E), make([]int32, 0, md.K))
			prev[l] = step
			tr = append(tr, step)
		}
	}
	return tr, bound
}

// choose returns k distinct records base+e, e chosen with probability
// exactly q[e] (q sums to k, each at most 1): systematic sampling, k
// points a unit apart from a random start laid over the q's in a random
// order, each point choosing the interval it falls in. An interval is at
// most a unit long, so no two points fall in one.
func choose(rng *rand.Rand, q []float64, k int, base int32, dst []int32) []int32 {
	u := rng.Float64()
	var cum float64
	var last int32 = -1
	for _, e := range rng.Perm(len(q)) {
		if q[e] <= 0 {
			continue
		}
		lo := cum
		cum += q[e]
		last = base + int32(e)
		// The first point at or past lo: u+j for the least j >= lo-u.
		if j := math.Ceil(lo - u); u+j < cum && int(j) < k {
			dst = append(dst, last)
		}
	}
	if len(dst) < k && last >= 0 && !slices.Contains(dst, last) {
		dst = append(dst, last) // the last point fell past a sum rounded below k
	}
	return dst
}

// TestChoose draws from fixed chances many times: every draw holds k
// distinct records, and each is chosen as often as its chance says
// (within 4.5 standard deviations), including chances of 0 and 1.
func TestChoose(t *testing.T) {
	q := []float64{1, 0, 0.5, 0.25, 0.25, 0.9, 0.1, 0.6, 0.4, 0, 0.3, 0.7}
	const k, n = 5, 40000
	rng := rand.New(rand.NewPCG(3, 4))
	count := make([]int, len(q))
	var dst []int32
	for range n {
		dst = choose(rng, q, k, 100, dst[:0])
		if len(dst) != k {
			t.Fatalf("a draw of %d records, want %d: %v", len(dst), k, dst)
		}
		for i, r := range dst {
			if r < 100 || int(r) >= 100+len(q) || slices.Contains(dst[:i], r) {
				t.Fatalf("draw %v: not %d distinct records of 100..%d", dst, k, 100+len(q)-1)
			}
			count[r-100]++
		}
	}
	for e, p := range q {
		got := float64(count[e]) / n
		if tol := 4.5*math.Sqrt(p*(1-p)/n) + 1e-12; math.Abs(got-p) > tol {
			t.Errorf("expert %d chosen in %.4f of draws, want %.4f ± %.4f", e, got, p, tol)
		}
	}
}

// TestOnlineBound draws decodes from each recorded trace's model, with
// tokens routed independently and with the trace's repeats, and requires
// every policy to hit no more than the bound (draw) allows, within 1% for
// the draw's chance; the next-token oracle, which sees a token ahead, must
// beat it at 10%, so that the bound is not one nothing could reach. It
// logs (-v) the table in the README: on each trace and pool, the
// optimum's hit rate, then markov's and the bound's fractions of it, on
// the recorded decode and on two drawn decodes of each model (one at the synth shapes).
func TestOnlineBound(t *testing.T) {
	var tab strings.Builder
	fmt.Fprintf(&tab, "%-22s %5s | %8s %7s | %8s %7s %7s | %8s %7s %7s\n", "trace", "pool",
		"optimum", "markov", "optimum", "bound", "markov", "optimum", "bound", "markov")
	for _, x := range routeTraces(t) {
		seeds := uint64(2)
		if x.L*x.E > 512 {
			seeds = 1 // the synth shapes: the most costly, and 10 to 40 times the tiny traces' steps a token
		}
		T := len(x.tr) / x.L
		shares := []int{5, 10, 25}
		slots := make([]int, len(shares))
		for i, s := range shares {
			slots[i] = x.L * x.E * s / 100
		}
		rows := make([]string, len(shares))
		for i, s := range slots {
			bh, n := BeladyHits(x.tr, s)
			mh, _, err := SimulateHits(x.tr, s, DefaultPolicy, x.L, x.E)
			if err != nil {
				t.Fatal(err)
			}
			rows[i] = fmt.Sprintf("%-22s %4d%% | %7.1f%% %6.2fx", x.name, shares[i], 100*float64(bh)/float64(n), float64(mh)/float64(bh))
		}
		for _, repeats := range []bool{false, true} {
			md := fitRouteModel(x, repeats)
			bound := make([]float64, len(slots))
			opt := make([]int, len(slots))
			hits := make([]map[Policy]int, len(slots))
			oracle := make([]int, len(slots))
			var n int
			for seed := range seeds {
				tr, b := md.draw(T, seed, slots)
				for i, s := range slots {
					bound[i] += b[i]
					h, m := BeladyHits(tr, s)
					opt[i] += h
					if i == 0 {
						n += m
					}
					if hits[i] == nil {
						hits[i] = map[Policy]int{}
					}
					for _, p := range Policies {
						if x.L*x.E > 512 && p != DefaultPolicy {
							continue // the tiny traces check the rest; these cost the most
						}
						h, _, err := SimulateHits(tr, s, p, x.L, x.E)
						if err != nil {
							t.Fatal(err)
						}
						hits[i][p] += h
					}
					if shares[i] == 10 && x.L*x.E <= 512 {
						h, _, err := simulate(tr, s, DefaultPolicy, x.L, x.E, nextTokenOracle(tr, x.L, x.E))
						if err != nil {
							t.Fatal(err)
						}
						oracle[i] += h
					}
				}
			}
			for i := range slots {
				for p, h := range hits[i] {
					if float64(h) > 1.01*bound[i] {
						t.Errorf("%s, repeats %v, pool %d%%: %s hits %d, above the bound of %.0f", x.name, repeats, shares[i], p, h, bound[i])
					}
				}
				if shares[i] == 10 && x.L*x.E <= 512 && float64(oracle[i]) <= bound[i] {
					t.Errorf("%s, repeats %v, pool 10%%: the next-token oracle hits %d, not above the bound of %.0f", x.name, repeats, oracle[i], bound[i])
				}
				o := float64(opt[i])
				rows[i] += fmt.Sprintf(" | %7.1f%% %6.2fx %6.2fx", 100*o/float64(n), bound[i]/o, float64(hits[i][DefaultPolicy])/o)
			}
		}
		for _, r := range rows {
			tab.WriteString(r + "\n")
		}
	}
	t.Logf("decode hit rate of the optimum, and fractions of it: markov's on the recorded decode; the online bound's and markov's on decodes drawn with independent tokens, then with the recorded repeats:\n%s", tab.String())
}
