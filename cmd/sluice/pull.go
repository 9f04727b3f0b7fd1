package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluicelm/sluice/internal/engine"
	"github.com/sluicelm/sluice/internal/hub"
)

// globList is a repeatable, comma-separated flag.
type globList []string

func (g *globList) String() string { return strings.Join(*g, ",") }

func (g *globList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*g = append(*g, s)
		}
	}
	return nil
}

func cmdPull(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pull", flag.ContinueOnError)
	var include globList
	fs.Var(&include, "include", "download only files matching GLOB (repeatable or comma-separated; \"*\" does not cross \"/\"); default: "+strings.Join(hub.DefaultInclude, ","))
	dir := fs.String("dir", "", "download into DIR (default: the cache's hub/OWNER--NAME[@REVISION])")
	noPack := fs.Bool("no-pack", false, "only download; do not pack")
	bits := fs.Int("bits", 4, "bits of the packed copy: 16 (bf16, exact), 8 or 4")
	parallel := fs.Int("parallel", 4, "files downloading at once")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want one REPO, got %q (usage: sluice pull OWNER/NAME[@REVISION] [--include GLOB] [--dir DIR] [--no-pack])", pos)
	}
	if *bits != 16 && *bits != 8 && *bits != 4 {
		return fmt.Errorf("--bits %d: want 16, 8 or 4", *bits)
	}
	if *parallel < 1 {
		return fmt.Errorf("--parallel %d must be >= 1", *parallel)
	}
	ref, err := hub.ParseRef(pos[0])
	if err != nil {
		return err
	}
	d := *dir
	if d == "" {
		cache, err := engine.CacheDir()
		if err != nil {
			return err
		}
		d = hub.Dir(cache, ref)
	}
	if err := pull(ctx, ref, include, d, *parallel); err != nil {
		return err
	}
	if *noPack {
		fmt.Println(d)
		return nil
	}
	var progress io.Writer
	if isTerminal(os.Stderr) {
		progress = os.Stderr
	}
	packed, err := engine.PackCached(ctx, d, engine.Options{PackBits: *bits, Progress: progress})
	if err != nil {
		return fmt.Errorf("packing %s: %w", d, err)
	}
	fmt.Fprintf(os.Stderr, "sluice pull: %s is ready: sluice run -m %s (or -m %s)\n", ref, ref, packed)
	fmt.Println(packed)
	return nil
}

// pull downloads ref into dir with a progress bar on a terminal, and says
// where partial downloads stay when it fails or is interrupted.
func pull(ctx context.Context, ref hub.Ref, include []string, dir string, parallel int) error {
	c := hub.NewClient()
	c.Parallel = parallel
	if isTerminal(os.Stderr) {
		c.Progress = os.Stderr
	} else {
		c.Log = os.Stderr
	}
	fmt.Fprintf(os.Stderr, "sluice pull: %s into %s\n", ref, dir)
	if _, err := c.Pull(ctx, ref, include, dir); err != nil {
		if hasPartial(dir) {
			fmt.Fprintf(os.Stderr, "sluice pull: partial downloads stay in %s; the same command resumes them\n", dir)
		}
		return err
	}
	return nil
}

func hasPartial(dir string) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), hub.PartialSuffix) {
			return true
		}
	}
	return false
}

// resolve turns -m OWNER/NAME[@REVISION], when no such directory exists,
// into the pulled checkpoint in the cache, pulling it on first use (the
// engine then packs it once, as for any checkpoint directory). It returns
// the repository's name ("" when -m is a directory or empty).
func (m *modelFlags) resolve(ctx context.Context) (string, error) {
	if m.dir == "" || !hub.LooksLikeRef(m.dir) {
		return "", nil
	}
	if _, err := os.Stat(m.dir); !errors.Is(err, os.ErrNotExist) {
		return "", nil // a directory (or something the engine will report on)
	}
	ref, _ := hub.ParseRef(m.dir)
	cache, err := engine.CacheDir()
	if err != nil {
		return "", err
	}
	d := hub.Dir(cache, ref)
	if !hub.Complete(d) {
		if err := pull(ctx, ref, nil, d, 4); err != nil {
			if errors.Is(err, context.Canceled) {
				return "", err
			}
			return "", fmt.Errorf("-m %s is not a directory, and pulling it from the hub failed: %w", m.dir, err)
		}
	}
	m.dir = d
	return ref.String(), nil
}
