package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/models"
)

// editManifest rewrites dir's manifest through a generic JSON tree, so a
// case can set any field to any value (negative, huge, the wrong type)
// whatever the Go types would allow.
func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, format.ManifestFile)
	m := testutil.ReadJSON(t, p)
	edit(m)
	testutil.WriteJSON(t, p, m)
}

// truncate cuts dir/name to n bytes (negative: that many bytes short).
func truncate(t *testing.T, dir, name string, n int64) {
	t.Helper()
	p := filepath.Join(dir, name)
	if n < 0 {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	if err := os.Truncate(p, n); err != nil {
		t.Fatal(err)
	}
}

func dense(m map[string]any, i int) map[string]any {
	return m["dense"].([]any)[i].(map[string]any)
}

func store(m map[string]any) map[string]any { return m["stores"].([]any)[0].(map[string]any) }

func config(m map[string]any) map[string]any { return m["config"].(map[string]any) }

// TestOpenCorrupt opens copies of the bundled model damaged in one way
// each, resident and streaming, and requires an error that names the
// problem: never a panic, never a model that loads and then computes
// with the wrong bytes.
func TestOpenCorrupt(t *testing.T) {
	edit := func(f func(m map[string]any)) func(*testing.T, string) {
		return func(t *testing.T, dir string) { editManifest(t, dir, f) }
	}
	cases := []struct {
		name   string
		damage func(*testing.T, string)
		want   string // in the error
	}{
		{"manifest cut short", func(t *testing.T, dir string) { truncate(t, dir, format.ManifestFile, 1000) }, "manifest.json"},
		{"manifest empty", func(t *testing.T, dir string) { truncate(t, dir, format.ManifestFile, 0) }, "manifest.json"},
		{"dense offset past end", edit(func(m map[string]any) { dense(m, 1)["offset"] = m["dense_bytes"] }), "layers.0.input_layernorm.weight"},
		{"dense offset huge", edit(func(m map[string]any) { dense(m, 1)["offset"] = 1 << 62 }), "layers.0.input_layernorm.weight"},
		{"dense offset negative", edit(func(m map[string]any) { dense(m, 1)["offset"] = -1024 }), "layers.0.input_layernorm.weight"},
		{"dense scale offset negative", edit(func(m map[string]any) { dense(m, 0)["scale_offset"] = -64 }), "embed_tokens.weight"},
		{"dense bias offset huge", edit(func(m map[string]any) { dense(m, 0)["bias_offset"] = 1 << 62 }), "embed_tokens.weight"},
		{"dense size too small", edit(func(m map[string]any) { dense(m, 1)["size"] = 4 }), "layers.0.input_layernorm.weight"},
		{"dense size negative", edit(func(m map[string]any) { dense(m, 1)["size"] = -1024 }), "layers.0.input_layernorm.weight"},
		{"dense shape disagrees with size", edit(func(m map[string]any) { dense(m, 1)["shape"] = []any{512} }), "layers.0.input_layernorm.weight"},
		{"dense shape empty", edit(func(m map[string]any) { dense(m, 1)["shape"] = []any{} }), "layers.0.input_layernorm.weight"},
		{"dense shape negative", edit(func(m map[string]any) { dense(m, 1)["shape"] = []any{-16, -16} }), "layers.0.input_layernorm.weight"},
		{"dense shape huge", edit(func(m map[string]any) { dense(m, 0)["shape"] = []any{1 << 40, 1 << 40} }), "embed_tokens.weight"},
		{"dense q4 columns not whole groups", edit(func(m map[string]any) { dense(m, 0)["shape"] = []any{8192, 128 + 32} }), "embed_tokens.weight"},
		{"dense kind unknown", edit(func(m map[string]any) { dense(m, 1)["kind"] = "f64" }), "layers.0.input_layernorm.weight"},
		{"dense kind changed", edit(func(m map[string]any) { dense(m, 1)["kind"] = "bf16" }), "layers.0.input_layernorm.weight"},
		{"dense_bytes negative", edit(func(m map[string]any) { m["dense_bytes"] = -1 }), "dense_bytes"},
		{"dense.bin truncated", func(t *testing.T, dir string) { truncate(t, dir, "dense.bin", -4096) }, "dense.bin"},
		{"dense.bin empty", func(t *testing.T, dir string) { truncate(t, dir, "dense.bin", 0) }, "dense.bin"},
		{"experts.bin truncated", func(t *testing.T, dir string) { truncate(t, dir, "experts.bin", -4096) }, "experts.bin"},
		{"experts.bin empty", func(t *testing.T, dir string) { truncate(t, dir, "experts.bin", 0) }, "experts.bin"},
		{"experts.bin missing", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "experts.bin")) }, "experts.bin"},
		{"no layers", edit(func(m map[string]any) { config(m)["num_hidden_layers"] = 0 }), "num_hidden_layers"},
		{"negative layers", edit(func(m map[string]any) { config(m)["num_hidden_layers"] = -6 }), "num_hidden_layers"},
		{"no experts", edit(func(m map[string]any) { config(m)["num_experts"] = 0 }), "num_experts"},
		{"negative experts", edit(func(m map[string]any) { config(m)["num_experts"] = -64 }), "num_experts"},
		{"top-k above experts", edit(func(m map[string]any) { config(m)["num_experts_per_tok"] = 65 }), "num_experts_per_tok"},
		{"manifest experts below config", edit(func(m map[string]any) { m["experts"] = 1 }), "experts"},
		{"manifest experts negative", edit(func(m map[string]any) { m["experts"] = -64 }), "experts"},
		{"manifest expert layers below config", edit(func(m map[string]any) { m["expert_layers"] = 1 }), "expert_layers"},
		{"manifest experts huge", edit(func(m map[string]any) { m["experts"] = 1 << 60; m["expert_layers"] = 1 << 60 }), "experts"},
		{"family disagrees", edit(func(m map[string]any) { m["family"] = "gpt_oss" }), "family"},
		{"group size", edit(func(m map[string]any) { m["group_size"] = 32 }), "group_size"},
		{"stride negative", edit(func(m map[string]any) { store(m)["stride"] = -28672 }), "stride"},
		{"stride zero", edit(func(m map[string]any) { store(m)["stride"] = 0 }), "stride"},
		{"stride unaligned", edit(func(m map[string]any) { store(m)["stride"] = 28672 + 64 }), "stride"},
		{"stride huge", edit(func(m map[string]any) { store(m)["stride"] = 1 << 62 }), "stride"},
		{"store kind unknown", edit(func(m map[string]any) { store(m)["kind"] = "q5" }), "q5"},
		{"store file outside", edit(func(m map[string]any) { store(m)["file"] = "../experts.bin" }), "../experts.bin"},
		{"expert gate past record", edit(func(m map[string]any) { store(m)["gate"].(map[string]any)["offset"] = store(m)["stride"] }), "gate"},
		{"expert gate scale negative", edit(func(m map[string]any) { store(m)["gate"].(map[string]any)["scale_offset"] = -512 }), "gate"},
		{"expert down shape empty", edit(func(m map[string]any) { store(m)["down"].(map[string]any)["shape"] = []any{} }), "down"},
		{"expert down shape transposed", edit(func(m map[string]any) { store(m)["down"].(map[string]any)["shape"] = []any{64, 256} }), "down"},
		{"expert up kind differs", edit(func(m map[string]any) { store(m)["up"].(map[string]any)["kind"] = "q8" }), "up"},
		{"expert biases the config lacks", edit(func(m map[string]any) {
			store(m)["gate_bias"] = map[string]any{"kind": "f32", "shape": []any{64}, "offset": 27648, "size": 256}
		}), "gate_bias"},
		{"config expects expert biases", edit(func(m map[string]any) { config(m)["expert_bias"] = true }), "bias"},
	}
	src, err := models.DefaultDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name string
		o    engine.ExpertOptions
	}{{"resident", engine.ExpertOptions{}}, {"stream", engine.ExpertOptions{PoolShare: 0.25}}} {
		t.Run(mode.name, func(t *testing.T) {
			// The undamaged copy opens: each case fails for its damage.
			if err := tryOpen(testutil.CopyDir(t, src), mode.o); err != nil {
				t.Fatalf("undamaged model: %v", err)
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					dir := testutil.CopyDir(t, src)
					c.damage(t, dir)
					err := tryOpen(dir, mode.o)
					t.Log(err)
					switch {
					case err == nil:
						t.Errorf("opened without error")
					case !strings.Contains(strings.ReplaceAll(err.Error(), dir, "DIR"), c.want):
						t.Errorf("error %q does not mention %q (outside the directory name)", err, c.want)
					}
				})
			}
		})
	}
}

// tryOpen opens dir and closes it, turning a panic into an error.
func tryOpen(dir string, xo engine.ExpertOptions) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 1, Experts: xo})
	if err != nil {
		return err
	}
	e.Close()
	return nil
}
