package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestAutoPoolCountsDenseOnce sizes the pool from the memory available
// before the dense weights were loaded, less each counted byte once. Read
// after the load, MemAvailable has already lost the dense weights, and
// subtracting them again took their size from the pool: under a cap of
// dense + 10% of the experts on a 30B model, a pool of 3% instead of 9%.
func TestAutoPoolCountsDenseOnce(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 16)
	c := &man.Config
	st := man.Stores[0]
	records := man.ExpertLayers * man.Experts
	const ctxLen = 256
	fixed := man.DenseBytes + experts.StateBytes(c, ctxLen) + experts.ScratchBytes(c, defaultChunk, 1, ctxLen) + callerBytes(c, Options{}, defaultChunk) +
		experts.PolicyBytes(experts.DefaultPolicy, man.ExpertLayers, man.Experts) + experts.Overhead
	want := records / 3
	// Below 2.5 GiB the headroom is its floor of 256 MiB.
	avail := fixed + 256<<20 + int64(want)*st.Stride + st.Stride/2
	if avail >= 2560<<20 {
		t.Fatalf("avail %d: the headroom would not be its floor", avail)
	}
	// The figure the platform gives drops by the dense bytes once they are
	// loaded, as MemAvailable does.
	calls := 0
	defer func(f func() (int64, string)) { memAvailable = f }(memAvailable)
	memAvailable = func() (int64, string) {
		calls++
		if calls == 1 {
			return avail, "test figure before loading"
		}
		return avail - man.DenseBytes, "test figure after loading"
	}
	e, err := Open(context.Background(), dir, Options{Threads: 1, Ctx: ctxLen})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Stream == nil {
		t.Fatalf("no pool: %s", e.ExpertPlan)
	}
	if got := e.Stream.Slots(); got != want {
		t.Fatalf("pool of %d slots, want %d (%s)", got, want, e.ExpertPlan)
	}
	if !strings.Contains(e.ExpertPlan, "before loading") {
		t.Fatalf("plan %q does not name the figure it was sized from", e.ExpertPlan)
	}
	t.Log(e.ExpertPlan, fmt.Sprintf("(%d records)", records))
}

// TestCallerBytes: the budget counts a chunk's rows of logits only for an
// engine that scores (Options.AllLogits), and a sequence's speculative
// buffers at the drafts the CPU then verifies at most: a generation asking
// for more drafts gets maxCPUDrafts, or Options.Drafts where that is more,
// or a chunk's rows less one.
func TestCallerBytes(t *testing.T) {
	dir, man := testutil.PackedManifest(t, specModelName, 16)
	c := &man.Config
	st := man.Stores[0]
	slots := func(o Options) int {
		t.Helper()
		o.Threads, o.Ctx = 2, 256
		o.Experts.MemoryBytes = man.DenseBytes + experts.StateBytes(c, 256) + experts.ScratchBytes(c, defaultChunk, 2, 256) +
			experts.PolicyBytes(experts.DefaultPolicy, man.ExpertLayers, man.Experts) + experts.Overhead + experts.LogitBytes(c, defaultChunk+1) + 40*st.Stride
		e, err := Open(context.Background(), dir, o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.Stream == nil {
			t.Fatalf("no pool: %s", e.ExpertPlan)
		}
		return e.Stream.Slots()
	}
	all, plain := slots(Options{AllLogits: true}), slots(Options{})
	freed := experts.LogitBytes(c, defaultChunk+1) - callerBytes(c, Options{}, defaultChunk)
	if all != 40 || int64(plain-all) != freed/st.Stride {
		t.Errorf("pool of %d slots scoring, %d not: want 40 and %d more (%d bytes of logits)", all, plain, freed/st.Stride, freed)
	}

	prompt := testutil.LoadRefs(t, specModelName).Cases[1].Prompt
	for _, c := range []struct {
		o    Options
		want int
	}{{Options{}, maxCPUDrafts}, {Options{Drafts: 12}, 12}, {Options{ChunkRows: 6}, 5}} {
		c.o.Threads = 2
		e, err := Open(context.Background(), testutil.Packed(t, specModelName, 16), c.o)
		if err != nil {
			t.Fatal(err)
		}
		st, err := e.NewState()
		if err != nil {
			t.Fatal(err)
		}
		_, s, err := e.Generate(context.Background(), st, prompt, GenOptions{MaxTokens: 4, IgnoreEOS: true, Drafts: 20}, nil)
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if s.MTP == nil || s.MTP.Drafts != c.want {
			t.Errorf("%+v, 20 drafts asked for: MTP stats %+v, want %d drafts a step", c.o, s.MTP, c.want)
		}
	}
}

// specModelName is a shared model with an MTP head.
const specModelName = "tiny-qwen3-5-moe"
