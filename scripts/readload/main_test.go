package main

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countReader counts the bytes asked of it and fails offsets outside a
// file of size bytes or not aligned to a piece.
type countReader struct {
	size, rec int64
	n         atomic.Int64
	bad       atomic.Int64
}

func (c *countReader) Pread(b []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(b)) > c.size || off%c.rec != 0 {
		c.bad.Add(1)
	}
	c.n.Add(int64(len(b)))
	return len(b), nil
}

// TestLoadPaced: load never reads ahead of its schedule (more than one
// piece beyond rate × time), stays inside the file on piece boundaries,
// and stops when its context ends. A load that ignored the rate would
// read gigabytes from this in-memory file in the same time.
func TestLoadPaced(t *testing.T) {
	const rec, rate = 64 << 10, 20.0 // 20 MB/s: about 300 pieces a second
	f := &countReader{size: 100*rec + 123, rec: rec}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	done, took, err := load(ctx, f, f.size, rec, rate)
	wall := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if done != f.n.Load() || done%rec != 0 {
		t.Fatalf("load reported %d bytes, read %d", done, f.n.Load())
	}
	if allowed := int64(rate*1e6*wall.Seconds()) + rec; done > allowed {
		t.Fatalf("read %d bytes in %v, more than the schedule's %d", done, wall, allowed)
	}
	if done == 0 {
		t.Fatalf("read nothing in %v", took)
	}
	if b := f.bad.Load(); b > 0 {
		t.Fatalf("%d reads outside the file or off a piece boundary", b)
	}
	if took > wall {
		t.Fatalf("took %v, longer than the call's %v", took, wall)
	}
}

// TestRunErrors: bad arguments and files are refused with a message, not
// a panic.
func TestRunErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"f", "x"}, "MB_PER_S"},
		{[]string{"f", "-3"}, "MB_PER_S"},
		{[]string{"f", "NaN"}, "MB_PER_S"},
		{[]string{"f", "Inf"}, "MB_PER_S"},
		{[]string{"f", "5", "100"}, "RECORD_BYTES"},
	} {
		err := run(ctx, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error mentioning %q", c.args, err, c.want)
		}
	}
	if err := run(ctx, []string{t.TempDir() + "/missing", "5"}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	if _, _, err := load(ctx, &countReader{size: 10, rec: 4096}, 10, 4096, 1); err == nil || !strings.Contains(err.Error(), "smaller than one") {
		t.Errorf("a file smaller than a piece: %v", err)
	}
}
