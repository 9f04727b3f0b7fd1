package experts

import (
	"context"
	"path/filepath"
	"runtime"
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

// TestScratchBytes: the budget's scratch bounds what a runner takes on
// the Go heap, for every family, with 2 and 16 threads: its buffers at
// creation and what a forward of more rows than a chunk grows (the
// attention's weights, each thread's activations), measured as HeapAlloc
// after a collection. The state is made before the first reading.
func TestScratchBytes(t *testing.T) {
	const rows, ctx, prompt = 64, 512, 200
	for _, name := range testutil.Models {
		m, err := model.Load(testutil.Packed(t, name, 4))
		if err != nil {
			t.Fatal(err)
		}
		p, err := model.NewResidentProvider(m)
		if err != nil {
			t.Fatal(err)
		}
		m.Experts = p
		toks := testutil.Prompt(prompt, m.Config.Vocab)
		out := make([]float32, m.Config.Vocab)
		for _, threads := range []int{2, 16} {
			st, err := m.NewState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var a, b runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&a)
			r := model.NewRunner(m, threads, rows)
			if err := r.Forward(st, toks, out, false); err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&b)
			got := int64(b.HeapAlloc) - int64(a.HeapAlloc)
			if want := ScratchBytes(&m.Config, rows, threads, ctx); got > want {
				t.Errorf("%s, %d threads: the runner holds %d bytes, the budget counts %d", name, threads, got, want)
			}
			r.Close()
			runtime.KeepAlive(st)
		}
		m.Close()
	}
}
