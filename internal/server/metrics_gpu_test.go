package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
)

// pooledForward is the CPU runner standing in for a GPU forward with an
// expert pool, whose figures it reports.
type pooledForward struct {
	*model.Runner
	pool engine.DevicePool
}

func (p pooledForward) DevicePool() engine.DevicePool { return p.pool }

// TestMetricsGPUPool: /metrics carries the GPU pool's figures when the
// forward has one, and none of them when it does not.
func TestMetricsGPUPool(t *testing.T) {
	e, err := engine.Open(context.Background(), testModelDir, engine.Options{Ctx: testCtx, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close) // after the servers stop
	pool := engine.DevicePool{Slots: 96, Records: 384, RecordBytes: 28672, Hits: 4185, Misses: 879,
		BytesUp: 41200000, Prefetched: 966, PrefetchUsed: 436, HostPinned: true}
	metrics := func() string {
		_, url := start(t, Config{Engine: e})
		_, m := get(t, url+"/metrics")
		return m
	}
	if m := metrics(); strings.Contains(m, "sluice_gpu_pool") {
		t.Fatalf("the CPU's forward reports a GPU pool:\n%s", grepLines(m, "sluice_gpu_pool"))
	}
	e.Fwd = pooledForward{e.Runner, pool}
	m := metrics()
	for name, want := range map[string]float64{
		"sluice_gpu_pool_slots": 96, "sluice_gpu_pool_hits_total": 4185, "sluice_gpu_pool_misses_total": 879,
		"sluice_gpu_pool_bytes_copied_total": 41200000, "sluice_gpu_pool_lookahead_copied_total": 966,
		"sluice_gpu_pool_lookahead_used_total": 436, "sluice_gpu_pool_host_pinned": 1,
	} {
		if got := metricValue(t, m, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// A GPU holding every expert has no pool to report.
	e.Fwd = pooledForward{e.Runner, engine.DevicePool{Records: 384}}
	if m := metrics(); strings.Contains(m, "sluice_gpu_pool") {
		t.Errorf("a resident GPU reports a pool:\n%s", grepLines(m, "sluice_gpu_pool"))
	}
}

// copyingForward is the CPU runner standing in for a GPU forward that
// keeps its own copy of each state: it counts the copies asked of it,
// saves (into a cache entry, a state of just the positions copied) apart
// from resumes (into a slot's state), and the states released.
type copyingForward struct {
	*model.Runner
	saves, resumes, releases *atomic.Int64
}

func (c copyingForward) CopyState(dst, src *model.State) error {
	if dst.Pos != src.Pos {
		return fmt.Errorf("CopyState before the host copy: positions %d and %d", dst.Pos, src.Pos)
	}
	if dst.Ctx > src.Ctx {
		c.resumes.Add(1)
	} else {
		c.saves.Add(1)
	}
	return nil
}

func (c copyingForward) Release(*model.State) { c.releases.Add(1) }

// TestPrefixCacheCopiesOnDevice: the prefix cache saves and resumes states
// through the engine's CopyState, so a forward with states of its own
// (the GPU) copies them too, and frees the device copies of the entries
// it drops: a repeated prompt resumes from the cache with the same
// output, and with room for one entry, a second prompt's entry replaces
// the first's, which is released.
func TestPrefixCacheCopiesOnDevice(t *testing.T) {
	e, err := engine.Open(context.Background(), testModelDir, engine.Options{Ctx: testCtx, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close) // after the server stops
	var saves, resumes, releases atomic.Int64
	e.Fwd = copyingForward{e.Runner, &saves, &resumes, &releases}
	_, url := start(t, Config{Engine: e})
	body := msg{"prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0}
	first := post(t, url, "/v1/completions", "", body)
	again := post(t, url, "/v1/completions", "", body)
	if first.Status != 200 || again.Status != 200 {
		t.Fatalf("status %d, %d", first.Status, again.Status)
	}
	if again.Usage.PromptTokensDetails.CachedTokens == 0 || again.Text != first.Text {
		t.Errorf("repeated prompt: cached_tokens %d, text %q, first %q", again.Usage.PromptTokensDetails.CachedTokens, again.Text, first.Text)
	}
	if saves.Load() == 0 || resumes.Load() != 1 {
		t.Errorf("the forward was asked for %d saves and %d resumes; want saves and one resume", saves.Load(), resumes.Load())
	}
	if releases.Load() != 0 {
		t.Errorf("a cache with room to spare released %d states", releases.Load())
	}
	// Room for one entry of up to 64 positions: each save drops the last.
	probe, err := e.Model.NewState(64)
	if err != nil {
		t.Fatal(err)
	}
	// (A request's last state may be saved after its reply, so the counts
	// are checked at least, not exactly.)
	_, url = start(t, Config{Engine: e, CacheBytes: probe.Bytes()})
	for _, p := range []string{"def fibonacci(n):", "class Queue:"} {
		if r := post(t, url, "/v1/completions", "", msg{"prompt": p, "max_tokens": 8, "temperature": 0}); r.Status != 200 {
			t.Fatalf("status %d", r.Status)
		}
	}
	if releases.Load() == 0 {
		t.Errorf("a cache of one entry saved %d states and released none", saves.Load())
	}
}

// textForward is the CPU runner standing in for a GPU forward with an
// expert pool: it counts the new texts it is told of, and, once armed,
// sends a request from within its first forward and gives it time to
// queue, so that the request starts while another runs.
type textForward struct {
	*model.Runner
	texts *atomic.Int64
	armed *atomic.Pointer[func()]
}

func (f textForward) NewText() { f.texts.Add(1) }

func (f textForward) Forward(st *model.State, tokens []int, out []float32, all bool) error {
	if send := f.armed.Swap(nil); send != nil {
		(*send)()
	}
	return f.Runner.Forward(st, tokens, out, all)
}

// TestConcurrentNoNewText: a request that starts alone is a new text for
// the expert pools; one that starts while another generates shares them
// and leaves their counts be.
func TestConcurrentNoNewText(t *testing.T) {
	e, err := engine.Open(context.Background(), testModelDir, engine.Options{Ctx: testCtx, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close) // after the server stops
	f := textForward{e.Runner, new(atomic.Int64), new(atomic.Pointer[func()])}
	e.Fwd = f
	_, url := start(t, Config{Engine: e, Slots: 2})
	body := msg{"prompt": "one", "max_tokens": 16, "temperature": 0, "ignore_eos": true}
	if r := post(t, url, "/v1/completions", "", body); r.Status != 200 || f.texts.Load() != 1 {
		t.Fatalf("one request alone: status %d, %d new texts", r.Status, f.texts.Load())
	}
	b, _ := json.Marshal(body)
	second := make(chan int, 1)
	send := func() {
		go func() {
			resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				second <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			second <- resp.StatusCode
		}()
		time.Sleep(200 * time.Millisecond) // the second request queues
	}
	f.armed.Store(&send)
	if r := post(t, url, "/v1/completions", "", body); r.Status != 200 {
		t.Fatalf("first of two: status %d", r.Status)
	}
	if code := <-second; code != 200 {
		t.Fatalf("second of two: status %d", code)
	}
	if n := f.texts.Load(); n != 2 {
		t.Errorf("after a request alone and two at once: %d new texts, want 2", n)
	}
}
