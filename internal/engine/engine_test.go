package engine_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/internal/testutil/enginetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// open opens the 16-bit packed copy of a shared model with o (Threads
// defaults to 2) and closes it when the test ends.
func open(t *testing.T, name string, o engine.Options) *engine.Engine {
	t.Helper()
	if o.Threads == 0 {
		o.Threads = 2
	}
	e, err := engine.Open(context.Background(), testutil.Packed(t, name, 16), o)
	if err != nil {
		t.Fatalf("Open %s: %v", name, err)
	}
	t.Cleanup(e.Close)
	return e
}

// generate runs one generation on a fresh state.
func generate(t *testing.T, e *engine.Engine, prompt []int, o engine.GenOptions, emit engine.Emit) ([]int, engine.Stats) {
	t.Helper()
	st, err := e.NewState()
	if err != nil {
		t.Fatal(err)
	}
	out, s, err := e.Generate(context.Background(), st, prompt, o, emit)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return out, s
}

var greedy48 = engine.GenOptions{MaxTokens: 48, Sample: sample.Params{Temperature: 0}, IgnoreEOS: true}

func TestGreedyMatchesReference(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			refs := testutil.LoadRefs(t, name)
			if len(refs.Cases) < 4 {
				t.Fatalf("want at least 4 reference cases, have %d", len(refs.Cases))
			}
			for _, chunk := range []int{0, 1, 7} {
				e := open(t, name, engine.Options{ChunkRows: chunk})
				for i, c := range refs.Cases[:4] {
					got, s := generate(t, e, c.Prompt, greedy48, nil)
					if d := testutil.FirstDiff(got, c.Greedy); d >= 0 {
						t.Errorf("chunk %d case %d: greedy tokens differ from transformers at %d\n got %v\nwant %v", chunk, i, d, got, c.Greedy)
					}
					if s.PromptTokens != len(c.Prompt) || s.GeneratedTokens != len(got) || s.StopReason != "length" {
						t.Errorf("chunk %d case %d: stats %+v, want prompt %d, generated %d, stop length", chunk, i, s, len(c.Prompt), len(got))
					}
				}
			}
		})
	}
}

// Without IgnoreEOS generation stops at, and includes, the first EOS id. The
// reference continuations hold no EOS, so the test declares one of their
// tokens an EOS id on its own engine.
func TestStopsAtEOS(t *testing.T) {
	name := testutil.Models[0]
	refs := testutil.LoadRefs(t, name)
	e := open(t, name, engine.Options{})
	// generation_config.json lists 4093 and 4095.
	if !slices.Contains(e.Model.Config.EOS, 4093) || !slices.Contains(e.Model.Config.EOS, 4095) {
		t.Errorf("EOS ids %v, want 4093 and 4095 from generation_config.json", e.Model.Config.EOS)
	}
	c := refs.Cases[0]
	stopAt := c.Greedy[10]
	j := slices.Index(c.Greedy, stopAt)
	e.Model.Config.EOS = []int{stopAt}
	o := greedy48
	o.IgnoreEOS = false
	var emitted []int
	got, s := generate(t, e, c.Prompt, o, func(tok int, _ string) error {
		emitted = append(emitted, tok)
		return nil
	})
	if !slices.Equal(got, c.Greedy[:j+1]) || s.StopReason != "eos" || s.GeneratedTokens != j+1 {
		t.Errorf("got %v (%s, %d generated), want %v (eos)", got, s.StopReason, s.GeneratedTokens, c.Greedy[:j+1])
	}
	if slices.Contains(emitted, stopAt) {
		t.Errorf("the EOS token %d was emitted: %v", stopAt, emitted)
	}
	got, s = generate(t, e, c.Prompt, greedy48, nil)
	if !slices.Equal(got, c.Greedy) || s.StopReason != "length" {
		t.Errorf("IgnoreEOS: got %v (%s), want the reference continuation", got, s.StopReason)
	}
}

// A generation that reaches the end of the context stops there: the last
// token is sampled from the logits of position Ctx-1 and is never fed.
func TestStopsAtContext(t *testing.T) {
	name := testutil.Models[1]
	refs := testutil.LoadRefs(t, name)
	const ctxLen = 40
	c := refs.Cases[2] // 28 prompt tokens
	if len(c.Prompt) >= ctxLen {
		t.Fatalf("case 2 prompt has %d tokens; the test wants fewer than %d", len(c.Prompt), ctxLen)
	}
	e := open(t, name, engine.Options{Ctx: ctxLen})
	got, s := generate(t, e, c.Prompt, greedy48, nil)
	n := ctxLen - len(c.Prompt) + 1
	if s.StopReason != "context" || !slices.Equal(got, c.Greedy[:n]) {
		t.Errorf("got %v (%s), want %v (context)", got, s.StopReason, c.Greedy[:n])
	}
}

func TestScoreMatchesReference(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			refs := testutil.LoadRefs(t, name)
			c := refs.Cases[0]
			e := open(t, name, engine.Options{})
			sc, err := e.Score(context.Background(), c.Prompt)
			if err != nil {
				t.Fatal(err)
			}
			checkScore(t, sc, c, testutil.LogitTol(name))
		})
	}
}

func checkScore(t *testing.T, sc *engine.Score, c testutil.Case, tol float64) {
	t.Helper()
	n := len(c.Prompt)
	if sc.N != n || len(sc.Argmax) != n {
		t.Fatalf("n %d, %d argmax; want %d", sc.N, len(sc.Argmax), n)
	}
	same := 0
	for i := range n {
		if sc.Argmax[i] == c.Argmax[i] {
			same++
		}
	}
	if float64(same) < 0.97*float64(n) {
		t.Errorf("argmax agrees with transformers at %d of %d positions, want >= 97%%", same, n)
	}
	if len(sc.Logprobs) != n-1 {
		t.Fatalf("%d logprobs, want %d", len(sc.Logprobs), n-1)
	}
	var sum float64
	for i, lp := range sc.Logprobs {
		if !(lp <= 0) || math.IsInf(lp, 0) {
			t.Errorf("logprob[%d] = %v, want finite and <= 0", i, lp)
		}
		sum -= lp
	}
	if mean := sum / float64(n-1); math.Abs(mean-sc.NLL) > 1e-9*max(1, math.Abs(mean)) {
		t.Errorf("nll %v, mean of -logprobs %v", sc.NLL, mean)
	}
	if len(sc.LastLogits) != len(c.LastLogits) {
		t.Fatalf("%d last logits, want %d", len(sc.LastLogits), len(c.LastLogits))
	}
	worst, at := 0.0, -1
	for i, v := range sc.LastLogits {
		if d := math.Abs(float64(v) - c.LastLogits[i]); !(d <= worst) {
			worst, at = d, i
		}
	}
	if !(worst <= tol) {
		t.Errorf("last logits differ from transformers by %g at %d (got %v, want %v)", worst, at, sc.LastLogits[at], c.LastLogits[at])
	}
}

// Score's chunking must not change its result: per-position logprobs and the
// last logits are identical across chunk sizes, and with or without
// AllLogits (a whole chunk of rows, or a sequence's speculative rows at a
// time).
func TestScoreChunkInvariant(t *testing.T) {
	name := testutil.Models[0]
	c := testutil.LoadRefs(t, name).Cases[0]
	var first *engine.Score
	for _, o := range []engine.Options{{AllLogits: true}, {}, {ChunkRows: 7}} {
		e := open(t, name, o)
		sc, err := e.Score(context.Background(), c.Prompt)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = sc
			continue
		}
		if !slices.Equal(sc.Argmax, first.Argmax) || !slices.Equal(sc.Logprobs, first.Logprobs) || !slices.Equal(sc.LastLogits, first.LastLogits) {
			t.Errorf("%+v: score differs from a whole chunk's with AllLogits", o)
		}
	}
}

func TestSeededSampling(t *testing.T) {
	name := testutil.Models[0]
	c := testutil.LoadRefs(t, name).Cases[1]
	e := open(t, name, engine.Options{})
	o := func(seed uint64) engine.GenOptions {
		return engine.GenOptions{MaxTokens: 48, IgnoreEOS: true, Sample: sample.Params{Temperature: 0.8, TopP: 0.95, Seed: seed}}
	}
	a, _ := generate(t, e, c.Prompt, o(7), nil)
	b, _ := generate(t, e, c.Prompt, o(7), nil)
	if !slices.Equal(a, b) {
		t.Errorf("seed 7 twice gave different tokens:\n%v\n%v", a, b)
	}
	if len(a) != 48 {
		t.Errorf("%d tokens, want 48", len(a))
	}
	d, _ := generate(t, e, c.Prompt, o(8), nil)
	if slices.Equal(a, d) {
		t.Errorf("seeds 7 and 8 gave the same 48 tokens %v", a)
	}
}

// TestNonFiniteLogits checks that a model whose weights are corrupt (every
// byte of dense.bin 0xFF: NaN scales and values) is refused when it
// computes NaN logits, by generation, greedy and sampled, with and without
// MTP drafts, and by scoring, instead of answering token 0 forever.
func TestNonFiniteLogits(t *testing.T) {
	dir := testutil.CopyDir(t, testutil.Packed(t, "tiny-qwen3-5-moe", 4))
	enginetest.NaNWeights(t, dir)
	e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 2, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	enginetest.RequireNotFinite(t, e, "")
}

func TestGenerateErrors(t *testing.T) {
	name := testutil.Models[1]
	refs := testutil.LoadRefs(t, name)
	e := open(t, name, engine.Options{Ctx: 16})
	gen := func(ctx context.Context, prompt []int, o engine.GenOptions) error {
		st, err := e.NewState()
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = e.Generate(ctx, st, prompt, o, nil)
		return err
	}
	bg := context.Background()
	if err := gen(bg, nil, greedy48); err == nil {
		t.Error("empty prompt: no error")
	}
	long := refs.Cases[0].Prompt[:20]
	if err := gen(bg, long, greedy48); err == nil || !strings.Contains(err.Error(), "context") {
		t.Errorf("20-token prompt in a context of 16: err %v, want one mentioning the context", err)
	}
	short := refs.Cases[0].Prompt[:8]
	bad := greedy48
	bad.Sample.Temperature = -1
	if err := gen(bg, short, bad); err == nil {
		t.Error("temperature -1: no error")
	}
	if err := gen(bg, []int{1, 1 << 20}, greedy48); err == nil {
		t.Error("token id outside the vocabulary: no error")
	}
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	if err := gen(cancelled, short, greedy48); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err %v, want context.Canceled", err)
	}
	if _, err := e.Score(cancelled, short); !errors.Is(err, context.Canceled) {
		t.Errorf("Score on a cancelled context: err %v, want context.Canceled", err)
	}
	if _, err := e.Score(bg, short[:1]); err == nil || !strings.Contains(err.Error(), "score needs at least 2 tokens, got 1") {
		t.Errorf("score of one token: %v", err)
	}
	if _, err := e.Score(bg, nil); err == nil {
		t.Error("Score of no tokens: no error")
	}
	if _, err := e.Score(bg, long); err == nil || !strings.Contains(err.Error(), "context") {
		t.Errorf("Score of 20 tokens in a context of 16: err %v, want one mentioning the context", err)
	}
}

// Cancelling while decoding stops the generation with context.Canceled, and
// an error returned by Emit stops it with that error.
func TestStopMidGeneration(t *testing.T) {
	name := testutil.Models[0]
	c := testutil.LoadRefs(t, name).Cases[2]
	e := open(t, name, engine.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := e.NewState()
	n := 0
	out, _, err := e.Generate(ctx, st, c.Prompt, greedy48, func(int, string) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || len(out) != 3 {
		t.Errorf("cancel after 3 tokens: %d tokens, err %v; want 3, context.Canceled", len(out), err)
	}
	stop := errors.New("enough")
	st, _ = e.NewState()
	out, _, err = e.Generate(context.Background(), st, c.Prompt, greedy48, func(int, string) error { return stop })
	if !errors.Is(err, stop) || len(out) != 1 {
		t.Errorf("emit error: %d tokens, err %v; want 1 and the emit error", len(out), err)
	}
}

func TestOpenErrors(t *testing.T) {
	bg := context.Background()
	missing := filepath.Join(t.TempDir(), "nope")
	if _, err := engine.Open(bg, missing, engine.Options{}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing dir: err %v, want one naming the directory", err)
	}
	empty := t.TempDir()
	_, err := engine.Open(bg, empty, engine.Options{})
	if err == nil || !strings.Contains(err.Error(), "manifest.json") || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("empty dir: err %v, want one naming manifest.json and config.json", err)
	}
	file := filepath.Join(empty, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Open(bg, file, engine.Options{}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("plain file: err %v, want 'not a directory'", err)
	}
}

// A Hugging Face directory is packed into the cache once and reused.
func TestOpenPacksIntoCacheOnce(t *testing.T) {
	name := testutil.Models[1]
	src := testutil.ModelDir(t, name)
	cache := t.TempDir()
	var progress bytes.Buffer
	o := engine.Options{Threads: 2, CacheDir: cache, PackBits: 8, Progress: &progress}
	e, err := engine.Open(context.Background(), src, o)
	if err != nil {
		t.Fatal(err)
	}
	dir := e.Dir
	e.Close()
	if filepath.Dir(dir) != cache {
		t.Fatalf("packed into %s, want a folder of %s", dir, cache)
	}
	if !strings.Contains(progress.String(), "packing") {
		t.Errorf("first open reported no packing: %q", progress.String())
	}
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if man.Bits != 8 {
		t.Errorf("packed at %d bits, want 8", man.Bits)
	}
	before, err := os.Stat(filepath.Join(dir, format.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}

	progress.Reset()
	e2, err := engine.Open(context.Background(), src, o)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if e2.Dir != dir {
		t.Errorf("second open used %s, want %s", e2.Dir, dir)
	}
	if progress.Len() != 0 {
		t.Errorf("second open packed again: %q", progress.String())
	}
	after, err := os.Stat(filepath.Join(e2.Dir, format.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("manifest rewritten: mtime %v then %v", before.ModTime(), after.ModTime())
	}
	if p, err := engine.PackCached(context.Background(), src, o); err != nil || p != dir {
		t.Errorf("PackCached = %s, %v; want %s", p, err, dir)
	}
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Errorf("cache holds %d entries, want 1", len(entries))
	}
	// Another bit width is a separate copy.
	o.PackBits = 4
	o.Progress = nil
	p4, err := engine.PackCached(context.Background(), src, o)
	if err != nil || p4 == dir {
		t.Errorf("4-bit PackCached = %s, %v; want a directory other than %s", p4, err, dir)
	}
}

// The text passed to Emit, concatenated, is the decoding of the generated
// tokens without the special ones.
func TestEmitText(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			refs := testutil.LoadRefs(t, name)
			e := open(t, name, engine.Options{})
			for i, c := range refs.Cases[:4] {
				var text strings.Builder
				var emitted []int
				out, _ := generate(t, e, c.Prompt, greedy48, func(tok int, s string) error {
					if tok >= 0 {
						emitted = append(emitted, tok)
					}
					text.WriteString(s)
					return nil
				})
				if !slices.Equal(emitted, out) {
					t.Errorf("case %d: emitted %v, returned %v", i, emitted, out)
				}
				var plain []int
				for _, id := range out {
					if !e.Tok.IsSpecial(id) {
						plain = append(plain, id)
					}
				}
				if want := e.Tok.Decode(plain); text.String() != want {
					t.Errorf("case %d: emitted text %q, want %q", i, text.String(), want)
				}
			}
		})
	}
}

// TestDeviceOptionRefusals: options the chosen device cannot honour are
// refused before anything loads (the directory does not even exist): a
// GPU pool or memory size for a forward on the CPU. (--miss-bits and
// --cut-weak run on the GPU too.)
func TestDeviceOptionRefusals(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	for _, c := range []struct {
		o    engine.Options
		want string
	}{
		{engine.Options{Device: "cpu", Experts: engine.ExpertOptions{GPUPoolShare: 0.5}}, "--gpu-pool-mb"},
		{engine.Options{Experts: engine.ExpertOptions{GPUPoolBytes: 1 << 30}}, "--gpu-pool-mb"},
		{engine.Options{Device: "cpu", Experts: engine.ExpertOptions{VRAMBytes: 1 << 30}}, "--vram-gb: GPU options; the forward runs on the CPU"},
		{engine.Options{Device: "cpu", Experts: engine.ExpertOptions{GPUCPUShare: 0.5}}, "--gpu-cpu-share: GPU options"},
		{engine.Options{Device: "tpu"}, "want auto, cpu, cuda"},
	} {
		_, err := engine.Open(context.Background(), missing, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want one saying %q", c.o, err, c.want)
		}
	}
	// Device auto with a model the GPU does not run (top-33 routing, and
	// no GPU at all on most machines) runs on the CPU, says why, and says
	// that the GPU's sizes go unused.
	cpuOnly := testutil.PackedVariant(t, "tiny-deepseek-v32", 4, testutil.GPURefused)
	for _, c := range []struct {
		xo   engine.ExpertOptions
		want string
	}{
		{engine.ExpertOptions{GPUPoolShare: 0.25}, "; --gpu-pool-mb is unused"},
		{engine.ExpertOptions{GPUPoolShare: 0.25, VRAMBytes: 8 << 30}, "; --gpu-pool-mb and --vram-gb are unused"},
	} {
		e, err := engine.Open(context.Background(), cpuOnly, engine.Options{Device: "auto", Threads: 2, Experts: c.xo})
		if err != nil {
			t.Fatal(err)
		}
		if e.OnGPU() || !strings.HasSuffix(e.DeviceNote, c.want) {
			t.Errorf("auto with %+v: device %q, note %q", c.xo, e.Device, e.DeviceNote)
		}
		e.Close()
	}
}

// countingPool is the CPU's forward with a pretend GPU pool that counts
// every row as a hit, every step as a miss of one 100-byte record waited
// for 0.5 ms, and every step of one row as a lookahead copy, used.
type countingPool struct {
	*model.Runner
	p engine.DevicePool
}

func (c *countingPool) Forward(st *model.State, tokens []int, out []float32, all bool) error {
	c.p.Hits += uint64(len(tokens))
	c.p.Misses++
	c.p.BytesUp += 100
	c.p.CopyWaitMS += 0.5
	if len(tokens) == 1 {
		c.p.Prefetched++
		c.p.PrefetchUsed++
	}
	return c.Runner.Forward(st, tokens, out, all)
}

func (c *countingPool) DevicePool() engine.DevicePool { return c.p }

// TestGPUPoolStats: a generation's stats carry the GPU pool's counters
// over the generation and over its decode (here, a pool that counts rows
// and steps).
func TestGPUPoolStats(t *testing.T) {
	e := open(t, testutil.Models[0], engine.Options{ChunkRows: 8})
	st, _ := e.NewState()
	_, s, err := e.Generate(context.Background(), st, make([]int, 20), engine.GenOptions{MaxTokens: 6, IgnoreEOS: true}, nil)
	if err != nil || s.GPUPool != nil {
		t.Fatalf("on the CPU: gpu_pool %+v, err %v", s.GPUPool, err)
	}
	c := &countingPool{Runner: e.Runner, p: engine.DevicePool{Slots: 7, Hits: 1000, Misses: 50, BytesUp: 5000}}
	e.Fwd = c
	st, _ = e.NewState()
	_, s, err = e.Generate(context.Background(), st, make([]int, 20), engine.GenOptions{MaxTokens: 6, IgnoreEOS: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Prefill: 20 rows in 3 steps of at most 8; decode: 5 steps of one row.
	want := engine.GPUPoolStats{Slots: 7, Hits: 25, Misses: 8, HitRate: 25.0 / 33, BytesCopied: 800,
		DecodeHitRate: 5.0 / 10, DecodeBytesCopied: 500, Prefetched: 5, PrefetchUsed: 5, CopyWaitMS: 4, DecodeCopyWaitMS: 2.5}
	if s.GPUPool == nil || *s.GPUPool != want {
		t.Errorf("gpu_pool %+v, want %+v", s.GPUPool, want)
	}
}

// TestDeviceFallback: the GPU backend does not run top-33 routing (its
// routers keep at most 32); --device auto falls back to the CPU saying
// why, and --device cuda is an error that says why, whether or not this
// machine has a GPU (the model is checked before the driver). The
// fallback decodes as --device cpu does.
func TestDeviceFallback(t *testing.T) {
	cpuOnly := testutil.PackedVariant(t, "tiny-deepseek-v32", 4, testutil.GPURefused)
	openOn := func(device string) (*engine.Engine, error) {
		return engine.Open(context.Background(), cpuOnly, engine.Options{Device: device, Threads: 2})
	}
	e, err := openOn("auto")
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Device != "cpu" || e.OnGPU() || !strings.HasPrefix(e.DeviceNote, "device: cpu (") {
		t.Fatalf("device %q, note %q", e.Device, e.DeviceNote)
	}
	why := []string{"top-33 routing not supported on the GPU", "without CUDA support", "linux only"}
	if !slices.ContainsFunc(why, func(s string) bool { return strings.Contains(e.DeviceNote, s) }) {
		t.Errorf("note %q names no reason", e.DeviceNote)
	}
	_, err = openOn("cuda")
	if err == nil || !strings.Contains(err.Error(), "device cuda") ||
		!slices.ContainsFunc(why, func(s string) bool { return strings.Contains(err.Error(), s) }) {
		t.Errorf("--device cuda: err %v", err)
	}
	c, err2 := openOn("cpu")
	if err2 != nil {
		t.Fatal(err2)
	}
	defer c.Close()
	prompt := testutil.LoadRefs(t, "tiny-deepseek-v32").Cases[1].Prompt
	want, _ := generate(t, c, prompt, greedy48, nil)
	if got, _ := generate(t, e, prompt, greedy48, nil); !slices.Equal(got, want) {
		t.Errorf("tokens %v, want %v (--device cpu)", got, want)
	}
}

// textCounter is the CPU's forward with a pretend device pool that
// counts the new texts it is told of.
type textCounter struct {
	*model.Runner
	n int
}

func (c *textCounter) NewText() { c.n++ }

// TestNewText: a sequence on an empty state tells the pools a new text
// begins, unless told to keep their counts (KeepPoolCounts); one
// that continues a state's prefix does not. Through a streamed pool the
// second of two texts then hits as it would through a pool that saw only
// its own text's last uses, where KeepPoolCounts leaves the first text's
// counts to outrank it, and it hits less.
func TestNewText(t *testing.T) {
	e := open(t, testutil.Models[0], engine.Options{})
	c := &textCounter{Runner: e.Runner}
	e.Fwd = c
	o := engine.GenOptions{MaxTokens: 4, IgnoreEOS: true}
	st, _ := e.NewState()
	if _, _, err := e.Generate(context.Background(), st, []int{1, 2, 3}, o, nil); err != nil || c.n != 1 {
		t.Fatalf("a fresh state: %d new texts, err %v", c.n, err)
	}
	if _, _, err := e.Generate(context.Background(), st, []int{4, 5}, o, nil); err != nil || c.n != 1 {
		t.Fatalf("continuing a prefix: %d new texts, err %v", c.n, err)
	}
	st.Reset()
	o.KeepPoolCounts = true
	if _, _, err := e.Generate(context.Background(), st, []int{1, 2, 3}, o, nil); err != nil || c.n != 1 {
		t.Fatalf("KeepPoolCounts: %d new texts, err %v", c.n, err)
	}

	name := "tiny-qwen3-moe"
	cases := testutil.LoadRefs(t, name).Cases
	hits := map[bool]float64{}
	for _, keep := range []bool{false, true} {
		e := open(t, name, engine.Options{Experts: engine.ExpertOptions{PoolShare: 0.1, NoLookahead: true}})
		if e.Stream == nil {
			t.Fatalf("PoolShare 0.1 did not stream (%s)", e.ExpertPlan)
		}
		o := greedy48
		o.MaxTokens = 128
		generate(t, e, cases[0].Prompt, o, nil)
		o.MaxTokens = 32
		o.KeepPoolCounts = keep
		_, s := generate(t, e, cases[1].Prompt, o, nil)
		hits[keep] = s.Experts.DecodeHitRate
	}
	t.Logf("second text's decode hit rate: %.3f as a new text, %.3f keeping the counts", hits[false], hits[true])
	if hits[false] <= hits[true] {
		t.Errorf("the second text's decode hit rate: %.3f as a new text, %.3f keeping the counts", hits[false], hits[true])
	}
}
