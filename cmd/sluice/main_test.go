package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/testutil"
)

// bin is the sluice binary built once for these system tests; cache is the
// SLUICE_CACHE of every run.
var bin, cache string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	defer testutil.Cleanup()
	tmp, err := os.MkdirTemp("", "sluice-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin = filepath.Join(tmp, "sluice")
	cache = filepath.Join(tmp, "cache")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// sluice runs the binary and returns stdout, stderr and the exit code.
func sluice(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("sluice %v: %v", args, err)
	}
	if strings.Contains(e.String(), "goroutine ") || strings.Contains(e.String(), "panic:") {
		t.Fatalf("sluice %v panicked:\n%s", args, e.String())
	}
	return o.String(), e.String(), code
}

// ok runs the binary and fails the test unless it exits 0.
func ok(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	o, e, code := sluice(t, args...)
	if code != 0 {
		t.Fatalf("sluice %v: exit %d\n%s", args, code, e)
	}
	return o, e
}

func decode(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, s)
	}
}

type runJSON struct {
	Tokens []int  `json:"tokens"`
	Text   string `json:"text"`
	Stats  struct {
		PromptTokens    *int     `json:"prompt_tokens"`
		GeneratedTokens *int     `json:"generated_tokens"`
		PrefillTokS     *float64 `json:"prefill_tok_s"`
		DecodeTokS      *float64 `json:"decode_tok_s"`
		StopReason      string   `json:"stop_reason"`
	} `json:"stats"`
}

func TestRun(t *testing.T) {
	args := []string{"run", "--temp", "0", "-n", "16", "--json", "--threads", "2", "-p", "def add(a, b):"}
	out, _ := ok(t, args...)
	var a runJSON
	decode(t, out, &a)
	s := a.Stats
	if a.Tokens == nil || s.PromptTokens == nil || s.GeneratedTokens == nil || s.PrefillTokS == nil || s.DecodeTokS == nil {
		t.Fatalf("JSON lacks tokens or a stats key: %s", out)
	}
	if len(a.Tokens) == 0 || len(a.Tokens) > 16 || *s.GeneratedTokens != len(a.Tokens) {
		t.Errorf("%d tokens, generated_tokens %d; want 1..16 and equal", len(a.Tokens), *s.GeneratedTokens)
	}
	if *s.PromptTokens < 3 || *s.PrefillTokS <= 0 || (len(a.Tokens) > 1 && *s.DecodeTokS <= 0) {
		t.Errorf("stats %s", out)
	}
	if a.Text == "" {
		t.Errorf("empty text for tokens %v", a.Tokens)
	}

	out2, _ := ok(t, args...)
	var b runJSON
	decode(t, out2, &b)
	if !equalInts(a.Tokens, b.Tokens) || a.Text != b.Text {
		t.Errorf("greedy runs differ:\n%v %q\n%v %q", a.Tokens, a.Text, b.Tokens, b.Text)
	}

	// Streaming mode: the same text on stdout (then a newline), a summary on stderr.
	text, summary := ok(t, "run", "--temp", "0", "-n", "16", "--threads", "2", "-p", "def add(a, b):")
	if text != a.Text+"\n" {
		t.Errorf("streamed text %q, want the JSON text %q and a newline", text, a.Text)
	}
	if !strings.Contains(summary, "decode") || !strings.Contains(summary, fmt.Sprintf("generated %d tokens", len(a.Tokens))) {
		t.Errorf("summary line %q", summary)
	}

	// The same prompt given as token ids generates the same tokens.
	tok, _ := ok(t, "tokenize", "--text", "def add(a, b):")
	var ids struct{ IDs []int }
	decode(t, tok, &ids)
	if len(ids.IDs) != *s.PromptTokens {
		t.Fatalf("tokenize gave %d ids, run reported %d prompt tokens", len(ids.IDs), *s.PromptTokens)
	}
	out3, _ := ok(t, "run", "--temp", "0", "-n", "16", "--json", "--threads", "2", "--tokens", joinInts(ids.IDs))
	var c runJSON
	decode(t, out3, &c)
	if !equalInts(a.Tokens, c.Tokens) {
		t.Errorf("--tokens %v generated %v, -p generated %v", ids.IDs, c.Tokens, a.Tokens)
	}
}

func TestRunSeeded(t *testing.T) {
	gen := func(seed string) []int {
		out, _ := ok(t, "run", "--seed", seed, "-n", "24", "--ignore-eos", "--json", "--threads", "2", "-p", "def add(a, b):")
		var r runJSON
		decode(t, out, &r)
		if len(r.Tokens) != 24 {
			t.Fatalf("--ignore-eos -n 24 gave %d tokens", len(r.Tokens))
		}
		return r.Tokens
	}
	a, b := gen("7"), gen("7")
	if !equalInts(a, b) {
		t.Errorf("--seed 7 twice: %v and %v", a, b)
	}
	if c := gen("8"); equalInts(a, c) {
		t.Errorf("--seed 7 and --seed 8 gave the same tokens %v", a)
	}

	// The random seed reported in --json reproduces the run when passed back.
	// Several runs, since a seed only falls outside int64 half the time.
	for range 6 {
		out, _ := ok(t, "run", "-n", "8", "--ignore-eos", "--json", "--threads", "2", "-p", "def add(a, b):")
		var first struct {
			Tokens []int
			Stats  struct{ Seed uint64 }
		}
		decode(t, out, &first)
		seed := strconv.FormatUint(first.Stats.Seed, 10)
		out, e, code := sluice(t, "run", "-n", "8", "--ignore-eos", "--json", "--threads", "2", "--seed", seed, "-p", "def add(a, b):")
		if code != 0 {
			t.Fatalf("--seed %s (the reported seed): exit %d\n%s", seed, code, e)
		}
		var again runJSON
		decode(t, out, &again)
		if !equalInts(first.Tokens, again.Tokens) {
			t.Fatalf("--seed %s gave %v, the run that reported it %v", seed, again.Tokens, first.Tokens)
		}
	}

	var r runJSON
	out, _ := ok(t, "run", "-n", "0", "--json", "-p", "x")
	decode(t, out, &r)
	if r.Tokens == nil || len(r.Tokens) != 0 {
		t.Errorf("-n 0: %s", out)
	}
}

func TestScore(t *testing.T) {
	name := testutil.Models[1]
	c := testutil.LoadRefs(t, name).Cases[0]
	dir := testutil.Packed(t, name, 16)
	out, _ := ok(t, "score", "-m", dir, "--threads", "2", "--tokens", joinInts(c.Prompt), "--json")
	var sc struct {
		N          int       `json:"n"`
		Argmax     []int     `json:"argmax"`
		Logprobs   []float64 `json:"logprobs"`
		NLL        float64   `json:"nll"`
		LastLogits []float64 `json:"last_logits"`
	}
	decode(t, out, &sc)
	n := len(c.Prompt)
	if sc.N != n || len(sc.Argmax) != n || len(sc.Logprobs) != n-1 || len(sc.LastLogits) != len(c.LastLogits) {
		t.Fatalf("n %d, %d argmax, %d logprobs, %d last logits; want %d, %d, %d, %d",
			sc.N, len(sc.Argmax), len(sc.Logprobs), len(sc.LastLogits), n, n, n-1, len(c.LastLogits))
	}
	same := 0
	for i := range n {
		if sc.Argmax[i] == c.Argmax[i] {
			same++
		}
	}
	if float64(same) < 0.97*float64(n) {
		t.Errorf("argmax agrees with transformers at %d of %d positions", same, n)
	}
	var sum float64
	for _, v := range sc.Logprobs {
		sum -= v
	}
	if mean := sum / float64(n-1); math.Abs(mean-sc.NLL) > 1e-9*max(1, mean) || !(sc.NLL > 0) {
		t.Errorf("nll %v, mean of -logprobs %v", sc.NLL, mean)
	}
	for i, v := range sc.LastLogits {
		if d := math.Abs(v - c.LastLogits[i]); !(d <= 1e-3) {
			t.Fatalf("last_logits[%d] = %v, transformers %v", i, v, c.LastLogits[i])
		}
	}

	// --text-file tokenizes the file and scores it.
	f := filepath.Join(t.TempDir(), "p.txt")
	if err := os.WriteFile(f, []byte("def add(a, b):\n    return a + b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = ok(t, "score", "-m", dir, "--threads", "2", "--text-file", f)
	decode(t, out, &sc)
	if sc.N < 5 || len(sc.Logprobs) != sc.N-1 {
		t.Errorf("--text-file: n %d, %d logprobs", sc.N, len(sc.Logprobs))
	}
}

func TestTokenize(t *testing.T) {
	for _, name := range testutil.Models {
		refs := testutil.LoadRefs(t, name)
		for i, c := range refs.Tokenizer[:min(3, len(refs.Tokenizer))] {
			out, _ := ok(t, "tokenize", "-m", testutil.ModelDir(t, name), "--text", c.Text)
			var got struct {
				IDs []int `json:"ids"`
			}
			decode(t, out, &got)
			if got.IDs == nil || !equalInts(got.IDs, c.IDs) {
				t.Errorf("%s tokenizer case %d: ids %v, want %v", name, i, got.IDs, c.IDs)
			}
		}
	}
	out, _ := ok(t, "tokenize", "--text", "")
	if strings.TrimSpace(out) != `{"ids":[]}` {
		t.Errorf("empty text: %q", out)
	}
}

func TestPackInspect(t *testing.T) {
	src := testutil.ModelDir(t, testutil.Models[0])
	dst := filepath.Join(t.TempDir(), "packed")
	ok(t, "pack", "--bits", "8", src, dst)
	for _, f := range []string{"manifest.json", "dense.bin", "experts.bin"} {
		if _, err := os.Stat(filepath.Join(dst, f)); err != nil {
			t.Errorf("packed directory lacks %s: %v", f, err)
		}
	}
	out, _ := ok(t, "inspect", dst)
	for _, want := range []string{"family", "qwen3_5_moe", "experts.bin", "stride", "8-bit"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	out, _ = ok(t, "inspect", "--json", dst)
	var js map[string]any
	decode(t, out, &js)
	if js["family"] != "qwen3_5_moe" || js["bits"] != 8.0 {
		t.Errorf("inspect --json: family %v, bits %v", js["family"], js["bits"])
	}
	if stride, _ := js["record_stride"].(float64); stride <= 0 || math.Mod(stride, 4096) != 0 {
		t.Errorf("record_stride %v, want a positive multiple of 4096", js["record_stride"])
	}
	if js["experts_tiled"] != false {
		t.Errorf("inspect --json of an 8-bit pack: experts_tiled %v, want false", js["experts_tiled"])
	}
	// A 4-bit pack with its expert records tiled says so.
	tiled := filepath.Join(t.TempDir(), "tiled")
	ok(t, "pack", "--layout", "tiled", src, tiled)
	if out, _ := ok(t, "inspect", tiled); !strings.Contains(out, "q4 tiled") {
		t.Errorf("inspect of a tiled pack lacks %q:\n%s", "q4 tiled", out)
	}
	var tj map[string]any
	tout, _ := ok(t, "inspect", "--json", tiled)
	if decode(t, tout, &tj); tj["experts_tiled"] != true {
		t.Errorf("inspect --json of a tiled pack: experts_tiled %v", tj["experts_tiled"])
	}
	if _, e, code := sluice(t, "pack", "--layout", "diagonal", src, filepath.Join(t.TempDir(), "x")); code == 0 || !strings.Contains(e, "diagonal") {
		t.Errorf("pack --layout diagonal: exit %d, %q", code, e)
	}
	// Flags after the positional argument work too.
	out2, _ := ok(t, "inspect", dst, "--json")
	if out2 != out {
		t.Errorf("inspect DIR --json differs from inspect --json DIR")
	}
	// A second pack into the same place needs --force.
	if _, e, code := sluice(t, "pack", "--bits", "8", src, dst); code == 0 || e == "" {
		t.Errorf("pack over an existing DST without --force: exit %d, stderr %q", code, e)
	}
	// The packed copy runs.
	out, _ = ok(t, "run", "-m", dst, "--temp", "0", "-n", "4", "--json", "--threads", "2", "-p", "def")
	var r runJSON
	decode(t, out, &r)
	if len(r.Tokens) == 0 {
		t.Errorf("run on the packed copy: %s", out)
	}
	// inspect of a checkpoint describes it without packing.
	out, _ = ok(t, "inspect", src)
	if !strings.Contains(out, "not packed") || !strings.Contains(out, "qwen3_5_moe") {
		t.Errorf("inspect of a checkpoint:\n%s", out)
	}
}

func TestBench(t *testing.T) {
	// Decode from an empty context (the default, as llama-bench's tg), right
	// after the timed prefill, and after a context longer than the prompt.
	for _, depth := range []int{0, 32, 40} {
		out, _ := ok(t, "bench", "--prompt", "32", "--gen", "8", "--repeat", "1", "--threads", "2", "--depth", fmt.Sprint(depth), "--json")
		var b struct {
			Prefill *float64 `json:"prefill_tok_s"`
			Decode  *float64 `json:"decode_tok_s"`
			Depth   int      `json:"depth"`
		}
		decode(t, out, &b)
		if b.Prefill == nil || b.Decode == nil || !(*b.Prefill > 0) || !(*b.Decode > 0) || b.Depth != max(depth, 1) {
			t.Errorf("bench --depth %d: %s", depth, out)
		}
	}
	// The decode's CPU time per token and the cores it kept busy; with
	// more than one thread, the share of the workers' parts the
	// dispatching thread ran, a fraction.
	for _, threads := range []int{1, 2} {
		out, _ := ok(t, "bench", "--prompt", "4", "--gen", "16", "--repeat", "1", "--threads", fmt.Sprint(threads), "--json")
		var b struct {
			User *float64 `json:"decode_cpu_user_ms_per_token"`
			Sys  *float64 `json:"decode_cpu_sys_ms_per_token"`
			Busy *float64 `json:"decode_cores_busy"`
			Self *float64 `json:"decode_self_run_share"`
			// Only on Linux, and only when the machine's clock ticked
			// during the decode.
			Steal *float64 `json:"decode_cpu_steal_share"`
			// The bundled model's dense weights are read, not mapped.
			Tiled *bool `json:"q4_tiled"`
			// The bundled model is packed with --layout rows.
			Stored *bool `json:"experts_stored_tiled"`
		}
		decode(t, out, &b)
		if b.Tiled == nil || *b.Tiled != (kernels.TiledQ4() && platform.LoadCopies()) {
			t.Errorf("bench: q4_tiled missing or not what this CPU asks for (%v): %s", kernels.TiledQ4(), out)
		}
		if b.Stored == nil || *b.Stored {
			t.Errorf("bench: experts_stored_tiled missing or true for the bundled row-major model: %s", out)
		}
		if b.User == nil || b.Sys == nil || b.Busy == nil || !(*b.User+*b.Sys > 0) || *b.Sys < 0 ||
			!(*b.Busy > 0) || *b.Busy > float64(runtime.NumCPU())+0.5 {
			t.Errorf("bench --threads %d: CPU figures: %s", threads, out)
		}
		if (b.Self != nil) != (threads > 1) || b.Self != nil && (*b.Self < 0 || *b.Self > 1) {
			t.Errorf("bench --threads %d: self-run share: %s", threads, out)
		}
		if b.Steal != nil && (runtime.GOOS != "linux" || *b.Steal < 0 || *b.Steal > 1) {
			t.Errorf("bench --threads %d: steal share: %s", threads, out)
		}
	}
	// On Linux a decode long enough for the machine's clock to tick
	// (100 Hz a processor) reports the share its host took, a fraction.
	if runtime.GOOS == "linux" {
		out, _ := ok(t, "bench", "--prompt", "4", "--gen", "512", "--repeat", "1", "--threads", "1", "--json")
		var b struct {
			Steal *float64 `json:"decode_cpu_steal_share"`
		}
		decode(t, out, &b)
		if b.Steal == nil || *b.Steal < 0 || *b.Steal > 1 {
			t.Errorf("bench --gen 512: steal share missing or not a fraction: %s", out)
		}
	}
}

// bench --ops times the decode by operation: on the bundled Qwen3.5-MoE
// model every operation of its blocks, and none it lacks, with the
// shares of the decode's wall time under 1 together.
func TestBenchOps(t *testing.T) {
	out, _ := ok(t, "bench", "--prompt", "4", "--gen", "8", "--repeat", "1", "--threads", "2", "--ops", "--json")
	var b struct {
		Ops *struct {
			Ops []struct {
				Op    string  `json:"op"`
				MS    float64 `json:"ms_per_token"`
				Calls float64 `json:"calls_per_token"`
				Share float64 `json:"share"`
			} `json:"ops"`
			MS    float64 `json:"decode_ms_per_token"`
			Share float64 `json:"ops_share"`
		} `json:"decode_ops"`
	}
	decode(t, out, &b)
	if b.Ops == nil || !(b.Ops.MS > 0) || !(b.Ops.Share > 0) || b.Ops.Share > 1 {
		t.Fatalf("bench --ops: %s", out)
	}
	seen := map[string]bool{}
	var sum float64
	for i, o := range b.Ops.Ops {
		seen[o.Op] = true
		sum += o.Share
		if !(o.MS > 0) || !(o.Calls > 0) || i > 0 && o.MS > b.Ops.Ops[i-1].MS {
			t.Errorf("op %s: %+v (not timed, or out of order)", o.Op, o)
		}
	}
	for _, op := range []string{"norm", "attn_project", "attend", "dn_project", "conv", "delta_rule", "dn_out", "router", "experts", "lm_head"} {
		if !seen[op] {
			t.Errorf("bench --ops: no %s: %s", op, out)
		}
	}
	for _, op := range []string{"mla_project", "dense"} {
		if seen[op] {
			t.Errorf("bench --ops: %s on a model without it: %s", op, out)
		}
	}
	if math.Abs(sum-b.Ops.Share) > 1e-6 {
		t.Errorf("bench --ops: shares sum to %v, ops_share %v", sum, b.Ops.Share)
	}
	text, _ := ok(t, "bench", "--prompt", "4", "--gen", "8", "--repeat", "1", "--threads", "2", "--ops")
	if !strings.Contains(text, "decode by operation") || !strings.Contains(text, "experts") {
		t.Errorf("bench --ops prints no table: %s", text)
	}
}

// --host-cache-mb is --pool-mb under the GPU's name for the host's tier:
// the same pool, named as given in the plan.
func TestHostCacheFlag(t *testing.T) {
	for _, name := range []string{"--pool-mb", "--host-cache-mb"} {
		out, _ := ok(t, "bench", "--prompt", "8", "--gen", "4", "--repeat", "1", "--threads", "2", name, "25%", "--json")
		var b struct {
			Experts struct {
				Share float64 `json:"pool_share"`
				// The lookahead's trial (on by default).
				Paused *float64 `json:"lookahead_paused"`
				Gain   *float64 `json:"lookahead_gain_ms"`
			} `json:"experts"`
		}
		decode(t, out, &b)
		if b.Experts.Share < 0.2 || b.Experts.Share > 0.3 {
			t.Errorf("bench %s 25%%: a pool of %v of the store: %s", name, b.Experts.Share, out)
		}
		if x := b.Experts; x.Paused == nil || *x.Paused < 0 || *x.Paused > 1 || x.Gain == nil {
			t.Errorf("bench %s 25%%: the lookahead's trial figures: %s", name, out)
		}
	}
}

// bench's pool figures count --cut-weak's drops per token: with a
// threshold above every weight a small pool drops late misses, and
// without the option it drops none.
func TestBenchCuts(t *testing.T) {
	for _, cut := range []string{"0", "0.99"} {
		out, _ := ok(t, "bench", "--prompt", "16", "--gen", "8", "--repeat", "1", "--threads", "2", "--pool-mb", "10%", "--lookahead=false", "--cut-weak", cut, "--json")
		var b struct {
			Experts struct {
				Cuts *float64 `json:"cuts_per_token"`
			} `json:"experts"`
		}
		decode(t, out, &b)
		if c := b.Experts.Cuts; (cut == "0") != (c == nil) || c != nil && !(*c > 0) {
			t.Errorf("bench --cut-weak %s: cuts per token: %s", cut, out)
		}
	}
}

// bench --membw measures the memory around every trial and takes each
// trial's share of the decode limit against the bandwidth of its own
// minute.
func TestBenchMemBW(t *testing.T) {
	out, _ := ok(t, "bench", "--prompt", "4", "--gen", "8", "--repeat", "2", "--threads", "2", "--membw", "--json")
	var b struct {
		Decode []float64 `json:"decode_all"`
		Limit  struct {
			BW      float64   `json:"bandwidth_gb_s"`
			BWAll   []float64 `json:"bandwidth_all_gb_s"`
			TokenMB float64   `json:"token_mb"`
			StateMB float64   `json:"state_mb"`
			Limit   float64   `json:"limit_tok_s"`
			WLimit  float64   `json:"weights_limit_tok_s"`
			Share   float64   `json:"decode_share"`
			WShare  float64   `json:"decode_share_weights"`
			Shares  []float64 `json:"decode_share_all"`
		} `json:"decode_limit"`
	}
	decode(t, out, &b)
	l := b.Limit
	if len(b.Decode) != 2 || len(l.BWAll) != 3 || len(l.Shares) != 2 || !(l.TokenMB > 0) {
		t.Fatalf("bench --membw --repeat 2: %s", out)
	}
	// The bundled model (tiny Qwen3.5: 4 DeltaNet layers of 4 value heads
	// of 64×64 floats and a conv history of 3×512, 2 attention layers of
	// 2×64-wide keys and values) decodes 7 steps after one token of
	// context (depth 0), at positions 1 to 7: each reads its DeltaNet
	// state and writes it back, reads pos+1 rows of keys and values and
	// writes one.
	var state float64
	for pos := 1; pos <= 7; pos++ {
		state += 4 * float64(4*2*(3*512+4*64*64)+2*2*(pos+2)*2*64)
	}
	state /= 7
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }
	if !near(l.StateMB*1e6, state) {
		t.Errorf("state %v MB a token, want %v", l.StateMB, state/1e6)
	}
	moved := (l.TokenMB + l.StateMB) * 1e6
	for i, d := range b.Decode {
		want := d / ((l.BWAll[i] + l.BWAll[i+1]) / 2 * 1e9 / moved)
		if !near(l.Shares[i], want) {
			t.Errorf("trial %d's share %v, want %v from its decode %v and the bandwidths %v", i, l.Shares[i], want, d, l.BWAll)
		}
	}
	mid := append([]float64(nil), l.BWAll...)
	slices.Sort(mid)
	if !near(l.Share, (l.Shares[0]+l.Shares[1])/2) || !near(l.BW, mid[1]) || !near(l.Limit, l.BW*1e9/moved) ||
		!near(l.WLimit, l.BW*1e9/(l.TokenMB*1e6)) || !near(l.WShare, l.Share*l.Limit/l.WLimit) {
		t.Errorf("bench --membw: median share %v of %v (%v over the weights), bandwidth %v of %v, limit %v (%v over the weights): %s", l.Share, l.Shares, l.WShare, l.BW, l.BWAll, l.Limit, l.WLimit, out)
	}
}

// Ctrl-C stops a command cleanly with exit status 130.
func TestInterrupt(t *testing.T) {
	cmd := exec.Command(bin, "bench", "--prompt", "2048", "--gen", "1024", "--repeat", "50", "--threads", "2")
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	var e bytes.Buffer
	cmd.Stderr = &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("bench did not stop within 10 s of SIGINT")
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 || !strings.Contains(e.String(), "interrupted") {
		t.Errorf("after SIGINT: exit %d, stderr %q; want 130 and 'interrupted'", code, e.String())
	}
	if strings.Contains(e.String(), "goroutine ") || strings.Contains(e.String(), "panic:") {
		t.Errorf("panic after SIGINT:\n%s", e.String())
	}
}

// TestChatOutgrowsContext checks that a chat longer than its context goes
// on: the oldest exchanges are dropped, with a note, and a message too
// long for the context alone is refused by itself, the session kept.
func TestChatOutgrowsContext(t *testing.T) {
	cmd := exec.Command(bin, "chat", "--temp", "0", "-n", "8", "--threads", "2", "--ctx", "80")
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	turns := []string{"hello there", "how are you", "what is up", "more text here", "and more", "final",
		strings.Repeat("word ", 200), "last"}
	cmd.Stdin = strings.NewReader(strings.Join(turns, "\n") + "\n")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("chat: %v\n%s", err, e.String())
	}
	if !strings.Contains(e.String(), "oldest exchange was dropped") {
		t.Errorf("no note of a dropped exchange:\n%s", e.String())
	}
	if !strings.Contains(e.String(), "not sent") {
		t.Errorf("the message longer than the context was not refused:\n%s", e.String())
	}
	if n := strings.Count(o.String(), "\n"); n < len(turns)-1 {
		t.Errorf("chat printed %d lines for %d turns that fit: %q", n, len(turns)-1, o.String())
	}
}

func TestChatPiped(t *testing.T) {
	cmd := exec.Command(bin, "chat", "--temp", "0", "-n", "8", "--threads", "2")
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	cmd.Stdin = strings.NewReader("hello\nwhat is 2+2?\n")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("chat: %v\n%s", err, e.String())
	}
	if n := strings.Count(o.String(), "\n"); n < 2 {
		t.Errorf("chat printed %d lines for 2 turns: %q", n, o.String())
	}
}

func TestErrors(t *testing.T) {
	empty := t.TempDir()
	long := strings.Repeat("def add(a, b): return a + b\n", 4)
	cases := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"run without prompt", []string{"run"}, "-p"},
		{"run with -p and --tokens", []string{"run", "-p", "x", "--tokens", "1,2"}, "exactly one"},
		{"run bad id", []string{"run", "--tokens", "1,x"}, `"x"`},
		{"run id outside vocab", []string{"run", "--tokens", "99999"}, "vocabulary"},
		{"run negative id", []string{"run", "--tokens", "-1"}, "vocabulary"},
		{"run missing model", []string{"run", "-m", "/nonexistent", "-p", "x"}, "/nonexistent"},
		{"run empty model dir", []string{"run", "-m", empty, "-p", "x"}, "config.json"},
		{"run prompt beyond ctx", []string{"run", "--ctx", "8", "-p", long}, "context"},
		{"run negative temp", []string{"run", "--temp", "-1", "-p", "x"}, "temperature"},
		{"run bad top-p", []string{"run", "--top-p", "2", "-p", "x"}, "top_p"},
		{"run negative -n", []string{"run", "-n", "-1", "-p", "x"}, "-n"},
		{"run unknown flag", []string{"run", "--bogus", "-p", "x"}, "bogus"},
		{"score without input", []string{"score"}, "--tokens"},
		{"score with both inputs", []string{"score", "--tokens", "1", "--text-file", "f"}, "--tokens"},
		{"score id outside vocab", []string{"score", "--tokens", "1,99999"}, "vocabulary"},
		{"score one token", []string{"score", "--tokens", "5", "--json"}, "score needs at least 2 tokens, got 1"},
		{"score missing file", []string{"score", "--text-file", filepath.Join(empty, "none.txt")}, "none.txt"},
		{"pack one arg", []string{"pack", "src"}, "SRC and DST"},
		{"pack bits 3", []string{"pack", "--bits", "3", testutil.ModelDir(t, testutil.Models[0]), filepath.Join(empty, "out")}, "bits"},
		{"inspect missing dir", []string{"inspect", filepath.Join(empty, "missing")}, "missing"},
		{"inspect no dir", []string{"inspect"}, "DIR"},
		{"bench gen 1", []string{"bench", "--gen", "1"}, "--gen"},
		{"pool sized twice", []string{"run", "--pool-mb", "10%", "--host-cache-mb", "20%", "-p", "x"}, "--pool-mb and --host-cache-mb both size"},
		{"host cache and memory", []string{"run", "--host-cache-mb", "10%", "--memory-gb", "4", "-p", "x"}, "give --host-cache-mb or --memory-gb"},
		{"host cache bad size", []string{"run", "--host-cache-mb", "lots", "-p", "x"}, "--host-cache-mb"},
		{"gpu cpu share word", []string{"run", "--gpu-cpu-share", "half", "-p", "x"}, "--gpu-cpu-share half: want a share in [0,1] or auto"},
		{"gpu cpu share above 1", []string{"run", "--gpu-cpu-share", "1.5", "-p", "x"}, "--gpu-cpu-share 1.5"},
		{"gpu cpu share NaN", []string{"run", "--gpu-cpu-share", "NaN", "-p", "x"}, "--gpu-cpu-share NaN"},
		{"bench negative depth", []string{"bench", "--depth", "-1"}, "--depth"},
		{"tokenize missing model", []string{"tokenize", "-m", "/nonexistent", "--text", "x"}, "nonexistent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, e, code := sluice(t, c.args...)
			if code == 0 {
				t.Fatalf("sluice %v exited 0", c.args)
			}
			if strings.TrimSpace(e) == "" || !strings.Contains(e, c.want) {
				t.Errorf("sluice %v: exit %d, stderr %q; want a message containing %q", c.args, code, e, c.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(empty, "out")); err == nil {
		t.Errorf("pack --bits 3 left its output behind")
	}
}

// TestIncompletePacked checks that a packed directory without its manifest
// is named as one, not taken for a checkpoint and blamed for missing
// safetensors, and that pack refuses a source that is already packed.
func TestIncompletePacked(t *testing.T) {
	packed, nomani := t.TempDir(), t.TempDir()
	for _, f := range []string{"manifest.json", "config.json"} {
		b, err := os.ReadFile(filepath.Join("../../models/default", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(packed, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if f == "config.json" {
			if err := os.WriteFile(filepath.Join(nomani, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []string{"dense.bin", "experts.bin"} {
		if err := os.WriteFile(filepath.Join(nomani, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	incomplete := "manifest.json missing: " + nomani + " is not a complete packed model"
	refusedFirst(t, []refused{
		{[]string{"run", "-m", nomani, "-p", "hi"}, incomplete},
		{[]string{"inspect", nomani}, incomplete},
		{[]string{"pack", nomani, out}, incomplete},
		{[]string{"pack", packed, out}, packed + " is already a packed model"},
	}, "safetensors", "device:")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused pack left %s (%v)", out, err)
	}
}

// TestStrayArguments checks that every command without positional
// arguments refuses stray words, naming them, before it loads a model: an
// unquoted prompt must not run as its first word alone.
func TestStrayArguments(t *testing.T) {
	out := filepath.Join(t.TempDir(), "synth")
	cases := []refused{
		{[]string{"run", "-p", "What", "is", "a", "mixture", "-n", "3"}, `unexpected arguments "is" "a" "mixture": sluice run takes no positional arguments; quote the value of -p: -p "What is a mixture"`},
		{[]string{"run", "-p=What", "is", "-n", "3"}, `unexpected argument "is": sluice run takes no positional arguments; quote the value of -p: -p "What is"`},
		{[]string{"run", "-n", "3", "extra", "-p", "hi"}, `unexpected argument "extra": sluice run takes no positional arguments; quote a value that contains spaces`},
		{[]string{"run", "--json", "extra", "-p", "hi"}, `unexpected argument "extra"`},
		{[]string{"tokenize", "--text", "hi", "extra"}, `unexpected argument "extra": sluice tokenize takes no positional arguments; quote the value of --text: --text "hi extra"`},
		{[]string{"chat", "--system", "be", "brief"}, `unexpected argument "brief": sluice chat takes no positional arguments; quote the value of --system: --system "be brief"`},
		{[]string{"score", "--tokens", "1,2", "3"}, `unexpected argument "3": sluice score takes no positional arguments`},
		{[]string{"bench", "--gen", "4", "x"}, `unexpected argument "x": sluice bench takes no positional arguments`},
		{[]string{"sweep", "--pools", "5", "x"}, `unexpected argument "x": sluice sweep takes no positional arguments`},
		{[]string{"pack", "a", "b", "c"}, `want SRC and DST, got 3 arguments ["a" "b" "c"]`},
		{[]string{"inspect", "a", "b"}, `want one DIR, got ["a" "b"]`},
		{[]string{"pull", "a/b", "c"}, `want one REPO, got ["a/b" "c"]`},
		{[]string{"serve", "x"}, `unexpected argument "x": sluice serve takes no positional arguments`},
		{[]string{"synth", "--like", "qwen3-30b-a3b", "--layers", "1", "--experts", "8", "--out", out, "x"}, `unexpected argument "x": sluice synth takes no positional arguments`},
	}
	refusedFirst(t, cases, "prompt ", "experts:")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("synth with a stray argument wrote %s (%v)", out, err)
	}
}

// TestFlagsCheckedFirst checks that bad values of flags are refused with
// the flag named before any work: before a model is opened ("device:" is
// the engine's first line) and before a bench or sweep runs. They used to
// run with a default in their place, or fail after the work.
func TestFlagsCheckedFirst(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "missing", "x.svg")
	cases := []refused{
		{[]string{"run", "-p", "hi", "--threads", "-1"}, "--threads -1 must be >= 0"},
		{[]string{"run", "-p", "hi", "--ctx", "-5"}, "--ctx -5 must be >= 0"},
		{[]string{"run", "-p", "hi", "--chunk", "0"}, "--chunk 0 must be >= 1"},
		{[]string{"run", "-p", "hi", "--chunk", "-1"}, "--chunk -1 must be >= 1"},
		{[]string{"run", "-p", "hi", "--readers", "-3"}, "--readers -3 must be >= 0"},
		{[]string{"run", "-p", "hi", "--memory-gb", "NaN"}, "--memory-gb NaN must be a positive number of GiB"},
		{[]string{"run", "-p", "hi", "--memory-gb", "+Inf"}, "--memory-gb +Inf must be a positive number of GiB"},
		{[]string{"run", "-p", "hi", "--memory-gb", "0"}, "--memory-gb 0 must be a positive number of GiB"},
		{[]string{"run", "-p", "hi", "--memory-gb", "-1"}, "--memory-gb -1 must be a positive number of GiB"},
		{[]string{"run", "-p", "hi", "--pool-mb", "50%", "--cut-weak", "NaN"}, "--cut-weak NaN"},
		{[]string{"run", "-p", "hi", "--vram-gb", "NaN"}, "--vram-gb NaN"},
		{[]string{"run", "-p", "hi", "--repeat-penalty", "0"}, "--repeat-penalty 0: repetition_penalty must be in (0, 10] (1 = off), got 0"},
		{[]string{"chat", "--repeat-penalty", "11"}, "--repeat-penalty 11: repetition_penalty must be in (0, 10]"},
		{[]string{"run", "-n", "5", "--tokens", "1,,2"}, `bad token id "" in --tokens "1,,2"`},
		{[]string{"run", "-n", "5", "--tokens", "1,2,"}, `bad token id "" in --tokens "1,2,"`},
		{[]string{"run", "-n", "5", "--tokens", " , "}, `bad token id "" in --tokens`},
		{[]string{"score", "--tokens", "1,,2"}, `bad token id "" in --tokens "1,,2"`},
		{[]string{"run", "-m", "", "-p", "hi"}, "-m: empty path"},
		{[]string{"run", "-m=", "-p", "hi"}, "-m: empty path"},
		{[]string{"score", "-m", " ", "--tokens", "1,2"}, "-m: empty path"},
		{[]string{"serve", "-m", ""}, "-m: empty path"},
		{[]string{"score", "--tokens", "1,2", "--threads", "-2"}, "--threads -2"},
		{[]string{"chat", "--ctx", "-1"}, "--ctx -1"},
		{[]string{"serve", "--threads", "-1"}, "--threads -1"},
		{[]string{"serve", "--memory-gb", "0"}, "--memory-gb 0 must be a positive number of GiB"},
		{[]string{"serve", "--max-body-kb", "0"}, "--max-body-kb 0 must be >= 1"},
		{[]string{"serve", "--max-body-kb", "-1"}, "--max-body-kb -1 must be >= 1"},
		{[]string{"serve", "--max-body-kb", "9223372036854775807"}, "--max-body-kb 9223372036854775807"},
		{[]string{"serve", "--cache-mb", "-5"}, "--cache-mb -5: want a size in MiB >= 0"},
		{[]string{"serve", "--cache-mb", "NaN"}, "--cache-mb NaN"},
		{[]string{"serve", "--cache-mb", "+Inf"}, "--cache-mb +Inf"},
		{[]string{"serve", "--grace", "-1s"}, "--grace -1s must be >= 0"},
		{[]string{"serve", "--slots", "0"}, "--slots 0 must be >= 1"},
		{[]string{"serve", "--max-queue", "-1"}, "--max-queue -1 must be >= 0"},
		{[]string{"bench", "--prompt", "8", "--gen", "4", "--repeat", "1", "--pool-mb", "100%,0%"}, `--pool-mb "0%": want a percentage in (0,100]`},
		{[]string{"bench", "--prompt", "8", "--gen", "4", "--repeat", "1", "--pool-mb", ","}, `--pool-mb ",": an empty entry`},
		{[]string{"bench", "--prompt", "8", "--gen", "4", "--repeat", "1", "--pool-mb", "50%,,25%"}, "an empty entry"},
		{[]string{"bench", "--prompt", "8", "--gen", "4", "--repeat", "1", "--chunk", "0"}, "--chunk 0"},
		{[]string{"bench", "--gen", "0"}, "--gen 0 must be >= 2"},
		{[]string{"bench", "--prompt", "0"}, "--prompt 0 must be >= 1"},
		{[]string{"bench", "--repeat", "-1"}, "--repeat -1 must be >= 1"},
		{[]string{"bench", "--depth", "-2"}, "--depth -2 must be >= 0"},
		{[]string{"bench", "--drafts", "-1"}, "--drafts -1 must be >= 0"},
		{[]string{"sweep", "--gen", "1", "--svg", ""}, "--gen 1 must be >= 2"},
		{[]string{"sweep", "--rounds", "0", "--svg", ""}, "--rounds 0 must be >= 1"},
		{[]string{"sweep", "--prompt", "8", "--gen", "4", "--repeat", "1", "--svg", svg}, "--svg " + svg + ": directory " + filepath.Dir(svg)},
		{[]string{"sweep", "--prompt", "8", "--gen", "4", "--repeat", "1", "--svg", "", "--readers", "-1"}, "--readers -1"},
	}
	refusedFirst(t, cases, "device:", "tok/s")
}

// TestBadFlagShort checks that a bad flag prints its error and a pointer
// to -h, not the whole flag list that would scroll the error away, and
// that -h prints the list.
func TestBadFlagShort(t *testing.T) {
	for _, args := range [][]string{{"run", "--bogus"}, {"run", "-n", "abc"}, {"bench", "--gen", "x"}} {
		_, e, code := sluice(t, args...)
		if code != 2 || !strings.Contains(e, "'sluice "+args[0]+" -h'") || strings.Count(e, "\n") > 3 {
			t.Errorf("sluice %q: exit %d, stderr %q; want exit 2, the error and a pointer to -h", args, code, e)
		}
	}
	_, e, code := sluice(t, "run", "-h")
	if code != 0 || !strings.Contains(e, "-temp") {
		t.Errorf("sluice run -h: exit %d, stderr %q; want the flag list", code, e)
	}
}

// refused is a command line that must fail with want in its error.
type refused struct {
	args []string
	want string
}

// refusedFirst runs each case and requires it to fail with its error, and
// before any work: stderr holds none of the lines work prints (worked).
func refusedFirst(t *testing.T, cases []refused, worked ...string) {
	t.Helper()
	for _, c := range cases {
		args := c.args
		if args[0] == "serve" {
			// An address no socket binds: should a check go missing,
			// the server fails at once instead of serving until the
			// test's timeout.
			args = append(slices.Clone(args), "--addr", "256.0.0.1:0")
		}
		_, e, code := sluice(t, args...)
		if code == 0 || !strings.Contains(e, c.want) {
			t.Errorf("sluice %q: exit %d, stderr %q; want an error containing %q", c.args, code, e, c.want)
		}
		for _, w := range worked {
			if strings.Contains(e, w) {
				t.Errorf("sluice %q worked (%q) before refusing:\n%s", c.args, w, e)
			}
		}
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// --gpu-cpu-share: auto (the cost model) unless a share is given, 0
// included; an explicit share reaches the engine as it was given.
func TestGPUCPUShareFlag(t *testing.T) {
	for _, c := range []struct {
		args  []string
		auto  bool
		share float64
	}{
		{nil, true, 0},
		{[]string{"--gpu-cpu-share", "auto"}, true, 0},
		{[]string{"--gpu-cpu-share", "0"}, false, 0},
		{[]string{"--gpu-cpu-share", "0.25"}, false, 0.25},
		{[]string{"--gpu-cpu-share", "1"}, false, 1},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		var m modelFlags
		m.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		o, err := m.experts.options(io.Discard)
		if err != nil || o.GPUCPUAuto != c.auto || o.GPUCPUShare != c.share {
			t.Errorf("%v: auto %v, share %v, err %v; want auto %v, share %v", c.args, o.GPUCPUAuto, o.GPUCPUShare, err, c.auto, c.share)
		}
	}
}
