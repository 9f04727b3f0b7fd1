package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// chatCases is testdata/chat/cases.json: the templates and conversations
// testdata/chat/render.py rendered with Python's jinja2 into the golden
// files beside it.
type chatCases struct {
	Now       string `json:"now"`
	Templates map[string]struct {
		File          string         `json:"file"`
		SpecialTokens map[string]any `json:"special_tokens"`
	} `json:"templates"`
	Conversations []struct {
		Name                string         `json:"name"`
		AddGenerationPrompt bool           `json:"add_generation_prompt"`
		Kwargs              map[string]any `json:"kwargs"`
		Messages            []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	} `json:"conversations"`
}

// TestChatTemplatesMatchJinja2 renders the released chat templates of
// DeepSeek-V3 and V3.1, gpt-oss (harmony) and Kimi K2, and the tiny test
// models' own, on every conversation of cases.json, and requires exactly
// the strings jinja2 rendered.
func TestChatTemplatesMatchJinja2(t *testing.T) {
	b, err := os.ReadFile("testdata/chat/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs chatCases
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	now, err := time.Parse("2006-01-02T15:04:05", cs.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer func(f func() time.Time) { timeNow = f }(timeNow)
	timeNow = func() time.Time { return now }
	names := make([]string, 0, len(cs.Templates))
	for n := range cs.Templates {
		names = append(names, n)
	}
	sort.Strings(names)
	compared := 0
	for _, name := range names {
		spec := cs.Templates[name]
		src, err := os.ReadFile(filepath.Join("testdata/templates", spec.File))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs.Conversations {
			t.Run(name+"/"+c.Name, func(t *testing.T) {
				tok := &Tokenizer{extraVars: map[string]any{}}
				for k, v := range spec.SpecialTokens {
					tok.extraVars[k] = v
				}
				for k, v := range c.Kwargs {
					tok.extraVars[k] = v
				}
				tok.setTemplate(string(src))
				if tok.TemplateIsFallback() {
					_, err := parseTemplate(string(src))
					t.Fatalf("template not supported (parse: %v)", err)
				}
				msgs := make([]Message, len(c.Messages))
				for i, m := range c.Messages {
					msgs[i] = Message{m.Role, m.Content}
				}
				got, err := tok.ApplyChatTemplate(msgs, c.AddGenerationPrompt)
				if err != nil {
					t.Fatal(err)
				}
				golden := filepath.Join("testdata/chat", name+"."+c.Name)
				if _, err := os.Stat(golden + ".error"); err == nil {
					// jinja2 refused the conversation: sluice falls back,
					// and says so.
					if !tok.TemplateIsFallback() {
						t.Errorf("jinja2 raised, sluice rendered %q", got)
					}
					return
				}
				want, err := os.ReadFile(golden + ".txt")
				if err != nil {
					t.Fatal(err)
				}
				if tok.TemplateIsFallback() {
					direct, err := tok.template.render(tok.templateVars(msgs, c.AddGenerationPrompt))
					t.Fatalf("fell back to ChatML (render error: %v, %q)", err, direct)
				}
				if got != string(want) {
					i := 0
					for i < len(got) && i < len(want) && got[i] == want[i] {
						i++
					}
					t.Errorf("differs from jinja2 at byte %d:\n got %q\nwant %q", i, got, string(want))
				}
				compared++
			})
		}
	}
	if compared < 30 {
		t.Errorf("compared %d renders", compared)
	}
}

// TestTinyModelTemplatesFixtures: the fixtures of the tiny models'
// templates are the models' current ones.
func TestTinyModelTemplatesFixtures(t *testing.T) {
	for _, m := range []string{"tiny-gpt-oss", "tiny-deepseek-v32"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "models", m, "tokenizer_config.json"))
		if err != nil {
			t.Skipf("shared models not present: %v", err)
		}
		var cfg struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		fix, err := os.ReadFile(filepath.Join("testdata/templates", m+".jinja"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(cfg.ChatTemplate) != strings.TrimSpace(string(fix)) {
			t.Errorf("%s: testdata/templates/%s.jinja is not the model's chat_template", m, m)
		}
	}
}

// TestJinjaSnippetsMatchJinja2 renders the feature snippets of
// testdata/chat/snippets.json and requires jinja2's strings.
func TestJinjaSnippetsMatchJinja2(t *testing.T) {
	b, err := os.ReadFile("testdata/chat/snippets.json")
	if err != nil {
		t.Fatal(err)
	}
	var snips []struct {
		Name     string          `json:"name"`
		Template string          `json:"template"`
		Vars     json.RawMessage `json:"vars"`
	}
	if err := json.Unmarshal(b, &snips); err != nil {
		t.Fatal(err)
	}
	defer func(f func() time.Time) { timeNow = f }(timeNow)
	timeNow = func() time.Time { return time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC) }
	for _, sn := range snips {
		t.Run(sn.Name, func(t *testing.T) {
			d := json.NewDecoder(strings.NewReader(string(sn.Vars)))
			d.UseNumber()
			var vars map[string]any
			if err := d.Decode(&vars); err != nil {
				t.Fatal(err)
			}
			tmpl, err := parseTemplate(sn.Template)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.render(intNumbers(vars).(map[string]any))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join("testdata/chat", "snippet."+sn.Name+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("got  %q\nwant %q", got, string(want))
			}
		})
	}
}

// intNumbers turns the json.Numbers of decoded JSON into ints.
func intNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		i, err := x.Int64()
		if err != nil {
			panic(err)
		}
		return int(i)
	case []any:
		for i := range x {
			x[i] = intNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = intNumbers(x[k])
		}
	}
	return v
}
