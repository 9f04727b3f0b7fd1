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
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
)

// ggufFile is a synth model of a small config written as GGUF and read
// back, for the GGUF writers' tests: the sources (dense.bin, the records)
// beside what llama.cpp will read.
type ggufFile struct {
	t     *testing.T
	m     *format.Manifest
	dense []byte
	recs  []byte
	src   map[string]*format.Tensor
	raw   []byte
	g     *gguf.File
	got   map[string]*gguf.Tensor
}

// writeGGUF packs a random model of cfg, lets tweak change dense.bin's
// values (where synth writes constants, so that orders and transforms
// show), and writes and reads back its GGUF.
func writeGGUF(t *testing.T, cfg format.Config, tweak func(dense []byte, src map[string]*format.Tensor)) *ggufFile {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := synthPack(context.Background(), cfg, format.Q4, synthExpertKind(&cfg, format.Q4), pack.LayoutRows, dir)
	if err != nil {
		t.Fatal(err)
	}
	f := &ggufFile{t: t, m: m, src: map[string]*format.Tensor{}, got: map[string]*gguf.Tensor{}}
	for i := range m.Dense {
		f.src[m.Dense[i].Name] = &m.Dense[i]
	}
	if f.dense, err = os.ReadFile(filepath.Join(dir, "dense.bin")); err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(f.dense, f.src)
		if err := os.WriteFile(filepath.Join(dir, "dense.bin"), f.dense, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if f.recs, err = os.ReadFile(filepath.Join(dir, m.Stores[0].File)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "m.gguf")
	if err := synthGGUF(m, dir, path, gguf.Q4_0); err != nil {
		t.Fatal(err)
	}
	if f.raw, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f.g, err = gguf.Read(r, int64(len(f.raw))); err != nil {
		t.Fatal(err)
	}
	for i := range f.g.Tensors {
		f.got[f.g.Tensors[i].Name] = &f.g.Tensors[i]
	}
	return f
}

// dims is a GGUF shape.
func dims(x ...int) []uint64 {
	r := make([]uint64, len(x))
	for i, v := range x {
		r[i] = uint64(v)
	}
	return r
}

// keys checks metadata values, types included.
func (f *ggufFile) keys(want map[string]any) {
	f.t.Helper()
	for k, w := range want {
		if got := f.g.Get(k); got != w {
			f.t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, w, w)
		}
	}
}

// tensors checks that the file holds exactly the tensors of want, with
// their dims, and that those named in f32 are F32.
func (f *ggufFile) tensors(want map[string][]uint64, f32 ...string) {
	f.t.Helper()
	for n, tt := range f.got {
		if _, ok := want[n]; !ok {
			f.t.Errorf("unexpected tensor %s %v", n, tt.Dims)
		}
	}
	for n, d := range want {
		if tt := f.got[n]; tt == nil {
			f.t.Errorf("missing tensor %s %v", n, d)
		} else if !slices.Equal(tt.Dims, d) {
			f.t.Errorf("%s: dims %v, want %v", n, tt.Dims, d)
		}
	}
	for _, n := range f32 {
		if tt := f.got[n]; tt != nil && tt.Type != gguf.F32 {
			f.t.Errorf("%s is %s, want F32", n, tt.Type)
		}
	}
}

// rows is a GGUF tensor's values as rows of its first dimension.
func (f *ggufFile) rows(name string) [][]float32 {
	f.t.Helper()
	tt := f.got[name]
	if tt == nil {
		f.t.Fatalf("no tensor %s", name)
	}
	cols, n := int(tt.Dims[0]), 1
	for _, x := range tt.Dims[1:] {
		n *= int(x)
	}
	sz, _ := tt.Size()
	v := make([]float32, cols*n)
	b := f.raw[tt.Offset : tt.Offset+sz]
	switch tt.Type {
	case gguf.F32:
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case gguf.Q4_0:
		gguf.DequantizeQ4_0(v, b)
	case gguf.MXFP4:
		gguf.DequantizeMXFP4(v, b)
	default:
		f.t.Fatalf("%s: type %s", name, tt.Type)
	}
	r := make([][]float32, n)
	for i := range r {
		r[i] = v[i*cols : (i+1)*cols]
	}
	return r
}

// srcRows is tensor st of buf (F32, MXFP4, or q4 as synth writes it) as
// rows.
func srcRows(buf []byte, st *format.Tensor) [][]float32 {
	f32 := func(off int64) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(buf[off:])) }
	f16 := func(off int64) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(buf[off:])) }
	rows, cols := st.Rows(), st.Cols()
	r := make([][]float32, rows)
	if st.Kind == format.MXFP4 {
		v := make([]float32, rows*cols)
		quant.DecodeMXFP4(v, buf[st.Offset:st.Offset+st.Size], rows, cols)
		for i := range r {
			r[i] = v[i*cols : (i+1)*cols]
		}
		return r
	}
	for i := range r {
		r[i] = make([]float32, cols)
		for c := range r[i] {
			if st.Kind == format.F32 {
				r[i][c] = f32(st.Offset + int64(4*(i*cols+c)))
				continue
			}
			gi := i*(cols/format.GroupSize) + c/format.GroupSize
			j := c % format.GroupSize
			q := buf[st.Offset+int64((i*cols+c-j)/2+j%32)]
			if j >= 32 {
				q >>= 4
			}
			r[i][c] = f16(st.ScaleOffset+int64(2*gi))*float32(q&15) + f16(st.BiasOffset+int64(2*gi))
		}
	}
	return r
}

// source is dense tensor name's values as rows.
func (f *ggufFile) source(name string) [][]float32 {
	f.t.Helper()
	st := f.src[name]
	if st == nil {
		f.t.Fatalf("no source tensor %s", name)
	}
	return srcRows(f.dense, st)
}

// same checks that GGUF tensor name holds dense tensor srcName's values
// in the same order, mapped by fn (nil: unchanged).
func (f *ggufFile) same(name, srcName string, fn func(float32) float32) {
	f.t.Helper()
	f.mapped(name, srcName, nil, nil, fn)
}

// mapped checks that GGUF tensor name is dense tensor srcName rearranged,
// of the same shape: its [r][c] is the source's [srcRow(r)][srcCol(c)]
// (nil: the same index), mapped by fn (nil: unchanged).
func (f *ggufFile) mapped(name, srcName string, srcRow, srcCol func(int) int, fn func(float32) float32) {
	f.t.Helper()
	sr := f.source(srcName)
	if srcRow != nil || srcCol != nil {
		id := func(i int) int { return i }
		if srcRow == nil {
			srcRow = id
		}
		if srcCol == nil {
			srcCol = id
		}
		p := make([][]float32, len(sr))
		for r := range p {
			p[r] = make([]float32, len(sr[r]))
			for c := range p[r] {
				p[r][c] = sr[srcRow(r)][srcCol(c)]
			}
		}
		sr = p
	}
	f.match(name, srcName, f.rows(name), sr, fn)
}

// match checks rows gr of GGUF tensor name against rows sr of source src.
func (f *ggufFile) match(name, src string, gr, sr [][]float32, fn func(float32) float32) {
	f.t.Helper()
	if len(gr) != len(sr) {
		f.t.Fatalf("%s: %d rows, source %s %d", name, len(gr), src, len(sr))
	}
	for r := range gr {
		if len(gr[r]) != len(sr[r]) {
			f.t.Fatalf("%s: rows of %d, source %s %d", name, len(gr[r]), src, len(sr[r]))
		}
		for c, v := range gr[r] {
			want := sr[r][c]
			if fn != nil {
				want = fn(want)
			}
			if v != want {
				f.t.Fatalf("%s[%d][%d] = %v, want %v (from %s)", name, r, c, v, want, src)
			}
		}
	}
}

// experts checks that GGUF tensor name stacks, expert after expert, the
// tensor of each record of layer l that pick chooses.
func (f *ggufFile) experts(name string, l int, pick func(*format.ExpertStore) *format.Tensor) {
	f.t.Helper()
	st := &f.m.Stores[0]
	gr := f.rows(name)
	per := len(gr) / f.m.Config.Experts
	for e := 0; e < f.m.Config.Experts; e++ {
		rec := f.recs[int64(l*f.m.Config.Experts+e)*st.Stride:][:st.Stride]
		f.match(name, "records", gr[e*per:(e+1)*per], srcRows(rec, pick(st)), nil)
	}
}

// setVec gives dense vector name the values 0.25·i − 0.5, distinct where
// synth writes constants.
func setVec(dense []byte, src map[string]*format.Tensor, name string) {
	st := src[name]
	for i := 0; i < st.Rows()*st.Cols(); i++ {
		binary.LittleEndian.PutUint32(dense[st.Offset+int64(4*i):], math.Float32bits(0.25*float32(i)-0.5))
	}
}

// writeQwen3Hybrid writes a small model of family fam (qwen35moe or
// qwen3next: three DeltaNet layers then a full-attention one, six value
// heads over two key heads, a shared expert, an MTP layer) with distinct
// values in layer 1's A_log, dt_bias and input norm, where synth writes
// constants, so that the transforms and any reordering show.
func writeQwen3Hybrid(t *testing.T, fam string) *ggufFile {
	t.Helper()
	lin, full := format.LinearAttention, format.FullAttention
	cfg := format.Config{Family: fam, Hidden: 64, Layers: 4, Vocab: 96, Heads: 2, KVHeads: 1, HeadDim: 64,
		RotaryDim: 16, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 4096, Experts: 4, TopK: 2, MoEInter: 64, SharedInter: 128,
		NormTopK: true, LinearKeyHeads: 2, LinearValueHeads: 6, LinearKeyDim: 32, LinearValueDim: 32, ConvKernel: 4,
		MTPLayers: 1, LayerTypes: []string{lin, lin, lin, full}}
	return writeGGUF(t, cfg, func(dense []byte, src map[string]*format.Tensor) {
		for _, n := range []string{"layers.1.linear_attn.A_log", "layers.1.linear_attn.dt_bias", "layers.1.input_layernorm.weight"} {
			setVec(dense, src, n)
		}
	})
}

// qwen3HybridKeys is the metadata llama.cpp's qwen35moe and qwen3next
// (arch) both read, derived from the config, and no MTP layer.
func qwen3HybridKeys(cfg *format.Config, arch string) map[string]any {
	a := arch + "."
	u := func(v int) uint32 { return uint32(v) }
	nk, nv, vd := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearValueDim
	return map[string]any{
		"general.architecture": arch, a + "block_count": u(cfg.Layers), a + "embedding_length": u(cfg.Hidden),
		a + "attention.head_count": u(cfg.Heads), a + "attention.head_count_kv": u(cfg.KVHeads),
		a + "attention.key_length": u(cfg.HeadDim), a + "attention.value_length": u(cfg.HeadDim),
		a + "rope.dimension_count": u(cfg.RotaryDim), a + "rope.freq_base": float32(cfg.RopeTheta),
		a + "attention.layer_norm_rms_epsilon": float32(cfg.RMSEps), a + "expert_count": u(cfg.Experts),
		a + "expert_used_count": u(cfg.TopK), a + "expert_feed_forward_length": u(cfg.MoEInter),
		a + "expert_shared_feed_forward_length": u(cfg.SharedInter), a + "ssm.conv_kernel": u(cfg.ConvKernel),
		a + "ssm.state_size": u(cfg.LinearKeyDim), a + "ssm.group_count": u(nk), a + "ssm.time_step_rank": u(nv),
		a + "ssm.inner_size": u(nv * vd), a + "full_attention_interval": u(4), "general.file_type": u(2),
		a + "nextn_predict_layers": nil,
	}
}

// qwen3HybridTensors is the tensors llama.cpp's qwen35moe and qwen3next
// create, with ggml dims derived from the config: those both have, and
// linear's in every DeltaNet layer, where the two differ.
func qwen3HybridTensors(cfg *format.Config, linear map[string][]uint64) map[string][]uint64 {
	nk, nv, kd, vd, H := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.Hidden
	conv, q, kv := 2*nk*kd+nv*vd, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	want := map[string][]uint64{"token_embd.weight": dims(H, cfg.Vocab), "output_norm.weight": dims(H), "output.weight": dims(H, cfg.Vocab)}
	for l := 0; l < cfg.Layers; l++ {
		w := map[string][]uint64{"attn_norm.weight": dims(H), "post_attention_norm.weight": dims(H),
			"ffn_gate_inp.weight": dims(H, cfg.Experts), "ffn_gate_exps.weight": dims(H, cfg.MoEInter, cfg.Experts),
			"ffn_up_exps.weight": dims(H, cfg.MoEInter, cfg.Experts), "ffn_down_exps.weight": dims(cfg.MoEInter, H, cfg.Experts),
			"ffn_gate_inp_shexp.weight": dims(H), "ffn_gate_shexp.weight": dims(H, cfg.SharedInter),
			"ffn_up_shexp.weight": dims(H, cfg.SharedInter), "ffn_down_shexp.weight": dims(cfg.SharedInter, H)}
		if cfg.LayerTypes[l] == format.FullAttention {
			w["attn_q.weight"], w["attn_k.weight"], w["attn_v.weight"] = dims(H, 2*q), dims(H, kv), dims(H, kv)
			w["attn_output.weight"], w["attn_q_norm.weight"], w["attn_k_norm.weight"] = dims(q, H), dims(cfg.HeadDim), dims(cfg.HeadDim)
		} else {
			w["attn_qkv.weight"], w["attn_gate.weight"], w["ssm_conv1d.weight"] = dims(H, conv), dims(H, nv*vd), dims(cfg.ConvKernel, conv)
			w["ssm_dt.bias"], w["ssm_a"], w["ssm_norm.weight"], w["ssm_out.weight"] = dims(nv), dims(nv), dims(vd), dims(nv*vd, H)
			for k, v := range linear {
				w[k] = v
			}
		}
		for k, v := range w {
			want[fmt.Sprintf("blk.%d.%s", l, k)] = v
		}
	}
	return want
}

// qwen3HybridValues checks the values of the tensors that qwen35moe and
// qwen3next convert alike, in a file of writeQwen3Hybrid: the norms as
// 1+w but the DeltaNet's gated norm, the full attention's q and output,
// the router and shared expert of layers 1 and 2, the embedding and
// output, and layer 2's experts, record l·E+e for expert e of layer l.
func (f *ggufFile) qwen3HybridValues() {
	f.t.Helper()
	plus1 := func(v float32) float32 { return 1 + v }
	f.same("blk.1.attn_norm.weight", "layers.1.input_layernorm.weight", plus1)
	f.same("blk.1.post_attention_norm.weight", "layers.1.post_attention_layernorm.weight", plus1)
	f.same("blk.3.attn_q_norm.weight", "layers.3.self_attn.q_norm.weight", plus1)
	f.same("blk.3.attn_k_norm.weight", "layers.3.self_attn.k_norm.weight", plus1)
	f.same("output_norm.weight", "norm.weight", plus1)
	f.same("blk.1.ssm_norm.weight", "layers.1.linear_attn.norm.weight", nil)
	f.same("blk.3.attn_q.weight", "layers.3.self_attn.q_proj.weight", nil)
	f.same("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight", nil)
	for _, l := range []string{"1", "2"} {
		for _, n := range [][2]string{{"ffn_gate_inp.weight", "mlp.gate.weight"},
			{"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"}, {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"}} {
			f.same("blk."+l+"."+n[0], "layers."+l+"."+n[1], nil)
		}
	}
	f.same("token_embd.weight", "embed_tokens.weight", nil)
	f.same("output.weight", "lm_head.weight", nil)
	f.experts("blk.2.ffn_gate_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Gate })
	f.experts("blk.2.ffn_up_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Up })
	f.experts("blk.2.ffn_down_exps.weight", 2, func(s *format.ExpertStore) *format.Tensor { return &s.Down })
}

// TestSynthGGUFRefuses checks that models llama.cpp's architecture would
// compute differently are refused with an error naming why, rather than
// written as a file that loads and gives other logits.
func TestSynthGGUFRefuses(t *testing.T) {
	parse := func(t *testing.T, name, raw string, edit func(map[string]any)) format.Config {
		var hf map[string]any
		if err := json.Unmarshal([]byte(raw), &hf); err != nil {
			t.Fatal(err)
		}
		edit(hf)
		b, _ := json.Marshal(hf)
		fam, _ := family.Named(name)
		cfg, err := fam.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	for _, c := range []struct {
		name, want string
		cfg        func(t *testing.T) format.Config
	}{
		{"glm4moe with router groups", "routes without groups", func(t *testing.T) format.Config {
			return parse(t, family.NameGLM4MoE, glm4MoETestConfig, func(m map[string]any) { m["n_group"], m["topk_group"] = 2, 1 })
		}},
		{"gpt-oss with full attention everywhere", "slides on the even layers", func(t *testing.T) format.Config {
			return parse(t, family.NameGPTOSS, gptOSSTestConfig, func(m map[string]any) {
				m["layer_types"] = []string{format.FullAttention, format.FullAttention}
			})
		}},
		{"gpt-oss with a YaRN attention factor", "attention factor", func(t *testing.T) format.Config {
			return parse(t, family.NameGPTOSS, gptOSSTestConfig, func(m map[string]any) {
				m["rope_scaling"].(map[string]any)["attention_factor"] = 1.5
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := c.cfg(t)
			m, err := synthPack(context.Background(), cfg, format.Q4, synthExpertKind(&cfg, format.Q4), pack.LayoutRows, dir)
			if err != nil {
				t.Fatal(err)
			}
			err = synthGGUF(m, dir, filepath.Join(dir, "m.gguf"), gguf.Q4_0)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("synthGGUF: %v, want an error saying %q", err, c.want)
			}
		})
	}
}
