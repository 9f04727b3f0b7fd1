package experts

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/testutil"
)

// benchPrompt is where a recorded trace's decode starts: the positions
// before it are the prompt (`sluice bench --prompt`'s default), and the
// decode is replayed from an empty pool, as bench replays its own.
const benchPrompt = 512

// routeTrace is the decode of one recorded or synthetic route table.
type routeTrace struct {
	name    string
	L, E, K int
	tr      Trace // one step per layer per position from benchPrompt on
}

// stepsFrom is the trace of routes (by layer, then position) from
// position from on, for experts experts a layer.
func stepsFrom(routes [][][]int, experts, from int) Trace {
	var tr Trace
	for p := from; p < len(routes[0]); p++ {
		for l := range routes {
			step := make([]int32, len(routes[l][p]))
			for k, e := range routes[l][p] {
				step[k] = int32(l*experts + e)
			}
			tr = append(tr, step)
		}
	}
	return tr
}

// routeTraces loads the decodes to measure policies on: the routes each
// test model recorded on the first long prompt (refs routes_long0: the
// shared tiny models', and those of the repository's own that recorded
// them), and what `sluice synth` replays from the tiny Qwen3.5 model's
// (the recording embedded in the binary) at the shapes of Qwen3.5-35B-A3B
// and Qwen3-30B-A3B, through LoadRoutes.
func routeTraces(t testing.TB) []routeTrace {
	t.Helper()
	var out []routeTrace
	if _, err := os.Stat(filepath.Join("..", "..", "..", "shared", "refs")); err != nil {
		t.Skip("no shared refs:", err)
	}
	for _, name := range testutil.Models {
		r := testutil.LoadRefs(t, name)
		if len(r.Routes) == 0 {
			continue // a model whose references recorded no routes
		}
		if len(r.Routes[0]) <= benchPrompt {
			t.Fatalf("%s: routes_long0 of %d positions, want more than %d", name, len(r.Routes[0]), benchPrompt)
		}
		var c struct {
			Experts int `json:"num_experts"`
			Routed  int `json:"n_routed_experts"`
			Local   int `json:"num_local_experts"`
		}
		b, err := os.ReadFile(filepath.Join(testutil.ModelDir(t, name), "config.json"))
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		E := max(c.Experts, c.Routed, c.Local)
		if err != nil || E == 0 {
			t.Fatalf("%s: experts per layer from config.json: %v", name, err)
		}
		out = append(out, routeTrace{name: name, L: len(r.Routes), E: E, K: len(r.Routes[0][0]), tr: stepsFrom(r.Routes, E, benchPrompt)})
		if name != "tiny-qwen3-5-moe" {
			continue
		}
		dir := t.TempDir()
		j, err := json.Marshal(map[string]any{"experts": E, "routes": r.Routes})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, RoutesFile), j, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, like := range []struct {
			name    string
			L, E, K int
		}{{"synth-qwen3.5-35b-a3b", 40, 256, 8}, {"synth-qwen3-30b-a3b", 48, 128, 8}} {
			route, err := LoadRoutes(dir, &format.Config{Experts: like.E, TopK: like.K})
			if err != nil {
				t.Fatal(err)
			}
			syn := make([][][]int, like.L)
			for l := range syn {
				syn[l] = make([][]int, len(r.Routes[0]))
			}
			for p := range syn[0] { // position-major, as the forward asks
				for l := range syn {
					syn[l][p] = make([]int, like.K)
					route(l, p, syn[l][p])
				}
			}
			out = append(out, routeTrace{name: like.name, L: like.L, E: like.E, K: like.K, tr: stepsFrom(syn, like.E, benchPrompt)})
		}
	}
	return append(out, extraRouteTraces(t)...)
}

// extraRouteTraces loads the route files that $SLUICE_ROUTES lists (paths
// separated as in $PATH), each in RoutesFile's format ({"experts": E,
// "routes": [layer][position][k]}), so that the policy tables and the
// bound can be measured on routes recorded from any model: a model's
// routes on a long text, each position once.
func extraRouteTraces(t testing.TB) []routeTrace {
	t.Helper()
	var out []routeTrace
	for _, f := range filepath.SplitList(os.Getenv("SLUICE_ROUTES")) {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Experts int       `json:"experts"`
			Routes  [][][]int `json:"routes"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if r.Experts <= 0 || len(r.Routes) == 0 || len(r.Routes[0]) <= benchPrompt || len(r.Routes[0][0]) == 0 {
			t.Fatalf("%s: %d experts, %d layers: want experts, and routes of more than %d positions", f, r.Experts, len(r.Routes), benchPrompt)
		}
		K := len(r.Routes[0][0])
		for l, rl := range r.Routes {
			if len(rl) != len(r.Routes[0]) {
				t.Fatalf("%s: layer %d has %d positions, layer 0 %d", f, l, len(rl), len(r.Routes[0]))
			}
			for p, ids := range rl {
				seen := map[int]bool{}
				for _, e := range ids {
					if e < 0 || e >= r.Experts || seen[e] {
						t.Fatalf("%s: layer %d, position %d: experts %v, want %d distinct in [0,%d)", f, l, p, ids, K, r.Experts)
					}
					seen[e] = true
				}
				if len(ids) != K {
					t.Fatalf("%s: layer %d, position %d: %d experts, want %d", f, l, p, len(ids), K)
				}
			}
		}
		name := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		out = append(out, routeTrace{name: name, L: len(r.Routes), E: r.Experts, K: K, tr: stepsFrom(r.Routes, r.Experts, benchPrompt)})
	}
	return out
}

// TestPolicyTable replays each trace's decode from an empty pool of 5,
// 10, 25, 50 and 100% of the records under the optimal eviction and every
// policy, and logs (-v) each policy's hit rate and its fraction of the
// optimum's (the README's table). No policy may beat the optimum, none
// may beat the default (which is why it is the default), and with room
// for every record only first requests miss.
func TestPolicyTable(t *testing.T) {
	var tab strings.Builder
	fmt.Fprintf(&tab, "%-22s %5s %8s", "trace", "pool", "optimum")
	for _, p := range Policies {
		fmt.Fprintf(&tab, " %15s", p)
	}
	fmt.Fprintf(&tab, " %15s\n", "next-token")
	sum := map[Policy]map[int]float64{}
	oracleSum := map[int]float64{}
	traces := routeTraces(t)
	for _, x := range traces {
		distinct := map[int32]bool{}
		for _, step := range x.tr {
			for _, r := range step {
				distinct[r] = true
			}
		}
		for _, share := range []int{5, 10, 25, 50, 100} {
			slots := x.L * x.E * share / 100
			bh, n := BeladyHits(x.tr, slots)
			fmt.Fprintf(&tab, "%-22s %4d%% %7.1f%%", x.name, share, 100*float64(bh)/float64(n))
			hits := map[Policy]int{}
			for _, p := range Policies {
				h, m, err := SimulateHits(x.tr, slots, p, x.L, x.E)
				if err != nil || m != n {
					t.Fatalf("%s, %s: %d requests (%v), want %d", x.name, p, m, err, n)
				}
				hits[p] = h
				if h > bh {
					t.Errorf("%s, pool %d%%: %s hits %d, above the optimum's %d", x.name, share, p, h, bh)
				}
				if share == 100 && h != n-len(distinct) {
					t.Errorf("%s, pool of every record: %s hits %d, want %d (all but first uses)", x.name, p, h, n-len(distinct))
				}
				f := float64(h) / float64(bh)
				fmt.Fprintf(&tab, " %5.1f%% (%.2fx)", 100*float64(h)/float64(n), f)
				if sum[p] == nil {
					sum[p] = map[int]float64{}
				}
				sum[p][share] += f / float64(len(traces))
			}
			// What the default would hit if it also knew the next
			// token's routes: markov's ceiling, were its one-token
			// prediction perfect. Only the small pools: the replay costs
			// the most in large ones, and there every policy is near the
			// optimum.
			if share <= 10 {
				oh, _, err := simulate(x.tr, slots, DefaultPolicy, x.L, x.E, nextTokenOracle(x.tr, x.L, x.E))
				if err != nil {
					t.Fatal(err)
				}
				if oh > bh {
					t.Errorf("%s, pool %d%%: the next-token oracle hits %d, above the optimum's %d", x.name, share, oh, bh)
				}
				fmt.Fprintf(&tab, " %5.1f%% (%.2fx)", 100*float64(oh)/float64(n), float64(oh)/float64(bh))
				oracleSum[share] += float64(oh) / float64(bh) / float64(len(traces))
			}
			tab.WriteString("\n")
			for p, h := range hits {
				if h > hits[DefaultPolicy] {
					t.Errorf("%s, pool %d%%: %s hits %d, the default %s %d", x.name, share, p, h, DefaultPolicy, hits[DefaultPolicy])
				}
			}
			if share == 100 && bh != n-len(distinct) {
				t.Errorf("%s, pool of every record: optimum hits %d, want %d", x.name, bh, n-len(distinct))
			}
		}
	}
	for _, share := range []int{5, 10, 25, 50} {
		fmt.Fprintf(&tab, "%-22s %4d%% %8s", "mean fraction", share, "")
		for _, p := range Policies {
			fmt.Fprintf(&tab, " %15s", fmt.Sprintf("%.2fx", sum[p][share]))
		}
		if share <= 10 {
			fmt.Fprintf(&tab, " %15s", fmt.Sprintf("%.2fx", oracleSum[share]))
		}
		tab.WriteString("\n")
	}
	t.Logf("decode hit rate from an empty pool (positions %d on), and the fraction of the optimum's:\n%s", benchPrompt, tab.String())
}

// nextTokenOracle returns a score bonus for simulate that knows the
// requests of the next token (the L steps after the current one) and
// nothing beyond: a record requested among them outranks every other, the
// sooner the higher, and the rest keep the policy's order.
func nextTokenOracle(tr Trace, L, E int) func(step int, rec int32) float64 {
	uses := make([][]int, L*E) // [record] the steps that request it, ascending
	for i, step := range tr {
		for _, r := range step {
			uses[r] = append(uses[r], i)
		}
	}
	at := make([]int, L*E) // [record] its first use not yet passed (steps only go forward)
	return func(step int, rec int32) float64 {
		u, k := uses[rec], at[rec]
		for k < len(u) && u[k] <= step {
			k++
		}
		at[rec] = k
		if k == len(u) || u[k] > step+L {
			return 0
		}
		return float64(1<<40 - u[k])
	}
}

// TestSimulateMatchesStream drives a real Stream (no lookahead, top-k
// within its readers) with a recorded decode and requires SimulateHits to
// count the same hits under every policy and pool size: the offline
// replay that `sluice bench` prints is the pool's own behaviour.
func TestSimulateMatchesStream(t *testing.T) {
	const name = "tiny-qwen3-5-moe"
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "refs", name+".json"))
	if err != nil {
		t.Skip("no shared refs:", err)
	}
	var r struct {
		Routes [][][]int `json:"routes_long0"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Routes) == 0 {
		t.Fatalf("routes_long0: %v", err)
	}
	dir, man := testutil.PackedManifest(t, name, 4)
	L, E := man.ExpertLayers, man.Experts
	if L < len(r.Routes) { // the model may have more (an MTP layer's)
		t.Fatalf("%d expert layers, routes for %d", L, len(r.Routes))
	}
	tokens := 160
	if testing.Short() {
		tokens = 40
	}
	for l := range r.Routes {
		r.Routes[l] = r.Routes[l][:benchPrompt+tokens]
	}
	tr := stepsFrom(r.Routes, E, benchPrompt)
	for _, p := range Policies {
		for _, share := range []int{5, 10, 25} {
			slots := max(L*E*share/100, man.Config.TopK)
			s, err := Open(dir, man, Options{Slots: slots, Readers: man.Config.TopK, Policy: p})
			if err != nil {
				t.Fatal(err)
			}
			ids := make([]int, 0, man.Config.TopK)
			for _, step := range tr {
				ids = ids[:0]
				for _, rec := range step {
					ids = append(ids, int(rec)%E)
				}
				if err := s.Begin(int(step[0])/E, ids, model.Hint{}); err != nil {
					t.Fatal(err)
				}
				for range ids {
					if _, _, err := s.Next(); err != nil {
						t.Fatal(err)
					}
				}
			}
			got := s.Stats()
			s.Close()
			want, n, err := SimulateHits(tr, slots, p, L, E)
			if err != nil {
				t.Fatal(err)
			}
			if got.Hits != int64(want) || got.Hits+got.Misses != int64(n) {
				t.Errorf("%s, %d slots: the stream hit %d of %d, the replay %d of %d", p, slots, got.Hits, got.Hits+got.Misses, want, n)
			}
		}
	}
}

// BenchmarkPolicies replays the tiny Qwen3.5 model's recorded decode
// through a 10% pool, and the replayed qwen3.5-35b-a3b synth's (40 layers
// of 256 experts) through a 25% pool of 2560 slots, under each policy:
// ns/op is one replay, ns/request the cost of a request including the
// victim searches of its misses, and of_optimal the policy's hits as a
// fraction of Belady's.
func BenchmarkPolicies(b *testing.B) {
	traces := routeTraces(b)
	for _, c := range []struct {
		x     routeTrace
		share int
	}{{traces[0], 10}, {traces[1], 25}} {
		x := c.x
		slots := x.L * x.E * c.share / 100
		opt, _ := BeladyHits(x.tr, slots)
		for _, p := range Policies {
			b.Run(fmt.Sprintf("%s/%d%%/%s", x.name, c.share, p), func(b *testing.B) {
				var h, n int
				for b.Loop() {
					var err error
					if h, n, err = SimulateHits(x.tr, slots, p, x.L, x.E); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/request")
				b.ReportMetric(float64(h)/float64(opt), "of_optimal")
			})
		}
	}
}

// TestMarkovTextSwitch replays two texts in turn through one pool of 10%
// of the records: decodes whose layers keep each expert they chose with
// probability 0.95 from one token to the next (as the router-routed
// synths' layers keep 94–97%), each text from its own random experts.
// Keeping what was just used is then close to optimal, so Markov must
// hit within 2% of LRU's rate on the second text: estimates that trusted
// only the counts learned on the first text would evict the second's
// experts first and miss far more (about a third of LRU's hits lost).
func TestMarkovTextSwitch(t *testing.T) {
	const L, E, K, T = 8, 64, 4, 200
	rng := rand.New(rand.NewPCG(7, 11))
	text := func() Trace {
		sets := make([][]int32, L)
		for l := range sets {
			for len(sets[l]) < K {
				if e := int32(rng.IntN(E)); !slices.Contains(sets[l], e) {
					sets[l] = append(sets[l], e)
				}
			}
		}
		var tr Trace
		for range T {
			for l, set := range sets {
				for k := range set {
					if rng.Float64() < 0.05 {
						for {
							if e := int32(rng.IntN(E)); !slices.Contains(set, e) {
								set[k] = e
								break
							}
						}
					}
				}
				step := make([]int32, K)
				for k, e := range set {
					step[k] = int32(l*E) + e
				}
				tr = append(tr, step)
			}
		}
		return tr
	}
	first, second := text(), text()
	both := append(slices.Clone(first), second...)
	slots := L * E / 10
	hits := func(p Policy) float64 {
		h1, _, err := SimulateHits(first, slots, p, L, E)
		if err != nil {
			t.Fatal(err)
		}
		h, _, err := SimulateHits(both, slots, p, L, E)
		if err != nil {
			t.Fatal(err)
		}
		return float64(h-h1) / float64(T*L*K)
	}
	mk, lru := hits(Markov), hits(LRU)
	t.Logf("second text: markov %.3f, lru %.3f of requests hit", mk, lru)
	if mk < 0.98*lru {
		t.Errorf("markov hit %.3f of the second text's requests, lru %.3f", mk, lru)
	}
}

// TestRowWeight: a prefill chunk's rows weigh no more than LRFU's decay
// window of single-token uses (rowWeight). After a 256-row step in which
// expert 0 served 200 rows, 40 decode tokens that each choose expert 1
// rank it above expert 0; counted a use a row, expert 0 would outrank it
// for about 75 tokens. A step of 4 rows (four sequences decoding) still
// counts every row.
func TestRowWeight(t *testing.T) {
	v := newEvictor(LRFU, 1, 4)
	v.tick(1, 0, 256)
	v.use(0, 200, true)
	v.use(2, 56, true)
	clock := int64(1)
	for range 40 {
		clock++
		v.tick(clock, 0, 1)
		v.use(1, 1, true)
	}
	if a, b := v.score(0, 1, false), v.score(1, clock, false); b <= a {
		t.Errorf("40 decode uses of expert 1 score %g, a prefill's 200 rows of expert 0 %g", b, a)
	}
	v = newEvictor(LRFU, 1, 4)
	v.tick(1, 0, 4)
	v.use(0, 3, true)
	v.use(1, 1, true)
	if v.key[0] != 3*v.key[1] {
		t.Errorf("a 4-row step: 3 rows weigh %g, one %g", v.key[0], v.key[1])
	}
}

// TestLoadRoutesSequences: each new sequence replays the recording from
// further in, also for a model whose leading layers are dense (DeepSeek's
// first_k_dense_replace), whose first routed layer is not layer 0.
func TestLoadRoutesSequences(t *testing.T) {
	dir := t.TempDir()
	routes := [][][]int{{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {1, 2}, {3, 4}, {5, 6}, {7, 0}}}
	j, err := json.Marshal(map[string]any{"experts": 8, "routes": routes})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, RoutesFile), j, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, first := range []int{0, 1, 3} {
		route, err := LoadRoutes(dir, &format.Config{Experts: 8, TopK: 2, FirstDense: first})
		if err != nil {
			t.Fatal(err)
		}
		a, b := make([]int, 2), make([]int, 2)
		route(first, 0, a) // the first sequence's first token
		route(first, 0, b) // the next sequence's
		if slices.Equal(a, b) {
			t.Errorf("first routed layer %d: two sequences both start with experts %v", first, a)
		}
	}
}

// TestRecencyDenseFirst: LRFU's uses age pass by pass also where the
// leading layers are dense and never take a step (DeepSeek's, GLM's
// first_k_dense_replace): 40 passes of expert 1 after 40 of expert 0 rank
// expert 1 first, under both policies that keep LRFU's counts.
func TestRecencyDenseFirst(t *testing.T) {
	for _, p := range []Policy{LRFU, Markov} {
		v := newEvictor(p, 3, 4)
		clock := int64(0)
		for pass := range 80 {
			for layer := 1; layer < 3; layer++ {
				clock++
				v.tick(clock, layer, 1)
				v.use(int32(layer*4+pass/40), 1, true)
			}
		}
		clock++
		v.tick(clock, 1, 1)
		if old, recent := v.score(4, 40*2, false), v.score(5, clock-1, false); recent <= old {
			t.Errorf("%s: expert 1, used in the last 40 passes, scores %g; expert 0, in the 40 before, %g", p, recent, old)
		}
	}
}

// TestNewText: a text chose experts 0-3 on each of 100 tokens, then the
// next text's first token chooses expert 4. With NewText between them,
// every policy that counts uses ranks 4 above the old text's experts (it
// stays, they go first); without, below.
func TestNewText(t *testing.T) {
	for _, p := range []Policy{FLRU, LRFU, Markov} {
		for _, fresh := range []bool{false, true} {
			ev, err := NewEvictor(p, 1, 8)
			if err != nil {
				t.Fatal(err)
			}
			var clock int64
			step := func(ids ...int32) {
				clock++
				ev.Tick(clock, 0, 1)
				for _, r := range ids {
					ev.Use(r, 1, true)
				}
			}
			for range 100 {
				step(0, 1, 2, 3)
			}
			if fresh {
				ev.NewText()
			}
			step(4)
			s4, s0 := ev.Score(4, clock), ev.Score(0, clock-1)
			if kept := s4 > s0; kept != fresh {
				t.Errorf("%s, NewText %v: the new text's expert scores %g, the old text's %g", p, fresh, s4, s0)
			}
		}
	}
}
