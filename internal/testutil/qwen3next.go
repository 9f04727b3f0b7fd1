package testutil

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/safetensors"
)

// WriteAsQwen3Next writes the qwen3_5_moe checkpoint src into dst as a
// qwen3_next checkpoint holding the same weights: each DeltaNet layer's
// in_proj_qkv and in_proj_z fused into in_proj_qkvz, and in_proj_b and
// in_proj_a into in_proj_ba, per key head [q ‖ k ‖ v ‖ z] and [b ‖ a]
// (transformers' fix_query_key_value_ordering read backwards); the MTP
// head's mtp.* tensors kept, and config.json without an MTP layer count,
// as the hub's Qwen3-Next configs are.
func WriteAsQwen3Next(t testing.TB, src, dst string) {
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
	st := map[string]STensor{}
	for n, x := range out {
		st[n] = STensor{x.dtype, x.shape, x.data}
	}
	WriteSafetensors(t, filepath.Join(dst, "model.safetensors"), st)
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
