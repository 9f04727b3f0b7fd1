package format_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// bundledManifest is the bundled model's manifest (package models), a real
// packer output to seed from.
const bundledManifest = "../../models/default/manifest.json"

// FuzzReadManifest feeds arbitrary bytes to ReadManifest as manifest.json.
// It must never panic, and a manifest it accepts must keep the promises
// the loaders rely on: every tensor can be sliced out of a buffer of the
// size the manifest declares (dense_bytes, or a store's stride), and the
// record counts agree with the config.
func FuzzReadManifest(f *testing.F) {
	for _, b := range validManifests(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"format": 3}`))
	f.Add([]byte(`{}`))

	// One directory and one zero buffer for every input: the fuzzer runs
	// an input at a time per process, and both cost more than the parse.
	dir := f.TempDir()
	zero := make([]byte, 1<<24)
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := format.ReadManifest(dir)
		if err == nil {
			accepted(t, zero, m)
		}
	})
}

// FuzzManifestFields sets one numeric field of the bundled manifest to an
// arbitrary value, which byte mutations of JSON seldom reach: where a
// field lands in a tensor (offsets, size, a dimension), in a store, or
// in the counts. ReadManifest must reject the value or accept it with
// its promises kept.
func FuzzManifestFields(f *testing.F) {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		f.Fatal(err)
	}
	for field := range 12 {
		f.Add(uint8(field), uint8(0), int64(-1))
		f.Add(uint8(field), uint8(1), int64(1)<<62)
		f.Add(uint8(field), uint8(2), int64(64))
	}
	dir := f.TempDir()
	zero := make([]byte, 1<<24)
	f.Fuzz(func(t *testing.T, field, which uint8, v int64) {
		var m format.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		st := &m.Stores[0]
		x := &m.Dense[int(which)%len(m.Dense)]
		if which >= 128 {
			x = []*format.Tensor{&st.Gate, &st.Up, &st.Down}[int(which)%3]
		}
		switch field % 12 {
		case 0:
			x.Offset = v
		case 1:
			x.Size = v
		case 2:
			x.ScaleOffset = v
		case 3:
			x.BiasOffset = v
		case 4:
			x.Shape[0] = int(v)
		case 5:
			x.Shape[len(x.Shape)-1] = int(v)
		case 6:
			st.Stride = v
		case 7:
			m.DenseBytes = v
		case 8:
			m.Experts = int(v)
		case 9:
			m.ExpertLayers = int(v)
		case 10:
			m.Config.Experts = int(v)
		case 11:
			m.Config.Hidden = int(v)
		}
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), marshal(t, &m), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := format.ReadManifest(dir); err == nil {
			accepted(t, zero, got)
		}
	})
}

// accepted checks the promises of a manifest ReadManifest accepted.
func accepted(t *testing.T, zero []byte, m *format.Manifest) {
	t.Helper()
	c := &m.Config
	if m.Experts != c.Experts || m.ExpertLayers != c.ExpertLayers() {
		t.Fatalf("accepted %d experts in %d layers for a config of %d in %d", m.Experts, m.ExpertLayers, c.Experts, c.ExpertLayers())
	}
	for i := range m.Dense {
		fits(t, zero, "dense", &m.Dense[i], m.DenseBytes)
	}
	for _, st := range m.Stores {
		if st.Stride <= 0 || st.Stride%format.RecordAlign != 0 {
			t.Fatalf("store %s: accepted stride %d", st.File, st.Stride)
		}
		for _, x := range []*format.Tensor{&st.Gate, &st.Up, &st.Down, st.GateBias, st.UpBias, st.DownBias} {
			if x != nil {
				fits(t, zero, st.File, x, st.Stride)
			}
		}
	}
}

// fits requires that x lies inside limit bytes and, when zero holds that
// many, that kernels.MatFrom slices it out of them without error.
func fits(t *testing.T, zero []byte, where string, x *format.Tensor, limit int64) {
	t.Helper()
	// Only quantised kinds have scales and biases: other kinds ignore the
	// fields.
	if e := x.End(); e < 0 || e > limit || x.Offset < 0 || x.Kind.Quantised() && (x.ScaleOffset < 0 || x.BiasOffset < 0) {
		t.Fatalf("%s tensor %q accepted: ends at %d of %d (offsets %d %d %d)", where, x.Name, e, limit, x.Offset, x.ScaleOffset, x.BiasOffset)
	}
	if limit > int64(len(zero)) {
		return
	}
	if _, err := kernels.MatFrom(zero[:limit], x); err != nil {
		t.Fatalf("%s tensor %q accepted, but %v", where, x.Name, err)
	}
}

// validManifests are manifests ReadManifest must accept: the bundled one
// and variants of it.
func validManifests(tb testing.TB) [][]byte {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		tb.Fatal(err)
	}
	var m format.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		tb.Fatal(err)
	}
	// A short manifest mutates faster: ReadManifest does not check the
	// family's tensor list (loading does), so two tensors are enough.
	short := m
	short.Dense = m.Dense[:2]
	// Expert biases, and a low-bit store.
	biased := m
	biased.Config.ExpertBias = true
	biased.Stores = []format.ExpertStore{format.ExpertRecordLayout(&biased.Config, format.Q4, "experts.bin"),
		format.ExpertRecordLayout(&biased.Config, format.Q3, format.LowStoreFile(3))}
	// Tiled q4 records, and a format-3 directory.
	tiled := m
	tiled.Stores = []format.ExpertStore{format.ExpertRecordLayout(&m.Config, format.Q4, "experts.bin")}
	for _, t := range []*format.Tensor{&tiled.Stores[0].Gate, &tiled.Stores[0].Up, &tiled.Stores[0].Down} {
		t.Tiled = true
	}
	old := m
	old.Format = 3
	return [][]byte{b, marshal(tb, &short), marshal(tb, &biased), marshal(tb, &tiled), marshal(tb, &old)}
}

// TestReadManifestTiled: only q4 matrices of a whole tile of rows may be
// marked tiled, and formats outside 3..Version are refused by name.
func TestReadManifestTiled(t *testing.T) {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		change func(m *format.Manifest)
		want   string
	}{
		{"a tiled q3 store", func(m *format.Manifest) {
			m.Stores = append(m.Stores, format.ExpertRecordLayout(&m.Config, format.Q3, format.LowStoreFile(3)))
			m.Stores[1].Down.Tiled = true
		}, "only q4 matrices"},
		{"a tiled matrix of 4 rows", func(m *format.Manifest) {
			m.Dense[len(m.Dense)-1] = format.Tensor{Name: m.Dense[len(m.Dense)-1].Name, Kind: format.Q4, Shape: []int{4, 64},
				Offset: 0, Size: 128, ScaleOffset: 128, BiasOffset: 192, Tiled: true}
		}, "only q4 matrices"},
		{"format 2", func(m *format.Manifest) { m.Format = 2 }, "has format 2"},
		{"a later format", func(m *format.Manifest) { m.Format = format.Version + 1 }, "repack it"},
	} {
		var m format.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		c.change(&m)
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), marshal(t, &m), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := format.ReadManifest(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// TestReadManifestValid requires the fuzz seeds to be accepted, so the
// fuzzer starts from manifests that reach every check.
func TestReadManifestValid(t *testing.T) {
	for i, b := range validManifests(t) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := format.ReadManifest(dir); err != nil {
			t.Errorf("manifest %d: %v", i, err)
		}
	}
}

func marshal(tb testing.TB, m *format.Manifest) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
