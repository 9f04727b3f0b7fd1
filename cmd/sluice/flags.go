package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/sluicelm/sluice/internal/engine"
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
	fs.SetOutput(os.Stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// modelFlags are the flags every model-loading command shares.
type modelFlags struct {
	dir     string
	threads int
	ctx     int
	chunk   int
}

func (m *modelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.dir, "m", "", "model: a packed directory or a Hugging Face checkpoint (packed once at 4 bits into the cache); default: the bundled tiny model")
	fs.IntVar(&m.threads, "threads", 0, "worker threads (0 = one per CPU)")
	fs.IntVar(&m.ctx, "ctx", 0, "context length in tokens (0 = min(model maximum, 4096))")
	fs.IntVar(&m.chunk, "chunk", 64, "prefill chunk size in tokens")
}

func (m *modelFlags) open(ctx context.Context) (*engine.Engine, error) {
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
	return engine.Open(ctx, dir, engine.Options{Threads: m.threads, Ctx: m.ctx, ChunkRows: m.chunk, Progress: progress})
}

// sampleFlags are the sampling flags of run and chat.
type sampleFlags struct {
	temp, topP, minP, rep, presence, frequency float64
	topK                                       int
	seed                                       int64
}

func (s *sampleFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&s.temp, "temp", 0.8, "temperature; 0 = greedy")
	fs.IntVar(&s.topK, "top-k", 40, "keep the k most likely tokens (0 = off)")
	fs.Float64Var(&s.topP, "top-p", 0.95, "nucleus: keep the smallest set with this probability mass (1 = off)")
	fs.Float64Var(&s.minP, "min-p", 0.05, "drop tokens below this fraction of the top probability (0 = off)")
	fs.Float64Var(&s.rep, "repeat-penalty", 1, "repetition penalty over the context (1 = off)")
	fs.Float64Var(&s.presence, "presence-penalty", 0, "subtracted from tokens already present")
	fs.Float64Var(&s.frequency, "frequency-penalty", 0, "subtracted per occurrence")
	fs.Int64Var(&s.seed, "seed", -1, "random seed (-1 = random)")
}

func (s *sampleFlags) params() (sample.Params, error) {
	seed := uint64(s.seed)
	if s.seed < 0 {
		// Keep the reported seed within --seed's int64 range so that it can
		// be passed back to reproduce the run.
		seed = randomSeed() &^ (1 << 63)
	}
	p := sample.Params{Temperature: s.temp, TopK: s.topK, TopP: s.topP, MinP: s.minP,
		RepetitionPenalty: s.rep, PresencePenalty: s.presence, FrequencyPenalty: s.frequency, Seed: seed}
	return p, p.Validate()
}

// parseIDs reads "1,2,3" (spaces allowed).
func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("bad token id %q in --tokens", f)
		}
		ids = append(ids, v)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("--tokens is empty")
	}
	return ids, nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
