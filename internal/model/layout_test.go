package model

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestResidentUntile: a CPU whose kernels read rows (kernels.TiledQ4
// false) holding a tiled store whole untiles its copy on load (each with
// untile, as OpenResident does there); the records then hold the bytes of
// the row-major store, and no view stays marked tiled. The views of a
// mapped tiled store are marked tiled as the manifest says.
func TestResidentUntile(t *testing.T) {
	const name = "tiny-qwen3-moe"
	rowsDir := testutil.PackedLayout(t, name, 4, pack.LayoutRows)
	tiledDir := testutil.PackedLayout(t, name, 4, pack.LayoutTiled)
	rm, err := Load(rowsDir)
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	tm, err := Load(tiledDir)
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	if !tm.Manifest.Stores[0].Tiled() {
		t.Fatal("the tiled pack stores nothing tiled: the test compares nothing")
	}
	mapped, err := NewResidentProvider(tm)
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	st := &tm.Manifest.Stores[0]
	for i := range mapped.experts {
		e := &mapped.experts[i]
		if e.Gate.Tiled != st.Gate.Tiled || e.Up.Tiled != st.Up.Tiled || e.Down.Tiled != st.Down.Tiled {
			t.Fatalf("record %d: views tiled %v %v %v, the manifest says %v %v %v", i,
				e.Gate.Tiled, e.Up.Tiled, e.Down.Tiled, st.Gate.Tiled, st.Up.Tiled, st.Down.Tiled)
		}
	}
	want, err := os.ReadFile(filepath.Join(rowsDir, rm.Manifest.Stores[0].File))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(tiledDir, st.File))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(data, want) {
		t.Fatal("the tiled records are the row-major ones")
	}
	r, err := newResident(tm, data) // a heap copy, never closed
	if err != nil {
		t.Fatal(err)
	}
	if err := r.each(context.Background(), (*Expert).untile); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, want) {
		t.Error("the untiled records differ from the row-major store's")
	}
	for i := range r.experts {
		if e := &r.experts[i]; e.Gate.Tiled || e.Up.Tiled || e.Down.Tiled {
			t.Fatalf("record %d: a view still marked tiled", i)
		}
	}
}

// TestTileRecordLayout: TileRecord lays a record out exactly as
// MarkTiled marks its views, tiled where kernels.Tiles says, whichever
// way the store holds each matrix: here every matrix stored tiled, even
// one Tiles may not pick (the down projection's single group a row,
// which AMD's 512-bit decode reads row-major). Every matrix keeps its
// rows (FlatQ).
func TestTileRecordLayout(t *testing.T) {
	dir := testutil.PackedLayout(t, "tiny-qwen3-moe", 4, pack.LayoutRows)
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st := m.Manifest.Stores[0] // a copy, marked tiled below
	raw, err := os.ReadFile(filepath.Join(dir, st.File))
	if err != nil {
		t.Fatal(err)
	}
	rec := raw[3*st.Stride : 4*st.Stride]
	flat, err := ExpertFromRecord(bytes.Clone(rec), &st)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
		kernels.TileQ4(rec[tn.Offset:tn.Offset+tn.Size], tn.Rows(), tn.Cols(), nil)
		tn.Tiled = true
	}
	if _, err := TileRecord(rec, &st, nil); err != nil {
		t.Fatal(err)
	}
	ex, err := ExpertFromRecord(rec, &st)
	if err != nil {
		t.Fatal(err)
	}
	ex.MarkTiled()
	for i, p := range [][2]*kernels.Mat{{&ex.Gate, &flat.Gate}, {&ex.Up, &flat.Up}, {&ex.Down, &flat.Down}} {
		if p[0].Tiled != kernels.Tiles(p[0]) {
			t.Errorf("matrix %d: marked tiled %v, Tiles says %v", i, p[0].Tiled, kernels.Tiles(p[0]))
		}
		if !bytes.Equal(p[0].FlatQ(), p[1].Q) {
			t.Errorf("matrix %d (%d×%d): rows differ after TileRecord", i, p[0].Rows, p[0].Cols)
		}
	}
}
