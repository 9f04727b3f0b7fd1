package engine_test

import (
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/testutil"
)

const glmModel = "tiny-glm4-moe"

// TestGLMWithoutMTPTensors: tiny-glm4-moe's config.json declares
// num_nextn_predict_layers 1 but its weights carry no layer
// num_hidden_layers; it packs and runs without the module, and drafts
// asked for are off with a reason while greedy stays the reference's.
func TestGLMWithoutMTPTensors(t *testing.T) {
	e := open(t, glmModel, engine.Options{})
	m := e.Model
	if m.MTP != nil || m.Config.MTPLayers != 0 || m.Manifest.ExpertLayers != m.Config.Layers || e.CanDraft() {
		t.Fatalf("MTP %v, mtp layers %d, expert layers %d of %d", m.MTP != nil, m.Config.MTPLayers, m.Manifest.ExpertLayers, m.Config.Layers)
	}
	c := testutil.LoadRefs(t, glmModel).Cases[0]
	o := greedy48
	o.Drafts = 2
	got, s := generateOpts(t, e, c.Prompt, o)
	if !slices.Equal(got, c.Greedy) {
		t.Errorf("tokens %v, want %v", got, c.Greedy)
	}
	if s.MTP == nil || s.MTP.Disabled == "" || s.MTP.Drafted != 0 {
		t.Errorf("MTP stats %+v, want drafts disabled with a reason", s.MTP)
	}
}

// TestGLMMTPDrafts: a GLM-4.5 checkpoint with its MTP layer (DeepSeek-V3's
// layout over GLM's decoder layer, seeded random weights) packs it, loads
// it and drafts; greedy with 1 to 3 drafts is plain greedy's exactly,
// resident and through the smallest pool.
func TestGLMMTPDrafts(t *testing.T) { testMTPDrafts(t, glmModel) }

// TestGLMMTPFollowChunked: GLM-4.5's MTP layer fed chunk by chunk fills its
// KV cache as one batch does, bit for bit.
func TestGLMMTPFollowChunked(t *testing.T) { testMTPFollowChunked(t, glmModel) }
