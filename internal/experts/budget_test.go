package experts

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestStateBytes: the budget's figure for a sequence state is what a
// loaded model's NewState allocates, for every family (gpt-oss's rings,
// DeepSeek's latents and indexer keys, DeltaNet states, an MTP layer's
// cache in Qwen3.5's and in DeepSeek-V3's layout), at a context shorter
// than a ring and longer.
func TestStateBytes(t *testing.T) {
	dirs := map[string]string{}
	for _, name := range testutil.Models {
		dirs[name] = testutil.Packed(t, name, 4)
	}
	for _, name := range []string{"tiny-deepseek-v32", "tiny-glm4-moe"} {
		dst := filepath.Join(t.TempDir(), "packed")
		if err := pack.Pack(context.Background(), testutil.WithDeepSeekMTP(t, name, ""), dst, pack.Options{Bits: 4}); err != nil {
			t.Fatal(err)
		}
		dirs[name+" with MTP"] = dst
	}
	for name, dir := range dirs {
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ctx := range []int{1, 100, 4096} {
			st, err := m.NewState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := StateBytes(&m.Config, ctx), st.Bytes(); got != want {
				t.Errorf("%s at %d positions: StateBytes %d, a state holds %d", name, ctx, got, want)
			}
		}
		m.Close()
	}
}
