package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// TestSynthLayouts checks that --layout tiled stores the q4 expert
// matrices tiled, marked so in the manifest, holding the same matrices as
// --layout rows: the records differ, their GGUF files do not.
func TestSynthLayouts(t *testing.T) {
	const name = "test-layouts"
	// Two groups a row everywhere, so that every matrix is tiled on any
	// CPU (kernels.StoreTiles).
	synthShapes[name] = format.Config{Family: family.NameQwen3MoE, Hidden: 128, Layers: 2, Vocab: 256, Heads: 2, KVHeads: 1,
		HeadDim: 32, RotaryDim: 32, RopeTheta: 1e4, RMSEps: 1e-6, MaxPos: 256, Experts: 4, TopK: 2, MoEInter: 128, NormTopK: true}
	t.Cleanup(func() { delete(synthShapes, name) })
	dir := t.TempDir()
	recs := map[string][]byte{}
	ggufs := map[string][]byte{}
	for _, lay := range []string{"rows", "tiled"} {
		out := filepath.Join(dir, lay)
		g := filepath.Join(dir, lay+".gguf")
		if err := cmdSynth(context.Background(), []string{"--like", name, "--route", "router", "--layout", lay, "--out", out, "--gguf", g}); err != nil {
			t.Fatal(err)
		}
		m, err := format.ReadManifest(out)
		if err != nil {
			t.Fatal(err)
		}
		st := &m.Stores[0]
		for _, tn := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
			if want := lay == "tiled" && kernels.StoreTiles(tn); tn.Tiled != want {
				t.Errorf("--layout %s: a %v matrix marked tiled %v, want %v", lay, tn.Shape, tn.Tiled, want)
			}
		}
		if recs[lay], err = os.ReadFile(filepath.Join(out, st.File)); err != nil {
			t.Fatal(err)
		}
		if ggufs[lay], err = os.ReadFile(g); err != nil {
			t.Fatal(err)
		}
	}
	if bytes.Equal(recs["rows"], recs["tiled"]) {
		t.Error("the tiled records are the row-major ones")
	}
	if !bytes.Equal(ggufs["rows"], ggufs["tiled"]) {
		t.Error("the GGUF of the tiled records differs from the row-major one's")
	}
	if err := cmdSynth(context.Background(), []string{"--like", name, "--layout", "diagonal", "--out", filepath.Join(dir, "x")}); err == nil {
		t.Error("--layout diagonal was taken")
	}
}
