package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/plot"
)

// poolSpec is one entry of --pools: a share of the expert store or a size.
type poolSpec struct {
	arg     string  // as given
	percent float64 // > 0 for a share
	mib     float64 // > 0 for a size
	slots   int     // resolved against the model
}

// poolMB is the --pool-mb value that opens an engine with this pool.
func (p poolSpec) poolMB() string {
	if p.percent > 0 {
		return strconv.FormatFloat(p.percent, 'g', -1, 64) + "%"
	}
	return strconv.FormatFloat(p.mib, 'g', -1, 64)
}

// label names the pool as the user gave it, with the unit.
func (p poolSpec) label() string {
	if p.percent > 0 {
		return strconv.FormatFloat(p.percent, 'g', -1, 64) + "%"
	}
	return p.arg
}

// parsePools reads --pools: comma-separated shares of the expert store in
// percent ("25" or "25%") or sizes in MiB ("300MiB", the unit of --pool-mb;
// "300MB" and "300M" are read as MiB too, and "2GiB" as 2048 MiB).
func parsePools(s string) ([]poolSpec, error) {
	var ps []poolSpec
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("--pools %q: an empty entry", s)
		}
		p := poolSpec{arg: f}
		num, scale, isSize := f, 1.0, false
		l := strings.ToLower(f)
		for _, u := range []struct {
			suffix string
			scale  float64
		}{{"gib", 1024}, {"gb", 1024}, {"g", 1024}, {"mib", 1}, {"mb", 1}, {"m", 1}} {
			if strings.HasSuffix(l, u.suffix) {
				num, scale, isSize = f[:len(f)-len(u.suffix)], u.scale, true
				break
			}
		}
		if !isSize {
			num = strings.TrimSuffix(f, "%")
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		switch {
		case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
			return nil, fmt.Errorf("--pools: %q is neither a percentage (25 or 25%%) nor a size (300MiB)", f)
		case isSize && v <= 0:
			return nil, fmt.Errorf("--pools: size %q must be positive", f)
		case isSize:
			p.mib = v * scale
		case v <= 0 || v > 100:
			return nil, fmt.Errorf("--pools: %q: a share of the expert store must be in (0,100] percent", f)
		default:
			p.percent = v
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// resolvePools sets each pool's slot count as the engine will size it and
// refuses pools below the engine's minimum (top-k experts, one step's
// worth), saying what the minimum is.
func resolvePools(ps []poolSpec, records, minSlots int, stride int64) error {
	minPct := math.Ceil(10000*float64(minSlots)/float64(records)) / 100
	for float64(int64(minPct/100*float64(records))) < float64(minSlots) {
		minPct = math.Round(100*minPct+1) / 100 // the engine truncates share × records
	}
	minMiB := float64(int64(minSlots)*stride) / (1 << 20)
	for i := range ps {
		p := &ps[i]
		if p.percent > 0 {
			p.slots = int(int64(p.percent / 100 * float64(records)))
		} else {
			p.slots = int(min(int64(p.mib*(1<<20))/stride, int64(records)))
		}
		if p.slots < minSlots {
			return fmt.Errorf("--pools: pool %s holds %d experts of %g MiB; the engine needs at least %d (the model's top-k, one step's experts): %g%% or %gMiB",
				p.label(), p.slots, float64(stride)/(1<<20), minSlots, minPct, minMiB)
		}
	}
	return nil
}

// sweepRow is one pool's results.
type sweepRow struct {
	Arg         string  `json:"pool"`
	Percent     float64 `json:"pool_percent"` // slots ÷ records
	PoolMB      float64 `json:"pool_mb"`
	Slots       int     `json:"pool_slots"`
	DecodeTokS  float64 `json:"decode_tok_s"`
	PrefillTokS float64 `json:"prefill_tok_s"`
	HitRate     float64 `json:"hit_rate"`
	MBPerToken  float64 `json:"mb_per_token"`
	// DiskMSTok is MBPerToken at the disk's bandwidth: the least time the
	// reads take per token.
	DiskMSTok float64 `json:"disk_ms_per_token"`
	// LimitTokS is 1000 / max(compute ms, DiskMSTok): reads fully
	// overlapped with compute. SerialTokS is 1000 / (compute ms +
	// DiskMSTok), reads not overlapped at all: bench's prediction.
	LimitTokS  float64    `json:"limit_tok_s"`
	SerialTokS float64    `json:"serial_tok_s"`
	Bound      string     `json:"bound"`  // "compute" or "disk": the larger term of the limit
	Rounds     int        `json:"rounds"` // rounds run (fewer than --rounds after an interrupt)
	Experts    *poolBench `json:"experts"`
	// NoLookahead is the same pool run with the lookahead off
	// (--compare-lookahead), its own round of median speed.
	NoLookahead *sweepRow `json:"without_lookahead,omitempty"`
}

// sweepResult is what sweep prints with --json.
type sweepResult struct {
	Model         string  `json:"model"`
	Family        string  `json:"family"`
	Bits          int     `json:"bits"`
	Threads       int     `json:"threads"`
	Device        string  `json:"device"`
	PromptTokens  int     `json:"prompt_tokens"`
	GenTokens     int     `json:"gen_tokens"`
	Depth         int     `json:"depth"`
	Repeat        int     `json:"repeat"`
	Rounds        int     `json:"rounds"`
	Records       int     `json:"records"`
	RecordMB      float64 `json:"record_mb"`
	ExpertMB      float64 `json:"expert_mb"`
	DiskMBs       float64 `json:"disk_mb_s"`
	DiskSource    string  `json:"disk_source"` // "measured" or "--disk-mbs"
	ComputeMSTok  float64 `json:"compute_ms_per_token"`
	ComputeSource string  `json:"compute_source"` // "full-residency decode" or "memory bandwidth"
	Interrupted   bool    `json:"interrupted,omitempty"`
	// CompareLookahead: every pool also ran with the lookahead off
	// (each row's without_lookahead).
	CompareLookahead bool   `json:"compare_lookahead,omitempty"`
	SVG              string `json:"svg,omitempty"`
	// Pools are in the order they ran: largest first.
	Pools []sweepRow `json:"pools"`
}

// checkWritable reports whether a file can be created at path, by
// creating and removing a temporary one in its directory, so that an
// existing file at path is left as it is.
func checkWritable(path string) error {
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	} else if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".sluice-check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

func cmdSweep(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	pools := fs.String("pools", "5,10,25,50,100", "pool sizes: percent of the expert store (25 or 25%) or MiB (300MiB), comma-separated")
	promptN := fs.Int("prompt", 512, "prompt tokens of the timed prefill")
	genN := fs.Int("gen", 128, "generated tokens")
	repeat := fs.Int("repeat", 3, "trials per pool (after one warm-up)")
	depth := fs.Int("depth", 0, "context tokens before the timed decode (0: decode from an empty context, as bench)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	svgPath := fs.String("svg", "sweep.svg", "write the plot to this file (\"\": no plot)")
	rounds := fs.Int("rounds", 1, "sweep the pools this many times in turn and keep each pool's round of median decode speed (for a noisy machine)")
	diskMBs := fs.Float64("disk-mbs", 0, "the disk's read bandwidth in MB/s for the limit (0: measure it, O_DIRECT at the record size and reader depth, before and after the sweep)")
	both := fs.Bool("compare-lookahead", false, "also run every pool with the lookahead off, alternating with it on, and report both")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *both && !mf.experts.lookahead {
		return fmt.Errorf("--compare-lookahead runs every pool with the lookahead on and off; drop --lookahead=false")
	}
	if err := checkMins([]intMin{{"--prompt", *promptN, 1}, {"--gen", *genN, 2}, {"--repeat", *repeat, 1},
		{"--depth", *depth, 0}, {"--rounds", *rounds, 1}}); err != nil {
		return err
	}
	if *diskMBs < 0 || math.IsNaN(*diskMBs) || math.IsInf(*diskMBs, 0) {
		return fmt.Errorf("--disk-mbs %g: want a positive bandwidth, or 0 to measure it", *diskMBs)
	}
	if mf.experts.poolMB != "" || mf.experts.memoryGB != 0 {
		return fmt.Errorf("sweep sizes the pool itself: give the sizes with --pools, not --pool-mb, --host-cache-mb or --memory-gb")
	}
	specs, err := parsePools(*pools)
	if err != nil {
		return err
	}
	if *svgPath != "" {
		// The plot is written after the sweep, which takes hours on a real
		// model: find out now whether it can be.
		if err := checkWritable(*svgPath); err != nil {
			return fmt.Errorf("--svg %s: %v", *svgPath, err)
		}
	}
	if err := mf.check(); err != nil {
		return err
	}
	if mf.ctx == 0 {
		mf.ctx = max(*promptN, *depth+1) + *genN
	}
	open := func(p poolSpec, look bool) (*engine.Engine, error) {
		m := mf
		m.experts.poolMB = p.poolMB()
		m.experts.lookahead = look
		e, err := m.open(ctx)
		if err != nil {
			return nil, err
		}
		if e.Stream == nil {
			e.Close()
			return nil, fmt.Errorf("the engine on %s does not stream experts through a pool; sweep has nothing to vary", e.Device)
		}
		return e, nil
	}

	// A first engine, with the smallest pool the engine allows (it raises
	// any smaller share to that), gives the model's record count and size
	// to check and order the pools, and measures the disk and (without a
	// full pool) the memory.
	e0, err := open(poolSpec{percent: 1e-9}, mf.experts.lookahead)
	if err != nil {
		return err
	}
	man := e0.Model.Manifest
	records, stride := man.ExpertLayers*man.Experts, e0.Stream.Stride()
	if err := resolvePools(specs, records, experts.MinSlots(&man.Config), stride); err != nil {
		e0.Close()
		return err
	}
	if need := max(*promptN, *depth+1) + *genN; need > e0.Ctx {
		e0.Close()
		return fmt.Errorf("--prompt or --depth, plus --gen, needs a context of %d; the model is open with %d", need, e0.Ctx)
	}
	// Largest first: the full pool's decode time is the compute term of
	// the smaller pools' limit.
	slices.SortStableFunc(specs, func(a, b poolSpec) int { return b.slots - a.slots })
	specs = slices.CompactFunc(specs, func(a, b poolSpec) bool {
		if a.slots == b.slots {
			fmt.Fprintf(os.Stderr, "note: pools %s and %s are both %d experts; sweeping it once\n", a.label(), b.label(), a.slots)
			return true
		}
		return false
	})
	res := &sweepResult{Model: e0.Dir, Family: e0.Model.Config.Family, Bits: man.Bits, Threads: e0.Runner.Pool.Threads(), Device: e0.Device,
		PromptTokens: *promptN, GenTokens: *genN, Depth: max(*depth, 1), Repeat: *repeat, Rounds: *rounds, Records: records,
		RecordMB: float64(stride) / 1e6, ExpertMB: float64(int64(records)*stride) / 1e6, DiskMBs: *diskMBs, DiskSource: "--disk-mbs"}
	var diskBefore float64
	if *diskMBs == 0 {
		res.DiskSource = "measured"
		if diskBefore, err = measureDisk(e0); err != nil {
			e0.Close()
			return fmt.Errorf("measuring the disk: %v (give --disk-mbs)", err)
		}
	}
	if mf.device == "auto" && e0.Device == "cpu" {
		mf.device = "cpu" // say once, not per pool, why auto chose the CPU
	}
	if specs[0].slots < records {
		lim := measureDecodeLimit(e0, decodeSteps{depth: max(*depth, 1), gen: *genN})
		res.ComputeMSTok, res.ComputeSource = 1e3/lim.LimitTokS, "memory bandwidth"
	}
	e0.Close()

	// Each round runs every pool once; with several, the pools alternate,
	// so that a burst of load elsewhere on the machine spreads over all of
	// them instead of slowing the ones it happened to meet. With
	// --compare-lookahead each pool runs twice in a row, with the lookahead
	// on and off, the first of the pair alternating from pool to pool and
	// round to round, so that neither setting always runs first.
	looks := []bool{mf.experts.lookahead}
	if *both {
		looks = []bool{true, false}
		res.CompareLookahead = true
	}
	var runErr error
	var lastDisk float64
	byPool := make([][][]sweepRow, len(looks)) // [setting][pool][round]
	for v := range byPool {
		byPool[v] = make([][]sweepRow, len(specs))
	}
	n, total := 0, len(specs)**rounds*len(looks)
rounds:
	for r := range *rounds {
		for i, p := range specs {
			for k := range looks {
				v := (k + r + i) % len(looks)
				if err := ctx.Err(); err != nil {
					runErr = err
					break rounds
				}
				n++
				row, after, err := sweepPool(ctx, open, p, looks[v], *promptN, *depth, *genN, *repeat, *diskMBs == 0 && n == total)
				if err != nil {
					runErr = err
					break rounds
				}
				if after > 0 {
					lastDisk = after
				}
				byPool[v][i] = append(byPool[v][i], row)
				round, look := "", ""
				if *rounds > 1 {
					round = fmt.Sprintf(" round %d/%d,", r+1, *rounds)
				}
				if *both {
					look = " lookahead off,"
					if looks[v] {
						look = " lookahead on, "
					}
				}
				fmt.Fprintf(os.Stderr, "pool %6.2f%% (%d experts, %.1f MB):%s%s decode %.2f tok/s, hit rate %.1f%%, %.3f MB/token [%d/%d]\n",
					row.Percent, row.Slots, row.PoolMB, round, look, row.DecodeTokS, 100*row.HitRate, row.MBPerToken, n, total)
			}
		}
	}
	for i, rows := range byPool[0] {
		if len(rows) == 0 {
			continue
		}
		row := medianRound(rows)
		if row.Slots >= records {
			res.ComputeMSTok, res.ComputeSource = row.Experts.MSPerToken, "full-residency decode"
		}
		if *both && len(byPool[1][i]) > 0 {
			off := medianRound(byPool[1][i])
			row.NoLookahead = &off
		}
		res.Pools = append(res.Pools, row)
	}
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		return runErr
	}
	if len(res.Pools) == 0 {
		return runErr
	}
	res.Interrupted = runErr != nil
	if *diskMBs == 0 {
		// The disk's speed swings between runs: average a measurement
		// before the sweep with one after (none after an interrupt).
		res.DiskMBs = diskBefore
		if lastDisk > 0 {
			res.DiskMBs = (diskBefore + lastDisk) / 2
		}
	}
	res.limits()
	if *svgPath != "" {
		if err := writeSweepSVG(*svgPath, res); err != nil {
			return err
		}
		res.SVG = *svgPath
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			return err
		}
	} else {
		res.print(os.Stdout)
	}
	if res.SVG != "" {
		fmt.Fprintf(os.Stderr, "wrote %s\n", res.SVG)
	}
	if res.Interrupted {
		done := 0
		for _, setting := range byPool {
			for _, rows := range setting {
				done += len(rows)
			}
		}
		fmt.Fprintf(os.Stderr, "interrupted after %d of %d pool runs; the results are of those\n", done, total)
		if *both {
			// A pool whose lookahead-on run did not finish is left out of
			// the table; its off run's progress line above has its figures.
			fmt.Fprintln(os.Stderr, "(with --compare-lookahead, a pool is reported once its lookahead-on run has finished)")
		}
	}
	return runErr
}

// medianRound is the round of rows (one pool's) with the median decode
// speed, the lower of the middle two for an even count: it stands for the
// pool whole, so that its figures stay one measurement's.
func medianRound(rows []sweepRow) sweepRow {
	slices.SortStableFunc(rows, func(a, b sweepRow) int { return cmp.Compare(a.DecodeTokS, b.DecodeTokS) })
	row := rows[(len(rows)-1)/2]
	row.Rounds = len(rows)
	return row
}

// sweepPool benches one pool in its own engine, as bench --pool-mb does,
// with the lookahead on or off (look), and measures the disk after the
// trials when disk is set.
func sweepPool(ctx context.Context, open func(poolSpec, bool) (*engine.Engine, error), p poolSpec, look bool, promptN, depth, genN, repeat int, disk bool) (sweepRow, float64, error) {
	e, err := open(p, look)
	if err != nil {
		return sweepRow{}, 0, fmt.Errorf("pool %s: %w", p.label(), err)
	}
	defer e.Close()
	// The same random prompt as bench's, so that the two agree.
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int, promptN)
	for i := range prompt {
		prompt[i] = rng.IntN(e.Model.Config.Vocab - 8)
	}
	ctxToks := prompt[:max(min(depth, promptN), 1)]
	if depth > promptN {
		ctxToks = make([]int, depth)
		for i := range ctxToks {
			ctxToks[i] = rng.IntN(e.Model.Config.Vocab - 8)
		}
	}
	st, err := e.NewState()
	if err != nil {
		return sweepRow{}, 0, err
	}
	var trials []benchTrial
	var pre, dec []float64
	tty := isTerminal(os.Stderr)
	for t := 0; t <= repeat; t++ {
		if tty {
			fmt.Fprintf(os.Stderr, "\rpool %s: trial %d/%d ", p.label(), t, repeat)
		}
		bt, err := runTrial(ctx, e, st, prompt, ctxToks, genN, 0, false)
		if tty {
			fmt.Fprint(os.Stderr, "\r\033[K")
		}
		if err != nil {
			return sweepRow{}, 0, err
		}
		if t == 0 {
			continue // warm-up: page in weights, grow scratch, fill the pool
		}
		trials = append(trials, bt)
		pre = append(pre, bt.pre.PrefillTokS)
		dec = append(dec, bt.stats.DecodeTokS)
	}
	pb := summarisePool(e, trials)
	row := sweepRow{Arg: p.label(), Percent: 100 * pb.PoolShare, PoolMB: pb.PoolMB, Slots: pb.Slots,
		DecodeTokS: median(dec), PrefillTokS: median(pre), HitRate: pb.HitRate, MBPerToken: pb.MBPerToken, Experts: pb}
	var after float64
	if disk {
		if after, err = measureDisk(e); err != nil {
			return sweepRow{}, 0, err
		}
	}
	return row, after, nil
}

// limits fills each row's physical limit from the compute time and the
// disk's bandwidth.
func (r *sweepResult) limits() {
	for i := range r.Pools {
		r.limit(&r.Pools[i])
		if off := r.Pools[i].NoLookahead; off != nil {
			r.limit(off)
		}
	}
}

// limit fills one row's limit from its MB read per token.
func (r *sweepResult) limit(row *sweepRow) {
	row.Experts.DiskMBs = r.DiskMBs
	row.DiskMSTok = row.MBPerToken / r.DiskMBs * 1e3
	c := r.ComputeMSTok
	row.LimitTokS, row.Bound = 1e3/c, "compute"
	if row.DiskMSTok > c {
		row.LimitTokS, row.Bound = 1e3/row.DiskMSTok, "disk"
	}
	row.SerialTokS = 1e3 / (c + row.DiskMSTok)
}

func (r *sweepResult) print(w io.Writer) {
	fmt.Fprintf(w, "%s: %s, %d-bit, %d experts of %.2f MB (%.0f MB), %d threads, %s; prompt %d, gen %d, %s\n",
		r.Model, r.Family, r.Bits, r.Records, r.RecordMB, r.ExpertMB, r.Threads, r.Device, r.PromptTokens, r.GenTokens, r.trials())
	fmt.Fprintf(w, "%8s %9s %8s %12s %11s %9s %8s %9s %9s", "pool %", "pool MB", "experts", "decode tok/s", "limit tok/s", "of limit", "bound", "hit rate", "MB/token")
	if r.CompareLookahead {
		// The lookahead-off run's figures beside, and the speed ratio.
		fmt.Fprintf(w, " | %12s %9s %9s %9s", "off: tok/s", "hit rate", "MB/token", "on ÷ off")
	}
	fmt.Fprintln(w)
	for _, p := range r.Pools {
		fmt.Fprintf(w, "%8.2f %9.1f %8d %12.2f %11.2f %8.0f%% %8s %8.1f%% %9.3f",
			p.Percent, p.PoolMB, p.Slots, p.DecodeTokS, p.LimitTokS, 100*p.DecodeTokS/p.LimitTokS, p.Bound, 100*p.HitRate, p.MBPerToken)
		if o := p.NoLookahead; o != nil {
			fmt.Fprintf(w, " | %12.2f %8.1f%% %9.3f %8.2fx", o.DecodeTokS, 100*o.HitRate, o.MBPerToken, p.DecodeTokS/o.DecodeTokS)
		}
		fmt.Fprintln(w)
	}
	if r.CompareLookahead {
		fmt.Fprintln(w, "left: the lookahead on (the default); right: --lookahead=false, the same pools in the same rounds")
	}
	fmt.Fprintf(w, "limit tok/s = 1000 / max(C, MB/token ÷ D × 1000): C = %.3f ms/token of compute (%s), D = %.0f MB/s of disk reads (%s)\n",
		r.ComputeMSTok, r.ComputeSource, r.DiskMBs, r.DiskSource)
}

// trials says what each pool's figures are medians of.
func (r *sweepResult) trials() string {
	if r.Rounds > 1 {
		return fmt.Sprintf("median of %d trials, round of median speed of %d", r.Repeat, r.Rounds)
	}
	return fmt.Sprintf("median of %d trials", r.Repeat)
}

// writeSweepSVG plots decode speed and its limit, hit rate and MB read per
// token against the pool's share of the expert store.
func writeSweepSVG(path string, r *sweepResult) error {
	var dec, lim, ser, hit, mbt, decOff, hitOff, mbtOff []plot.Point
	var xs []float64
	lo, hi := math.Inf(1), 0.0
	for _, p := range r.Pools {
		x := p.Percent
		xs = append(xs, x)
		lo, hi = math.Min(lo, x), math.Max(hi, x)
		dec = append(dec, plot.Point{X: x, Y: p.DecodeTokS})
		lim = append(lim, plot.Point{X: x, Y: p.LimitTokS})
		ser = append(ser, plot.Point{X: x, Y: p.SerialTokS})
		hit = append(hit, plot.Point{X: x, Y: 100 * p.HitRate})
		mbt = append(mbt, plot.Point{X: x, Y: p.MBPerToken})
		if o := p.NoLookahead; o != nil {
			decOff = append(decOff, plot.Point{X: x, Y: o.DecodeTokS})
			hitOff = append(hitOff, plot.Point{X: x, Y: 100 * o.HitRate})
			mbtOff = append(mbtOff, plot.Point{X: x, Y: o.MBPerToken})
		}
	}
	// Ascending x, so that the lines run left to right.
	for _, s := range [][]plot.Point{dec, lim, ser, hit, mbt, decOff, hitOff, mbtOff} {
		slices.Reverse(s)
	}
	slices.Reverse(xs)
	pct := func(v float64) string { return plot.FormatNumber(v) + "%" }
	f := &plot.Figure{
		Title: "sluice sweep: " + filepath.Base(r.Model),
		Notes: []string{
			fmt.Sprintf("%s, %d-bit, %d experts of %.2f MB; %d threads, %s; prompt %d, gen %d, %s", r.Family, r.Bits, r.Records, r.RecordMB, r.Threads, r.Device, r.PromptTokens, r.GenTokens, r.trials()),
			"physical limit = 1000 / max(C, reads); no overlap = 1000 / (C + reads), in tok/s",
			fmt.Sprintf("C = %.2f ms/token of compute (%s); reads = MB read per token ÷ %.0f MB/s of disk (%s), in ms", r.ComputeMSTok, r.ComputeSource, r.DiskMBs, r.DiskSource),
		},
		XLabel: "expert pool (% of the expert store; logarithmic)", XTicks: xs, XFormat: pct, LogX: hi/lo >= 4,
		Panels: []plot.Panel{
			{YLabel: "decode tok/s", Series: []plot.Series{{Name: "decode tok/s (measured)", Points: dec}, {Name: "physical limit", Points: lim, Dashed: true},
				{Name: "no overlap: 1000 / (C + reads)", Points: ser, Dashed: true}}},
			{YLabel: "hit rate %", Series: []plot.Series{{Name: "pool hit rate", Points: hit}}, YFormat: pct},
			{YLabel: "MB read / token", Series: []plot.Series{{Name: "MB read from disk per token", Points: mbt}}},
		},
	}
	if !f.LogX {
		f.XLabel = "expert pool (% of the expert store)"
	}
	if r.CompareLookahead {
		for i, s := range []plot.Series{{Name: "decode tok/s, lookahead off", Points: decOff},
			{Name: "pool hit rate, lookahead off", Points: hitOff}, {Name: "MB read from disk per token, lookahead off", Points: mbtOff}} {
			f.Panels[i].Series = append(f.Panels[i].Series, s)
		}
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.WriteSVG(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
