package main

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/tokenizer"
	"github.com/sluicelm/sluice/models"
)

func randomSeed() uint64 {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano())
	}
	return binary.LittleEndian.Uint64(b[:])
}

func cmdPack(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pack", flag.ContinueOnError)
	bits := fs.Int("bits", 4, "16 (bf16, exact), 8 or 4")
	force := fs.Bool("force", false, "replace DST if it is a packed model (nothing else is replaced)")
	lowBits := fs.String("low-bits", "", "also write low-bit expert stores for lossy --miss-bits, e.g. 3,2")
	layout := fs.String("layout", pack.LayoutRows, "how q4 expert records are stored: rows, tiled, or auto (as this CPU's decode kernel reads them)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	var lows []int
	if *lowBits != "" {
		for _, f := range strings.Split(*lowBits, ",") {
			b, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || (b != 2 && b != 3) {
				return fmt.Errorf("--low-bits %q: want 3, 2 or 3,2", *lowBits)
			}
			lows = append(lows, b)
		}
	}
	if len(pos) != 2 {
		return fmt.Errorf("want SRC and DST, got %d arguments %q (usage: sluice pack [--bits 16|8|4] [--layout rows|tiled|auto] [--force] SRC DST)", len(pos), pos)
	}
	var progress io.Writer
	if isTerminal(os.Stderr) {
		progress = os.Stderr
	}
	return pack.Pack(ctx, pos[0], pos[1], pack.Options{Bits: *bits, Force: *force, Progress: progress, LowBits: lows, Layout: *layout})
}

func cmdInspect(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the manifest summary as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one DIR, got %q (usage: sluice inspect DIR)", pos)
	}
	dir := pos[0]
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	var man *format.Manifest
	if _, err := os.Stat(filepath.Join(dir, format.ManifestFile)); err == nil {
		if man, err = format.ReadManifest(dir); err != nil {
			return err
		}
	} else if err := format.CheckComplete(dir); err != nil {
		return err
	} else if hf.IsCheckpoint(dir) {
		cfg, _, err := hf.ReadConfig(dir)
		if err != nil {
			return err
		}
		fmt.Printf("Hugging Face checkpoint %s (not packed)\n", dir)
		printConfig(&cfg)
		fmt.Println("pack it with: sluice pack SRC DST")
		return nil
	} else {
		return fmt.Errorf("%s holds neither manifest.json nor config.json", dir)
	}
	c := &man.Config
	var dense, denseParams int64
	for _, t := range man.Dense {
		dense += t.End() - t.Offset
		denseParams += int64(t.Rows()) * int64(t.Cols())
	}
	st := man.Stores[0]
	expertParams := int64(man.ExpertLayers) * int64(man.Experts) * int64(3*c.MoEInter*c.Hidden)
	expertBytes := int64(man.ExpertLayers) * int64(man.Experts) * st.Stride
	activeParams := denseParams + int64(c.ExpertLayers())*int64(c.TopK)*int64(3*c.MoEInter*c.Hidden)
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{
			"family": c.Family, "bits": man.Bits, "config": c, "dense_params": denseParams, "expert_params": expertParams,
			"active_params": activeParams, "dense_bytes": man.DenseBytes, "expert_bytes": expertBytes, "record_stride": st.Stride,
			"experts_tiled": st.Tiled(), "blocks": family.Describe(c),
		})
	}
	fmt.Printf("packed model %s (format %d, %d-bit, group %d)\n", dir, man.Format, man.Bits, man.GroupSize)
	printConfig(c)
	fmt.Printf("parameters     %s total: %s dense, %s in experts; %s active per token\n",
		count(denseParams+expertParams), count(denseParams), count(expertParams), count(activeParams))
	fmt.Printf("dense.bin      %s\n", bytesStr(man.DenseBytes))
	lay := "row-major"
	if st.Tiled() {
		lay = "q4 tiled"
	}
	fmt.Printf("experts.bin    %s: %d records of %s (stride %d, %d-aligned, %s)\n", bytesStr(expertBytes), man.ExpertLayers*man.Experts, bytesStr(st.Stride), st.Stride, format.RecordAlign, lay)
	_ = dense
	return nil
}

func printConfig(c *format.Config) {
	kinds := map[string]int{}
	for _, t := range c.LayerTypes {
		kinds[t]++
	}
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(ks)
	fmt.Printf("family         %s\n", c.Family)
	fmt.Printf("layers         %d (%s)%s\n", c.Layers, strings.Join(ks, ", "), map[bool]string{true: " + MTP layer", false: ""}[c.MTPLayers > 0])
	fmt.Printf("hidden         %d, vocab %d, heads %d/%d kv, head_dim %d, rotary %d\n", c.Hidden, c.Vocab, c.Heads, c.KVHeads, c.HeadDim, c.RotaryDim)
	fmt.Printf("experts        %d, top-%d, intermediate %d, shared %d\n", c.Experts, c.TopK, c.MoEInter, c.SharedInter)
	for _, l := range family.Describe(c) {
		fmt.Println(l)
	}
}

func count(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	}
	return fmt.Sprintf("%d", n)
}

func bytesStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func cmdTokenize(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	text := fs.String("text", "", "text to tokenize")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if _, err := mf.resolve(ctx); err != nil {
		return err
	}
	dir := mf.dir
	if dir == "" {
		cache, err := engine.CacheDir()
		if err != nil {
			return err
		}
		if dir, err = models.DefaultDir(cache); err != nil {
			return err
		}
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return err
	}
	ids := tok.Encode(*text)
	if ids == nil {
		ids = []int{}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"ids": ids})
}

func cmdScore(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("score", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	tokens := fs.String("tokens", "", "comma-separated token ids")
	textFile := fs.String("text-file", "", "file whose text is tokenized and scored")
	fs.Bool("json", true, "print JSON (the only output format)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*tokens == "") == (*textFile == "") {
		return fmt.Errorf("give exactly one of --tokens or --text-file")
	}
	if *tokens != "" {
		// A malformed list is refused before the model loads; the range
		// check waits for its vocabulary.
		if _, err := parseIDs(*tokens); err != nil {
			return err
		}
	}
	mf.allLogits = true
	e, err := mf.open(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	var ids []int
	if *tokens != "" {
		if ids, err = vocabIDs(e, *tokens); err != nil {
			return err
		}
	} else {
		b, err := os.ReadFile(*textFile)
		if err != nil {
			return err
		}
		if ids = e.Tok.Encode(string(b)); len(ids) == 0 {
			return fmt.Errorf("%s tokenizes to nothing", *textFile)
		}
	}
	sc, err := e.Score(ctx, ids)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	return json.NewEncoder(w).Encode(sc)
}

func cmdRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var mf modelFlags
	var sf sampleFlags
	mf.register(fs)
	sf.register(fs)
	prompt := fs.String("p", "", "prompt text")
	tokens := fs.String("tokens", "", "prompt as comma-separated token ids")
	n := fs.Int("n", 128, "tokens to generate at most")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past end-of-sequence tokens")
	asJSON := fs.Bool("json", false, "print one JSON object instead of streaming text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*prompt == "") == (*tokens == "") {
		return fmt.Errorf("give exactly one of -p TEXT or --tokens IDS (a non-empty prompt)")
	}
	if *n < 0 {
		return fmt.Errorf("-n %d must be >= 0", *n)
	}
	if *tokens != "" {
		// A malformed list is refused before the model loads; the range
		// check waits for its vocabulary.
		if _, err := parseIDs(*tokens); err != nil {
			return err
		}
	}
	e, sp, err := sf.open(ctx, &mf)
	if err != nil {
		return err
	}
	defer e.Close()
	var ids []int
	if *tokens != "" {
		if ids, err = vocabIDs(e, *tokens); err != nil {
			return err
		}
	} else if ids = e.Tok.Encode(*prompt); len(ids) == 0 {
		return fmt.Errorf("the prompt tokenizes to nothing")
	}
	st, err := e.NewState()
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var text strings.Builder
	emit := func(tok int, s string) error {
		if *asJSON {
			text.WriteString(s)
			return nil
		}
		out.WriteString(s)
		return out.Flush()
	}
	gen, stats, err := e.Generate(ctx, st, ids, engine.GenOptions{MaxTokens: *n, Sample: sp, IgnoreEOS: *ignoreEOS, Drafts: sf.drafts}, emit)
	if err != nil {
		return err
	}
	if *asJSON {
		if gen == nil {
			gen = []int{}
		}
		return json.NewEncoder(out).Encode(map[string]any{"tokens": gen, "text": text.String(), "stats": statsJSON(stats, sp.Seed)})
	}
	out.WriteString("\n")
	out.Flush()
	fmt.Fprintf(os.Stderr, "prompt %d tokens, generated %d tokens (%s), prefill %.1f tok/s, decode %.1f tok/s, device %s\n",
		stats.PromptTokens, stats.GeneratedTokens, stats.StopReason, stats.PrefillTokS, stats.DecodeTokS, stats.Device)
	fmt.Fprintln(os.Stderr, expertSummary(e, stats))
	return nil
}

// expertSummary is the run summary's line about the experts: what was
// chosen and, when they stream, the hit rate and MB read per token.
func expertSummary(e *engine.Engine, s engine.Stats) string {
	line := "experts: " + e.ExpertPlan
	if x := s.Experts; x != nil {
		line += fmt.Sprintf("\nexperts: hit rate %.1f%%, %.2f MB read per prompt token, %.2f MB per generated token, io wait %.0f ms",
			100*x.HitRate, perToken(x.PrefillBytesRead, s.PromptTokens), perToken(x.DecodeBytesRead, s.GeneratedTokens-1), x.IOWaitMS)
		if la := s.Lookahead; la != nil {
			line += fmt.Sprintf("; lookahead %d issued, %d useful, %d wasted", la.Issued, la.Useful, la.Wasted)
		}
	}
	if g := s.GPUPool; g != nil {
		line += fmt.Sprintf("\ngpu pool: %d slots, hit rate %.1f%% (decode %.1f%%), %.2f MB copied and %.2f ms waited for copies per generated token; lookahead %d copied, %d used, %d held back",
			g.Slots, 100*g.HitRate, 100*g.DecodeHitRate, perToken(int64(g.DecodeBytesCopied), s.GeneratedTokens-1), msPerToken(g.DecodeCopyWaitMS, s.GeneratedTokens-1),
			g.Prefetched, g.PrefetchUsed, g.PrefetchSkipped)
		if g.CPUComputed > 0 {
			ms := g.CPUExpertMS // a wave's further experts: the usual cost
			if ms == 0 {
				ms = g.CPUFirstMS
			}
			line += fmt.Sprintf("; %d misses computed on the CPU (%.2f ms each)", g.CPUComputed, ms)
		}
		if g.LowCopies > 0 {
			line += fmt.Sprintf("; %d copies at low bits (lossy)", g.LowCopies)
		}
	}
	return line
}

func msPerToken(ms float64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return ms / float64(n)
}

func perToken(bytes int64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(bytes) / 1e6 / float64(n)
}

func statsJSON(s engine.Stats, seed uint64) map[string]any {
	m := map[string]any{"prompt_tokens": s.PromptTokens, "generated_tokens": s.GeneratedTokens,
		"prefill_tok_s": s.PrefillTokS, "decode_tok_s": s.DecodeTokS, "prefill_ms": s.PrefillMS,
		"decode_ms": s.DecodeMS, "stop_reason": s.StopReason, "seed": seed, "device": s.Device}
	if s.Experts != nil {
		m["experts"] = s.Experts
	}
	if s.Lookahead != nil {
		m["lookahead"] = s.Lookahead
	}
	if s.MTP != nil {
		m["mtp"] = s.MTP
	}
	if s.GPUPool != nil {
		m["gpu_pool"] = s.GPUPool
	}
	return m
}

func cmdChat(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	var mf modelFlags
	var sf sampleFlags
	mf.register(fs)
	sf.register(fs)
	n := fs.Int("n", 512, "tokens per reply at most")
	system := fs.String("system", "", "system prompt")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	e, sp, err := sf.open(ctx, &mf)
	if err != nil {
		return err
	}
	defer e.Close()
	if e.Tok.TemplateIsFallback() {
		fmt.Fprintf(os.Stderr, "note: the model's chat template could not be used (%s); using the ChatML fallback\n", e.Tok.TemplateFallbackReason())
	}
	var msgs []tokenizer.Message
	if *system != "" {
		msgs = append(msgs, tokenizer.Message{Role: "system", Content: *system})
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	interactive := isTerminal(os.Stdin)
	turns := 0
	for {
		if interactive {
			fmt.Fprint(os.Stderr, "> ")
		}
		if !in.Scan() {
			return in.Err()
		}
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: line})
		var ids []int
		if msgs, ids, err = fitChat(e, msgs, *n, os.Stderr); err != nil {
			return err
		}
		if ids == nil {
			continue // the message alone does not fit: said, and dropped
		}
		// The whole conversation is prefilled each turn: simple and exact;
		// the server's prefix reuse is what avoids recomputing it.
		st, err := e.NewState()
		if err != nil {
			return err
		}
		var reply strings.Builder
		// A later turn continues the conversation the pools counted.
		o := engine.GenOptions{MaxTokens: *n, Sample: sp, Drafts: sf.drafts, KeepPoolCounts: turns > 0}
		turns++
		_, stats, err := e.Generate(ctx, st, ids, o, func(_ int, s string) error {
			reply.WriteString(s)
			fmt.Print(s)
			return nil
		})
		fmt.Println()
		if err != nil {
			return err
		}
		if interactive {
			fmt.Fprintf(os.Stderr, "[%d tokens, %.1f tok/s]\n", stats.GeneratedTokens, stats.DecodeTokS)
		}
		msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: reply.String()})
	}
}

// fitChat returns the conversation msgs (its last message the user's new
// one) as the prompt ids of the next turn, after dropping its oldest
// exchanges (a user message and the reply to it; the system prompt stays)
// until the prompt leaves room for a reply of n tokens, or of half the
// context if n is more, as ollama truncates a chat's history: a chat that
// outgrows the context goes on instead of ending. Each drop is noted on
// log. When the new message does not fit even alone, it says so and
// returns the conversation without it and nil ids.
func fitChat(e *engine.Engine, msgs []tokenizer.Message, n int, log io.Writer) ([]tokenizer.Message, []int, error) {
	first := 0
	if len(msgs) > 0 && msgs[0].Role == "system" {
		first = 1
	}
	room := min(n, e.Ctx/2)
	for {
		prompt, err := e.Tok.ApplyChatTemplate(msgs, true)
		if err != nil {
			return nil, nil, err
		}
		ids := e.Tok.Encode(prompt)
		if len(ids)+room <= e.Ctx {
			return msgs, ids, nil
		}
		if len(msgs)-first < 3 { // nothing older than the new message
			if len(ids) < e.Ctx {
				return msgs, ids, nil // no room for a whole reply: it stops at the context's end
			}
			fmt.Fprintf(log, "this message makes a prompt of %d tokens, more than the context of %d: not sent; %s\n", len(ids), e.Ctx, e.CtxHint())
			return msgs[:len(msgs)-1], nil, nil
		}
		msgs = append(msgs[:first], msgs[first+2:]...)
		fmt.Fprintf(log, "note: the oldest exchange was dropped from the conversation to fit the context of %d tokens\n", e.Ctx)
	}
}

// vocabIDs parses --tokens and checks every id against the model's vocabulary.
func vocabIDs(e *engine.Engine, s string) ([]int, error) {
	ids, err := parseIDs(s)
	if err != nil {
		return nil, err
	}
	for _, t := range ids {
		if t < 0 || t >= e.Model.Config.Vocab {
			return nil, fmt.Errorf("token id %d outside the vocabulary [0,%d)", t, e.Model.Config.Vocab)
		}
	}
	return ids, nil
}
