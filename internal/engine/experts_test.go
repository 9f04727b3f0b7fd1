package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestStreamingMatchesReference generates through a streaming pool of a
// quarter of the experts and requires the reference's greedy tokens and
// the pool's telemetry.
func TestStreamingMatchesReference(t *testing.T) {
	name := "tiny-qwen3-5-moe"
	e := open(t, name, engine.Options{Experts: engine.ExpertOptions{PoolShare: 0.25}})
	if e.Stream == nil {
		t.Fatalf("PoolShare 0.25 did not stream (%s)", e.ExpertPlan)
	}
	c := testutil.LoadRefs(t, name).Cases[1]
	got, s := generate(t, e, c.Prompt, greedy48, nil)
	if !slices.Equal(got, c.Greedy) {
		t.Fatalf("first difference at %d", testutil.FirstDiff(got, c.Greedy))
	}
	x := s.Experts
	if x == nil || s.Lookahead == nil || x.Misses == 0 || x.BytesRead == 0 || x.PrefillBytesRead == 0 || x.DecodeBytesRead == 0 || x.PoolSlots != e.Stream.Slots() {
		t.Fatalf("expert stats %+v, lookahead %+v", x, s.Lookahead)
	}
	t.Logf("%s; hit rate %.2f, %d bytes read", e.ExpertPlan, x.HitRate, x.BytesRead)
}

// TestMemoryBudget runs a generation in a child process under a --memory-gb
// budget that forces streaming (a quarter of the experts' bytes beyond the
// rest) and requires its peak RSS (VmHWM) within the budget.
func TestMemoryBudget(t *testing.T) {
	if dir := os.Getenv("SLUICE_BUDGET_DIR"); dir != "" {
		budgetChild(t, dir)
		return
	}
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 16)
	c := &man.Config
	st := man.Stores[0]
	all := int64(man.ExpertLayers*man.Experts) * st.Stride
	budget := experts.Overhead + man.DenseBytes + experts.StateBytes(c, 512) + experts.ScratchBytes(c, 64, 2, 512) + all/4
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryBudget$", "-test.v")
	cmd.Env = append(os.Environ(), "SLUICE_BUDGET_DIR="+dir, "SLUICE_BUDGET="+strconv.FormatInt(budget, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var hwm int64 = -1
	for _, line := range strings.Split(string(out), "\n") {
		if _, v, ok := strings.Cut(line, "VmHWM="); ok {
			hwm, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if hwm < 0 {
		t.Fatalf("child printed no VmHWM:\n%s", out)
	}
	t.Logf("budget %.1f MiB (experts %.1f MiB), peak RSS %.1f MiB", float64(budget)/(1<<20), float64(all)/(1<<20), float64(hwm)/(1<<20))
	if hwm > budget {
		t.Errorf("peak RSS %d exceeds the budget %d", hwm, budget)
	}
}

func budgetChild(t *testing.T, dir string) {
	budget, _ := strconv.ParseInt(os.Getenv("SLUICE_BUDGET"), 10, 64)
	e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 2, Ctx: 512, ChunkRows: 64, Experts: engine.ExpertOptions{MemoryBytes: budget}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Stream == nil || e.Stream.Slots() >= e.Model.Manifest.ExpertLayers*e.Model.Manifest.Experts {
		t.Fatalf("budget did not force streaming: %s", e.ExpertPlan)
	}
	prompt := testutil.Prompt(300, e.Model.Config.Vocab)
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Generate(context.Background(), st, prompt, engine.GenOptions{MaxTokens: 64, IgnoreEOS: true}, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println(e.ExpertPlan)
	fmt.Printf("VmHWM=%d\n", testutil.ProcStatus(t, "VmHWM"))
}

// TestMissBitsResident checks that --miss-bits leaves the model directory
// alone, with a note, when every expert fits in memory on the CPU: no
// record is read twice then, so there is nothing for low bits to save.
// With a pool that streams, the low-bit store is derived as before.
func TestMissBitsResident(t *testing.T) {
	dir := testutil.CopyDir(t, testutil.Packed(t, "tiny-qwen3-moe", 4))
	manifest := filepath.Join(dir, format.ManifestFile)
	before, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 2, Device: "cpu", Experts: engine.ExpertOptions{MissBits: 2, Log: &log}})
	if err != nil {
		t.Fatal(err)
	}
	resident := e.Stream == nil
	e.Close()
	if !resident {
		t.Fatalf("--miss-bits 2 with every expert in memory streams them: %s", e.ExpertPlan)
	}
	if !strings.Contains(log.String(), "--miss-bits 2 is unused") {
		t.Errorf("no note that --miss-bits is unused: %q", log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, format.LowStoreFile(2))); !os.IsNotExist(err) {
		t.Errorf("%s was written (%v)", format.LowStoreFile(2), err)
	}
	if after, _ := os.ReadFile(manifest); !bytes.Equal(after, before) {
		t.Errorf("manifest.json was rewritten")
	}

	e, err = engine.Open(context.Background(), dir, engine.Options{Threads: 2, Device: "cpu", Experts: engine.ExpertOptions{MissBits: 2, PoolShare: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	streams := e.Stream != nil
	e.Close()
	if !streams {
		t.Fatalf("a 50%% pool does not stream: %s", e.ExpertPlan)
	}
	if _, err := os.Stat(filepath.Join(dir, format.LowStoreFile(2))); err != nil {
		t.Errorf("a streaming pool with --miss-bits 2 did not derive the low-bit store: %v", err)
	}
}
