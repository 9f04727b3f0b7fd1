package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
)

// TestChatPageServed checks GET / and its assets: embedded, with their
// content types, a policy that keeps the page to this server, no API key
// needed for the page itself, and 405 for other methods.
func TestChatPageServed(t *testing.T) {
	_, url := start(t, Config{APIKey: "k"})
	for path, typ := range map[string]string{"/": "text/html", "/chat.js": "text/javascript", "/chat.css": "text/css"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), typ) || body.Len() == 0 {
			t.Errorf("GET %s: %d %q, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), body.Len())
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		// Nothing from other sites: no absolute URL in what the page loads.
		if strings.Contains(body.String(), "http://") || strings.Contains(body.String(), "https://") {
			t.Errorf("GET %s refers to another site", path)
		}
	}
	if r := post(t, url, "/", "", msg{}); r.Status != http.StatusMethodNotAllowed {
		t.Errorf("POST /: status %d", r.Status)
	}
	if code, _ := get(t, url+"/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /nothing: status %d", code)
	}
}

// serve serves s over 127.0.0.1 until the test ends.
func serve(t *testing.T, s *Server) string {
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts.URL
}

// sluiceChunk is a streamed chunk's sluice extension.
type sluiceChunk struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage  *usage      `json:"usage"`
	Sluice *replyStats `json:"sluice"`
}

// streamChunks posts a streamed chat request and returns its chunks.
func streamChunks(t *testing.T, url string, body msg) []sluiceChunk {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []sluiceChunk
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c sluiceChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// TestReplyStats checks the sluice extension: the figures of each reply
// agree with its usage and, with a streaming expert pool, with the pool's
// own counters in /metrics (one request at a time, so the request's
// figures are the counters' change); with sluice_stats every text chunk
// carries the figures so far, growing.
func TestReplyStats(t *testing.T) {
	eng, err := engine.Open(context.Background(), testModelDir, engine.Options{Ctx: testCtx, Threads: 1,
		Experts: engine.ExpertOptions{PoolShare: 0.25}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s, err := New(Config{Engine: eng, ModelID: "tiny", CacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Abort()
		s.Wait(context.Background())
	}()
	url := serve(t, s)
	metric := func(name string) float64 {
		_, m := get(t, url+"/metrics")
		return metricValue(t, m, name)
	}
	hits0, misses0, bytes0 := metric("sluice_expert_hits_total"), metric("sluice_expert_misses_total"), metric("sluice_expert_bytes_read_total")
	chunks := streamChunks(t, url, msg{"messages": []msg{{"role": "user", "content": "def add(a, b):"}}, "temperature": 0,
		"max_tokens": 24, "ignore_eos": true, "stream": true, "sluice_stats": true, "stream_options": msg{"include_usage": true}})
	var last *replyStats
	var u *usage
	prev := -1
	for _, c := range chunks {
		if c.Usage != nil {
			u = c.Usage
		}
		if c.Sluice == nil {
			continue
		}
		if c.Sluice.GeneratedTokens < prev {
			t.Errorf("generated_tokens went back from %d to %d", prev, c.Sluice.GeneratedTokens)
		}
		prev = c.Sluice.GeneratedTokens
		if len(c.Choices) == 1 && c.Choices[0].FinishReason != nil {
			last = c.Sluice
		}
	}
	if last == nil || u == nil {
		t.Fatalf("no final sluice figures or usage in %d chunks", len(chunks))
	}
	if last.GeneratedTokens != 24 || last.GeneratedTokens != u.CompletionTokens || last.PromptTokens != u.PromptTokens {
		t.Errorf("figures %+v; usage %+v", last, u)
	}
	hits, misses, read := metric("sluice_expert_hits_total")-hits0, metric("sluice_expert_misses_total")-misses0, metric("sluice_expert_bytes_read_total")-bytes0
	if n, all := metric("sluice_expert_prefetch_readers"), float64(eng.Stream.Options().Readers); n < 1 || n > all {
		t.Errorf("%v readers take prefetches, want 1 to the %v readers", n, all)
	}
	if c := metric("sluice_expert_prefetch_reader_changes_total"); c < 0 {
		t.Errorf("%v changes of the prefetch readers' count", c)
	}
	if last.ExpertsResident || last.ExpertMisses == 0 || float64(last.BytesRead+last.PrefillBytesRead) != read {
		t.Errorf("figures %+v; the pool read %v bytes", last, read)
	}
	// The decode's hits and misses are part of the pool's, the rest being
	// the prefill's.
	if d := hits + misses - float64(last.ExpertHits+last.ExpertMisses); d <= 0 || float64(last.ExpertHits) > hits || float64(last.ExpertMisses) > misses {
		t.Errorf("decode uses %d+%d of the pool's %v+%v", last.ExpertHits, last.ExpertMisses, hits, misses)
	}
	want := float64(last.ExpertHits) / float64(last.ExpertHits+last.ExpertMisses)
	if last.HitRate != want || last.DecodeTokS <= 0 {
		t.Errorf("hit_rate %v, want %v; decode_tok_s %v", last.HitRate, want, last.DecodeTokS)
	}
	// 23 forward passes follow the first token (the last token is not run).
	if mb := float64(last.BytesRead) / (1 << 20) / 23; last.MBPerToken != mb {
		t.Errorf("mb_per_token %v, want %v", last.MBPerToken, mb)
	}

	// Whole responses carry the figures too; resident experts all hit.
	_, url2 := start(t, Config{})
	b, _ := json.Marshal(msg{"messages": []msg{{"role": "user", "content": "hi"}}, "temperature": 0, "max_tokens": 5})
	resp, err := http.Post(url2+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var whole struct {
		Usage  usage       `json:"usage"`
		Sluice *replyStats `json:"sluice"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&whole); err != nil {
		t.Fatal(err)
	}
	if x := whole.Sluice; x == nil || !x.ExpertsResident || x.HitRate != 1 || x.BytesRead != 0 || x.GeneratedTokens != whole.Usage.CompletionTokens {
		t.Errorf("resident figures %+v; usage %+v", whole.Sluice, whole.Usage)
	}
}
