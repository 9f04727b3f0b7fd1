// Package server is sluice's OpenAI-compatible HTTP server: chat and text
// completions (streamed as server-sent events or whole), the model list,
// health and Prometheus metrics, and a chat page at /.
//
// One engine serves many clients. The engine has one runner, which is not
// safe for concurrent use, so a single scheduler goroutine owns it and
// interleaves the active requests, a prefill chunk or a few decode steps
// each. Every active request has its own sequence state (KV rows, DeltaNet
// state), so switching between them is free; the number of live states
// (slots) is bounded by a memory budget, requests beyond them wait in a
// bounded queue, and past that queue the answer is 429. Copies of states at
// the end of prompt prefixes (a system prompt, an earlier turn) are kept in
// a byte-bounded LRU, and a request whose prompt starts with one resumes
// from it: greedy output is the same either way, because a row's arithmetic
// does not depend on how the rows before it were batched.
package server

import (
	"context"
	crand "crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/tokenizer"
)

// Config configures a Server. Zero values pick the documented defaults.
type Config struct {
	Engine  *engine.Engine
	ModelID string // the id /v1/models reports; "" = the model directory's name
	APIKey  string // when set, /v1/ requests need "Authorization: Bearer APIKey"

	Slots      int   // live sequence states (requests generating at once); 0 = 4
	MaxQueue   int   // requests that may wait for a slot before 429; < 0 = 0
	CacheBytes int64 // prefix-cache budget; 0 = four sequence states' worth, < 0 = no prefix cache
	Drafts     int   // MTP drafts per decode step (speculative decoding); 0 = off

	MaxBodyBytes   int64 // request bodies beyond this get 413; 0 = 4 MiB
	StepsPerTurn   int   // decode steps a request runs before the next one's turn; 0 = 4
	PrefillPerTurn int   // prompt tokens a request prefills per turn; 0 = twice the runner's chunk
	MinCacheTokens int   // shortest prefix worth caching; 0 = 4
}

// Server serves the OpenAI-compatible API over one engine.
type Server struct {
	e          *engine.Engine
	cfg        Config
	sched      *scheduler
	met        *metrics
	modelID    string
	created    int64
	stateBytes int64
	cacheMax   int64
	maxBody    int64

	base     context.Context // cancelled by Abort: every job's context derives from it
	abort    context.CancelFunc
	shutting atomic.Bool
}

// New starts a server's scheduler over cfg.Engine. The caller serves the
// returned handler and ends with Shutdown (or Abort) and Wait.
func New(cfg Config) (*Server, error) {
	e := cfg.Engine
	if e == nil {
		return nil, errors.New("server: no engine")
	}
	probe, err := e.NewState()
	if err != nil {
		return nil, fmt.Errorf("server: %v", err)
	}
	s := &Server{e: e, cfg: cfg, modelID: cfg.ModelID, created: time.Now().Unix(), stateBytes: probe.Bytes(), maxBody: cfg.MaxBodyBytes}
	if s.modelID == "" {
		s.modelID = filepath.Base(e.Dir)
	}
	if s.maxBody <= 0 {
		s.maxBody = 4 << 20
	}
	slots := cfg.Slots
	if slots <= 0 {
		slots = 4
	}
	cacheBytes := cfg.CacheBytes
	if cacheBytes == 0 {
		cacheBytes = 4 * s.stateBytes
	}
	s.cacheMax = max(cacheBytes, 0)
	c := e.Model.Config
	s.met = newMetrics(c.Layers * c.TopK)
	sc := &scheduler{e: e, slots: slots, maxQueue: max(cfg.MaxQueue, 0), steps: cfg.StepsPerTurn,
		prefill: cfg.PrefillPerTurn, minMark: cfg.MinCacheTokens, met: s.met,
		wake: make(chan struct{}, 1), done: make(chan struct{}), free: []*model.State{probe}}
	if sc.steps <= 0 {
		sc.steps = 4
	}
	if sc.prefill <= 0 {
		sc.prefill = 2 * e.Runner.MaxRows
	}
	if sc.minMark <= 0 {
		sc.minMark = 4
	}
	if cacheBytes > 0 {
		sc.cache = newPrefixCache(e.Model, e.CopyState, e.ReleaseState, cacheBytes, 64)
	}
	s.sched = sc
	s.base, s.abort = context.WithCancel(context.Background())
	go sc.loop()
	return s, nil
}

// Slots is the number of live sequence states the scheduler may hold.
func (s *Server) Slots() int { return s.sched.slots }

// CacheBytes is the prefix cache's budget (0 when it is off).
func (s *Server) CacheBytes() int64 { return s.cacheMax }

// StateBytes is the memory of one sequence state.
func (s *Server) StateBytes() int64 { return s.stateBytes }

// ModelID is the id reported by /v1/models.
func (s *Server) ModelID() string { return s.modelID }

// Load reports the requests holding slots and those waiting for one.
func (s *Server) Load() (active, queued int) { return s.sched.load() }

// Shutdown refuses new generation requests (503) and lets /health report
// it; requests in flight continue. Pair it with http.Server.Shutdown.
func (s *Server) Shutdown() {
	s.shutting.Store(true)
	s.sched.close()
}

// Abort cancels every request in flight; their clients get an error.
func (s *Server) Abort() {
	s.Shutdown()
	s.abort()
}

// Wait blocks until the scheduler has finished every request, after
// Shutdown or Abort, or until ctx ends.
func (s *Server) Wait(ctx context.Context) error {
	select {
	case <-s.sched.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	var code int
	defer func() {
		if rec := recover(); rec != nil {
			if rec == http.ErrAbortHandler {
				panic(rec)
			}
			// A bug must not take the server down; report it as a 500.
			code = http.StatusInternalServerError
			writeError(w, &apiError{Status: code, Type: "server_error", Code: "internal_error", Message: fmt.Sprintf("internal error: %v", rec)})
		}
		if code != 0 {
			s.met.request(endpointLabel(path), code)
		}
	}()
	switch {
	case servePage(w, r, &code):
	case path == "/health":
		if !allow(w, r, &code, http.MethodGet, http.MethodHead) {
			return
		}
		code = http.StatusOK
		status := "ok"
		if s.shutting.Load() {
			code, status = http.StatusServiceUnavailable, "shutting_down"
		}
		active, queued := s.sched.load()
		writeJSON(w, code, map[string]any{"status": status, "model": s.modelID, "active": active, "queued": queued, "slots": s.sched.slots})
	case path == "/metrics":
		if !allow(w, r, &code, http.MethodGet, http.MethodHead) {
			return
		}
		code = http.StatusOK
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.writeMetrics(w)
	case strings.HasPrefix(path, "/v1/"):
		if !s.authorized(r) {
			code = http.StatusUnauthorized
			writeError(w, &apiError{Status: code, Type: "invalid_request_error", Code: "invalid_api_key",
				Message: "missing or wrong API key: send the header \"Authorization: Bearer KEY\""})
			return
		}
		switch {
		case path == "/v1/models":
			if allow(w, r, &code, http.MethodGet) {
				code = http.StatusOK
				writeJSON(w, code, map[string]any{"object": "list", "data": []any{s.modelObject()}})
			}
		case strings.HasPrefix(path, "/v1/models/"):
			if !allow(w, r, &code, http.MethodGet) {
				return
			}
			if id := strings.TrimPrefix(path, "/v1/models/"); id != s.modelID {
				code = http.StatusNotFound
				writeError(w, &apiError{Status: code, Type: "invalid_request_error", Code: "model_not_found", Message: fmt.Sprintf("the model %q does not exist; this server serves %q", id, s.modelID)})
				return
			}
			code = http.StatusOK
			writeJSON(w, code, s.modelObject())
		case path == "/v1/chat/completions":
			if allow(w, r, &code, http.MethodPost) {
				code = s.handleChat(w, r)
			}
		case path == "/v1/completions":
			if allow(w, r, &code, http.MethodPost) {
				code = s.handleCompletion(w, r)
			}
		default:
			code = http.StatusNotFound
			writeError(w, &apiError{Status: code, Type: "invalid_request_error", Code: "not_found", Message: fmt.Sprintf("no endpoint %s %s", r.Method, path)})
		}
	default:
		code = http.StatusNotFound
		writeError(w, &apiError{Status: code, Type: "invalid_request_error", Code: "not_found", Message: fmt.Sprintf("no endpoint %s %s", r.Method, path)})
	}
}

// endpointLabel bounds the metrics' endpoint label to known paths.
func endpointLabel(path string) string {
	switch path {
	case "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions":
		return path
	case "/", "/chat.css", "/chat.js":
		return "/"
	}
	if strings.HasPrefix(path, "/v1/models/") {
		return "/v1/models/{id}"
	}
	return "other"
}

// allow answers 405 unless r's method is one of methods.
func allow(w http.ResponseWriter, r *http.Request, code *int, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	*code = http.StatusMethodNotAllowed
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, &apiError{Status: *code, Type: "invalid_request_error", Code: "method_not_allowed", Message: fmt.Sprintf("%s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(methods, " or "))})
	return false
}

// authorized reports whether r carries the API key as a bearer token. The
// scheme is matched without regard to case because RFC 7235 makes auth
// schemes case-insensitive, and some clients send "bearer".
func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") &&
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(s.cfg.APIKey)) == 1
}

func (s *Server) modelObject() map[string]any {
	return map[string]any{"id": s.modelID, "object": "model", "created": s.created, "owned_by": "sluice",
		"context_length": s.e.Ctx}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]any{"error": e})
}

// readBody reads a request body of at most the configured size.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	tooBig := &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("the request body exceeds the limit of %d bytes", s.maxBody)}
	if r.ContentLength > s.maxBody {
		return nil, tooBig
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooBig
		}
		return nil, invalid("", "invalid_body", "reading the request body: %v", err)
	}
	return body, nil
}

// handleChat serves POST /v1/chat/completions and returns the status.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) int {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	var req chatRequest
	if aerr = decodeJSON(body, &req); aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	g, msgs, aerr := req.validate()
	if aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	prompt, marks, aerr := s.chatPrompt(msgs)
	if aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	return s.generate(w, r, true, prompt, marks, g)
}

// chatPrompt renders msgs with the chat template and tokenizes them; marks
// are the token counts at the end of the leading system messages and at
// the end of all but the last message, where a snapshot serves later
// requests sharing the system prompt or the conversation so far.
func (s *Server) chatPrompt(msgs []chatMessage) ([]int, []int, *apiError) {
	tok := s.e.Tok
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.role, Content: m.content}
	}
	text, err := tok.ApplyChatTemplate(tm, true)
	if err != nil {
		return nil, nil, invalid("messages", "invalid_value", "applying the chat template: %v", err)
	}
	ids := tok.Encode(text)
	var marks []int
	nsys := 0
	for nsys < len(tm) && tm[nsys].Role == "system" {
		nsys++
	}
	for _, k := range []int{nsys, len(tm) - 1} {
		if k <= 0 || k >= len(tm) || (len(marks) > 0 && k == nsys && k == len(tm)-1) {
			continue
		}
		pre, err := tok.ApplyChatTemplate(tm[:k], false)
		if err != nil || !strings.HasPrefix(text, pre) {
			continue
		}
		// BPE may merge across the boundary; only an exact token prefix
		// is a usable snapshot point.
		if p := tok.Encode(pre); len(p) < len(ids) && equalInts(p, ids[:len(p)]) {
			if len(marks) == 0 || len(p) > marks[len(marks)-1] {
				marks = append(marks, len(p))
			}
		}
	}
	return ids, marks, nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// handleCompletion serves POST /v1/completions and returns the status.
func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) int {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	var req completionRequest
	if aerr = decodeJSON(body, &req); aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	g, text, ids, aerr := req.validate()
	if aerr != nil {
		writeError(w, aerr)
		return aerr.Status
	}
	if ids == nil {
		if ids = s.e.Tok.Encode(text); len(ids) == 0 {
			aerr = invalid("prompt", "invalid_value", "the prompt tokenizes to nothing")
			writeError(w, aerr)
			return aerr.Status
		}
	} else {
		V := s.e.Model.Config.Vocab
		for i, t := range ids {
			if t < 0 || t >= V {
				aerr = invalid("prompt", "invalid_value", "prompt token %d (at %d) is outside the vocabulary [0, %d)", t, i, V)
				writeError(w, aerr)
				return aerr.Status
			}
		}
	}
	return s.generate(w, r, false, ids, nil, g)
}

// usage is OpenAI's token accounting; cached_tokens counts the prompt
// tokens resumed from the prefix cache.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(r result) *usage {
	u := &usage{PromptTokens: r.promptTokens, CompletionTokens: r.genTokens, TotalTokens: r.promptTokens + r.genTokens}
	u.PromptTokensDetails.CachedTokens = r.cachedTokens
	return u
}

// generate runs one validated request through the scheduler and writes
// the response, whole or as server-sent events; it returns the status.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool, prompt []int, marks []int, g genParams) int {
	t0 := time.Now()
	if len(prompt) > s.e.Ctx {
		aerr := invalid("messages", "context_length_exceeded", "the prompt is %d tokens; the context holds %d", len(prompt), s.e.Ctx)
		if !chat {
			aerr.Param = "prompt"
		}
		writeError(w, aerr)
		return aerr.Status
	}
	seed := uint64(0)
	if g.seed != nil {
		seed = uint64(*g.seed)
	} else if g.temperature > 0 {
		seed = randomSeed()
	}
	sp := sample.Params{Temperature: g.temperature, TopK: g.topK, TopP: g.topP, MinP: g.minP,
		RepetitionPenalty: g.repetition, PresencePenalty: g.presence, FrequencyPenalty: g.frequency, Seed: seed}
	if err := sp.Validate(); err != nil {
		aerr := invalid("", "invalid_value", "%v", err)
		writeError(w, aerr)
		return aerr.Status
	}
	maxTokens := g.maxTokens
	if maxTokens <= 0 || maxTokens > s.e.Ctx {
		maxTokens = s.e.Ctx // the sequence stops at the context's end anyway
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stopAbort := context.AfterFunc(s.base, cancel)
	defer stopAbort()

	j := newJob(ctx, prompt, engine.GenOptions{MaxTokens: maxTokens, Sample: sp, IgnoreEOS: g.ignoreEOS, Drafts: s.cfg.Drafts}, g.stops)
	j.marks = marks
	j.live = g.stream && g.sluiceStats
	// Penalties look at the whole history, which a resumed sequence would
	// lack, so such requests compute their prompt in full.
	j.reuse = (g.repetition == 0 || g.repetition == 1) && g.presence == 0 && g.frequency == 0
	if err := s.sched.submit(j); err != nil {
		if errors.Is(err, errBusy) {
			s.met.rejected.Add(1)
			w.Header().Set("Retry-After", "1")
			aerr := &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
				Message: fmt.Sprintf("the server is busy: %d requests running and %d waiting; retry later", s.sched.slots, s.sched.maxQueue)}
			writeError(w, aerr)
			return aerr.Status
		}
		aerr := &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: err.Error()}
		writeError(w, aerr)
		return aerr.Status
	}
	s.met.promptTokens.Add(int64(len(prompt)))
	defer func() { s.met.latency.observe(time.Since(t0).Seconds()) }()
	id := newID(chat)
	if g.stream {
		return s.stream(w, j, chat, id, g)
	}
	var text strings.Builder
	for {
		<-j.notify
		t, fin, res, _ := j.take()
		text.WriteString(t)
		if !fin {
			continue
		}
		if res.err != nil {
			aerr := s.jobError(res.err)
			writeError(w, aerr)
			return aerr.Status
		}
		var choice map[string]any
		obj := "text_completion"
		if chat {
			obj = "chat.completion"
			choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text.String()}, "finish_reason": res.finish, "logprobs": nil}
		} else {
			choice = map[string]any{"index": 0, "text": text.String(), "finish_reason": res.finish, "logprobs": nil}
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": obj, "created": time.Now().Unix(), "model": s.modelID,
			"choices": []any{choice}, "usage": usageOf(res), "system_fingerprint": "sluice", "sluice": res.stats})
		return http.StatusOK
	}
}

// jobError maps how a job failed to an API error.
func (s *Server) jobError(err error) *apiError {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "cancelled", Message: "the request was cancelled (the server is shutting down or the client went away)"}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "generation_failed", Message: err.Error()}
}

// stream writes j's output as server-sent events: a first chunk with the
// role, one chunk per batch of new text, a last chunk with the finish
// reason and the reply's figures (the "sluice" extension; with
// sluice_stats every text chunk carries them so far), the usage when asked
// for, and "data: [DONE]".
func (s *Server) stream(w http.ResponseWriter, j *job, chat bool, id string, g genParams) int {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	created := time.Now().Unix()
	obj := "text_completion"
	if chat {
		obj = "chat.completion.chunk"
	}
	var buf []byte
	send := func(v any) error {
		buf = append(buf[:0], "data: "...)
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		buf = append(append(buf, b...), "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return err
		}
		return rc.Flush()
	}
	chunk := func(text string, finish any) map[string]any {
		var choice map[string]any
		if chat {
			delta := map[string]any{}
			if text != "" {
				delta["content"] = text
			}
			choice = map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}
		} else {
			choice = map[string]any{"index": 0, "text": text, "finish_reason": finish, "logprobs": nil}
		}
		return map[string]any{"id": id, "object": obj, "created": created, "model": s.modelID, "choices": []any{choice}, "system_fingerprint": "sluice"}
	}
	if chat {
		first := chunk("", nil)
		first["choices"].([]any)[0].(map[string]any)["delta"] = map[string]any{"role": "assistant", "content": ""}
		if send(first) != nil {
			return http.StatusOK // the client is gone; the job's context ends it
		}
	}
	for {
		<-j.notify
		text, fin, res, st := j.take()
		if text != "" {
			c := chunk(text, nil)
			if g.sluiceStats {
				c["sluice"] = st
			}
			if send(c) != nil {
				return http.StatusOK
			}
		}
		if !fin {
			continue
		}
		if res.err != nil {
			send(map[string]any{"error": s.jobError(res.err)})
		} else {
			last := chunk("", res.finish)
			last["sluice"] = res.stats
			send(last)
			if g.includeUsage {
				send(map[string]any{"id": id, "object": obj, "created": created, "model": s.modelID, "choices": []any{}, "usage": usageOf(res)})
			}
		}
		w.Write([]byte("data: [DONE]\n\n"))
		rc.Flush()
		return http.StatusOK
	}
}

func newID(chat bool) string {
	var b [12]byte
	crand.Read(b[:])
	if chat {
		return "chatcmpl-" + hex.EncodeToString(b[:])
	}
	return "cmpl-" + hex.EncodeToString(b[:])
}

func randomSeed() uint64 {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano())
	}
	return binary.LittleEndian.Uint64(b[:])
}
