package kernels

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestX86Model checks x86Model against the first processor of
// /proc/cpuinfo, which the kernel fills from the same CPUID leaves, and
// that the 512-bit decode variant is dropped exactly where halfWideZMM
// says.
func TestX86Model(t *testing.T) {
	vendor, family, model := x86Model()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("no /proc/cpuinfo to compare with: %v", err)
	}
	want := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" {
			break // the first processor's block ends here
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			want[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if want["vendor_id"] == "" {
		t.Skip("/proc/cpuinfo names no vendor_id")
	}
	if vendor != want["vendor_id"] {
		t.Errorf("vendor %q, /proc/cpuinfo %q", vendor, want["vendor_id"])
	}
	for _, c := range []struct {
		key string
		got uint32
	}{{"cpu family", family}, {"model", model}} {
		if n, err := strconv.Atoi(want[c.key]); err != nil || uint32(n) != c.got {
			t.Errorf("%s %d, /proc/cpuinfo %q", c.key, c.got, want[c.key])
		}
	}
	zen4 := vendor == "AuthenticAMD" && family == 25 && useVNNI
	if splitZMM != zen4 {
		t.Errorf("splitZMM %v on %s family %d (VNNI %v)", splitZMM, vendor, family, useVNNI)
	}
	if zmm := q4RowsMode&q4RowsZMM != 0; zmm != (useVNNI && !zen4) {
		t.Errorf("decode mode %d: 512-bit variant %v on %s family %d (VNNI %v)", q4RowsMode, zmm, vendor, family, useVNNI)
	}
	if amd := vendor == "AuthenticAMD" && useVNNI && !zen4; amdZMM != amd {
		t.Errorf("amdZMM %v on %s family %d (VNNI %v)", amdZMM, vendor, family, useVNNI)
	}
}
