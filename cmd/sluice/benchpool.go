package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/sample"
)

// benchTrial is one timed generation and what the pool did during its
// decode.
type benchTrial struct {
	pre    engine.Stats // the timed prefill
	stats  engine.Stats // the decode (after its own context when depth differs)
	decode experts.Snapshot
	// dispatches is the operations the decode split across threads.
	dispatches uint64
	// launches is the GPU kernels the decode launched (0 on the CPU).
	launches uint64
	// selfRuns is the workers' parts of those operations that the
	// dispatching thread ran itself (kernels.Pool.SelfRuns).
	selfRuns uint64
	// cpuUser and cpuSys are the process's CPU time during the decode,
	// over wall (cpuOK false where the platform gives none).
	cpuUser, cpuSys, wall time.Duration
	cpuOK                 bool
	// steal and machine are the machine's processor time during the
	// decode that its host took, and all of it (platform.MachineCPU;
	// machine 0 where the platform gives none).
	steal, machine uint64
	// trace is the records the decode's steps asked for.
	trace experts.Trace
	// ops is the decode's time by operation (--ops; nil without it).
	ops *block.OpTimes
}

// runTrial times a prefill of prompt from an empty context, then a decode
// of gen tokens greedily after a context of ctxToks (when ctxToks is prompt
// itself, the decode continues the timed prefill). The pool's counters are
// snapshotted around the decode so that per-layer figures are decode-only.
//
// With ops set, the decode's steps are timed by operation into bt.ops
// (the CPU's runner only).
func runTrial(ctx context.Context, e *engine.Engine, st *model.State, prompt, ctxToks []int, gen, drafts int, ops bool) (benchTrial, error) {
	var bt benchTrial
	same := len(ctxToks) == len(prompt) && &ctxToks[0] == &prompt[0]
	opts := engine.GenOptions{MaxTokens: gen, IgnoreEOS: true, Sample: sample.Params{}, Drafts: drafts}
	if !same {
		st.Reset()
		q, err := e.NewSequence(st, engine.GenOptions{})
		if err != nil {
			return bt, err
		}
		if err := q.Prefill(ctx, prompt); err != nil {
			return bt, err
		}
		bt.pre = q.Stats()
	}
	st.Reset()
	q, err := e.NewSequence(st, opts)
	if err != nil {
		return bt, err
	}
	if err := q.Prefill(ctx, ctxToks); err != nil {
		return bt, err
	}
	var before experts.Snapshot
	if e.Stream != nil {
		before = e.Stream.Stats()
		e.Stream.RecordTrace(true)
	}
	d0, r0, l0 := e.Runner.Pool.Dispatches(), e.Runner.Pool.SelfRuns(), e.Launches()
	u0, s0, ok0 := platform.CPUTime()
	st0, m0, mok0 := platform.MachineCPU()
	t0 := time.Now()
	if p, ok := e.Fwd.(engine.Profiler); ok {
		p.ResetProfile() // the phase profile covers the decode only
	}
	if ops {
		bt.ops = new(block.OpTimes)
		e.Runner.Ops = bt.ops
		defer func() { e.Runner.Ops = nil }()
	}
	for !q.Done() {
		if _, _, err := q.Step(ctx); err != nil {
			return bt, err
		}
	}
	bt.wall = time.Since(t0)
	if u1, s1, ok1 := platform.CPUTime(); ok0 && ok1 {
		bt.cpuUser, bt.cpuSys, bt.cpuOK = u1-u0, s1-s0, true
	}
	if st1, m1, mok1 := platform.MachineCPU(); mok0 && mok1 && m1 > m0 {
		bt.steal, bt.machine = st1-st0, m1-m0
	}
	bt.dispatches = e.Runner.Pool.Dispatches() - d0
	bt.selfRuns = e.Runner.Pool.SelfRuns() - r0
	bt.launches = e.Launches() - l0
	if e.Stream != nil {
		bt.decode = e.Stream.Stats().Sub(before)
		bt.trace = e.Stream.Trace()
		e.Stream.RecordTrace(false)
	}
	bt.stats = q.Stats()
	if same {
		bt.pre = bt.stats
	}
	return bt, nil
}

// poolBench is the medians over trials of the pool's decode figures.
type poolBench struct {
	Slots     int     `json:"pool_slots"`
	PoolMB    float64 `json:"pool_mb"`
	PoolShare float64 `json:"pool_share"`
	HitRate   float64 `json:"hit_rate"`
	// LandedRate is the share of the decode's requests whose record had
	// landed (HitRate less the hits on reads still in flight): what the
	// replays below count as hits.
	LandedRate   float64 `json:"landed_rate"`
	MBPerToken   float64 `json:"mb_per_token"`
	PrefillMBTok float64 `json:"prefill_mb_per_token"`
	IOWaitMSTok  float64 `json:"io_wait_ms_per_token"`
	CutsPerToken float64 `json:"cuts_per_token,omitempty"` // --cut-weak's late misses dropped
	MSPerToken   float64 `json:"decode_ms_per_token"`
	ReadMBs      float64 `json:"read_mb_s"`       // achieved: bytes / wall time with reads in flight
	DiskMBs      float64 `json:"disk_mb_s"`       // --disk: O_DIRECT limit at the same record size and depth
	ReadBusy     float64 `json:"read_busy_share"` // share of the decode's wall time with reads in flight
	// The disk's throughput under load (experts.Stats.DeepNs), and the
	// share of it the decode's reads took over its wall time: what the
	// prefetch readers' count follows.
	LoadMBs  float64 `json:"disk_under_load_mb_s"`
	LoadUtil float64 `json:"disk_under_load_share"`
	// The readers taking prefetches at the end of each trial, and how
	// often the count changed in all (--prefetch-readers 0 follows the disk).
	PrefetchReaders  []int   `json:"prefetch_readers"`
	PrefetchSwitches int64   `json:"prefetch_switches"`
	LookRecall       float64 `json:"lookahead_recall"`
	LookWaste        float64 `json:"lookahead_waste_per_useful"`
	LookSkipped      float64 `json:"lookahead_skipped"` // share of predicted records not prefetched (their rank paused)
	// The same split off for the predictions made two or more layers
	// ahead (--lookahead-depth): their share of the useful prefetches,
	// their waste per useful one, and their share not prefetched.
	AheadUseful  float64 `json:"lookahead_ahead_useful_share"`
	AheadWaste   float64 `json:"lookahead_ahead_waste_per_useful"`
	AheadSkipped float64 `json:"lookahead_ahead_skipped"`
	LookPaused   float64 `json:"lookahead_paused"`  // share of steps without predictions (timed slower than without)
	LookGainMS   float64 `json:"lookahead_gain_ms"` // the step time predicting saved (negative: added), as the stream's trial last timed it
	LookSteps    int64   `json:"lookahead_steps"`   // decode steps the lookahead's trial saw, all trials (0: the lookahead was off)
	// The decode's requests replayed offline from an empty pool of the same
	// size: under the optimal eviction (Belady's; no policy hits more),
	// under the pool's own policy without lookahead, and under each policy.
	OptimalHitRate float64            `json:"optimal_hit_rate"`
	PolicyHitRate  float64            `json:"policy_hit_rate"`
	PolicyHitRates map[string]float64 `json:"policy_hit_rates"`
	Layers         []layerBench       `json:"layers"`
}

type layerBench struct {
	HitRate     float64 `json:"hit_rate"`
	MBPerToken  float64 `json:"mb_per_token"`
	IOWaitMSTok float64 `json:"io_wait_ms_per_token"`
}

func summarisePool(e *engine.Engine, trials []benchTrial) *poolBench {
	s := e.Stream
	man := e.Model.Manifest
	pb := &poolBench{Slots: s.Slots(), PoolMB: float64(int64(s.Slots())*s.Stride()) / 1e6,
		PoolShare: float64(s.Slots()) / float64(man.ExpertLayers*man.Experts)}
	var hit, landed, mbt, pmbt, iow, mst, rbw, busy, load, util, rec, waste, skip, paused, opt, cut []float64
	var aUse, aWaste, aSkip []float64
	sim := map[experts.Policy][]float64{}
	nl := 0
	for _, t := range trials {
		nl = len(t.decode.Layers)
		d := t.decode
		n := float64(max(t.stats.GeneratedTokens-1, 1))
		hit, landed = append(hit, d.HitRate()), append(landed, d.LandedRate())
		if h, n := experts.BeladyHits(t.trace, s.Slots()); n > 0 {
			opt = append(opt, float64(h)/float64(n))
			for _, p := range experts.Policies {
				if h, _, err := experts.SimulateHits(t.trace, s.Slots(), p, man.ExpertLayers, man.Experts); err == nil {
					sim[p] = append(sim[p], float64(h)/float64(n))
				}
			}
		}
		mbt = append(mbt, float64(d.BytesRead)/1e6/n)
		pmbt = append(pmbt, float64(t.pre.Experts.PrefillBytesRead)/1e6/float64(max(t.pre.PromptTokens, 1)))
		iow = append(iow, d.IOWaitMS/n)
		cut = append(cut, float64(d.Cuts)/n)
		mst = append(mst, t.stats.DecodeMS/n)
		if d.ReadBusyMS > 0 {
			rbw = append(rbw, float64(d.BytesRead)/1e6/(d.ReadBusyMS/1e3))
		}
		if t.stats.DecodeMS > 0 {
			busy = append(busy, d.ReadBusyMS/t.stats.DecodeMS)
		}
		if d.DeepMS > 0 && t.stats.DecodeMS > 0 {
			l := float64(d.DeepBytes) / 1e6 / (d.DeepMS / 1e3)
			load = append(load, l)
			util = append(util, float64(d.BytesRead)/1e6/(t.stats.DecodeMS/1e3)/l)
		}
		pb.PrefetchReaders = append(pb.PrefetchReaders, d.PrefetchReaders)
		pb.PrefetchSwitches += d.PrefetchSwitches
		if u := d.LookUseful; u+d.Misses > 0 {
			rec = append(rec, float64(u)/float64(u+d.Misses))
			waste = append(waste, float64(d.LookWasted)/float64(max(u, 1)))
		}
		if d.LookIssued+d.LookSkip > 0 {
			skip = append(skip, float64(d.LookSkip)/float64(d.LookIssued+d.LookSkip))
		}
		if d.LookUseful > 0 {
			aUse = append(aUse, float64(d.AheadUseful)/float64(d.LookUseful))
		}
		if d.AheadIssued+d.AheadSkip > 0 {
			aWaste = append(aWaste, float64(d.AheadWasted)/float64(max(d.AheadUseful, 1)))
			aSkip = append(aSkip, float64(d.AheadSkip)/float64(d.AheadIssued+d.AheadSkip))
		}
		if d.LookSteps > 0 {
			paused = append(paused, float64(d.LookPaused)/float64(d.LookSteps))
		}
		pb.LookSteps += d.LookSteps
		pb.LookGainMS = d.LookGainMS
	}
	pb.LandedRate = median(landed)
	pb.HitRate, pb.MBPerToken, pb.PrefillMBTok, pb.IOWaitMSTok, pb.MSPerToken = median(hit), median(mbt), median(pmbt), median(iow), median(mst)
	pb.ReadMBs, pb.ReadBusy, pb.LoadMBs, pb.LoadUtil, pb.LookRecall, pb.LookWaste, pb.LookSkipped = median(rbw), median(busy), median(load), median(util), median(rec), median(waste), median(skip)
	pb.LookPaused = median(paused)
	pb.AheadUseful, pb.AheadWaste, pb.AheadSkipped = median(aUse), median(aWaste), median(aSkip)
	pb.OptimalHitRate, pb.PolicyHitRate, pb.CutsPerToken = median(opt), median(sim[s.Options().Policy]), median(cut)
	pb.PolicyHitRates = map[string]float64{}
	for p, r := range sim {
		pb.PolicyHitRates[string(p)] = median(r)
	}
	for l := 0; l < nl; l++ {
		var h, m, w []float64
		for _, t := range trials {
			ls := t.decode.Layers[l]
			n := float64(max(t.stats.GeneratedTokens-1, 1))
			if ls.Hits+ls.Misses > 0 {
				h = append(h, float64(ls.Hits)/float64(ls.Hits+ls.Misses))
			}
			m = append(m, float64(ls.BytesRead)/1e6/n)
			w = append(w, ls.IOWaitMS/n)
		}
		pb.Layers = append(pb.Layers, layerBench{median(h), median(m), median(w)})
	}
	return pb
}

func measureDisk(e *engine.Engine) (float64, error) {
	bw, err := experts.MeasureRead(e.Stream.StorePath(), e.Stream.Stride(), e.Stream.Options().Readers, 3*time.Second)
	return bw / 1e6, err
}

// fullResidencyMS is the decode ms/token of a bench whose pool held every
// expert, for the predicted decode time of smaller pools in the same run.
var fullResidencyMS float64

func (pb *poolBench) print(w io.Writer, e *engine.Engine) {
	fmt.Fprintf(w, "experts: %s\n", e.ExpertPlan)
	fmt.Fprintf(w, "pool %d slots (%.0f MB, %.1f%%): decode hit rate %.1f%%, %.2f MB/token, io wait %.2f ms/token, %.2f ms/token; prefill %.2f MB/prompt token\n",
		pb.Slots, pb.PoolMB, 100*pb.PoolShare, 100*pb.HitRate, pb.MBPerToken, pb.IOWaitMSTok, pb.MSPerToken, pb.PrefillMBTok)
	if pb.CutsPerToken > 0 {
		fmt.Fprintf(w, "--cut-weak dropped %.2f late experts per token\n", pb.CutsPerToken)
	}
	fmt.Fprintf(w, "decode requests whose record had landed %s; hits on reads still in flight %.1f%%\n",
		pb.ofOptimal(pb.LandedRate), 100*(pb.HitRate-pb.LandedRate))
	fmt.Fprintf(w, "offline replay of the decode's requests from an empty pool of %d slots: optimal eviction %.1f%% hits; %s (the pool's) %s",
		pb.Slots, 100*pb.OptimalHitRate, e.Stream.Options().Policy, pb.ofOptimal(pb.PolicyHitRate))
	for _, p := range experts.Policies {
		if r, ok := pb.PolicyHitRates[string(p)]; ok && p != e.Stream.Options().Policy {
			fmt.Fprintf(w, ", %s %s", p, pb.ofOptimal(r))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "reads in flight %.0f%% of the decode's time, at %.0f MB/s", 100*pb.ReadBusy, pb.ReadMBs)
	if pb.DiskMBs > 0 {
		fmt.Fprintf(w, " = %.0f%% of the disk's %.0f MB/s (%s, %s records, depth %d)", 100*pb.ReadMBs/pb.DiskMBs, pb.DiskMBs, platform.UncachedName, fmtMB(e.Stream.Stride()), e.Stream.Options().Readers)
	}
	if pb.LoadMBs > 0 {
		fmt.Fprintf(w, "; the decode read at %.0f%% of the %.0f MB/s the disk gave under load", 100*pb.LoadUtil, pb.LoadMBs)
	}
	fmt.Fprintf(w, "; readers taking prefetches at each trial's end %v (%d changes)\n", pb.PrefetchReaders, pb.PrefetchSwitches)
	if pb.PoolShare >= 1 {
		fullResidencyMS = pb.MSPerToken
	} else if fullResidencyMS > 0 && pb.DiskMBs > 0 {
		pred := fullResidencyMS + pb.MBPerToken/pb.DiskMBs*1e3
		fmt.Fprintf(w, "decode %.2f ms/token vs %.2f predicted (full-residency compute %.2f + %.2f MB / %.0f MB/s): %.2fx\n",
			pb.MSPerToken, pred, fullResidencyMS, pb.MBPerToken, pb.DiskMBs, pb.MSPerToken/pred)
	}
	if e.Stream.Lookahead() {
		fmt.Fprintf(w, "lookahead recall %.1f%%, waste %.2f per useful, %.1f%% of predictions not prefetched (their rank's predictions did not pay); %.1f%% of steps without predictions (timed: predicting saved %.2f ms a step)\n",
			100*pb.LookRecall, pb.LookWaste, 100*pb.LookSkipped, 100*pb.LookPaused, pb.LookGainMS)
		if e.Stream.LookDepth() > 1 {
			fmt.Fprintf(w, "of those, the predictions 2 or more layers ahead: %.1f%% of the useful prefetches, waste %.2f per useful, %.1f%% not prefetched\n",
				100*pb.AheadUseful, pb.AheadWaste, 100*pb.AheadSkipped)
		}
	}
	fmt.Fprintf(w, "%6s %9s %10s %12s\n", "layer", "hit rate", "MB/token", "io ms/token")
	for l, lb := range pb.Layers {
		fmt.Fprintf(w, "%6d %8.1f%% %10.3f %12.3f\n", l, 100*lb.HitRate, lb.MBPerToken, lb.IOWaitMSTok)
	}
}

// ofOptimal formats a replayed hit rate with its fraction of the optimal
// eviction's.
func (pb *poolBench) ofOptimal(r float64) string {
	if pb.OptimalHitRate <= 0 {
		return fmt.Sprintf("%.1f%%", 100*r)
	}
	return fmt.Sprintf("%.1f%% (%.2fx optimal)", 100*r, r/pb.OptimalHitRate)
}

func fmtMB(n int64) string { return fmt.Sprintf("%.2f MB", float64(n)/1e6) }
