//go:build linux

package gpu_test

// Tests of the GPU backend against transformers' references and the CPU
// runner. They skip where there is no GPU. The shared test data is found
// at $SLUICE_SHARED, else ../shared beside the repository root (the GPU
// machine has no copy of the checkout's parent, so its script sets it).

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluicelm/sluice/internal/backend/gpu"
	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/internal/testutil/enginetest"
	"github.com/sluicelm/sluice/internal/testutil/ref"
)

// gpuModels are the models every GPU test runs: the shared checkpoints
// (gpt-oss: sliding windows in rings, sinks, biases everywhere, the top-k
// softmax router, the clamped activation), then the repository's own
// (testutil.Extra): Qwen3-Next, whose pack has Qwen3.5's blocks, and
// GLM-4.5 (attention biases, a dense first layer, the grouped sigmoid
// router).
var gpuModels = []string{"tiny-qwen3-moe", "tiny-qwen3-5-moe", "tiny-gpt-oss", "tiny-qwen3-next", "tiny-glm4-moe", "tiny-deepseek-v32"}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup() // the shared packs (TestSupported's extra models)
	if packDir != "" && os.Getenv("SLUICE_GPU_PACKS") == "" {
		os.RemoveAll(packDir)
	}
	os.Exit(code)
}

// needGPU skips the test where no GPU is usable.
func needGPU(t testing.TB) {
	t.Helper()
	n, err := cuda.Count()
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	if n == 0 {
		t.Skip("no GPU: the driver sees none")
	}
}

func shared(t testing.TB) string {
	t.Helper()
	d := os.Getenv("SLUICE_SHARED")
	if d == "" {
		d = filepath.Join("..", "..", "..", "..", "shared")
	}
	if _, err := os.Stat(d); err != nil {
		t.Skipf("shared test data not found at %s (set SLUICE_SHARED)", d)
	}
	return d
}

var (
	packMu  sync.Mutex
	packDir string
)

// packed packs a shared model, or one of the repository's own
// (testutil.Extra), at bits once per binary ($SLUICE_GPU_PACKS keeps them
// across runs) and returns the directory; it skips the test when the
// shared copy of the model, or the repository's archive, is absent.
func packed(t testing.TB, name string, bits int) string {
	t.Helper()
	return packedFrom(t, name, name, pack.Options{Bits: bits}, func() string { return modelSrc(t, name) })
}

// modelSrc is the checkpoint directory of a shared model or one of the
// repository's own; it skips the test when it is absent.
func modelSrc(t testing.TB, name string) string {
	t.Helper()
	var src string
	if slices.Contains(testutil.Extra, name) {
		if !testutil.ExtraPresent(name) {
			t.Skipf("model %s: its archive is not where the checkout was when this binary was built", name)
		}
		src = testutil.ModelDir(t, name)
	} else {
		src = filepath.Join(shared(t), "models", name)
	}
	if _, err := os.Stat(filepath.Join(src, "config.json")); err != nil {
		t.Skipf("model %s not found in the shared data", name)
	}
	return src
}

// packedFrom is packed for the checkpoint src gives (called only when no
// pack is kept under key), for a test model of name, packed with o.
func packedFrom(t testing.TB, name, key string, o pack.Options, src func() string) string {
	t.Helper()
	modelSrc(t, name)
	packMu.Lock()
	defer packMu.Unlock()
	if packDir == "" {
		packDir = os.Getenv("SLUICE_GPU_PACKS")
		if packDir == "" {
			d, err := os.MkdirTemp("", "sluice-gpu-test-")
			if err != nil {
				t.Fatal(err)
			}
			packDir = d
		}
	}
	dst := filepath.Join(packDir, fmt.Sprintf("%s-%d", key, o.Bits))
	if _, err := os.Stat(filepath.Join(dst, "manifest.json")); err == nil {
		return dst
	}
	o.Force = true
	if err := pack.Pack(context.Background(), src(), dst, o); err != nil {
		t.Fatalf("pack %s at %d bits: %v", key, o.Bits, err)
	}
	return dst
}

func refs(t testing.TB, name string) *testutil.Refs {
	t.Helper()
	if slices.Contains(testutil.Extra, name) {
		return testutil.LoadRefs(t, name)
	}
	b, err := os.ReadFile(filepath.Join(shared(t), "refs", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	r := &testutil.Refs{}
	if err := json.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func open(t testing.TB, dir, device string, rows int) *engine.Engine {
	t.Helper()
	e, err := engine.Open(context.Background(), dir, engine.Options{Device: device, ChunkRows: rows, Threads: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if device == "cuda" && !e.OnGPU() {
		t.Fatalf("device cuda gave %s", e.Device)
	}
	return e
}

// all runs prompt through a fresh state and returns every position's logits.
func all(t testing.TB, e *engine.Engine, prompt []int) []float32 {
	t.Helper()
	st, err := e.Model.NewState(len(prompt) + 1)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(prompt)*e.Model.Config.Vocab)
	if err := e.Fwd.Forward(st, prompt, out, true); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGPUConformance checks exact mode (bf16) on the GPU against
// transformers: argmax per position (a mismatch only where the reference's
// top two are within 1e-3), last logits within 1e-3, and the 48 greedy
// tokens, decoded through the engine (argmax on the device) and through
// the logits (argmax on the host).
func TestGPUConformance(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		t.Run(name, func(t *testing.T) {
			dir := packed(t, name, 16)
			rf := refs(t, name)
			e := open(t, dir, "cuda", 64)
			refRope(e, name)
			V := e.Model.Config.Vocab
			for ci, c := range rf.Cases {
				out := all(t, e, c.Prompt)
				for p := range c.Prompt {
					if got := sample.Argmax(out[p*V : (p+1)*V]); got != c.Argmax[p] {
						if lp := c.Top5Logprobs[p]; math.Abs(lp[0]-lp[1]) > 1e-3 {
							t.Errorf("case %d pos %d: argmax %d, want %d (ref top2 %v)", ci, p, got, c.Argmax[p], lp[:2])
						}
					}
				}
				last := out[(len(c.Prompt)-1)*V:]
				var worst float64
				for i, want := range c.LastLogits {
					worst = math.Max(worst, math.Abs(float64(last[i])-want))
				}
				if ci == 0 {
					t.Logf("case 0: last logits max abs diff %.2e (device %s)", worst, e.Device)
				}
				if worst > 1e-3 {
					t.Errorf("case %d: last logits differ by up to %g", ci, worst)
				}
				// Greedy through the engine: the argmax on the device.
				st, _ := e.NewState()
				got, _, err := e.Generate(context.Background(), st, c.Prompt,
					engine.GenOptions{MaxTokens: len(c.Greedy), Sample: sample.Params{}, IgnoreEOS: true}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if d := testutil.FirstDiff(got, c.Greedy); d >= 0 {
					t.Errorf("case %d: greedy tokens (device argmax) differ at %d\n got %v\nwant %v", ci, d, got, c.Greedy)
				}
				// Greedy through the logits.
				st2, _ := e.Model.NewState(len(c.Prompt) + len(c.Greedy))
				logits := make([]float32, V)
				if err := e.Fwd.Forward(st2, c.Prompt, logits, false); err != nil {
					t.Fatal(err)
				}
				var host []int
				for len(host) < len(c.Greedy) {
					next := sample.Argmax(logits)
					host = append(host, next)
					if err := e.Fwd.Forward(st2, []int{next}, logits, false); err != nil {
						t.Fatal(err)
					}
				}
				if d := testutil.FirstDiff(host, c.Greedy); d >= 0 {
					t.Errorf("case %d: greedy tokens (host argmax) differ at %d\n got %v\nwant %v", ci, d, host, c.Greedy)
				}
			}
		})
	}
}

// refRope rounds e's rope frequencies to bf16 where the model's
// references were computed so: transformers cast the repository's tiny
// Qwen3-Next to bf16 for export, its rotary inverse frequencies included
// (the CPU's TestQwen3NextReferenceRope does the same). The GPU reads them
// as it builds each step's cos and sin.
func refRope(e *engine.Engine, name string) {
	if name != "tiny-qwen3-next" {
		return
	}
	round := func(inv []float32) {
		for i, f := range inv {
			inv[i] = quant.BF16ToF32(quant.BF16(f))
		}
	}
	round(e.Model.Arch.Rope.InvFreq)
	for _, L := range e.Model.Arch.Layers {
		if a, ok := L.Mixer.(*block.Attn); ok && a.Rope != nil {
			round(a.Rope.InvFreq)
		}
	}
}

// TestGPUBatchInvariance requires bit-identical logits on the GPU whether a
// prompt runs in one batch, token by token or in odd-sized chunks.
func TestGPUBatchInvariance(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		for _, bits := range []int{16, 4} {
			t.Run(fmt.Sprintf("%s/%d", name, bits), func(t *testing.T) {
				dir := packed(t, name, bits)
				c := refs(t, name).Cases[0]
				want := all(t, open(t, dir, "cuda", 128), c.Prompt)
				V := len(want) / len(c.Prompt)
				// rows 1 runs every token as a recorded, replayed step;
				// rows -1 runs them one by one launched from the host.
				for _, rows := range []int{1, -1, 7, 13} {
					e := open(t, dir, "cuda", max(rows, 1))
					if rows < 0 {
						e.Fwd.(interface{ SetGraphs(bool) }).SetGraphs(false)
					}
					got := all(t, e, c.Prompt)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("rows %d: logit %d (pos %d) = %v, one batch %v", rows, i, i/V, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// TestGPUSynthBatchInvariance checks batch invariance at real widths, on
// the packed models `sluice synth` writes (SLUICE_GPU_SYNTH=DIR[,DIR...];
// skipped without): where the tiny models' widths keep the batched
// products on the one-matrix kernels, these take the tiled kernel's
// every path (plain products, a chunk's experts grouped in one launch,
// DeepSeek's W_k and W_v a head at a time), and each must give the bits
// of the one-row kernels that a replayed decode step runs, token by
// token. 72 random tokens: a chunk of 64 rows, then one of 8.
func TestGPUSynthBatchInvariance(t *testing.T) {
	dirs := os.Getenv("SLUICE_GPU_SYNTH")
	if dirs == "" {
		t.Skip("set SLUICE_GPU_SYNTH to directories of synthetic packed models")
	}
	needGPU(t)
	for _, dir := range strings.Split(dirs, ",") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			chunked := open(t, dir, "cuda", 64)
			r := rand.New(rand.NewPCG(5, 5))
			prompt := make([]int, 72)
			for i := range prompt {
				prompt[i] = r.IntN(chunked.Model.Config.Vocab)
			}
			want := all(t, chunked, prompt)
			got := all(t, open(t, dir, "cuda", 1), prompt)
			V := chunked.Model.Config.Vocab
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("logit %d at position %d: token by token %v, in chunks %v", i%V, i/V, got[i], want[i])
				}
			}
		})
	}
}

// TestGPUQuantisedNLL compares held-out NLL on the long cases at 4 bits on
// the GPU with exact mode on the GPU (within 4%) and with 4 bits on the CPU
// (within 0.5%).
func TestGPUQuantisedNLL(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		t.Run(name, func(t *testing.T) {
			d16, d4 := packed(t, name, 16), packed(t, name, 4)
			rf := refs(t, name)
			nll := func(dir, device string) float64 { return heldOutNLL(t, open(t, dir, device, 256), rf) }
			g16, g4, c4 := nll(d16, "cuda"), nll(d4, "cuda"), nll(d4, "cpu")
			t.Logf("held-out NLL: GPU bf16 %.5f, GPU q4 %.5f (%+.2f%%), CPU q4 %.5f (GPU %+.3f%%)", g16, g4, 100*(g4/g16-1), c4, 100*(g4/c4-1))
			if d := math.Abs(g4/g16 - 1); d > 0.04 {
				t.Errorf("GPU q4 NLL off bf16 by %.2f%%, want <= 4%%", 100*d)
			}
			if d := math.Abs(g4/c4 - 1); d > 0.005 {
				t.Errorf("GPU q4 NLL off the CPU's q4 by %.3f%%, want <= 0.5%%", 100*d)
			}
		})
	}
}

// heldOutNLL is e's mean NLL over the next tokens of rf's long cases.
func heldOutNLL(t *testing.T, e *engine.Engine, rf *testutil.Refs) float64 {
	t.Helper()
	V := e.Model.Config.Vocab
	var sum float64
	var n int
	for _, c := range rf.Long {
		out := all(t, e, c.Prompt)
		for p := 0; p+1 < len(c.Prompt); p++ {
			sum -= ref.LogSoftmax(out[p*V : (p+1)*V])[c.Prompt[p+1]]
			n++
		}
	}
	return sum / float64(n)
}

// TestGPUQ4MatchesCPU: at 4 bits the GPU's held-out NLL is the CPU's
// within 0.5%, whatever layout the CPU keeps its q4 matrices in (tiled
// where kernels.TiledQ4, or with SLUICE_TILEQ4=1: the upload sends rows
// either way). Only 4-bit packs are needed.
func TestGPUQ4MatchesCPU(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		t.Run(name, func(t *testing.T) {
			d4 := packed(t, name, 4)
			rf := refs(t, name)
			ge := open(t, d4, "cuda", 256)
			g4, c4 := heldOutNLL(t, ge, rf), heldOutNLL(t, open(t, d4, "cpu", 256), rf)
			t.Logf("held-out NLL at 4 bits: GPU %.5f, CPU %.5f (%+.3f%%); host weights tiled: %v", g4, c4, 100*(g4/c4-1), ge.Model.Tiled)
			if d := math.Abs(g4/c4 - 1); d > 0.005 {
				t.Errorf("GPU q4 NLL off the CPU's q4 by %.3f%%, want <= 0.5%%", 100*d)
			}
		})
	}
}

// TestGPURefusals: what the GPU cannot do is refused, not computed
// wrongly: a verify of more drafts than the backend was opened for, a
// commit with no verify armed, and a state changed behind the backend's
// back.
func TestGPURefusals(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	e := open(t, packed(t, name, 4), "cuda", 64)
	c := refs(t, name).Cases[0]
	v, ok := e.Fwd.(interface {
		Speculate(st *model.State, rows int) error
		Commit(st *model.State, n int) error
	})
	if !ok {
		t.Fatalf("the GPU forward %T has no speculative verify", e.Fwd)
	}
	st, _ := e.NewState()
	if err := v.Speculate(st, 3); err == nil || !strings.Contains(err.Error(), "opened for 0") {
		t.Errorf("a verify of 2 drafts on a backend opened for none: %v", err)
	}
	if err := v.Commit(st, 1); err == nil {
		t.Error("a commit with no verify armed: no error")
	}
	a, _ := e.NewState()
	logits := make([]float32, e.Model.Config.Vocab)
	if err := e.Fwd.Forward(a, c.Prompt, logits, false); err != nil {
		t.Fatal(err)
	}
	b, _ := e.NewState()
	if err := b.CopyFrom(a); err != nil {
		t.Fatal(err)
	}
	if err := e.Fwd.Forward(b, c.Prompt[:1], logits, false); err == nil {
		t.Error("a state copied on the host ran on the GPU without an error")
	}
}

// TestGPUSpeed (SLUICE_GPU_BENCH=1) measures prefill of 512 tokens and
// decode of 128 on the GPU and on the CPU (every core), alternating, and
// the phase profile of the GPU's decode.
func TestGPUSpeed(t *testing.T) {
	if os.Getenv("SLUICE_GPU_BENCH") == "" {
		t.Skip("set SLUICE_GPU_BENCH=1")
	}
	needGPU(t)
	for _, name := range gpuModels {
		for _, bits := range []int{4, 16} {
			t.Run(fmt.Sprintf("%s/%d", name, bits), func(t *testing.T) {
				dir := packed(t, name, bits)
				engines := []*engine.Engine{open(t, dir, "cuda", 256), open(t, dir, "cuda", 256), open(t, dir, "cpu", 256)}
				engines[1].Fwd.(interface{ SetGraphs(bool) }).SetGraphs(false)
				label := []string{"GPU graphs", "GPU launches", "CPU"}
				rng := rand.New(rand.NewPCG(1, 2))
				prompt := make([]int, 512)
				for i := range prompt {
					prompt[i] = rng.IntN(engines[0].Model.Config.Vocab - 8)
				}
				res := make([][3][]float64, len(engines)) // per engine: prefill tok/s, decode tok/s, launches per token
				for trial := 0; trial <= 3; trial++ {
					for i, e := range engines {
						pre, dec, lpt := speedTrial(t, e, prompt, 128)
						if trial > 0 {
							res[i][0] = append(res[i][0], pre)
							res[i][1] = append(res[i][1], dec)
							res[i][2] = append(res[i][2], lpt)
						}
					}
				}
				for i, e := range engines {
					fmt.Printf("speed: %s bits %d %-12s %-24s threads %d: prefill 512 %.0f tok/s, decode 128 %.0f tok/s (medians of 3: %v / %v), launches per decode token %.0f\n",
						name, bits, label[i], e.Device, e.Runner.Pool.Threads(), median(res[i][0]), median(res[i][1]), round(res[i][0]), round(res[i][1]), median(res[i][2]))
				}
				fmt.Printf("speed: %s bits %d GPU/CPU: prefill %.2fx, decode %.2fx (graphs), %.2fx (launches)\n", name, bits,
					median(res[0][0])/median(res[2][0]), median(res[0][1])/median(res[2][1]), median(res[1][1])/median(res[2][1]))
				for i, e := range engines[:2] {
					if p, ok := e.Fwd.(engine.Profiler); ok {
						if err := p.EnableProfile(8192); err != nil {
							t.Fatal(err)
						}
						speedTrial(t, e, prompt, 129) // the decode resets the totals first
						fmt.Printf("speed: %s bits %d decode, %s: %s", name, bits, label[i], p.Profile())
					}
				}
			})
		}
	}
}

// speedTrial prefills prompt from an empty context and decodes gen tokens
// greedily after it, as sluice bench does.
func speedTrial(t testing.TB, e *engine.Engine, prompt []int, gen int) (pre, dec, launchesPerToken float64) {
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := e.NewSequence(st, engine.GenOptions{MaxTokens: gen, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	l0 := e.Launches()
	if p, ok := e.Fwd.(engine.Profiler); ok {
		p.ResetProfile()
	}
	for !q.Done() {
		if _, _, err := q.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s := q.Stats()
	return s.PrefillTokS, s.DecodeTokS, float64(e.Launches()-l0) / float64(max(s.GeneratedTokens-1, 1))
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func round(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x)
	}
	return out
}

// TestGPUNonFiniteLogits: a model whose weights are corrupt (every byte
// of dense.bin 0xFF: NaN scales and values) computes NaN logits on the
// GPU too, through each family's router (whose ids must stay in range:
// TestRouteNaN), and generation, greedy (the device's argmax, graphs on
// and off, and MTP verifies where the model has a head) and sampled, and
// scoring refuse it, as the CPU does, instead of answering token 0
// forever.
func TestGPUNonFiniteLogits(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		t.Run(name, func(t *testing.T) {
			dir := testutil.CopyDir(t, packed(t, name, 4))
			enginetest.NaNWeights(t, dir)
			e := open(t, dir, "cuda", 64)
			for _, graphs := range []bool{true, false} {
				e.Fwd.(interface{ SetGraphs(bool) }).SetGraphs(graphs)
				enginetest.RequireNotFinite(t, e, fmt.Sprintf("graphs %v, ", graphs))
			}
		})
	}
}

// TestGPUDecodeAllocs: a decode step on the GPU allocates nothing on the
// host (the device's memory is all allocated when the model and the
// sequence state first run).
func TestGPUDecodeAllocs(t *testing.T) {
	needGPU(t)
	name := gpuModels[0]
	e := open(t, packed(t, name, 4), "cuda", 64)
	am, ok := e.Fwd.(interface {
		ForwardArgmax(st *model.State, tokens []int) (int, error)
	})
	if !ok {
		t.Fatal("the GPU forward has no ForwardArgmax")
	}
	st, _ := e.NewState()
	c := refs(t, name).Cases[0]
	next, err := am.ForwardArgmax(st, c.Prompt)
	if err != nil {
		t.Fatal(err)
	}
	tok := []int{next}
	for _, graphs := range []bool{true, false} {
		e.Fwd.(interface{ SetGraphs(bool) }).SetGraphs(graphs)
		var ferr error
		allocs := testing.AllocsPerRun(20, func() {
			tok[0], ferr = am.ForwardArgmax(st, tok)
		})
		if ferr != nil {
			t.Fatal(ferr)
		}
		if allocs != 0 {
			t.Errorf("graphs %v: a decode step allocates %.1f times", graphs, allocs)
		}
	}
}

// TestGPUExpertPool streams the experts through device pools of one
// token's experts of a layer (top-k records, so a prefill chunk runs in
// many waves), a quarter of the store and all of it, with some or all of
// a decode row's misses multiplied on the CPU (q4), and requires the
// logits of a prompt (in one chunk and token by token) and the greedy
// tokens after it to be the resident upload's bits; the pool's counts
// must add up, and a pool below top-k records is refused.
func TestGPUExpertPool(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		for _, bits := range []int{4, 16} {
			t.Run(fmt.Sprintf("%s/%d", name, bits), func(t *testing.T) {
				dir := packed(t, name, bits)
				c := refs(t, name).Cases[0]
				res := open(t, dir, "cuda", 64)
				if p, ok := res.DevicePool(); !ok || p.Slots != 0 {
					t.Fatalf("resident upload reports a pool: %+v, %v", p, ok)
				}
				want := all(t, res, c.Prompt)
				wantGen := greedy(t, res, c.Prompt, 16)
				quarter := openPool(t, dir, 64, engine.ExpertOptions{GPUPoolShare: 0.25})
				p, _ := quarter.DevicePool()
				K := res.Model.Config.TopK
				if p.Slots != p.Records/4 || p.RecordBytes <= 0 {
					t.Fatalf("a quarter pool: %+v", p)
				}
				pools := map[string]engine.ExpertOptions{
					"topk":    {GPUPoolBytes: int64(K * p.RecordBytes)},
					"quarter": {GPUPoolShare: 0.25},
					"all":     {GPUPoolShare: 1},
					// Three tiers: a tenth in the GPU's pool, a quarter in
					// the host's, the rest read from experts.bin; copies
					// straight from the host pool's page-locked slots, or
					// through the staging.
					"tiers":         {GPUPoolShare: 0.1, PoolShare: 0.25},
					"tiers, staged": {GPUPoolShare: 0.1, PoolShare: 0.25},
					// Both pools at their least, top-k records: every host
					// slot a copy reads from is soon refilled, so a copy
					// that was not done before its slot's next read would
					// show in the logits.
					"tiers, least": {GPUPoolBytes: int64(K * p.RecordBytes), PoolBytes: int64(K * p.RecordBytes)},
					// --lookahead=false turns the GPU's lookahead off too.
					"quarter, no lookahead": {GPUPoolShare: 0.25, NoLookahead: true},
				}
				// The CPU's products of misses add no biases and run
				// SwiGLU: with gpt-oss's experts a share is refused and
				// the cost model leaves every miss to the GPU.
				cpuMisses := res.Model.Manifest.Stores[0].GateBias == nil
				if bits == 4 && !cpuMisses {
					if _, err := engine.Open(context.Background(), dir, engine.Options{Device: "cuda", Experts: engine.ExpertOptions{GPUPoolShare: 0.25, GPUCPUShare: 0.5}}); err == nil || !strings.Contains(err.Error(), "without biases") {
						t.Errorf("a CPU share of the misses of experts with biases: %v", err)
					}
					pools["quarter, auto"] = engine.ExpertOptions{GPUPoolShare: 0.25, GPUCPUAuto: true}
				} else if bits == 4 {
					// The host's CPU multiplies half of a decode row's
					// misses, or all of them from the host's pool.
					pools["quarter, hybrid"] = engine.ExpertOptions{GPUPoolShare: 0.25, GPUCPUShare: 0.5}
					pools["tiers, hybrid"] = engine.ExpertOptions{GPUPoolShare: 0.1, PoolShare: 0.25, GPUCPUShare: 1}
					// The cost model picks the share, through the GPU's
					// pool alone and through both tiers (the CPU's records
					// then lie in the host's pool, computed before its next
					// call recycles them).
					pools["quarter, auto"] = engine.ExpertOptions{GPUPoolShare: 0.25, GPUCPUAuto: true}
					pools["tiers, auto"] = engine.ExpertOptions{GPUPoolShare: 0.1, PoolShare: 0.25, GPUCPUAuto: true}
				} else if _, err := engine.Open(context.Background(), dir, engine.Options{Device: "cuda", Experts: engine.ExpertOptions{GPUPoolShare: 0.25, GPUCPUShare: 0.5}}); err == nil || !strings.Contains(err.Error(), "q4 experts only") {
					t.Errorf("a CPU share of the misses of %d-bit experts: %v", bits, err)
				}
				for pname, xo := range pools {
					for _, rows := range []int{64, 1} {
						staged := pname == "tiers, staged"
						if staged {
							t.Setenv("SLUICE_GPU_STAGE", "1")
						}
						e := openPool(t, dir, rows, xo)
						if staged {
							os.Unsetenv("SLUICE_GPU_STAGE")
						}
						got := all(t, e, c.Prompt)
						V := len(want) / len(c.Prompt)
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("pool %s, rows %d: logit %d (pos %d) = %v, resident %v", pname, rows, i, i/V, got[i], want[i])
							}
						}
						gen := greedy(t, e, c.Prompt, 16)
						if d := testutil.FirstDiff(gen, wantGen); d >= 0 {
							t.Fatalf("pool %s, rows %d: greedy tokens differ at %d\n got %v\nwant %v", pname, rows, d, gen, wantGen)
						}
						ps, _ := e.DevicePool()
						t.Logf("pool %s (%d of %d records), rows %d: %d hits, %d misses, %.1f MB copied; decode %d hits, %d misses; host pinned %v %s",
							pname, ps.Slots, ps.Records, rows, ps.Hits, ps.Misses, float64(ps.BytesUp)/1e6,
							ps.DecodeHits, ps.DecodeMisses, ps.HostPinned, ps.PinNote)
						t.Logf("  lookahead: %d prefetched, %d used, %d held back; %d misses computed on the CPU (%.3f ms a flush's first, %.3f ms a further one, %.3f ms a record copied); %.2f ms waited for copies", ps.Prefetched, ps.PrefetchUsed, ps.PrefetchSkipped, ps.CPUComputed, ps.CPUFirstMS, ps.CPUExpertMS, ps.CopyRecordMS, ps.CopyWaitMS)
						tiers := strings.HasPrefix(pname, "tiers")
						if tiers != (e.Stream != nil) {
							t.Errorf("pool %s: host stream %v", pname, e.Stream != nil)
						}
						// The host pool's memory is page-locked unless staging
						// is asked for (its records are tiled only when it
						// holds them all).
						if tiers && ps.HostPinned == staged {
							t.Errorf("pool %s: host pinned %v (%s)", pname, ps.HostPinned, ps.PinNote)
						}
						// Misses the CPU computed (rows of one row) are not copied.
						if hybrid := (xo.GPUCPUShare > 0 || xo.GPUCPUAuto) && cpuMisses; hybrid != (ps.CPUComputed > 0) || ps.CPUComputed > ps.DecodeMisses {
							t.Errorf("pool %s, rows %d: the CPU computed %d of %d decode misses", pname, rows, ps.CPUComputed, ps.DecodeMisses)
						}
						// The CPU's time per expert is measured wherever it
						// computes; the link's for the cost model (whose
						// first layer with misses gives the CPU one).
						if hybrid, auto := (xo.GPUCPUShare > 0 || xo.GPUCPUAuto) && cpuMisses, xo.GPUCPUAuto && cpuMisses; hybrid != (ps.CPUFirstMS > 0) || auto != (ps.CopyRecordMS > 0) {
							t.Errorf("pool %s, rows %d: cost model %.3f ms a flush's first expert on the CPU, %.3f ms a record copied", pname, rows, ps.CPUFirstMS, ps.CopyRecordMS)
						}
						if ps.DecodeHits+ps.DecodeMisses == 0 || ps.DecodeBytesUp != (ps.DecodeMisses-ps.CPUComputed+ps.Prefetched)*uint64(ps.RecordBytes) {
							t.Errorf("pool %s: decode counts %d hits, %d misses, %d bytes", pname, ps.DecodeHits, ps.DecodeMisses, ps.DecodeBytesUp)
						}
						if ps.Misses == 0 || ps.BytesUp != (ps.Misses-ps.CPUComputed+ps.Prefetched)*uint64(ps.RecordBytes) {
							t.Errorf("pool %s: %d misses (%d on the CPU) and %d prefetches moved %d bytes of %d-byte records", pname, ps.Misses, ps.CPUComputed, ps.Prefetched, ps.BytesUp, ps.RecordBytes)
						}
						// The decode's lookahead copies from a page-locked host
						// store (not a tiled one) into slots the step does not
						// hold: a quarter pool has some, top-k slots none.
						// Copies a layer's poor predictions held back count
						// as skipped; with the lookahead off there are none.
						none := !ps.HostPinned || pname == "topk" || xo.NoLookahead
						if none && ps.Prefetched > 0 || !none && pname == "quarter" && ps.Prefetched == 0 || ps.PrefetchUsed > ps.Prefetched ||
							xo.NoLookahead && ps.PrefetchSkipped > 0 {
							t.Errorf("pool %s, rows %d: %d prefetched, %d used, %d held back (host pinned %v)", pname, rows, ps.Prefetched, ps.PrefetchUsed, ps.PrefetchSkipped, ps.HostPinned)
						}
						if pname == "topk" && ps.Slots != K {
							t.Errorf("pool topk has %d slots, want %d", ps.Slots, K)
						}
						// With no hits to compute first, every wave waits
						// for its copies.
						if pname == "topk" && !(ps.CopyWaitMS > 0) || ps.DecodeCopyWaitMS > ps.CopyWaitMS || ps.CopyWaitMS < 0 {
							t.Errorf("pool %s, rows %d: waited %.3f ms for copies, %.3f ms of it decoding", pname, rows, ps.CopyWaitMS, ps.DecodeCopyWaitMS)
						}
						if pname == "all" && ps.Misses > uint64(ps.Records) {
							t.Errorf("a pool of every record missed %d times (%d records)", ps.Misses, ps.Records)
						}
						// top-k slots hold one layer's experts, which the next
						// layer replaces: only the larger pools can hit.
						if ps.Slots > K && ps.Hits == 0 {
							t.Errorf("pool %s: no hits", pname)
						}
					}
				}
				_, err := engine.Open(context.Background(), dir, engine.Options{Device: "cuda", ChunkRows: 64,
					Experts: engine.ExpertOptions{GPUPoolBytes: int64((K - 1) * p.RecordBytes)}})
				if err == nil || !strings.Contains(err.Error(), "at least") {
					t.Errorf("a pool of top-k − 1 records: %v", err)
				}
			})
		}
	}
}

// TestGPUTiledStore runs a store whose q4 records lie tiled on disk
// (sluice pack --layout tiled) on the GPU, whose kernels read rows in
// order: resident, through the GPU's pool alone, through both tiers, and
// with the host's CPU computing misses. Its logits are the row-major
// store's resident ones, bit for bit, so every path that reads a tiled
// record (the upload, the staging of a miss, the host pool's landing, the
// CPU's product) lays it out as it reads it.
func TestGPUTiledStore(t *testing.T) {
	needGPU(t)
	for _, name := range gpuModels {
		t.Run(name, func(t *testing.T) {
			rows := packed(t, name, 4)
			tiled := packedFrom(t, name, name+"-tiled", pack.Options{Bits: 4, Layout: pack.LayoutTiled}, func() string { return modelSrc(t, name) })
			m, err := format.ReadManifest(tiled)
			if err != nil {
				t.Fatal(err)
			}
			if !m.Stores[0].Tiled() {
				t.Fatalf("%s: --layout tiled stored no matrix tiled", name)
			}
			c := refs(t, name).Cases[0]
			want := all(t, open(t, rows, "cuda", 64), c.Prompt)
			pools := map[string]engine.ExpertOptions{
				"resident": {},
				"quarter":  {GPUPoolShare: 0.25},
				"tiers":    {GPUPoolShare: 0.1, PoolShare: 0.25},
			}
			if m.Stores[0].GateBias == nil {
				pools["tiers, hybrid"] = engine.ExpertOptions{GPUPoolShare: 0.1, PoolShare: 0.25, GPUCPUShare: 1}
			}
			for pname, xo := range pools {
				for _, n := range []int{64, 1} {
					e := openPool(t, tiled, n, xo)
					got := all(t, e, c.Prompt)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s, rows %d: logit %d = %v, the row-major store's %v", pname, n, i, got[i], want[i])
						}
					}
					if ps, ok := e.DevicePool(); ok && ps.Slots > 0 {
						if ps.Misses == 0 {
							t.Errorf("%s, rows %d: a pool of %d of %d records missed nothing", pname, n, ps.Slots, ps.Records)
						}
						t.Logf("%s, rows %d: %d misses, %d on the CPU; host pinned %v %s", pname, n, ps.Misses, ps.CPUComputed, ps.HostPinned, ps.PinNote)
					}
				}
			}
		})
	}
}

func openPool(t testing.TB, dir string, rows int, xo engine.ExpertOptions) *engine.Engine {
	t.Helper()
	return openCUDA(t, dir, engine.Options{ChunkRows: rows, Experts: xo})
}

// openCUDA opens dir on the GPU with o.
func openCUDA(t testing.TB, dir string, o engine.Options) *engine.Engine {
	t.Helper()
	o.Device = "cuda"
	e, err := engine.Open(context.Background(), dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if !e.OnGPU() {
		t.Fatalf("device cuda gave %s", e.Device)
	}
	return e
}

// resume prefills rest after what st holds and generates with o.
func resume(t testing.TB, e *engine.Engine, st *model.State, rest []int, o engine.GenOptions) []int {
	t.Helper()
	ctx := context.Background()
	q, err := e.NewSequence(st, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Prefill(ctx, rest); err != nil {
		t.Fatal(err)
	}
	for !q.Done() {
		if _, _, err := q.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return q.Tokens()
}

// greedy decodes n tokens after prompt through the engine (argmax on the
// device).
func greedy(t testing.TB, e *engine.Engine, prompt []int, n int) []int {
	t.Helper()
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := e.Generate(context.Background(), st, prompt, engine.GenOptions{MaxTokens: n, IgnoreEOS: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestGPUVRAMBudget opens a model for two sequences at once under a
// --vram-gb budget that holds its dense weights, scratch, the runner's
// reserve, two sequence states and about a quarter of its experts (less
// where the runner's kernels and scratch are near the experts' size),
// measured against what the resident upload took: the experts stream
// through a pool, the device memory taken (cuMemGetInfo, after two
// sequences prefilled and decoded in turns) stays within the budget, and
// each sequence's greedy tokens are the resident upload's. A budget below
// the dense weights is refused by name. It assumes nothing else allocates
// on the GPU meanwhile (go test -p 1 on a GPU machine).
func TestGPUVRAMBudget(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	dir := packed(t, name, 4)
	cases := refs(t, name).Cases[:2]
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	free := func() int64 {
		var f int64
		if err := dev.Do(func() (err error) { f, _, err = dev.MemInfo(); return err }); err != nil {
			t.Fatal(err)
		}
		return f
	}
	taken := func(run func()) int64 {
		f0 := free()
		run()
		return f0 - free()
	}
	// interleaved prefills each case on a state of its own, then decodes
	// them a token each in turn.
	interleaved := func(e *engine.Engine) [][]int {
		qs := make([]*engine.Sequence, len(cases))
		for i, c := range cases {
			st, err := e.NewState()
			if err != nil {
				t.Fatal(err)
			}
			if qs[i], err = e.NewSequence(st, engine.GenOptions{MaxTokens: 16, IgnoreEOS: true}); err != nil {
				t.Fatal(err)
			}
			if err := qs[i].Prefill(context.Background(), c.Prompt); err != nil {
				t.Fatal(err)
			}
		}
		for more := true; more; {
			more = false
			for _, q := range qs {
				if q.Done() {
					continue
				}
				if _, _, err := q.Step(context.Background()); err != nil {
					t.Fatal(err)
				}
				more = true
			}
		}
		out := make([][]int, len(qs))
		for i, q := range qs {
			out[i] = q.Tokens()
		}
		return out
	}
	// A short context keeps a state to a few dozen records of the pool.
	opts := engine.Options{Device: "cuda", ChunkRows: 64, Ctx: 512, States: len(cases)}
	var want [][]int
	var res *engine.Engine
	resident := taken(func() {
		if res, err = engine.Open(context.Background(), dir, opts); err != nil {
			t.Fatal(err)
		}
		want = interleaved(res)
	})
	dense, exps := gpu.NeedBytes(res.Model)
	states := int64(len(cases)) * experts.StateBytes(&res.Model.Config, res.Ctx)
	K, rec := res.Model.Config.TopK, res.Model.Manifest.Stores[0].Stride
	res.Close()
	// What the resident runner took beside its weights and states (its
	// scratch and kernels), which a pooled one takes too.
	rest := max(resident-dense-exps-states, 0)
	budget := dense + rest + states + gpu.ScratchReserve + exps/4
	// The runner judges whether the experts fit by ScratchReserve, not by
	// rest, and this tiny model's experts (12 MiB) are about rest's size:
	// keep the budget a record below what it counts for a whole upload
	// with one state, so that the experts stream with one state or two.
	budget = min(budget, dense+exps+states/int64(len(cases))+gpu.ScratchReserve-rec)
	opts.Experts.VRAMBytes = budget
	var e *engine.Engine
	var got [][]int
	used := taken(func() {
		if e, err = engine.Open(context.Background(), dir, opts); err != nil {
			t.Fatal(err)
		}
		got = interleaved(e)
	})
	p, _ := e.DevicePool()
	e.Close()
	t.Logf("budget %.1f MiB (resident took %.1f MiB: dense %.1f, experts %.1f, 2 states %.1f); took %.1f MiB with a pool of %d of %d records",
		float64(budget)/(1<<20), float64(resident)/(1<<20), float64(dense)/(1<<20), float64(exps)/(1<<20), float64(states)/(1<<20), float64(used)/(1<<20), p.Slots, p.Records)
	if p.Slots < K || p.Slots >= p.Records {
		t.Errorf("a budget of a quarter of the experts gave a pool of %d of %d records", p.Slots, p.Records)
	}
	if used > budget {
		t.Errorf("took %d bytes of device memory, over the budget of %d", used, budget)
	}
	for i := range cases {
		if d := testutil.FirstDiff(got[i], want[i]); d >= 0 {
			t.Errorf("case %d: greedy tokens under the budget differ from the resident upload's at %d", i, d)
		}
	}
	// The pool leaves room for every state asked for: one state fewer, a
	// state's worth of records more.
	one := opts
	one.States = 1
	e1, err := engine.Open(context.Background(), dir, one)
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := e1.DevicePool()
	e1.Close()
	if d, want := p1.Slots-p.Slots, states/2/rec; int64(d) < want-1 || int64(d) > want+1 {
		t.Errorf("one state instead of two gave %d more slots, want about %d (a state's %d bytes over records of %d)", d, want, states/2, rec)
	}
	opts.Experts.VRAMBytes = dense + int64(K)*rec
	_, err = engine.Open(context.Background(), dir, opts)
	if err == nil || !strings.Contains(err.Error(), "--vram-gb") {
		t.Errorf("a budget below the dense weights, scratch and top-k records: %v", err)
	}
}

// TestGPUHostBudget runs a generation on the GPU in a child process under
// a --memory-gb budget that makes the host stream its experts (a quarter
// of their bytes beyond the rest) and the GPU pool a tenth of them, and
// requires the process's peak RSS (VmHWM) within the budget beyond what
// the CUDA driver took as it opened the device (measured in the child
// first): the host pool, page-locked for the GPU's copies, is the
// budget's, and no staging is allocated beside it.
func TestGPUHostBudget(t *testing.T) {
	needGPU(t)
	if dir := os.Getenv("SLUICE_GPU_BUDGET_DIR"); dir != "" {
		hostBudgetChild(t, dir)
		return
	}
	dir := packed(t, gpuModels[1], 4)
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &man.Config
	all := int64(man.ExpertLayers*man.Experts) * man.Stores[0].Stride
	budget := experts.Overhead + man.DenseBytes + experts.StateBytes(c, 512) + experts.ScratchBytes(c, 64, 0, 512) +
		experts.PolicyBytes("", man.ExpertLayers, man.Experts) + all/4
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUHostBudget$", "-test.v")
	cmd.Env = append(os.Environ(), "SLUICE_GPU_BUDGET_DIR="+dir, "SLUICE_GPU_BUDGET="+strconv.FormatInt(budget, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	hwm, base := int64(-1), int64(-1)
	for _, line := range strings.Split(string(out), "\n") {
		if _, v, ok := strings.Cut(line, "VmHWM="); ok {
			fmt.Sscanf(v, "%d driver=%d", &hwm, &base)
		}
	}
	if hwm < 0 || base < 0 {
		t.Fatalf("child printed no VmHWM:\n%s", out)
	}
	t.Logf("budget %.1f MiB (experts %.1f MiB); the driver took %.1f MiB, the peak RSS was %.1f MiB beyond it",
		float64(budget)/(1<<20), float64(all)/(1<<20), float64(base)/(1<<20), float64(hwm-base)/(1<<20))
	if hwm-base > budget {
		t.Errorf("peak RSS %d beyond the driver's %d exceeds the budget %d", hwm-base, base, budget)
	}
}

func hostBudgetChild(t *testing.T, dir string) {
	budget, _ := strconv.ParseInt(os.Getenv("SLUICE_GPU_BUDGET"), 10, 64)
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	base := testutil.ProcStatus(t, "VmRSS")
	e, err := engine.Open(context.Background(), dir, engine.Options{Device: "cuda", Ctx: 512, ChunkRows: 64,
		Experts: engine.ExpertOptions{MemoryBytes: budget, GPUPoolShare: 0.1}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p, _ := e.DevicePool()
	if e.Stream == nil || !e.OnGPU() || p.Slots == 0 || !p.HostPinned {
		t.Fatalf("want the host streaming into a GPU pool from page-locked memory: %s, device %s, %+v", e.ExpertPlan, e.Device, p)
	}
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	prompt := testutil.Prompt(300, e.Model.Config.Vocab)
	if _, _, err := e.Generate(context.Background(), st, prompt, engine.GenOptions{MaxTokens: 64, IgnoreEOS: true}, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println(e.ExpertPlan)
	fmt.Printf("VmHWM=%d driver=%d\n", testutil.ProcStatus(t, "VmHWM"), base)
}

// TestGPUPoolReadError streams through three tiers (a tenth of the
// experts on the GPU, a quarter in the host's pool, the rest on disk) from
// a copy of the model, empties its experts.bin mid-run, and requires the
// generation to fail with the read's error rather than give tokens; with
// the file restored, the next generation gives the resident upload's
// tokens, so no slot kept a record whose read or copy failed.
func TestGPUPoolReadError(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	src := packed(t, name, 4)
	c := refs(t, name).Cases[0]
	want := greedy(t, open(t, src, "cuda", 64), c.Prompt, 16)
	dir := testutil.CopyDir(t, src)
	e := openPool(t, dir, 64, engine.ExpertOptions{GPUPoolShare: 0.1, PoolShare: 0.25})
	if e.Stream == nil {
		t.Fatalf("no host stream: %s", e.ExpertPlan)
	}
	store := filepath.Join(dir, e.Model.Manifest.Stores[0].File)
	whole, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(store, 0); err != nil {
		t.Fatal(err)
	}
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := e.Generate(context.Background(), st, c.Prompt, engine.GenOptions{MaxTokens: 16, IgnoreEOS: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "reading layer") {
		t.Fatalf("generation over an emptied experts.bin: tokens %v, error %v; want the read's error", got, err)
	}
	t.Logf("emptied store: %v", err)
	if err := os.WriteFile(store, whole, 0o644); err != nil {
		t.Fatal(err)
	}
	if d := testutil.FirstDiff(greedy(t, e, c.Prompt, 16), want); d >= 0 {
		t.Errorf("after the failed reads, greedy tokens differ from the resident upload's at %d", d)
	}
}

// TestGPUCopyState: a state prefilled on the GPU with half a prompt and
// copied (through a state of just those positions, as the server's prefix
// cache keeps one) resumes exactly: after the rest of the prompt its
// greedy tokens are those of the whole prompt run at once, with every
// expert resident and through a pool. A state copied on the host alone
// has no device copy to give, and copying from it is refused. gpt-oss's
// sliding windows keep rings of 96 rows here (a window of 32 and steps of
// 64 rows): its copy starts from 120 positions, so the rings have wrapped
// and the saved state is a ring too. DeepSeek-V3.2's copy of 80
// positions carries latents and indexer keys past its top-k of 64, which
// the resumed rows then choose among.
func TestGPUCopyState(t *testing.T) {
	needGPU(t)
	for _, m := range []struct {
		name     string
		cs, keep int // the case, and the positions copied (0: half)
	}{{gpuModels[1], 1, 0}, {"tiny-gpt-oss", 3, 120}, {"tiny-deepseek-v32", 0, 80}} {
		t.Run(m.name, func(t *testing.T) { copyState(t, m.name, m.cs, m.keep) })
	}
}

func copyState(t *testing.T, name string, cs, keep int) {
	dir := packed(t, name, 4)
	c := refs(t, name).Cases[cs]
	ctx := context.Background()
	for _, xo := range []engine.ExpertOptions{{}, {GPUPoolShare: 0.25}} {
		e := openPool(t, dir, 64, xo)
		want := greedy(t, e, c.Prompt, 16)
		n := len(c.Prompt) / 2
		if keep > 0 {
			n = keep
		}
		a, err := e.NewState()
		if err != nil {
			t.Fatal(err)
		}
		qa, err := e.NewSequence(a, engine.GenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := qa.Prefill(ctx, c.Prompt[:n]); err != nil {
			t.Fatal(err)
		}
		saved, err := e.Model.NewState(n)
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.NewState()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.CopyState(saved, a); err != nil {
			t.Fatal(err)
		}
		if err := e.CopyState(b, saved); err != nil {
			t.Fatal(err)
		}
		if got := resume(t, e, b, c.Prompt[n:], engine.GenOptions{MaxTokens: 16, IgnoreEOS: true}); testutil.FirstDiff(got, want) >= 0 {
			t.Errorf("pool %+v: resumed from a copied state, greedy tokens differ at %d\n got %v\nwant %v", xo, testutil.FirstDiff(got, want), got, want)
		}
		hostOnly, err := e.NewState()
		if err != nil {
			t.Fatal(err)
		}
		if err := hostOnly.CopyFrom(a); err != nil {
			t.Fatal(err)
		}
		if err := e.CopyState(b, hostOnly); err == nil {
			t.Errorf("pool %+v: copying a state with no device copy: no error", xo)
		}
	}
}

// TestGPUMissBits runs --miss-bits 3 and 2 on the GPU. With both
// lookaheads off every record reaches the host's pool as a demand miss,
// at low bits, so every expert the GPU multiplies (prefill and decode,
// from slots of the GPU's pool at top-k records or at a quarter) is a
// low-bit one: the logits must then be, bit for bit, those of the
// resident upload of a copy of the model whose store holds the low-bit
// records widened to q4, and each copy moves a low-bit record's bytes.
// With the lookaheads on, some records arrive whole (the host's lookahead
// reads the main store); the counts must still add up.
func TestGPUMissBits(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	src := packed(t, name, 4)
	c := refs(t, name).Cases[0]
	for _, bits := range []int{3, 2} {
		t.Run(fmt.Sprint(bits), func(t *testing.T) {
			dir := testutil.CopyDir(t, src)
			if err := pack.AddLowBits(context.Background(), dir, bits, nil); err != nil {
				t.Fatal(err)
			}
			wide := widenedPack(t, dir, bits)
			res := open(t, wide, "cuda", 64)
			want := all(t, res, c.Prompt)
			wantGen := greedy(t, res, c.Prompt, 16)
			man, err := format.ReadManifest(dir)
			if err != nil {
				t.Fatal(err)
			}
			low, err := experts.LowStore(man, bits)
			if err != nil {
				t.Fatal(err)
			}
			K := man.Config.TopK
			stride := man.Stores[0].Stride
			for pname, xo := range map[string]engine.ExpertOptions{
				"topk":    {GPUPoolBytes: int64(K) * stride},
				"quarter": {GPUPoolShare: 0.25},
				// The host's CPU multiplies half of a decode row's
				// misses from their low-bit records, with the same bits.
				"quarter, hybrid": {GPUPoolShare: 0.25, GPUCPUShare: 0.5},
			} {
				xo.MissBits, xo.NoLookahead = bits, true
				for _, rows := range []int{64, 1} {
					e := openPool(t, dir, rows, xo)
					if e.Stream == nil || e.Stream.Options().MissBits != bits {
						t.Fatalf("pool %s: the host does not stream at %d bits", pname, bits)
					}
					got := all(t, e, c.Prompt)
					V := len(want) / len(c.Prompt)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("pool %s, rows %d: logit %d (pos %d) = %v, widened store resident %v", pname, rows, i, i/V, got[i], want[i])
						}
					}
					if gen := greedy(t, e, c.Prompt, 16); testutil.FirstDiff(gen, wantGen) >= 0 {
						t.Fatalf("pool %s, rows %d: greedy tokens\n got %v\nwant %v", pname, rows, gen, wantGen)
					}
					ps, _ := e.DevicePool()
					t.Logf("pool %s (%d slots), rows %d: %d hits, %d misses (%d on the CPU), %d low-bit copies, %.2f MB copied",
						pname, ps.Slots, rows, ps.Hits, ps.Misses, ps.CPUComputed, ps.LowCopies, float64(ps.BytesUp)/1e6)
					if ps.Misses == 0 || ps.LowCopies != ps.Misses-ps.CPUComputed || ps.Prefetched != 0 || ps.BytesUp != ps.LowCopies*uint64(low.Stride) {
						t.Errorf("pool %s: %d misses (%d on the CPU), %d low-bit copies, %d prefetched, %d bytes of %d-byte records",
							pname, ps.Misses, ps.CPUComputed, ps.LowCopies, ps.Prefetched, ps.BytesUp, low.Stride)
					}
					if hybrid := xo.GPUCPUShare > 0; hybrid != (ps.CPUComputed > 0) {
						t.Errorf("pool %s, rows %d: the CPU computed %d misses", pname, rows, ps.CPUComputed)
					}
				}
			}
			// Lookaheads on: whole records arrive beside low-bit ones.
			e := openPool(t, dir, 64, engine.ExpertOptions{GPUPoolShare: 0.25, MissBits: bits})
			gen := greedy(t, e, c.Prompt, 16)
			ps, _ := e.DevicePool()
			whole := ps.Misses + ps.Prefetched - ps.LowCopies
			t.Logf("lookahead on: %d misses, %d prefetched, %d low-bit copies; tokens %v (widened %v)", ps.Misses, ps.Prefetched, ps.LowCopies, gen, wantGen)
			if ps.LowCopies == 0 || ps.LowCopies > ps.Misses+ps.Prefetched || ps.BytesUp != ps.LowCopies*uint64(low.Stride)+whole*uint64(stride) {
				t.Errorf("lookahead on: %d misses, %d prefetched, %d low-bit copies, %d bytes", ps.Misses, ps.Prefetched, ps.LowCopies, ps.BytesUp)
			}
		})
	}
}

// widenedPack copies the packed model dir with its main expert store
// replaced by the low-bit store of bits widened to the main kind
// (experts.ExpandLow): the values --miss-bits multiplies, in q4 records.
func widenedPack(t *testing.T, dir string, bits int) string {
	t.Helper()
	w := testutil.CopyDir(t, dir)
	man, err := format.ReadManifest(w)
	if err != nil {
		t.Fatal(err)
	}
	st := &man.Stores[0]
	low, err := experts.LowStore(man, bits)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := os.ReadFile(filepath.Join(w, low.File))
	if err != nil {
		t.Fatal(err)
	}
	n := man.ExpertLayers * man.Experts
	out := make([]byte, int64(n)*st.Stride)
	for i := range n {
		if err := experts.ExpandLow(out[int64(i)*st.Stride:int64(i+1)*st.Stride], lb[int64(i)*low.Stride:int64(i+1)*low.Stride], st, low); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(w, st.File), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// cutting is a host provider that cuts (gives nil for) every expert whose
// id is a multiple of 3, as a host pool with --cut-weak cuts a late weak
// miss, over the store held whole; it is a hostPool, so the GPU's pool
// takes its cuts, and it requires the routing weights a cut is judged by.
type cutting struct {
	model.Provider
	mem []byte
	ids []int
}

func (c *cutting) Begin(layer int, ids []int, hint model.Hint) error {
	if len(hint.MaxWeight) != len(ids) {
		return fmt.Errorf("layer %d: %d experts asked for with %d weights", layer, len(ids), len(hint.MaxWeight))
	}
	c.ids = ids
	return c.Provider.Begin(layer, ids, hint)
}

func (c *cutting) Next() (int, *model.Expert, error) {
	j, ex, err := c.Provider.Next()
	if err == nil && ex != nil && c.ids[j]%3 == 0 {
		return j, nil, nil
	}
	return j, ex, err
}

func (c *cutting) Memory() []byte                    { return c.mem }
func (c *cutting) Cached(layer, e int) *model.Expert { return nil }
func (c *cutting) Options() experts.Options          { return experts.Options{CutWeak: 1} }

// TestGPUCutZero: an expert the host's pool cuts (--cut-weak) adds
// exactly nothing. Through a GPU pool of top-k records every expert is a
// miss, so with every third expert cut the logits of a prompt must be, bit
// for bit, the resident upload's of a copy of the model whose every third
// expert has a zero down projection (scales and biases zero: each output
// exactly 0). The routing weights reach the host with the choice.
func TestGPUCutZero(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	src := packed(t, name, 4)
	c := refs(t, name).Cases[0]
	zero := testutil.CopyDir(t, src)
	man, err := format.ReadManifest(zero)
	if err != nil {
		t.Fatal(err)
	}
	st := &man.Stores[0]
	f, err := os.OpenFile(filepath.Join(zero, st.File), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, sb := st.Down.Kind.Sizes(st.Down.Shape[0], st.Down.Shape[1])
	for rec := 0; rec < man.ExpertLayers*man.Experts; rec++ {
		if rec%man.Experts%3 != 0 {
			continue
		}
		for _, off := range []int64{st.Down.ScaleOffset, st.Down.BiasOffset} {
			if _, err := f.WriteAt(make([]byte, sb), int64(rec)*st.Stride+off); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.Close()
	want := all(t, open(t, zero, "cuda", 64), c.Prompt)

	m, err := model.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	res, err := model.OpenResident(context.Background(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Experts = &cutting{Provider: res, mem: res.Bytes()}
	dev, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	r, err := gpu.New(dev, m, gpu.Config{Rows: 64, Ctx: 256, PoolBytes: int64(m.Config.TopK) * st.Stride})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := m.NewState(len(c.Prompt) + 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(want))
	if err := r.Forward(s, c.Prompt, got, true); err != nil {
		t.Fatal(err)
	}
	same := 0
	base := all(t, open(t, src, "cuda", 64), c.Prompt)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d (pos %d) = %v with every third expert cut, %v with it zeroed", i, i/m.Config.Vocab, got[i], want[i])
		}
		if got[i] == base[i] {
			same++
		}
	}
	if ps := r.Pool(); ps.Hits != 0 {
		t.Fatalf("a pool of top-k records hit %d times: not every expert was a miss", ps.Hits)
	}
	if same == len(base) {
		t.Fatal("the cuts changed no logit")
	}
}

// TestGPUCutWeak runs --cut-weak on the GPU through three tiers: the
// GPU's pool at a tenth, the host's at top-k records, so that most of a
// step's misses are read from disk. With a threshold above every weight
// the host cuts every miss whose read is late, and decoding still runs;
// the GPU's pool copies only what was not cut.
func TestGPUCutWeak(t *testing.T) {
	needGPU(t)
	name := gpuModels[1]
	dir := packed(t, name, 4)
	c := refs(t, name).Cases[0]
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	K, stride := man.Config.TopK, man.Stores[0].Stride
	e := openPool(t, dir, 64, engine.ExpertOptions{GPUPoolShare: 0.1, PoolBytes: int64(K) * stride, CutWeak: 0.99, NoLookahead: true})
	gen := greedy(t, e, c.Prompt, 16)
	cuts := e.Stream.Stats().Cuts
	ps, _ := e.DevicePool()
	t.Logf("cut-weak 0.99: %d cuts, %d misses, %d records copied; tokens %v", cuts, ps.Misses, ps.BytesUp/uint64(stride), gen)
	if len(gen) != 16 || cuts == 0 || ps.BytesUp != (ps.Misses-uint64(cuts))*uint64(stride) {
		t.Errorf("%d tokens, %d cuts, %d misses, %d bytes copied of %d-byte records", len(gen), cuts, ps.Misses, ps.BytesUp, stride)
	}
}
