package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/sample"
	"github.com/sluicelm/sluice/models"
)

var (
	errUsage = errors.New("usage")
	errHelp  = errors.New("help")
)

// parse parses flags that may stand before, between or after positional
// arguments, and returns the positionals.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, _, err := parseAt(fs, args)
	return pos, err
}

// parseAt is parse, also returning where in args each positional stood.
//
// A bad flag prints its error and a pointer to -h, not the whole flag list,
// which would scroll the error out of sight; -h prints the list.
func parseAt(fs *flag.FlagSet, args []string) (pos []string, at []int, err error) {
	fs.SetOutput(os.Stderr)
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				if usage != nil {
					usage()
				} else {
					fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
					fs.PrintDefaults()
				}
				return nil, nil, errHelp
			}
			fmt.Fprintf(fs.Output(), "run 'sluice %s -h' for its flags\n", fs.Name())
			return nil, nil, errUsage
		}
		rest = fs.Args()
		if len(rest) == 0 {
			return pos, at, nil
		}
		pos = append(pos, rest[0])
		at = append(at, len(args)-len(rest))
		rest = rest[1:]
	}
}

// parseFlags parses the flags of a command that takes no positional
// arguments, and refuses any. Since flags may follow positionals, an
// unquoted prompt (-p What is a mixture) would otherwise run with its
// first word alone and drop the rest without a word.
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, at, err := parseAt(fs, args)
	if err != nil || len(pos) == 0 {
		return err
	}
	return strayError(fs, args, pos, at)
}

// strayError names the stray positionals of a command that takes none.
// When the first one follows a flag's value, the words are most likely the
// rest of that value, so the hint shows the flag with them quoted.
func strayError(fs *flag.FlagSet, args, pos []string, at []int) error {
	q := make([]string, len(pos))
	for i, p := range pos {
		q[i] = strconv.Quote(p)
	}
	what := "unexpected argument " + q[0]
	if len(q) > 1 {
		what = "unexpected arguments " + strings.Join(q, " ")
	}
	hint := "quote a value that contains spaces"
	if name, value, ok := flagValueBefore(fs, args, at[0]); ok {
		words := []string{value}
		for i := 0; i < len(pos) && at[i] == at[0]+i; i++ {
			words = append(words, pos[i])
		}
		// Show the quoted form only where the flag takes it (a text, not
		// a number). Setting the flag is harmless: the command fails.
		joined := strings.Join(words, " ")
		if fs.Set(strings.TrimLeft(name, "-"), joined) == nil {
			hint = fmt.Sprintf("quote the value of %s: %s %q", name, name, joined)
		}
	}
	return fmt.Errorf("%s: sluice %s takes no positional arguments; %s", what, fs.Name(), hint)
}

// flagValueBefore returns the non-boolean flag (as written) and its value
// that stand just before args[i], if any: "-p What" or "-p=What".
func flagValueBefore(fs *flag.FlagSet, args []string, i int) (name, value string, ok bool) {
	isValueFlag := func(arg string) (string, bool) {
		n := strings.TrimLeft(arg, "-")
		if !strings.HasPrefix(arg, "-") || n == "" || len(arg)-len(n) > 2 {
			return "", false
		}
		f := fs.Lookup(n)
		if f == nil {
			return "", false
		}
		if b, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool && b.IsBoolFlag() {
			return "", false
		}
		return n, true
	}
	if i >= 1 {
		if flagPart, v, found := strings.Cut(args[i-1], "="); found {
			if _, ok := isValueFlag(flagPart); ok {
				return flagPart, v, true
			}
		}
	}
	if i >= 2 && !strings.Contains(args[i-2], "=") {
		if _, ok := isValueFlag(args[i-2]); ok {
			return args[i-2], args[i-1], true
		}
	}
	return "", "", false
}

// modelFlags are the flags every model-loading command shares.
type modelFlags struct {
	dir     string
	dirSet  bool // -m given, where "" would otherwise mean the bundled model
	threads int
	ctx     int
	chunk   int
	device  string
	experts expertFlags
	// drafts is the most MTP drafts per step the command will ask for
	// (its --drafts), which the GPU sizes its verify snapshots by.
	drafts int
	// allLogits: the command scores text, every row's logits at once
	// (engine.Options.AllLogits).
	allLogits bool
}

// expertFlags choose how routed experts are served (engine.ExpertOptions).
type expertFlags struct {
	poolMB     string
	poolNames  []string // the flags that set poolMB: --pool-mb, --host-cache-mb
	gpuPoolMB  string
	vramGB     float64
	gpuCPU     string
	memoryGB   float64
	memorySet  bool // --memory-gb given, where 0 would mean "not set"
	lookahead  bool
	lookDepth  int
	evict      string
	missBits   int
	cutWeak    float64
	readers    int
	preReaders int
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.Var(setString{&m.dir, &m.dirSet}, "m", "model: a packed directory, a Hugging Face checkpoint (packed once at 4 bits into the cache), or a hub repository OWNER/NAME[@REVISION] (pulled once into the cache); default: the bundled tiny model")
	fs.IntVar(&m.threads, "threads", 0, "worker threads (0 = one per CPU)")
	fs.IntVar(&m.ctx, "ctx", 0, "context length in tokens (0 = min(model maximum, 4096))")
	fs.IntVar(&m.chunk, "chunk", 256, "prefill chunk size in tokens (rows per batched step)")
	fs.StringVar(&m.device, "device", "auto", "where the forward pass runs: auto (the GPU when one is usable, else the CPU), cpu, cuda or cuda:N")
	x := &m.experts
	fs.Var(poolFlag{x, "--pool-mb"}, "pool-mb", "stream experts through a pool of `N` MiB, or N% of the expert store (default: map them whole if they fit, else auto-size)")
	fs.Var(poolFlag{x, "--host-cache-mb"}, "host-cache-mb", "on the GPU, the host-RAM tier below its pool, page-locked: `N` MiB or N% of the expert store (another name for --pool-mb)")
	fs.Float64Var(&x.vramGB, "vram-gb", 0, "on the GPU, the most device memory sluice takes in GiB beyond the CUDA context: weights, scratch, sequence states and the expert pool, which gets what the rest leaves (default: what the GPU has free)")
	fs.StringVar(&x.gpuCPU, "gpu-cpu-share", "auto", "on the GPU with an expert pool, the share (0..1) of each layer's decode misses that the CPU computes from host memory instead of copying them to the GPU; auto: a cost model picks it per layer from the CPU's measured time per expert and the link's per record (q4 experts; the tokens are the same either way)")
	fs.StringVar(&x.gpuPoolMB, "gpu-pool-mb", "", "on the GPU, stream experts through a device pool of N MiB, or N% of the expert store, filled from host memory (default: every expert on the GPU if they fit, else a pool of the memory left)")
	fs.Var(setFloat{&x.memoryGB, &x.memorySet}, "memory-gb", "total memory budget in GiB (dense + state + scratch + expert pool); experts stream when they do not fit")
	fs.BoolVar(&x.lookahead, "lookahead", true, "prefetch the next layer's predicted experts while this layer computes (steps are timed with and without predicting, and predicting pauses where it is slower)")
	fs.IntVar(&x.lookDepth, "lookahead-depth", experts.DefaultLookDepth, fmt.Sprintf("how many layers ahead the lookahead predicts and reads, 1 to %d (each layer's guesses are gated by how often they prove right)", experts.MaxLookDepth))
	fs.StringVar(&x.evict, "evict", "", "expert pool eviction: markov (each layer's expert-to-expert transitions), lrfu (recency-weighted use counts, by layer order), flru (frequency-weighted LRU) or lru; default markov")
	fs.IntVar(&x.missBits, "miss-bits", 0, "lossy: read missed experts from the 3- or 2-bit store (sluice pack --low-bits)")
	fs.Float64Var(&x.cutWeak, "cut-weak", 0, "lossy: skip a late-arriving expert whose routing weight is below W in every row")
	fs.IntVar(&x.readers, "readers", 0, "expert reads in flight at most, i.e. read queue depth: kernel asynchronous reads for uncached reads on Linux (except where records are tiled as they land), else as many reader goroutines (0 = 8)")
	fs.IntVar(&x.preReaders, "prefetch-readers", 0, "of the readers, how many also take lookahead prefetches (0 = follow the disk: 2 while the reads take most of its bandwidth, all while it has room)")
}

// setFloat is a float flag that remembers being given, so that an explicit
// 0 can be refused where the default 0 means "not set".
type setFloat struct {
	v   *float64
	set *bool
}

func (f setFloat) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.v, 'g', -1, 64)
}

func (f setFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("want a number")
	}
	*f.v, *f.set = v, true
	return nil
}

// setString is a string flag that remembers being given, so that an
// explicit empty value can be refused where the default "" means "not set".
type setString struct {
	v   *string
	set *bool
}

func (f setString) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f setString) Set(s string) error {
	*f.v, *f.set = s, true
	return nil
}

// check refuses values of the shared model flags that would otherwise be
// replaced by a default without a word (a negative --threads ran as "one
// per CPU") or, for NaN, slip past every range check. Commands call it,
// through open, before any work.
func (m *modelFlags) check() error {
	// -m "" (an unset variable in a script, say) must not quietly run the
	// bundled model in place of the one meant.
	if m.dirSet && strings.TrimSpace(m.dir) == "" {
		return fmt.Errorf("-m: empty path (leave -m out for the bundled model)")
	}
	if m.threads < 0 {
		return fmt.Errorf("--threads %d must be >= 0 (0 = one per CPU)", m.threads)
	}
	if m.ctx < 0 {
		return fmt.Errorf("--ctx %d must be >= 0 (0 = the model's maximum, at most 4096)", m.ctx)
	}
	if m.chunk < 1 {
		return fmt.Errorf("--chunk %d must be >= 1", m.chunk)
	}
	_, err := m.experts.options(io.Discard)
	return err
}

// intMin is an integer flag's value and the least it may be.
type intMin struct {
	name   string
	v, min int
}

// checkMins names the first flag below its minimum, with its value, so that
// the one wrong flag stands out from a list of constraints.
func checkMins(flags []intMin) error {
	for _, f := range flags {
		if f.v < f.min {
			return fmt.Errorf("%s %d must be >= %d", f.name, f.v, f.min)
		}
	}
	return nil
}

// poolFlag sets the host's pool size under either of its names.
type poolFlag struct {
	x    *expertFlags
	name string
}

func (f poolFlag) String() string {
	if f.x == nil {
		return ""
	}
	return f.x.poolMB
}

func (f poolFlag) Set(v string) error {
	f.x.poolMB = v
	if !slices.Contains(f.x.poolNames, f.name) {
		f.x.poolNames = append(f.x.poolNames, f.name)
	}
	return nil
}

// options converts the flags; verbose notes go to log.
func (x *expertFlags) options(log io.Writer) (engine.ExpertOptions, error) {
	o := engine.ExpertOptions{MemoryBytes: int64(x.memoryGB * (1 << 30)), NoLookahead: !x.lookahead, LookDepth: x.lookDepth,
		Policy: experts.Policy(x.evict), MissBits: x.missBits, CutWeak: x.cutWeak, Readers: x.readers, PrefetchReaders: x.preReaders, Log: log}
	if len(x.poolNames) > 1 {
		return o, fmt.Errorf("%s and %s both size the host's pool: give one", x.poolNames[0], x.poolNames[1])
	}
	if x.lookDepth < 1 || x.lookDepth > experts.MaxLookDepth {
		return o, fmt.Errorf("--lookahead-depth %d: give 1 to %d layers", x.lookDepth, experts.MaxLookDepth)
	}
	if x.poolMB != "" {
		name := "--pool-mb"
		if len(x.poolNames) > 0 {
			name = x.poolNames[0]
		}
		if x.memoryGB > 0 {
			return o, fmt.Errorf("give %s or --memory-gb, not both", name)
		}
		var err error
		if o.PoolBytes, o.PoolShare, err = poolSize(name, x.poolMB); err != nil {
			return o, err
		}
	}
	if x.gpuPoolMB != "" {
		var err error
		if o.GPUPoolBytes, o.GPUPoolShare, err = poolSize("--gpu-pool-mb", x.gpuPoolMB); err != nil {
			return o, err
		}
	}
	if x.memorySet && !(x.memoryGB > 0 && !math.IsInf(x.memoryGB, 1)) || x.memoryGB < 0 {
		return o, fmt.Errorf("--memory-gb %g must be a positive number of GiB", x.memoryGB)
	}
	if !(x.vramGB >= 0) || math.IsInf(x.vramGB, 1) {
		return o, fmt.Errorf("--vram-gb %g must be positive", x.vramGB)
	}
	if x.readers < 0 {
		return o, fmt.Errorf("--readers %d must be >= 0 (0 = 8)", x.readers)
	}
	o.VRAMBytes = int64(x.vramGB * (1 << 30))
	switch x.gpuCPU {
	case "", "auto":
		o.GPUCPUAuto = true
	default:
		v, err := strconv.ParseFloat(x.gpuCPU, 64)
		if err != nil || !(v >= 0 && v <= 1) {
			return o, fmt.Errorf("--gpu-cpu-share %s: want a share in [0,1] or auto", x.gpuCPU)
		}
		o.GPUCPUShare = v
	}
	if x.missBits != 0 && x.missBits != 2 && x.missBits != 3 {
		return o, fmt.Errorf("--miss-bits %d: want 3 or 2", x.missBits)
	}
	if !(x.cutWeak >= 0 && x.cutWeak < 1) { // NaN too
		return o, fmt.Errorf("--cut-weak %g: want a routing weight in [0,1)", x.cutWeak)
	}
	return o, nil
}

// poolSize reads a pool flag's value: a size in MiB, or a percentage of
// the expert store ("25%").
func poolSize(name, v string) (bytes int64, share float64, err error) {
	if p, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || !(f > 0 && f <= 100) {
			return 0, 0, fmt.Errorf("%s %q: want a percentage in (0,100]", name, v)
		}
		return 0, f / 100, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 1) || f*(1<<20) >= math.MaxInt64 {
		return 0, 0, fmt.Errorf("%s %q: want a positive size in MiB or a percentage", name, v)
	}
	return int64(f * (1 << 20)), 0, nil
}

func (m *modelFlags) open(ctx context.Context) (*engine.Engine, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	if _, err := m.resolve(ctx); err != nil {
		return nil, err
	}
	dir := m.dir
	if dir == "" {
		cache, err := engine.CacheDir()
		if err != nil {
			return nil, err
		}
		if dir, err = models.DefaultDir(cache); err != nil {
			return nil, err
		}
	}
	var progress io.Writer
	if isTerminal(os.Stderr) {
		progress = os.Stderr
	}
	xo, err := m.experts.options(os.Stderr)
	if err != nil {
		return nil, err
	}
	e, err := engine.Open(ctx, dir, engine.Options{Threads: m.threads, Ctx: m.ctx, ChunkRows: m.chunk, Progress: progress, Experts: xo, Device: m.device, Drafts: m.drafts, AllLogits: m.allLogits})
	if err != nil {
		return nil, err
	}
	deviceNote(e)
	return e, nil
}

// deviceNote says on stderr why auto chose the CPU, when it did, and how
// the GPU holds the experts when they stream through its pool.
func deviceNote(e *engine.Engine) {
	if e.DeviceNote != "" {
		fmt.Fprintln(os.Stderr, e.DeviceNote)
	}
	if p, ok := e.DevicePool(); ok && p.Slots > 0 {
		fmt.Fprintf(os.Stderr, "device: experts stream through a GPU pool of %d of %d records (%.1f MiB)\n",
			p.Slots, p.Records, float64(p.Slots)*float64(p.RecordBytes)/(1<<20))
		if p.PinNote != "" {
			fmt.Fprintf(os.Stderr, "device: misses are copied to the GPU through staging, with no lookahead: %s\n", p.PinNote)
		}
	}
}

// sampleFlags are the sampling flags of run and chat, with the number of
// MTP drafts per step.
type sampleFlags struct {
	temp, topP, minP, rep, presence, frequency float64
	topK                                       int
	seed                                       int64
	drafts                                     int
}

// defaultDrafts is --drafts by default: the D with the best measured decode
// speed on the bundled model with the full store and a 25% expert pool
// (README, "Speculative decoding"). On this 2-core machine the tiny model's
// step is bound by per-expert dispatch, whose count grows with the rows of a
// batch, so drafts do not pay yet; measure again on a real checkpoint.
const defaultDrafts = 0

func (s *sampleFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&s.temp, "temp", 0.8, "temperature; 0 = greedy")
	fs.IntVar(&s.topK, "top-k", 40, "keep the k most likely tokens (0 = off)")
	fs.Float64Var(&s.topP, "top-p", 0.95, "nucleus: keep the smallest set with this probability mass (1 = off)")
	fs.Float64Var(&s.minP, "min-p", 0.05, "drop tokens below this fraction of the top probability (0 = off)")
	fs.Float64Var(&s.rep, "repeat-penalty", 1, "repetition penalty over the context, in (0, 10] (1 = off)")
	fs.Float64Var(&s.presence, "presence-penalty", 0, "subtracted from tokens already present")
	fs.Float64Var(&s.frequency, "frequency-penalty", 0, "subtracted per occurrence")
	fs.Int64Var(&s.seed, "seed", -1, "random seed (-1 = random)")
	fs.IntVar(&s.drafts, "drafts", defaultDrafts, "tokens the model's MTP head drafts per step for speculative decoding (0 = off; ignored, with a note, for models without an MTP head)")
}

// draftNote tells the user when --drafts cannot apply to the model.
func (s *sampleFlags) draftNote(e *engine.Engine) {
	if s.drafts > 0 && !e.CanDraft() {
		fmt.Fprintln(os.Stderr, "note: the model has no MTP head; decoding without drafts")
	}
}

// open checks the sampling flags, then opens the model with the drafts they
// ask for, noting when the model cannot draft: run's and chat's start.
func (s *sampleFlags) open(ctx context.Context, mf *modelFlags) (*engine.Engine, sample.Params, error) {
	sp, err := s.params()
	if err != nil {
		return nil, sp, err
	}
	mf.drafts = s.drafts
	e, err := mf.open(ctx)
	if err != nil {
		return nil, sp, err
	}
	s.draftNote(e)
	return e, sp, nil
}

func (s *sampleFlags) params() (sample.Params, error) {
	seed := uint64(s.seed)
	if s.seed < 0 {
		// Keep the reported seed within --seed's int64 range so that it can
		// be passed back to reproduce the run.
		seed = randomSeed() &^ (1 << 63)
	}
	if s.drafts < 0 {
		return sample.Params{}, fmt.Errorf("--drafts %d must be >= 0", s.drafts)
	}
	// The same rule as the API's, which Validate cannot apply alone: it
	// takes 0 as the zero value's "off".
	if err := sample.CheckRepetitionPenalty(s.rep); err != nil {
		return sample.Params{}, fmt.Errorf("--repeat-penalty %v: %v", s.rep, err)
	}
	p := sample.Params{Temperature: s.temp, TopK: s.topK, TopP: s.topP, MinP: s.minP,
		RepetitionPenalty: s.rep, PresencePenalty: s.presence, FrequencyPenalty: s.frequency, Seed: seed}
	return p, p.Validate()
}

// parseIDs reads "1,2,3" (spaces allowed, around commas or in place of
// them). An empty entry between commas ("1,,2", "1,2,") is refused: it is
// most likely a lost id, and dropping it would run another prompt.
func parseIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--tokens is empty")
	}
	var ids []int
	for _, part := range strings.Split(s, ",") {
		fields := strings.Fields(part)
		if len(fields) == 0 {
			return nil, fmt.Errorf("bad token id \"\" in --tokens %q: an empty entry", s)
		}
		for _, f := range fields {
			v, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("bad token id %q in --tokens", f)
			}
			ids = append(ids, v)
		}
	}
	return ids, nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
