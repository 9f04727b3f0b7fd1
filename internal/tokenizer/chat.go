package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Message is one chat turn.
type Message struct {
	Role    string
	Content string
}

// tokenizerConfig holds the fields of tokenizer_config.json that we use.
// Token fields may be a plain string, null, or an AddedToken object.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	PadToken     json.RawMessage `json:"pad_token"`
	UnkToken     json.RawMessage `json:"unk_token"`
}

// tokenString extracts a special token's text from its config form.
func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("special token %s is neither a string nor an object with content", string(raw))
	}
	return obj.Content, nil
}

// loadConfig reads the optional tokenizer_config.json and chat template.
// A missing config is fine (ChatML fallback); a malformed one is an error
// because silently ignoring it would also lose the eos token.
func (t *Tokenizer) loadConfig(dir string) error {
	t.extraVars = map[string]any{}
	var templateSrc string
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		var cfg tokenizerConfig
		if err := json.Unmarshal(data, &cfg); err != nil {
			return fmt.Errorf("parsing %s: %w", path, err)
		}
		for name, raw := range map[string]json.RawMessage{
			"bos_token": cfg.BOSToken, "eos_token": cfg.EOSToken,
			"pad_token": cfg.PadToken, "unk_token": cfg.UnkToken,
		} {
			s, err := tokenString(raw)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", path, name, err)
			}
			if s != "" {
				t.extraVars[name] = s
			}
		}
		t.bosToken, _ = t.extraVars["bos_token"].(string)
		t.eosToken, _ = t.extraVars["eos_token"].(string)
		templateSrc = pickTemplate(cfg.ChatTemplate)
	}
	// Newer checkpoints ship the template as its own file, which
	// transformers prefers over the config entry.
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		templateSrc = string(b)
	}
	t.setTemplate(templateSrc)
	return nil
}

// pickTemplate returns the template text from chat_template, which is
// either a string or a list of {name, template} (the "default" one wins).
func pickTemplate(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return ""
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template
		}
	}
	return ""
}

// setTemplate parses src and test-renders it on a typical conversation so
// that unsupported features are detected at load time, not mid-request.
func (t *Tokenizer) setTemplate(src string) {
	t.template = nil
	t.fallBack("no chat template")
	if strings.TrimSpace(src) == "" {
		return
	}
	tmpl, err := parseTemplate(src)
	if err != nil {
		t.fallBack(err.Error())
		return
	}
	probe := []Message{{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "u"}}
	if _, err := tmpl.render(t.templateVars(probe, true)); err != nil {
		t.fallBack(err.Error())
		return
	}
	t.template = tmpl
	t.templateFallback.Store(false)
}

func (t *Tokenizer) templateVars(msgs []Message, addGenerationPrompt bool) map[string]any {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	vars := map[string]any{"messages": list, "add_generation_prompt": addGenerationPrompt}
	for k, v := range t.extraVars {
		vars[k] = v
	}
	return vars
}

// ApplyChatTemplate renders msgs with the model's chat template, appending
// the assistant prompt when addGenerationPrompt is set. If the template is
// absent, uses unsupported features, or fails on these messages, ChatML is
// used instead and TemplateIsFallback reports true from then on; a message
// without a role is the only error.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("tokenizer: chat message %d has an empty role", i)
		}
	}
	if tmpl := t.template; tmpl != nil && !t.templateFallback.Load() {
		out, err := tmpl.render(t.templateVars(msgs, addGenerationPrompt))
		if err == nil {
			return out, nil
		}
		// The probe render passed but these messages hit an unsupported
		// path; stay on ChatML so a conversation is not rendered two ways.
		t.fallBack(err.Error())
	}
	return chatML(msgs, addGenerationPrompt), nil
}

// TemplateIsFallback reports whether ApplyChatTemplate uses the built-in
// ChatML format because the model's template was absent or could not be
// rendered by the Jinja subset.
func (t *Tokenizer) TemplateIsFallback() bool { return t.templateFallback.Load() }

// TemplateFallbackReason says why ApplyChatTemplate uses ChatML: no
// template, or the template feature or render error that made sluice's
// Jinja subset give up. It is "" while the model's template is used.
func (t *Tokenizer) TemplateFallbackReason() string {
	if !t.templateFallback.Load() {
		return ""
	}
	if w := t.templateWhy.Load(); w != nil {
		return *w
	}
	return "no chat template"
}

func (t *Tokenizer) fallBack(why string) {
	t.templateWhy.Store(&why)
	t.templateFallback.Store(true)
}

// chatML is the Qwen chat format, used when the real template is unusable.
func chatML(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}
