package experts

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkQueueDepth measures O_DIRECT random-record read bandwidth of this
// machine's disk at several queue depths and record sizes, the measurement
// behind DefaultReaders. It writes a 2 GiB file (larger than any page cache
// it could be served from after O_DIRECT) under SLUICE_BENCH_DIR or the
// temp dir. Run: go test ./internal/experts -run x -bench QueueDepth -benchtime 1x
func BenchmarkQueueDepth(b *testing.B) {
	dir := os.Getenv("SLUICE_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	path := filepath.Join(dir, "depth.bin")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(path)
	chunk := make([]byte, 8<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for written := 0; written < 2<<30; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	f.Sync()
	f.Close()
	for _, stride := range []int64{32 << 10, 2 << 20} {
		for _, qd := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("record%dKiB/depth%d", stride>>10, qd), func(b *testing.B) {
				var bw float64
				for b.Loop() {
					if bw, err = MeasureRead(path, stride, qd, 2*time.Second); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(bw/1e6, "MB/s")
			})
		}
	}
}
