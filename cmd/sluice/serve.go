package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/server"
	"github.com/sluicelm/sluice/models"
)

// serveLimits are serve's own numeric flags, checked before the model
// loads.
type serveLimits struct {
	slots, maxQueue int
	cacheMB         float64
	grace           time.Duration
	maxBodyKB       int64
}

// check refuses values that would otherwise be replaced without a word:
// the server took --max-body-kb 0 as its 4 MiB default, any negative or NaN
// --cache-mb as "off", and announced "up to -1s to finish" for a negative
// --grace.
func (l serveLimits) check() error {
	if l.slots < 1 {
		return fmt.Errorf("--slots %d must be >= 1", l.slots)
	}
	if l.maxQueue < 0 {
		return fmt.Errorf("--max-queue %d must be >= 0", l.maxQueue)
	}
	// -1 is the documented "off"; other negatives are more likely typos.
	if l.cacheMB != -1 && !(l.cacheMB >= 0 && !math.IsInf(l.cacheMB, 1) && l.cacheMB*(1<<20) < math.MaxInt64) {
		return fmt.Errorf("--cache-mb %g: want a size in MiB >= 0 (0 = four sequence states' worth), or -1 for off", l.cacheMB)
	}
	if l.grace < 0 {
		return fmt.Errorf("--grace %v must be >= 0", l.grace)
	}
	// The limit is passed on in bytes, so it must survive the shift.
	if l.maxBodyKB < 1 || l.maxBodyKB > math.MaxInt64>>10 {
		return fmt.Errorf("--max-body-kb %d must be >= 1", l.maxBodyKB)
	}
	return nil
}

// cmdServe runs the OpenAI-compatible HTTP server until SIGINT or SIGTERM,
// then stops accepting, lets requests in flight finish within --grace,
// cancels what is left, and returns nil (exit 0).
func cmdServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (host:port; port 0 picks a free one)")
	maxQueue := fs.Int("max-queue", 64, "requests that may wait for a slot; beyond them the answer is 429 with Retry-After")
	apiKey := fs.String("api-key", os.Getenv("SLUICE_API_KEY"), "require \"Authorization: Bearer KEY\" on /v1/ (default $SLUICE_API_KEY)")
	slots := fs.Int("slots", 4, "requests generating at once, each with its own sequence state")
	cacheMB := fs.Float64("cache-mb", 0, "prefix cache size in MiB (0 = four sequence states' worth, -1 = off)")
	drafts := fs.Int("drafts", 0, "MTP draft tokens per step (speculative decoding; greedy output is unchanged)")
	grace := fs.Duration("grace", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish before they are cancelled")
	maxBody := fs.Int64("max-body-kb", 4096, "request bodies beyond this many KiB get 413")
	modelID := fs.String("model-id", "", "model id reported by /v1/models (default: the model directory's name)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := mf.check(); err != nil {
		return err
	}
	lim := serveLimits{slots: *slots, maxQueue: *maxQueue, cacheMB: *cacheMB, grace: *grace, maxBodyKB: *maxBody}
	if err := lim.check(); err != nil {
		return err
	}
	memGB := mf.experts.memoryGB
	id := *modelID
	if ref, err := mf.resolve(ctx); err != nil {
		return err
	} else if id == "" && ref != "" {
		id = ref
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
		if id == "" {
			id = "tiny-qwen3-5-moe"
		}
	} else if id == "" {
		id = filepath.Base(filepath.Clean(dir))
	}
	xo, err := mf.experts.options(os.Stderr)
	if err != nil {
		return err
	}
	opts := engine.Options{Threads: mf.threads, Ctx: mf.ctx, ChunkRows: mf.chunk, Experts: xo, Device: mf.device, States: *slots, Drafts: *drafts}
	if isTerminal(os.Stderr) {
		opts.Progress = os.Stderr
	}
	cacheBytes := int64(*cacheMB * (1 << 20))
	if *cacheMB < 0 {
		cacheBytes = -1
	}
	// A directory that is not a model is reported when the engine opens it.
	state, serr := stateBytes(dir, mf.ctx)
	if serr == nil {
		if cacheBytes == 0 {
			cacheBytes = 4 * state
		}
		// On a GPU every slot's state and each cached prefix has a device
		// copy as well, which the GPU's expert pool leaves room for.
		opts.States = *slots + int((max(cacheBytes, 0)+state-1)/max(state, 1))
	}
	if memGB > 0 {
		if serr != nil {
			return serr
		}
		// The engine's budget covers the weights, the expert pool and one
		// sequence state; the other slots and the prefix cache come out
		// of --memory-gb first.
		reserve := int64(*slots-1)*state + max(cacheBytes, 0)
		opts.Experts.MemoryBytes = int64(memGB*(1<<30)) - reserve
		if opts.Experts.MemoryBytes <= 0 {
			return fmt.Errorf("--memory-gb %.2f is less than the %d slots (%s each) and prefix cache (%s) take; lower --slots or --cache-mb", memGB, *slots, mibStr(state), mibStr(max(cacheBytes, 0)))
		}
	}
	e, err := engine.Open(ctx, dir, opts)
	if err != nil {
		return err
	}
	defer e.Close()
	deviceNote(e)
	if e.Tok.TemplateIsFallback() {
		fmt.Fprintf(os.Stderr, "note: the model's chat template could not be used (%s); using the ChatML fallback\n", e.Tok.TemplateFallbackReason())
	}
	srv, err := server.New(server.Config{Engine: e, ModelID: id, APIKey: *apiKey, Slots: *slots, MaxQueue: *maxQueue,
		CacheBytes: cacheBytes, Drafts: *drafts, MaxBodyBytes: *maxBody << 10})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		srv.Abort()
		return err
	}
	cacheDesc := "off"
	if srv.CacheBytes() > 0 {
		cacheDesc = mibStr(srv.CacheBytes())
	}
	auth := ""
	if *apiKey != "" {
		auth = ", API key required"
	}
	fmt.Fprintf(os.Stderr, "sluice serve: %s (context %d) on http://%s: %d slots of %s, queue %d, prefix cache %s%s, device %s\n",
		id, e.Ctx, ln.Addr(), srv.Slots(), mibStr(srv.StateBytes()), *maxQueue, cacheDesc, auth, e.Device)
	if e.ExpertPlan != "" {
		fmt.Fprintf(os.Stderr, "sluice serve: experts: %s\n", e.ExpertPlan)
	}
	fmt.Fprintf(os.Stderr, "sluice serve: chat in a browser at http://%s/\n", ln.Addr())
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		srv.Abort()
		srv.Wait(context.Background())
		return err
	case <-ctx.Done():
	}
	active, queued := srv.Load()
	fmt.Fprintf(os.Stderr, "sluice serve: shutting down: %d requests running, %d waiting, up to %s to finish\n", active, queued, *grace)
	srv.Shutdown()
	gctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	if err := hs.Shutdown(gctx); err != nil {
		active, queued = srv.Load()
		fmt.Fprintf(os.Stderr, "sluice serve: grace period over: cancelling %d requests\n", active+queued)
		srv.Abort()
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(cctx); err != nil {
			hs.Close()
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := srv.Wait(wctx); err != nil {
		// The scheduler still holds the runner: leave the engine open.
		return fmt.Errorf("the scheduler did not stop: %v", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Fprintln(os.Stderr, "sluice serve: stopped")
	return nil
}

// stateBytes estimates one sequence state of the model in dir (a packed
// directory or a checkpoint) at context ctx (0 = the default).
func stateBytes(dir string, ctx int) (int64, error) {
	var c format.Config
	if _, err := os.Stat(filepath.Join(dir, format.ManifestFile)); err == nil {
		man, err := format.ReadManifest(dir)
		if err != nil {
			return 0, err
		}
		c = man.Config
	} else {
		if c, _, err = hf.ReadConfig(dir); err != nil {
			return 0, err
		}
	}
	if ctx <= 0 {
		ctx = 4096
		if c.MaxPos > 0 && c.MaxPos < ctx {
			ctx = c.MaxPos
		}
	}
	return experts.StateBytes(&c, ctx), nil
}

func mibStr(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
