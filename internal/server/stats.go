package server

import (
	"github.com/sluicelm/sluice/internal/experts"
)

// replyStats are one reply's own figures, sent as the "sluice" extension
// field of responses and stream chunks (OpenAI's clients ignore fields they
// do not know). The expert figures cover the reply's decode steps only:
// the scheduler runs one request's steps at a time, so the pool counters'
// change across a step belongs to that request even while others are
// interleaved with it.
type replyStats struct {
	PromptTokens    int     `json:"prompt_tokens"`
	CachedTokens    int     `json:"cached_tokens"` // prompt tokens resumed from the prefix cache
	GeneratedTokens int     `json:"generated_tokens"`
	PrefillTokS     float64 `json:"prefill_tok_s"`
	DecodeTokS      float64 `json:"decode_tok_s"`
	// ExpertsResident is true when every expert is mapped in memory: every
	// use is a hit and nothing is read.
	ExpertsResident  bool    `json:"experts_resident"`
	ExpertHits       int64   `json:"expert_hits"`
	ExpertMisses     int64   `json:"expert_misses"`
	HitRate          float64 `json:"hit_rate"`     // decode hits / (hits + misses); 1 when nothing was asked
	BytesRead        int64   `json:"bytes_read"`   // expert bytes read from disk while decoding
	MBPerToken       float64 `json:"mb_per_token"` // bytes_read / 2^20 per forwarded decode token
	PrefillBytesRead int64   `json:"prefill_bytes_read"`
}

// replyExperts accumulates a task's expert counters across its turns.
type replyExperts struct {
	hits, misses, bytes int64
	prefillBytes        int64
	tokens              int // decode tokens run through the model
}

// expertSnap is the pool's counters now (zero when experts are resident).
func (s *scheduler) expertSnap() experts.Snapshot {
	if s.e.Stream == nil {
		return experts.Snapshot{}
	}
	return s.e.Stream.Stats()
}

// add counts one decode step: the pool counters before and after it and
// the tokens it forwarded. With resident experts every use is a hit.
func (x *replyExperts) add(before, after experts.Snapshot, forwarded int, perToken int64, resident bool) {
	x.tokens += forwarded
	if resident {
		x.hits += int64(forwarded) * perToken
		return
	}
	x.hits += after.Hits - before.Hits
	x.misses += after.Misses - before.Misses
	x.bytes += after.BytesRead - before.BytesRead
}

// stats is t's reply figures so far.
func (t *task) stats(resident bool) replyStats {
	r := replyStats{PromptTokens: len(t.j.prompt), CachedTokens: t.cached, ExpertsResident: resident,
		ExpertHits: t.x.hits, ExpertMisses: t.x.misses, BytesRead: t.x.bytes, PrefillBytesRead: t.x.prefillBytes, HitRate: 1}
	if t.seq != nil {
		st := t.seq.Stats()
		r.GeneratedTokens, r.PrefillTokS, r.DecodeTokS = st.GeneratedTokens, st.PrefillTokS, st.DecodeTokS
	}
	if n := t.x.hits + t.x.misses; n > 0 {
		r.HitRate = float64(t.x.hits) / float64(n)
	}
	if t.x.tokens > 0 {
		r.MBPerToken = float64(t.x.bytes) / (1 << 20) / float64(t.x.tokens)
	}
	return r
}

// liveStats is t's figures so far when its request streams them, else
// the zero value (the final figures come with the result).
func (s *scheduler) liveStats(t *task) replyStats {
	if !t.j.live {
		return replyStats{}
	}
	return t.stats(s.e.Stream == nil)
}
