package experts

import (
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/testutil"
)

// liveRun is what one live decode of a long prompt's tail did.
type liveRun struct {
	st     Snapshot // the decode's counts (the prefill's taken off)
	tr     Trace    // the records each decode step asked for
	stride int64    // bytes a record's read takes
}

// liveDecode runs prompt through the model packed in dir with experts
// streamed under o: the first benchPrompt tokens as a prefill in chunks
// of 256, then one token a step to the end, each step's input the
// prompt's next token rather than the model's choice (the recording's
// positions, whatever the quantized model would have said).
func liveDecode(t *testing.T, dir string, prompt []int, o Options) liveRun {
	t.Helper()
	m, s := loadStreamDir(t, dir, o)
	r := model.NewRunner(m, 2, 256)
	defer r.Close()
	st, err := m.NewState(len(prompt))
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Config.Vocab)
	for i := 0; i < benchPrompt; i += 256 {
		if err := r.Forward(st, prompt[i:min(i+256, benchPrompt)], logits, false); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Stats()
	s.RecordTrace(true)
	for p := benchPrompt; p < len(prompt); p++ {
		if err := r.Forward(st, prompt[p:p+1], logits, false); err != nil {
			t.Fatal(err)
		}
	}
	return liveRun{st: s.Stats().Sub(before), tr: s.Trace(), stride: s.Stride()}
}

// TestLookaheadAgainstOptimum decodes the tail of each tiny test model's
// first long reference prompt (the four shared models' and the
// repository's two; positions 512 on, as the replays of
// TestPolicyTable) through a pool of 10% of its records, with the
// lookahead off and with it predicting at every step, and sets each
// decode's hits against Belady's on the same requests. Eviction alone
// cannot reach 0.9× of the optimum on such decodes (TestOnlineBound):
// what a token's layers find resident was resident when the token
// began. The lookahead's reads are not bound so: a layer's predicted
// records are read while the layers before it compute. Predicting at
// every step, the pool must hit at least 0.9× as often as the optimum
// and more often than without the lookahead, and the forward must ask
// for the same records either way (reading ahead changes no logits).
func TestLookaheadAgainstOptimum(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-moe", "tiny-qwen3-5-moe", "tiny-gpt-oss", "tiny-deepseek-v32", "tiny-qwen3-next", "tiny-glm4-moe"} {
		dir, man := testutil.PackedManifest(t, name, 4)
		prompt := testutil.LoadRefs(t, name).Long[0].Prompt
		if len(prompt) <= benchPrompt {
			t.Fatalf("%s: a long prompt of %d tokens, want more than %d", name, len(prompt), benchPrompt)
		}
		slots := man.ExpertLayers * man.Experts / 10
		o := Options{Slots: slots, Policy: Markov, Buffered: true}
		off := liveDecode(t, dir, prompt, o)
		o.Lookahead, o.lookAlways = true, true
		on := liveDecode(t, dir, prompt, o)
		if !slices.EqualFunc(off.tr, on.tr, slices.Equal) {
			t.Fatalf("%s: the decode asked for other records with the lookahead on", name)
		}
		hits, total := BeladyHits(off.tr, slots)
		opt := float64(hits) / float64(total)
		steps := float64(len(prompt) - benchPrompt)
		// Records read a token, prefetches included.
		reads := func(r liveRun) float64 { return float64(r.st.BytesRead) / float64(r.stride) / steps }
		t.Logf("%s, %d of %d records: optimum %.1f%% (%.2f reads a token); lookahead off %.1f%% (%.2fx, %.2f reads); on %.1f%% (%.2fx; %.1f%% landed, %.2fx; %.2f reads a token, %.2f of them the forward's own)",
			name, slots, man.ExpertLayers*man.Experts, 100*opt, float64(total-hits)/steps,
			100*off.st.HitRate(), off.st.HitRate()/opt, reads(off),
			100*on.st.HitRate(), on.st.HitRate()/opt, 100*on.st.LandedRate(), on.st.LandedRate()/opt, reads(on), float64(on.st.Misses)/steps)
		if on.st.HitRate() < 0.9*opt || on.st.HitRate() <= off.st.HitRate() {
			t.Errorf("%s: %.1f%% of requests hit with the lookahead predicting at every step, %.1f%% without it: want at least 0.9× the optimum's %.1f%%, and more than without",
				name, 100*on.st.HitRate(), 100*off.st.HitRate(), 100*opt)
		}
	}
}
