// Package engine turns a model into a text generator: it opens a model
// (packing a Hugging Face directory on first use), tokenizes, prefills in
// chunks, decodes with a sampler, streams text, and scores token sequences.
package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/internal/tokenizer"
)

// defaultChunk is the prefill chunk (rows a step) when Options.ChunkRows
// is 0, for the runner and the memory budget alike: 256-row chunks
// prefilled about 28% faster than 64-row ones on the tiny models.
const defaultChunk = 256

// Options configure an Engine.
type Options struct {
	Threads   int       // worker threads; 0 = one per CPU
	Ctx       int       // context length in tokens; 0 = min(model max, 4096)
	ChunkRows int       // prefill chunk size; 0 = defaultChunk
	PackBits  int       // bits for packing a Hugging Face directory; 0 = 4
	CacheDir  string    // where packed copies of Hugging Face directories go; "" = user cache
	Progress  io.Writer // pack progress; nil = silent
	Experts   ExpertOptions
	// Device is where the forward pass runs: "cpu" (also ""), "cuda",
	// "cuda:N", or "auto" (the GPU when one is usable, else the CPU).
	Device string
	// States is the most sequence states the caller holds at once (the
	// server's slots and its prefix cache's entries; 0 is 1). On the GPU
	// each takes device memory, which the expert pool leaves room for.
	States int
	// Drafts is the most MTP drafts per step a generation will ask for
	// (GenOptions.Drafts). The CPU needs nothing ahead; the GPU keeps a
	// speculative verify's per-row DeltaNet snapshots in device memory
	// sized by it, and a generation asking for more drafts gets this many.
	Drafts int
	// AllLogits says the caller scores text (Score), which takes every
	// row's logits of a prefill chunk at once: the memory budget then
	// counts a chunk of logits rows. Without it the budget counts a
	// sequence's speculative buffers, and Score takes chunks of as many
	// rows: the same logits, more slowly.
	AllLogits bool
}

// Engine is one loaded model with its tokenizer and runner.
type Engine struct {
	Model  *model.Model
	Runner *model.Runner // the CPU runner (MTP drafts and benchmarks use it)
	// Fwd runs the forward pass: Runner, or the GPU backend. Device names
	// it ("cpu", or "cuda:N (name)"); DeviceNote says why auto chose the
	// CPU, when it did.
	Fwd        Forwarder
	Device     string
	DeviceNote string
	Tok        *tokenizer.Tokenizer
	Ctx        int
	Dir        string // the packed directory in use
	// Stream is the expert pool when experts stream from disk; nil when
	// the store is mapped whole. ExpertPlan says which and why.
	Stream     *experts.Stream
	ExpertPlan string
	// scoreRows is the rows of a chunk of Score, and maxDrafts the most
	// drafts a step verifies on the CPU: what the memory budget counted
	// (callerBytes).
	scoreRows, maxDrafts int
}

// Open loads a packed directory, or packs a Hugging Face checkpoint
// directory into the cache first (once) and loads that.
func Open(ctx context.Context, dir string, o Options) (*Engine, error) {
	if err := checkDevice(o); err != nil {
		return nil, err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("model: %s is not a directory", dir)
	}
	packed := dir
	if _, err := os.Stat(filepath.Join(dir, format.ManifestFile)); err != nil {
		if err := format.CheckComplete(dir); err != nil {
			return nil, fmt.Errorf("model: %v", err)
		}
		if !hf.IsCheckpoint(dir) {
			return nil, fmt.Errorf("model: %s holds neither a packed model (manifest.json) nor a Hugging Face checkpoint (config.json)", dir)
		}
		if packed, err = PackCached(ctx, dir, o); err != nil {
			return nil, err
		}
	}
	// What the process may use before the dense weights take their share:
	// the pool is sized from it less everything counted, dense included.
	avail, availFrom := memAvailable()
	m, err := model.LoadContext(ctx, packed, o.Progress)
	if err != nil {
		return nil, err
	}
	stream, plan, err := openExperts(ctx, m, o, avail, availFrom)
	if err != nil {
		m.Close()
		return nil, err
	}
	tok, err := tokenizer.Load(packed)
	if err != nil {
		m.Close()
		return nil, err
	}
	e := &Engine{Model: m, Tok: tok, Dir: packed, Stream: stream, ExpertPlan: plan}
	e.Ctx = o.Ctx
	if mp := m.Config.MaxPos; mp > 0 && e.Ctx > mp {
		m.Close()
		return nil, fmt.Errorf("context %d exceeds the model's maximum of %d positions", e.Ctx, mp)
	}
	if e.Ctx <= 0 {
		e.Ctx = 4096
		if mp := m.Config.MaxPos; mp > 0 && mp < e.Ctx {
			e.Ctx = mp
		}
	}
	chunk := o.ChunkRows
	if chunk <= 0 {
		chunk = defaultChunk
	}
	e.Runner = model.NewRunner(m, o.Threads, chunk)
	if stream != nil && stream.KernelReads() {
		e.Runner.Pool.SetPatience(experts.ReadSpin)
	}
	e.scoreRows, e.maxDrafts = scoreRows(o, chunk), draftCap(o, chunk)
	if e.Runner.Routes, err = experts.LoadRoutes(packed, &m.Config); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.selectDevice(o, chunk); err != nil {
		e.Close()
		return nil, err
	}
	if stream != nil && stream.KernelReads() && e.Device == "cpu" {
		// The CPU's forward computes and calls the stream on one
		// goroutine, never both at once, so the pool's dispatcher may
		// poll the stream's reads between operations. The GPU's forward
		// computes its CPU share on a pool of its own, and leaves this
		// one unhooked.
		e.Runner.Pool.SetIdle(stream.Poll)
	}
	return e, nil
}

// PackCached packs a Hugging Face directory into the cache unless an
// up-to-date copy is there, and returns the packed directory.
func PackCached(ctx context.Context, src string, o Options) (string, error) {
	bits := o.PackBits
	if bits == 0 {
		bits = 4
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n%d\n", abs, bits, format.Version)
	entries, err := os.ReadDir(abs)
	if err != nil {
		return "", fmt.Errorf("model: %v", err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			fmt.Fprintf(h, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
		}
	}
	cache := o.CacheDir
	if cache == "" {
		if cache, err = CacheDir(); err != nil {
			return "", err
		}
	}
	dst := filepath.Join(cache, fmt.Sprintf("%s-q%d-%s", filepath.Base(abs), bits, hex.EncodeToString(h.Sum(nil))[:12]))
	if _, err := format.ReadManifest(dst); err == nil {
		return dst, nil
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "packing %s at %d bits into %s (once)\n", src, bits, dst)
	}
	if err := pack.Pack(ctx, abs, dst, pack.Options{Bits: bits, Force: true, Progress: o.Progress}); err != nil {
		return "", err
	}
	return dst, nil
}

// CacheDir is $SLUICE_CACHE, else the user cache directory's sluice folder.
func CacheDir() (string, error) {
	if d := os.Getenv("SLUICE_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (set SLUICE_CACHE): %v", err)
	}
	return filepath.Join(d, "sluice"), nil
}

// Close releases the model.
func (e *Engine) Close() {
	if c, ok := e.Fwd.(closer); ok && e.Fwd != Forwarder(e.Runner) {
		c.Close()
	}
	e.Runner.Close()
	e.Model.Close()
}

// NewState allocates a sequence state of the engine's context length.
func (e *Engine) NewState() (*model.State, error) { return e.Model.NewState(e.Ctx) }

// CtxHint is what to tell a user whose text does not fit the context: to
// raise --ctx, up to the model's maximum where it is known, or that the
// context already is that maximum.
func (e *Engine) CtxHint() string {
	switch mp := e.Model.Config.MaxPos; {
	case mp <= 0:
		return "raise --ctx"
	case e.Ctx >= mp:
		return fmt.Sprintf("the context is the model's maximum of %d positions", mp)
	default:
		return fmt.Sprintf("raise --ctx (the model's maximum is %d)", mp)
	}
}

// GenOptions control one generation.
type GenOptions struct {
	MaxTokens int
	Sample    sample.Params
	IgnoreEOS bool
	// Drafts is the number of tokens the model's MTP head drafts per step
	// for speculative decoding (0 = off). Greedy output is the same with or
	// without drafts; sampled output has the same distribution. Models
	// without an MTP head decode plainly and say so in Stats.MTP.
	Drafts int
	// KeepPoolCounts keeps the expert pools' eviction counts as they are
	// when a sequence starts on an empty state, which otherwise counts as
	// a new text (Engine.NewSequence): other sequences are using the pools
	// (a server's requests at once), or the prompt continues the text they
	// counted (a chat's next turn, prefilled whole).
	KeepPoolCounts bool
}

// Stats describe one generation.
type Stats struct {
	PromptTokens    int     `json:"prompt_tokens"`
	GeneratedTokens int     `json:"generated_tokens"`
	PrefillTokS     float64 `json:"prefill_tok_s"`
	DecodeTokS      float64 `json:"decode_tok_s"`
	PrefillMS       float64 `json:"prefill_ms"`
	DecodeMS        float64 `json:"decode_ms"`
	StopReason      string  `json:"stop_reason"` // "eos", "length", "context"
	// Device is where the forward pass ran ("cpu", "cuda:0 (NAME)").
	Device string `json:"device"`
	// MTP describes speculative decoding; nil when no drafts were asked for.
	MTP *MTPStats `json:"mtp,omitempty"`
	// Experts and Lookahead describe the expert pool; nil when the
	// experts are mapped whole (or lookahead is off).
	Experts   *ExpertStats    `json:"experts,omitempty"`
	Lookahead *LookaheadStats `json:"lookahead,omitempty"`
	// GPUPool describes the GPU's expert pool; nil on the CPU and when
	// every expert is resident on the GPU.
	GPUPool *GPUPoolStats `json:"gpu_pool,omitempty"`
}

// Emit receives each generated token and the text it completes (possibly
// empty while a UTF-8 sequence is incomplete). Returning an error stops.
type Emit func(token int, text string) error

// Generate prefills prompt into st (fresh, or holding a prefix the caller
// accounts for) and decodes up to MaxTokens tokens, passing each to emit.
func (e *Engine) Generate(ctx context.Context, st *model.State, prompt []int, o GenOptions, emit Emit) ([]int, Stats, error) {
	q, err := e.NewSequence(st, o)
	if err != nil {
		return nil, Stats{}, err
	}
	if err := q.Prefill(ctx, prompt); err != nil {
		return nil, q.Stats(), err
	}
	for !q.Done() {
		toks, text, err := q.Step(ctx)
		if err != nil {
			return q.Tokens(), q.Stats(), err
		}
		if emit != nil {
			for i, t := range toks {
				if q.IsEOS(t) {
					continue // the stop token is returned, not emitted
				}
				s := ""
				if i == len(toks)-1 {
					s = text
				}
				if err := emit(t, s); err != nil {
					return q.Tokens(), q.Stats(), err
				}
			}
		}
	}
	if rest := q.Flush(); rest != "" && emit != nil {
		if err := emit(-1, rest); err != nil {
			return q.Tokens(), q.Stats(), err
		}
	}
	return q.Tokens(), q.Stats(), nil
}

// Score is what `sluice score` prints.
type Score struct {
	N          int       `json:"n"`
	Argmax     []int     `json:"argmax"`
	Logprobs   []float64 `json:"logprobs"`
	NLL        float64   `json:"nll"`
	LastLogits []float32 `json:"last_logits"`
	Device     string    `json:"device"` // where the forward pass ran
}

// Score runs tokens through a fresh state and reports, per position, the
// argmax and the log-probability of the next token. It needs at least two
// tokens: each log-probability is of a token given those before it, so one
// token has none, and an NLL of 0 would read as a perfect prediction.
func (e *Engine) Score(ctx context.Context, tokens []int) (*Score, error) {
	if len(tokens) < 2 {
		return nil, fmt.Errorf("score needs at least 2 tokens, got %d: each log-probability is of a token given those before it", len(tokens))
	}
	if len(tokens) > e.Ctx {
		return nil, fmt.Errorf("score: %d tokens exceed the context of %d; %s", len(tokens), e.Ctx, e.CtxHint())
	}
	st, err := e.NewState()
	if err != nil {
		return nil, err
	}
	V := e.Model.Config.Vocab
	sc := &Score{Device: e.Device, N: len(tokens), Argmax: make([]int, len(tokens)), Logprobs: make([]float64, 0, len(tokens)-1)}
	step := max(e.scoreRows, 1) // what the budget counted (callerBytes)
	logits := make([]float32, step*V)
	lp := make([]float32, V)
	for i := 0; i < len(tokens); i += step {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		j := min(i+step, len(tokens))
		if err := e.Fwd.Forward(st, tokens[i:j], logits, true); err != nil {
			return nil, err
		}
		for r := 0; r < j-i; r++ {
			row := logits[r*V : (r+1)*V]
			p := i + r
			sc.Argmax[p] = sample.Argmax(row)
			if err := finiteLogit(row[sc.Argmax[p]], p); err != nil {
				return nil, fmt.Errorf("score: %v", err)
			}
			if p+1 < len(tokens) {
				sample.LogSoftmax(lp, row)
				sc.Logprobs = append(sc.Logprobs, float64(lp[tokens[p+1]]))
			}
			if p == len(tokens)-1 {
				sc.LastLogits = append([]float32(nil), row...)
			}
		}
	}
	var sum float64
	for _, v := range sc.Logprobs {
		sum -= v
	}
	if len(sc.Logprobs) > 0 {
		sc.NLL = sum / float64(len(sc.Logprobs))
	}
	return sc, nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e6 }

func rate(n int, ms float64) float64 {
	if ms <= 0 {
		return 0
	}
	return float64(n) / ms * 1000
}
