package server

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are the server's counters, exported by GET /metrics in the
// Prometheus text format. Counters are atomics so that the scheduler and
// the handlers update them without a lock.
type metrics struct {
	start time.Time

	reqMu    sync.Mutex
	requests map[[2]string]int64 // (endpoint, status code) → count

	finishMu sync.Mutex
	finishes map[string]int64 // stop, length, cancelled, error

	promptTokens  atomic.Int64 // prompt tokens of accepted requests
	prefillTokens atomic.Int64 // prompt tokens computed (not resumed from the cache)
	cachedTokens  atomic.Int64 // prompt tokens resumed from the prefix cache
	genTokens     atomic.Int64
	forwardTokens atomic.Int64 // tokens run through the model
	cacheHits     atomic.Int64
	cacheMisses   atomic.Int64
	cacheStores   atomic.Int64
	cacheEntries  atomic.Int64 // published by the scheduler, which owns the cache
	cacheBytes    atomic.Int64
	rejected      atomic.Int64 // 429s

	// expertsPerToken is the number of routed-expert uses of one token
	// (expert layers × top-k). With the resident provider every use is a
	// hit and nothing is read.
	expertsPerToken int64

	latency   *histogram // request duration, seconds
	ttft      *histogram // time to first token, seconds
	queueWait *histogram // time from arrival to holding a slot, seconds
	rate      rateWindow
}

func newMetrics(expertsPerToken int) *metrics {
	b := []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	return &metrics{start: time.Now(), requests: map[[2]string]int64{}, finishes: map[string]int64{},
		expertsPerToken: int64(expertsPerToken),
		latency:         newHistogram(b), ttft: newHistogram(b), queueWait: newHistogram(b)}
}

func (m *metrics) request(endpoint string, code int) {
	m.reqMu.Lock()
	m.requests[[2]string{endpoint, strconv.Itoa(code)}]++
	m.reqMu.Unlock()
}

func (m *metrics) finished(reason string) {
	m.finishMu.Lock()
	m.finishes[reason]++
	m.finishMu.Unlock()
}

func (m *metrics) forwarded(n int) {
	if n > 0 {
		m.forwardTokens.Add(int64(n))
	}
}

// histogram is a cumulative Prometheus histogram.
type histogram struct {
	mu     sync.Mutex
	bounds []float64
	counts []int64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      int64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]int64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v: le semantics
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

func (h *histogram) write(w io.Writer, name, help string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var c int64
	for i, b := range h.bounds {
		c += h.counts[i]
		fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", name, strconv.FormatFloat(b, 'g', -1, 64), c)
	}
	c += h.counts[len(h.bounds)]
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, c, name, h.sum, name, h.n)
}

// rateWindow counts generated tokens per wall-clock second over the last
// minute, for a tokens-per-second gauge.
type rateWindow struct {
	mu      sync.Mutex
	buckets [60]struct{ sec, n int64 }
}

func (r *rateWindow) add(n int) {
	sec := time.Now().Unix()
	r.mu.Lock()
	b := &r.buckets[sec%60]
	if b.sec != sec {
		b.sec, b.n = sec, 0
	}
	b.n += int64(n)
	r.mu.Unlock()
}

// perSecond averages the last window seconds, the current one excluded.
func (r *rateWindow) perSecond(window int64) float64 {
	now := time.Now().Unix()
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, b := range r.buckets {
		if b.sec < now && b.sec >= now-window {
			n += b.n
		}
	}
	return float64(n) / float64(window)
}

// rssBytes reads the process's resident set size from /proc (0 elsewhere).
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// writeMetrics renders every metric in the Prometheus text format (0.0.4).
func (s *Server) writeMetrics(w io.Writer) {
	m := s.met
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	counter := func(name, help string, v int64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s gauge\n%s %s\n", name, help, name, name, strconv.FormatFloat(v, 'g', -1, 64))
	}

	m.reqMu.Lock()
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	fmt.Fprintf(bw, "# HELP sluice_requests_total HTTP requests by endpoint and status code.\n# TYPE sluice_requests_total counter\n")
	for _, k := range keys {
		fmt.Fprintf(bw, "sluice_requests_total{endpoint=%q,code=%q} %d\n", k[0], k[1], m.requests[k])
	}
	m.reqMu.Unlock()

	m.finishMu.Lock()
	fmt.Fprintf(bw, "# HELP sluice_generations_total Generations by how they ended (stop, length, cancelled, error).\n# TYPE sluice_generations_total counter\n")
	for _, r := range []string{"stop", "length", "cancelled", "error"} {
		fmt.Fprintf(bw, "sluice_generations_total{reason=%q} %d\n", r, m.finishes[r])
	}
	m.finishMu.Unlock()

	counter("sluice_rejected_total", "Requests refused with 429 because the slots and the queue were full.", m.rejected.Load())
	counter("sluice_prompt_tokens_total", "Prompt tokens of accepted generation requests.", m.promptTokens.Load())
	counter("sluice_prompt_tokens_computed_total", "Prompt tokens run through the model (not resumed from the prefix cache).", m.prefillTokens.Load())
	counter("sluice_prompt_tokens_cached_total", "Prompt tokens resumed from the prefix cache instead of recomputed.", m.cachedTokens.Load())
	counter("sluice_generated_tokens_total", "Tokens generated.", m.genTokens.Load())
	counter("sluice_forward_tokens_total", "Tokens run through the model (prefill and decode).", m.forwardTokens.Load())
	gauge("sluice_tokens_per_second", "Generated tokens per second over the last 10 seconds.", m.rate.perSecond(10))
	active, queued := s.sched.load()
	gauge("sluice_queue_depth", "Requests waiting for a slot.", float64(queued))
	gauge("sluice_active_requests", "Requests holding a slot (a live sequence state).", float64(active))
	gauge("sluice_slots", "Live sequence states the scheduler may hold at once.", float64(s.sched.slots))
	gauge("sluice_max_queue", "Requests that may wait for a slot before new ones get 429.", float64(s.sched.maxQueue))
	m.latency.write(bw, "sluice_request_duration_seconds", "Generation request latency, arrival to last byte.")
	m.ttft.write(bw, "sluice_time_to_first_token_seconds", "Time from arrival to the first generated token.")
	m.queueWait.write(bw, "sluice_queue_wait_seconds", "Time from arrival to holding a slot.")
	counter("sluice_prefix_cache_hits_total", "Requests that resumed from a cached prefix.", m.cacheHits.Load())
	counter("sluice_prefix_cache_misses_total", "Requests eligible for prefix reuse that found no cached prefix.", m.cacheMisses.Load())
	counter("sluice_prefix_cache_stores_total", "States saved into the prefix cache.", m.cacheStores.Load())
	gauge("sluice_prefix_cache_entries", "States held by the prefix cache.", float64(m.cacheEntries.Load()))
	gauge("sluice_prefix_cache_bytes", "Bytes held by the prefix cache.", float64(m.cacheBytes.Load()))
	gauge("sluice_prefix_cache_max_bytes", "The prefix cache's budget in bytes.", float64(s.cacheMax))
	if st := s.e.Stream; st != nil {
		x := st.Stats()
		gauge("sluice_expert_pool_slots", "Expert records the streaming pool holds.", float64(x.PoolSlots))
		counter("sluice_expert_hits_total", "Routed-expert uses found in the pool.", x.Hits)
		counter("sluice_expert_misses_total", "Routed-expert uses that had to be read from disk.", x.Misses)
		counter("sluice_expert_bytes_read_total", "Bytes of expert records read from disk.", x.BytesRead)
		counter("sluice_expert_evictions_total", "Expert records evicted from the pool.", x.Evictions)
		fmt.Fprintf(bw, "# HELP sluice_expert_io_wait_seconds_total Seconds the forward pass waited for expert reads.\n# TYPE sluice_expert_io_wait_seconds_total counter\nsluice_expert_io_wait_seconds_total %g\n", x.IOWaitMS/1000)
		counter("sluice_expert_lookahead_issued_total", "Next-layer expert prefetches issued.", x.LookIssued)
		counter("sluice_expert_lookahead_useful_total", "Prefetches used by the layer they were issued for.", x.LookUseful)
		counter("sluice_expert_lookahead_wasted_total", "Prefetches read for nothing.", x.LookWasted)
		gauge("sluice_expert_prefetch_readers", "Expert readers that take lookahead prefetches now (the count follows the disk unless --prefetch-readers fixes it).", float64(x.PrefetchReaders))
		counter("sluice_expert_prefetch_reader_changes_total", "Changes of the prefetch readers' count as it followed the disk.", x.PrefetchSwitches)
	} else {
		// Every expert is mapped whole: every use is a hit, nothing is read.
		counter("sluice_expert_hits_total", "Routed-expert uses served from memory (all of them: the experts are mapped whole).", m.forwardTokens.Load()*m.expertsPerToken)
		counter("sluice_expert_misses_total", "Routed-expert uses that had to be read from disk.", 0)
		counter("sluice_expert_bytes_read_total", "Bytes of expert records read from disk.", 0)
	}
	if p, ok := s.e.DevicePool(); ok && p.Slots > 0 {
		// The GPU's own pool, filled from the host's experts above.
		pinned := 0.0
		if p.HostPinned {
			pinned = 1
		}
		gauge("sluice_gpu_pool_slots", "Expert records the GPU's pool holds.", float64(p.Slots))
		counter("sluice_gpu_pool_hits_total", "Routed-expert uses found in the GPU's pool.", int64(p.Hits))
		counter("sluice_gpu_pool_misses_total", "Routed-expert uses copied into the GPU's pool from host memory.", int64(p.Misses))
		counter("sluice_gpu_pool_bytes_copied_total", "Bytes copied from host memory into the GPU's pool (misses and lookahead).", int64(p.BytesUp))
		counter("sluice_gpu_pool_lookahead_copied_total", "Experts the decode's lookahead copied into the GPU's pool.", int64(p.Prefetched))
		counter("sluice_gpu_pool_lookahead_used_total", "Lookahead copies a step then used.", int64(p.PrefetchUsed))
		gauge("sluice_gpu_pool_host_pinned", "1 when misses are copied straight from page-locked host memory (the host's store or its pool), 0 when through staging.", pinned)
	}
	gauge("sluice_state_bytes", "Bytes of one sequence state (a slot).", float64(s.stateBytes))
	gauge("sluice_process_resident_memory_bytes", "Resident set size of the server process.", float64(rssBytes()))
	gauge("sluice_uptime_seconds", "Seconds since the server started.", time.Since(m.start).Seconds())
}
