// Package tokenizer implements the Hugging Face byte-level BPE tokenizer
// used by Qwen-style models (tokenizer.json), an incremental UTF-8 safe
// decoder for streaming generation, and the small subset of Jinja needed to
// render simple chat templates.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and back. It is safe for concurrent
// use: the only mutable state is the BPE word cache, which is locked.
type Tokenizer struct {
	model    *bpe
	split    splitter
	nfc      bool
	idBytes  [][]byte // decoded bytes of every id; nil for unused ids
	tokenIDs map[string]int
	special  []bool
	added    []addedToken
	// addedByFirst indexes added tokens by their first byte, longest first,
	// so splitting the input on them is a cheap scan.
	addedByFirst map[byte][]int

	template         *template // nil when absent or unparsable
	templateFallback atomic.Bool
	templateWhy      atomic.Pointer[string] // why the fallback is used
	bosToken         string
	eosToken         string
	extraVars        map[string]any
}

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type typed struct {
	Type string `json:"type"`
}

type tokenizerFile struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]int    `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
	} `json:"model"`
}

// isNull reports whether a raw JSON field is absent or null.
func isNull(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) == 0 || string(m) == "null"
}

// maxVocab guards against absurd ids in a corrupt file turning into a
// multi-gigabyte allocation.
const maxVocab = 1 << 24

// Load reads tokenizer.json (and tokenizer_config.json if present, for the
// chat template and eos/bos) from dir. Only the configuration used by
// byte-level BPE models of the Qwen2/Llama 3 family is accepted; anything
// else is reported as an error rather than silently mis-tokenised.
func Load(dir string) (*Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: parsing %s: %w", path, err)
	}
	t, err := build(&f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	if err := t.loadConfig(dir); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

func build(f *tokenizerFile) (*Tokenizer, error) {
	t := &Tokenizer{tokenIDs: make(map[string]int)}
	if err := t.parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if !isNull(f.Decoder) {
		var d typed
		if err := json.Unmarshal(f.Decoder, &d); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
		if d.Type != "ByteLevel" {
			return nil, fmt.Errorf("unsupported decoder type %q (want ByteLevel)", d.Type)
		}
	}
	if !isNull(f.PostProcessor) {
		// A ByteLevel post-processor only adjusts offsets; templates that
		// add BOS/EOS would change ids, which we do not implement.
		var p typed
		if err := json.Unmarshal(f.PostProcessor, &p); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
		if p.Type != "ByteLevel" {
			return nil, fmt.Errorf("unsupported post_processor type %q", p.Type)
		}
	}

	m := &f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil) {
		return nil, fmt.Errorf("unsupported model type %q (want BPE)", m.Type)
	}
	if len(m.Vocab) == 0 {
		return nil, errors.New("model has an empty vocab")
	}
	if m.ByteFallback || (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, errors.New("unsupported BPE options (byte_fallback, continuing_subword_prefix or end_of_word_suffix)")
	}

	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("vocab token %q has out-of-range id %d", tok, id)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab {
			return nil, fmt.Errorf("added token %q has out-of-range id %d", a.Content, a.ID)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("added token %d has empty content", a.ID)
		}
		maxID = max(maxID, a.ID)
	}
	t.idBytes = make([][]byte, maxID+1)
	t.special = make([]bool, maxID+1)

	model := &bpe{
		merges:       make(map[uint64]merge, len(m.Merges)),
		byBytes:      make(map[string]int32, len(m.Vocab)),
		ignoreMerges: m.IgnoreMerges,
		cache:        make(map[string][]int32),
	}
	for i := range model.byteID {
		model.byteID[i] = -1
	}
	for tok, id := range m.Vocab {
		t.tokenIDs[tok] = id
		b, ok := byteLevelToBytes(tok)
		t.idBytes[id] = b
		if ok {
			model.byBytes[string(b)] = int32(id)
			if len(b) == 1 {
				model.byteID[b[0]] = int32(id)
			}
		}
	}
	for rank, raw := range m.Merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("merge %d: %w", rank, err)
		}
		ida, oka := m.Vocab[a]
		idb, okb := m.Vocab[b]
		idm, okm := m.Vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("merge %d (%q %q) uses a token missing from the vocab", rank, a, b)
		}
		k := pairKey(int32(ida), int32(idb))
		if _, dup := model.merges[k]; !dup { // first (best) rank wins, as in HF
			model.merges[k] = merge{rank: int32(rank), id: int32(idm)}
		}
	}
	t.model = model

	t.addedByFirst = make(map[byte][]int)
	for _, a := range f.AddedTokens {
		t.tokenIDs[a.Content] = a.ID
		t.special[a.ID] = a.Special
		// The ByteLevel decoder maps an added token through the byte
		// alphabet when it can, otherwise emits its UTF-8 as is.
		t.idBytes[a.ID], _ = byteLevelToBytes(a.Content)
		t.added = append(t.added, a)
	}
	for i, a := range t.added {
		t.addedByFirst[a.Content[0]] = append(t.addedByFirst[a.Content[0]], i)
	}
	for _, list := range t.addedByFirst {
		// Longest first gives leftmost-longest matching like HF's
		// Aho-Corasick configuration.
		sort.SliceStable(list, func(i, j int) bool {
			return len(t.added[list[i]].Content) > len(t.added[list[j]].Content)
		})
	}
	return t, nil
}

// parseMerge accepts both merge encodings found in tokenizer.json files:
// the legacy "a b" string and the newer ["a", "b"] pair (needed when tokens
// themselves contain spaces).
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		parts := strings.Split(s, " ")
		if len(parts) != 2 {
			return "", "", fmt.Errorf("merge %q is not two space-separated tokens", s)
		}
		return parts[0], parts[1], nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("merge %s is neither \"a b\" nor [\"a\",\"b\"]", string(raw))
	}
	return pair[0], pair[1], nil
}

func (t *Tokenizer) parseNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		t.nfc = true
		return nil
	case "Sequence":
		for _, sub := range n.Normalizers {
			if err := t.parseNormalizer(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unsupported normalizer type %q", n.Type)
}

func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("missing pre_tokenizer (expected Split + ByteLevel)")
	}
	var p struct {
		Type          string            `json:"type"`
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
		Pattern       struct {
			Regex  *string `json:"Regex"`
			String *string `json:"String"`
		} `json:"pattern"`
		Behavior       string `json:"behavior"`
		Invert         bool   `json:"invert"`
		AddPrefixSpace bool   `json:"add_prefix_space"`
		UseRegex       bool   `json:"use_regex"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch p.Type {
	case "Sequence":
		for _, sub := range p.PreTokenizers {
			if err := t.parsePreTokenizer(sub); err != nil {
				return err
			}
		}
		if t.split.maxDigits == 0 {
			return errors.New("pre_tokenizer sequence has no supported Split step")
		}
		return nil
	case "Split":
		if p.Pattern.Regex == nil || p.Behavior != "Isolated" || p.Invert {
			return errors.New("unsupported Split pre_tokenizer (want a Regex pattern, Isolated, not inverted)")
		}
		switch *p.Pattern.Regex {
		case qwen2Pattern:
			t.split.maxDigits = 1
		case llama3Pattern:
			t.split.maxDigits = 3
		default:
			return fmt.Errorf("unsupported Split regex %q", *p.Pattern.Regex)
		}
		return nil
	case "ByteLevel":
		// The byte mapping itself is folded into the BPE model; prefix
		// spaces and the GPT-2 regex would change the splits.
		if p.AddPrefixSpace || p.UseRegex {
			return errors.New("unsupported ByteLevel pre_tokenizer options (add_prefix_space/use_regex)")
		}
		return nil
	}
	return fmt.Errorf("unsupported pre_tokenizer type %q", p.Type)
}

// VocabSize returns the largest id over the vocab and added tokens, plus one.
func (t *Tokenizer) VocabSize() int { return len(t.idBytes) }

// TokenID looks up a token string, including added and special tokens.
// Regular vocab entries are spelled in the byte-level alphabet, e.g. "Ġthe"
// for " the".
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.tokenIDs[s]
	return id, ok
}

// IsSpecial reports whether id is an added token marked special (such as
// <|im_end|>); out-of-range ids are not special.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

// Encode converts text to token ids. Added tokens appearing literally in the
// text are recognised as their ids, as HF does with
// split_special_tokens=false; the remaining text is NFC-normalised,
// pre-tokenised and BPE-encoded. Invalid UTF-8 is first replaced with
// U+FFFD, since the reference implementation only accepts valid strings.
func (t *Tokenizer) Encode(text string) []int {
	if !utf8.ValidString(text) {
		text = string(appendLossy(nil, []byte(text)))
	}
	ids := make([]int, 0, len(text)/3+1)
	var pieces []string // reused between segments
	for len(text) > 0 {
		start, end, tokIdx := t.findAdded(text)
		if tokIdx < 0 {
			return t.encodePlain(text, ids, &pieces)
		}
		ids = t.encodePlain(text[:start], ids, &pieces)
		ids = append(ids, t.added[tokIdx].ID)
		text = text[end:]
	}
	return ids
}

// encodePlain encodes text that contains no added tokens.
func (t *Tokenizer) encodePlain(text string, ids []int, pieces *[]string) []int {
	if text == "" {
		return ids
	}
	if t.nfc {
		text = norm.NFC.String(text)
	}
	*pieces = t.split.split(text, (*pieces)[:0])
	for _, p := range *pieces {
		ids = t.model.encodeWord(p, ids)
	}
	return ids
}

// findAdded returns the leftmost, then longest, occurrence of an added token
// in s as the span [start,end) to cut out (including whitespace absorbed by
// lstrip/rstrip) and the index into t.added, or tokIdx -1 if there is none.
func (t *Tokenizer) findAdded(s string) (start, end, tokIdx int) {
	if len(t.added) == 0 {
		return 0, 0, -1
	}
	for i := 0; i < len(s); i++ {
		cands, ok := t.addedByFirst[s[i]]
		if !ok {
			continue
		}
		for _, ci := range cands {
			a := &t.added[ci]
			if !strings.HasPrefix(s[i:], a.Content) {
				continue
			}
			e := i + len(a.Content)
			if a.SingleWord && !isWordBoundary(s, i, e) {
				continue
			}
			st := i
			if a.LStrip {
				st = len(strings.TrimRightFunc(s[:i], unicode.IsSpace))
			}
			if a.RStrip {
				e = len(s) - len(strings.TrimLeftFunc(s[e:], unicode.IsSpace))
			}
			return st, e, ci
		}
	}
	return 0, 0, -1
}

// isWordBoundary implements single_word: the match must not touch word
// characters on either side.
func isWordBoundary(s string, i, e int) bool {
	word := func(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }
	if i > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:i]); word(r) {
			return false
		}
	}
	if e < len(s) {
		if r, _ := utf8.DecodeRuneInString(s[e:]); word(r) {
			return false
		}
	}
	return true
}

// appendBytes appends the raw bytes of id; unknown ids contribute nothing,
// as HF's decode skips ids it cannot map.
func (t *Tokenizer) appendBytes(dst []byte, id int) []byte {
	if id < 0 || id >= len(t.idBytes) {
		return dst
	}
	return append(dst, t.idBytes[id]...)
}

// Decode converts ids back to text with the byte-level decoder. Special
// tokens are included verbatim; unknown ids are skipped; byte sequences that
// are not valid UTF-8 become U+FFFD as with HF's errors="replace".
func (t *Tokenizer) Decode(ids []int) string {
	var buf []byte
	for _, id := range ids {
		buf = t.appendBytes(buf, id)
	}
	if utf8.Valid(buf) {
		return string(buf)
	}
	return string(appendLossy(nil, buf))
}

// BOSToken returns the id of the configured beginning-of-sequence token, if
// tokenizer_config.json names one that exists in the vocabulary.
func (t *Tokenizer) BOSToken() (int, bool) { return t.lookupNonEmpty(t.bosToken) }

// EOSToken returns the id of the configured end-of-sequence token, if
// tokenizer_config.json names one that exists in the vocabulary.
func (t *Tokenizer) EOSToken() (int, bool) { return t.lookupNonEmpty(t.eosToken) }

func (t *Tokenizer) lookupNonEmpty(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	return t.TokenID(s)
}

// StreamDecoder turns ids into text incrementally, holding back bytes that
// do not yet form complete UTF-8. Its concatenated output (Add calls then
// Flush) equals Decode of the same ids. It is not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
}

// NewStreamDecoder returns a decoder with nothing held back.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Add decodes one more id and returns the text completed by it, which may be
// "" when the id ends in the middle of a multi-byte character.
func (d *StreamDecoder) Add(id int) string {
	d.pending = d.t.appendBytes(d.pending, id)
	hold := incompleteTail(d.pending)
	ready := d.pending[:len(d.pending)-hold]
	var out string
	if utf8.Valid(ready) {
		out = string(ready)
	} else {
		// Invalid bytes that can no longer become valid are replaced now,
		// exactly where whole-sequence decoding would replace them.
		out = string(appendLossy(nil, ready))
	}
	d.pending = append(d.pending[:0], d.pending[len(d.pending)-hold:]...)
	return out
}

// Flush returns whatever is held back, with U+FFFD for an incomplete
// sequence, and resets the decoder.
func (d *StreamDecoder) Flush() string {
	out := string(appendLossy(nil, d.pending))
	d.pending = d.pending[:0]
	return out
}
