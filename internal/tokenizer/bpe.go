package tokenizer

import (
	"container/heap"
	"sync"
)

// merge is the result of merging one adjacent pair of token ids: its
// priority (lower merges first) and the id of the merged token.
type merge struct {
	rank int32
	id   int32
}

// pairKey packs two token ids into one map key.
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpe is a byte-level BPE model working directly on raw bytes and ids,
// which avoids building byte-level strings for every word.
type bpe struct {
	byteID       [256]int32 // id of each single-byte token, -1 if absent
	merges       map[uint64]merge
	byBytes      map[string]int32 // raw bytes of a vocab token -> id
	ignoreMerges bool

	mu    sync.Mutex
	cache map[string][]int32
}

// cacheLimit bounds the per-word cache. Like HF's cache, once it is full we
// simply stop inserting: prompts are dominated by a small set of frequent
// words, so this keeps most of the benefit with a hard memory cap.
const cacheLimit = 1 << 16

// encodeWord appends the ids for one pre-tokenized piece to dst.
func (m *bpe) encodeWord(word string, dst []int) []int {
	m.mu.Lock()
	ids, ok := m.cache[word]
	m.mu.Unlock()
	if !ok {
		ids = m.merge(word)
		m.mu.Lock()
		if len(m.cache) < cacheLimit {
			m.cache[word] = ids
		}
		m.mu.Unlock()
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// symbol is one node of the doubly linked list of word parts.
type symbol struct {
	id         int32
	prev, next int32
	dead       bool
}

// candidate is a queued merge of symbols[pos] with its right neighbour.
type candidate struct {
	rank, pos, id int32
}

// candidateHeap implements heap.Interface over merge candidates.
type candidateHeap []candidate

func (h candidateHeap) Len() int { return len(h) }
func (h candidateHeap) Less(i, j int) bool {
	// Lowest rank first; among equal ranks the leftmost, as in HF.
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candidateHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candidateHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candidateHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// merge runs the BPE algorithm of HF's Word::merge_all: a priority queue of
// adjacent pairs ordered by (rank, position), with stale entries skipped on
// pop. This is O(n log n) in the word length, so long runs such as a line of
// "=" characters do not go quadratic.
func (m *bpe) merge(word string) []int32 {
	if m.ignoreMerges {
		if id, ok := m.byBytes[word]; ok {
			return []int32{id}
		}
	}
	syms := make([]symbol, 0, len(word))
	for i := 0; i < len(word); i++ {
		id := m.byteID[word[i]]
		if id < 0 {
			// No token for this byte and no unk token: HF drops it.
			continue
		}
		syms = append(syms, symbol{id: id, prev: int32(len(syms) - 1), next: int32(len(syms) + 1)})
	}
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1

	h := make(candidateHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, candidate{mg.rank, int32(i), mg.id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		left := &syms[c.pos]
		if left.dead || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		// The pair may have changed since it was queued; only merge if it
		// still produces the queued token.
		if mg, ok := m.merges[pairKey(left.id, right.id)]; !ok || mg.id != c.id {
			continue
		}
		left.id = c.id
		right.dead = true
		left.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = c.pos
		}
		if left.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[left.prev].id, left.id)]; ok {
				heap.Push(&h, candidate{mg.rank, left.prev, mg.id})
			}
		}
		if left.next >= 0 {
			if mg, ok := m.merges[pairKey(left.id, syms[left.next].id)]; ok {
				heap.Push(&h, candidate{mg.rank, c.pos, mg.id})
			}
		}
	}
	out := make([]int32, 0, len(syms))
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}
