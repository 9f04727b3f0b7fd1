package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Known Split patterns. Go's regexp package has no lookahead, so instead of
// compiling the pattern we recognise it and run a hand-written scanner that
// reproduces the backtracking engine's (Oniguruma in HF tokenizers) result.
const (
	// qwen2Pattern is the Qwen2/Qwen3 pre-tokenizer: single digits.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// llama3Pattern differs only in grouping up to three digits.
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter is the scanner for the patterns above; maxDigits is the upper
// bound of the \p{N} repetition (1 for Qwen2, 3 for Llama 3).
type splitter struct {
	maxDigits int
}

// split appends the pieces of s to dst. With behaviour "Isolated" every
// regex match becomes its own piece, and because the final alternatives
// cover every rune class, the matches tile s with no gaps.
func (sp splitter) split(s string, dst []string) []string {
	for i := 0; i < len(s); {
		n := sp.matchAt(s, i)
		if n <= 0 {
			// Unreachable for valid input; guarantees progress anyway.
			_, n = utf8.DecodeRuneInString(s[i:])
		}
		dst = append(dst, s[i:i+n])
		i += n
	}
	return dst
}

func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }

// isOther is the class [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// runWhile returns the end offset of the longest run of runes from i that
// satisfy f.
func runWhile(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// matchAt returns the length in bytes of the regex match anchored at i,
// trying the alternatives in pattern order as a backtracking engine does
// (first alternative that matches wins, not the longest).
func (sp splitter) matchAt(s string, i int) int {
	r0, n0 := utf8.DecodeRuneInString(s[i:])

	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' {
		if n := contraction(s[i+1:]); n > 0 {
			return 1 + n
		}
	}

	// 2. [^\r\n\p{L}\p{N}]?\p{L}+ : the optional prefix is tried first
	// (greedy); if r0 is itself a letter the prefix cannot match it, so the
	// engine falls back to matching the letter run directly.
	if isLetter(r0) {
		return runWhile(s, i, isLetter) - i
	}
	if r0 != '\r' && r0 != '\n' && !isNumber(r0) && i+n0 < len(s) {
		if r1, _ := utf8.DecodeRuneInString(s[i+n0:]); isLetter(r1) {
			return runWhile(s, i+n0, isLetter) - i
		}
	}

	// 3. \p{N} or \p{N}{1,3}
	if isNumber(r0) {
		j := i
		for k := 0; k < sp.maxDigits && j < len(s); k++ {
			r, n := utf8.DecodeRuneInString(s[j:])
			if !isNumber(r) {
				break
			}
			j += n
		}
		return j - i
	}

	// 4. " ?[^\s\p{L}\p{N}]+[\r\n]*". If r0 is a space but no symbol
	// follows, retrying without the optional space cannot help because a
	// space is not in the symbol class.
	start := i
	if r0 == ' ' {
		start = i + 1
	}
	if end := runWhile(s, start, isOther); end > start {
		end = runWhile(s, end, func(r rune) bool { return r == '\r' || r == '\n' })
		return end - i
	}

	if !isSpace(r0) {
		return 0 // every non-space rune was handled above
	}
	end := runWhile(s, i, isSpace)

	// 5. \s*[\r\n]+ : \s* first swallows the whole whitespace run, then
	// gives runes back until [\r\n]+ can match, so the match ends right
	// after the last \r or \n of the run.
	lastNL := -1
	for j := i; j < end; {
		r, n := utf8.DecodeRuneInString(s[j:])
		if r == '\r' || r == '\n' {
			lastNL = j + n
		}
		j += n
	}
	if lastNL >= 0 {
		return lastNL - i
	}

	// 6. \s+(?!\S) : at end of input the whole run matches. Otherwise the
	// run is followed by a non-space, so the engine gives back the last
	// whitespace rune (which then satisfies the lookahead), provided at
	// least one rune remains in the match.
	if end == len(s) {
		return end - i
	}
	_, lastN := utf8.DecodeLastRuneInString(s[i:end])
	if end-lastN > i {
		return end - lastN - i
	}

	// 7. \s+ : a single whitespace rune before a non-space.
	return end - i
}

// contraction matches the letters after an apostrophe for alternative 1,
// case-insensitively. Unicode simple case folding maps U+017F (long s) to
// 's', which the Rust/Oniguruma engines honour under (?i), so we do too.
func contraction(s string) int {
	low := func(i int) (rune, int) {
		if i >= len(s) {
			return 0, 0
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == 'ſ' {
			return 's', n
		}
		return unicode.ToLower(r), n
	}
	r, n := low(0)
	switch r {
	case 's', 't', 'm', 'd':
		return n
	case 'r', 'v':
		if r2, n2 := low(n); r2 == 'e' {
			return n + n2
		}
	case 'l':
		if r2, n2 := low(n); r2 == 'l' {
			return n + n2
		}
	}
	return 0
}
