package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
	"github.com/sluicelm/sluice/internal/quant"
)

// TestGGUFTensor converts affine q4 and q8 tensors to Q4_0 and Q8_0 and
// compares llama.cpp's dequantisation of the result with the affine
// values computed here: equal where synth's scales make the conversion
// exact, within the GGUF type's rounding elsewhere.
func TestGGUFTensor(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const rows, cols = 3, 128
	ng := cols / format.GroupSize
	for _, kind := range []format.Kind{format.Q4, format.Q8} {
		for _, exact := range []bool{true, false} {
			vb, sb := kind.Sizes(rows, cols)
			buf := make([]byte, vb+2*sb)
			fillRandom(r, buf[:vb])
			tt := format.Tensor{Name: "w", Kind: kind, Shape: []int{rows, cols}, Offset: 0, Size: vb, ScaleOffset: vb, BiasOffset: vb + sb}
			scales, biases := make([]float32, rows*ng), make([]float32, rows*ng)
			for i := range scales {
				sc, bi := synthScale(kind, float32(0.01+r.Float64()))
				if !exact {
					sc = quant.RoundF16(sc * 1.01)
					bi = quant.RoundF16(-float32(r.Float64()))
				}
				scales[i], biases[i] = sc, bi
				binary.LittleEndian.PutUint16(buf[vb+int64(2*i):], quant.F16(sc))
				binary.LittleEndian.PutUint16(buf[vb+sb+int64(2*i):], quant.F16(bi))
			}
			// The affine values, from the format's definition.
			want := make([]float32, rows*cols)
			for i := range want {
				row, col := i/cols, i%cols
				g, j := col/format.GroupSize, col%format.GroupSize
				var q byte
				if kind == format.Q8 {
					q = buf[i]
				} else if j < 32 {
					q = buf[(row*cols+g*64)/2+j] & 15
				} else {
					q = buf[(row*cols+g*64)/2+j-32] >> 4
				}
				want[i] = scales[row*ng+g]*float32(q) + biases[row*ng+g]
			}
			for _, gt := range []gguf.Type{gguf.Q4_0, gguf.Q8_0} {
				var w bytes.Buffer
				if err := ggufTensor(&w, buf, &tt, gt, ggufXform{}); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, rows*cols)
				if gt == gguf.Q4_0 {
					gguf.DequantizeQ4_0(got, w.Bytes())
				} else {
					gguf.DequantizeQ8_0(got, w.Bytes())
				}
				lossless := exact && !(kind == format.Q8 && gt == gguf.Q4_0)
				for i := range want {
					// Off by at most half a step of the GGUF block's scale
					// (the block spans at most 2·max|v|), plus f16 rounding.
					tol := 0.0
					if !lossless {
						m := 0.0
						b := i / gguf.BlockSize * gguf.BlockSize
						for _, v := range want[b : b+gguf.BlockSize] {
							m = max(m, math.Abs(float64(v)))
						}
						tol = m/7 + 1e-3*m
						if gt == gguf.Q8_0 {
							tol = m/127 + 1e-3*m
						}
					}
					if d := math.Abs(float64(got[i] - want[i])); d > tol {
						t.Fatalf("%s exact=%v to %s: [%d] = %v, want %v", kind, exact, gt, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestSynthDeepSeekV3: --like deepseek-v3.2 writes DeepSeek-V3's real
// shapes (those of its public config.json: hidden 7168, vocab 129280, 128
// heads, MLA q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, experts
// of 2048 routed top-8 within the top 4 of 8 groups, a shared expert,
// dense layers of 18432 first, an MTP layer) with V3.2's indexer (64 heads
// of 128, top 2048), cut to 2 layers and 16 experts; inspect reports them,
// and the model decodes a few steps, with drafts from its MTP layer giving
// the same tokens. deepseek-v3 is the same config without the indexer.
func TestSynthDeepSeekV3(t *testing.T) {
	for like, topK := range map[string]int{"deepseek-v3": 0, "deepseek-v3.2": 2048} {
		c, found, err := synthLike(like)
		var a family.DeepSeekArch
		if err == nil {
			err = json.Unmarshal(c.Arch, &a)
		}
		if !found || err != nil || c.Family != family.NameDeepSeek || a.IndexTopK != topK || topK > 0 && (a.IndexHeads != 64 || a.IndexHeadDim != 128) {
			t.Fatalf("--like %s: %v %v, family %s, indexer %d heads of %d, top %d", like, found, err, c.Family, a.IndexHeads, a.IndexHeadDim, a.IndexTopK)
		}
	}
	dir := filepath.Join(t.TempDir(), "ds")
	ok(t, "synth", "--like", "deepseek-v3.2", "--layers", "2", "--experts", "16", "--route", "router", "--out", dir)
	out, _ := ok(t, "inspect", "--json", dir)
	var raw map[string]any
	decode(t, out, &raw)
	cfg, _ := raw["config"].(map[string]any)
	arch, _ := cfg["arch"].(map[string]any)
	want := map[string]float64{
		"hidden_size": 7168, "num_hidden_layers": 2, "vocab_size": 129280, "num_attention_heads": 128,
		"num_experts": 16, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "shared_expert_intermediate_size": 2048,
		"first_k_dense_replace": 1, "mtp_num_hidden_layers": 1,
		"arch.q_lora_rank": 1536, "arch.kv_lora_rank": 512, "arch.qk_nope_head_dim": 128, "arch.qk_rope_head_dim": 64,
		"arch.v_head_dim": 128, "arch.intermediate_size": 18432, "arch.n_group": 8, "arch.topk_group": 4,
		"arch.routed_scaling_factor": 2.5, "arch.index_topk": 2048, "arch.index_n_heads": 64, "arch.index_head_dim": 128,
	}
	for k, v := range want {
		m, key := cfg, k
		if a, ok := strings.CutPrefix(k, "arch."); ok {
			m, key = arch, a
		}
		if got, _ := m[key].(float64); got != v {
			t.Errorf("inspect: %s = %v, want %v", k, m[key], v)
		}
	}
	// Tensor shapes in the manifest: MLA projections, the MTP layer, the
	// expert record.
	var mf struct {
		Dense []struct {
			Name  string `json:"name"`
			Shape []int  `json:"shape"`
		} `json:"dense"`
		Stores []struct {
			Gate, Down struct {
				Shape []int `json:"shape"`
			}
		} `json:"stores"`
	}
	readJSONFile(t, filepath.Join(dir, "manifest.json"), &mf)
	shapes := map[string][]int{}
	for _, d := range mf.Dense {
		shapes[d.Name] = d.Shape
	}
	for n, s := range map[string][]int{
		"embed_tokens.weight": {129280, 7168}, "layers.0.self_attn.q_a_proj.weight": {1536, 7168},
		"layers.0.self_attn.q_b_proj.weight": {128 * 192, 1536}, "layers.1.self_attn.kv_a_proj_with_mqa.weight": {576, 7168},
		"layers.1.self_attn.kv_b_proj.k_t.weight": {128 * 512, 128}, "layers.1.self_attn.kv_b_proj.v.weight": {128 * 128, 512}, "layers.1.self_attn.o_proj.weight": {7168, 128 * 128},
		"layers.0.mlp.gate_proj.weight": {18432, 7168}, "layers.1.mlp.gate.weight": {16, 7168},
		"layers.1.mlp.shared_experts.down_proj.weight": {7168, 2048}, "layers.2.eh_proj.weight": {7168, 2 * 7168},
		"layers.2.shared_head.norm.weight": {7168}, "lm_head.weight": {129280, 7168},
		"layers.1.self_attn.indexer.wq_b.weight": {64 * 128, 1536}, "layers.1.self_attn.indexer.wk.weight": {128, 7168},
		"layers.1.self_attn.indexer.weights_proj.weight": {64, 7168}, "layers.1.self_attn.indexer.k_norm.bias": {128},
	} {
		if !slices.Equal(shapes[n], s) {
			t.Errorf("%s: shape %v, want %v", n, shapes[n], s)
		}
	}
	if len(mf.Stores) != 1 || !slices.Equal(mf.Stores[0].Gate.Shape, []int{2048, 7168}) || !slices.Equal(mf.Stores[0].Down.Shape, []int{7168, 2048}) {
		t.Errorf("expert record %+v, want gate 2048×7168, down 7168×2048", mf.Stores)
	}
	checkDrafts(t, dir, 4, 2)
	for _, bad := range [][]string{{"--experts", "12"}, {"--experts", "4"}, {"--like", "deepseek-v4"}, {"--gguf", "x.gguf", "--like", "deepseek-v3.2"}} {
		_, e, code := sluice(t, append([]string{"synth", "--out", filepath.Join(t.TempDir(), "x"), "--like", "deepseek-v3"}, bad...)...)
		if code == 0 || !strings.Contains(e, bad[0]) {
			t.Errorf("synth %v: exit %d, %q", bad, code, e)
		}
	}
}

func readJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestSynthGLM45Air: --like glm-4.5-air writes GLM-4.5-Air's real shapes
// (hidden 4096, vocab 151552, 96 heads / 8 kv heads of 128 with q/k/v
// biases, a rope over 64 of them, experts of 1408 routed top-8, a shared
// expert, an MTP layer), cut to one layer and 8 experts; inspect reports
// them, and the model decodes with drafts from its MTP layer giving the
// same tokens.
func TestSynthGLM45Air(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "air")
	ok(t, "synth", "--like", "glm-4.5-air", "--layers", "1", "--experts", "8", "--route", "router", "--out", dir)
	out, _ := ok(t, "inspect", "--json", dir)
	var raw map[string]any
	decode(t, out, &raw)
	cfg, _ := raw["config"].(map[string]any)
	for k, v := range map[string]float64{"hidden_size": 4096, "num_hidden_layers": 1, "vocab_size": 151552, "num_attention_heads": 96,
		"num_key_value_heads": 8, "head_dim": 128, "rotary_dim": 64, "rope_theta": 1e6, "num_experts": 8, "num_experts_per_tok": 8,
		"moe_intermediate_size": 1408, "shared_expert_intermediate_size": 1408, "mtp_num_hidden_layers": 1} {
		if got, _ := cfg[k].(float64); got != v {
			t.Errorf("inspect: %s = %v, want %v", k, cfg[k], v)
		}
	}
	var mf struct {
		Dense []struct {
			Name  string `json:"name"`
			Shape []int  `json:"shape"`
		} `json:"dense"`
	}
	readJSONFile(t, filepath.Join(dir, "manifest.json"), &mf)
	shapes := map[string][]int{}
	for _, d := range mf.Dense {
		shapes[d.Name] = d.Shape
	}
	for n, s := range map[string][]int{
		"layers.0.self_attn.q_proj.weight": {96 * 128, 4096}, "layers.0.self_attn.q_proj.bias": {96 * 128},
		"layers.0.self_attn.k_proj.bias": {8 * 128}, "layers.0.mlp.gate.e_score_correction_bias": {8},
		"layers.1.eh_proj.weight": {4096, 2 * 4096}, "layers.1.self_attn.v_proj.weight": {8 * 128, 4096},
	} {
		if !slices.Equal(shapes[n], s) {
			t.Errorf("%s: shape %v, want %v", n, shapes[n], s)
		}
	}
	checkDrafts(t, dir, 3, 1)
}

// checkDrafts runs n greedy tokens of the synthetic model in dir plainly
// and with the given drafts per step: the tokens must be equal, and the MTP
// layer must have drafted.
func checkDrafts(t *testing.T, dir string, n, drafts int) {
	t.Helper()
	type runOut struct {
		Tokens []int `json:"tokens"`
		Stats  struct {
			MTP *struct {
				Drafted int `json:"drafted"`
			} `json:"mtp"`
		} `json:"stats"`
	}
	var plain, drafted runOut
	args := []string{"run", "-m", dir, "--temp", "0", "-n", strconv.Itoa(n), "--ignore-eos", "--json", "--threads", "2", "--tokens", "1,2,3"}
	o, _ := ok(t, args...)
	decode(t, o, &plain)
	o, _ = ok(t, append(args, "--drafts", strconv.Itoa(drafts))...)
	decode(t, o, &drafted)
	if len(plain.Tokens) != n || !slices.Equal(plain.Tokens, drafted.Tokens) {
		t.Errorf("tokens %v, with drafts %v: want %d equal", plain.Tokens, drafted.Tokens, n)
	}
	if m := drafted.Stats.MTP; m == nil || m.Drafted == 0 {
		t.Errorf("--drafts %d: the MTP layer drafted nothing (%+v)", drafts, m)
	}
}

// TestSynthGPTOSS20B: --like gpt-oss-20b writes gpt-oss-20b's shapes
// (its public config.json) with MXFP4 expert records at 4 bits, as pack
// keeps the release's, q4 ones with --mxfp4=false and q8 ones at 8 bits;
// the model decodes.
func TestSynthGPTOSS20B(t *testing.T) {
	for _, c := range []struct {
		bits, mx string
		want     format.Kind
	}{{"4", "true", format.MXFP4}, {"4", "false", format.Q4}, {"8", "true", format.Q8}} {
		bits, want := c.bits, c.want
		dir := filepath.Join(t.TempDir(), "goss")
		ok(t, "synth", "--like", "gpt-oss-20b", "--layers", "1", "--experts", "4", "--bits", bits, "--mxfp4="+c.mx, "--route", "router", "--out", dir)
		out, _ := ok(t, "inspect", "--json", dir)
		var raw map[string]any
		decode(t, out, &raw)
		cfg, _ := raw["config"].(map[string]any)
		for k, v := range map[string]float64{"hidden_size": 2880, "num_hidden_layers": 1, "vocab_size": 201088, "num_attention_heads": 64,
			"num_key_value_heads": 8, "head_dim": 64, "num_experts": 4, "num_experts_per_tok": 4, "moe_intermediate_size": 2880,
			"sliding_window": 128, "rope_theta": 150000} {
			if got, _ := cfg[k].(float64); got != v {
				t.Errorf("--bits %s: inspect: %s = %v, want %v", bits, k, cfg[k], v)
			}
		}
		var mf format.Manifest
		readJSONFile(t, filepath.Join(dir, "manifest.json"), &mf)
		if k := mf.Stores[0].Kind; k != want {
			t.Errorf("--bits %s: expert records are %s, want %s", bits, k, want)
		}
		o, _ := ok(t, "run", "-m", dir, "--temp", "0", "-n", "3", "--ignore-eos", "--json", "--threads", "2", "--tokens", "1,2,3")
		var r struct {
			Tokens []int `json:"tokens"`
		}
		decode(t, o, &r)
		if len(r.Tokens) != 3 {
			t.Errorf("--bits %s: run gave tokens %v, want 3", bits, r.Tokens)
		}
	}
}
