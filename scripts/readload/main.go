// Command readload reads a file from disk at a steady rate, bypassing the
// page cache, until it is killed: the load a streamed expert pool puts on
// the disk, without the engine. scripts/compare-cap.sh runs sluice's
// resident decode beside it at the rate a capped run read at, to measure
// what the reads themselves cost the compute on the machine (on a virtual
// machine the host's disk emulation takes processor time and memory
// bandwidth that the guest never sees as its own).
//
//	readload FILE MB_PER_S [RECORD_BYTES]
//
// Each read is one RECORD_BYTES piece (default 2 MiB, rounded down to
// whole 4 KiB blocks) at a random offset aligned to the piece, as a pool's
// misses are; the reads are paced so that the bytes read by any moment
// stay within one piece of MB_PER_S times the time since the start. When
// killed (SIGTERM or SIGINT) it prints the rate it achieved on stderr.
package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/sluicelm/sluice/internal/platform"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "readload:", err)
		os.Exit(1)
	}
}

// run parses the arguments, opens the file uncached and reads it until
// ctx ends.
func run(ctx context.Context, args []string) error {
	if len(args) < 2 || len(args) > 3 {
		return fmt.Errorf("usage: readload FILE MB_PER_S [RECORD_BYTES]")
	}
	rate, err := strconv.ParseFloat(args[1], 64)
	if err != nil || !(rate > 0) || math.IsInf(rate, 1) {
		return fmt.Errorf("MB_PER_S %q: want a positive number", args[1])
	}
	rec := int64(2 << 20)
	if len(args) == 3 {
		if rec, err = strconv.ParseInt(args[2], 10, 64); err != nil || rec < 4096 {
			return fmt.Errorf("RECORD_BYTES %q: want a number of at least 4096", args[2])
		}
		rec = rec / 4096 * 4096 // uncached reads want whole blocks
	}
	f, direct, why, err := platform.OpenUncached(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	if !direct {
		return fmt.Errorf("%s: cannot bypass the page cache (%s), so the reads would not reach the disk", args[0], why)
	}
	st, err := os.Stat(args[0])
	if err != nil {
		return err
	}
	done, took, err := load(ctx, f, st.Size(), rec, rate)
	if err != nil {
		return err
	}
	s := took.Seconds()
	fmt.Fprintf(os.Stderr, "readload: %.0f MB in %.1f s, %.0f MB/s\n", float64(done)/1e6, s, float64(done)/1e6/max(s, 1e-9))
	return nil
}

// preader is the file's one method load needs.
type preader interface {
	Pread(b []byte, off int64) (int, error)
}

// load reads pieces of rec bytes at random piece-aligned offsets of a
// file of size bytes, paced to rate MB/s, until ctx ends; it returns the
// bytes read and the time it took.
func load(ctx context.Context, f preader, size, rec int64, rate float64) (done int64, took time.Duration, err error) {
	n := size / rec
	if n < 1 {
		return 0, 0, fmt.Errorf("the file (%d bytes) is smaller than one %d-byte piece", size, rec)
	}
	buf, err := platform.Alloc(int(rec))
	if err != nil {
		return 0, 0, err
	}
	defer platform.Free(buf)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	perByte := float64(time.Second) / (rate * 1e6)
	t0 := time.Now()
	for ctx.Err() == nil {
		// Wait until the schedule allows the next piece.
		if d := time.Duration(float64(done)*perByte) - time.Since(t0); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return done, time.Since(t0), nil
			}
		}
		if _, err := f.Pread(buf, r.Int64N(n)*rec); err != nil {
			return done, time.Since(t0), err
		}
		done += rec
	}
	return done, time.Since(t0), nil
}
