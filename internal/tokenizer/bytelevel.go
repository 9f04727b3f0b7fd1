package tokenizer

import "unicode/utf8"

// byteToRune and runeToByte are the GPT-2 byte-level alphabet: every byte
// gets a printable rune so that BPE vocabularies can be stored as text.
// Printable Latin-1 bytes map to themselves; the rest are shifted to
// U+0100 and up in byte order, exactly as in bytes_to_unicode() of GPT-2,
// which is what Hugging Face's ByteLevel pre-tokenizer/decoder use.
var (
	byteToRune [256]rune
	runeToByte = make(map[rune]byte, 256)
)

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelToBytes converts a vocabulary string written in the byte-level
// alphabet back to the raw bytes it stands for. ok is false when the string
// contains a rune outside the alphabet; such tokens (typically added tokens)
// decode to their own UTF-8 bytes, mirroring the HF ByteLevel decoder.
func byteLevelToBytes(s string) (b []byte, ok bool) {
	b = make([]byte, 0, len(s))
	for _, r := range s {
		v, found := runeToByte[r]
		if !found {
			return []byte(s), false
		}
		b = append(b, v)
	}
	return b, true
}

// appendLossy appends the UTF-8 decoding of b to dst, replacing every
// maximal invalid subsequence with one U+FFFD. This is the "substitution of
// maximal subparts" rule used by both Rust's String::from_utf8_lossy and
// Python's errors="replace"; Go's strings.ToValidUTF8 collapses whole runs
// instead, and utf8.DecodeRune reports one error per byte, so neither can be
// used directly if we want to match HF output.
func appendLossy(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			dst = append(dst, b[i])
			i++
			continue
		}
		n, complete := utf8Prefix(b[i:])
		if complete {
			dst = append(dst, b[i:i+n]...)
		} else {
			dst = append(dst, "\uFFFD"...)
		}
		i += n
	}
	return dst
}

// utf8Prefix inspects the non-ASCII sequence starting at b[0]. It returns the
// number of bytes that form the longest prefix of a well-formed sequence
// (at least 1) and whether that prefix is a complete character. The byte
// ranges follow Table 3-7 of the Unicode standard, which rules out
// overlongs, surrogates and values above U+10FFFF.
func utf8Prefix(b []byte) (n int, complete bool) {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 2
	case c == 0xE0:
		need, lo = 3, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 3
	case c == 0xED:
		need, hi = 3, 0x9F
	case c == 0xF0:
		need, lo = 4, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 4
	case c == 0xF4:
		need, hi = 4, 0x8F
	default:
		return 1, false
	}
	n = 1
	for n < need {
		if n >= len(b) || b[n] < lo || b[n] > hi {
			return n, false
		}
		lo, hi = 0x80, 0xBF
		n++
	}
	return n, true
}

// incompleteTail reports how many bytes at the end of b form a proper
// prefix of a well-formed UTF-8 sequence, i.e. bytes that might still turn
// into a character once more bytes arrive. The stream decoder holds exactly
// these back so that its output matches decoding everything at once.
func incompleteTail(b []byte) int {
	// A UTF-8 sequence is at most 4 bytes, so only the last 3 can be an
	// unfinished prefix.
	for k := 1; k <= 3 && k <= len(b); k++ {
		i := len(b) - k
		c := b[i]
		if c < 0x80 {
			return 0 // ASCII ends any sequence before it
		}
		if c < 0xC2 || c > 0xF4 {
			if c <= 0xBF {
				continue // continuation byte: look further back for the lead
			}
			return 0 // never a valid lead byte
		}
		n, complete := utf8Prefix(b[i:])
		if !complete && n == k {
			return k
		}
		return 0
	}
	return 0
}
