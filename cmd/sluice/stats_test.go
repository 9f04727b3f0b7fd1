package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/engine"
)

// TestStatsGPUPool: run's JSON stats and its summary carry the GPU pool's
// figures when a generation had them, and neither mentions a pool when it
// had none.
func TestStatsGPUPool(t *testing.T) {
	s := engine.Stats{GeneratedTokens: 11, GPUPool: &engine.GPUPoolStats{Slots: 40, Hits: 90, Misses: 10, HitRate: 0.9,
		BytesCopied: 3e6, DecodeHitRate: 0.8, DecodeBytesCopied: 2e6, Prefetched: 7, PrefetchUsed: 5, PrefetchSkipped: 3,
		CopyWaitMS: 9, DecodeCopyWaitMS: 4}}
	b, err := json.Marshal(statsJSON(s, 1))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		GPUPool map[string]float64 `json:"gpu_pool"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.GPUPool["slots"] != 40 || got.GPUPool["decode_bytes_copied"] != 2e6 || got.GPUPool["prefetch_used"] != 5 || got.GPUPool["decode_copy_wait_ms"] != 4 {
		t.Errorf("gpu_pool in the stats: %s", b)
	}
	e := &engine.Engine{ExpertPlan: "plan"}
	if sum := expertSummary(e, s); !strings.Contains(sum, "gpu pool: 40 slots, hit rate 90.0% (decode 80.0%), 0.20 MB copied and 0.40 ms waited for copies per generated token; lookahead 7 copied, 5 used, 3 held back") {
		t.Errorf("summary %q", sum)
	}
	s.GPUPool.LowCopies = 6 // --miss-bits
	if sum := expertSummary(e, s); !strings.HasSuffix(sum, "5 used, 3 held back; 6 copies at low bits (lossy)") {
		t.Errorf("summary with low-bit copies %q", sum)
	}
	s.GPUPool.CPUComputed, s.GPUPool.CPUExpertMS = 9, 0.146 // --gpu-cpu-share
	if sum := expertSummary(e, s); !strings.HasSuffix(sum, "3 held back; 9 misses computed on the CPU (0.15 ms each); 6 copies at low bits (lossy)") {
		t.Errorf("summary with CPU misses %q", sum)
	}
	if b, _ := json.Marshal(statsJSON(s, 1)); !strings.Contains(string(b), `"cpu_computed":9,"cpu_ms_per_expert":0.146`) {
		t.Errorf("gpu_pool with CPU misses: %s", b)
	}
	s.GPUPool.CPUComputed, s.GPUPool.CPUExpertMS = 0, 0
	if b, _ := json.Marshal(statsJSON(s, 1)); !strings.Contains(string(b), `"low_copies":6`) {
		t.Errorf("gpu_pool with low-bit copies: %s", b)
	}
	s.GPUPool = nil
	if b, _ := json.Marshal(statsJSON(s, 1)); strings.Contains(string(b), "gpu_pool") || strings.Contains(expertSummary(e, s), "gpu pool") {
		t.Errorf("no pool, yet %s / %q", b, expertSummary(e, s))
	}
}
