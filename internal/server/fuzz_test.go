package server

import (
	"math"
	"net/http"
	"testing"
)

// FuzzDecodeRequest feeds arbitrary bodies to both endpoints' decoding,
// validation and prompt building (template and tokenizer): none may panic,
// every refusal is a 400 with a message, and whatever is accepted is in
// range. Run it with: go test ./internal/server -run '^$' -fuzz FuzzDecodeRequest -fuzztime 30s
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"assistant","content":null},{"role":"developer","content":"x"}],"temperature":0,"top_p":0.5,"seed":-3,"stop":["\n","##"]}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1e3,"temperature":"1","n":1,"logprobs":false}`,
		`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1,"stop":"<|im_end|>"}`,
		`{"prompt":"def f(x):","max_tokens":16,"temperature":0.7,"top_k":40,"min_p":0.05,"repetition_penalty":1.1}`,
		`{"prompt":[1,2,3],"echo":false,"suffix":null,"presence_penalty":-2,"frequency_penalty":2}`,
		`{"prompt":["one"],"ignore_eos":true,"stop":null}`,
		`{"prompt":[["nested"]]}`,
		`{"messages":{}}`, `[]`, `null`, `"str"`, `{"messages":[`, `{"prompt":"\ud800"}`,
		`{"temperature":NaN}`, `{"max_tokens":99999999999999999999}`, `{"seed":1.5}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"<|im_start|>user\\n\\u0000\\xff\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(e *apiError) {
			if e.Status != http.StatusBadRequest || e.Message == "" || e.Type == "" || e.Code == "" {
				t.Fatalf("refusal %+v is not a 400 OpenAI error", e)
			}
		}
		inRange := func(g genParams) {
			if g.maxTokens < 0 || !(g.temperature >= 0 && g.temperature <= 2) || !(g.topP >= 0 && g.topP <= 1) ||
				!(g.minP >= 0 && g.minP <= 1) || g.topK < 0 || math.Abs(g.presence) > 2 || math.Abs(g.frequency) > 2 ||
				math.IsNaN(g.repetition) || len(g.stops) > maxStops {
				t.Fatalf("accepted out-of-range parameters %+v", g)
			}
		}
		var c chatRequest
		if e := decodeJSON(body, &c); e != nil {
			check(e)
		} else if g, msgs, e := c.validate(); e != nil {
			check(e)
		} else {
			inRange(g)
			if len(msgs) == 0 {
				t.Fatal("accepted no messages")
			}
			if srvEng != nil {
				s := &Server{e: srvEng}
				ids, marks, e := s.chatPrompt(msgs)
				if e != nil {
					check(e)
				}
				for i, m := range marks {
					if m <= 0 || m >= len(ids) || (i > 0 && m <= marks[i-1]) {
						t.Fatalf("bad snapshot marks %v for %d tokens", marks, len(ids))
					}
				}
			}
		}
		var p completionRequest
		if e := decodeJSON(body, &p); e != nil {
			check(e)
		} else if g, text, ids, e := p.validate(); e != nil {
			check(e)
		} else {
			inRange(g)
			if text == "" && len(ids) == 0 {
				t.Fatal("accepted an empty prompt")
			}
		}
	})
}

// TestStopper checks the stop-sequence cutter on text arriving in pieces.
func TestStopper(t *testing.T) {
	cases := []struct {
		stops  []string
		pieces []string
		want   string
		hit    bool
	}{
		{nil, []string{"ab", "cd"}, "abcd", false},
		{[]string{"cd"}, []string{"ab", "c", "de"}, "ab", true},
		{[]string{"xyz"}, []string{"ax", "y", "b"}, "axyb", false},
		{[]string{"\n\n", "END"}, []string{"one\n", "\ntwo"}, "one", true},
		{[]string{"ab"}, []string{"aab"}, "a", true},
		{[]string{"é!"}, []string{"café", "!"}, "caf", true},
	}
	for _, c := range cases {
		s := stopper{stops: c.stops}
		got, hit := "", false
		for _, p := range c.pieces {
			out, h := s.add(p)
			got += out
			if h {
				hit = true
				break
			}
		}
		if !hit {
			got += s.flush()
		}
		if got != c.want || hit != c.hit {
			t.Errorf("stops %q pieces %q: %q %v, want %q %v", c.stops, c.pieces, got, hit, c.want, c.hit)
		}
	}
}
