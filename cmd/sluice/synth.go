package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/pack"
)

// synthShapes are the real dimensions of the models synth imitates.
var synthShapes = map[string]format.Config{
	"qwen3.5-35b-a3b": {Family: family.NameQwen35MoE, Hidden: 2048, Layers: 40, Vocab: 248320, Heads: 16, KVHeads: 2, HeadDim: 256,
		RotaryDim: 64, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 262144, Experts: 256, TopK: 8, MoEInter: 512, SharedInter: 512, NormTopK: true,
		LinearKeyHeads: 16, LinearValueHeads: 32, LinearKeyDim: 128, LinearValueDim: 128, ConvKernel: 4, MTPLayers: 1},
	"qwen3-30b-a3b": {Family: family.NameQwen3MoE, Hidden: 2048, Layers: 48, Vocab: 151936, Heads: 32, KVHeads: 4, HeadDim: 128,
		RotaryDim: 128, RopeTheta: 1e6, RMSEps: 1e-6, MaxPos: 40960, Experts: 128, TopK: 8, MoEInter: 768, NormTopK: true},
	"gpt-oss-120b": {Family: family.NameGPTOSS, Hidden: 2880, Layers: 36, Vocab: 201088, Heads: 64, KVHeads: 8, HeadDim: 64,
		RotaryDim: 64, RopeTheta: 150000, RMSEps: 1e-5, MaxPos: 131072, Experts: 128, TopK: 4, MoEInter: 2880, ExpertBias: true, SlidingWindow: 128,
		Arch: format.ArchJSON(`{"rope":{"rope_theta":150000,"factor":32,"original_max_position_embeddings":4096,"beta_fast":32,"beta_slow":1,"truncate":false}}`)},
}

// cmdSynth writes a packed model with a real model's shapes and random
// weights, for benchmarks of expert streaming at real record sizes. Random
// routers would route uniformly, unlike trained ones, so the model carries
// the routes the shared tiny model's router chose on a long prompt
// (refs routes_long0: skewed and correlated in time), which bench replays.
func cmdSynth(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	like := fs.String("like", "qwen3.5-35b-a3b", "shapes: qwen3.5-35b-a3b or qwen3-30b-a3b")
	layers := fs.Int("layers", 0, "keep only this many layers (0 = all)")
	bits := fs.Int("bits", 4, "8 or 4")
	out := fs.String("out", "", "output directory (GBs; not inside the repository)")
	refs := fs.String("routes", "", "refs JSON whose routes_long0 to replay (default ../shared/refs/tiny-qwen3-5-moe.json)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	cfg, ok := synthShapes[*like]
	if !ok {
		return fmt.Errorf("--like %q: want qwen3.5-35b-a3b or qwen3-30b-a3b", *like)
	}
	if *out == "" {
		return fmt.Errorf("--out DIR is required")
	}
	kind, err := format.KindForBits(*bits)
	if err != nil || !kind.Quantised() {
		return fmt.Errorf("--bits %d: want 8 or 4", *bits)
	}
	if *layers > 0 && *layers < cfg.Layers {
		cfg.Layers = *layers
	}
	cfg.LayerTypes = make([]string, cfg.Layers)
	for i := range cfg.LayerTypes {
		cfg.LayerTypes[i] = format.FullAttention
		if cfg.Family == family.NameQwen35MoE && i%4 != 3 {
			cfg.LayerTypes[i] = format.LinearAttention
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	rp := *refs
	if rp == "" {
		rp = filepath.Join("..", "shared", "refs", "tiny-qwen3-5-moe.json")
	}
	rb, err := os.ReadFile(rp)
	if err != nil {
		return fmt.Errorf("routes: %v (give --routes refs/<model>.json)", err)
	}
	var r struct {
		Routes [][][]int `json:"routes_long0"`
	}
	if err := json.Unmarshal(rb, &r); err != nil || len(r.Routes) == 0 {
		return fmt.Errorf("routes: %s has no routes_long0 (%v)", rp, err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	m := &format.Manifest{Format: format.Version, Family: cfg.Family, Config: cfg, Bits: *bits, GroupSize: format.GroupSize,
		ExpertLayers: cfg.ExpertLayers(), Experts: cfg.Experts}
	if err := synthDense(m, kind, filepath.Join(*out, "dense.bin")); err != nil {
		return err
	}
	st := format.ExpertRecordLayout(&cfg, kind, "experts.bin")
	if err := synthExperts(ctx, m, &st, filepath.Join(*out, st.File)); err != nil {
		return err
	}
	m.Stores = []format.ExpertStore{st}
	mb, _ := json.MarshalIndent(m, "", " ")
	if err := os.WriteFile(filepath.Join(*out, format.ManifestFile), mb, 0o644); err != nil {
		return err
	}
	rt, _ := json.Marshal(map[string]any{"experts": 64, "routes": r.Routes})
	if err := os.WriteFile(filepath.Join(*out, experts.RoutesFile), rt, 0o644); err != nil {
		return err
	}
	// The tokenizer only has to load: bench feeds random ids.
	tiny := filepath.Join(filepath.Dir(filepath.Dir(rp)), "models", "tiny-qwen3-5-moe")
	for _, f := range pack.CopiedFiles {
		if b, err := os.ReadFile(filepath.Join(tiny, f)); err == nil && f != "config.json" {
			os.WriteFile(filepath.Join(*out, f), b, 0o644)
		}
	}
	fmt.Fprintf(os.Stderr, "synth %s: %d layers, %d records of %s, %s dense, in %.1fs\n", *out, cfg.Layers, m.ExpertLayers*m.Experts,
		bytesStr(st.Stride), bytesStr(m.DenseBytes), time.Since(t0).Seconds())
	return nil
}

// synthDense writes random dense weights: quantised values uniform over
// ±1/sqrt(cols), so activations keep their scale layer after layer;
// norms neutral; DeltaNet decay parameters zero.
func synthDense(m *format.Manifest, kind format.Kind, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 4<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	var off int64
	put := func(b []byte) int64 {
		pad := format.AlignUp(off, format.DenseAlign) - off
		w.Write(make([]byte, pad))
		off += pad
		at := off
		w.Write(b)
		off += int64(len(b))
		return at
	}
	zc := m.Config.Family == family.NameQwen35MoE // zero-centred norms
	specs, err := family.Specs(&m.Config)
	if err != nil {
		return err
	}
	for _, s := range specs {
		t := format.Tensor{Name: s.Name, Kind: format.F32, Shape: s.Shape}
		rows, cols := t.Rows(), t.Cols()
		amp := float32(1 / math.Sqrt(float64(cols)))
		if s.Quant {
			t.Kind = kind
			v, sb := kind.Sizes(rows, cols)
			vals := make([]byte, v)
			fillRandom(rng, vals)
			t.Offset, t.Size = put(vals), v
			levels := float32(int(1)<<kind.Bits() - 1)
			t.ScaleOffset = put(floats(int(sb/4), 2*amp/levels))
			t.BiasOffset = put(floats(int(sb/4), -amp))
		} else {
			n := rows * cols
			var b []byte
			switch {
			case len(s.Shape) == 1 && zc:
				b = floats(n, 0)
			case len(s.Shape) == 1:
				b = floats(n, 1)
			default:
				b = make([]byte, 4*n)
				for i := 0; i < n; i++ {
					binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(amp*float32(rng.NormFloat64())))
				}
			}
			t.Offset, t.Size = put(b), int64(len(b))
		}
		m.Dense = append(m.Dense, t)
	}
	put(nil)
	m.DenseBytes = off
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

// synthExperts writes every record from one random block shifted per
// record: contents do not matter for speed, and generating GBs of fresh
// randomness would dominate the time.
func synthExperts(ctx context.Context, m *format.Manifest, st *format.ExpertStore, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 8<<20)
	rec := make([]byte, st.Stride)
	block := make([]byte, 2*st.Stride)
	fillRandom(rand.New(rand.NewPCG(3, 4)), block)
	amp := float32(1 / math.Sqrt(float64(m.Config.Hidden)))
	n := m.ExpertLayers * m.Experts
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		s := (int64(i) * 4099) % st.Stride
		copy(rec, block[s:s+st.Stride])
		for _, t := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
			_, sb := t.Kind.Sizes(t.Rows(), t.Cols())
			levels := float32(int(1)<<t.Kind.Bits() - 1)
			copy(rec[t.ScaleOffset:], floats(int(sb/4), 2*amp/levels))
			copy(rec[t.BiasOffset:], floats(int(sb/4), -amp))
		}
		if _, err := w.Write(rec); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

func floats(n int, v float32) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
