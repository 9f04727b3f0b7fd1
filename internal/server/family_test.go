package server

import (
	"context"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestServesEveryFamily serves each shared test model and requires the
// greedy completion of a reference prompt to be transformers' greedy
// tokens.
func TestServesEveryFamily(t *testing.T) {
	defer testutil.Cleanup() // the packed models; no other test of this package packs
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			e, err := engine.Open(context.Background(), testutil.Packed(t, name, 16), engine.Options{Ctx: testCtx, Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close) // after the server stops
			_, url := start(t, Config{Engine: e, ModelID: name})
			c := testutil.LoadRefs(t, name).Cases[0]
			const n = 16
			r := post(t, url, "/v1/completions", "", msg{"prompt": c.Prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			if r.Status != 200 {
				t.Fatalf("status %d: %s", r.Status, r.RawBody)
			}
			if want := e.Tok.Decode(c.Greedy[:n]); r.Text != want {
				t.Errorf("completion %q, want transformers' greedy %q", r.Text, want)
			}
		})
	}
}
