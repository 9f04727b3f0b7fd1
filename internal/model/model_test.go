package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/testutil"
	"github.com/sluicelm/sluice/internal/testutil/ref"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

func load(t testing.TB, name string, bits int) *Model {
	t.Helper()
	m, err := Load(testutil.Packed(t, name, bits))
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewResidentProvider(m)
	if err != nil {
		t.Fatal(err)
	}
	m.Experts = p
	t.Cleanup(func() { m.Close() })
	return m
}

// TestConformance checks the exact (bf16) mode against transformers: argmax
// per position (a mismatch only where the reference's top two are within
// 1e-3), last-position logits within testutil.LogitTol (1e-3).
func TestConformance(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			m := load(t, name, 16)
			refs := testutil.LoadRefs(t, name)
			r := NewRunner(m, 2, 64)
			defer r.Close()
			V := m.Config.Vocab
			for ci, c := range refs.Cases {
				st, err := m.NewState(len(c.Prompt))
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(c.Prompt)*V)
				if err := r.Forward(st, c.Prompt, out, true); err != nil {
					t.Fatal(err)
				}
				for p := range c.Prompt {
					got := sample.Argmax(out[p*V : (p+1)*V])
					if got != c.Argmax[p] {
						lp := c.Top5Logprobs[p]
						if math.Abs(lp[0]-lp[1]) > 1e-3 {
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
					t.Logf("case 0: last logits max abs diff %.2e", worst)
				}
				if worst > testutil.LogitTol(name) {
					t.Errorf("case %d: last logits differ by up to %g", ci, worst)
				}
			}
		})
	}
}

// TestGreedy decodes 48 tokens greedily in exact mode and requires the
// reference's tokens, up to a step whose top two logits are within 1e-3.
func TestGreedy(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			m := load(t, name, 16)
			refs := testutil.LoadRefs(t, name)
			r := NewRunner(m, 2, 64)
			defer r.Close()
			V := m.Config.Vocab
			logits := make([]float32, V)
			for ci, c := range refs.Cases {
				st, _ := m.NewState(len(c.Prompt) + len(c.Greedy))
				if err := r.Forward(st, c.Prompt, logits, false); err != nil {
					t.Fatal(err)
				}
				var got []int
				var gaps []float64
				for len(got) < len(c.Greedy) {
					next := sample.Argmax(logits)
					got, gaps = append(got, next), append(gaps, top2Gap(logits))
					if err := r.Forward(st, []int{next}, logits, false); err != nil {
						t.Fatal(err)
					}
				}
				for i := range got {
					if got[i] != c.Greedy[i] {
						// Exact for every model but tiny-qwen3-next, whose
						// references carry rounded rope tables (see
						// testutil.LogitTol): there, a step whose top two
						// are within 1e-3 may go either way, and
						// TestQwen3NextReferenceRope checks its tokens
						// exactly under the references' rope.
						if name != "tiny-qwen3-next" || gaps[i] > 1e-3 {
							t.Errorf("case %d: greedy token %d is %d, want %d (top two %.2e apart)\n got %v\nwant %v", ci, i, got[i], c.Greedy[i], gaps[i], got, c.Greedy)
						}
						break
					}
				}
			}
		})
	}
}

// TestBatchInvariance requires bit-identical logits whether a prompt runs in
// one batch, token by token, in odd-sized chunks, or on one thread.
func TestBatchInvariance(t *testing.T) {
	for _, name := range testutil.Models {
		for _, bits := range []int{16, 4} {
			t.Run(fmt.Sprintf("%s/%d", name, bits), func(t *testing.T) {
				m := load(t, name, bits)
				c := testutil.LoadRefs(t, name).Cases[0]
				V := m.Config.Vocab
				run := func(threads, rows int) []float32 {
					r := NewRunner(m, threads, rows)
					defer r.Close()
					st, _ := m.NewState(len(c.Prompt))
					out := make([]float32, len(c.Prompt)*V)
					if err := r.Forward(st, c.Prompt, out, true); err != nil {
						t.Fatal(err)
					}
					return out
				}
				want := run(2, 128)
				for _, v := range []struct{ threads, rows int }{{2, 1}, {2, 7}, {1, 128}, {1, 13}} {
					got := run(v.threads, v.rows)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("threads %d rows %d: logit %d (pos %d) = %v, one-shot %v", v.threads, v.rows, i, i/V, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// TestQuantisedNLL compares held-out NLL on the long cases at 8 and 4 bits
// with the exact mode: within 0.5% and 4%.
func TestQuantisedNLL(t *testing.T) {
	if testing.Short() {
		t.Skip("long prompts")
	}
	if raceEnabled {
		t.Skip("quantisation accuracy, not concurrency: too slow under the race detector")
	}
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			refs := testutil.LoadRefs(t, name)
			nll := map[int]float64{}
			for _, bits := range []int{16, 8, 4} {
				m := load(t, name, bits)
				r := NewRunner(m, 2, 64)
				V := m.Config.Vocab
				var sum float64
				var n int
				for _, c := range refs.Long {
					st, _ := m.NewState(len(c.Prompt))
					out := make([]float32, len(c.Prompt)*V)
					if err := r.Forward(st, c.Prompt, out, true); err != nil {
						t.Fatal(err)
					}
					for p := 0; p+1 < len(c.Prompt); p++ {
						sum -= ref.LogSoftmax(out[p*V : (p+1)*V])[c.Prompt[p+1]]
						n++
					}
				}
				r.Close()
				nll[bits] = sum / float64(n)
			}
			t.Logf("held-out NLL: bf16 %.4f, q8 %.4f (%+.2f%%), q4 %.4f (%+.2f%%)", nll[16], nll[8], 100*(nll[8]/nll[16]-1), nll[4], 100*(nll[4]/nll[16]-1))
			if d := math.Abs(nll[8]/nll[16] - 1); d > 0.005 {
				t.Errorf("q8 NLL off by %.2f%%, want <= 0.5%%", 100*d)
			}
			if d := math.Abs(nll[4]/nll[16] - 1); d > 0.04 {
				t.Errorf("q4 NLL off by %.2f%%, want <= 4%%", 100*d)
			}
		})
	}
}

// TestDecodeAllocs keeps the decode step allocation-free.
func TestDecodeAllocs(t *testing.T) {
	for _, name := range testutil.Models {
		m := load(t, name, 4)
		r := NewRunner(m, 2, 16)
		st, _ := m.NewState(512)
		logits := make([]float32, m.Config.Vocab)
		tok := []int{42}
		if err := r.Forward(st, []int{1, 2, 3}, logits, false); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(50, func() {
			if err := r.Forward(st, tok, logits, false); err != nil {
				t.Fatal(err)
			}
		})
		r.Close()
		if allocs != 0 {
			t.Errorf("%s: decode step allocates %.1f times", name, allocs)
		}
	}
}

// TestLayers compares every named intermediate with the reference dump of
// refs/layers, so a departure is located at its block.
func TestLayers(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(testutil.Shared(t), "refs", "layers", name+"-layers.json"))
			if os.IsNotExist(err) {
				t.Skipf("no per-layer references for %s", name)
			}
			if err != nil {
				t.Fatal(err)
			}
			var ref struct {
				Prompt []int                      `json:"prompt"`
				Embed  [][]float64                `json:"embed"`
				Layers map[string]json.RawMessage `json:"layers"`
			}
			if err := json.Unmarshal(b, &ref); err != nil {
				t.Fatal(err)
			}
			m := load(t, name, 16)
			r := NewRunner(m, 2, 64)
			defer r.Close()
			compared := 0
			r.Trace = func(key string, layer, rows int, data []float32) {
				k := key
				if layer >= 0 {
					k = fmt.Sprintf("%d.%s", layer, key)
				}
				raw, ok := ref.Layers[k]
				if !ok {
					return
				}
				var want [][]float64
				if json.Unmarshal(raw, &want) != nil {
					return // integer dumps (topk ids) are compared through routing elsewhere
				}
				w := len(data) / rows
				var worst, scale float64
				for i := range want {
					for j, v := range want[i] {
						worst = math.Max(worst, math.Abs(float64(data[i*w+j])-v))
						scale = math.Max(scale, math.Abs(v))
					}
				}
				if worst > 1e-4*(1+scale) {
					t.Errorf("%s: max abs diff %.3g (scale %.3g)", k, worst, scale)
				}
				compared++
			}
			st, _ := m.NewState(len(ref.Prompt))
			out := make([]float32, m.Config.Vocab)
			if err := r.Forward(st, ref.Prompt, out, false); err != nil {
				t.Fatal(err)
			}
			if compared < 6*5 {
				t.Errorf("compared only %d intermediates", compared)
			}
		})
	}
}

// TestBadInput: errors, never panics, for out-of-range tokens, overflowing
// the context, and damaged packed directories.
func TestBadInput(t *testing.T) {
	m := load(t, "tiny-qwen3-moe", 4)
	r := NewRunner(m, 2, 8)
	defer r.Close()
	st, _ := m.NewState(4)
	out := make([]float32, m.Config.Vocab)
	for _, tc := range []struct {
		name string
		toks []int
		want string
	}{
		{"empty", nil, "no tokens"},
		{"negative", []int{-1}, "outside the vocabulary"},
		{"too large", []int{m.Config.Vocab}, "outside the vocabulary"},
		{"over context", []int{1, 2, 3, 4, 5}, "exceed the context"},
	} {
		err := r.Forward(st, tc.toks, out, false)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Error("missing dir: no error")
	}
	src := testutil.Packed(t, "tiny-qwen3-moe", 4)
	damage := func(file string, f func(b []byte) []byte) string {
		d := t.TempDir()
		for _, n := range []string{"manifest.json", "dense.bin", "experts.bin"} {
			b, err := os.ReadFile(filepath.Join(src, n))
			if err != nil {
				t.Fatal(err)
			}
			if n == file {
				b = f(b)
			}
			os.WriteFile(filepath.Join(d, n), b, 0o644)
		}
		return d
	}
	half := func(b []byte) []byte { return b[:len(b)/2] }
	if _, err := Load(damage("dense.bin", half)); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated dense.bin: %v", err)
	}
	if _, err := Load(damage("manifest.json", half)); err == nil {
		t.Error("truncated manifest: no error")
	}
	if _, err := Load(damage("manifest.json", func(b []byte) []byte {
		return []byte(strings.Replace(string(b), fmt.Sprintf(`"format": %d`, format.MinVersion), `"format": 99`, 1))
	})); err == nil || !strings.Contains(err.Error(), "format") {
		t.Errorf("wrong format version: %v", err)
	}
	bad, err := Load(damage("experts.bin", half))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := NewResidentProvider(bad); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated experts.bin: %v", err)
	}
}

// TestStateCopy: a sequence resumed from a copied state continues exactly as
// the original.
func TestStateCopy(t *testing.T) {
	m := load(t, "tiny-qwen3-5-moe", 4)
	r := NewRunner(m, 2, 16)
	defer r.Close()
	p := testutil.LoadRefs(t, "tiny-qwen3-5-moe").Cases[0].Prompt
	V := m.Config.Vocab
	a, _ := m.NewState(256)
	b, _ := m.NewState(128)
	la, lb := make([]float32, V), make([]float32, V)
	if err := r.Forward(a, p[:40], la, false); err != nil {
		t.Fatal(err)
	}
	if err := b.CopyFrom(a); err != nil {
		t.Fatal(err)
	}
	if err := r.Forward(a, p[40:60], la, false); err != nil {
		t.Fatal(err)
	}
	if err := r.Forward(b, p[40:60], lb, false); err != nil {
		t.Fatal(err)
	}
	for i := range la {
		if la[i] != lb[i] {
			t.Fatalf("logit %d: original %v, resumed copy %v", i, la[i], lb[i])
		}
	}
}

// A decode step's state traffic, from each model's config.json: a full
// attention layer reads every position's keys and values and writes its
// own, a sliding one its window's, DeepSeek's sparse attention the latents
// of the indexer's top-k (and, past it, every indexer key), and a DeltaNet
// layer reads and writes its conv history and recurrent matrix.
func TestStepStateBytes(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-5-moe", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-deepseek-v32"} {
		t.Run(name, func(t *testing.T) {
			m := load(t, name, 4)
			c := testutil.ReadJSON(t, filepath.Join(testutil.ModelDir(t, name), "config.json"))
			if tc, ok := c["text_config"].(map[string]any); ok {
				c = tc
			}
			num := func(k string) int64 {
				v, ok := c[k].(float64)
				if !ok {
					t.Fatalf("config.json has no %s", k)
				}
				return int64(v)
			}
			layers := num("num_hidden_layers")
			types := make([]string, layers)
			if lt, ok := c["layer_types"].([]any); ok {
				for i := range types {
					types[i] = lt[i].(string)
				}
			}
			for _, pos := range []int{0, 31, 32, 63, 64, 200} {
				n := int64(pos + 1)
				var f int64
				for _, typ := range types {
					switch typ {
					case "", "full_attention":
						f += 2 * (n + 1) * num("num_key_value_heads") * num("head_dim")
					case "sliding_attention":
						f += 2 * (min(n, num("sliding_window")) + 1) * num("num_key_value_heads") * num("head_dim")
					case "deepseek_sparse_attention":
						lat, keys := n, int64(0)
						if n > num("index_topk") {
							lat, keys = num("index_topk"), n
						}
						f += (lat+1)*(num("kv_lora_rank")+num("qk_rope_head_dim")) + (keys+1)*num("index_head_dim")
					case "linear_attention":
						conv := 2*num("linear_num_key_heads")*num("linear_key_head_dim") + num("linear_num_value_heads")*num("linear_value_head_dim")
						rec := num("linear_num_value_heads") * num("linear_key_head_dim") * num("linear_value_head_dim")
						f += 2 * ((num("linear_conv_kernel_dim")-1)*conv + rec)
					default:
						t.Fatalf("layer type %q", typ)
					}
				}
				if got := m.StepStateBytes(pos); got != 4*f {
					t.Errorf("position %d: %d bytes, want %d", pos, got, 4*f)
				}
			}
		})
	}
}
