package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/quant"
)

// synthShapes are the real dimensions of the models synth imitates.
var synthShapes = map[string]format.Config{
	"qwen3.5-35b-a3b": {Family: family.NameQwen35MoE, Hidden: 2048, Layers: 40, Vocab: 248320, Heads: 16, KVHeads: 2, HeadDim: 256,
		RotaryDim: 64, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 262144, Experts: 256, TopK: 8, MoEInter: 512, SharedInter: 512, NormTopK: true,
		LinearKeyHeads: 16, LinearValueHeads: 32, LinearKeyDim: 128, LinearValueDim: 128, ConvKernel: 4, MTPLayers: 1},
	// Qwen3.5-397B-A17B as public descriptions of the release give it
	// (hidden 4096, 60 layers of 512 experts of 1024, top-10, a shared
	// expert of 1024, 64 value and 16 key heads in the DeltaNet layers, 32
	// query and 2 key-value heads of 256 with a quarter of them rotated);
	// not checked against its config.json here.
	"qwen3.5-397b-a17b": {Family: family.NameQwen35MoE, Hidden: 4096, Layers: 60, Vocab: 248320, Heads: 32, KVHeads: 2, HeadDim: 256,
		RotaryDim: 64, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 262144, Experts: 512, TopK: 10, MoEInter: 1024, SharedInter: 1024, NormTopK: true,
		LinearKeyHeads: 16, LinearValueHeads: 64, LinearKeyDim: 128, LinearValueDim: 128, ConvKernel: 4, MTPLayers: 1},
	"qwen3-next-80b-a3b": {Family: family.NameQwen3Next, Hidden: 2048, Layers: 48, Vocab: 151936, Heads: 16, KVHeads: 2, HeadDim: 256,
		RotaryDim: 64, RopeTheta: 1e7, RMSEps: 1e-6, MaxPos: 262144, Experts: 512, TopK: 10, MoEInter: 512, SharedInter: 512, NormTopK: true,
		LinearKeyHeads: 16, LinearValueHeads: 32, LinearKeyDim: 128, LinearValueDim: 128, ConvKernel: 4, MTPLayers: 1},
	"qwen3-30b-a3b": {Family: family.NameQwen3MoE, Hidden: 2048, Layers: 48, Vocab: 151936, Heads: 32, KVHeads: 4, HeadDim: 128,
		RotaryDim: 128, RopeTheta: 1e6, RMSEps: 1e-6, MaxPos: 40960, Experts: 128, TopK: 8, MoEInter: 768, NormTopK: true},
	"gpt-oss-120b": gptOSSShape(36, 128),
	"gpt-oss-20b":  gptOSSShape(24, 32),
}

// gptOSSShape is gpt-oss's config at a size: the two releases differ only
// in their layers and experts.
func gptOSSShape(layers, experts int) format.Config {
	return format.Config{Family: family.NameGPTOSS, Hidden: 2880, Layers: layers, Vocab: 201088, Heads: 64, KVHeads: 8, HeadDim: 64,
		RotaryDim: 64, RopeTheta: 150000, RMSEps: 1e-5, MaxPos: 131072, Experts: experts, TopK: 4, MoEInter: 2880, ExpertBias: true, SlidingWindow: 128,
		Arch: format.ArchJSON(`{"rope":{"rope_theta":150000,"factor":32,"original_max_position_embeddings":4096,"beta_fast":32,"beta_slow":1,"truncate":false}}`)}
}

// deepSeekV3Config is DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3),
// less its FP8 quantization_config (synth writes its own weights) and the
// keys that only name files. Parsing it through the family gives the
// config pack would write for the release.
const deepSeekV3Config = `{"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
 "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
 "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
 "n_group": 8, "topk_group": 4, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
 "topk_method": "noaux_tc", "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "rms_norm_eps": 1e-6,
 "max_position_embeddings": 163840, "rope_theta": 10000, "hidden_act": "silu", "attention_bias": false,
 "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}`

// deepSeekV32Config is DeepSeek-V3.2-Exp's config.json: V3's shapes with
// model_type deepseek_v32 and the lightning indexer's keys (64 heads of
// 128 dims; each row attends to its top 2048 positions).
var deepSeekV32Config = strings.Replace(deepSeekV3Config, `{"model_type": "deepseek_v3",`,
	`{"model_type": "deepseek_v32", "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,`, 1)

// glm45AirConfig is GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air), less
// the keys that only name tokens. Parsing it through the family gives the
// config pack would write for the release.
const glm45AirConfig = `{"model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944,
 "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_nextn_predict_layers": 1, "num_attention_heads": 96,
 "num_key_value_heads": 8, "head_dim": 128, "partial_rotary_factor": 0.5, "n_routed_experts": 128,
 "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
 "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "vocab_size": 151552, "rms_norm_eps": 1e-5,
 "max_position_embeddings": 131072, "rope_theta": 1000000, "rope_scaling": null, "hidden_act": "silu",
 "attention_bias": true, "use_qk_norm": false, "tie_word_embeddings": false}`

// synthLike returns the config of the model --like names.
func synthLike(like string) (format.Config, bool, error) {
	for _, l := range []struct{ like, family, config string }{
		{"deepseek-v3", family.NameDeepSeek, deepSeekV3Config}, {"deepseek-v3.2", family.NameDeepSeek, deepSeekV32Config},
		{"glm-4.5-air", family.NameGLM4MoE, glm45AirConfig}} {
		if like == l.like {
			f, _ := family.Named(l.family)
			c, err := f.Parse([]byte(l.config))
			return c, true, err
		}
	}
	c, ok := synthShapes[like]
	return c, ok, nil
}

// synthLikes lists the names --like takes.
const synthLikes = "qwen3.5-35b-a3b, qwen3.5-397b-a17b, qwen3-next-80b-a3b, qwen3-30b-a3b, gpt-oss-120b, gpt-oss-20b, deepseek-v3, deepseek-v3.2 or glm-4.5-air"

// cmdSynth writes a packed model with a real model's shapes and random
// weights, for benchmarks at real record sizes, and optionally the same
// model as a GGUF file for llama.cpp. Random routers would route
// uniformly, unlike trained ones, so by default the model carries recorded
// routes (skewed and correlated in time), which bench replays: those of
// the shared tiny Qwen3.5 model on a long prompt (refs routes_long0),
// embedded in the binary so that synth runs anywhere. With --route router
// the model routes by its own random router weights instead, as llama.cpp
// does on the GGUF.
func cmdSynth(ctx context.Context, args []string) (err error) {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	like := fs.String("like", "qwen3.5-35b-a3b", "shapes: "+synthLikes)
	layers := fs.Int("layers", 0, "keep only this many layers (0 = all; at least one of them an MoE layer)")
	nExperts := fs.Int("experts", 0, "keep only this many routed experts a layer (0 = all; records keep their real size)")
	bits := fs.Int("bits", 4, "8 or 4")
	mxfp4 := fs.Bool("mxfp4", true, "gpt-oss at --bits 4: MXFP4 expert records, as pack keeps the release's (false: q4)")
	out := fs.String("out", "", "output directory (GBs; not inside the repository), written under a temporary name beside it and renamed when complete")
	force := fs.Bool("force", false, "replace --out when it holds a packed model, and an existing --gguf file that is a GGUF (nothing else is replaced)")
	refs := fs.String("routes", "", "refs JSON whose routes_long0 to replay (default: the embedded recording)")
	route := fs.String("route", "replay", "replay: replay the recorded routes; router: route by the router weights")
	ggufPath := fs.String("gguf", "", "also write the model as a GGUF file for llama.cpp, as its converter would write the real model")
	ggufType := fs.String("gguf-type", "q4_0", "GGUF type of the quantised weights: q4_0 or q8_0")
	layout := fs.String("layout", pack.LayoutRows, "how q4 expert records are stored: rows, tiled, or auto (as this CPU's decode kernel reads them)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, ok, err := synthLike(*like)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("--like %q: want %s", *like, synthLikes)
	}
	if *out == "" {
		return fmt.Errorf("--out DIR is required")
	}
	kind, err := format.KindForBits(*bits)
	if err != nil || !kind.Quantised() {
		return fmt.Errorf("--bits %d: want 8 or 4", *bits)
	}
	if *route != "replay" && *route != "router" {
		return fmt.Errorf("--route %q: want replay or router", *route)
	}
	if _, err := pack.LayoutTiles(*layout); err != nil {
		return fmt.Errorf("--layout: %v", err)
	}
	var gt gguf.Type
	switch *ggufType {
	case "q4_0":
		gt = gguf.Q4_0
	case "q8_0":
		gt = gguf.Q8_0
	default:
		return fmt.Errorf("--gguf-type %q: want q4_0 or q8_0", *ggufType)
	}
	if *ggufPath != "" && (ggufFamilies[cfg.Family] == nil || *like == "deepseek-v3.2") {
		return fmt.Errorf("--gguf: %s shapes cannot be written as GGUF", *like)
	}
	if *ggufPath != "" {
		// A GGUF of GBs must not end a long synth by overwriting a file
		// the user meant to keep.
		if st, err := os.Stat(*ggufPath); err == nil {
			if !st.Mode().IsRegular() {
				return fmt.Errorf("--gguf %s exists and is not a file", *ggufPath)
			}
			if !*force {
				return fmt.Errorf("--gguf %s exists (use --force to replace it)", *ggufPath)
			}
			// As with --out, --force replaces only what synth could
			// write again: a GGUF (or an empty file), never a file a
			// mistyped path happened to name.
			if err := checkGGUFFile(*ggufPath); err != nil {
				return err
			}
		} else if !os.IsNotExist(err) {
			return fmt.Errorf("--gguf: %v", err)
		}
	}
	if *layers < 0 || *layers > cfg.Layers {
		return fmt.Errorf("--layers %d: %s has %d layers (0 = all)", *layers, *like, cfg.Layers)
	}
	if *layers > 0 && *layers < cfg.Layers {
		cfg.Layers = *layers
		// Keep the leading dense layers, but at least one MoE layer.
		cfg.FirstDense = min(cfg.FirstDense, cfg.Layers-1)
	}
	if *nExperts < 0 || *nExperts > cfg.Experts {
		return fmt.Errorf("--experts %d: %s has %d routed experts a layer (0 = all)", *nExperts, *like, cfg.Experts)
	}
	if *nExperts > 0 && *nExperts < cfg.Experts {
		if err := synthFewerExperts(&cfg, *nExperts); err != nil {
			return err
		}
	}
	cfg.LayerTypes = make([]string, cfg.Layers)
	for i := range cfg.LayerTypes {
		cfg.LayerTypes[i] = format.FullAttention
		if (cfg.Family == family.NameQwen35MoE || cfg.Family == family.NameQwen3Next) && i%4 != 3 {
			cfg.LayerTypes[i] = format.LinearAttention
		}
		if cfg.Family == family.NameGPTOSS && i%2 == 0 {
			cfg.LayerTypes[i] = format.SlidingAttention // gpt-oss's pattern
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var routes [][][]int
	if *route == "replay" {
		if routes, err = synthRoutes(*refs); err != nil {
			return err
		}
	}
	exists, err := synthOut(*out, *force)
	if err != nil {
		return err
	}
	// The model is written under a temporary name beside --out and renamed
	// when complete, as pack does: a failure, a full disk or Ctrl-C leaves
	// no half-written model of GBs behind, and an existing --out stays
	// whole until the new one is in place.
	parent := filepath.Dir(filepath.Clean(*out))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	ekind := kind
	if *mxfp4 {
		ekind = synthExpertKind(&cfg, kind)
	}
	size := synthSize(&cfg, kind, ekind)
	if err := checkRoom(parent, size, "--out"); err != nil {
		return err
	}
	if *ggufPath != "" {
		// The GGUF holds the same weights at about the same bits. When it
		// goes to the same file system, this counts the room once each.
		if err := checkRoom(filepath.Dir(filepath.Clean(*ggufPath)), size, "--gguf"); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(*out)+".synth-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	m, err := synthPack(ctx, cfg, kind, ekind, *layout, tmp)
	if err != nil {
		return err
	}
	st := &m.Stores[0]
	rp := filepath.Join(tmp, experts.RoutesFile)
	if routes != nil {
		rt, _ := json.Marshal(map[string]any{"experts": 64, "routes": routes})
		if err := os.WriteFile(rp, rt, 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(rp); err != nil && !os.IsNotExist(err) {
		return err
	}
	// The tokenizer only has to load: bench feeds random ids.
	if err := os.WriteFile(filepath.Join(tmp, "tokenizer.json"), synthTokenizer(), 0o644); err != nil {
		return err
	}
	if err := pack.Install(tmp, *out, exists); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "synth %s: %d layers, %d records of %s, %s dense, in %.1fs\n", *out, cfg.Layers, m.ExpertLayers*m.Experts,
		bytesStr(st.Stride), bytesStr(m.DenseBytes), time.Since(t0).Seconds())
	if *ggufPath != "" {
		t0 = time.Now()
		if err := synthGGUF(m, *out, *ggufPath, gt); err != nil {
			return err
		}
		fi, err := os.Stat(*ggufPath)
		if err != nil {
			return err
		}
		kinds := gt.String()
		if st.Kind == format.MXFP4 {
			kinds += ", experts MXFP4"
		}
		fmt.Fprintf(os.Stderr, "synth %s: %s GGUF (%s) in %.1fs\n", *ggufPath, bytesStr(fi.Size()), kinds, time.Since(t0).Seconds())
	}
	return nil
}

// synthOut checks --out before synth writes anything: a missing or empty
// directory is taken, a packed model only with --force, and nothing else
// at all (pack.CheckReplace). It reports whether out exists, to be
// replaced once the new model is complete.
func synthOut(out string, force bool) (exists bool, err error) {
	if _, err := os.Stat(out); os.IsNotExist(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	empty, err := pack.CheckReplace(out)
	if err != nil {
		return true, fmt.Errorf("--out: %v", err)
	}
	if !empty && !force {
		return true, fmt.Errorf("--out %s holds a packed model (use --force to replace it)", out)
	}
	return true, nil
}

// checkGGUFFile refuses to replace path unless it is empty or starts
// with the GGUF magic.
func checkGGUFFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--gguf: %v", err)
	}
	defer f.Close()
	magic := make([]byte, len(gguf.Magic))
	n, err := io.ReadFull(f, magic)
	if n == 0 && err == io.EOF {
		return nil // empty
	}
	if err != nil || string(magic) != gguf.Magic {
		return fmt.Errorf("--gguf %s is not a GGUF file: not replaced, even with --force", path)
	}
	return nil
}

// freeBytes is the free space of a directory's file system; tests replace it.
var freeBytes = platform.FreeBytes

// checkRoom refuses to start writing about need bytes into dir when its
// file system has less free: better at once than after filling the disk.
func checkRoom(dir string, need int64, flag string) error {
	if free := freeBytes(dir); free >= 0 && need > free {
		return fmt.Errorf("%s: the model needs about %s in %s, and only %s is free there", flag, bytesStr(need), dir, bytesStr(free))
	}
	return nil
}

// synthExpertKind is the kind of the expert records at kind: MXFP4 for
// gpt-oss at 4 bits, as pack keeps the release's MXFP4 experts (its
// expertKind), else kind.
func synthExpertKind(cfg *format.Config, kind format.Kind) format.Kind {
	if cfg.Family == family.NameGPTOSS && kind == format.Q4 && cfg.Hidden%format.GroupSize == 0 && cfg.MoEInter%format.GroupSize == 0 {
		return format.MXFP4
	}
	return kind
}

// synthSize is about the bytes synthPack writes for cfg at kind, experts
// at ekind: the dense tensors as synthDense lays them out and every
// expert record.
func synthSize(cfg *format.Config, kind, ekind format.Kind) int64 {
	var n int64
	specs, _ := family.Specs(cfg) // an error surfaces when synthDense asks again
	for _, s := range specs {
		t := format.Tensor{Shape: s.Shape}
		size := 4 * int64(t.Rows()) * int64(t.Cols())
		if s.Quant {
			v, sb := kind.Sizes(t.Rows(), t.Cols())
			size = format.AlignUp(v, format.DenseAlign) + 2*format.AlignUp(sb, format.DenseAlign)
		}
		n += format.AlignUp(size, format.DenseAlign)
	}
	st := format.ExpertRecordLayout(cfg, ekind, "experts.bin")
	return n + int64(cfg.ExpertLayers())*int64(cfg.Experts)*st.Stride
}

// synthPack writes a model of config cfg with random weights of kind, its
// expert records of ekind stored in the layout (pack.TileStore), in dir:
// dense.bin, the records and the manifest.
func synthPack(ctx context.Context, cfg format.Config, kind, ekind format.Kind, layout, dir string) (*format.Manifest, error) {
	m := &format.Manifest{Format: format.Version, Family: cfg.Family, Config: cfg, Bits: kind.Bits(), GroupSize: format.GroupSize,
		ExpertLayers: cfg.ExpertLayers(), Experts: cfg.Experts}
	if err := synthDense(m, kind, filepath.Join(dir, "dense.bin")); err != nil {
		return nil, err
	}
	st := format.ExpertRecordLayout(&cfg, ekind, "experts.bin")
	if err := pack.TileStore(&st, layout); err != nil {
		return nil, err
	}
	if err := synthExperts(ctx, m, &st, filepath.Join(dir, st.File)); err != nil {
		return nil, err
	}
	m.Stores = []format.ExpertStore{st}
	m.Format = format.VersionOf(m.Stores)
	mb, _ := json.MarshalIndent(m, "", " ")
	if err := os.WriteFile(filepath.Join(dir, format.ManifestFile), mb, 0o644); err != nil {
		return nil, err
	}
	return m, nil
}

// synthFewerExperts keeps n routed experts a layer, checking that the
// router still has top-k of them to choose (DeepSeek, GLM-4.5: within its
// groups).
func synthFewerExperts(c *format.Config, n int) error {
	if n < c.TopK {
		return fmt.Errorf("--experts %d: below the %d experts each token uses", n, c.TopK)
	}
	if c.Family == family.NameDeepSeek || c.Family == family.NameGLM4MoE {
		var g struct {
			Groups    int `json:"n_group"`
			TopGroups int `json:"topk_group"`
		}
		if err := json.Unmarshal(c.Arch, &g); err != nil {
			return err
		}
		if n%g.Groups != 0 || n/g.Groups < 2 || n/g.Groups*g.TopGroups < c.TopK {
			return fmt.Errorf("--experts %d: want a multiple of the %d router groups, at least 2 a group and %d in the top %d groups", n, g.Groups, c.TopK, g.TopGroups)
		}
	}
	c.Experts = n
	return nil
}

//go:embed synth_routes.bin
var synthRoutesBin []byte

// synthRoutes returns the routes to replay: refs' routes_long0, or the
// embedded recording (synth_routes.bin: layers, positions as two bytes
// big-endian, top-k, then the expert ids of each layer and position, one
// byte each), which holds routes_long0 of refs/tiny-qwen3-5-moe.json.
func synthRoutes(refs string) ([][][]int, error) {
	if refs != "" {
		rb, err := os.ReadFile(refs)
		if err != nil {
			return nil, fmt.Errorf("routes: %v", err)
		}
		var r struct {
			Routes [][][]int `json:"routes_long0"`
		}
		if err := json.Unmarshal(rb, &r); err != nil || len(r.Routes) == 0 {
			return nil, fmt.Errorf("routes: %s has no routes_long0 (%v)", refs, err)
		}
		return r.Routes, nil
	}
	b := synthRoutesBin
	L, P, K := int(b[0]), int(b[1])<<8|int(b[2]), int(b[3])
	if len(b) != 4+L*P*K {
		return nil, fmt.Errorf("embedded routes: %d bytes, want %d", len(b), 4+L*P*K)
	}
	ids := b[4:]
	r := make([][][]int, L)
	for l := range r {
		r[l] = make([][]int, P)
		for p := range r[l] {
			r[l][p] = make([]int, K)
			for k := range r[l][p] {
				r[l][p][k] = int(ids[(l*P+p)*K+k])
			}
		}
	}
	return r, nil
}

// synthTokenizer is a byte-level BPE tokenizer with the 256 byte tokens
// and no merges: enough to load, since bench feeds random ids.
func synthTokenizer() []byte {
	vocab := map[string]int{}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
			r = rune(256 + n) // GPT-2's bytes_to_unicode
			n++
		}
		vocab[string(r)] = b
	}
	split := `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	t := map[string]any{
		"added_tokens": []any{},
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": split}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{}},
	}
	b, _ := json.Marshal(t)
	return b
}

// synthDense writes random dense weights: quantised values spread
// symmetrically over ±1/sqrt(cols) (see centre), so activations keep
// their scale layer after layer;
// norms neutral (zero-centred ones 0, others 1); DeltaNet decay
// parameters zero.
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
	zc := m.Config.Family == family.NameQwen35MoE || m.Config.Family == family.NameQwen3Next // zero-centred norms
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
			centre(vals, kind)
			t.Offset, t.Size = put(vals), v
			sc, bi := synthScale(kind, amp)
			t.ScaleOffset = put(halves(int(sb/2), sc))
			t.BiasOffset = put(halves(int(sb/2), bi))
		} else {
			n := rows * cols
			var b []byte
			switch spread := synthRandomVec(s.Name); {
			case zc && strings.HasSuffix(s.Name, "linear_attn.norm.weight"):
				b = floats(n, 1) // the DeltaNet's gated norm is a plain one
			case spread > 0:
				b = normals(rng, n, spread)
			case strings.HasSuffix(s.Name, "norm.bias"):
				b = floats(n, 0) // a layer norm's bias (V3.2's indexer keys)
			case len(s.Shape) == 1 && zc:
				b = floats(n, 0)
			case len(s.Shape) == 1:
				b = floats(n, 1)
			default:
				b = normals(rng, n, amp)
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

// synthRandomVec is the spread of the random values synth gives a vector
// that is not a norm weight, or 0 for a constant one: the projections'
// biases, attention sinks and router biases. A constant bias would add one
// direction to every hidden state, and a GGUF written without it would go
// unnoticed. (The routers' correction biases stay constant: random ones
// would change which experts the benchmarks' routers pick.)
func synthRandomVec(name string) float32 {
	switch {
	case strings.HasSuffix(name, "_proj.bias"), strings.HasSuffix(name, "router.bias"), strings.HasSuffix(name, ".sinks"):
		return 0.1
	}
	return 0
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
	var tmp []byte // kernels.TileQ4's scratch
	block := make([]byte, 2*st.Stride)
	fillRandom(rand.New(rand.NewPCG(3, 4)), block)
	if st.Gate.Kind != format.MXFP4 {
		centre(block, st.Gate.Kind) // E2M1 codes are symmetric already
	}
	amp := float32(1 / math.Sqrt(float64(m.Config.Hidden)))
	// Expert biases (gpt-oss) come shifted from one random vector too.
	rng := rand.New(rand.NewPCG(5, 6))
	biases := normals(rng, 2*max(m.Config.Hidden, m.Config.MoEInter), 0.1)
	n := m.ExpertLayers * m.Experts
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if i/m.Experts < m.Config.FirstDense {
			// A dense layer has no experts: leave a hole, as pack does.
			if err := w.Flush(); err != nil {
				return err
			}
			if _, err := f.Seek(st.Stride, io.SeekCurrent); err != nil {
				return err
			}
			continue
		}
		s := (int64(i) * 4099) % st.Stride
		copy(rec, block[s:s+st.Stride])
		for _, t := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
			if t.Kind == format.MXFP4 {
				synthMXScales(rec[t.Offset+int64(t.Rows()*t.Cols()/2):t.Offset+t.Size], amp)
				continue
			}
			_, sb := t.Kind.Sizes(t.Rows(), t.Cols())
			sc, bi := synthScale(t.Kind, amp)
			copy(rec[t.ScaleOffset:], halves(int(sb/2), sc))
			copy(rec[t.BiasOffset:], halves(int(sb/2), bi))
		}
		for _, t := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
			if t.Tiled {
				// The same matrix as the row-major layout's, so that
				// both layouts (and the GGUF) compute alike.
				tmp = kernels.TileQ4(rec[t.Offset:t.Offset+t.Size], t.Rows(), t.Cols(), tmp)
			}
		}
		for j, t := range []*format.Tensor{st.GateBias, st.UpBias, st.DownBias} {
			if t != nil {
				s := 4 * ((13*i + 101*j) % (len(biases) / 8))
				copy(rec[t.Offset:t.Offset+t.Size], biases[s:])
			}
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

// synthMXScales sets the scale bytes of an MXFP4 matrix (e8, a byte a
// block) so that its uniform random codes spread about as
// widely as synthScale's values over ±amp (a root mean square of amp/√3;
// uniform E2M1 codes have 2.93), alternating the two nearest powers of two
// along each row.
func synthMXScales(e8 []byte, amp float32) {
	s := math.Log2(float64(amp) / math.Sqrt(3) / 2.93)
	lo := byte(127 + math.Floor(s))
	for i := range e8 {
		e8[i] = lo + byte(i%2)
	}
}

// synthScale is the scale and bias of quantised values spread over
// ±amp: the scale rounded to a half-precision value and the bias -2^(b-1)
// scales, so that every weight is exactly (q-2^(b-1))·scale, which GGUF's
// Q4_0 (q-8)·d and Q8_0 q·d with an f16 d represent without loss.
func synthScale(k format.Kind, amp float32) (scale, bias float32) {
	zero := float32(int(1) << (k.Bits() - 1))
	scale = quant.RoundF16(amp / zero)
	return scale, -zero * scale
}

// centre makes random quantised values symmetric about zero: the lowest
// code (-8 or -128 scales, with synthScale's bias) has no positive twin,
// so it becomes the zero code. Uniform codes would give every weight
// matrix a mean of -scale/2, which layer after layer adds up to a
// direction every hidden state shares: the router then picks nearly the
// same experts for every token, and the logits hardly depend on the input.
func centre(b []byte, k format.Kind) {
	for i, v := range b {
		if k == format.Q4 {
			if v&15 == 0 {
				v |= 8
			}
			if v>>4 == 0 {
				v |= 8 << 4
			}
		} else if v == 0 {
			v = 128
		}
		b[i] = v
	}
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

// normals is n float32 values drawn from a normal distribution of the
// given spread, little-endian.
func normals(rng *rand.Rand, n int, spread float32) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(spread*float32(rng.NormFloat64())))
	}
	return b
}

func floats(n int, v float32) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// halves is n copies of v as halves, the packed format's scales and biases.
func halves(n int, v float32) []byte {
	b := make([]byte, 2*n)
	h := quant.F16(v)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b
}
