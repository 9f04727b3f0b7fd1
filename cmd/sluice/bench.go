package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/platform"
)

func cmdBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	promptN := fs.Int("prompt", 512, "prompt tokens")
	genN := fs.Int("gen", 128, "generated tokens")
	repeat := fs.Int("repeat", 3, "trials (after one warm-up)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed trials to this file")
	genOnly := fs.Bool("profile-decode-only", false, "with --cpuprofile, profile only decode (prompt of 1 token)")
	depth := fs.Int("depth", 0, "context tokens before the timed decode (0: decode from an empty context, as llama-bench's tg test does)")
	graphs := fs.Bool("gpu-graphs", true, "on the GPU, record the one-row decode step as a CUDA graph and replay it (false: launch every kernel from the host)")
	phases := fs.Bool("gpu-phases", false, "on the GPU, time the phases of the last trial's decode steps with CUDA events and print where the time goes (stderr)")
	disk := fs.Bool("disk", false, "also measure the uncached (O_DIRECT, F_NOCACHE, FILE_FLAG_NO_BUFFERING) random-read bandwidth of the expert store at the record size and queue depth in use")
	drafts := fs.Int("drafts", 0, "MTP drafts per decode step (speculative decoding; 0 = off): the decode's tok/s then counts every token a step decides")
	opsFlag := fs.Bool("ops", false, "time each of the CPU backend's operations during the decode (norms, projections, attention, delta rule, router, experts, logits) and print where a token's time goes")
	membw := fs.Bool("membw", false, "also measure the memory's read bandwidth and print the decode speed it allows: the weights a token reads ÷ bandwidth")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if pools := strings.Split(mf.experts.poolMB, ","); len(pools) > 1 {
		// One bench per pool size, each with its own engine. Every size is
		// checked first: a bad one found only in its turn would come after
		// the benches before it, which take minutes on a real model.
		for _, p := range pools {
			if strings.TrimSpace(p) == "" {
				return fmt.Errorf("--pool-mb %q: an empty entry", mf.experts.poolMB)
			}
			if _, _, err := poolSize("--pool-mb", strings.TrimSpace(p)); err != nil {
				return err
			}
		}
		for _, p := range pools {
			if err := cmdBench(ctx, append(slices.Clone(args), "--pool-mb", strings.TrimSpace(p))); err != nil {
				return err
			}
		}
		return nil
	}
	if err := checkMins([]intMin{{"--prompt", *promptN, 1}, {"--gen", *genN, 2}, {"--repeat", *repeat, 1},
		{"--depth", *depth, 0}, {"--drafts", *drafts, 0}}); err != nil {
		return err
	}
	mf.drafts = *drafts
	if mf.ctx == 0 {
		mf.ctx = max(*promptN, *depth+1) + *genN
	}
	e, err := mf.open(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	if need := max(*promptN, *depth+1) + *genN; need > e.Ctx {
		return fmt.Errorf("--prompt or --depth, plus --gen, needs a context of %d; the model is open with %d", need, e.Ctx)
	}
	// Random ids, as llama-bench uses: the speed of a step does not depend
	// on which tokens it sees, only (for MoE) on the experts they route to.
	// Every trial, the warm-up included, draws its own: a streamed pool
	// warmed up on the timed trial's very tokens would already hold the
	// records their routes need, and report a hit rate no real text gets.
	vocab := e.Model.Config.Vocab - 8
	inputs := func(trial int) (prompt, ctxToks []int) {
		rng := rand.New(rand.NewPCG(1, 2+uint64(trial)))
		prompt = make([]int, *promptN)
		for i := range prompt {
			prompt[i] = rng.IntN(vocab)
		}
		// The decode runs after depth context tokens (at least one: the
		// first generated token needs an input). A depth equal to the
		// prompt decodes straight after the timed prefill.
		ctxToks = prompt[:max(min(*depth, *promptN), 1)]
		if *depth > *promptN {
			ctxToks = make([]int, *depth)
			for i := range ctxToks {
				ctxToks[i] = rng.IntN(vocab)
			}
		}
		if *genOnly {
			prompt, ctxToks = prompt[:1], prompt[:1]
		}
		return prompt, ctxToks
	}
	depthUsed := 0 // the context of the decode: every trial's is as long
	st, err := e.NewState()
	if err != nil {
		return err
	}
	if g, ok := e.Fwd.(interface{ SetGraphs(bool) }); ok {
		g.SetGraphs(*graphs)
	}
	if *opsFlag && e.Fwd != engine.Forwarder(e.Runner) {
		return fmt.Errorf("--ops times the CPU's operations (device %s); on the GPU, --gpu-phases", e.Device)
	}
	if *phases {
		p, ok := e.Fwd.(engine.Profiler)
		if !ok {
			return fmt.Errorf("--gpu-phases needs the GPU (device %s)", e.Device)
		}
		if err := p.EnableProfile(8192); err != nil {
			return err
		}
		defer func() { fmt.Fprint(os.Stderr, p.Profile()) }()
	}
	var pre, dec, disp, launches, self, cpuUser, cpuSys, busy, steal []float64
	var mtp *engine.MTPStats // the last trial's drafts
	var trials []benchTrial
	var diskBefore float64
	if *disk && e.Stream != nil {
		if diskBefore, err = measureDisk(e); err != nil {
			return err
		}
	}
	// The memory's bandwidth moves from minute to minute on a shared
	// machine (15.7 to 31.2 GB/s within two hours on the 2-core
	// development machine): measured around every trial, each trial's share
	// of the limit is taken against the bandwidth of its own minute.
	var mem *memMeter
	var bws, shares []float64
	var prof *os.File
	defer func() {
		if prof != nil {
			pprof.StopCPUProfile()
			prof.Close()
		}
	}()
	for t := 0; t <= *repeat; t++ {
		if t == 1 && *cpuProfile != "" {
			if prof, err = os.Create(*cpuProfile); err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(prof); err != nil {
				return err
			}
		}
		prompt, ctxToks := inputs(t)
		if t == 1 && *membw {
			mem = newMemMeter(e, decodeSteps{depth: len(ctxToks), gen: *genN})
			bws = append(bws, mem.measure())
		}
		depthUsed = len(ctxToks)
		bt, err := runTrial(ctx, e, st, prompt, ctxToks, *genN, *drafts, *opsFlag)
		if err != nil {
			return err
		}
		s := bt.stats
		if t == 0 {
			continue // warm-up: page in weights, grow scratch
		}
		trials = append(trials, bt)
		if s.MTP != nil {
			mtp = s.MTP
		}
		pre = append(pre, bt.pre.PrefillTokS)
		dec = append(dec, s.DecodeTokS)
		if mem != nil {
			bws = append(bws, mem.measure())
			// No share where the clock saw no time for the reads
			// (ReadBandwidth's 0): it would be infinite.
			if around := (bws[len(bws)-2] + bws[len(bws)-1]) / 2; around > 0 {
				shares = append(shares, s.DecodeTokS/(around*1e9/mem.tokenBytes))
			}
		}
		steps := float64(max(s.GeneratedTokens-1, 1))
		disp = append(disp, float64(bt.dispatches)/steps)
		if parts := bt.dispatches * uint64(e.Runner.Pool.Threads()-1); parts > 0 {
			self = append(self, float64(bt.selfRuns)/float64(parts))
		}
		if bt.cpuOK {
			cpuUser = append(cpuUser, bt.cpuUser.Seconds()*1e3/steps)
			cpuSys = append(cpuSys, bt.cpuSys.Seconds()*1e3/steps)
			busy = append(busy, (bt.cpuUser+bt.cpuSys).Seconds()/bt.wall.Seconds())
		}
		if bt.machine > 0 {
			steal = append(steal, float64(bt.steal)/float64(bt.machine))
		}
		launches = append(launches, float64(bt.launches)/steps)
		if isTerminal(os.Stderr) && !*asJSON {
			fmt.Fprintf(os.Stderr, "\rtrial %d/%d", t, *repeat)
		}
	}
	res := map[string]any{
		"model": e.Dir, "family": e.Model.Config.Family, "bits": e.Model.Manifest.Bits, "threads": e.Runner.Pool.Threads(),
		"prompt_tokens": *promptN, "gen_tokens": *genN, "depth": depthUsed, "repeat": *repeat,
		"prefill_tok_s": median(pre), "decode_tok_s": median(dec), "prefill_all": pre, "decode_all": dec,
		// Operations a decode step hands to the worker pool: times the
		// per-op hand-off (BenchmarkPoolDispatch), the overhead per token.
		"decode_dispatches_per_token": median(disp),
		// GPU kernels a decode step launches (0 on the CPU).
		"decode_launches_per_token": median(launches),
		"device":                    e.Device,
		// Whether the dense q4 matrices are tiled in memory for the
		// CPU's decode kernel (kernels.TiledQ4; SLUICE_FLATQ4=1 not).
		"q4_tiled": e.Model.Tiled,
		// Whether the store holds q4 expert records tiled (pack --layout),
		// the layout a streamed pool computes them in.
		"experts_stored_tiled": e.Model.Manifest.Stores[0].Tiled(),
	}
	var xs *poolBench
	if e.Stream != nil {
		xs = summarisePool(e, trials)
		if *disk {
			// The disk's speed swings between runs: average a measurement
			// before the trials with one after.
			after, err := measureDisk(e)
			if err != nil {
				return err
			}
			xs.DiskMBs = (diskBefore + after) / 2
		}
		res["experts"] = xs
	}
	res["experts_plan"] = e.ExpertPlan
	if mtp != nil {
		res["mtp"] = mtp
	}
	if p, ok := e.DevicePool(); ok && p.Slots > 0 {
		// The GPU's expert pool over the whole bench, warm-up included,
		// and over its decode steps alone.
		rate := func(h, m uint64) float64 { return float64(h) / float64(max(h+m, 1)) }
		res["gpu_pool"] = map[string]any{"slots": p.Slots, "records": p.Records, "record_mb": float64(p.RecordBytes) / 1e6,
			"hits": p.Hits, "misses": p.Misses, "hit_rate": rate(p.Hits, p.Misses), "mb_copied": float64(p.BytesUp) / 1e6,
			"decode_hit_rate": rate(p.DecodeHits, p.DecodeMisses), "decode_mb_copied": float64(p.DecodeBytesUp) / 1e6,
			"prefetched": p.Prefetched, "prefetch_used": p.PrefetchUsed, "prefetch_skipped": p.PrefetchSkipped, "host_pinned": p.HostPinned,
			"cpu_computed": p.CPUComputed, "cpu_first_ms": p.CPUFirstMS, "cpu_ms_per_expert": p.CPUExpertMS, "cpu_lead_ms": p.CPULeadMS, "copy_ms_per_record": p.CopyRecordMS, "low_copies": p.LowCopies,
			"copy_wait_ms": p.CopyWaitMS, "decode_copy_wait_ms": p.DecodeCopyWaitMS}
		if xs != nil {
			// The tiers below it over the decode: the share of the GPU's
			// misses found in the host's pool, and what was read from
			// disk per token.
			g := res["gpu_pool"].(map[string]any)
			g["host_hit_rate"], g["disk_mb_per_token"] = xs.HitRate, xs.MBPerToken
		}
	}
	var lim *decodeLimit
	if mem != nil {
		lim = mem.limit(median(bws))
		mem.close()
		lim.BandwidthAll, lim.Share, lim.ShareAll = bws, median(shares), shares
		lim.WeightsShare = lim.Share * lim.TokenMB / (lim.TokenMB + lim.StateMB)
		res["decode_limit"] = lim
	}
	if len(self) > 0 {
		// The share of the workers' parts of the decode's split
		// operations that the dispatching thread ran itself, their
		// workers not having started them (kernels.Pool.SelfRuns): near 0
		// when every thread has a core, near 1 when the decode ran on one
		// thread in effect.
		res["decode_self_run_share"] = median(self)
	}
	if len(cpuUser) > 0 {
		// The process's CPU time per decoded token, in user mode and in
		// the kernel (with experts streamed, chiefly the reads), and the
		// cores it kept busy on average.
		res["decode_cpu_user_ms_per_token"] = median(cpuUser)
		res["decode_cpu_sys_ms_per_token"] = median(cpuSys)
		res["decode_cores_busy"] = median(busy)
	}
	if len(steal) > 0 {
		// The share of the machine's processor time during the decode
		// that its host took (steal, on a virtual machine): time the
		// compute wanted that the process's own CPU time does not show.
		res["decode_cpu_steal_share"] = median(steal)
	}
	var ops *opsSummary
	if *opsFlag {
		ops = summariseOps(trials)
		res["decode_ops"] = ops
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	if isTerminal(os.Stderr) {
		fmt.Fprint(os.Stderr, "\r")
	}
	if xs != nil {
		defer xs.print(os.Stdout, e)
	}
	fmt.Printf("%-40s %-12s %5s %8s %14s %14s  %s\n", "model", "family", "bits", "threads", "pp"+fmt.Sprint(*promptN)+" tok/s", "tg"+fmt.Sprint(*genN)+" tok/s", "device")
	fmt.Printf("%-40s %-12s %5d %8d %14.1f %14.1f  %s\n", trim(e.Dir, 40), e.Model.Config.Family, e.Model.Manifest.Bits, e.Runner.Pool.Threads(), median(pre), median(dec), e.Device)
	if mtp != nil && mtp.Disabled != "" {
		fmt.Printf("drafts off: %s\n", mtp.Disabled)
	} else if mtp != nil {
		fmt.Printf("drafts: %d per step, %.2f tokens per step, acceptance by depth %s (last trial)\n", mtp.Drafts, mtp.TokensPerStep, percents(mtp.Acceptance))
	}
	if len(cpuUser) > 0 {
		fmt.Printf("decode CPU %.1f ms user + %.1f ms system per token, %.2f cores busy with %d threads",
			median(cpuUser), median(cpuSys), median(busy), e.Runner.Pool.Threads())
		if len(self) > 0 {
			fmt.Printf("; the dispatching thread ran %.0f%% of the workers' parts itself", 100*median(self))
		}
		if len(steal) > 0 && median(steal) >= 0.001 {
			fmt.Printf("; the host took %.1f%% of the machine's processor time (steal)", 100*median(steal))
		}
		fmt.Println()
	}
	if ops != nil {
		ops.print(os.Stdout)
	}
	if lim != nil {
		fmt.Printf("memory read bandwidth %.1f GB/s (%d threads, median around the trials; 1 thread %.1f); a token reads %.1f MB of weights (%.1f MB per layer) and moves %.1f MB of state: decode limit %.1f tok/s (%.1f over the weights alone); each trial reached %s of the limit its own bandwidth set (median %.0f%%, %.0f%% over the weights alone)\n",
			lim.BandwidthGBs, e.Runner.Pool.Threads(), lim.Bandwidth1GBs, lim.TokenMB, lim.LayerMB, lim.StateMB, lim.LimitTokS, lim.WeightsLimitTokS, percents(lim.ShareAll), 100*lim.Share, 100*lim.WeightsShare)
	}
	return nil
}

// decodeLimit is the physical bound of a decode step: every weight it
// uses is read from memory once, and the sequence's state it touches read
// or written once, so tokens/s cannot exceed the memory's bandwidth over
// the bytes a token moves.
type decodeLimit struct {
	BandwidthGBs  float64 `json:"bandwidth_gb_s"`   // with the engine's threads
	Bandwidth1GBs float64 `json:"bandwidth_1_gb_s"` // with one thread
	TokenMB       float64 `json:"token_mb"`         // weights read per token: dense (less the embedding) and top-k experts per layer
	LayerMB       float64 `json:"layer_mb"`         // of which per layer
	LayerMBQ4_0   float64 `json:"layer_mb_q4_0"`    // a layer in GGUF's Q4_0 (18 bytes per 32 quantised weights), for comparisons with llama.cpp
	// State moved per token, on average over the trial's decode steps
	// (model.StepStateBytes): the KV rows attended to, the new rows, and
	// DeltaNet's recurrent state, read and written back.
	StateMB float64 `json:"state_mb"`
	// The limit over the weights and the state; WeightsLimitTokS over the
	// weights alone.
	LimitTokS        float64 `json:"limit_tok_s"`
	WeightsLimitTokS float64 `json:"weights_limit_tok_s"`
	// With bench's trials: the bandwidth measured before the first trial
	// and after each, and each trial's decode over the limit set by the
	// mean of the measurements on either side of it (their median Share).
	BandwidthAll []float64 `json:"bandwidth_all_gb_s,omitempty"`
	ShareAll     []float64 `json:"decode_share_all,omitempty"`
	Share        float64   `json:"decode_share,omitempty"`
	// Share against the limit the weights alone set.
	WeightsShare float64 `json:"decode_share_weights,omitempty"`
}

// memMeter measures the memory's read bandwidth with the engine's threads
// over a buffer of 1 GiB, far beyond the last-level cache.
type memMeter struct {
	e          *engine.Engine
	buf        []byte
	mapped     bool        // buf is platform.Alloc's, for close to free
	bytes      decodeLimit // the bytes a token moves (decodeBytes), the bandwidths unset
	tokenBytes float64     // weights and state
}

// newMemMeter reads memory like the weights': the engine keeps them in
// transparent huge pages where the system gives them (platform.Alloc), and
// plain reads of 4 KiB pages ran slower, so a buffer of those set the limit
// too low: on the 2-core Zen 4, six alternating pairs read 1 GiB at a
// median 1.04x (one thread) and 1.03x (two) from huge pages.
func newMemMeter(e *engine.Engine, steps decodeSteps) *memMeter {
	m := &memMeter{e: e, bytes: *decodeBytes(e, steps)}
	var err error
	if m.buf, err = platform.Alloc(1 << 30); err == nil {
		m.mapped = true
	} else {
		m.buf = make([]byte, 1<<30)
	}
	for i := range m.buf {
		m.buf[i] = byte(i) // touch every page before timing
	}
	m.tokenBytes = (m.bytes.TokenMB + m.bytes.StateMB) * 1e6
	return m
}

// close releases the buffer.
func (m *memMeter) close() {
	if m.mapped {
		platform.Free(m.buf)
	}
	m.buf, m.mapped = nil, false
}

// measure returns the bandwidth in GB/s.
func (m *memMeter) measure() float64 {
	return kernels.ReadBandwidth(m.buf, m.e.Runner.Pool.Threads(), 3) / 1e9
}

// limit is the decode limit at bw GB/s, with a one-thread measurement.
func (m *memMeter) limit(bw float64) *decodeLimit {
	d := m.bytes
	d.BandwidthGBs, d.Bandwidth1GBs = bw, kernels.ReadBandwidth(m.buf, 1, 3)/1e9
	d.LimitTokS = d.BandwidthGBs * 1e9 / ((d.TokenMB + d.StateMB) * 1e6)
	d.WeightsLimitTokS = d.BandwidthGBs * 1e9 / (d.TokenMB * 1e6)
	return &d
}

// percents formats shares as percentages.
func percents(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f%%", 100*x)
	}
	return strings.Join(s, ", ")
}

// measureDecodeLimit reads 1 GiB (far beyond the last-level cache) with the
// engine's thread count and with one thread.
func measureDecodeLimit(e *engine.Engine, steps decodeSteps) *decodeLimit {
	m := newMemMeter(e, steps)
	defer m.close()
	return m.limit(m.measure())
}

// decodeSteps are the positions a trial's timed decode steps run at: the
// first generated token comes from the context's prefill, each later one
// from a step at positions depth, depth+1, ... (depth at least 1).
type decodeSteps struct{ depth, gen int }

// stateBytes is the mean over the steps of model.StepStateBytes.
func (s decodeSteps) stateBytes(m *model.Model) float64 {
	n := max(s.gen-1, 1)
	var sum float64
	for i := range n {
		sum += float64(m.StepStateBytes(max(s.depth, 1) + i))
	}
	return sum / float64(n)
}

// decodeBytes is the weights a decode step reads, in total and per layer,
// and the state it moves on average over steps.
func decodeBytes(e *engine.Engine, steps decodeSteps) *decodeLimit {
	d := &decodeLimit{}
	m := e.Model.Manifest
	size := func(t *format.Tensor) int64 {
		_, sb := t.Kind.Sizes(t.Rows(), t.Cols())
		if t.Kind.Quantised() {
			return t.Size + 2*sb
		}
		return t.Size
	}
	q40 := func(t *format.Tensor) int64 {
		if t.Kind.Quantised() {
			return int64(t.Rows()) * int64(t.Cols()) / 32 * 18
		}
		return t.Size
	}
	var dense, layers, layers40 int64
	for i := range m.Dense {
		t := &m.Dense[i]
		if t.Name == "embed_tokens.weight" || strings.HasPrefix(t.Name, "mtp.") {
			continue // one row per token; the MTP head only when drafting
		}
		dense += size(t)
		if strings.HasPrefix(t.Name, "layers.") {
			layers += size(t)
			layers40 += q40(t)
		}
	}
	var expert, expert40 int64
	if len(m.Stores) > 0 {
		st := &m.Stores[0]
		expert = size(&st.Gate) + size(&st.Up) + size(&st.Down)
		expert40 = q40(&st.Gate) + q40(&st.Up) + q40(&st.Down)
	}
	c := &m.Config
	tok := dense + int64(c.Layers*c.TopK)*expert
	L := int64(max(c.Layers, 1))
	d.TokenMB = float64(tok) / 1e6
	d.LayerMB = float64(layers/L+int64(c.TopK)*expert) / 1e6
	d.LayerMBQ4_0 = float64(layers40/L+int64(c.TopK)*expert40) / 1e6
	d.StateMB = steps.stateBytes(e.Model) / 1e6
	return d
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n+1:]
}
