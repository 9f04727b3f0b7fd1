//go:build linux

package cuda

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ebitengine/purego"
)

// TestDlopenErrorKeepsMessage checks that a failed dlopen reports the
// dynamic loader's reason (the text the user sees when no driver is
// installed) even while other goroutines keep the runtime moving
// goroutines between threads: dlerror reads a per-thread message, so it
// must run on the thread whose dlopen failed.
func TestDlopenErrorKeepsMessage(t *testing.T) {
	const name = "libsluice-test-absent.so.1"
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				runtime.Gosched()
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	bad := 0
	const tries = 20000
	for range tries {
		_, err := dlopen(name, purego.RTLD_NOW)
		if err == nil {
			t.Fatalf("dlopen(%s) succeeded", name)
		}
		if !strings.Contains(err.Error(), name) {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d failed dlopens lost the loader's message", bad, tries)
	}
}
