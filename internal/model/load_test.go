package model

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestLoadMapsWhenShort: with less memory available than the weights
// need, Load maps them instead of copying them, says so, and computes the
// same logits; OpenResident does the same for the expert store, and both
// read whole otherwise, silently for files under a GiB. A copy's q4
// matrices are tiled where the CPU reads that layout faster
// (kernels.TiledQ4), a mapping's never: the same logits, bit for bit.
func TestLoadMapsWhenShort(t *testing.T) {
	name := testutil.Models[0]
	dir := testutil.Packed(t, name, 4)
	prompt := testutil.LoadRefs(t, name).Cases[0].Prompt
	logits := func(short bool) ([]float32, string) {
		if short {
			defer func(f func() (int64, string)) { availableMemory = f }(availableMemory)
			availableMemory = func() (int64, string) { return 1 << 20, "1 MiB in this test" }
		}
		var note bytes.Buffer
		m, err := LoadContext(context.Background(), dir, &note)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		p, err := OpenResident(context.Background(), m, &note)
		if err != nil {
			t.Fatal(err)
		}
		m.Experts = p
		own := !short && platform.LoadCopies()
		tiled := own && kernels.TiledQ4()
		// A mapped store's records are as it holds them (pack --layout).
		exTiled := tiled
		if !own {
			exTiled = m.Manifest.Stores[0].Gate.Tiled
		}
		if head := &m.Arch.LMHead.Mat; head.Kind != format.Q4 {
			t.Fatalf("the output head is %s, want q4", head.Kind)
		} else if m.Tiled != tiled || head.Tiled != tiled || p.experts[0].Gate.Tiled != exTiled {
			t.Errorf("loaded in short memory %v: dense tiled %v, output head %v, expert %v; want %v, expert %v", short, m.Tiled, head.Tiled, p.experts[0].Gate.Tiled, tiled, exTiled)
		}
		r := NewRunner(m, 2, 64)
		defer r.Close()
		st, _ := m.NewState(len(prompt))
		out := make([]float32, len(prompt)*m.Config.Vocab)
		if err := r.Forward(st, prompt, out, true); err != nil {
			t.Fatal(err)
		}
		return out, note.String()
	}
	want, note := logits(false)
	if note != "" {
		t.Errorf("loading a small model in ample memory said %q", note)
	}
	got, note := logits(true)
	for _, f := range []string{"dense.bin", "experts.bin"} {
		if !strings.Contains(note, f+" ") || !strings.Contains(note, "mapping it") {
			t.Errorf("short of memory, the load did not say it maps %s: %q", f, note)
		}
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("mapped weights: logit %d = %v, loaded %v", i, got[i], want[i])
		}
	}
}

// TestLoadRefusesWholeKVB: a DeepSeek pack whose manifest holds kv_b_proj
// whole (as earlier versions packed it, in float32) is refused by name,
// with the command that repacks it, rather than as a missing tensor.
func TestLoadRefusesWholeKVB(t *testing.T) {
	dir := testutil.CopyDir(t, testutil.Packed(t, "tiny-deepseek-v32", 8))
	path := filepath.Join(dir, "manifest.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const split = `"layers.1.self_attn.kv_b_proj.k_t.weight"`
	if !bytes.Contains(b, []byte(split)) {
		t.Fatalf("manifest.json has no %s", split)
	}
	b = bytes.Replace(b, []byte(split), []byte(`"layers.1.self_attn.kv_b_proj.weight"`), 1)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err == nil {
		m.Close()
		t.Fatal("a pack with kv_b_proj whole loaded")
	}
	if !strings.Contains(err.Error(), "kv_b_proj.weight is packed whole") || !strings.Contains(err.Error(), "sluice pack --force") {
		t.Errorf("error %q does not name kv_b_proj and the repack", err)
	}
}
