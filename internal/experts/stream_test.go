package experts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// loadStream loads a shared model with its experts streamed through a pool
// of slots slots.
func loadStream(t testing.TB, name string, bits int, o Options) (*model.Model, *Stream) {
	t.Helper()
	return loadStreamDir(t, testutil.Packed(t, name, bits), o)
}

func records(m *model.Model) int { return m.Manifest.ExpertLayers * m.Manifest.Experts }

// greedy prefills prompt in chunks of rows and decodes n tokens greedily,
// with the compute pool polling a stream's reads as the engine has it
// (Stream.Poll).
func greedy(t testing.TB, m *model.Model, prompt []int, n, rows int) []int {
	t.Helper()
	return greedyPoll(t, m, prompt, n, rows, true)
}

// greedyPoll is greedy, with the pool polling a stream's reads or not.
func greedyPoll(t testing.TB, m *model.Model, prompt []int, n, rows int, poll bool) []int {
	t.Helper()
	r := model.NewRunner(m, 2, rows)
	defer r.Close()
	if s, ok := m.Experts.(*Stream); ok && poll {
		r.Pool.SetIdle(s.Poll)
	}
	st, err := m.NewState(len(prompt) + n)
	if err != nil {
		t.Fatal(err)
	}
	V := m.Config.Vocab
	logits := make([]float32, V)
	if err := r.Forward(st, prompt, logits, false); err != nil {
		t.Fatal(err)
	}
	var out []int
	for len(out) < n {
		next := sample.Argmax(logits)
		out = append(out, next)
		if len(out) == n {
			break
		}
		if err := r.Forward(st, []int{next}, logits, false); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestGreedyAnyPool decodes the reference prompts greedily (exact mode)
// through the smallest legal pool, a quarter of the experts and all of
// them, with lookahead on and off, and requires the tokens of the exact
// mode with every expert resident (the reference's, which model.TestGreedy
// holds them to) every time: the pool changes speed, never results. Where
// the kernel's asynchronous reads serve (kernelReads), the quarter pool
// also reads through the reader goroutines, and without the compute
// polling the reads between operations (Stream.Poll).
func TestGreedyAnyPool(t *testing.T) {
	for _, name := range testutil.Models {
		refs := testutil.LoadRefs(t, name)
		dir, man := testutil.PackedManifest(t, name, 16)
		exact := residentGreedy(t, dir, refs.Cases)
		n := man.ExpertLayers * man.Experts
		for _, v := range []struct {
			slots      int
			look       bool
			cases      int // 0 = all
			goroutines bool
			noPoll     bool
		}{{MinSlots(&man.Config), true, 0, false, false}, {n / 4, true, 0, false, false}, {n, true, 0, false, false}, {n / 4, false, 3, false, false}, {n / 4, true, 3, true, false}, {n / 4, true, 3, false, true}} {
			t.Run(fmt.Sprintf("%s/slots=%d/lookahead=%v/goroutines=%v/poll=%v", name, v.slots, v.look, v.goroutines, !v.noPoll), func(t *testing.T) {
				m, s := loadStream(t, name, 16, Options{Slots: v.slots, Lookahead: v.look, goroutineReads: v.goroutines})
				if v.goroutines && s.kr != nil {
					t.Fatal("goroutineReads ignored")
				}
				if !v.goroutines && s.Direct() && s.kr == nil {
					// Only where the platform has no asynchronous reads.
					if r, err := platform.NewReads(1); err == nil {
						r.Close()
						t.Fatal("uncached reads through goroutines where the kernel's asynchronous reads serve")
					}
				}
				cases := refs.Cases
				if testing.Short() || v.cases > 0 {
					cases = cases[:3]
				}
				for ci, c := range cases {
					got := greedyPoll(t, m, c.Prompt, len(c.Greedy), 64, !v.noPoll)
					if !slices.Equal(got, exact[ci]) {
						t.Fatalf("case %d: greedy %v, want %v", ci, got, exact[ci])
					}
				}
				st := s.Stats()
				t.Logf("hit rate %.3f, %d misses, %.1f MiB read, lookahead issued %d useful %d wasted %d",
					st.HitRate(), st.Misses, float64(st.BytesRead)/(1<<20), st.LookIssued, st.LookUseful, st.LookWasted)
				if v.slots < n && st.Misses == 0 {
					t.Errorf("no misses with %d of %d slots", v.slots, n)
				}
			})
		}
	}
}

// residentGreedy decodes each case greedily with the packed model at dir
// and every expert resident.
func residentGreedy(t *testing.T, dir string, cases []testutil.Case) [][]int {
	t.Helper()
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p, err := model.NewResidentProvider(m)
	if err != nil {
		t.Fatal(err)
	}
	m.Experts = p
	var out [][]int
	for _, c := range cases {
		out = append(out, greedy(t, m, c.Prompt, len(c.Greedy), 64))
	}
	return out
}

// TestDecodeAllocs keeps a streamed decode step allocation-free, with every
// expert a hit and with misses and prefetches in flight.
func TestDecodeAllocs(t *testing.T) {
	_, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	n := man.ExpertLayers * man.Experts
	for _, slots := range []int{n, n / 4} {
		m, _ := loadStream(t, "tiny-qwen3-moe", 4, Options{Slots: slots, Lookahead: true})
		r := model.NewRunner(m, 2, 16)
		st, _ := m.NewState(512)
		logits := make([]float32, m.Config.Vocab)
		if err := r.Forward(st, []int{1, 2, 3}, logits, false); err != nil {
			t.Fatal(err)
		}
		tok := []int{42}
		i := 0
		allocs := testing.AllocsPerRun(50, func() {
			tok[0] = 10 + i%300 // vary tokens so that routes, hence misses, vary
			i++
			if err := r.Forward(st, tok, logits, false); err != nil {
				t.Fatal(err)
			}
		})
		r.Close()
		if allocs != 0 {
			t.Errorf("%d slots: decode step allocates %.1f times", slots, allocs)
		}
	}
}

// TestSmallPoolErrors names the minimum.
func TestSmallPoolErrors(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	_, err := Open(dir, man, Options{Slots: 2})
	if err == nil || !strings.Contains(err.Error(), "at least 4") {
		t.Fatalf("2 slots: got %v, want an error naming the minimum of 4", err)
	}
	b := Budget{PoolBytes: 1 << 10}
	if _, err := b.Size(&man.Config, &man.Stores[0], n(man)); err == nil || !strings.Contains(err.Error(), "smallest pool") {
		t.Fatalf("--pool-mb 1KiB: got %v", err)
	}
	b = Budget{MemoryBytes: 1 << 20, DenseBytes: man.DenseBytes}
	if _, err := b.Size(&man.Config, &man.Stores[0], n(man)); err == nil || !strings.Contains(err.Error(), "smallest pool") {
		t.Fatalf("--memory-gb tiny: got %v", err)
	}
}

func n(man *format.Manifest) int { return man.ExpertLayers * man.Experts }

// TestBufferedFallback reads through the page cache when asked (as when
// O_DIRECT is refused) and still gives the same tokens.
func TestBufferedFallback(t *testing.T) {
	refs := testutil.LoadRefs(t, "tiny-qwen3-moe")
	m, s := loadStream(t, "tiny-qwen3-moe", 16, Options{Slots: 8, Buffered: true, Lookahead: true})
	if s.Direct() {
		t.Fatal("Buffered option ignored")
	}
	c := refs.Cases[0]
	if got := greedy(t, m, c.Prompt, 16, 7); !slices.Equal(got, c.Greedy[:16]) {
		t.Fatalf("greedy %v, want %v", got, c.Greedy[:16])
	}
}

// TestCutWeak checks the lossy deadline policy: with an impossible
// threshold every late miss is cut, and the forward still runs.
func TestCutWeak(t *testing.T) {
	m, s := loadStream(t, "tiny-qwen3-moe", 4, Options{Slots: 16, CutWeak: 0.99})
	c := testutil.LoadRefs(t, "tiny-qwen3-moe").Cases[0]
	greedy(t, m, c.Prompt[:20], 8, 1)
	if s.Stats().Cuts == 0 {
		t.Fatal("no expert was cut with --cut-weak 0.99")
	}
}

// TestStreamDelivers drives a small pool directly, as the forward would,
// with random steps and random (often wrong) lookahead predictions, taking
// experts one at a time (Next) or in batches (Ready) at random, and checks
// that every expert handed out holds its own record's bytes. Run under -race it also
// checks the reader hand-off.
func TestStreamDelivers(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	file, err := os.ReadFile(filepath.Join(dir, man.Stores[0].File))
	if err != nil {
		t.Fatal(err)
	}
	// One reader takes both kinds of read; three leave one for demand
	// misses only (prefetchReaders), or all three take prefetches too.
	for _, rd := range [][2]int{{1, 0}, {3, 0}, {3, 3}} {
		for _, pol := range Policies {
			streamDelivers(t, dir, man, file, rd[0], rd[1], pol, false)
		}
	}
	// Records tiled as they land: the views of the matrices the loaders
	// tile (kernels.Tiles) are marked, and their rows are the file's.
	streamDelivers(t, dir, man, file, 3, 0, DefaultPolicy, true)
}

// TestPrefetchReaders: the prefetch readers start at the smaller of 2
// and the readers when they follow the disk (0), may be all of them, and
// out of range are an error.
func TestPrefetchReaders(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	for _, c := range []struct{ readers, pre, want int }{{1, 0, 1}, {3, 0, 2}, {3, 3, 3}, {3, 1, 1}} {
		s, err := Open(dir, man, Options{Slots: 9, Readers: c.readers, PrefetchReaders: c.pre})
		if err != nil {
			t.Fatalf("readers %d, prefetch readers %d: %v", c.readers, c.pre, err)
		}
		if got := s.PrefetchReaders(); got != c.want {
			t.Errorf("readers %d, prefetch readers %d: %d in effect, want %d", c.readers, c.pre, got, c.want)
		}
		s.Close()
	}
	for _, pre := range []int{-1, 4} {
		if s, err := Open(dir, man, Options{Slots: 9, Readers: 3, PrefetchReaders: pre}); err == nil || !strings.Contains(err.Error(), "prefetch readers") {
			if s != nil {
				s.Close()
			}
			t.Errorf("prefetch readers %d of 3: err %v, want one naming the prefetch readers", pre, err)
		}
	}
}

func streamDelivers(t *testing.T, dir string, man *format.Manifest, file []byte, readers, preReaders int, pol Policy, tile bool) {
	stride := man.Stores[0].Stride
	s, err := Open(dir, man, Options{Slots: 9, Readers: readers, PrefetchReaders: preReaders, Lookahead: true, Policy: pol, Prefetch: 3, Tile: tile})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, uint64(len(pol))))
	E := man.Experts
	ids := make([]int, 0, E)
	rows := make([]int, E)
	for step := 0; step < 400; step++ {
		layer := step % man.ExpertLayers
		ids = ids[:0]
		for _, e := range rng.Perm(E)[:1+rng.IntN(12)] {
			ids = append(ids, e)
		}
		for i := range ids {
			rows[i] = 1 + rng.IntN(5)
		}
		if err := s.Begin(layer, ids, model.Hint{Rows: rows[:len(ids)]}); err != nil {
			t.Fatal(err)
		}
		s.Prefetch((layer+1)%man.ExpertLayers, rng.Perm(E)[:6])
		seen := make([]bool, len(ids))
		check := func(i int, ex *model.Expert) {
			if seen[i] {
				t.Fatalf("step %d: position %d returned twice", step, i)
			}
			seen[i] = true
			rec := int64(layer*E + ids[i])
			st := &man.Stores[0]
			for _, m := range []struct {
				w *kernels.Mat
				t *format.Tensor
			}{{&ex.Gate, &st.Gate}, {&ex.Up, &st.Up}, {&ex.Down, &st.Down}} {
				want := file[rec*stride+m.t.Offset:][:len(m.w.Q)]
				if m.t.Tiled {
					// Stored tiled (pack.LayoutTiled): FlatQ gives rows.
					want = slices.Clone(want)
					kernels.UntileQ4(want, m.w.Rows, m.w.Cols, nil)
				}
				if m.w.Tiled != (m.t.Tiled || tile && kernels.Tiles(m.w)) || !slices.Equal(m.w.FlatQ(), want) {
					t.Fatalf("%s step %d: layer %d expert %d: wrong bytes (tiled %v)", pol, step, layer, ids[i], m.w.Tiled)
				}
			}
		}
		for got := 0; got < len(ids); {
			if rng.IntN(2) == 0 {
				pos, exs, err := s.Ready(nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				for k, i := range pos {
					check(i, exs[k])
				}
				got += len(pos)
				continue
			}
			i, ex, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			check(i, ex)
			got++
		}
		if _, _, err := s.Next(); err == nil {
			t.Fatal("Next past the last expert: no error")
		}
	}
	st := s.Stats()
	t.Logf("%s, %d readers: hit rate %.2f, %d misses, lookahead issued %d useful %d wasted %d", pol, readers, st.HitRate(), st.Misses, st.LookIssued, st.LookUseful, st.LookWasted)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// loadStreamDir loads the packed model in dir with its experts streamed
// through a pool (o).
func loadStreamDir(t testing.TB, dir string, o Options) (*model.Model, *Stream) {
	t.Helper()
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, m.Manifest, o)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	m.Experts = s
	t.Cleanup(func() { m.Close() })
	return m, s
}

func unsafeBytes(v []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)) }

// recorder wraps a provider and keeps each layer's last step.
type recorder struct {
	*Stream
	ids  map[int][]int
	rows map[int][]int
}

func (r *recorder) Begin(layer int, ids []int, h model.Hint) error {
	r.ids[layer] = slices.Clone(ids)
	r.rows[layer] = slices.Clone(h.Rows)
	return r.Stream.Begin(layer, ids, h)
}

// TestPrefillRetention checks point 3 of the design: a prefill chunk reads
// each expert it needs once per layer, and each layer's most-used experts
// stay in the pool for decode, the first layer's included, although a
// pure recency order would have evicted them for the last layers'.
func TestPrefillRetention(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	c := testutil.LoadRefs(t, "tiny-qwen3-moe").Long[0]
	for _, pol := range Policies {
		slots := 6 * man.Config.Layers // a share of 6 per layer
		m, s := loadStreamDir(t, dir, Options{Slots: slots, Policy: pol})
		rec := &recorder{Stream: s, ids: map[int][]int{}, rows: map[int][]int{}}
		m.Experts = rec
		r := model.NewRunner(m, 2, 64)
		st, _ := m.NewState(64)
		logits := make([]float32, m.Config.Vocab)
		if err := r.Forward(st, c.Prompt[:64], logits, false); err != nil {
			t.Fatal(err)
		}
		r.Close()
		m.Experts = s
		var distinct int
		for l := 0; l < man.Config.Layers; l++ {
			distinct += len(rec.ids[l])
		}
		if got := s.Stats().Misses; got != int64(distinct) {
			t.Errorf("%s: %d reads for %d distinct (layer, expert) pairs of one chunk", pol, got, distinct)
		}
		for l := 0; l < man.Config.Layers; l++ {
			ids, rows := rec.ids[l], rec.rows[l]
			order := make([]int, len(ids))
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(a, b int) int { return rows[b] - rows[a] })
			kept := 0
			for _, i := range order[:3] { // the three most used
				if s.where[l*man.Experts+ids[i]] >= 0 {
					kept++
				}
			}
			if kept < 3 {
				t.Errorf("%s: layer %d keeps %d of its 3 most-used experts after prefill", pol, l, kept)
			}
		}
	}
}

// TestNextTokenPrefetch checks that the last layer's decode step reads
// ahead for the next token's first layer. Every token chooses the same
// experts, and a pool of two layers' experts cannot keep the first
// layer's through a token, so without the read-ahead the first layer
// mostly misses and with it hits once the policy has learned.
func TestNextTokenPrefetch(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	c := &man.Config
	K, E, tokens := c.TopK, man.Experts, 24
	hits := func(look bool) (first, rest int64) {
		s, err := Open(dir, man, Options{Slots: 2 * K, Readers: K, Lookahead: look, Policy: Markov})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ids := make([]int, K)
		ones := make([]int, K)
		for i := range ones {
			ones[i] = 1
		}
		for range tokens {
			for l := range c.Layers {
				for i := range ids {
					ids[i] = (l*5 + i*3) % E
				}
				if err := s.Begin(l, ids, model.Hint{Rows: ones}); err != nil {
					t.Fatal(err)
				}
				for range ids {
					if _, _, err := s.Next(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		st := s.Stats()
		for l, ls := range st.Layers {
			if l == 0 {
				first = ls.Hits
			} else {
				rest += ls.Hits
			}
		}
		return first, rest
	}
	offFirst, offRest := hits(false)
	onFirst, onRest := hits(true)
	t.Logf("first layer's hits: %d without read-ahead, %d with; the other layers' %d and %d", offFirst, onFirst, offRest, onRest)
	if want := int64((tokens - 4) * K); onFirst < want || onFirst-offFirst < int64(tokens*K/2) {
		t.Fatalf("the first layer hit %d of %d times with read-ahead, %d without: want at least %d, and %d more than without",
			onFirst, tokens*K, offFirst, want, tokens*K/2)
	}
}

// TestReadyBatches decodes the same tokens with every expert resident and
// through a pool that already holds them all, and requires the pool's
// decode to hand the worker threads as many operations as the resident
// one, with the same logits: experts in memory are computed whole on
// different threads in one dispatch (the shared expert with them), as
// resident experts are, not one after another, each split across the
// threads (three dispatches) or, for matrices too small to split, on the
// calling thread alone.
func TestReadyBatches(t *testing.T) {
	const name = "tiny-qwen3-5-moe" // routed and shared experts
	toks := []int{5, 17, 99, 3, 250, 7, 31, 64}
	// decode runs toks through m twice, the first time to fill a pool, and
	// returns the second run's dispatches and last logits.
	decode := func(m *model.Model) (uint64, []float32) {
		r := model.NewRunner(m, 2, 16)
		defer r.Close()
		st, err := m.NewState(len(toks))
		if err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, m.Config.Vocab)
		var d0 uint64
		for range 2 {
			st.Reset()
			d0 = r.Pool.Dispatches()
			for _, tok := range toks {
				if err := r.Forward(st, []int{tok}, logits, false); err != nil {
					t.Fatal(err)
				}
			}
		}
		return r.Pool.Dispatches() - d0, logits
	}
	m, s := loadStream(t, name, 4, Options{Slots: 1 << 20})
	streamed, sl := decode(m)
	if st := s.Stats(); st.Misses == 0 || st.Hits == 0 {
		t.Fatalf("%d hits and %d misses: the pool was not filled, then used", st.Hits, st.Misses)
	}
	rm, err := model.Load(testutil.Packed(t, name, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	p, err := model.NewResidentProvider(rm)
	if err != nil {
		t.Fatal(err)
	}
	rm.Experts = p
	resident, rl := decode(rm)
	if streamed != resident {
		t.Errorf("a decode of %d tokens through a full pool took %d dispatches, with every expert resident %d", len(toks), streamed, resident)
	}
	if !slices.Equal(sl, rl) {
		t.Errorf("logits differ between the pool and resident experts")
	}
}

// TestReadErrorSurfaces truncates the expert store under an open stream
// and requires a step's failed reads to come back as the read's own error,
// from Ready as from Next, rather than as a stall or a step that seems to
// have no reads left.
func TestReadErrorSurfaces(t *testing.T) {
	src := testutil.Packed(t, "tiny-qwen3-moe", 4)
	man, err := format.ReadManifest(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct{ ready, buffered bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		ready := v.ready
		dir := testutil.CopyDir(t, src)
		s, err := Open(dir, man, Options{Slots: MinSlots(&man.Config), Buffered: v.buffered})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, man.Stores[0].File), 0); err != nil {
			t.Fatal(err)
		}
		ids := make([]int, man.Config.TopK)
		for i := range ids {
			ids[i] = i
		}
		if err := s.Begin(0, ids, model.Hint{}); err != nil {
			t.Fatal(err)
		}
		if ready {
			// Let every read fail before the first Ready, so that Ready
			// is the call that meets the failures.
			for deadline := time.Now().Add(10 * time.Second); s.kr == nil && len(s.done) < s.inflight && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			for s.kr != nil && s.kr.out[0]+s.kr.out[1] > 0 {
				if err := s.collect(true, true); err != nil {
					t.Fatal(err)
				}
			}
		}
		var got error
		for n := 0; got == nil && n < len(ids); n++ {
			if ready {
				var pos []int
				if pos, _, got = s.Ready(nil, nil); got != nil || len(pos) > 0 {
					continue
				}
			}
			_, _, got = s.Next()
		}
		s.Close()
		if got == nil || !strings.Contains(got.Error(), "reading layer 0") {
			t.Errorf("ready=%v, buffered=%v: a step over a truncated store gave %v, want the read's error", ready, v.buffered, got)
		}
	}
}

// TestPopulate requires Populate to stop with the context's error once it
// is cancelled, and otherwise to report the whole pool done, in order.
func TestPopulate(t *testing.T) {
	_, s := loadStream(t, "tiny-qwen3-moe", 4, Options{Slots: 64})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Populate(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("populating under a cancelled context: %v", err)
	}
	var last, total int64
	err := s.Populate(context.Background(), func(done, all int64) {
		if done <= last || done > all {
			t.Errorf("progress %d of %d after %d", done, all, last)
		}
		last, total = done, all
	})
	if err != nil || last != total || total != int64(s.Slots())*s.Stride() {
		t.Fatalf("populate: %v, progress %d of %d, pool %d bytes", err, last, total, int64(s.Slots())*s.Stride())
	}
}

// TestNextPreLimit: every reader below utilLow, the base above utilHigh,
// the count unchanged in between.
func TestNextPreLimit(t *testing.T) {
	for _, c := range []struct {
		cur  int
		util float64
		want int
	}{{2, 0.1, 8}, {2, 0.49, 8}, {2, 0.5, 2}, {8, 0.5, 8}, {8, 0.7, 8}, {8, 0.71, 2}, {2, 0.9, 2}, {8, 1, 2}} {
		if got := nextPreLimit(c.cur, 2, 8, c.util); got != c.want {
			t.Errorf("%d prefetch readers, reads at %.2f of the disk: %d next, want %d", c.cur, c.util, got, c.want)
		}
	}
}

// TestAdaptReaders drives the window of adaptReaders with a fake clock and
// fake counters: the count waits for an estimate of the disk, rises once a
// second of steps has read at less than half of it, falls once one reads
// at more than 70%, keeps the last estimate through windows without one,
// ignores the idle time of a long gap between steps, and never moves when
// the count was given.
func TestAdaptReaders(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	for _, given := range []int{0, 2} {
		s, err := Open(dir, man, Options{Slots: 9, Readers: 8, PrefetchReaders: given})
		if err != nil {
			t.Fatal(err)
		}
		var now int64
		s.now = func() int64 { return now }
		// step advances the clock by 100 ms, in which the stream read mb
		// MB, and the disk gave 1 MB/ms for deep ms under load.
		step := func(mb, deep int64) {
			now += 100e6
			s.stats.BytesRead.Add(mb * 1e6)
			s.stats.DeepNs.Add(deep * 1e6)
			s.stats.DeepBytes.Add(deep * 1e6)
			s.adaptReaders()
		}
		steps := func(k int, mb, deep int64) {
			for range k {
				step(mb, deep)
			}
		}
		want := func(n int, when string) {
			t.Helper()
			if given != 0 {
				n = given
			}
			if got := s.PrefetchReaders(); got != n {
				t.Errorf("given %d, %s: %d readers take prefetches, want %d", given, when, got, n)
			}
		}
		now -= 100e6
		step(0, 0) // the first step opens the window
		steps(10, 30, 0)
		want(2, "a second of reads, never 4 in flight")
		steps(9, 30, 10)
		want(2, "0.9 s of steps")
		step(30, 10)
		want(8, "a second at 30% of the disk")
		steps(10, 60, 10)
		want(8, "a second at 60%")
		steps(10, 80, 0)
		want(2, "a second at 80% of the last estimate")
		steps(5, 80, 10)
		now += 5000e6 // idle between requests: not an idle disk
		step(0, 0)
		want(2, "half a second at 80%, then a 5 s gap")
		steps(10, 80, 10)
		want(2, "a second at 80% after the gap")
		s.Close()
	}
}

// heldPrefetches opens a stream of tiny-qwen3-moe's 4-layer pack (9
// slots, 3 readers) in which no reader takes prefetches, and asks it to
// prefetch layer 0's experts 0 and 1: both wait, queued, until
// setPreLimit lets readers take them. The stream closes with the test.
func heldPrefetches(t *testing.T) *Stream {
	t.Helper()
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	s, err := Open(dir, man, Options{Slots: 9, Readers: 3, Lookahead: true, Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.setPreLimit(0)
	time.Sleep(10 * time.Millisecond) // the readers back in their loops
	s.Prefetch(0, []int{0, 1})
	return s
}

// TestPrefetchReadersWake: a prefetch waits while no reader takes
// prefetches, and is read once the count rises, by a reader that was
// waiting for demand misses alone.
func TestPrefetchReadersWake(t *testing.T) {
	s := heldPrefetches(t)
	if s.preInflight != 2 {
		t.Fatalf("%d prefetches in flight, want 2", s.preInflight)
	}
	time.Sleep(100 * time.Millisecond)
	if s.drain(); s.preInflight != 2 {
		t.Fatalf("%d of 2 prefetches landed with no reader taking prefetches", 2-s.preInflight)
	}
	s.setPreLimit(3)
	deadline := time.Now().Add(10 * time.Second)
	for s.preInflight > 0 && time.Now().Before(deadline) {
		select {
		case c := <-s.done:
			if err := s.complete(c); err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Until(deadline)):
		}
	}
	if s.preInflight != 0 {
		t.Fatalf("%d prefetches still in flight 10 s after every reader may take them", s.preInflight)
	}
}

// TestLandedCounts: a request whose record a prefetch is still reading is
// a hit but has not landed (LayerStats.Landed); once read, a request of
// it is both.
func TestLandedCounts(t *testing.T) {
	s := heldPrefetches(t)
	step := func(want Snapshot) {
		t.Helper()
		if err := s.Begin(0, []int{0, 1, 2, 3}, model.Hint{}); err != nil {
			t.Fatal(err)
		}
		st := s.Stats()
		if st.Hits != want.Hits || st.Landed != want.Landed || st.Misses != want.Misses || st.Layers[0].Landed != want.Landed {
			t.Fatalf("%d hits, %d landed (layer 0: %d), %d misses; want %d, %d, %d", st.Hits, st.Landed, st.Layers[0].Landed, st.Misses, want.Hits, want.Landed, want.Misses)
		}
		if r := st.LandedRate(); r != float64(want.Landed)/float64(want.Hits+want.Misses) {
			t.Errorf("landed rate %v", r)
		}
		s.setPreLimit(3)
		for range 4 {
			if _, _, err := s.Next(); err != nil {
				t.Fatal(err)
			}
		}
	}
	step(Snapshot{Hits: 2, Landed: 0, Misses: 2})
	step(Snapshot{Hits: 6, Landed: 4, Misses: 2})
}

// TestShareThreshold: the row count that keeps an expert among its
// layer's share with the most rows.
func TestShareThreshold(t *testing.T) {
	rows := []int{5, 1, 3, 3, 2}
	for share, want := range map[int]int{1: 5, 2: 3, 3: 3, 4: 2, 5: 0, 9: 0} {
		if got := ShareThreshold(rows, share); got != want {
			t.Errorf("share %d: threshold %d, want %d", share, got, want)
		}
	}
	if got := ShareThreshold([]int{1, 1, 1}, 1); got != 0 {
		t.Errorf("single rows: threshold %d, want 0 (every expert alike)", got)
	}
}

// TestCached: Cached gives a record only once it is read, as the slot's
// expert (its Record within Memory, the file's bytes), changes no counter,
// and gives nil for records not in the pool and ids out of range.
func TestCached(t *testing.T) {
	m, s := loadStream(t, "tiny-qwen3-5-moe", 4, Options{Slots: 8})
	file, err := os.ReadFile(s.StorePath())
	if err != nil {
		t.Fatal(err)
	}
	if s.Cached(1, 3) != nil {
		t.Fatal("an empty pool has a record cached")
	}
	if err := s.Begin(1, []int{3, 5}, model.Hint{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Stats()
	mem := s.Memory()
	stride := int(s.Stride())
	for _, e := range []int{3, 5} {
		ex := s.Cached(1, e)
		if ex == nil {
			t.Fatalf("expert %d of layer 1, just read, is not cached", e)
		}
		lo, at := uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&ex.Record[0]))
		if at < lo || at+uintptr(stride) > lo+uintptr(len(mem)) {
			t.Errorf("expert %d's record lies outside the pool's memory", e)
		}
		rec := m.Manifest.Experts + e
		if !bytes.Equal(ex.Record[:stride], file[rec*stride:(rec+1)*stride]) {
			t.Errorf("expert %d's cached record is not the file's", e)
		}
	}
	for _, c := range [][2]int{{1, 4}, {0, 3}, {-1, 0}, {s.L, 0}, {1, s.E}, {1, -1}} {
		if s.Cached(c[0], c[1]) != nil {
			t.Errorf("Cached(%d, %d) is not nil", c[0], c[1])
		}
	}
	if after := s.Stats(); after.Hits != before.Hits || after.Misses != before.Misses {
		t.Errorf("Cached changed the counters: %+v → %+v", before, after)
	}
}

// TestEndStepReleases: a step, finished or abandoned part-way (its
// experts not all taken, reads still in flight), leaves no slot held or
// waited for once the next step begins, only the new step's own; a
// small pool would otherwise run out of slots to read into.
func TestEndStepReleases(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	c := &man.Config
	s, err := Open(dir, man, Options{Slots: MinSlots(c) + 2, Readers: 3, Lookahead: true, Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	for step := range 200 {
		layer := step % s.L
		ids := rng.Perm(c.Experts)[:c.TopK]
		if err := s.Begin(layer, ids, model.Hint{}); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		own := map[int32]bool{}
		for i := range ids {
			own[s.slotOf[i]] = true
		}
		for si := range s.slots {
			if sl := &s.slots[si]; !own[int32(si)] && (sl.held || sl.demand >= 0) {
				t.Fatalf("step %d: slot %d held %v, waited for by position %d, outside the step", step, si, sl.held, sl.demand)
			}
		}
		take := len(ids)
		if step%3 == 1 {
			take = rng.IntN(len(ids)) // abandoned part-way
		}
		for range take {
			if _, _, err := s.Next(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
}
