package main

import (
	"context"
	"encoding/binary"
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

// TestSynthGGUFQwen35 writes a small qwen3_5_moe model as a qwen35moe GGUF
// and reads it back: the metadata llama.cpp's loader reads, every tensor
// it creates with the shape it expects (both derived here from the
// config), nothing else (no MTP layer), and the converter's transforms on
// the values: norms 1+w, A = -exp(A_log), the DeltaNet's value heads in
// tiled order (value head j of key head k at j·keyHeads+k) in every tensor
// that has them, everything else bit for bit.
func TestSynthGGUFQwen35(t *testing.T) {
	lin, full := format.LinearAttention, format.FullAttention
	cfg := format.Config{Family: family.NameQwen35MoE, Hidden: 64, Layers: 4, Vocab: 96, Heads: 2, KVHeads: 1, HeadDim: 64,
		RotaryDim: 16, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 4096, Experts: 4, TopK: 2, MoEInter: 64, SharedInter: 128,
		NormTopK: true, LinearKeyHeads: 2, LinearValueHeads: 6, LinearKeyDim: 32, LinearValueDim: 32, ConvKernel: 4,
		MTPLayers: 1, LayerTypes: []string{lin, lin, lin, full}}
	if err := cfg.Validate(); err != nil {
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
	// Distinct per-head values where synth writes constants, so that the
	// order and the transforms show.
	for _, n := range []string{"layers.1.linear_attn.A_log", "layers.1.linear_attn.dt_bias", "layers.1.input_layernorm.weight"} {
		st := src[n]
		for i := 0; i < st.Cols(); i++ {
			binary.LittleEndian.PutUint32(dense[st.Offset+int64(4*i):], math.Float32bits(0.25*float32(i)-0.5))
		}
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
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := gguf.Read(f, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}

	const a = "qwen35moe."
	u := func(v int) uint32 { return uint32(v) }
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	for k, want := range map[string]any{
		"general.architecture": "qwen35moe", a + "block_count": u(cfg.Layers), a + "embedding_length": u(H),
		a + "attention.head_count": u(cfg.Heads), a + "attention.head_count_kv": u(cfg.KVHeads),
		a + "attention.key_length": u(cfg.HeadDim), a + "attention.value_length": u(cfg.HeadDim),
		a + "rope.dimension_count": u(cfg.RotaryDim), a + "rope.freq_base": float32(cfg.RopeTheta),
		a + "attention.layer_norm_rms_epsilon": float32(cfg.RMSEps), a + "expert_count": u(cfg.Experts),
		a + "expert_used_count": u(cfg.TopK), a + "expert_feed_forward_length": u(cfg.MoEInter),
		a + "expert_shared_feed_forward_length": u(cfg.SharedInter), a + "ssm.conv_kernel": u(cfg.ConvKernel),
		a + "ssm.state_size": u(kd), a + "ssm.group_count": u(nk), a + "ssm.time_step_rank": u(nv),
		a + "ssm.inner_size": u(nv * vd), a + "full_attention_interval": u(4), "general.file_type": u(2),
	} {
		if got := g.Get(k); got != want {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, want, want)
		}
	}
	if s, _ := g.Get(a + "rope.dimension_sections").([]int32); len(s) != 4 {
		t.Errorf("rope.dimension_sections = %v, want 4 sections", g.Get(a+"rope.dimension_sections"))
	}
	if g.Get(a+"nextn_predict_layers") != nil {
		t.Errorf("nextn_predict_layers written, but no MTP layer is")
	}

	// The tensors llama.cpp's qwen35moe creates, with ggml dims.
	d := func(x ...int) []uint64 {
		r := make([]uint64, len(x))
		for i, v := range x {
			r[i] = uint64(v)
		}
		return r
	}
	conv := 2*nk*kd + nv*vd
	want := map[string][]uint64{"token_embd.weight": d(H, cfg.Vocab), "output_norm.weight": d(H), "output.weight": d(H, cfg.Vocab)}
	for l := 0; l < cfg.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		w := map[string][]uint64{"attn_norm.weight": d(H), "post_attention_norm.weight": d(H),
			"ffn_gate_inp.weight": d(H, cfg.Experts), "ffn_gate_exps.weight": d(H, cfg.MoEInter, cfg.Experts),
			"ffn_up_exps.weight": d(H, cfg.MoEInter, cfg.Experts), "ffn_down_exps.weight": d(cfg.MoEInter, H, cfg.Experts),
			"ffn_gate_inp_shexp.weight": d(H), "ffn_gate_shexp.weight": d(H, cfg.SharedInter),
			"ffn_up_shexp.weight": d(H, cfg.SharedInter), "ffn_down_shexp.weight": d(cfg.SharedInter, H)}
		if cfg.LayerTypes[l] == full {
			q := cfg.Heads * cfg.HeadDim
			for k, v := range map[string][]uint64{"attn_q.weight": d(H, 2*q), "attn_k.weight": d(H, cfg.KVHeads*cfg.HeadDim),
				"attn_v.weight": d(H, cfg.KVHeads*cfg.HeadDim), "attn_output.weight": d(q, H),
				"attn_q_norm.weight": d(cfg.HeadDim), "attn_k_norm.weight": d(cfg.HeadDim)} {
				w[k] = v
			}
		} else {
			for k, v := range map[string][]uint64{"attn_qkv.weight": d(H, conv), "attn_gate.weight": d(H, nv*vd),
				"ssm_conv1d.weight": d(cfg.ConvKernel, conv), "ssm_dt.bias": d(nv), "ssm_a": d(nv),
				"ssm_beta.weight": d(H, nv), "ssm_alpha.weight": d(H, nv), "ssm_norm.weight": d(vd),
				"ssm_out.weight": d(nv*vd, H)} {
				w[k] = v
			}
		}
		for k, v := range w {
			want[b+k] = v
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
	for _, n := range []string{"ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight", "attn_norm.weight", "ffn_gate_inp.weight"} {
		if tt := got["blk.1."+n]; tt != nil && tt.Type != gguf.F32 {
			t.Errorf("blk.1.%s is %s, want F32", n, tt.Type)
		}
	}
	if t.Failed() {
		return
	}

	// Values: rows of GGUF tensors against rows of the sources.
	ggufRows := func(name string) [][]float32 {
		tt := got[name]
		cols, n := int(tt.Dims[0]), 1
		for _, x := range tt.Dims[1:] {
			n *= int(x)
		}
		sz, _ := tt.Size()
		v := make([]float32, cols*n)
		b := raw[tt.Offset : tt.Offset+sz]
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
		r := make([][]float32, n)
		for i := range r {
			r[i] = v[i*cols : (i+1)*cols]
		}
		return r
	}
	f32 := func(b []byte, off int64) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[off:])) }
	srcRows := func(buf []byte, st *format.Tensor) [][]float32 {
		rows, cols := st.Rows(), st.Cols()
		r := make([][]float32, rows)
		for i := range r {
			r[i] = make([]float32, cols)
			for c := range r[i] {
				if st.Kind == format.F32 {
					r[i][c] = f32(buf, st.Offset+int64(4*(i*cols+c)))
					continue
				}
				gi := i*(cols/format.GroupSize) + c/format.GroupSize
				j := c % format.GroupSize
				q := buf[st.Offset+int64((i*cols+c-j)/2+j%32)]
				if j >= 32 {
					q >>= 4
				}
				r[i][c] = f32(buf, st.ScaleOffset+int64(4*gi))*float32(q&15) + f32(buf, st.BiasOffset+int64(4*gi))
			}
		}
		return r
	}
	// srcHead is the source value head of value head h in tiled order.
	srcHead := func(h int) int { return h%nk*(nv/nk) + h/nk }
	check := func(name, srcName string, srcRow func(r int) int, srcCol func(c int) int, fn func(float32) float32) {
		t.Helper()
		gr, sr := ggufRows(name), srcRows(dense, src[srcName])
		if len(gr) != len(sr) {
			t.Fatalf("%s: %d rows, source %s %d", name, len(gr), srcName, len(sr))
		}
		for r := range gr {
			for c := range gr[r] {
				want := sr[srcRow(r)][srcCol(c)]
				if fn != nil {
					want = fn(want)
				}
				if gr[r][c] != want {
					t.Fatalf("%s[%d][%d] = %v, want %v (from %s)", name, r, c, gr[r][c], want, srcName)
				}
			}
		}
	}
	same := func(i int) int { return i }
	vRow := func(r int) int { return srcHead(r/vd)*vd + r%vd }
	qkvRow := func(r int) int {
		if r < 2*nk*kd {
			return r
		}
		return 2*nk*kd + vRow(r-2*nk*kd)
	}
	plus1 := func(v float32) float32 { return 1 + v }
	check("blk.1.attn_norm.weight", "layers.1.input_layernorm.weight", same, same, plus1)
	check("blk.3.attn_q_norm.weight", "layers.3.self_attn.q_norm.weight", same, same, plus1)
	check("output_norm.weight", "norm.weight", same, same, plus1)
	check("blk.1.ssm_norm.weight", "layers.1.linear_attn.norm.weight", same, same, nil)
	check("blk.1.ssm_a", "layers.1.linear_attn.A_log", same, srcHead, func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	check("blk.1.ssm_dt.bias", "layers.1.linear_attn.dt_bias", same, srcHead, nil)
	check("blk.1.attn_qkv.weight", "layers.1.linear_attn.in_proj_qkv.weight", qkvRow, same, nil)
	check("blk.1.ssm_conv1d.weight", "layers.1.linear_attn.conv1d.weight", qkvRow, same, nil)
	check("blk.1.attn_gate.weight", "layers.1.linear_attn.in_proj_z.weight", vRow, same, nil)
	check("blk.1.ssm_beta.weight", "layers.1.linear_attn.in_proj_b.weight", srcHead, same, nil)
	check("blk.1.ssm_alpha.weight", "layers.1.linear_attn.in_proj_a.weight", srcHead, same, nil)
	check("blk.1.ssm_out.weight", "layers.1.linear_attn.out_proj.weight", same, vRow, nil)
	check("blk.3.attn_q.weight", "layers.3.self_attn.q_proj.weight", same, same, nil)
	check("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight", same, same, nil)
	check("blk.2.ffn_gate_inp.weight", "layers.2.mlp.gate.weight", same, same, nil)
	check("blk.2.ffn_gate_inp_shexp.weight", "layers.2.mlp.shared_expert_gate.weight", same, same, nil)
	check("blk.2.ffn_down_shexp.weight", "layers.2.mlp.shared_expert.down_proj.weight", same, same, nil)
	check("token_embd.weight", "embed_tokens.weight", same, same, nil)

	// Expert e of layer l is record l·E+e.
	recs, err := os.ReadFile(filepath.Join(dir, m.Stores[0].File))
	if err != nil {
		t.Fatal(err)
	}
	st := &m.Stores[0]
	down := ggufRows("blk.2.ffn_down_exps.weight")
	for e := 0; e < cfg.Experts; e++ {
		rec := recs[int64(2*cfg.Experts+e)*st.Stride:][:st.Stride]
		for r, row := range srcRows(rec, &st.Down) {
			if !slices.Equal(down[e*H+r], row) {
				t.Fatalf("blk.2.ffn_down_exps expert %d row %d differs from its record", e, r)
			}
		}
	}
}
