package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/quant"
)

// synthGGUF writes the packed model in dir as a GGUF file for llama.cpp,
// with the tensor names, layouts and metadata that llama.cpp's converter
// (convert_hf_to_gguf.py) writes for the family (ggufFamilies: qwen3moe,
// qwen35moe, qwen3next, deepseek2, glm4moe, gpt-oss). The quantised
// weights become Q4_0 or Q8_0, exactly when synth wrote them (see
// synthScale); float tensors stay F32, the routers included, so that both
// engines route alike.
func synthGGUF(m *format.Manifest, dir, path string, gt gguf.Type) error {
	p := &ggufPlan{m: m, gt: gt, byName: map[string]*format.Tensor{}}
	for i := range m.Dense {
		p.byName[m.Dense[i].Name] = &m.Dense[i]
	}
	plan := ggufFamilies[m.Config.Family]
	if plan == nil {
		return fmt.Errorf("--gguf: %s cannot be written as GGUF", m.Config.Family)
	}
	if err := plan(p); err != nil {
		return err
	}
	dense, err := platform.MapFile(filepath.Join(dir, "dense.bin"))
	if err != nil {
		return err
	}
	defer platform.Unmap(dense)
	st := &m.Stores[0]
	recs, err := platform.MapFile(filepath.Join(dir, st.File))
	if err != nil {
		return err
	}
	defer platform.Unmap(recs)
	// Written beside path under a temporary name and renamed when
	// complete: an error or Ctrl-C leaves no partial file, and a file
	// --force replaces stays whole until then.
	f, err := os.CreateTemp(filepath.Dir(filepath.Clean(path)), "."+filepath.Base(path)+".synth-")
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	E := m.Config.Experts
	var flat, tmp []byte // a tiled record untiled, and the scratch for it
	err = gguf.Write(f, p.kvs, p.tensors, func(i int, w io.Writer) error {
		s := p.srcs[i]
		if s.dense != nil {
			return ggufTensor(w, dense, s.dense, gt, s.x)
		}
		for e := 0; e < E; e++ {
			r := int64(s.layer*E+e) * st.Stride
			rec := recs[r : r+st.Stride]
			if s.expert.Tiled {
				// GGUF rows are row-major.
				flat = append(flat[:0], rec...)
				t := s.expert
				tmp = kernels.UntileQ4(flat[t.Offset:t.Offset+t.Size], t.Rows(), t.Cols(), tmp)
				rec = flat
			}
			if err := ggufTensor(w, rec, s.expert, gt, ggufXform{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// ggufFamilies plans each family's GGUF file as llama.cpp's converter
// writes it; a family missing here cannot be written.
var ggufFamilies = map[string]func(*ggufPlan) error{
	family.NameQwen3MoE:  (*ggufPlan).qwen3MoE,
	family.NameQwen35MoE: (*ggufPlan).qwen35MoE,
	family.NameGLM4MoE:   (*ggufPlan).glm4MoE,
	family.NameGPTOSS:    (*ggufPlan).gptOSS,
	family.NameQwen3Next: (*ggufPlan).qwen3Next,
	family.NameDeepSeek:  (*ggufPlan).deepSeek2,
}

// ggufPlan collects a GGUF file's metadata and tensors, and where each
// tensor's data comes from.
type ggufPlan struct {
	m       *format.Manifest
	gt      gguf.Type
	byName  map[string]*format.Tensor
	kvs     []gguf.KV
	tensors []gguf.Tensor
	srcs    []ggufSrc
}

// ggufSrc is the source of one GGUF tensor: a dense tensor, or one
// tensor of every expert record of a layer, stacked.
type ggufSrc struct {
	dense  *format.Tensor
	expert *format.Tensor
	layer  int
	x      ggufXform
}

// ggufXform is how a dense tensor changes on its way into the GGUF file,
// where llama.cpp's converter changes the checkpoint's tensor.
type ggufXform struct {
	// more are tensors (of the source's kind and columns) whose rows
	// follow the source's, for a GGUF tensor that a converter fuses from
	// several checkpoint tensors sluice keeps apart.
	more []*format.Tensor
	// rows[r] is the source row of row r, counted over the source's rows
	// then more's (nil: the same order); there may be fewer than those,
	// where the converter splits a tensor.
	rows []int
	// cols[j] is the source block of column block j, blocks of colBlock
	// columns (nil: the same order).
	cols     []int
	colBlock int
	// f maps every value (F32 tensors only).
	f func(float32) float32
	// dims replaces the GGUF dimensions (the same number of elements).
	dims []uint64
}

// add declares GGUF tensor name from the dense tensor src.
func (p *ggufPlan) add(name, src string, x ggufXform) error {
	t := p.byName[src]
	if t == nil {
		return fmt.Errorf("gguf: model has no tensor %s", src)
	}
	rows := t.Rows()
	for _, o := range x.more {
		if o.Kind != t.Kind || o.Cols() != t.Cols() {
			return fmt.Errorf("gguf: tensor %s (%s, %d columns) cannot follow %s (%s, %d columns)", o.Name, o.Kind, o.Cols(), src, t.Kind, t.Cols())
		}
		rows += o.Rows()
	}
	if x.rows != nil {
		for _, r := range x.rows {
			if r < 0 || r >= rows {
				return fmt.Errorf("gguf: tensor %s: row %d of %d", src, r, rows)
			}
		}
		rows = len(x.rows)
	}
	g := gguf.Tensor{Name: name, Type: gguf.F32, Dims: []uint64{uint64(t.Cols()), uint64(rows)}}
	if t.Kind.Quantised() {
		g.Type = p.gt
		if x.f != nil {
			return fmt.Errorf("gguf: tensor %s is %s, cannot map its values", src, t.Kind)
		}
	} else if t.Kind != format.F32 {
		return fmt.Errorf("gguf: tensor %s is %s", src, t.Kind)
	}
	if len(t.Shape) == 1 && x.more == nil {
		g.Dims = g.Dims[:1]
	}
	if x.dims != nil {
		n := uint64(1)
		for _, d := range x.dims {
			n *= d
		}
		if n != uint64(rows*t.Cols()) {
			return fmt.Errorf("gguf: tensor %s of shape %v cannot be %v", src, t.Shape, x.dims)
		}
		g.Dims = x.dims
	}
	if x.cols != nil && (x.colBlock <= 0 || len(x.cols)*x.colBlock != t.Cols() ||
		(t.Kind.Quantised() && x.colBlock%gguf.BlockSize != 0)) {
		return fmt.Errorf("gguf: tensor %s: %d columns cannot move in blocks of %d", src, t.Cols(), x.colBlock)
	}
	p.tensors, p.srcs = append(p.tensors, g), append(p.srcs, ggufSrc{dense: t, x: x})
	return nil
}

// addExperts declares the layer's stacked expert tensors, [E][out][in]
// as ggml's {in, out, E}, and their biases, [E][out] as {out, E}, when
// the records have them.
func (p *ggufPlan) addExperts(prefix string, layer int) {
	st := &p.m.Stores[0]
	E := uint64(p.m.Config.Experts)
	for _, e := range []struct {
		name    string
		t, bias *format.Tensor
	}{{"ffn_gate_exps", &st.Gate, st.GateBias}, {"ffn_down_exps", &st.Down, st.DownBias}, {"ffn_up_exps", &st.Up, st.UpBias}} {
		gt := p.gt
		if e.t.Kind == format.MXFP4 {
			gt = gguf.MXFP4 // kept as they are, as the converter keeps the release's
		}
		p.tensors = append(p.tensors, gguf.Tensor{Name: prefix + e.name + ".weight", Type: gt,
			Dims: []uint64{uint64(e.t.Cols()), uint64(e.t.Rows()), E}})
		p.srcs = append(p.srcs, ggufSrc{expert: e.t, layer: layer})
		if e.bias != nil {
			p.tensors = append(p.tensors, gguf.Tensor{Name: prefix + e.name + ".bias", Type: gguf.F32,
				Dims: []uint64{uint64(e.bias.Rows() * e.bias.Cols()), E}})
			p.srcs = append(p.srcs, ggufSrc{expert: e.bias, layer: layer})
		}
	}
}

// ggufNamed is a GGUF tensor's name, its source's and the change between.
type ggufNamed struct {
	name, src string
	x         ggufXform
}

// addEach declares each GGUF tensor of ts, names under prefix gp, sources
// under sp.
func (p *ggufPlan) addEach(gp, sp string, ts []ggufNamed) error {
	for _, t := range ts {
		if err := p.add(gp+t.name, sp+t.src, t.x); err != nil {
			return err
		}
	}
	return nil
}

// addAll declares GGUF tensors from dense ones, name pairs (GGUF, source)
// under the given prefixes, unchanged.
func (p *ggufPlan) addAll(gp, sp string, names [][2]string) error {
	for _, nm := range names {
		if err := p.add(gp+nm[0]+".weight", sp+nm[1]+".weight", ggufXform{}); err != nil {
			return err
		}
	}
	return nil
}

// header starts the metadata: the keys every architecture has, under
// arch's prefix.
func (p *ggufPlan) header(arch string) {
	c := &p.m.Config
	fileType := uint32(2) // LLAMA_FTYPE_MOSTLY_Q4_0
	if p.gt == gguf.Q8_0 {
		fileType = 7 // LLAMA_FTYPE_MOSTLY_Q8_0
	}
	if p.m.Stores[0].Kind == format.MXFP4 {
		fileType = 38 // LLAMA_FTYPE_MOSTLY_MXFP4_MOE: the release's GGUF
	}
	p.kvs = []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.name", Value: fmt.Sprintf("sluice synth %s %d layers", c.Family, c.Layers)},
		{Key: "general.file_type", Value: fileType},
		{Key: arch + ".block_count", Value: uint32(c.Layers)},
		{Key: arch + ".context_length", Value: uint32(c.MaxPos)},
		{Key: arch + ".embedding_length", Value: uint32(c.Hidden)},
		{Key: arch + ".feed_forward_length", Value: uint32(c.MoEInter)},
		{Key: arch + ".attention.head_count", Value: uint32(c.Heads)},
		{Key: arch + ".attention.head_count_kv", Value: uint32(c.KVHeads)},
		{Key: arch + ".attention.key_length", Value: uint32(c.HeadDim)},
		{Key: arch + ".attention.value_length", Value: uint32(c.HeadDim)},
		{Key: arch + ".rope.freq_base", Value: float32(c.RopeTheta)},
		{Key: arch + ".attention.layer_norm_rms_epsilon", Value: float32(c.RMSEps)},
		{Key: arch + ".expert_count", Value: uint32(c.Experts)},
		{Key: arch + ".expert_used_count", Value: uint32(c.TopK)},
		{Key: arch + ".expert_feed_forward_length", Value: uint32(c.MoEInter)},
		{Key: arch + ".vocab_size", Value: uint32(c.Vocab)},
		// No tokenizer: llama.cpp then makes vocab_size placeholder tokens,
		// which is all llama-bench (random ids) needs.
		{Key: "tokenizer.ggml.model", Value: "none"},
	}
}

// set replaces the value of metadata key k, or adds it.
func (p *ggufPlan) set(k string, v any) {
	for i := range p.kvs {
		if p.kvs[i].Key == k {
			p.kvs[i].Value = v
			return
		}
	}
	p.kvs = append(p.kvs, gguf.KV{Key: k, Value: v})
}

// sigmoidMoE plans the feed-forward part of a DeepSeek-V3-style layer as
// llama.cpp names it, for deepseek2 and glm4moe alike: a leading dense
// layer's MLP, or the sigmoid router with its correction bias
// (exp_probs_b), the stacked routed experts and the shared experts.
func (p *ggufPlan) sigmoidMoE(b, s string, l int) error {
	c := &p.m.Config
	if l < c.FirstDense {
		return p.addAll(b, s+"mlp.", [][2]string{{"ffn_gate", "gate_proj"}, {"ffn_up", "up_proj"}, {"ffn_down", "down_proj"}})
	}
	if err := p.add(b+"ffn_gate_inp.weight", s+"mlp.gate.weight", ggufXform{}); err != nil {
		return err
	}
	if err := p.add(b+"exp_probs_b.bias", s+"mlp.gate.e_score_correction_bias", ggufXform{}); err != nil {
		return err
	}
	p.addExperts(b, l)
	if c.SharedInter == 0 {
		return nil
	}
	return p.addAll(b, s+"mlp.shared_experts.", [][2]string{{"ffn_gate_shexp", "gate_proj"}, {"ffn_up_shexp", "up_proj"},
		{"ffn_down_shexp", "down_proj"}})
}

// qwen3MoE plans llama.cpp's qwen3moe: the checkpoint's tensors renamed.
func (p *ggufPlan) qwen3MoE() error {
	c := &p.m.Config
	p.header("qwen3moe")
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		if err := p.addAll(b, fmt.Sprintf("layers.%d.", l), [][2]string{
			{"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
			{"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
			{"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate_inp", "mlp.gate"},
		}); err != nil {
			return err
		}
		p.addExperts(b, l)
	}
	return p.addAll("", "", [][2]string{{"output_norm", "norm"}, {"output", "lm_head"}})
}

// qwen35MRopeSections is Qwen3.5's interleaved M-RoPE split of the
// rotary pairs between time, height and width, which llama.cpp's qwen35moe
// requires (convert_hf_to_gguf.py writes this default when the checkpoint
// has none). With text only, the three positions are equal and the split
// changes nothing: the rope is the plain one over the rotary dims.
var qwen35MRopeSections = []int32{11, 11, 10, 0}

// qwen35MoE plans llama.cpp's qwen35moe as convert_hf_to_gguf.py writes
// it (Qwen3_5MoeTextModel): zero-centred norm weights w stored as 1+w
// (but not the DeltaNet's gated norm, a plain one); A_log stored as
// A = -exp(A_log); the conv kernel [channels][1][K] as {K, channels}; the
// DeltaNet's value heads reordered from grouped by key head to tiled
// (value head j of every key head, then j+1, ...), in every tensor that
// has them, for ggml's broadcast of the key heads; the attention's q
// projection kept whole (query ‖ gate per head, as llama.cpp splits it);
// no MTP layer.
func (p *ggufPlan) qwen35MoE() error {
	return p.qwen3Hybrid("qwen35moe", qwen35MRopeSections, func(c *format.Config) func(b, la string) error {
		nk, nv, kd, vd := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim
		// Row orders: value heads of vd rows, of one row, and the conv/qkv
		// channels (q and k, then the value heads).
		vRows, vOne := vHeadOrder(nk, nv/nk, vd), vHeadOrder(nk, nv/nk, 1)
		qkv := make([]int, 2*nk*kd, 2*nk*kd+nv*vd)
		for i := range qkv {
			qkv[i] = i
		}
		for _, r := range vRows {
			qkv = append(qkv, 2*nk*kd+r)
		}
		return func(b, la string) error {
			return p.addEach(b, la, []ggufNamed{
				{"attn_qkv.weight", "in_proj_qkv.weight", ggufXform{rows: qkv}},
				{"attn_gate.weight", "in_proj_z.weight", ggufXform{rows: vRows}},
				{"ssm_conv1d.weight", "conv1d.weight", ggufXform{rows: qkv, dims: []uint64{uint64(c.ConvKernel), uint64(len(qkv))}}},
				{"ssm_dt.bias", "dt_bias", ggufXform{cols: vOne, colBlock: 1}},
				{"ssm_a", "A_log", ggufXform{cols: vOne, colBlock: 1, f: ggufNegExp.f}},
				{"ssm_beta.weight", "in_proj_b.weight", ggufXform{rows: vOne}},
				{"ssm_alpha.weight", "in_proj_a.weight", ggufXform{rows: vOne}},
				{"ssm_norm.weight", "norm.weight", ggufXform{}},
				{"ssm_out.weight", "out_proj.weight", ggufXform{cols: vOne, colBlock: vd}},
			})
		}
	})
}

// qwen3Hybrid plans what llama.cpp's qwen35moe and qwen3next (arch) share:
// the DeltaNet and rope metadata (with M-RoPE sections where sections is
// not nil); every layer's norms as 1+w; the full-attention layers' q
// projection kept whole (query ‖ gate per head) and their q/k norms as
// 1+w; the router, the stacked experts and the shared expert with its
// sigmoid gate; the final norm as 1+w. linear is called once the DeltaNet's
// heads are checked, and gives what plans a DeltaNet layer's tensors under
// GGUF prefix b and source prefix la, which is where the two differ.
func (p *ggufPlan) qwen3Hybrid(arch string, sections []int32, linear func(*format.Config) func(b, la string) error) error {
	c := &p.m.Config
	nk, nv, kd, vd := c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim
	if kd != vd {
		return fmt.Errorf("gguf: DeltaNet key and value heads of %d and %d: llama.cpp's %s takes one head size", kd, vd, arch)
	}
	if nk <= 0 || nv%nk != 0 {
		return fmt.Errorf("gguf: %d value heads over %d key heads", nv, nk)
	}
	interval, err := fullAttentionInterval(c.LayerTypes)
	if err != nil {
		return err
	}
	p.header(arch)
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".expert_shared_feed_forward_length", Value: uint32(c.SharedInter)},
		gguf.KV{Key: arch + ".rope.dimension_count", Value: uint32(c.RotaryDim)})
	if sections != nil {
		p.kvs = append(p.kvs, gguf.KV{Key: arch + ".rope.dimension_sections", Value: sections})
	}
	p.kvs = append(p.kvs,
		gguf.KV{Key: arch + ".ssm.conv_kernel", Value: uint32(c.ConvKernel)},
		gguf.KV{Key: arch + ".ssm.state_size", Value: uint32(kd)},
		gguf.KV{Key: arch + ".ssm.group_count", Value: uint32(nk)},
		gguf.KV{Key: arch + ".ssm.time_step_rank", Value: uint32(nv)},
		gguf.KV{Key: arch + ".ssm.inner_size", Value: uint32(vd * nv)},
		gguf.KV{Key: arch + ".full_attention_interval", Value: uint32(interval)},
	)
	deltaNet := linear(c)
	if err := p.add("token_embd.weight", "embed_tokens.weight", ggufXform{}); err != nil {
		return err
	}
	for l := 0; l < c.Layers; l++ {
		b, s := fmt.Sprintf("blk.%d.", l), fmt.Sprintf("layers.%d.", l)
		ts := []ggufNamed{{"attn_norm.weight", "input_layernorm.weight", ggufPlusOne},
			{"post_attention_norm.weight", "post_attention_layernorm.weight", ggufPlusOne}}
		if c.LayerTypes[l] == format.FullAttention {
			ts = append(ts, ggufNamed{"attn_q.weight", "self_attn.q_proj.weight", ggufXform{}},
				ggufNamed{"attn_k.weight", "self_attn.k_proj.weight", ggufXform{}},
				ggufNamed{"attn_v.weight", "self_attn.v_proj.weight", ggufXform{}},
				ggufNamed{"attn_output.weight", "self_attn.o_proj.weight", ggufXform{}},
				ggufNamed{"attn_q_norm.weight", "self_attn.q_norm.weight", ggufPlusOne},
				ggufNamed{"attn_k_norm.weight", "self_attn.k_norm.weight", ggufPlusOne})
		}
		if err := p.addEach(b, s, ts); err != nil {
			return err
		}
		if c.LayerTypes[l] != format.FullAttention {
			if err := deltaNet(b, s+"linear_attn."); err != nil {
				return err
			}
		}
		if err := p.add(b+"ffn_gate_inp.weight", s+"mlp.gate.weight", ggufXform{}); err != nil {
			return err
		}
		p.addExperts(b, l)
		if c.SharedInter > 0 {
			if err := p.add(b+"ffn_gate_inp_shexp.weight", s+"mlp.shared_expert_gate.weight", ggufXform{dims: []uint64{uint64(c.Hidden)}}); err != nil {
				return err
			}
			if err := p.addAll(b, s+"mlp.shared_expert.", [][2]string{{"ffn_gate_shexp", "gate_proj"},
				{"ffn_up_shexp", "up_proj"}, {"ffn_down_shexp", "down_proj"}}); err != nil {
				return err
			}
		}
	}
	if err := p.add("output_norm.weight", "norm.weight", ggufPlusOne); err != nil {
		return err
	}
	return p.add("output.weight", "lm_head.weight", ggufXform{})
}

// ggufPlusOne stores a zero-centred norm weight w as the 1+w llama.cpp
// multiplies by; ggufNegExp stores A_log as A = -exp(A_log), the DeltaNet
// decay rate llama.cpp multiplies by.
var (
	ggufPlusOne = ggufXform{f: func(v float32) float32 { return v + 1 }}
	ggufNegExp  = ggufXform{f: func(v float32) float32 { return float32(-math.Exp(float64(v))) }}
)

// fullAttentionInterval is n such that layer i has full attention exactly
// when (i+1)%n == 0, the pattern llama.cpp's qwen35moe reads; one more
// than the layers when none has.
func fullAttentionInterval(types []string) (int, error) {
	n := len(types) + 1
	for i, t := range types {
		if t == format.FullAttention {
			n = i + 1
			break
		}
	}
	for i, t := range types {
		if (t == format.FullAttention) != ((i+1)%n == 0) {
			return 0, fmt.Errorf("gguf: layer types %v are not one full-attention layer in every n", types)
		}
	}
	return n, nil
}

// vHeadOrder reorders value heads of d entries each, stored grouped by
// key head (the vPerK value heads of key head 0, then of key head 1, ...),
// into llama.cpp's tiled order (value head 0 of every key head, then value
// head 1, ...): entry i of the result is the source index of entry i.
func vHeadOrder(kHeads, vPerK, d int) []int {
	p := make([]int, kHeads*vPerK*d)
	for j := 0; j < vPerK; j++ {
		for k := 0; k < kHeads; k++ {
			for e := 0; e < d; e++ {
				p[(j*kHeads+k)*d+e] = (k*vPerK+j)*d + e
			}
		}
	}
	return p
}

// ggufTensor writes tensor t of buf in GGUF type gt (F32 tensors as F32),
// changed by x. A group of 64 affine values s·q+b becomes two blocks of
// 32: exactly (d = s, the same q) when b = -2^(bits-1)·s and s is a
// half-precision value, as synth writes them; otherwise requantised from
// the values.
func ggufTensor(w io.Writer, buf []byte, t *format.Tensor, gt gguf.Type, x ggufXform) error {
	rows, cols := t.Rows(), t.Cols()
	for _, o := range x.more {
		rows += o.Rows()
	}
	if x.rows != nil {
		rows = len(x.rows)
	}
	// src is the tensor and row that row r comes from.
	src := func(r int) (*format.Tensor, int) {
		if x.rows != nil {
			r = x.rows[r]
		}
		st := t
		for _, o := range x.more {
			if r < st.Rows() {
				break
			}
			r, st = r-st.Rows(), o
		}
		return st, r
	}
	// permute reorders the column blocks of a row, bb bytes a block.
	permute := func(dst, row []byte, bb int) {
		if x.cols == nil {
			copy(dst, row)
			return
		}
		for j, s := range x.cols {
			copy(dst[j*bb:(j+1)*bb], row[s*bb:(s+1)*bb])
		}
	}
	if t.Kind == format.F32 {
		out := make([]byte, 4*cols)
		for r := 0; r < rows; r++ {
			st, sr := src(r)
			permute(out, buf[st.Offset+int64(4*sr*cols):][:4*cols], 4*x.colBlock)
			if x.f != nil {
				for i := 0; i < cols; i++ {
					v := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
					binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x.f(v)))
				}
			}
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
		return nil
	}
	if t.Kind == format.MXFP4 && x.rows == nil && x.cols == nil && x.more == nil && x.f == nil {
		return ggufMXFP4(w, buf, t)
	}
	if t.Kind != format.Q4 && t.Kind != format.Q8 {
		return fmt.Errorf("tensor %s: %s cannot be written as GGUF", t.Name, t.Kind)
	}
	if x.f != nil {
		return fmt.Errorf("tensor %s: %s values cannot be mapped", t.Name, t.Kind)
	}
	const G = format.GroupSize
	ng := cols / G
	rb, err := gt.RowBytes(cols)
	if err != nil {
		return err
	}
	blockBytes := int(rb / int64(cols/gguf.BlockSize))
	if x.cols != nil && x.colBlock%gguf.BlockSize != 0 {
		return fmt.Errorf("tensor %s: column blocks of %d split GGUF blocks of %d", t.Name, x.colBlock, gguf.BlockSize)
	}
	row, out := make([]byte, rb), make([]byte, rb)
	vals := make([]float32, G)
	per := G / gguf.BlockSize * blockBytes
	zero := float32(int(1) << (t.Kind.Bits() - 1))
	f16 := func(off int64) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(buf[off:])) }
	for r := 0; r < rows; r++ {
		st, sr := src(r)
		for g := 0; g < ng; g++ {
			sc, bi := f16(st.ScaleOffset+int64(2*(sr*ng+g))), f16(st.BiasOffset+int64(2*(sr*ng+g)))
			dst := row[g*per : (g+1)*per]
			var q []byte
			if t.Kind == format.Q4 {
				q = buf[st.Offset+int64((sr*cols+g*G)/2):][:G/2]
			} else {
				q = buf[st.Offset+int64(sr*cols+g*G):][:G]
			}
			h := quant.F16(sc)
			if bi == -zero*sc && quant.F16ToF32(h) == sc && !(t.Kind == format.Q8 && gt == gguf.Q4_0) {
				ggufGroupExact(dst, q, h, t.Kind, gt)
				continue
			}
			for j := range vals {
				var v byte
				if t.Kind == format.Q8 {
					v = q[j]
				} else if j < G/2 {
					v = q[j] & 15
				} else {
					v = q[j-G/2] >> 4
				}
				vals[j] = sc*float32(v) + bi
			}
			if gt == gguf.Q4_0 {
				gguf.QuantizeQ4_0(dst, vals)
			} else {
				gguf.QuantizeQ8_0(dst, vals)
			}
		}
		// Each GGUF block holds 32 consecutive columns, so column blocks
		// that are whole GGUF blocks move as bytes.
		permute(out, row, x.colBlock/gguf.BlockSize*blockBytes)
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// ggufGroupExact writes one group of 64 values (q-zero)·d, q in sluice's
// layout (q4: byte j holds element j low and j+32 high), as two GGUF
// blocks of 32 with scale h.
func ggufGroupExact(dst, q []byte, h uint16, k format.Kind, gt gguf.Type) {
	const B = gguf.BlockSize
	elem := func(j int) int { // element j as a signed integer
		if k == format.Q8 {
			return int(q[j]) - 128
		}
		if j < 32 {
			return int(q[j]&15) - 8
		}
		return int(q[j-32]>>4) - 8
	}
	for blk := 0; blk < 2; blk++ {
		if gt == gguf.Q4_0 {
			d := dst[blk*(2+B/2):]
			binary.LittleEndian.PutUint16(d, h)
			for j := 0; j < B/2; j++ {
				// Q4_0: byte j holds element j low and j+16 high, offset by 8.
				d[2+j] = byte(elem(blk*B+j)+8) | byte(elem(blk*B+j+B/2)+8)<<4
			}
		} else {
			d := dst[blk*(2+B):]
			binary.LittleEndian.PutUint16(d, h)
			for j := 0; j < B; j++ {
				d[2+j] = byte(int8(elem(blk*B + j)))
			}
		}
	}
}

// ggufMXFP4 writes MXFP4 tensor t of buf as GGUF MXFP4 blocks: the same
// codes and scale bytes, each block's codes reordered from sluice's (byte
// k: values 2k and 2k+1) to ggml's (byte j: values j and j+16).
func ggufMXFP4(w io.Writer, buf []byte, t *format.Tensor) error {
	rows, cols := t.Rows(), t.Cols()
	nblk := cols / format.MXBlock
	q := buf[t.Offset : t.Offset+int64(rows*cols/2)]
	e8 := buf[t.Offset+int64(rows*cols/2) : t.Offset+t.Size]
	out := make([]byte, nblk*(1+gguf.BlockSize/2))
	var codes [gguf.BlockSize]byte
	for r := 0; r < rows; r++ {
		for b := 0; b < nblk; b++ {
			src := q[(r*nblk+b)*format.MXBlock/2:][:format.MXBlock/2]
			for k, v := range src {
				codes[2*k], codes[2*k+1] = v&15, v>>4
			}
			gguf.PutMXFP4(out[b*(1+gguf.BlockSize/2):], &codes, e8[r*nblk+b])
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}
