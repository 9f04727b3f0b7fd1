//go:build linux

package cuda

import (
	"testing"

	"github.com/ebitengine/purego"
)

// TestCallAllocatesNothing checks that a driver call through Device.call
// (every launch, copy and graph replay goes through it) allocates nothing,
// using libc's labs as a stand-in C function with as many arguments as
// cuLaunchKernel. It needs no GPU.
func TestCallAllocatesNothing(t *testing.T) {
	lib, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skip("no libc.so.6 to call:", err)
	}
	labs, err := purego.Dlsym(lib, "labs")
	if err != nil {
		t.Skip(err)
	}
	d := &Device{}
	var x uintptr
	n := testing.AllocsPerRun(1000, func() {
		if err := d.call("labs", labs, x, x+1, x+2, x+3, x+4, x+5, x+6, x+7, x+8, x+9, x+10); err != nil {
			t.Fatal("labs(0) returned non-zero:", err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}
