package testutil

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/safetensors"
)

// STensor is one tensor for WriteSafetensors: its dtype as safetensors
// names it, its shape and its little-endian bytes.
type STensor struct {
	DType string
	Shape []int
	Data  []byte
}

// WriteSafetensors writes tensors as one safetensors file at path: an
// 8-byte header length, the JSON header (names in order, with the
// "__metadata__" entry torch writes, padded to 8 bytes), the data.
func WriteSafetensors(t testing.TB, path string, tensors map[string]STensor) {
	t.Helper()
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var off int
	for _, n := range names {
		x := tensors[n]
		hdr[n] = map[string]any{"dtype": x.DType, "shape": x.Shape, "data_offsets": []int{off, off + len(x.Data)}}
		off += len(x.Data)
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
		buf = append(buf, tensors[n].Data...)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// WithDeepSeekMTP writes a copy of the test model name (ModelDir) with
// num_nextn_predict_layers 1 and a seeded random MTP module stored as
// DeepSeek-V3's checkpoints store it (deepseek_v32, glm4_moe): layer
// num_hidden_layers with enorm, hnorm, eh_proj, shared_head and a full
// decoder layer. Each tensor of its decoder layer is drawn with the mean
// and spread of the same tensor of trunk layer 1 (a MoE layer), so
// activations keep their scale. zero names a half of eh_proj's columns to
// zero: "embed" (the first H, which multiply enorm(embed)), "hidden" (the
// last H, which multiply hnorm(h)) or "" (none). It returns the copy's
// directory, under t.TempDir.
func WithDeepSeekMTP(t testing.TB, name, zero string) string {
	t.Helper()
	src := ModelDir(t, name)
	dir := t.TempDir()
	cfg := ReadJSON(t, filepath.Join(src, "config.json"))
	cfg["num_nextn_predict_layers"] = 1
	WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n != "config.json" && n != "model.safetensors.index.json" {
			Link(t, filepath.Join(src, n), filepath.Join(dir, n))
		}
	}
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	L := int(cfg["num_hidden_layers"].(float64))
	H := int(cfg["hidden_size"].(float64))
	rng := rand.New(rand.NewPCG(12, 34))
	out := map[string]STensor{}
	f32 := func(shape []int, v []float32) STensor {
		b := make([]byte, 0, 4*len(v))
		for _, f := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
		return STensor{"F32", shape, b}
	}
	normal := func(n int, mean, sd float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + sd*rng.NormFloat64())
		}
		return v
	}
	from := "model.layers.1."
	for _, name := range ck.Names() {
		if !strings.HasPrefix(name, from) {
			continue
		}
		tt := ck.Tensors[name]
		x, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		var s, s2 float64
		for _, f := range x {
			s += float64(f)
			s2 += float64(f) * float64(f)
		}
		mean := s / float64(len(x))
		sd := math.Sqrt(max(s2/float64(len(x))-mean*mean, 0))
		out[fmt.Sprintf("model.layers.%d.", L)+name[len(from):]] = f32(tt.Shape, normal(len(x), mean, sd))
	}
	p := fmt.Sprintf("model.layers.%d.", L)
	out[p+"enorm.weight"] = f32([]int{H}, normal(H, 1, 0.1))
	out[p+"hnorm.weight"] = f32([]int{H}, normal(H, 1, 0.1))
	out[p+"shared_head.norm.weight"] = f32([]int{H}, normal(H, 1, 0.1))
	eh := normal(2*H*H, 0, 1/math.Sqrt(float64(2*H)))
	for r := 0; r < H && zero != ""; r++ {
		c0 := 0
		if zero == "hidden" {
			c0 = H
		}
		clear(eh[r*2*H+c0 : r*2*H+c0+H])
	}
	out[p+"eh_proj.weight"] = f32([]int{H, 2 * H}, eh)
	for to, fromName := range map[string]string{p + "embed_tokens.weight": "model.embed_tokens.weight", p + "shared_head.head.weight": "lm_head.weight"} {
		x, err := ck.Tensors[fromName].Float32() // copies of the trunk's, as released
		if err != nil {
			t.Fatal(err)
		}
		out[to] = f32(ck.Tensors[fromName].Shape, x)
	}
	const file = "model-mtp.safetensors"
	WriteSafetensors(t, filepath.Join(dir, file), out)
	ix := ReadJSON(t, filepath.Join(src, "model.safetensors.index.json"))
	wm := ix["weight_map"].(map[string]any)
	for n := range out {
		wm[n] = file
	}
	WriteJSON(t, filepath.Join(dir, "model.safetensors.index.json"), ix)
	return dir
}
