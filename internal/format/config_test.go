package format_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
)

// TestReadManifestRopeAndEps checks that a manifest whose rope_theta or
// rms_norm_eps would make every activation NaN is refused at load, with
// the key named, rather than generating token 0 forever.
func TestReadManifestRopeAndEps(t *testing.T) {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		v    float64
		want string
	}{
		{"rope_theta", 0, "rope_theta = 0, want a finite number > 0"},
		{"rope_theta", -5, "rope_theta = -5"},
		{"rms_norm_eps", -1, "rms_norm_eps = -1, want a finite number >= 0"},
	} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["config"].(map[string]any)[c.key] = c.v
		dir := t.TempDir()
		mb, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), mb, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := format.ReadManifest(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %g: err = %v, want %q", c.key, c.v, err, c.want)
		}
	}
	// NaN and infinities cannot be written in JSON, but a config built in
	// code (synth's shapes) goes through the same check.
	var m format.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if err := m.Config.Validate(); err != nil {
		t.Fatalf("the bundled config: %v", err)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1)} {
		c := m.Config
		c.RopeTheta = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rope_theta") {
			t.Errorf("rope_theta %g: err = %v", v, err)
		}
		c = m.Config
		c.RMSEps = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rms_norm_eps") {
			t.Errorf("rms_norm_eps %g: err = %v", v, err)
		}
	}
}

// TestReadManifestEOS checks that eos_token_ids outside the vocabulary are
// refused at load with the key named: such an id can never be sampled, so
// generation would not stop, and a negative one would index out of range.
func TestReadManifestEOS(t *testing.T) {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ids  []any
		want string
	}{
		{[]any{999999}, "eos_token_ids[0] = 999999, outside the vocabulary [0, "},
		{[]any{1, -1}, "eos_token_ids[1] = -1, outside the vocabulary"},
	} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["config"].(map[string]any)["eos_token_ids"] = c.ids
		dir := t.TempDir()
		mb, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), mb, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := format.ReadManifest(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("eos_token_ids %v: err = %v, want %q", c.ids, err, c.want)
		}
	}
}

// TestReadManifestGenerationConfig checks that a packed directory whose
// generation_config.json is no longer JSON is refused with the file named,
// and that one without the file loads.
func TestReadManifestGenerationConfig(t *testing.T) {
	b, err := os.ReadFile(bundledManifest)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := format.ReadManifest(dir); err != nil {
		t.Fatalf("without generation_config.json: %v", err)
	}
	gp := filepath.Join(dir, format.GenerationConfigFile)
	if err := os.WriteFile(gp, []byte(`{"eos_token_id": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := format.ReadManifest(dir); err != nil {
		t.Fatalf("with a valid generation_config.json: %v", err)
	}
	if err := os.WriteFile(gp, []byte(`{"eos_token_id": "x"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := format.ReadManifest(dir); err == nil || !strings.Contains(err.Error(), gp+" is not valid JSON") {
		t.Errorf("corrupt generation_config.json: err = %v", err)
	}
}

// TestCheckComplete checks that weight files without a manifest are called
// an incomplete packed model, and that a checkpoint or a complete packed
// directory passes.
func TestCheckComplete(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := format.CheckComplete(dir); err != nil {
		t.Errorf("a checkpoint: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "experts.bin"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := "manifest.json missing: " + dir + " is not a complete packed model"
	if err := format.CheckComplete(dir); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("experts.bin without manifest.json: err = %v, want %q", err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := format.CheckComplete(dir); err != nil {
		t.Errorf("with manifest.json: %v", err)
	}
}
