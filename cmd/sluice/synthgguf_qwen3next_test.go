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

// q3nCheckpoint is a checkpoint of named float tensors, for reading a
// GGUF tensor back as the checkpoint tensor it was converted from.
type q3nCheckpoint struct {
	family.Checkpoint
	t map[string][]float32
}

func (c q3nCheckpoint) Has(name string) bool { return c.t[name] != nil }
func (c q3nCheckpoint) Float32(name string, _ []int) ([]float32, error) {
	if c.t[name] == nil {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return c.t[name], nil
}

// TestSynthGGUFQwen3Next writes a small qwen3_next model as a qwen3next
// GGUF and reads it back: the metadata llama.cpp's loader reads, every
// tensor it creates with the shape it expects (both derived here from the
// config), nothing else (no MTP layer), and the converter's transforms on
// the values: norms 1+w, A = -exp(A_log), ssm_ba the checkpoint's fused
// in_proj_ba (the family's packer, reading it as in_proj_ba, gives back
// the pack's in_proj_b and in_proj_a), everything else bit for bit, with
// the value heads in the checkpoint's order.
func TestSynthGGUFQwen3Next(t *testing.T) {
	lin, full := format.LinearAttention, format.FullAttention
	cfg := format.Config{Family: family.NameQwen3Next, Hidden: 64, Layers: 4, Vocab: 96, Heads: 2, KVHeads: 1, HeadDim: 64,
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
	// Distinct values where synth writes constants, so that the transforms
	// and any reordering show.
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

	const a = "qwen3next."
	u := func(v int) uint32 { return uint32(v) }
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	for k, want := range map[string]any{
		"general.architecture": "qwen3next", a + "block_count": u(cfg.Layers), a + "embedding_length": u(H),
		a + "attention.head_count": u(cfg.Heads), a + "attention.head_count_kv": u(cfg.KVHeads),
		a + "attention.key_length": u(cfg.HeadDim), a + "attention.value_length": u(cfg.HeadDim),
		a + "rope.dimension_count": u(cfg.RotaryDim), a + "rope.freq_base": float32(cfg.RopeTheta),
		a + "attention.layer_norm_rms_epsilon": float32(cfg.RMSEps), a + "expert_count": u(cfg.Experts),
		a + "expert_used_count": u(cfg.TopK), a + "expert_feed_forward_length": u(cfg.MoEInter),
		a + "expert_shared_feed_forward_length": u(cfg.SharedInter), a + "ssm.conv_kernel": u(cfg.ConvKernel),
		a + "ssm.state_size": u(kd), a + "ssm.group_count": u(nk), a + "ssm.time_step_rank": u(nv),
		a + "ssm.inner_size": u(nv * vd), a + "full_attention_interval": u(4), "general.file_type": u(2),
		a + "nextn_predict_layers": nil, a + "rope.dimension_sections": nil,
	} {
		if got := g.Get(k); got != want {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, want, want)
		}
	}

	// The tensors llama.cpp's qwen3next creates, with ggml dims.
	d := func(x ...int) []uint64 {
		r := make([]uint64, len(x))
		for i, v := range x {
			r[i] = uint64(v)
		}
		return r
	}
	conv, q, kv := 2*nk*kd+nv*vd, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	want := map[string][]uint64{"token_embd.weight": d(H, cfg.Vocab), "output_norm.weight": d(H), "output.weight": d(H, cfg.Vocab)}
	for l := 0; l < cfg.Layers; l++ {
		w := map[string][]uint64{"attn_norm.weight": d(H), "post_attention_norm.weight": d(H),
			"ffn_gate_inp.weight": d(H, cfg.Experts), "ffn_gate_exps.weight": d(H, cfg.MoEInter, cfg.Experts),
			"ffn_up_exps.weight": d(H, cfg.MoEInter, cfg.Experts), "ffn_down_exps.weight": d(cfg.MoEInter, H, cfg.Experts),
			"ffn_gate_inp_shexp.weight": d(H), "ffn_gate_shexp.weight": d(H, cfg.SharedInter),
			"ffn_up_shexp.weight": d(H, cfg.SharedInter), "ffn_down_shexp.weight": d(cfg.SharedInter, H)}
		if cfg.LayerTypes[l] == full {
			w["attn_q.weight"], w["attn_k.weight"], w["attn_v.weight"] = d(H, 2*q), d(H, kv), d(H, kv)
			w["attn_output.weight"], w["attn_q_norm.weight"], w["attn_k_norm.weight"] = d(q, H), d(cfg.HeadDim), d(cfg.HeadDim)
		} else {
			w["attn_qkv.weight"], w["attn_gate.weight"], w["ssm_conv1d.weight"] = d(H, conv), d(H, nv*vd), d(cfg.ConvKernel, conv)
			w["ssm_dt.bias"], w["ssm_a"], w["ssm_ba.weight"] = d(nv), d(nv), d(H, 2*nv)
			w["ssm_norm.weight"], w["ssm_out.weight"] = d(vd), d(nv*vd, H)
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
	for _, n := range []string{"ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_ba.weight", "ssm_norm.weight", "attn_norm.weight", "ffn_gate_inp.weight"} {
		if tt := got["blk.1."+n]; tt != nil && tt.Type != gguf.F32 {
			t.Errorf("blk.1.%s is %s, want F32", n, tt.Type)
		}
	}
	if t.Failed() {
		return
	}

	// Values, flat: GGUF tensors (F32 or Q4_0) against the sources (F32 or
	// sluice's q4, byte j of a group holding elements j and j+32).
	ggufVals := func(name string) []float32 {
		tt := got[name]
		sz, _ := tt.Size()
		b := raw[tt.Offset : tt.Offset+sz]
		v := make([]float32, sz/4)
		if tt.Type == gguf.Q4_0 {
			v = make([]float32, sz/18*32)
			gguf.DequantizeQ4_0(v, b)
		} else {
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
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
			j := i % format.GroupSize
			q := buf[st.Offset+int64((i-j)/2+j%32)]
			if j >= 32 {
				q >>= 4
			}
			v[i] = f32(buf, st.ScaleOffset+int64(4*(i/format.GroupSize)))*float32(q&15) + f32(buf, st.BiasOffset+int64(4*(i/format.GroupSize)))
		}
		return v
	}
	check := func(name, srcName string, fn func(float32) float32) {
		t.Helper()
		gv, sv := ggufVals(name), srcVals(dense, src[srcName])
		if len(gv) != len(sv) {
			t.Fatalf("%s: %d values, source %s %d", name, len(gv), srcName, len(sv))
		}
		for i, v := range sv {
			if fn != nil {
				v = fn(v)
			}
			if gv[i] != v {
				t.Fatalf("%s[%d] = %v, want %v (from %s)", name, i, gv[i], v, srcName)
			}
		}
	}
	plus1 := func(v float32) float32 { return 1 + v }
	check("blk.1.attn_norm.weight", "layers.1.input_layernorm.weight", plus1)
	check("blk.1.post_attention_norm.weight", "layers.1.post_attention_layernorm.weight", plus1)
	check("blk.3.attn_q_norm.weight", "layers.3.self_attn.q_norm.weight", plus1)
	check("blk.3.attn_k_norm.weight", "layers.3.self_attn.k_norm.weight", plus1)
	check("output_norm.weight", "norm.weight", plus1)
	check("blk.1.ssm_norm.weight", "layers.1.linear_attn.norm.weight", nil)
	check("blk.1.ssm_a", "layers.1.linear_attn.A_log", func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	for gn, sn := range map[string]string{"ssm_dt.bias": "linear_attn.dt_bias", "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
		"ssm_conv1d.weight": "linear_attn.conv1d.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
		"ssm_out.weight": "linear_attn.out_proj.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
		"ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight", "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"} {
		check("blk.1."+gn, "layers.1."+sn, nil)
	}
	check("blk.3.attn_q.weight", "layers.3.self_attn.q_proj.weight", nil)
	check("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight", nil)
	check("token_embd.weight", "embed_tokens.weight", nil)
	check("output.weight", "lm_head.weight", nil)

	// ssm_ba read as the checkpoint's in_proj_ba.
	ck := q3nCheckpoint{t: map[string][]float32{"layers.1.linear_attn.in_proj_ba.weight": ggufVals("blk.1.ssm_ba.weight")}}
	for _, n := range []string{"layers.1.linear_attn.in_proj_b.weight", "layers.1.linear_attn.in_proj_a.weight"} {
		v, err := family.DenseOf(ck, &cfg, format.Spec{Name: n, Shape: src[n].Shape})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, srcVals(dense, src[n])) {
			t.Errorf("blk.1.ssm_ba read as in_proj_ba does not give %s", n)
		}
	}

	// Expert e of layer l is record l·E+e.
	recs, err := os.ReadFile(filepath.Join(dir, m.Stores[0].File))
	if err != nil {
		t.Fatal(err)
	}
	st := &m.Stores[0]
	for _, e := range []struct {
		name string
		t    *format.Tensor
	}{{"ffn_gate_exps", &st.Gate}, {"ffn_up_exps", &st.Up}, {"ffn_down_exps", &st.Down}} {
		gv, n := ggufVals("blk.2."+e.name+".weight"), e.t.Rows()*e.t.Cols()
		for x := 0; x < cfg.Experts; x++ {
			if !slices.Equal(gv[x*n:(x+1)*n], srcVals(recs[int64(2*cfg.Experts+x)*st.Stride:][:st.Stride], e.t)) {
				t.Fatalf("blk.2.%s expert %d differs from its record", e.name, x)
			}
		}
	}
}
