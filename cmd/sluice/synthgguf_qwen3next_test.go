package main

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
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
	f := writeQwen3Hybrid(t, family.NameQwen3Next)
	cfg := f.m.Config
	keys := qwen3HybridKeys(&cfg, "qwen3next")
	keys["qwen3next.rope.dimension_sections"] = nil
	f.keys(keys)
	// The tensors llama.cpp's qwen3next creates, with ggml dims.
	f.tensors(qwen3HybridTensors(&cfg, map[string][]uint64{"ssm_ba.weight": dims(cfg.Hidden, 2*cfg.LinearValueHeads)}),
		"blk.1.ssm_conv1d.weight", "blk.1.ssm_a", "blk.1.ssm_dt.bias", "blk.1.ssm_ba.weight",
		"blk.1.ssm_norm.weight", "blk.1.attn_norm.weight", "blk.1.ffn_gate_inp.weight")
	if t.Failed() {
		return
	}

	// Values: what qwen35moe converts alike, then the DeltaNet's tensors,
	// bit for bit but A, with the value heads in the checkpoint's order.
	f.qwen3HybridValues()
	f.same("blk.1.ssm_a", "layers.1.linear_attn.A_log", func(v float32) float32 { return float32(-math.Exp(float64(v))) })
	for _, n := range [][2]string{{"ssm_dt.bias", "dt_bias"}, {"attn_qkv.weight", "in_proj_qkv.weight"},
		{"ssm_conv1d.weight", "conv1d.weight"}, {"attn_gate.weight", "in_proj_z.weight"}, {"ssm_out.weight", "out_proj.weight"}} {
		f.same("blk.1."+n[0], "layers.1.linear_attn."+n[1], nil)
	}

	// ssm_ba read as the checkpoint's in_proj_ba.
	ck := q3nCheckpoint{t: map[string][]float32{"layers.1.linear_attn.in_proj_ba.weight": slices.Concat(f.rows("blk.1.ssm_ba.weight")...)}}
	for _, n := range []string{"layers.1.linear_attn.in_proj_b.weight", "layers.1.linear_attn.in_proj_a.weight"} {
		v, err := family.DenseOf(ck, &cfg, format.Spec{Name: n, Shape: f.src[n].Shape})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, slices.Concat(f.source(n)...)) {
			t.Errorf("blk.1.ssm_ba read as in_proj_ba does not give %s", n)
		}
	}
}
