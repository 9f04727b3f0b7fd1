package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/tokenizer"
	"github.com/sluicelm/sluice/models"
)

// testCtx is the context length of the test engines: small, so states are
// cheap and "prompt over the context" is easy to reach.
const testCtx = 512

var (
	// srvEng is the engine the test servers run on (one at a time: each
	// test's server is stopped before the next starts); refEng computes
	// what a request would give alone, the way `sluice run` does.
	srvEng, refEng *engine.Engine
	refMu          sync.Mutex
	// testModelDir is the bundled model's packed directory.
	testModelDir string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "sluice-server-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	dir, err := models.DefaultDir(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testModelDir = dir
	for _, e := range []**engine.Engine{&srvEng, &refEng} {
		if *e, err = engine.Open(context.Background(), dir, engine.Options{Ctx: testCtx, Threads: 1}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer (*e).Close()
	}
	return m.Run()
}

// start serves cfg over 127.0.0.1 until the test ends, on the shared
// server engine unless cfg names one (which must outlive the test's
// cleanups: register its Close with t.Cleanup before calling start).
func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Engine == nil {
		cfg.Engine = srvEng
	}
	if cfg.ModelID == "" {
		cfg.ModelID = "tiny"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Abort()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Wait(ctx); err != nil {
			t.Errorf("scheduler did not stop: %v", err)
		}
	})
	return s, ts.URL
}

// reference generates alone on a fresh state, as `sluice run` does.
func reference(t *testing.T, prompt []int, maxTokens int, p sample.Params) string {
	t.Helper()
	refMu.Lock()
	defer refMu.Unlock()
	st, err := refEng.NewState()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	_, _, err = refEng.Generate(context.Background(), st, prompt, engine.GenOptions{MaxTokens: maxTokens, Sample: p}, func(_ int, s string) error {
		sb.WriteString(s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

func chatTokens(t *testing.T, msgs ...tokenizer.Message) []int {
	t.Helper()
	text, err := refEng.Tok.ApplyChatTemplate(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	return refEng.Tok.Encode(text)
}

// reply is the parts of a response the tests look at.
type reply struct {
	Status  int
	Header  http.Header
	Text    string
	Finish  string
	Usage   usage
	Error   apiError
	Chunks  int
	RawBody string
}

type errBody struct {
	Error apiError `json:"error"`
}

// post sends body to url+path (with an optional bearer key) and parses the
// answer, whole or streamed.
func post(t *testing.T, url, path, key string, body any) reply {
	t.Helper()
	return postCtx(t, context.Background(), url, path, key, body)
}

func postCtx(t *testing.T, ctx context.Context, url, path, key string, body any) reply {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return parseReply(t, resp)
}

func parseReply(t *testing.T, resp *http.Response) reply {
	t.Helper()
	r := reply{Status: resp.StatusCode, Header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sawDone := false
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				t.Fatalf("stream line without data: %q", line)
			}
			if sawDone {
				t.Fatalf("data after [DONE]: %q", line)
			}
			if data == "[DONE]" {
				sawDone = true
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
					Text         string  `json:"text"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
				Usage *usage    `json:"usage"`
				Error *apiError `json:"error"`
			}
			if err := json.Unmarshal([]byte(data), &ch); err != nil {
				t.Fatalf("stream chunk is not JSON: %v: %q", err, data)
			}
			r.Chunks++
			if ch.Error != nil {
				r.Error = *ch.Error
			}
			if ch.Usage != nil {
				r.Usage = *ch.Usage
			}
			for _, c := range ch.Choices {
				r.Text += c.Delta.Content + c.Text
				if c.FinishReason != nil {
					r.Finish = *c.FinishReason
				}
			}
		}
		if !sawDone {
			t.Fatalf("stream did not end with data: [DONE] (%v)", sc.Err())
		}
		return r
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r.RawBody = string(b)
	if resp.StatusCode != http.StatusOK {
		var e errBody
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("status %d with a body that is not an OpenAI error: %v: %s", resp.StatusCode, err, b)
		}
		r.Error = e.Error
		return r
	}
	var full struct {
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(b, &full); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, b)
	}
	if len(full.Choices) != 1 {
		t.Fatalf("want one choice: %s", b)
	}
	c := full.Choices[0]
	r.Text, r.Finish, r.Usage = c.Message.Content+c.Text, c.FinishReason, full.Usage
	return r
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type msg = map[string]any

func chatBody(msgs []tokenizer.Message, extra msg) msg {
	var ms []msg
	for _, m := range msgs {
		ms = append(ms, msg{"role": m.Role, "content": m.Content})
	}
	b := msg{"model": "tiny", "messages": ms}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

var greedy = sample.Params{}

// TestChatStreamAndWholeMatchRun checks that a chat completion gives the
// same text streamed and whole, equal to greedy generation alone on the
// templated prompt, with usage; and the same for text completions.
func TestChatStreamAndWholeMatchRun(t *testing.T) {
	_, url := start(t, Config{})
	msgs := []tokenizer.Message{{Role: "system", Content: "You write Python."}, {Role: "user", Content: "def add(a, b):"}}
	ids := chatTokens(t, msgs...)
	want := reference(t, ids, 40, greedy)
	whole := post(t, url, "/v1/chat/completions", "", chatBody(msgs, msg{"max_tokens": 40, "temperature": 0}))
	if whole.Status != 200 {
		t.Fatalf("status %d: %s", whole.Status, whole.RawBody)
	}
	stream := post(t, url, "/v1/chat/completions", "", chatBody(msgs, msg{"max_tokens": 40, "temperature": 0, "stream": true, "stream_options": msg{"include_usage": true}}))
	if whole.Text != want || stream.Text != want {
		t.Fatalf("texts differ:\nalone   %q\nwhole   %q\nstream  %q", want, whole.Text, stream.Text)
	}
	if want == "" {
		t.Fatal("the reference generated nothing; pick another prompt")
	}
	for _, r := range []reply{whole, stream} {
		if r.Finish != "length" && r.Finish != "stop" {
			t.Errorf("finish_reason %q", r.Finish)
		}
		if r.Usage.PromptTokens != len(ids) || r.Usage.CompletionTokens == 0 || r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
			t.Errorf("usage %+v, want %d prompt tokens", r.Usage, len(ids))
		}
	}
	if stream.Chunks < 3 {
		t.Errorf("only %d stream chunks", stream.Chunks)
	}

	prompt := "def fibonacci(n):"
	want = reference(t, refEng.Tok.Encode(prompt), 32, greedy)
	for _, streamed := range []bool{false, true} {
		r := post(t, url, "/v1/completions", "", msg{"prompt": prompt, "max_tokens": 32, "temperature": 0, "stream": streamed})
		if r.Status != 200 || r.Text != want {
			t.Fatalf("completions (stream %v): status %d, text %q, want %q", streamed, r.Status, r.Text, want)
		}
	}
	// The prompt as token ids gives the same.
	r := post(t, url, "/v1/completions", "", msg{"prompt": refEng.Tok.Encode(prompt), "max_tokens": 32, "temperature": 0})
	if r.Text != want {
		t.Fatalf("token-id prompt: %q, want %q", r.Text, want)
	}
}

// TestConcurrentClients runs 8 clients at once (more than the slots, so
// some queue), greedy and seeded, streamed and whole: each gets what it
// would get alone.
func TestConcurrentClients(t *testing.T) {
	_, url := start(t, Config{Slots: 3, MaxQueue: 8, StepsPerTurn: 2})
	prompts := []string{"def fibonacci(n):", "import os\n", "class Stack:", "def main():", "# Sort a list\n", "for i in range(", "def is_prime(n):", "x = ["}
	type result struct {
		got, want string
		status    int
	}
	res := make([]result, len(prompts))
	for i, p := range prompts {
		sp := greedy
		if i%2 == 1 {
			sp = sample.Params{Temperature: 0.9, TopP: 0.95, Seed: uint64(100 + i)}
		}
		res[i].want = reference(t, refEng.Tok.Encode(p), 24, sp)
	}
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := msg{"prompt": p, "max_tokens": 24, "temperature": 0, "stream": i%3 == 0}
			if i%2 == 1 {
				body["temperature"], body["top_p"], body["seed"] = 0.9, 0.95, 100+i
			}
			r := post(t, url, "/v1/completions", "", body)
			res[i].got, res[i].status = r.Text, r.Status
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.status != 200 || r.got != r.want {
			t.Errorf("client %d (%q): status %d\n got %q\nwant %q", i, prompts[i], r.status, r.got, r.want)
		}
	}
}

// TestPrefixReuse checks that requests sharing a system prompt, repeating
// a prompt, or continuing a conversation resume from the prefix cache
// (cached_tokens and the metrics say so) with output identical to
// computing everything.
func TestPrefixReuse(t *testing.T) {
	_, url := start(t, Config{})
	sys := tokenizer.Message{Role: "system", Content: "You are a careful Python programmer. Answer with code only, no prose, and keep functions short."}
	a := []tokenizer.Message{sys, {Role: "user", Content: "def add(a, b):"}}
	b := []tokenizer.Message{sys, {Role: "user", Content: "class Queue:"}}
	sysLen := len(refEng.Tok.Encode(mustTemplate(t, []tokenizer.Message{sys}, false)))

	ra := post(t, url, "/v1/chat/completions", "", chatBody(a, msg{"max_tokens": 16, "temperature": 0}))
	if ra.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first request: cached_tokens %d, want 0", ra.Usage.PromptTokensDetails.CachedTokens)
	}
	rb := post(t, url, "/v1/chat/completions", "", chatBody(b, msg{"max_tokens": 16, "temperature": 0}))
	if got := rb.Usage.PromptTokensDetails.CachedTokens; got != sysLen {
		t.Errorf("shared system prompt: cached_tokens %d, want %d (the system prompt)", got, sysLen)
	}
	if want := reference(t, chatTokens(t, b...), 16, greedy); rb.Text != want {
		t.Errorf("with the system prompt reused: %q, want %q", rb.Text, want)
	}
	// The same request again: all but the last prompt token are reused.
	ra2 := post(t, url, "/v1/chat/completions", "", chatBody(a, msg{"max_tokens": 16, "temperature": 0, "stream": true, "stream_options": msg{"include_usage": true}}))
	if n := len(chatTokens(t, a...)); ra2.Usage.PromptTokensDetails.CachedTokens != n-1 {
		t.Errorf("repeated prompt: cached_tokens %d, want %d", ra2.Usage.PromptTokensDetails.CachedTokens, n-1)
	}
	if ra2.Text != ra.Text {
		t.Errorf("repeated prompt: %q, first time %q", ra2.Text, ra.Text)
	}
	// The next turn of conversation a reuses at least a's whole prompt.
	turn2 := append(append([]tokenizer.Message{}, a...), tokenizer.Message{Role: "assistant", Content: ra.Text}, tokenizer.Message{Role: "user", Content: "Now subtract."})
	r2 := post(t, url, "/v1/chat/completions", "", chatBody(turn2, msg{"max_tokens": 16, "temperature": 0}))
	if n := len(chatTokens(t, a...)); r2.Usage.PromptTokensDetails.CachedTokens < n-1 {
		t.Errorf("second turn: cached_tokens %d, want at least %d", r2.Usage.PromptTokensDetails.CachedTokens, n-1)
	}
	if want := reference(t, chatTokens(t, turn2...), 16, greedy); r2.Text != want {
		t.Errorf("second turn: %q, want %q", r2.Text, want)
	}
	// Penalties need the whole history, so they do not reuse.
	rp := post(t, url, "/v1/chat/completions", "", chatBody(b, msg{"max_tokens": 8, "temperature": 0, "presence_penalty": 0.5}))
	if rp.Status != 200 || rp.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("with a penalty: status %d, cached_tokens %d, want 0", rp.Status, rp.Usage.PromptTokensDetails.CachedTokens)
	}
	_, m := get(t, url+"/metrics")
	if metricValue(t, m, "sluice_prefix_cache_hits_total") < 3 || metricValue(t, m, "sluice_prompt_tokens_cached_total") < float64(sysLen) {
		t.Errorf("metrics do not show the reuse:\n%s", grepLines(m, "prefix_cache", "cached"))
	}
}

func mustTemplate(t *testing.T, msgs []tokenizer.Message, gen bool) string {
	t.Helper()
	s, err := refEng.Tok.ApplyChatTemplate(msgs, gen)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func grepLines(text string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// longRequest starts a streaming request that would run for a long time
// and returns once its first chunk has arrived, with the function that
// drops the connection.
func longRequest(t *testing.T, url string) (cancel func(), done <-chan struct{}) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	b, _ := json.Marshal(msg{"prompt": "def f(x):", "max_tokens": testCtx, "temperature": 0, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("long request: status %d", resp.StatusCode)
	}
	first := make(chan struct{})
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		once := false
		for sc.Scan() {
			if !once && strings.HasPrefix(sc.Text(), "data: ") {
				once = true
				close(first)
			}
		}
		if !once {
			close(first)
		}
	}()
	<-first
	return cancelCtx, fin
}

// waitLoad waits until the server's load is (active, queued).
func waitLoad(t *testing.T, s *Server, active, queued int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, q := s.Load()
		if a == active && q == queued {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("load is %d active, %d queued; want %d, %d", a, q, active, queued)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCancelFreesSlot drops a client mid-stream: its slot is freed and the
// next request is served.
func TestCancelFreesSlot(t *testing.T) {
	s, url := start(t, Config{Slots: 1, MaxQueue: 0})
	cancel, done := longRequest(t, url)
	waitLoad(t, s, 1, 0)
	cancel()
	<-done
	waitLoad(t, s, 0, 0)
	r := post(t, url, "/v1/completions", "", msg{"prompt": "import os", "max_tokens": 4, "temperature": 0})
	if r.Status != 200 {
		t.Fatalf("after a cancel: status %d %+v", r.Status, r.Error)
	}
	_, m := get(t, url+"/metrics")
	if !strings.Contains(m, `sluice_generations_total{reason="cancelled"} 1`) {
		t.Errorf("cancellation not counted:\n%s", grepLines(m, "generations_total"))
	}
}

// TestQueueFull429 fills the slot and the queue: the next request gets 429
// with Retry-After, and the queued one is served once the slot frees.
func TestQueueFull429(t *testing.T) {
	s, url := start(t, Config{Slots: 1, MaxQueue: 1})
	cancel, done := longRequest(t, url)
	waitLoad(t, s, 1, 0)
	queued := make(chan reply, 1)
	go func() {
		queued <- post(t, url, "/v1/completions", "", msg{"prompt": "import os", "max_tokens": 4, "temperature": 0})
	}()
	waitLoad(t, s, 1, 1)
	r := post(t, url, "/v1/chat/completions", "", chatBody([]tokenizer.Message{{Role: "user", Content: "hi"}}, nil))
	if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" || r.Error.Code != "rate_limit_exceeded" || r.Error.Message == "" {
		t.Fatalf("want 429 with Retry-After and an OpenAI error, got %d %q %+v", r.Status, r.Header.Get("Retry-After"), r.Error)
	}
	cancel()
	<-done
	if q := <-queued; q.Status != 200 {
		t.Fatalf("the queued request: status %d %+v", q.Status, q.Error)
	}
	// A client that gives up while queued frees its place too.
	cancel, done = longRequest(t, url)
	ctx, cancelQ := context.WithCancel(context.Background())
	go func() {
		b, _ := json.Marshal(msg{"prompt": "x", "max_tokens": 2})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitLoad(t, s, 1, 1)
	cancelQ()
	waitLoad(t, s, 1, 0)
	cancel()
	<-done
	waitLoad(t, s, 0, 0)
}

// TestStop cuts the output at a stop sequence, streamed and whole.
func TestStop(t *testing.T) {
	_, url := start(t, Config{})
	prompt := "def fibonacci(n):"
	full := reference(t, refEng.Tok.Encode(prompt), 32, greedy)
	// A stop sequence from the middle of the reply.
	stop := strings.TrimSpace(full[len(full)/2:])
	if len(stop) > 4 {
		stop = stop[:4]
	}
	i := strings.Index(full, stop)
	if stop == "" || i < 0 {
		t.Fatalf("no stop sequence in %q", full)
	}
	for _, streamed := range []bool{false, true} {
		r := post(t, url, "/v1/completions", "", msg{"prompt": prompt, "max_tokens": 32, "temperature": 0, "stop": []string{"never", stop}, "stream": streamed})
		if r.Text != full[:i] || r.Finish != "stop" {
			t.Errorf("stream %v, stop %q: %q (%s), want %q (stop)", streamed, stop, r.Text, r.Finish, full[:i])
		}
	}
}

// TestErrors sends every kind of bad request: each gets its status and an
// error in OpenAI's shape.
func TestErrors(t *testing.T) {
	s, url := start(t, Config{MaxBodyBytes: 64 << 10})
	long := strings.Repeat("def f(x): return x\n", 200) // well over testCtx tokens
	ids := make([]int, testCtx+1)
	user := []msg{{"role": "user", "content": "hi"}}
	cases := []struct {
		name, path string
		body       any
		status     int
		code       string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`, 400, "invalid_json"},
		{"empty body", "/v1/chat/completions", ``, 400, "invalid_json"},
		{"not an object", "/v1/chat/completions", `[1, 2]`, 400, "invalid_json"},
		{"trailing garbage", "/v1/completions", `{"prompt": "x"} x`, 400, "invalid_json"},
		{"missing messages", "/v1/chat/completions", msg{"model": "tiny"}, 400, "missing_required_parameter"},
		{"empty messages", "/v1/chat/completions", msg{"messages": []msg{}}, 400, "invalid_value"},
		{"messages not an array", "/v1/chat/completions", msg{"messages": "hi"}, 400, "invalid_type"},
		{"message without role", "/v1/chat/completions", msg{"messages": []msg{{"content": "hi"}}}, 400, "missing_required_parameter"},
		{"unknown role", "/v1/chat/completions", msg{"messages": []msg{{"role": "wizard", "content": "hi"}}}, 400, "invalid_value"},
		{"user without content", "/v1/chat/completions", msg{"messages": []msg{{"role": "user"}}}, 400, "missing_required_parameter"},
		{"image content", "/v1/chat/completions", msg{"messages": []msg{{"role": "user", "content": []msg{{"type": "image_url", "image_url": msg{"url": "x"}}}}}}, 400, "invalid_value"},
		{"temperature a string", "/v1/chat/completions", msg{"messages": user, "temperature": "hot"}, 400, "invalid_type"},
		{"temperature too high", "/v1/chat/completions", msg{"messages": user, "temperature": 3}, 400, "invalid_value"},
		{"top_p too high", "/v1/chat/completions", msg{"messages": user, "top_p": 1.5}, 400, "invalid_value"},
		{"max_tokens a string", "/v1/chat/completions", msg{"messages": user, "max_tokens": "ten"}, 400, "invalid_type"},
		{"max_tokens fractional", "/v1/chat/completions", msg{"messages": user, "max_tokens": 1.5}, 400, "invalid_type"},
		{"max_tokens zero", "/v1/chat/completions", msg{"messages": user, "max_tokens": 0}, 400, "invalid_value"},
		{"stream a string", "/v1/chat/completions", msg{"messages": user, "stream": "yes"}, 400, "invalid_type"},
		{"stop a number", "/v1/chat/completions", msg{"messages": user, "stop": 5}, 400, "invalid_value"},
		{"seed a string", "/v1/chat/completions", msg{"messages": user, "seed": "x"}, 400, "invalid_type"},
		{"n of 2", "/v1/chat/completions", msg{"messages": user, "n": 2}, 400, "unsupported_value"},
		{"logprobs", "/v1/chat/completions", msg{"messages": user, "logprobs": true}, 400, "unsupported_value"},
		{"penalty out of range", "/v1/chat/completions", msg{"messages": user, "presence_penalty": 5}, 400, "invalid_value"},
		{"chat over the context", "/v1/chat/completions", msg{"messages": []msg{{"role": "user", "content": long}}}, 400, "context_length_exceeded"},
		{"prompt over the context", "/v1/completions", msg{"prompt": ids}, 400, "context_length_exceeded"},
		{"missing prompt", "/v1/completions", msg{"max_tokens": 3}, 400, "missing_required_parameter"},
		{"empty prompt", "/v1/completions", msg{"prompt": ""}, 400, "invalid_value"},
		{"prompt a number", "/v1/completions", msg{"prompt": 7}, 400, "invalid_value"},
		{"token outside the vocabulary", "/v1/completions", msg{"prompt": []int{1, 99999}}, 400, "invalid_value"},
		{"two prompts", "/v1/completions", msg{"prompt": []string{"a", "b"}}, 400, "invalid_value"},
		{"body too large", "/v1/completions", msg{"prompt": strings.Repeat("x", 100<<10)}, 413, "request_too_large"},
		{"unknown endpoint", "/v1/embeddings", msg{"input": "x"}, 404, "not_found"},
	}
	for _, c := range cases {
		r := post(t, url, c.path, "", c.body)
		if r.Status != c.status || r.Error.Code != c.code || r.Error.Message == "" || r.Error.Type == "" {
			t.Errorf("%s: got %d %+v, want %d with code %s", c.name, r.Status, r.Error, c.status, c.code)
		}
	}
	// repetition_penalty follows the CLI's --repeat-penalty rule, message
	// included: 0 is refused, not read as off.
	for _, rp := range []float64{0, 10.5} {
		r := post(t, url, "/v1/completions", "", msg{"prompt": "x", "max_tokens": 2, "repetition_penalty": rp})
		if want := fmt.Sprintf("repetition_penalty must be in (0, 10] (1 = off), got %v", rp); r.Status != 400 || r.Error.Param != "repetition_penalty" || r.Error.Message != want {
			t.Errorf("repetition_penalty %v: %d %+v, want 400 %q", rp, r.Status, r.Error, want)
		}
	}
	// Unknown fields are ignored, as OpenAI's clients send fields a
	// server may not know.
	if r := post(t, url, "/v1/chat/completions", "", msg{"messages": user, "max_tokens": 2, "frobnicate": []int{1}, "tools": nil}); r.Status != 200 {
		t.Errorf("unknown field: status %d %+v", r.Status, r.Error)
	}
	resp, err := http.Get(url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	if r := parseReply(t, resp); r.Status != 405 || r.Error.Code != "method_not_allowed" {
		t.Errorf("GET on chat: %d %+v", r.Status, r.Error)
	}
	resp.Body.Close()
	waitLoad(t, s, 0, 0)
}

// TestUnsupportedParameters checks that requests asking for what sluice
// cannot do (constrained output, tool calls, several candidates) get a 400
// naming the parameter, as n and logprobs do, instead of free text; that
// the plain forms of the same fields pass; and that type errors name the
// field as the request spells it.
func TestUnsupportedParameters(t *testing.T) {
	s, url := start(t, Config{})
	user := []msg{{"role": "user", "content": "hi"}}
	tools := []msg{{"type": "function", "function": msg{"name": "f"}}}
	chat := func(extra msg) msg {
		m := msg{"messages": user, "max_tokens": 2}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name, path string
		body       any
		status     int
		code       string
		param      any
	}{
		{"json mode", "/v1/chat/completions", chat(msg{"response_format": msg{"type": "json_object"}}), 400, "unsupported_value", "response_format"},
		{"json schema", "/v1/completions", msg{"prompt": "x", "response_format": msg{"type": "json_schema", "json_schema": msg{}}}, 400, "unsupported_value", "response_format"},
		{"response_format a string", "/v1/chat/completions", chat(msg{"response_format": "json"}), 400, "invalid_value", "response_format"},
		{"tools", "/v1/chat/completions", chat(msg{"tools": tools}), 400, "unsupported_value", "tools"},
		{"tools with auto", "/v1/chat/completions", chat(msg{"tools": tools, "tool_choice": "auto"}), 400, "unsupported_value", "tools"},
		{"tools not an array", "/v1/chat/completions", chat(msg{"tools": "f"}), 400, "invalid_type", "tools"},
		{"tool_choice required", "/v1/chat/completions", chat(msg{"tool_choice": "required"}), 400, "unsupported_value", "tool_choice"},
		{"tool_choice a function", "/v1/chat/completions", chat(msg{"tools": tools, "tool_choice": msg{"type": "function", "function": msg{"name": "f"}}}), 400, "unsupported_value", "tool_choice"},
		{"best_of 2", "/v1/completions", msg{"prompt": "x", "best_of": 2}, 400, "unsupported_value", "best_of"},
		{"best_of 0", "/v1/completions", msg{"prompt": "x", "best_of": 0}, 400, "invalid_value", "best_of"},
		{"max_tokens a string", "/v1/chat/completions", chat(msg{"max_tokens": "5"}), 400, "invalid_type", "max_tokens"},
		{"seed a string", "/v1/completions", msg{"prompt": "x", "seed": "5"}, 400, "invalid_type", "seed"},
		{"include_usage a string", "/v1/completions", msg{"prompt": "x", "stream_options": msg{"include_usage": "yes"}}, 400, "invalid_type", "stream_options.include_usage"},
		{"n of 2", "/v1/chat/completions", chat(msg{"n": 2}), 400, "unsupported_value", "n"},

		{"text format", "/v1/chat/completions", chat(msg{"response_format": msg{"type": "text"}}), 200, "", nil},
		{"null format", "/v1/completions", msg{"prompt": "x", "max_tokens": 2, "response_format": nil}, 200, "", nil},
		{"tools ruled out", "/v1/chat/completions", chat(msg{"tools": tools, "tool_choice": "none"}), 200, "", nil},
		{"no tools, auto", "/v1/chat/completions", chat(msg{"tools": []msg{}, "tool_choice": "auto"}), 200, "", nil},
		{"best_of 1", "/v1/completions", msg{"prompt": "x", "max_tokens": 2, "best_of": 1}, 200, "", nil},
	}
	for _, c := range cases {
		r := post(t, url, c.path, "", c.body)
		if r.Status != c.status || r.Error.Code != c.code || r.Error.Param != c.param {
			t.Errorf("%s: got %d %+v, want %d with code %q and param %v", c.name, r.Status, r.Error, c.status, c.code, c.param)
		}
		if c.status != 200 && (r.Error.Message == "" || r.Error.Type != "invalid_request_error" || strings.Contains(r.Error.Message, "sampling.")) {
			t.Errorf("%s: error %+v", c.name, r.Error)
		}
	}
	waitLoad(t, s, 0, 0)
}

// TestAPIKey checks the bearer token on /v1/, and that health and metrics
// stay open.
func TestAPIKey(t *testing.T) {
	_, url := start(t, Config{APIKey: "sekrit"})
	body := msg{"prompt": "x", "max_tokens": 2}
	for _, key := range []string{"", "wrong"} {
		if r := post(t, url, "/v1/completions", key, body); r.Status != 401 || r.Error.Code != "invalid_api_key" {
			t.Errorf("key %q: %d %+v", key, r.Status, r.Error)
		}
	}
	if r := post(t, url, "/v1/completions", "sekrit", body); r.Status != 200 {
		t.Errorf("right key: %d %+v", r.Status, r.Error)
	}
	if code, _ := get(t, url+"/v1/models"); code != 401 {
		t.Errorf("models without a key: %d", code)
	}
	if code, _ := get(t, url+"/health"); code != 200 {
		t.Errorf("health: %d", code)
	}
	// RFC 7235: the scheme is case-insensitive; the token is not.
	for header, want := range map[string]int{
		"Bearer sekrit": 200, "bearer sekrit": 200, "BEARER sekrit": 200, "bEaReR  sekrit": 200,
		"Bearer SEKRIT": 401, "Basic sekrit": 401, "sekrit": 401, "Bearersekrit": 401, "bearer": 401,
	} {
		req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: %d, want %d", header, resp.StatusCode, want)
		}
	}
}

// TestModelsHealthMetrics checks the read-only endpoints.
func TestModelsHealthMetrics(t *testing.T) {
	s, url := start(t, Config{})
	code, body := get(t, url+"/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "tiny" || list.Data[0].Object != "model" {
		t.Fatalf("models: %d %s", code, body)
	}
	if code, _ := get(t, url+"/v1/models/tiny"); code != 200 {
		t.Errorf("models/tiny: %d", code)
	}
	if code, _ := get(t, url+"/v1/models/other"); code != 404 {
		t.Errorf("models/other: %d", code)
	}
	if code, body := get(t, url+"/health"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("health: %d %s", code, body)
	}
	post(t, url, "/v1/completions", "", msg{"prompt": "import", "max_tokens": 3})
	code, m := get(t, url+"/metrics")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	for _, name := range []string{`sluice_requests_total{endpoint="/v1/completions",code="200"} 1`, "sluice_generated_tokens_total 3",
		"sluice_tokens_per_second", "sluice_queue_depth 0", `sluice_request_duration_seconds_bucket{le="+Inf"} 1`,
		"sluice_time_to_first_token_seconds_count 1", "sluice_expert_hits_total", "sluice_expert_misses_total", "sluice_expert_bytes_read_total"} {
		if !strings.Contains(m, name) {
			t.Errorf("metrics lack %q", name)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(m), "\n") {
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if !strings.HasPrefix(name, "sluice_") {
			t.Errorf("metric line without the sluice_ prefix: %q", line)
		}
	}
	if s.met.forwardTokens.Load() > 0 && metricValue(t, m, "sluice_expert_hits_total") <= 0 {
		t.Error("no expert hits counted")
	}
	s.Shutdown()
	if code, _ := get(t, url+"/health"); code != 503 {
		t.Errorf("health while shutting down: %d", code)
	}
	if r := post(t, url, "/v1/completions", "", msg{"prompt": "x"}); r.Status != 503 {
		t.Errorf("generation while shutting down: %d", r.Status)
	}
}

// TestOpenAINodeClient drives the server with the official openai npm
// package. .ci/run installs it when npm is present and points
// SLUICE_OPENAI_NODE_PATH at its node_modules; otherwise the test skips.
func TestOpenAINodeClient(t *testing.T) {
	nodePath := os.Getenv("SLUICE_OPENAI_NODE_PATH")
	if nodePath == "" {
		t.Skip("SLUICE_OPENAI_NODE_PATH is unset: no node_modules with the openai npm package (.ci/run installs it when npm is present)")
	}
	if _, err := os.Stat(filepath.Join(nodePath, "openai", "package.json")); err != nil {
		t.Skipf("the openai npm package is not in SLUICE_OPENAI_NODE_PATH=%s: %v", nodePath, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH: skipping the openai npm client test")
	}
	_, url := start(t, Config{APIKey: "k"})
	script, err := filepath.Abs(filepath.Join("testdata", "openai_client.cjs"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, url+"/v1", "k")
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodePath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var got struct {
		Models                   []string
		Chat, Stream, Completion string
		ChatFinish               string
		ChatUsage, StreamUsage   usage
		BadStatus, AuthStatus    int
		BadCode, BadType         string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	msgs := []tokenizer.Message{{Role: "system", Content: "You write Python."}, {Role: "user", Content: "def add(a, b):"}}
	want := reference(t, chatTokens(t, msgs...), 24, greedy)
	if len(got.Models) != 1 || got.Models[0] != "tiny" {
		t.Errorf("models %q", got.Models)
	}
	if got.Chat != want || got.Stream != want {
		t.Errorf("chat via openai:\n whole  %q\n stream %q\n want   %q", got.Chat, got.Stream, want)
	}
	if got.ChatUsage.PromptTokens == 0 || got.StreamUsage.CompletionTokens == 0 || got.ChatFinish == "" {
		t.Errorf("usage %+v / %+v, finish %q", got.ChatUsage, got.StreamUsage, got.ChatFinish)
	}
	if wantC := reference(t, refEng.Tok.Encode("def fibonacci(n):"), 16, greedy); got.Completion != wantC {
		t.Errorf("completion via openai %q, want %q", got.Completion, wantC)
	}
	if got.BadStatus != 400 || got.BadCode != "invalid_value" || got.BadType != "invalid_request_error" {
		t.Errorf("bad request seen by openai as %d %q %q", got.BadStatus, got.BadCode, got.BadType)
	}
	if got.AuthStatus != 401 {
		t.Errorf("wrong key seen by openai as %d", got.AuthStatus)
	}
}

// TestDraftsKeepGreedyOutput serves with speculative decoding (several
// tokens per step) and prefix reuse: greedy text is that of plain decoding.
func TestDraftsKeepGreedyOutput(t *testing.T) {
	if !srvEng.CanDraft() {
		t.Skip("the bundled model has no MTP head")
	}
	_, url := start(t, Config{Drafts: 3, Slots: 2})
	sys := tokenizer.Message{Role: "system", Content: "You are a careful Python programmer."}
	for i, u := range []string{"def add(a, b):", "class Stack:", "def add(a, b):"} {
		msgs := []tokenizer.Message{sys, {Role: "user", Content: u}}
		want := reference(t, chatTokens(t, msgs...), 32, greedy)
		r := post(t, url, "/v1/chat/completions", "", chatBody(msgs, msg{"max_tokens": 32, "temperature": 0, "stream": i%2 == 0}))
		if r.Status != 200 || r.Text != want {
			t.Errorf("request %d with drafts: status %d\n got %q\nwant %q", i, r.Status, r.Text, want)
		}
	}
}
