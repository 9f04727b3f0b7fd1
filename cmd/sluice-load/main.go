// Command sluice-load drives a running `sluice serve` with N concurrent
// clients for a while and reports requests per second, latency
// percentiles, errors, generated tokens and the server's resident memory
// before and after (from its /metrics). It is a load run, not a test:
//
//	sluice serve --addr 127.0.0.1:8080 &
//	go run ./cmd/sluice-load --url http://127.0.0.1:8080 --clients 8 --duration 5m
//
// Clients mix chat requests that share a system prompt (prefix reuse),
// multi-turn chats and plain completions, streamed and whole, greedy and
// sampled.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type sample struct {
	latency, ttft time.Duration
	tokens        int
	cached        int
	err           string // "" = success
}

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "server base URL")
	clients := flag.Int("clients", 8, "concurrent clients")
	duration := flag.Duration("duration", time.Minute, "how long to run")
	maxTokens := flag.Int("max-tokens", 48, "max_tokens per request")
	streamFrac := flag.Float64("stream", 0.5, "fraction of requests that stream")
	apiKey := flag.String("api-key", "", "bearer token")
	asJSON := flag.Bool("json", false, "print the summary as JSON")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *clients, MaxConnsPerHost: *clients * 2}}
	rssBefore := scrape(hc, *url, "sluice_process_resident_memory_bytes")

	var mu sync.Mutex
	var samples []sample
	var rssMax float64
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	go func() { // sample the server's RSS every few seconds
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				if v := scrape(hc, *url, "sluice_process_resident_memory_bytes"); v > 0 {
					mu.Lock()
					rssMax = max(rssMax, v)
					mu.Unlock()
				}
			}
		}
	}()
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			var history []map[string]string
			for runCtx.Err() == nil {
				body, chat := request(rng, &history, *maxTokens, rng.Float64() < *streamFrac)
				s, reply := do(runCtx, hc, *url, *apiKey, chat, body)
				if runCtx.Err() != nil && s.err != "" {
					break // cut off by the end of the run, not a server error
				}
				if chat && s.err == "" && len(history) > 0 {
					history = append(history, map[string]string{"role": "assistant", "content": reply})
				}
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
				if s.err == "429" {
					time.Sleep(time.Second) // honour Retry-After
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	time.Sleep(2 * time.Second) // let the server settle before measuring memory again
	rssAfter := scrape(hc, *url, "sluice_process_resident_memory_bytes")
	report(samples, elapsed, *clients, rssBefore, rssAfter, rssMax, *asJSON)
}

var (
	systemPrompt = "You are a careful Python programmer. Answer with short, correct code and no prose."
	userPrompts  = []string{"def add(a, b):", "class Stack:", "Write a function that reverses a string.", "import os\n",
		"def is_prime(n):", "Parse a CSV file.", "def fibonacci(n):", "Sort a list of tuples by the second item.",
		"def main():", "Read a JSON file and print its keys."}
	completionPrompts = []string{"def fibonacci(n):", "import sys\n", "class Node:\n    def __init__(self", "for i in range(",
		"# Compute the mean\n", "def parse(line):"}
)

// request builds a random request: a chat with the shared system prompt
// (sometimes continuing the client's conversation) or a completion.
func request(rng *rand.Rand, history *[]map[string]string, maxTokens int, stream bool) (map[string]any, bool) {
	body := map[string]any{"max_tokens": 1 + rng.IntN(maxTokens), "stream": stream}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	if rng.IntN(3) == 0 {
		body["temperature"] = 0
	} else {
		body["temperature"], body["top_p"], body["seed"] = 0.8, 0.95, rng.IntN(1000)
	}
	if rng.IntN(4) == 0 {
		body["prompt"] = completionPrompts[rng.IntN(len(completionPrompts))]
		return body, false
	}
	if len(*history) == 0 || len(*history) > 6 || rng.IntN(2) == 0 {
		*history = []map[string]string{{"role": "system", "content": systemPrompt}}
	}
	*history = append(*history, map[string]string{"role": "user", "content": userPrompts[rng.IntN(len(userPrompts))]})
	body["messages"] = *history
	return body, true
}

// do sends one request and measures it.
func do(ctx context.Context, hc *http.Client, url, key string, chat bool, body map[string]any) (sample, string) {
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
	if err != nil {
		return sample{err: "request"}, ""
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return sample{err: "connect", latency: time.Since(t0)}, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return sample{err: strconv.Itoa(resp.StatusCode), latency: time.Since(t0)}, ""
	}
	s := sample{}
	var text strings.Builder
	type usage struct {
		CompletionTokens int `json:"completion_tokens"`
		Details          struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				done = true
				break
			}
			var ch struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
					Text  string                   `json:"text"`
				} `json:"choices"`
				Usage *usage          `json:"usage"`
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal([]byte(data), &ch) != nil || ch.Error != nil {
				s.err = "stream-error"
				continue
			}
			for _, c := range ch.Choices {
				if s.ttft == 0 && (c.Delta.Content != "" || c.Text != "") {
					s.ttft = time.Since(t0)
				}
				text.WriteString(c.Delta.Content + c.Text)
			}
			if ch.Usage != nil {
				s.tokens, s.cached = ch.Usage.CompletionTokens, ch.Usage.Details.Cached
			}
		}
		if !done && s.err == "" {
			s.err = "truncated-stream"
		}
	} else {
		var full struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
				Text    string                   `json:"text"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&full); err != nil || len(full.Choices) != 1 {
			s.err = "bad-json"
		} else {
			text.WriteString(full.Choices[0].Message.Content + full.Choices[0].Text)
			s.tokens, s.cached = full.Usage.CompletionTokens, full.Usage.Details.Cached
		}
	}
	s.latency = time.Since(t0)
	return s, text.String()
}

// scrape reads one gauge from the server's /metrics (0 if absent).
func scrape(hc *http.Client, url, name string) float64 {
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func report(samples []sample, elapsed time.Duration, clients int, rssBefore, rssAfter, rssMax float64, asJSON bool) {
	var lat, ttft []time.Duration
	errs := map[string]int{}
	tokens, cached, ok := 0, 0, 0
	for _, s := range samples {
		if s.err != "" {
			errs[s.err]++
			continue
		}
		ok++
		lat = append(lat, s.latency)
		if s.ttft > 0 {
			ttft = append(ttft, s.ttft)
		}
		tokens += s.tokens
		cached += s.cached
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(ttft, func(i, j int) bool { return ttft[i] < ttft[j] })
	sec := elapsed.Seconds()
	out := map[string]any{
		"clients": clients, "seconds": sec, "requests": len(samples), "ok": ok, "errors": errs,
		"requests_per_s": float64(ok) / sec, "tokens_per_s": float64(tokens) / sec, "cached_prompt_tokens": cached,
		"p50_ms": pct(lat, 0.50).Milliseconds(), "p90_ms": pct(lat, 0.90).Milliseconds(), "p99_ms": pct(lat, 0.99).Milliseconds(),
		"ttft_p50_ms": pct(ttft, 0.50).Milliseconds(), "ttft_p99_ms": pct(ttft, 0.99).Milliseconds(),
		"rss_before_mib": rssBefore / (1 << 20), "rss_after_mib": rssAfter / (1 << 20), "rss_max_mib": rssMax / (1 << 20),
	}
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(out)
		return
	}
	fmt.Printf("%d clients for %.0f s: %d requests (%d ok), %.2f req/s, %.1f generated tok/s, %d prompt tokens reused\n",
		clients, sec, len(samples), ok, float64(ok)/sec, float64(tokens)/sec, cached)
	fmt.Printf("latency p50 %v, p90 %v, p99 %v; streamed first token p50 %v, p99 %v\n",
		pct(lat, 0.5).Round(time.Millisecond), pct(lat, 0.9).Round(time.Millisecond), pct(lat, 0.99).Round(time.Millisecond),
		pct(ttft, 0.5).Round(time.Millisecond), pct(ttft, 0.99).Round(time.Millisecond))
	fmt.Printf("errors %v\n", errs)
	fmt.Printf("server RSS before %.1f MiB, after %.1f MiB, max sampled %.1f MiB\n", rssBefore/(1<<20), rssAfter/(1<<20), rssMax/(1<<20))
}
