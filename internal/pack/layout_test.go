package pack_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestPackLayouts packs one checkpoint row-major and tiled: the tiled
// store marks the matrices kernels.StoreTiles picks and holds the same
// values in other bytes, and the 3-bit store derived from either
// (AddLowBits, which reads the main records) is the same file. An unknown
// layout is refused before anything is written.
func TestPackLayouts(t *testing.T) {
	src := testutil.ModelDir(t, "tiny-qwen3-moe")
	dirs := map[string]string{}
	recs := map[string][]byte{}
	for _, lay := range []string{pack.LayoutRows, pack.LayoutTiled} {
		dir := filepath.Join(t.TempDir(), lay)
		if err := pack.Pack(context.Background(), src, dir, pack.Options{Bits: 4, Layout: lay}); err != nil {
			t.Fatal(err)
		}
		m := readManifest(t, dir)
		st := &m.Stores[0]
		tiled := 0
		for _, tn := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
			want := lay == pack.LayoutTiled && kernels.StoreTiles(tn)
			if tn.Tiled != want {
				t.Errorf("--layout %s: %v matrix tiled %v, want %v", lay, tn.Shape, tn.Tiled, want)
			}
			if tn.Tiled {
				tiled++
			}
		}
		if lay == pack.LayoutTiled && tiled == 0 {
			t.Fatal("no matrix of the tiled store is tiled: the test compares nothing")
		}
		// Row-major records are format 3's: older readers read them.
		if want := map[string]int{pack.LayoutRows: format.MinVersion, pack.LayoutTiled: format.Version}[lay]; m.Format != want {
			t.Errorf("--layout %s: format %d, want %d", lay, m.Format, want)
		}
		if err := pack.AddLowBits(context.Background(), dir, 3, nil); err != nil {
			t.Fatal(err)
		}
		dirs[lay] = dir
		var err error
		if recs[lay], err = os.ReadFile(filepath.Join(dir, st.File)); err != nil {
			t.Fatal(err)
		}
	}
	rows, tiled := readManifest(t, dirs[pack.LayoutRows]), readManifest(t, dirs[pack.LayoutTiled])
	if bytes.Equal(recs[pack.LayoutRows], recs[pack.LayoutTiled]) {
		t.Error("the tiled records are the row-major ones")
	}
	sr, stl := &rows.Stores[0], &tiled.Stores[0]
	for i := int64(0); i < int64(rows.ExpertLayers*rows.Experts); i++ {
		for _, p := range [][2]*format.Tensor{{&sr.Gate, &stl.Gate}, {&sr.Up, &stl.Up}, {&sr.Down, &stl.Down}} {
			a, b := decodeAt(recs[pack.LayoutRows], i*sr.Stride, p[0]), decodeAt(recs[pack.LayoutTiled], i*stl.Stride, p[1])
			if j := sameBits(a, b); j >= 0 {
				t.Fatalf("record %d %v: value %d differs between the layouts", i, p[0].Shape, j)
			}
		}
	}
	low := map[string][]byte{}
	for lay, dir := range dirs {
		var err error
		if low[lay], err = os.ReadFile(filepath.Join(dir, format.LowStoreFile(3))); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(low[pack.LayoutRows], low[pack.LayoutTiled]) {
		t.Error("the 3-bit store derived from the tiled records differs from the row-major one's")
	}
	dst := filepath.Join(t.TempDir(), "bad")
	if err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: 4, Layout: "diagonal"}); err == nil || !strings.Contains(err.Error(), "diagonal") {
		t.Errorf("layout diagonal: %v", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("a refused layout left %s: %v", dst, err)
	}
}
