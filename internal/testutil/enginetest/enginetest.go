// Package enginetest holds checks on a whole engine, outside the engine's
// own tests so that the GPU backend's tests can run the same ones and
// both backends answer to the same requirement.
package enginetest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/sample"
)

// NaNWeights overwrites every byte of the dense weights of the packed
// model at dir with 0xFF: NaN scales and values, as a corrupt file would
// hold, so that every forward computes NaN logits.
func NaNWeights(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "dense.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xff}, int(fi.Size())), 0); err != nil {
		t.Fatal(err)
	}
}

// RequireNotFinite requires generation with e, greedy and sampled,
// without MTP drafts and with two, and scoring to fail with an error
// about non-finite logits, as they must on a model NaNWeights corrupted,
// rather than answer token 0 forever. what prefixes the failures.
func RequireNotFinite(t *testing.T, e *engine.Engine, what string) {
	t.Helper()
	for _, drafts := range []int{0, 2} {
		for _, sp := range []sample.Params{{Temperature: 0}, {Temperature: 0.8, TopK: 40, Seed: 1}} {
			st, err := e.NewState()
			if err != nil {
				t.Fatal(err)
			}
			o := engine.GenOptions{MaxTokens: 4, Sample: sp, IgnoreEOS: true, Drafts: drafts}
			out, _, err := e.Generate(context.Background(), st, []int{5, 6, 7}, o, nil)
			if err == nil || !strings.Contains(err.Error(), "not finite") {
				t.Errorf("%stemperature %g, %d drafts: tokens %v, err %v; want an error about non-finite logits", what, sp.Temperature, drafts, out, err)
			}
		}
	}
	if _, err := e.Score(context.Background(), []int{5, 6, 7}); err == nil || !strings.Contains(err.Error(), "not finite") {
		t.Errorf("%sscore: err %v; want an error about non-finite logits", what, err)
	}
}
