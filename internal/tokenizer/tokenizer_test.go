package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The shared test data lives next to the repository checkout.
const (
	modelsDir = "../../../shared/models"
	refsDir   = "../../../shared/refs"
)

var modelNames = []string{"tiny-qwen3-5-moe", "tiny-qwen3-moe"}

type refFile struct {
	Tokenizer []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"tokenizer"`
	Cases []struct {
		Prompt []int `json:"prompt"`
	} `json:"cases"`
	Long []struct {
		Prompt []int `json:"prompt"`
	} `json:"long"`
}

func loadModel(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	tok, err := Load(filepath.Join(modelsDir, name))
	if err != nil {
		tb.Fatalf("Load(%s): %v", name, err)
	}
	return tok
}

func loadRefs(tb testing.TB, name string) *refFile {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(refsDir, name+".json"))
	if err != nil {
		tb.Fatalf("reading refs: %v", err)
	}
	var r refFile
	if err := json.Unmarshal(data, &r); err != nil {
		tb.Fatalf("parsing refs %s: %v", name, err)
	}
	if len(r.Tokenizer) == 0 {
		tb.Fatalf("refs %s has no tokenizer entries", name)
	}
	return &r
}

func (r *refFile) prompts() [][]int {
	var out [][]int
	for _, c := range r.Cases {
		out = append(out, c.Prompt)
	}
	for _, c := range r.Long {
		out = append(out, c.Prompt)
	}
	return out
}

func streamDecode(tok *Tokenizer, ids []int) string {
	d := tok.NewStreamDecoder()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Add(id))
	}
	b.WriteString(d.Flush())
	return b.String()
}

func TestRefsEncodeDecode(t *testing.T) {
	for _, name := range modelNames {
		t.Run(name, func(t *testing.T) {
			tok := loadModel(t, name)
			refs := loadRefs(t, name)
			for i, e := range refs.Tokenizer {
				got := tok.Encode(e.Text)
				if !reflect.DeepEqual(got, e.IDs) {
					n := 0
					for n < len(got) && n < len(e.IDs) && got[n] == e.IDs[n] {
						n++
					}
					t.Errorf("entry %d: Encode differs at token %d (len got %d want %d)", i, n, len(got), len(e.IDs))
				}
				if dec := tok.Decode(e.IDs); dec != norm.NFC.String(e.Text) {
					t.Errorf("entry %d: Decode(ids) != text", i)
				}
			}
		})
	}
}

// Prompts in the refs are model inputs, not necessarily canonical BPE
// output, so Encode(Decode(p)) may differ from p. What must hold is that
// decoding is byte-exact and that re-encoding the text decodes back to it.
func TestPromptDecodeRoundTrip(t *testing.T) {
	for _, name := range modelNames {
		t.Run(name, func(t *testing.T) {
			tok := loadModel(t, name)
			refs := loadRefs(t, name)
			ps := refs.prompts()
			if len(ps) == 0 {
				t.Fatal("no prompts in refs")
			}
			for i, p := range ps {
				var raw []byte
				for _, id := range p {
					raw = tok.appendBytes(raw, id)
				}
				text := tok.Decode(p)
				if utf8.Valid(raw) && text != string(raw) {
					t.Errorf("prompt %d: Decode is not the concatenated token bytes", i)
				}
				if again := tok.Decode(tok.Encode(text)); again != norm.NFC.String(text) {
					t.Errorf("prompt %d: Decode(Encode(text)) != text", i)
				}
				if s := streamDecode(tok, p); s != text {
					t.Errorf("prompt %d: stream decode differs from Decode", i)
				}
			}
		})
	}
}

// extraCases were produced with @huggingface/tokenizers (tokenizers.js
// 0.2.0), which reproduces all 20 reference encodings above exactly; they
// cover multi-byte text, combining characters and edge whitespace that the
// Python-source refs lack.
var extraCases = []struct {
	text string
	ids  []int
}{
	{"日本語のテキスト 123 4567", []int{162, 245, 98, 162, 250, 105, 164, 103, 252, 159, 223, 106, 159, 225, 228, 159, 224, 255, 159, 224, 117, 159, 225, 230, 220, 16, 17, 18, 220, 19, 20, 21, 22}},
	{"emoji 🙂 ok", []int{68, 812, 73, 72, 220, 797, 247, 224, 305, 74}},
	{"héllo wörld", []int{71, 127, 102, 75, 309, 324, 127, 114, 81, 1891}},
	{"e\u0301", []int{127, 102}}, // NFC composes to é first
	{"a  b", []int{64, 220, 310}},
	{"x \n\n y", []int{87, 220, 292, 563}},
	{"   leading", []int{256, 914, 365, 307}},
	{"trailing   ", []int{1216, 3193, 258}},
	{"it's DON'T", []int{290, 1258, 581, 942, 6, 51}},
	{"123abc", []int{16, 17, 18, 1107, 66}},
	{"a\r\nb", []int{64, 201, 198, 65}},
	{"hello world!!!\n\n", []int{279, 75, 309, 324, 3975, 0, 0, 0, 292}},
	{"x\u3000\u3000y", []int{87, 159, 222, 222, 159, 222, 222, 88}},
	{"<|im_start|>user\nhi<|im_end|>\n", []int{4094, 84, 368, 198, 2621, 4095, 198}},
}

func TestExtraEncode(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	for _, c := range extraCases {
		if got := tok.Encode(c.text); !reflect.DeepEqual(got, c.ids) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.ids)
		}
		if got, want := tok.Decode(c.ids), norm.NFC.String(c.text); got != want {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, want)
		}
	}
}

func TestStreamDecoder(t *testing.T) {
	for _, name := range modelNames {
		t.Run(name, func(t *testing.T) {
			tok := loadModel(t, name)
			refs := loadRefs(t, name)
			var all [][]int
			for _, e := range refs.Tokenizer {
				all = append(all, e.IDs)
			}
			for _, c := range extraCases {
				all = append(all, c.ids)
			}
			for i, ids := range all {
				if got, want := streamDecode(tok, ids), tok.Decode(ids); got != want {
					t.Errorf("sequence %d: stream %q != Decode %q", i, got, want)
				}
			}
		})
	}
}

// byteIDs returns the ids of the single-byte tokens for raw bytes, so tests
// can build arbitrary (also invalid) byte streams.
func byteIDs(t *testing.T, tok *Tokenizer, raw []byte) []int {
	t.Helper()
	var ids []int
	for _, b := range raw {
		id, ok := tok.TokenID(string(byteToRune[b]))
		if !ok {
			t.Fatalf("no token for byte %#x", b)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestStreamDecoderHoldsBack(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	ids := byteIDs(t, tok, []byte("日"))
	d := tok.NewStreamDecoder()
	if s := d.Add(ids[0]); s != "" {
		t.Fatalf("first byte of 日 emitted %q", s)
	}
	if s := d.Add(ids[1]); s != "" {
		t.Fatalf("second byte of 日 emitted %q", s)
	}
	if s := d.Add(ids[2]); s != "日" {
		t.Fatalf("third byte gave %q, want 日", s)
	}
	// A truncated character at the end is replaced on Flush.
	d.Add(ids[0])
	if s := d.Flush(); s != "\uFFFD" {
		t.Fatalf("Flush of a dangling lead byte = %q", s)
	}
	if s := d.Flush(); s != "" {
		t.Fatalf("second Flush = %q, want empty", s)
	}
}

// Invalid UTF-8 must become U+FFFD per maximal subpart, as Python's
// bytes.decode(errors="replace") and Rust's from_utf8_lossy do.
func TestDecodeInvalidUTF8(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	cases := []struct {
		raw  []byte
		want string
	}{
		{[]byte{0xE6, 0x97, 'A'}, "\uFFFDA"},                         // truncated 3-byte: one replacement
		{[]byte{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"},             // surrogate: every byte replaced
		{[]byte{'x', 0x80, 0x80, 'y'}, "x\uFFFD\uFFFDy"},             // stray continuations
		{[]byte{0xF0, 0x9F, 0x99}, "\uFFFD"},                         // emoji cut short at the end
		{[]byte{0xC0, 0xAF}, "\uFFFD\uFFFD"},                         // overlong
		{[]byte{0xF0, 0x9F, 0x99, 0x82, 0xFF}, "🙂\uFFFD"},            // valid then invalid lead
		{[]byte{0xE6, 0x97, 0xE6, 0x97, 0xA5}, "\uFFFD日"},            // restart inside a broken sequence
		{[]byte{0xF4, 0x90, 0x80, 0x80}, "\uFFFD\uFFFD\uFFFD\uFFFD"}, // above U+10FFFF
	}
	for _, c := range cases {
		ids := byteIDs(t, tok, c.raw)
		if got := tok.Decode(ids); got != c.want {
			t.Errorf("Decode(% x) = %q, want %q", c.raw, got, c.want)
		}
		if got := streamDecode(tok, ids); got != c.want {
			t.Errorf("stream decode(% x) = %q, want %q", c.raw, got, c.want)
		}
	}
}

// Expected splits worked out by hand from the regex
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// with first-alternative-wins backtracking semantics.
func TestPreTokenizerSplits(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		// Two spaces before "b": \s+(?!\S) gives back one space, which
		// then joins "b" through the optional prefix of alternative 2.
		{"a  b", []string{"a", " ", " b"}},
		// \s*[\r\n]+ ends at the last newline of the whitespace run; the
		// remaining space prefixes "y".
		{"x \n\n y", []string{"x", " \n\n", " y"}},
		// Three leading spaces: two by \s+(?!\S), one attaches to the word.
		{"   leading", []string{"  ", " leading"}},
		// Whitespace at end of input: \s+(?!\S) takes it all.
		{"trailing   ", []string{"trailing", "   "}},
		// Contractions are case-insensitive; the apostrophe in "it's" is
		// not a letter so "it" stops before it.
		{"it's DON'T", []string{"it", "'s", " DON", "'T"}},
		// \p{N} is a single digit for Qwen2.
		{"123abc", []string{"1", "2", "3", "abc"}},
		// \r\n is whitespace ending in a newline: one piece via \s*[\r\n]+;
		// \r cannot be the optional prefix of alternative 2.
		{"a\r\nb", []string{"a", "\r\n", "b"}},
		// Newline then spaces before a word: the newline piece, then the
		// space run split as for "a  b".
		{"  \n  x", []string{"  \n", " ", " x"}},
		// Symbols take trailing newlines with them.
		{"hello world!!!\n\n", []string{"hello", " world", "!!!\n\n"}},
		// A tab is a valid prefix for a word.
		{"\t\tfoo", []string{"\t", "\tfoo"}},
		// Punctuation as the optional prefix; a space before a symbol
		// goes with the symbol; "'ll" only counts without a space.
		{"(hello) 'll 'LL 'Re", []string{"(hello", ")", " '", "ll", " '", "LL", " '", "Re"}},
		{"don'tx 'sup", []string{"don", "'t", "x", " '", "sup"}},
		{"'sup", []string{"'s", "up"}},
		// Upper-case contraction wins over the apostrophe-prefixed word.
		{"we'll WE'LLx 'VEry", []string{"we", "'ll", " WE", "'LL", "x", " '", "VEry"}},
		{"I'VEx", []string{"I", "'VE", "x"}},
		{"a \n", []string{"a", " \n"}},
		{" ", []string{" "}},
		{"", nil},
	}
	sp := splitter{maxDigits: 1}
	for _, c := range cases {
		if got := sp.split(c.in, nil); !reflect.DeepEqual(got, c.want) {
			t.Errorf("split(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := (splitter{maxDigits: 3}).split("12345", nil); !reflect.DeepEqual(got, []string{"123", "45"}) {
		t.Errorf("llama3 digits: %q", got)
	}
}

func TestTokenLookup(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	if got := tok.VocabSize(); got != 4096 {
		t.Errorf("VocabSize = %d, want 4096", got)
	}
	for id, s := range map[int]string{4093: "<|endoftext|>", 4094: "<|im_start|>", 4095: "<|im_end|>"} {
		if got, ok := tok.TokenID(s); !ok || got != id {
			t.Errorf("TokenID(%q) = %d, %v; want %d", s, got, ok, id)
		}
		if !tok.IsSpecial(id) {
			t.Errorf("IsSpecial(%d) = false", id)
		}
		if got := tok.Decode([]int{id}); got != s {
			t.Errorf("Decode(%d) = %q", id, got)
		}
	}
	for _, id := range []int{0, 220, -1, 4096, 1 << 40} {
		if tok.IsSpecial(id) {
			t.Errorf("IsSpecial(%d) = true", id)
		}
	}
	if id, ok := tok.TokenID("Ġ"); !ok || id != 220 {
		t.Errorf("TokenID(Ġ) = %d, %v", id, ok)
	}
	if _, ok := tok.TokenID("no such token"); ok {
		t.Error("TokenID found a missing token")
	}
	if id, ok := tok.EOSToken(); !ok || id != 4093 {
		t.Errorf("EOSToken = %d, %v", id, ok)
	}
	if _, ok := tok.BOSToken(); ok {
		t.Error("BOSToken found, config has bos_token null")
	}
	// Unknown ids are skipped rather than crashing.
	if got := tok.Decode([]int{-5, 64, 99999}); got != "a" {
		t.Errorf("Decode with unknown ids = %q", got)
	}
}

func TestEncodeOddInput(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	if got := tok.Encode(""); len(got) != 0 {
		t.Errorf("Encode(\"\") = %v", got)
	}
	// Invalid UTF-8 is encoded as U+FFFD, which decodes back as such.
	if got := tok.Decode(tok.Encode("a\xffb")); got != "a\uFFFDb" {
		t.Errorf("invalid UTF-8 round trip = %q", got)
	}
	// Adjacent and partial special tokens.
	ids := tok.Encode("<|im_end|><|im_end|><|im_")
	if len(ids) < 3 || ids[0] != 4095 || ids[1] != 4095 || tok.Decode(ids) != "<|im_end|><|im_end|><|im_" {
		t.Errorf("adjacent specials: %v", ids)
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := loadModel(t, modelNames[0])
	refs := loadRefs(t, modelNames[0])
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, e := range refs.Tokenizer {
				if !reflect.DeepEqual(tok.Encode(e.Text), e.IDs) {
					t.Error("concurrent Encode mismatch")
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestChatTemplate(t *testing.T) {
	for _, name := range modelNames {
		tok := loadModel(t, name)
		if tok.TemplateIsFallback() {
			t.Fatalf("%s: the model's simple template should be supported", name)
		}
		msgs := []Message{{Role: "system", Content: "You are x"}, {Role: "user", Content: "hi"}}
		got, err := tok.ApplyChatTemplate(msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		// From the template: per message '<|im_start|>' + role + '\n' +
		// content + '<|im_end|>' + '\n', then '<|im_start|>assistant\n'.
		want := "<|im_start|>system\nYou are x<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
		if got != want {
			t.Errorf("%s: got %q\nwant %q", name, got, want)
		}
		got, _ = tok.ApplyChatTemplate(msgs, false)
		if want := strings.TrimSuffix(want, "<|im_start|>assistant\n"); got != want {
			t.Errorf("%s without generation prompt: %q", name, got)
		}
		if _, err := tok.ApplyChatTemplate([]Message{{Content: "x"}}, true); err == nil {
			t.Errorf("%s: empty role accepted", name)
		}
	}
}

// modelDirWithConfig makes a model directory holding the real
// tokenizer.json and, if config is non-empty, the given config.
func modelDirWithConfig(t *testing.T, config string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(modelsDir, modelNames[0], "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if config != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func configWithTemplate(t *testing.T, tmpl string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"chat_template": tmpl, "eos_token": "<|im_end|>", "bos_token": nil})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestChatTemplateFallback(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "You are x"}, {Role: "user", Content: "hi"}}
	chatml := "<|im_start|>system\nYou are x<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	for name, config := range map[string]string{
		"no config":       "",
		"filter":          configWithTemplate(t, "{{ messages | tojson }}"),
		"call block":      configWithTemplate(t, "{% macro m() %}x{{ caller() }}{% endmacro %}{% call m() %}y{% endcall %}"),
		"method call":     configWithTemplate(t, "{% for m in messages %}{{ m.content.format(1) }}{% endfor %}"),
		"unclosed for":    configWithTemplate(t, "{% for m in messages %}{{ m.content }}"),
		"render error":    configWithTemplate(t, "{{ messages[0].role + 1 }}"),
		"no template key": `{"eos_token": "<|im_end|>"}`,
	} {
		tok, err := Load(modelDirWithConfig(t, config))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !tok.TemplateIsFallback() || tok.TemplateFallbackReason() == "" {
			t.Errorf("%s: TemplateIsFallback = %v, reason %q", name, tok.TemplateIsFallback(), tok.TemplateFallbackReason())
		}
		got, err := tok.ApplyChatTemplate(msgs, true)
		if err != nil || got != chatml {
			t.Errorf("%s: got %q, %v", name, got, err)
		}
	}
}

// A template that passes the load-time probe but fails on a particular
// conversation still renders (as ChatML) and flips TemplateIsFallback.
func TestChatTemplateLateFallback(t *testing.T) {
	tmpl := "{% for m in messages %}{% if loop.index0 == 4 %}{{ m.nope.deeper }}{% endif %}{{ m.content }}{% endfor %}"
	tok, err := Load(modelDirWithConfig(t, configWithTemplate(t, tmpl)))
	if err != nil {
		t.Fatal(err)
	}
	if tok.TemplateIsFallback() {
		t.Fatal("probe should pass")
	}
	msgs := []Message{{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}, {"user", "e"}}
	got, err := tok.ApplyChatTemplate(msgs, false)
	if err != nil || got != chatML(msgs, false) || !tok.TemplateIsFallback() {
		t.Errorf("got %q, %v, fallback=%v", got, err, tok.TemplateIsFallback())
	}
}

func TestJinjaNewlines(t *testing.T) {
	// Checked against jinja2 3.1 with trim_blocks and lstrip_blocks: CRLF
	// is normalised to LF and one trailing newline is dropped.
	for src, want := range map[string]string{
		"{% if true %}\r\nx\r\ny{% endif %}\r\n": "x\ny",
		"a\n\n":                                  "a\n",
		"{{ 'a' }}\n{{ 'b' }}\n":                 "a\nb",
		"  {%+ if true %}x{% endif +%}\n":        "  x",
		"  {%+ if true %}x{% endif +%}\nz":       "  x\nz",
		"  {% if true %}x{% endif %}\n\nz":       "x\nz",
		"{# c -#}  \n x{{- ' y' }}":              "x y",
	} {
		tmpl, err := parseTemplate(src)
		if err != nil {
			t.Errorf("%q: %v", src, err)
			continue
		}
		got, err := tmpl.render(map[string]any{})
		if err != nil || got != want {
			t.Errorf("%q rendered %q, %v; want %q", src, got, err, want)
		}
	}
}

func TestJinjaSubset(t *testing.T) {
	// Multi-line template relying on trim_blocks/lstrip_blocks, as HF
	// renders with both enabled.
	tmpl := `{%- set sep = "\n" %}
{%- for message in messages %}
    {%- if loop.first and message.role != 'system' %}
{{- '<|im_start|>system' + sep + 'default<|im_end|>' + sep }}
    {%- endif %}
    {%- if message['role'] == "user" or message.role == 'system' %}
{{- '<|im_start|>' + message.role + sep + message.content | trim + '<|im_end|>\n' }}
    {%- elif not message.content %}
{{- '<|im_start|>' ~ message.role ~ ' (empty #' ~ loop.index0 ~ ')<|im_end|>\n' }}
    {%- else %}
{{- '<|im_start|>assistant\n' + message.content + '<|im_end|>' }}{% if not loop.last %}{{ '\n' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt and eos_token is defined %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
{# comment #}
  {% if messages | length > 2 %}
many
  {% else %}
few
  {% endif %}
`
	tok, err := Load(modelDirWithConfig(t, configWithTemplate(t, tmpl)))
	if err != nil {
		t.Fatal(err)
	}
	if tok.TemplateIsFallback() {
		t.Fatal("template should be within the supported subset")
	}
	msgs := []Message{{"user", "  hi  "}, {"assistant", ""}, {"assistant", "ok"}}
	got, err := tok.ApplyChatTemplate(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	// Worked out by hand: the first message is not system, so the default
	// system turn comes first; the user content is trimmed; the empty
	// assistant turn takes the elif branch (loop.index0 == 1); the last
	// turn has no trailing "\n" because loop.last. Then the generation
	// prompt. The comment line and the "{% if %}" lines vanish entirely
	// thanks to lstrip_blocks + trim_blocks, leaving "many\n".
	want := "<|im_start|>system\ndefault<|im_end|>\n" +
		"<|im_start|>user\nhi<|im_end|>\n" +
		"<|im_start|>assistant (empty #1)<|im_end|>\n" +
		"<|im_start|>assistant\nok<|im_end|>" +
		"<|im_start|>assistant\n" +
		"many\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestLoadErrors(t *testing.T) {
	real, err := os.ReadFile(filepath.Join(modelsDir, modelNames[0], "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Load of a missing dir succeeded")
	}
	for name, content := range map[string]string{
		"garbage":         "\x00\x01 not json at all",
		"truncated":       string(real[:len(real)/2]),
		"empty":           "",
		"wrong model":     `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`,
		"no vocab":        `{"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}`,
		"bad merge":       `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}}`,
		"bad merge shape": `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}, "pre_tokenizer": {"type": "ByteLevel"}}`,
		"negative id":     `{"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}`,
		"huge id":         `{"model": {"type": "BPE", "vocab": {"a": 9000000000}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}`,
		"bad regex":       strings.Replace(string(real), `\\s+(?!\\S)|`, "", 1),
		"bad normalizer":  strings.Replace(string(real), `"type": "NFC"`, `"type": "NFKD"`, 1),
		"wrong types":     `{"model": "BPE", "added_tokens": 7}`,
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if tok, err := Load(dir); err == nil {
			t.Errorf("%s: Load succeeded (%v)", name, tok != nil)
		} else if !strings.Contains(err.Error(), "tokenizer") {
			t.Errorf("%s: error does not say what failed: %v", name, err)
		}
	}
	if _, err := Load(modelDirWithConfig(t, "{broken")); err == nil {
		t.Error("garbage tokenizer_config.json accepted")
	}
}

// Added tokens are matched leftmost-longest, and lstrip/rstrip absorb the
// surrounding whitespace.
func TestAddedTokenOptions(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(modelsDir, modelNames[0], "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	f["added_tokens"] = append(f["added_tokens"].([]any),
		map[string]any{"id": 4096, "content": "<|im_start|>user", "special": false},
		map[string]any{"id": 4097, "content": "<tool>", "special": true, "lstrip": true, "rstrip": true},
	)
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]int{
		"<|im_start|>user\n":    {4096, 198},
		"<|im_start|>assistant": {4094, 449, 628, 638},
		"a  <tool>\n b":         {64, 4097, 65},
	} {
		if got := tok.Encode(text); !reflect.DeepEqual(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
	if tok.VocabSize() != 4098 || tok.IsSpecial(4096) || !tok.IsSpecial(4097) {
		t.Errorf("VocabSize %d, IsSpecial(4096) %v, IsSpecial(4097) %v", tok.VocabSize(), tok.IsSpecial(4096), tok.IsSpecial(4097))
	}
}

// The merges in the test model are ["a","b"] pairs; the legacy "a b" form
// must give the same tokenizer.
func TestLegacyMergeStrings(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(modelsDir, modelNames[0], "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	model := f["model"].(map[string]any)
	merges := model["merges"].([]any)
	for i, m := range merges {
		pair := m.([]any)
		merges[i] = pair[0].(string) + " " + pair[1].(string)
	}
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	refs := loadRefs(t, modelNames[0])
	for i, e := range refs.Tokenizer {
		if !reflect.DeepEqual(tok.Encode(e.Text), e.IDs) {
			t.Errorf("entry %d differs with string merges", i)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	tok := loadModel(b, modelNames[0])
	refs := loadRefs(b, modelNames[0])
	longest := ""
	for _, e := range refs.Tokenizer {
		if len(e.Text) > len(longest) {
			longest = e.Text
		}
	}
	b.SetBytes(int64(len(longest)))
	for b.Loop() {
		tok.Encode(longest)
	}
}

// BenchmarkEncodeUncached measures BPE itself by defeating the word cache.
func BenchmarkEncodeUncached(b *testing.B) {
	tok := loadModel(b, modelNames[0])
	refs := loadRefs(b, modelNames[0])
	text := refs.Tokenizer[0].Text
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.model.mu.Lock()
		clear(tok.model.cache)
		tok.model.mu.Unlock()
		tok.Encode(text)
	}
}

// FuzzTemplate checks that arbitrary template text never panics: it either
// parses and renders, or reports an error.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}{%- endfor %}",
		"{% if a == 'x' and not b or c != 1 %}{% elif d %}{% else %}{% endif %}",
		"{{ messages[-1].content | trim | length }}{% set x = 'a' ~ 1 %}{{ x }}",
		"{{", "{%", "{#", "{{ 'unterminated", "{% if %}", "{{ (1 }}", "{{ a.b.c }}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := parseTemplate(src)
		if err != nil {
			return
		}
		msgs := []any{map[string]any{"role": "user", "content": "hi"}}
		_, _ = tmpl.render(map[string]any{"messages": msgs, "add_generation_prompt": true})
	})
}

// FuzzEncodeDecode checks that any input encodes without panicking, that
// valid text survives the round trip up to NFC, and that streaming agrees
// with Decode.
func FuzzEncodeDecode(f *testing.F) {
	tok := loadModel(f, modelNames[0])
	for _, c := range extraCases {
		f.Add(c.text)
	}
	f.Add("a\xffb\xe6\x97")
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		dec := tok.Decode(ids)
		if utf8.ValidString(s) && dec != norm.NFC.String(s) {
			t.Fatalf("round trip %q -> %q", s, dec)
		}
		if got := streamDecode(tok, ids); got != dec {
			t.Fatalf("stream %q != Decode %q", got, dec)
		}
	})
}
