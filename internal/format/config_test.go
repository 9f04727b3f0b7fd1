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
