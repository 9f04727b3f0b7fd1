package server

import (
	"slices"

	"github.com/sluicelm/sluice/internal/model"
)

// prefixCache keeps copies of sequence states at the end of token prefixes
// (a system prompt, a whole earlier prompt, a finished conversation) so
// that a request starting with one of them resumes from the copy instead of
// recomputing it. A DeltaNet model's recurrent state cannot be truncated,
// so an entry serves exactly its own tokens: a request uses the longest
// entry whose tokens are a prefix of its prompt. Each copy is allocated for
// exactly its prefix length, so small prefixes cost little; the cache is an
// LRU bounded in bytes and entries. It is owned by the scheduler goroutine.
type prefixCache struct {
	m          *model.Model
	copy       func(dst, src *model.State) error // State.CopyFrom, on the forward's device too
	release    func(st *model.State)             // frees a dropped state's device copy
	maxBytes   int64
	maxEntries int
	used       int64
	entries    []*cacheEntry // least recently used first
}

// cacheEntry is one saved state and the tokens it has consumed.
type cacheEntry struct {
	tokens []int
	st     *model.State
	bytes  int64
}

func newPrefixCache(m *model.Model, copy func(dst, src *model.State) error, release func(*model.State), maxBytes int64, maxEntries int) *prefixCache {
	return &prefixCache{m: m, copy: copy, release: release, maxBytes: maxBytes, maxEntries: maxEntries}
}

// lookup returns the longest entry of at most limit tokens that is a
// prefix of tokens, marking it recently used, or nil.
func (c *prefixCache) lookup(tokens []int, limit int) *cacheEntry {
	best := -1
	for i, e := range c.entries {
		n := len(e.tokens)
		if n > limit || n > len(tokens) || (best >= 0 && n <= len(c.entries[best].tokens)) {
			continue
		}
		if slices.Equal(e.tokens, tokens[:n]) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	e := c.entries[best]
	c.touch(best)
	return e
}

// touch moves entry i to the most recently used end.
func (c *prefixCache) touch(i int) {
	e := c.entries[i]
	copy(c.entries[i:], c.entries[i+1:])
	c.entries[len(c.entries)-1] = e
}

// put saves a copy of src, which has consumed exactly tokens. It does
// nothing when an entry for tokens exists (beyond refreshing it) or when
// one copy would exceed the whole budget. It reports whether it stored.
func (c *prefixCache) put(tokens []int, src *model.State) bool {
	if c.maxEntries <= 0 || len(tokens) == 0 || src.Pos != len(tokens) {
		return false
	}
	for i, e := range c.entries {
		if slices.Equal(e.tokens, tokens) {
			c.touch(i)
			return false
		}
	}
	st, err := c.m.NewState(len(tokens))
	if err != nil {
		return false
	}
	need := st.Bytes()
	if need > c.maxBytes {
		return false
	}
	for len(c.entries) > 0 && (c.used+need > c.maxBytes || len(c.entries) >= c.maxEntries) {
		c.used -= c.entries[0].bytes
		c.release(c.entries[0].st)
		c.entries[0] = nil
		c.entries = c.entries[1:]
	}
	if err := c.copy(st, src); err != nil {
		c.release(st)
		return false
	}
	c.entries = append(c.entries, &cacheEntry{tokens: slices.Clone(tokens), st: st, bytes: need})
	c.used += need
	return true
}

// clear drops every entry.
func (c *prefixCache) clear() {
	for _, e := range c.entries {
		c.release(e.st)
	}
	c.entries, c.used = nil, 0
}
