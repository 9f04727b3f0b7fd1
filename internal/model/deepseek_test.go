package model

import (
	"math"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestDeepSeekV3Path runs the tiny DeepSeek-V3.2 as a deepseek_v3 config
// (no indexer: every row attends to every position) and requires the
// V3.2 logits bit for bit on a prompt no longer than index_topk, where the
// indexer selects every position anyway.
func TestDeepSeekV3Path(t *testing.T) {
	const name = "tiny-deepseek-v32"
	v3dir := testutil.PackedVariant(t, name, 16, testutil.DeepSeekV3)
	v3, err := Load(v3dir)
	if err != nil {
		t.Fatal(err)
	}
	p3, err := NewResidentProvider(v3)
	if err != nil {
		t.Fatal(err)
	}
	v3.Experts = p3
	defer v3.Close()
	v32 := load(t, name, 16)
	prompt := testutil.LoadRefs(t, name).Cases[5].Prompt // 30 tokens
	V := v32.Config.Vocab
	var logits [2][]float32
	for i, m := range []*Model{v32, v3} {
		r := NewRunner(m, 2, 7)
		st, _ := m.NewState(len(prompt))
		logits[i] = make([]float32, len(prompt)*V)
		if err := r.Forward(st, prompt, logits[i], true); err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	if m, ok := v3.Arch.Layers[1].Mixer.(*block.MLA); !ok || m.Index != nil {
		t.Fatal("the deepseek_v3 config did not build an MLA without indexer")
	}
	if m := v32.Arch.Layers[1].Mixer.(*block.MLA); m.Index == nil {
		t.Fatal("the deepseek_v32 config built no indexer")
	}
	for i := range logits[0] {
		if math.Float32bits(logits[0][i]) != math.Float32bits(logits[1][i]) {
			t.Fatalf("logit %d (pos %d): v3 %v, v3.2 %v", i, i/V, logits[1][i], logits[0][i])
		}
	}
}
