package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
	"github.com/sluicelm/sluice/internal/testutil"
)

// writeAsQwen3Next writes the qwen3_5_moe checkpoint src into dst as a
// qwen3_next checkpoint holding the same weights: each DeltaNet layer's
// in_proj_qkv and in_proj_z fused into in_proj_qkvz, and in_proj_b and
// in_proj_a into in_proj_ba, per key head [q ‖ k ‖ v ‖ z] and [b ‖ a]
// (transformers' fix_query_key_value_ordering read backwards); the MTP
// head's mtp.* tensors kept, and config.json without an MTP layer count,
// as the hub's Qwen3-Next configs are.
func writeAsQwen3Next(t *testing.T, src, dst string) {
	t.Helper()
	c, _, err := hf.ReadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	nk, dk, dv := c.LinearKeyHeads, c.LinearKeyDim, c.LinearValueDim
	r := c.LinearValueHeads / nk
	type tensor struct {
		dtype string
		shape []int
		data  []byte
	}
	out := map[string]tensor{}
	// rows returns rows lo..lo+n of a matrix tensor's bytes.
	rows := func(x *safetensors.Tensor, lo, n int) []byte {
		rb := len(x.Data) / x.Shape[0]
		return x.Data[lo*rb : (lo+n)*rb]
	}
	for name, x := range ck.Tensors {
		p, ok := strings.CutSuffix(name, "linear_attn.in_proj_qkv.weight")
		if !ok {
			if !strings.Contains(name, "linear_attn.in_proj_") {
				out[name] = tensor{x.DType, x.Shape, x.Data}
			}
			continue
		}
		z := ck.Tensors[p+"linear_attn.in_proj_z.weight"]
		b, a := ck.Tensors[p+"linear_attn.in_proj_b.weight"], ck.Tensors[p+"linear_attn.in_proj_a.weight"]
		if z == nil || b == nil || a == nil {
			t.Fatalf("%s: DeltaNet projections missing", p)
		}
		var qkvz, ba []byte
		for g := 0; g < nk; g++ {
			qkvz = append(qkvz, rows(x, g*dk, dk)...)
			qkvz = append(qkvz, rows(x, nk*dk+g*dk, dk)...)
			qkvz = append(qkvz, rows(x, 2*nk*dk+g*r*dv, r*dv)...)
			qkvz = append(qkvz, rows(z, g*r*dv, r*dv)...)
			ba = append(ba, rows(b, g*r, r)...)
			ba = append(ba, rows(a, g*r, r)...)
		}
		H := x.Shape[1]
		out[p+"linear_attn.in_proj_qkvz.weight"] = tensor{x.DType, []int{x.Shape[0] + z.Shape[0], H}, qkvz}
		out[p+"linear_attn.in_proj_ba.weight"] = tensor{b.DType, []int{2 * b.Shape[0], H}, ba}
	}
	// One safetensors file: an 8-byte header length, the JSON header, the data.
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	hdr := map[string]any{}
	var off int
	for _, n := range names {
		x := out[n]
		hdr[n] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{off, off + len(x.data)}}
		off += len(x.data)
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	buf = append(buf, hb...)
	for _, n := range names {
		buf = append(buf, out[n].data...)
	}
	if err := os.WriteFile(filepath.Join(dst, "model.safetensors"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	cb, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(cb, &cfg); err != nil {
		t.Fatal(err)
	}
	if tc, ok := cfg["text_config"].(map[string]any); ok {
		cfg = tc
	}
	cfg["model_type"], cfg["architectures"] = "qwen3_next", []string{"Qwen3NextForCausalLM"}
	delete(cfg, "mtp_num_hidden_layers")
	delete(cfg, "mtp_use_dedicated_embeddings")
	cb, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dst, "config.json"), cb, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if b, err := os.ReadFile(filepath.Join(src, f)); err == nil {
			if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestQwen3NextIsQwen35: Qwen3.5-MoE's test checkpoint re-laid as
// qwen3_next (fused DeltaNet projections, an MTP head the config does not
// count) packs into the same model: trunk logits and MTP logits bit for bit
// those of the qwen3_5_moe original on the reference prompts. The fused
// layout itself is checked against transformers by TestConformance on
// tiny-qwen3-next; this checks the split is the exact inverse of the
// fusion, and that a Qwen3-Next checkpoint's mtp.* head loads and drafts.
func TestQwen3NextIsQwen35(t *testing.T) {
	if testing.Short() {
		t.Skip("packs a converted checkpoint")
	}
	const name = "tiny-qwen3-5-moe"
	src := testutil.ModelDir(t, name)
	conv := t.TempDir()
	writeAsQwen3Next(t, src, conv)
	dir := filepath.Join(t.TempDir(), "packed")
	if err := pack.Pack(context.Background(), conv, dir, pack.Options{Bits: 16}); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := NewResidentProvider(b)
	if err != nil {
		t.Fatal(err)
	}
	b.Experts = p
	if b.Config.Family != "qwen3_next" || b.Config.MTPLayers != 1 || b.MTP == nil {
		t.Fatalf("converted checkpoint: family %q, %d MTP layers, head loaded %v", b.Config.Family, b.Config.MTPLayers, b.MTP != nil)
	}
	a := load(t, name, 16)
	ra, rb := NewRunner(a, 2, 160), NewRunner(b, 2, 160)
	defer ra.Close()
	defer rb.Close()
	H, V := a.Config.Hidden, a.Config.Vocab
	run := func(m *Model, r *Runner, prompt []int) ([]float32, []float32) {
		T := len(prompt)
		st, _ := m.NewState(T)
		out := make([]float32, T*V)
		if err := r.Forward(st, prompt, out, true); err != nil {
			t.Fatal(err)
		}
		hid := append([]float32(nil), r.final[:(T-1)*H]...)
		mtp := make([]float32, (T-1)*V)
		if err := r.MTPForward(st, 0, hid, prompt[1:], mtp, true); err != nil {
			t.Fatal(err)
		}
		return out, mtp
	}
	for ci, c := range testutil.LoadRefs(t, name).Cases[:4] {
		la, ma := run(a, ra, c.Prompt)
		lb, mb := run(b, rb, c.Prompt)
		for i := range la {
			if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
				t.Fatalf("case %d: logit %d (pos %d) %v, qwen3_5_moe %v", ci, i, i/V, lb[i], la[i])
			}
		}
		for i := range ma {
			if math.Float32bits(ma[i]) != math.Float32bits(mb[i]) {
				t.Fatalf("case %d: MTP logit %d (row %d) %v, qwen3_5_moe %v", ci, i, i/V, mb[i], ma[i])
			}
		}
	}
}

// The tiny Qwen3-Next references were computed by a transformers model that
// had been cast to bf16 for export and back to float32 (scripts/tiny), so
// its rotary inverse frequencies, a buffer rather than a weight, were
// rounded to bf16 on the way; the model read back from disk recomputes them
// in float32, as sluice does. That rounding, and nothing else, is why the
// shared tables allow this model testutil.LogitTol's wider bound: with the
// frequencies rounded to bf16 as the reference had them, every case's last
// logits agree within 1e-4, every position's argmax agrees, and so do the
// 48 greedy tokens of every case.
func TestQwen3NextReferenceRope(t *testing.T) {
	const name = "tiny-qwen3-next"
	m := load(t, name, 16)
	round := func(inv []float32) {
		for i, f := range inv {
			inv[i] = quant.BF16ToF32(quant.BF16(f))
		}
	}
	round(m.Arch.Rope.InvFreq)
	for _, L := range m.Arch.Layers {
		if a, ok := L.Mixer.(*block.Attn); ok && a.Rope != nil {
			round(a.Rope.InvFreq)
		}
	}
	refs := testutil.LoadRefs(t, name)
	r := NewRunner(m, 2, 64)
	defer r.Close()
	V := m.Config.Vocab
	var worst float64
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
			if got := argmax(out[p*V : (p+1)*V]); got != c.Argmax[p] {
				t.Errorf("case %d pos %d: argmax %d, want %d", ci, p, got, c.Argmax[p])
			}
		}
		last := out[(len(c.Prompt)-1)*V:]
		for i, want := range c.LastLogits {
			worst = math.Max(worst, math.Abs(float64(last[i])-want))
		}
	}
	t.Logf("rope frequencies in bf16, as the reference had them: last logits within %.2e over %d cases", worst, len(refs.Cases))
	// And the 48 greedy tokens of every case, exactly.
	logits := make([]float32, V)
	for ci, c := range refs.Cases {
		st, _ := m.NewState(len(c.Prompt) + len(c.Greedy))
		if err := r.Forward(st, c.Prompt, logits, false); err != nil {
			t.Fatal(err)
		}
		for i, want := range c.Greedy {
			next := argmax(logits)
			if next != want {
				t.Errorf("case %d: greedy token %d is %d, want %d", ci, i, next, want)
				break
			}
			if err := r.Forward(st, []int{next}, logits, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	if worst > 1e-4 {
		t.Errorf("last logits differ by up to %g", worst)
	}
}
