package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/sluicelm/sluice/internal/sample"
)

// apiError is an error in OpenAI's shape, with the HTTP status it is sent
// with: {"error": {"message", "type", "code"}}.
type apiError struct {
	Status  int    `json:"-"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
	Param   any    `json:"param"` // the offending field, or null
}

func (e *apiError) Error() string { return e.Message }

// invalid is a 400 invalid_request_error naming the offending field.
func invalid(param, code, format string, args ...any) *apiError {
	e := &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = param
	}
	return e
}

// content is a chat message's content: a string, or an array of parts of
// which only {"type": "text", "text": ...} is supported.
type content struct {
	text string
	set  bool // present and not null
}

// UnmarshalJSON accepts a string, null or an array of text parts.
func (c *content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*c = content{}
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		c.set = true
		return json.Unmarshal(b, &c.text)
	}
	var parts []struct {
		Type *string `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("content must be a string or an array of text parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == nil || *p.Type != "text" || p.Text == nil {
			return errors.New("only content parts of type \"text\" with a \"text\" string are supported")
		}
		sb.WriteString(*p.Text)
	}
	c.text, c.set = sb.String(), true
	return nil
}

// stopList is the stop parameter: a string, an array of strings, or null.
type stopList []string

// UnmarshalJSON accepts a string, null or an array of strings.
func (s *stopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop must be a string or an array of strings")
	}
	*s = many
	return nil
}

// promptInput is the completions prompt: a string, an array of one string,
// or an array of token ids.
type promptInput struct {
	text string
	ids  []int
	set  bool
}

// UnmarshalJSON accepts a string, [string] or [int, ...].
func (p *promptInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*p = promptInput{}
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		p.set = true
		return json.Unmarshal(b, &p.text)
	}
	var strs []string
	if err := json.Unmarshal(b, &strs); err == nil {
		if len(strs) != 1 {
			return fmt.Errorf("prompt: an array of %d strings is not supported (send one prompt per request)", len(strs))
		}
		p.text, p.set = strs[0], true
		return nil
	}
	var ids []int
	if err := json.Unmarshal(b, &ids); err == nil {
		p.ids, p.set = ids, true
		if ids == nil {
			p.ids = []int{}
		}
		return nil
	}
	return errors.New("prompt must be a string, an array of one string, or an array of token ids")
}

// message is one chat turn as a client sends it.
type message struct {
	Role    *string `json:"role"`
	Content content `json:"content"`
	Name    *string `json:"name"`
}

// streamOptions is stream_options.
type streamOptions struct {
	IncludeUsage *bool `json:"include_usage"`
}

// sampling holds the fields common to both generation endpoints. Pointers
// tell an absent or null field from a zero value; unknown fields are
// ignored, as OpenAI's clients send fields a server may not know.
type sampling struct {
	Model               *string          `json:"model"`
	MaxTokens           *int             `json:"max_tokens"`
	MaxCompletionTokens *int             `json:"max_completion_tokens"`
	Temperature         *float64         `json:"temperature"`
	TopP                *float64         `json:"top_p"`
	N                   *int             `json:"n"`
	Stream              *bool            `json:"stream"`
	StreamOptions       *streamOptions   `json:"stream_options"`
	Stop                stopList         `json:"stop"`
	Seed                *int64           `json:"seed"`
	PresencePenalty     *float64         `json:"presence_penalty"`
	FrequencyPenalty    *float64         `json:"frequency_penalty"`
	Logprobs            *json.RawMessage `json:"logprobs"`
	User                *string          `json:"user"`
	// Refused unless they ask for plain text: sluice cannot constrain its
	// output, and a client that asked for JSON would get free text.
	ResponseFormat *json.RawMessage `json:"response_format"`

	// Extensions of vLLM and llama.cpp.
	TopK              *int     `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	IgnoreEOS         *bool    `json:"ignore_eos"`

	// sluice's own: every streamed text chunk carries the reply's figures
	// so far in a "sluice" field (the last chunk always does).
	SluiceStats *bool `json:"sluice_stats"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	sampling
	Messages *[]message `json:"messages"`
	// Tool calling is not supported: both are refused unless they leave
	// the model no tool to call.
	Tools      *json.RawMessage `json:"tools"`
	ToolChoice *json.RawMessage `json:"tool_choice"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	sampling
	Prompt promptInput `json:"prompt"`
	Echo   *bool       `json:"echo"`
	Suffix *string     `json:"suffix"`
	BestOf *int        `json:"best_of"`
}

// Limits on request fields beyond which a request is refused.
const (
	maxStops      = 16
	maxStopLen    = 256
	maxMessages   = 4096
	maxPenaltyAbs = 2
)

// decodeJSON unmarshals body into v and turns the decoder's errors into
// 400s that name the field and the expected type.
func decodeJSON(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return invalid("", "invalid_json", "the request body is empty; send a JSON object")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return invalid("", "invalid_json", "the request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return invalid("", "invalid_json", "the request body must be a JSON object, not a JSON %s", typ.Value)
		}
		// The decoder names a field inside the embedded sampling struct
		// "sampling.max_tokens"; the client knows it as max_tokens.
		field := strings.TrimPrefix(typ.Field, "sampling.")
		return invalid(field, "invalid_type", "invalid type for '%s': expected %s, got a JSON %s", field, jsonTypeName(typ.Type.String()), typ.Value)
	}
	// Errors from the custom unmarshalers and anything else the decoder says.
	return invalid("", "invalid_value", "invalid request: %v", err)
}

// jsonTypeName names a Go type as a JSON type for error messages.
func jsonTypeName(goType string) string {
	switch strings.TrimLeft(goType, "*") {
	case "int", "int64":
		return "an integer"
	case "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "string":
		return "a string"
	}
	if strings.HasPrefix(strings.TrimLeft(goType, "*"), "[]") {
		return "an array"
	}
	return "an object"
}

// genParams is a validated generation request, endpoint-independent.
type genParams struct {
	maxTokens    int // 0 = up to the context
	temperature  float64
	topP         float64
	topK         int
	minP         float64
	repetition   float64
	presence     float64
	frequency    float64
	seed         *int64
	stream       bool
	includeUsage bool
	stops        []string
	ignoreEOS    bool
	sluiceStats  bool
}

// validate checks the common fields and returns them with OpenAI's
// defaults (temperature 1, top_p 1).
func (s *sampling) validate() (genParams, *apiError) {
	g := genParams{temperature: 1, topP: 1}
	if s.N != nil && *s.N != 1 {
		return g, invalid("n", "unsupported_value", "n=%d is not supported: only one choice per request (n=1)", *s.N)
	}
	if s.Logprobs != nil {
		raw := bytes.TrimSpace(*s.Logprobs)
		if !bytes.Equal(raw, []byte("null")) && !bytes.Equal(raw, []byte("false")) && !bytes.Equal(raw, []byte("0")) {
			return g, invalid("logprobs", "unsupported_value", "logprobs are not supported")
		}
	}
	if s.ResponseFormat != nil && !isNull(*s.ResponseFormat) {
		var f struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(*s.ResponseFormat, &f); err != nil || f.Type == "" {
			return g, invalid("response_format", "invalid_value", "response_format must be an object with a \"type\"")
		}
		if f.Type != "text" {
			return g, invalid("response_format", "unsupported_value", "response_format %q is not supported: sluice cannot constrain its output (only \"text\")", f.Type)
		}
	}
	mt := s.MaxTokens
	name := "max_tokens"
	if s.MaxCompletionTokens != nil {
		mt, name = s.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < 1 {
			return g, invalid(name, "invalid_value", "%s must be at least 1, got %d", name, *mt)
		}
		g.maxTokens = *mt
	}
	if s.Temperature != nil {
		t := *s.Temperature
		if math.IsNaN(t) || t < 0 || t > 2 {
			return g, invalid("temperature", "invalid_value", "temperature must be between 0 and 2, got %v", t)
		}
		g.temperature = t
	}
	if s.TopP != nil {
		p := *s.TopP
		if math.IsNaN(p) || p < 0 || p > 1 {
			return g, invalid("top_p", "invalid_value", "top_p must be between 0 and 1, got %v", p)
		}
		g.topP = p
	}
	if s.TopK != nil {
		if *s.TopK < 0 {
			return g, invalid("top_k", "invalid_value", "top_k must be >= 0, got %d", *s.TopK)
		}
		g.topK = *s.TopK
	}
	if s.MinP != nil {
		p := *s.MinP
		if math.IsNaN(p) || p < 0 || p > 1 {
			return g, invalid("min_p", "invalid_value", "min_p must be between 0 and 1, got %v", p)
		}
		g.minP = p
	}
	if s.RepetitionPenalty != nil {
		r := *s.RepetitionPenalty
		if err := sample.CheckRepetitionPenalty(r); err != nil {
			return g, invalid("repetition_penalty", "invalid_value", "%v", err)
		}
		g.repetition = r
	}
	for _, f := range []struct {
		name string
		v    *float64
		dst  *float64
	}{{"presence_penalty", s.PresencePenalty, &g.presence}, {"frequency_penalty", s.FrequencyPenalty, &g.frequency}} {
		if f.v == nil {
			continue
		}
		if math.IsNaN(*f.v) || math.Abs(*f.v) > maxPenaltyAbs {
			return g, invalid(f.name, "invalid_value", "%s must be between -2 and 2, got %v", f.name, *f.v)
		}
		*f.dst = *f.v
	}
	if s.Stream != nil {
		g.stream = *s.Stream
	}
	if s.StreamOptions != nil && s.StreamOptions.IncludeUsage != nil {
		g.includeUsage = *s.StreamOptions.IncludeUsage
	}
	if s.IgnoreEOS != nil {
		g.ignoreEOS = *s.IgnoreEOS
	}
	if s.SluiceStats != nil {
		g.sluiceStats = *s.SluiceStats
	}
	if len(s.Stop) > maxStops {
		return g, invalid("stop", "invalid_value", "at most %d stop sequences are supported, got %d", maxStops, len(s.Stop))
	}
	for _, st := range s.Stop {
		if len(st) > maxStopLen {
			return g, invalid("stop", "invalid_value", "a stop sequence is %d bytes; at most %d are supported", len(st), maxStopLen)
		}
		if st != "" {
			g.stops = append(g.stops, st)
		}
	}
	g.seed = s.Seed
	return g, nil
}

// isNull reports whether a raw JSON value is null.
func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// validateTools refuses what would need tool calls: tool_choice
// "required" or naming a function, and tools that tool_choice does not
// rule out with "none". tool_choice "auto" without tools asks for nothing.
func (r *chatRequest) validateTools() *apiError {
	choice := "auto"
	if r.ToolChoice != nil && !isNull(*r.ToolChoice) {
		if err := json.Unmarshal(*r.ToolChoice, &choice); err != nil || (choice != "none" && choice != "auto") {
			return invalid("tool_choice", "unsupported_value", "tool_choice %s is not supported: sluice does not call tools (only \"none\")", bytes.TrimSpace(*r.ToolChoice))
		}
	}
	if r.Tools != nil && !isNull(*r.Tools) {
		var tools []json.RawMessage
		if err := json.Unmarshal(*r.Tools, &tools); err != nil {
			return invalid("tools", "invalid_type", "invalid type for 'tools': expected an array")
		}
		if len(tools) > 0 && choice != "none" {
			return invalid("tools", "unsupported_value", "tools are not supported: sluice does not call tools")
		}
	}
	return nil
}

// chatMessage is a validated chat turn.
type chatMessage struct {
	role, content string
}

// validate checks the messages of a chat request.
func (r *chatRequest) validate() (genParams, []chatMessage, *apiError) {
	g, err := r.sampling.validate()
	if err != nil {
		return g, nil, err
	}
	if err := r.validateTools(); err != nil {
		return g, nil, err
	}
	if r.Messages == nil {
		return g, nil, invalid("messages", "missing_required_parameter", "missing required parameter: 'messages'")
	}
	msgs := *r.Messages
	if len(msgs) == 0 {
		return g, nil, invalid("messages", "invalid_value", "'messages' must hold at least one message")
	}
	if len(msgs) > maxMessages {
		return g, nil, invalid("messages", "invalid_value", "'messages' holds %d messages; at most %d are supported", len(msgs), maxMessages)
	}
	out := make([]chatMessage, len(msgs))
	for i, m := range msgs {
		if m.Role == nil {
			return g, nil, invalid(fmt.Sprintf("messages[%d].role", i), "missing_required_parameter", "messages[%d]: missing required parameter 'role'", i)
		}
		role := *m.Role
		switch role {
		case "system", "user", "assistant":
		case "developer":
			role = "system" // OpenAI's newer name for the system role
		default:
			return g, nil, invalid(fmt.Sprintf("messages[%d].role", i), "invalid_value", "messages[%d]: role %q is not supported (system, developer, user or assistant)", i, role)
		}
		if !m.Content.set && role != "assistant" {
			return g, nil, invalid(fmt.Sprintf("messages[%d].content", i), "missing_required_parameter", "messages[%d]: missing required parameter 'content'", i)
		}
		out[i] = chatMessage{role: role, content: m.Content.text}
	}
	return g, out, nil
}

// validate checks a completions request; ids is the prompt when given as
// token ids, else nil and text holds it.
func (r *completionRequest) validate() (g genParams, text string, ids []int, err *apiError) {
	if g, err = r.sampling.validate(); err != nil {
		return g, "", nil, err
	}
	if !r.Prompt.set {
		return g, "", nil, invalid("prompt", "missing_required_parameter", "missing required parameter: 'prompt'")
	}
	if r.Echo != nil && *r.Echo {
		return g, "", nil, invalid("echo", "unsupported_value", "echo is not supported")
	}
	if r.Suffix != nil && *r.Suffix != "" {
		return g, "", nil, invalid("suffix", "unsupported_value", "suffix is not supported")
	}
	if r.BestOf != nil && *r.BestOf < 1 {
		return g, "", nil, invalid("best_of", "invalid_value", "best_of must be at least 1, got %d", *r.BestOf)
	}
	if r.BestOf != nil && *r.BestOf > 1 {
		return g, "", nil, invalid("best_of", "unsupported_value", "best_of=%d is not supported: only one candidate per request (best_of=1)", *r.BestOf)
	}
	if r.MaxTokens == nil && r.MaxCompletionTokens == nil {
		g.maxTokens = 16 // OpenAI's default for completions
	}
	if r.Prompt.ids != nil {
		if len(r.Prompt.ids) == 0 {
			return g, "", nil, invalid("prompt", "invalid_value", "the prompt is empty")
		}
		return g, "", r.Prompt.ids, nil
	}
	if r.Prompt.text == "" {
		return g, "", nil, invalid("prompt", "invalid_value", "the prompt is empty")
	}
	return g, r.Prompt.text, nil, nil
}
