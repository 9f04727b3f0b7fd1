package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sluicelm/sluice/internal/engine"
)

// chromium finds a Chromium-family browser: $SLUICE_CHROMIUM, else one on
// PATH (Debian's package is "chromium").
func chromium() string {
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// slowStream delays each write of a streamed reply, and while its gate is
// armed holds every write after a reply's first text chunk until the gate
// is released: a test can then press Stop with the reply still coming,
// however fast the machine generates.
type slowStream struct {
	http.ResponseWriter
	delay  time.Duration
	g      *gate
	writes int
}

// gate holds streamed replies after their first text while armed.
type gate struct {
	mu      sync.Mutex
	armed   bool
	release chan struct{}
}

func (g *gate) arm() {
	g.mu.Lock()
	g.armed, g.release = true, make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	if g.armed {
		g.armed = false
		close(g.release)
	}
	g.mu.Unlock()
}

func (s *slowStream) Write(b []byte) (int, error) {
	if strings.HasPrefix(s.Header().Get("Content-Type"), "text/event-stream") {
		time.Sleep(s.delay)
		// The first write is the role chunk, the second the first text.
		if s.writes++; s.writes > 2 {
			s.g.mu.Lock()
			armed, release := s.g.armed, s.g.release
			s.g.mu.Unlock()
			if armed {
				select {
				case <-release:
				case <-time.After(30 * time.Second):
				}
			}
		}
	}
	return s.ResponseWriter.Write(b)
}

func (s *slowStream) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// storedChat is the page's local storage as the test reads it.
type storedChat struct {
	Conversations []struct {
		Title    string `json:"title"`
		Messages []struct {
			Role    string    `json:"role"`
			Content string    `json:"content"`
			State   string    `json:"state"`
			Hits    []float64 `json:"hits"`
			Stats   *struct {
				GeneratedTokens int     `json:"generated_tokens"`
				DecodeTokS      float64 `json:"decode_tok_s"`
				HitRate         float64 `json:"hit_rate"`
				MBPerToken      float64 `json:"mb_per_token"`
				PromptTokens    int     `json:"prompt_tokens"`
				CachedTokens    int     `json:"cached_tokens"`
			} `json:"stats"`
		} `json:"messages"`
	} `json:"conversations"`
}

// TestChatPageInBrowser drives the chat page in headless Chromium over the
// DevTools protocol, against a server with an API key and a streaming
// expert pool: the page asks for the key, a typed prompt's streamed reply
// (temperature 0) equals the API's greedy answer, Stop ends a reply midway
// (keeping the text so far) and the server's slot is free after, Regenerate gives the full answer, after a
// reload the conversation is still there, and editing its first message
// and resending gives the answer to the new text. SLUICE_CHAT_SCREENSHOT=FILE.png
// saves a screenshot of the page at the end.
func TestChatPageInBrowser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no Chromium found (install Debian's chromium, or set SLUICE_CHROMIUM); skipping the browser test")
	}
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	// A pool of a quarter of the expert store, so that the page has a hit
	// rate and bytes read to show; greedy output is the same at any pool.
	eng, err := engine.Open(context.Background(), testModelDir, engine.Options{Ctx: testCtx, Threads: 1,
		Experts: engine.ExpertOptions{PoolShare: 0.25}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	const key = "test-key"
	s, err := New(Config{Engine: eng, ModelID: "tiny", APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.ServeHTTP(&slowStream{ResponseWriter: w, delay: 2 * time.Millisecond, g: g}, r)
	}))
	defer g.open()
	defer func() {
		s.Abort()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Wait(ctx)
	}()

	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1100, 720),
		chromedp.UserDataDir(t.TempDir()))...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first Run starts the browser and must not have a deadline.
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/")); err != nil {
		t.Skipf("Chromium (%s) did not start: %v; skipping the browser test", exe, err)
	}
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// waitFor polls a JavaScript predicate.
	waitFor := func(what, js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			t.Fatalf("waiting for %s (%s): %v", what, js, err)
		}
	}
	stored := func() storedChat {
		t.Helper()
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`localStorage.getItem("sluice.chat") || "{}"`))
		if err != nil {
			t.Fatal(err)
		}
		var c storedChat
		if err := json.Unmarshal([]byte(raw), &c); err != nil {
			t.Fatalf("local storage: %v: %s", err, raw)
		}
		return c
	}
	// greedy is the API's own answer to the conversation so far.
	greedy := func(msgs []msg, maxTokens int) reply {
		t.Helper()
		r := post(t, ts.URL, "/v1/chat/completions", key, msg{"model": "tiny", "messages": msgs, "temperature": 0, "max_tokens": maxTokens})
		if r.Status != 200 {
			t.Fatalf("API: status %d: %+v", r.Status, r.Error)
		}
		return r
	}

	// The page finds that the API wants a key and asks for it.
	waitFor("the API key form", `!document.getElementById("key-form").hidden`)
	do("giving the key", chromedp.SendKeys(chromedp.CSS("#key-input"), key), chromedp.Click(chromedp.CSS("#key-save")))
	waitFor("the model name", `document.getElementById("model-name").textContent.startsWith("tiny")`)

	// A typed prompt at temperature 0 streams the API's greedy answer.
	const maxTokens = 40
	do("settings", chromedp.SetValue(chromedp.CSS("#temperature"), "0"), chromedp.SetValue(chromedp.CSS("#max-tokens"), "40"))
	prompt1 := "Write a Python function that adds two numbers."
	do("typing a prompt", chromedp.SendKeys(chromedp.CSS("#prompt"), prompt1), chromedp.Click(chromedp.CSS("#send")))
	waitFor("the first reply", `document.querySelector(".msg.assistant[data-state=done]") !== null`)
	want1 := greedy([]msg{{"role": "user", "content": prompt1}}, maxTokens)
	c := stored()
	if len(c.Conversations) != 1 || len(c.Conversations[0].Messages) != 2 {
		t.Fatalf("stored conversations: %+v", c)
	}
	got := c.Conversations[0].Messages[1]
	if got.Content != want1.Text || want1.Text == "" {
		t.Fatalf("page reply %q, API greedy answer %q", got.Content, want1.Text)
	}
	if got.Stats == nil || got.Stats.GeneratedTokens != want1.Usage.CompletionTokens || got.Stats.DecodeTokS <= 0 ||
		got.Stats.HitRate <= 0 || got.Stats.HitRate > 1 || got.Stats.PromptTokens != want1.Usage.PromptTokens {
		t.Errorf("reply stats %+v; API usage %+v", got.Stats, want1.Usage)
	}
	if len(got.Hits) < 2 {
		t.Errorf("hit rate recorded at %d points while streaming; want a series", len(got.Hits))
	}
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(".msg.assistant .stats").textContent`))
	if err != nil || !strings.Contains(shown, "tok/s") || !strings.Contains(shown, "hit rate") {
		t.Errorf("stats line %q (%v)", shown, err)
	}

	// A second turn, stopped after its first text arrives (the rest is
	// held back until then).
	const longTokens = 300
	prompt2 := "Now explain it in detail, line by line."
	do("max tokens", chromedp.SetValue(chromedp.CSS("#max-tokens"), "300"))
	g.arm()
	do("typing the second prompt", chromedp.SendKeys(chromedp.CSS("#prompt"), prompt2), chromedp.Click(chromedp.CSS("#send")))
	waitFor("the second reply's first text", `(() => { const m = document.querySelectorAll(".msg.assistant"); return m.length === 2 && m[1].dataset.state === "streaming" && m[1].querySelector(".content").textContent.length > 0 })()`)
	do("stopping", chromedp.Click(chromedp.CSS("#stop")))
	waitFor("the stopped reply", `document.querySelectorAll(".msg.assistant")[1].dataset.state === "stopped"`)
	g.open()
	waitLoad(t, s, 0, 0)
	conv2 := []msg{{"role": "user", "content": prompt1}, {"role": "assistant", "content": want1.Text}, {"role": "user", "content": prompt2}}
	full := greedy(conv2, longTokens)
	c = stored()
	part := c.Conversations[0].Messages[3]
	if part.State != "stopped" || part.Content == "" || !strings.HasPrefix(full.Text, part.Content) || len(part.Content) >= len(full.Text) {
		t.Fatalf("stopped reply (%s) %q; want a strict prefix of the full answer %q", part.State, part.Content, full.Text)
	}

	// Regenerate replaces the stopped reply with the whole answer.
	do("regenerating", chromedp.Click(chromedp.CSS(".msg.assistant:last-child button.regenerate")))
	waitFor("the regenerated reply", `(() => { const m = document.querySelectorAll(".msg.assistant"); return m.length === 2 && m[1].dataset.state === "done" })()`)
	c = stored()
	if regen := c.Conversations[0].Messages[3]; regen.Content != full.Text {
		t.Fatalf("regenerated reply %q; API answer %q", regen.Content, full.Text)
	}
	if cached := c.Conversations[0].Messages[3].Stats; cached == nil || cached.CachedTokens == 0 {
		t.Errorf("the second turn resumed no prompt tokens from the prefix cache: %+v", cached)
	}

	// After a reload the conversation is still there, shown as before.
	do("reloading", chromedp.Reload())
	waitFor("the restored conversation", `document.querySelectorAll(".msg").length === 4`)
	title, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#conversations li.current span").textContent`))
	if err != nil || !strings.HasPrefix(prompt1, title) || title == "" {
		t.Errorf("conversation title %q (%v); want the start of %q", title, err, prompt1)
	}
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelectorAll(".msg.assistant")[0].querySelector(".content").textContent`))
	if err != nil || strings.TrimSpace(text) == "" || !strings.Contains(want1.Text, strings.TrimSpace(strings.Split(text, "\n")[0])) {
		t.Errorf("restored first reply shows %q (%v); the reply was %q", text, err, want1.Text)
	}
	// Editing the first message and resending replaces the conversation
	// from there with the answer to the new text.
	prompt3 := "Write a Go function that adds two numbers."
	do("editing", chromedp.SetValue(chromedp.CSS("#max-tokens"), "40"), chromedp.Click(chromedp.CSS(".msg.user button.edit")))
	do("resending", chromedp.SetValue(chromedp.CSS(".msg.user .edit textarea"), prompt3), chromedp.Click(chromedp.CSS(".msg.user button.resend")))
	waitFor("the edited conversation's reply", `(() => { const m = document.querySelectorAll(".msg"); return m.length === 2 && m[1].dataset.state === "done" })()`)
	want3 := greedy([]msg{{"role": "user", "content": prompt3}}, maxTokens)
	c = stored()
	if m := c.Conversations[0].Messages; len(m) != 2 || m[0].Content != prompt3 || m[1].Content != want3.Text {
		t.Errorf("after edit and resend: %+v; want the answer %q", m, want3.Text)
	}

	// Code fences render as code blocks, and text never becomes markup.
	blocks, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const q = "\x60", f = q + q + q, d = document.createElement("div");
		renderText(d, "Try:\n" + f + "python\nprint(1 < 2)\n" + f + "\nand <b>x</b> with " + q + "y" + q + ".");
		return [d.querySelectorAll("pre code").length + "", d.querySelector("pre code").textContent,
			d.querySelectorAll("b").length + "", d.querySelectorAll(":not(pre) > code").length + ""];
	})()`))
	if err != nil || strings.Join(blocks, "|") != "1|print(1 < 2)|0|1" {
		t.Errorf("rendering a code block: %q (%v); want one block holding the code, no <b>, one inline code", blocks, err)
	}

	if out := os.Getenv("SLUICE_CHAT_SCREENSHOT"); out != "" {
		// A short conversation for the README's picture.
		question := "What does this do?\n```python\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n```"
		do("a new chat", chromedp.Click(chromedp.CSS("#new-chat")), chromedp.SetValue(chromedp.CSS("#max-tokens"), "48"),
			chromedp.SetValue(chromedp.CSS("#system"), "You are a concise Python tutor."),
			chromedp.SetValue(chromedp.CSS("#prompt"), question), chromedp.Click(chromedp.CSS("#send")))
		waitFor("the picture's reply", `document.querySelector(".msg.assistant[data-state=done]") !== null`)
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
