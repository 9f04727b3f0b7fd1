package server

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

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
			defer e.Close()
			s, err := New(Config{Engine: e, ModelID: name})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(s)
			defer func() {
				s.Abort()
				ts.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s.Wait(ctx)
			}()
			c := testutil.LoadRefs(t, name).Cases[0]
			const n = 16
			r := post(t, ts.URL, "/v1/completions", "", msg{"prompt": c.Prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			if r.Status != 200 {
				t.Fatalf("status %d: %s", r.Status, r.RawBody)
			}
			if want := e.Tok.Decode(c.Greedy[:n]); r.Text != want {
				t.Errorf("completion %q, want transformers' greedy %q", r.Text, want)
			}
		})
	}
}
