package platform

import (
	"testing"
	"time"
)

// TestParseStat reads steal and the total from a /proc/stat of a VM (the
// guest columns after steal left out of the total, as user counts them),
// and refuses lines it cannot read as that.
func TestParseStat(t *testing.T) {
	const stat = "cpu  3795774 792 1377661 4760882 1003117 0 15162 22710 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n"
	steal, total, ok := parseStat([]byte(stat))
	if !ok || steal != 22710 || total != 10976098 {
		t.Errorf("parseStat = %d, %d, %v; want 22710, 10976098, true", steal, total, ok)
	}
	for _, bad := range []string{
		"",
		"cpu  1 2 3 4 5 6 7\n", // no steal column
		"cpu0 1 2 3 4 5 6 7 8 9 10\n",
		"intr 1 2 3 4 5 6 7 8 9\n",
		"cpu  1 2 3 x 5 6 7 8 9 10\n",
		"cpu  1 2 3 4 5 6 7 -8 9 10\n",
	} {
		if s, tot, ok := parseStat([]byte(bad)); ok {
			t.Errorf("parseStat(%q) = %d, %d, true; want it refused", bad, s, tot)
		}
	}
}

// TestMachineCPU: the machine's total grows with the time passed (idle
// counts too), and steal never exceeds it.
func TestMachineCPU(t *testing.T) {
	s0, t0, ok := MachineCPU()
	if !ok {
		t.Fatal("no /proc/stat figures on Linux")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		time.Sleep(20 * time.Millisecond)
		s1, t1, ok := MachineCPU()
		if !ok || t1 < t0 || s1 < s0 || s1 > t1 {
			t.Fatalf("steal %d → %d, total %d → %d (ok %v)", s0, s1, t0, t1, ok)
		}
		if t1 > t0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("total stayed at %d for 5 s", t0)
		}
	}
}
