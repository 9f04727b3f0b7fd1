//go:build linux

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGemmEmulated runs the tiled q4 kernel (kernels/gemm.cuh) on the
// CPU, so that its indexing is checked where there is no GPU: g++
// compiles it against host stand-ins for the device's primitives
// (testdata/emu/device.h, in place of common.cuh) and
// testdata/emu/gemm_emu.cpp checks every mode's outputs bit for bit
// against q4_rows' arithmetic. q4_mma, cut from matvec.cu, runs through
// the same emulated mma first, as the check of the emulation itself (its
// bits are checked on the device by TestQ4). Skipped without g++.
func TestGemmEmulated(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++ to build the emulation")
	}
	dir := t.TempDir()
	copyFile := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile("kernels/gemm.cuh", "gemm.cuh")
	copyFile("testdata/emu/device.h", "common.cuh")
	copyFile("testdata/emu/gemm_emu.cpp", "gemm_emu.cpp")
	mv, err := os.ReadFile("kernels/matvec.cu")
	if err != nil {
		t.Fatal(err)
	}
	fn, err := cutFunction(string(mv), `extern "C" __global__ void __launch_bounds__(128) q4_mma(`)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "q4_mma.inc"), []byte(strings.TrimPrefix(fn, `extern "C" `)), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gemm_emu")
	cc := exec.Command(gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-o", bin, filepath.Join(dir, "gemm_emu.cpp"))
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the emulated kernel: %v", err)
	}
}

// cutFunction returns the definition in src that starts with head, up to
// its body's closing brace.
func cutFunction(src, head string) (string, error) {
	i := strings.Index(src, head)
	if i < 0 {
		return "", os.ErrNotExist
	}
	depth := 0
	for j := i; j < len(src); j++ {
		switch src[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[i : j+1], nil
			}
		}
	}
	return "", os.ErrNotExist
}
