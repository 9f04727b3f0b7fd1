package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// tinySynthShape adds a --like shape of a few KiB for the tests of how
// synth writes its output, which the real shapes make GBs of.
func tinySynthShape(t *testing.T) string {
	const name = "test-tiny"
	synthShapes[name] = format.Config{Family: family.NameQwen3MoE, Hidden: 64, Layers: 2, Vocab: 256, Heads: 2, KVHeads: 1,
		HeadDim: 32, RotaryDim: 32, RopeTheta: 1e4, RMSEps: 1e-6, MaxPos: 256, Experts: 4, TopK: 2, MoEInter: 64, NormTopK: true}
	t.Cleanup(func() { delete(synthShapes, name) })
	return name
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestSynthFlagLimits checks that --layers and --experts beyond the
// shape's counts are refused, naming the limit, before anything is
// written: they used to mean "all" and write the whole model.
func TestSynthFlagLimits(t *testing.T) {
	parent := t.TempDir()
	out := filepath.Join(parent, "s")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--layers", "-1"}, "--layers -1: qwen3-30b-a3b has 48 layers"},
		{[]string{"--layers", "49"}, "--layers 49: qwen3-30b-a3b has 48 layers"},
		{[]string{"--layers", "1", "--experts", "129"}, "--experts 129: qwen3-30b-a3b has 128 routed experts a layer"},
		{[]string{"--layers", "1", "--experts", "-1"}, "--experts -1: qwen3-30b-a3b has 128"},
	} {
		_, e, code := sluice(t, append([]string{"synth", "--like", "qwen3-30b-a3b", "--out", out}, c.args...)...)
		if code == 0 || !strings.Contains(e, c.want) {
			t.Errorf("synth %v: exit %d, stderr %q; want %q", c.args, code, e, c.want)
		}
	}
	if names := entries(t, parent); len(names) != 0 {
		t.Errorf("refused synths left %v", names)
	}
}

// TestSynthOutput checks how synth writes --out: complete or not at all
// (a cancelled run leaves nothing), over a packed model only with
// --force, over anything else not at all, and nothing when the disk has
// too little room.
func TestSynthOutput(t *testing.T) {
	like := tinySynthShape(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "m")
	synth := func(ctx context.Context, extra ...string) error {
		return cmdSynth(ctx, append([]string{"--like", like, "--out", out}, extra...))
	}
	bg := context.Background()
	if err := synth(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := format.ReadManifest(out); err != nil {
		t.Fatal(err)
	}
	if names := entries(t, parent); len(names) != 1 || names[0] != "m" {
		t.Fatalf("after synth the parent holds %v, want [m]", names)
	}
	if err := synth(bg, "--layers", "3"); err == nil || !strings.Contains(err.Error(), like+" has 2 layers") {
		t.Errorf("--layers 3: err = %v", err)
	}

	marker := filepath.Join(out, "keep.txt")
	if err := os.WriteFile(marker, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := synth(bg); err == nil || !strings.Contains(err.Error(), "holds a packed model (use --force") {
		t.Errorf("synth onto a packed model: err = %v", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("a refused synth changed --out: %v", err)
	}
	if err := synth(bg, "--force"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("--force kept the old content (%v)", err)
	}
	if names := entries(t, parent); len(names) != 1 || names[0] != "m" {
		t.Errorf("after --force the parent holds %v, want [m]", names)
	}

	// What is not a packed model is never replaced, even with --force:
	// replacing deletes it whole.
	for _, c := range []struct {
		name string
		make func(path string) error
		want string
	}{
		{"notes", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, "keep.txt"), []byte("mine"), 0o644)
		}, "is not a packed model: not replaced, even with --force"},
		{"file", func(p string) error { return os.WriteFile(p, []byte("mine"), 0o644) }, "is not a directory, so not a packed model"},
	} {
		out = filepath.Join(parent, c.name)
		if err := c.make(out); err != nil {
			t.Fatal(err)
		}
		for _, extra := range [][]string{nil, {"--force"}} {
			if err := synth(bg, extra...); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("synth %v onto %s: err = %v, want %q", extra, c.name, err, c.want)
			}
		}
		kept := out
		if c.name == "notes" {
			kept = filepath.Join(out, "keep.txt")
		}
		if b, err := os.ReadFile(kept); err != nil || string(b) != "mine" {
			t.Errorf("a refused synth changed %s: %q, %v", c.name, b, err)
		}
		if err := os.RemoveAll(out); err != nil {
			t.Fatal(err)
		}
	}

	// An empty directory is taken without --force.
	out = filepath.Join(parent, "empty")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := synth(bg); err != nil {
		t.Fatalf("synth into an empty --out: %v", err)
	}
	if _, err := format.ReadManifest(out); err != nil {
		t.Fatal(err)
	}

	// A cancelled synth removes what it wrote.
	out = filepath.Join(parent, "cancelled")
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := synth(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled synth: err = %v, want context.Canceled", err)
	}
	// Too little room: refused before anything is written.
	out = filepath.Join(parent, "full")
	saved := freeBytes
	freeBytes = func(string) int64 { return 1000 }
	defer func() { freeBytes = saved }()
	if err := synth(bg); err == nil || !strings.Contains(err.Error(), "needs about") || !strings.Contains(err.Error(), "only 1000 B is free") {
		t.Errorf("synth without room: err = %v", err)
	}
	if names := entries(t, parent); len(names) != 2 || names[0] != "empty" || names[1] != "m" {
		t.Errorf("the cancelled and refused synths left %v, want [empty m]", names)
	}
}

// TestSynthGGUFExisting checks that synth does not overwrite an existing
// --gguf file without --force, nor one that is not a GGUF with it,
// checked before anything is written, and that with --force a GGUF is
// replaced by a complete one, with no temporary file left beside it.
func TestSynthGGUFExisting(t *testing.T) {
	like := tinySynthShape(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "m")
	g := filepath.Join(parent, "m.gguf")
	if err := os.WriteFile(g, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--like", like, "--route", "router", "--out", out, "--gguf", g}
	// refused runs synth with extra and wants it refused with want,
	// before anything is written.
	refused := func(extra []string, want string) {
		t.Helper()
		err := cmdSynth(context.Background(), append(slices.Clip(args), extra...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("synth %v onto an existing --gguf: err = %v, want %q", extra, err, want)
		}
		if b, err := os.ReadFile(g); err != nil || string(b) != "mine" {
			t.Fatalf("a refused synth %v changed the file: %q, %v", extra, b, err)
		}
		if names := entries(t, parent); len(names) != 1 {
			t.Fatalf("a refused synth %v left %v, want [m.gguf]", extra, names)
		}
	}
	refused(nil, "exists (use --force to replace it)")
	// Nor with --force when the file is not a GGUF.
	refused([]string{"--force"}, "is not a GGUF file: not replaced, even with --force")
	// A GGUF (here only its magic) is replaced with --force.
	if err := os.WriteFile(g, []byte("GGUF old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmdSynth(context.Background(), append(args, "--force")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(g)
	if err != nil || len(b) < 1024 || string(b[:4]) != "GGUF" {
		t.Fatalf("after --force the GGUF holds %d bytes starting %q (%v), want a GGUF", len(b), b[:min(4, len(b))], err)
	}
	if names := entries(t, parent); len(names) != 2 || names[0] != "m" || names[1] != "m.gguf" {
		t.Errorf("after --force the parent holds %v, want [m m.gguf]", names)
	}
	// A directory is never replaced.
	d := filepath.Join(parent, "dir.gguf")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	args = []string{"--like", like, "--route", "router", "--out", filepath.Join(parent, "m2"), "--gguf", d, "--force"}
	if err := cmdSynth(context.Background(), args); err == nil || !strings.Contains(err.Error(), "is not a file") {
		t.Errorf("synth --gguf onto a directory: err = %v", err)
	}
}
