package models

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestDefaultUpToDate packs the source checkpoint afresh and requires the
// bundled copy to be byte-identical: it fails whenever the packer or the
// format changes without the bundled model being regenerated.
func TestDefaultUpToDate(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "default")
	if err := pack.Pack(context.Background(), testutil.ModelDir(t, "tiny-qwen3-5-moe"), dst, pack.Options{Bits: 4}); err != nil {
		t.Fatal(err)
	}
	got, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := os.ReadDir(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != len(got) {
		t.Errorf("bundled model has %d files, a fresh pack %d", len(got), len(fresh))
	}
	for _, e := range fresh {
		want, err := os.ReadFile(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[e.Name()], want) {
			t.Errorf("bundled %s is stale: regenerate with `go run ./cmd/sluice pack --bits 4 --force ../shared/models/tiny-qwen3-5-moe models/default`", e.Name())
		}
	}
}

func TestDefaultDirExtracts(t *testing.T) {
	cache := t.TempDir()
	d1, err := DefaultDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := DefaultDir(cache)
	if err != nil || d1 != d2 {
		t.Fatalf("second extraction: %q %v, want %q", d2, err, d1)
	}
	if _, err := os.Stat(filepath.Join(d1, "experts.bin")); err != nil {
		t.Fatal(err)
	}
}
