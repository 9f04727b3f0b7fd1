package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
)

// TestSynthGGUFDeepSeek2 writes a small DeepSeek-V3 (its config.json with
// small sizes: MLA, a dense layer first, grouped sigmoid routing, a shared
// expert, yarn, an MTP layer) as a deepseek2 GGUF and reads it back: the
// metadata llama.cpp's loader reads, every tensor it creates with the
// shape it expects (both derived here from the config), nothing else (no
// MTP layer), and the converter's transforms on the values: the rope rows
// of q_b and kv_a back in the checkpoint's interleaved order, kv_b split
// into k_b (transposed per head) and v_b, the correction bias as
// exp_probs_b, everything else bit for bit.
func TestSynthGGUFDeepSeek2(t *testing.T) {
	var hf map[string]any
	if err := json.Unmarshal([]byte(deepSeekV3Config), &hf); err != nil {
		t.Fatal(err)
	}
	const H, nh, qLora, kvl, nope, rope, V, inter, moeInter, E, groups, topGroups = 64, 2, 64, 64, 32, 16, 32, 128, 64, 8, 4, 2
	for k, v := range map[string]any{"hidden_size": H, "num_hidden_layers": 3, "num_attention_heads": nh, "num_key_value_heads": nh,
		"q_lora_rank": qLora, "kv_lora_rank": kvl, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": V,
		"intermediate_size": inter, "moe_intermediate_size": moeInter, "n_routed_experts": E, "n_group": groups,
		"topk_group": topGroups, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "vocab_size": 96} {
		hf[k] = v
	}
	raw0, _ := json.Marshal(hf)
	f, _ := family.Named(family.NameDeepSeek)
	cfg, err := f.Parse(raw0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := synthPack(context.Background(), cfg, format.Q4, dir)
	if err != nil {
		t.Fatal(err)
	}
	dense, err := os.ReadFile(filepath.Join(dir, "dense.bin"))
	if err != nil {
		t.Fatal(err)
	}
	src := map[string]*format.Tensor{}
	for i := range m.Dense {
		src[m.Dense[i].Name] = &m.Dense[i]
	}
	// Distinct values where synth writes a constant, so that the order shows.
	cb := src["layers.2.mlp.gate.e_score_correction_bias"]
	for i := 0; i < E; i++ {
		binary.LittleEndian.PutUint32(dense[cb.Offset+int64(4*i):], math.Float32bits(0.25*float32(i)-0.5))
	}
	if err := os.WriteFile(filepath.Join(dir, "dense.bin"), dense, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "m.gguf")
	if err := synthGGUF(m, dir, path, gguf.Q4_0); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	g, err := gguf.Read(fh, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}

	const a = "deepseek2."
	u := func(v int) uint32 { return uint32(v) }
	y := hf["rope_scaling"].(map[string]any)
	for k, want := range map[string]any{
		"general.architecture": "deepseek2", "general.file_type": u(2), a + "block_count": u(cfg.Layers),
		a + "context_length": u(int(hf["max_position_embeddings"].(float64))), a + "embedding_length": u(H),
		a + "feed_forward_length": u(inter), a + "attention.head_count": u(nh), a + "attention.head_count_kv": u(1),
		a + "attention.key_length": u(kvl + rope), a + "attention.value_length": u(kvl),
		a + "attention.key_length_mla": u(nope + rope), a + "attention.value_length_mla": u(V),
		a + "attention.q_lora_rank": u(qLora), a + "attention.kv_lora_rank": u(kvl), a + "rope.dimension_count": u(rope),
		a + "rope.freq_base": float32(hf["rope_theta"].(float64)), a + "attention.layer_norm_rms_epsilon": float32(1e-6),
		a + "expert_count": u(E), a + "expert_used_count": u(2), a + "expert_feed_forward_length": u(moeInter),
		a + "expert_shared_count": u(1), a + "expert_group_count": u(groups), a + "expert_group_used_count": u(topGroups),
		a + "expert_gating_func": u(2), a + "expert_weights_scale": float32(2.5), a + "expert_weights_norm": true,
		a + "leading_dense_block_count": u(1), a + "vocab_size": u(96),
		a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": float32(y["factor"].(float64)),
		a + "rope.scaling.original_context_length": u(int(y["original_max_position_embeddings"].(float64))),
		a + "rope.scaling.yarn_beta_fast":          float32(y["beta_fast"].(float64)),
		a + "rope.scaling.yarn_beta_slow":          float32(y["beta_slow"].(float64)),
		a + "rope.scaling.yarn_log_multiplier":     float32(0.1 * y["mscale_all_dim"].(float64)),
	} {
		if got := g.Get(k); got != want {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, want, want)
		}
	}
	if g.Get(a+"nextn_predict_layers") != nil {
		t.Errorf("nextn_predict_layers written, but no MTP layer is")
	}

	// The tensors llama.cpp's deepseek2 creates, with ggml dims.
	d := func(x ...int) []uint64 {
		r := make([]uint64, len(x))
		for i, v := range x {
			r[i] = uint64(v)
		}
		return r
	}
	want := map[string][]uint64{"token_embd.weight": d(H, 96), "output_norm.weight": d(H), "output.weight": d(H, 96)}
	for l := 0; l < cfg.Layers; l++ {
		w := map[string][]uint64{"attn_norm.weight": d(H), "attn_q_a_norm.weight": d(qLora), "attn_kv_a_norm.weight": d(kvl),
			"attn_q_a.weight": d(H, qLora), "attn_q_b.weight": d(qLora, nh*(nope+rope)), "attn_kv_a_mqa.weight": d(H, kvl+rope),
			"attn_k_b.weight": d(nope, kvl, nh), "attn_v_b.weight": d(kvl, V, nh), "attn_output.weight": d(nh*V, H),
			"ffn_norm.weight": d(H)}
		if l < 1 {
			w["ffn_gate.weight"], w["ffn_up.weight"], w["ffn_down.weight"] = d(H, inter), d(H, inter), d(inter, H)
		} else {
			for k, v := range map[string][]uint64{"ffn_gate_inp.weight": d(H, E), "exp_probs_b.bias": d(E),
				"ffn_gate_exps.weight": d(H, moeInter, E), "ffn_up_exps.weight": d(H, moeInter, E),
				"ffn_down_exps.weight": d(moeInter, H, E), "ffn_gate_shexp.weight": d(H, moeInter),
				"ffn_up_shexp.weight": d(H, moeInter), "ffn_down_shexp.weight": d(moeInter, H)} {
				w[k] = v
			}
		}
		for k, v := range w {
			want[fmt.Sprintf("blk.%d.%s", l, k)] = v
		}
	}
	got := map[string]*gguf.Tensor{}
	for i := range g.Tensors {
		tt := &g.Tensors[i]
		got[tt.Name] = tt
		if _, ok := want[tt.Name]; !ok {
			t.Errorf("unexpected tensor %s %v", tt.Name, tt.Dims)
		}
	}
	for n, dims := range want {
		if tt := got[n]; tt == nil {
			t.Errorf("missing tensor %s", n)
		} else if !slices.Equal(tt.Dims, dims) {
			t.Errorf("%s: dims %v, want %v", n, tt.Dims, dims)
		}
	}
	if t.Failed() {
		return
	}

	// Values, flat in row-major order: GGUF element i against source
	// element at(i).
	ggufVals := func(name string) []float32 {
		tt := got[name]
		sz, _ := tt.Size()
		b := raw[tt.Offset : tt.Offset+sz]
		n := 1
		for _, x := range tt.Dims {
			n *= int(x)
		}
		v := make([]float32, n)
		switch tt.Type {
		case gguf.F32:
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
		case gguf.Q4_0:
			gguf.DequantizeQ4_0(v, b)
		default:
			t.Fatalf("%s: type %s", name, tt.Type)
		}
		return v
	}
	f32 := func(b []byte, off int64) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[off:])) }
	srcVals := func(buf []byte, st *format.Tensor) []float32 {
		v := make([]float32, st.Rows()*st.Cols())
		for i := range v {
			if st.Kind == format.F32 {
				v[i] = f32(buf, st.Offset+int64(4*i))
				continue
			}
			gi, j := i/format.GroupSize, i%format.GroupSize
			q := buf[st.Offset+int64((i-j)/2+j%32)]
			if j >= 32 {
				q >>= 4
			}
			v[i] = f32(buf, st.ScaleOffset+int64(4*gi))*float32(q&15) + f32(buf, st.BiasOffset+int64(4*gi))
		}
		return v
	}
	check := func(name, srcName string, at func(i int) int) {
		t.Helper()
		gv, sv := ggufVals(name), srcVals(dense, src[srcName])
		for i, v := range gv {
			if v != sv[at(i)] {
				t.Fatalf("%s[%d] = %v, want %v (from %s[%d])", name, i, v, sv[at(i)], srcName, at(i))
			}
		}
	}
	same := func(i int) int { return i }
	// sluice packs rope pair p as rows (p, p+rope/2) of the rope part; the
	// checkpoint and llama.cpp hold it as rows (2p, 2p+1).
	ropeRow := func(r int) int { return r/2 + r%2*rope/2 }
	qk := nope + rope
	check("blk.1.attn_q_b.weight", "layers.1.self_attn.q_b_proj.weight", func(i int) int {
		r, c := i/qLora, i%qLora
		if h, o := r/qk, r%qk; o >= nope {
			r = h*qk + nope + ropeRow(o-nope)
		}
		return r*qLora + c
	})
	check("blk.0.attn_kv_a_mqa.weight", "layers.0.self_attn.kv_a_proj_with_mqa.weight", func(i int) int {
		r, c := i/H, i%H
		if r >= kvl {
			r = kvl + ropeRow(r-kvl)
		}
		return r*H + c
	})
	// kv_b_proj [head][nope+V][kvl]; k_b [head][kvl][nope]; v_b [head][V][kvl].
	check("blk.1.attn_k_b.weight", "layers.1.self_attn.kv_b_proj.weight", func(i int) int {
		h, j, n := i/(kvl*nope), i/nope%kvl, i%nope
		return (h*(nope+V)+n)*kvl + j
	})
	check("blk.0.attn_v_b.weight", "layers.0.self_attn.kv_b_proj.weight", func(i int) int {
		h, r, j := i/(V*kvl), i/kvl%V, i%kvl
		return (h*(nope+V)+nope+r)*kvl + j
	})
	for _, n := range [][2]string{{"blk.2.exp_probs_b.bias", "layers.2.mlp.gate.e_score_correction_bias"},
		{"blk.2.ffn_gate_inp.weight", "layers.2.mlp.gate.weight"}, {"blk.1.attn_q_a.weight", "layers.1.self_attn.q_a_proj.weight"},
		{"blk.1.attn_output.weight", "layers.1.self_attn.o_proj.weight"}, {"blk.0.ffn_down.weight", "layers.0.mlp.down_proj.weight"},
		{"blk.2.ffn_up_shexp.weight", "layers.2.mlp.shared_experts.up_proj.weight"}, {"token_embd.weight", "embed_tokens.weight"},
		{"output.weight", "lm_head.weight"}} {
		check(n[0], n[1], same)
	}

	// Expert e of layer l is record l·E+e.
	recs, err := os.ReadFile(filepath.Join(dir, m.Stores[0].File))
	if err != nil {
		t.Fatal(err)
	}
	st := &m.Stores[0]
	gate := ggufVals("blk.2.ffn_gate_exps.weight")
	for e := 0; e < E; e++ {
		if !slices.Equal(gate[e*H*moeInter:(e+1)*H*moeInter], srcVals(recs[int64(2*E+e)*st.Stride:][:st.Stride], &st.Gate)) {
			t.Fatalf("blk.2.ffn_gate_exps expert %d differs from its record", e)
		}
	}
}
