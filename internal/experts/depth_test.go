package experts

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/format"
)

// BenchmarkQueueDepth measures O_DIRECT random-record read bandwidth of this
// machine's disk at several queue depths and record sizes, the measurement
// behind DefaultReaders. It writes a 2 GiB file (larger than any page cache
// it could be served from after O_DIRECT) under SLUICE_BENCH_DIR or the
// temp dir. Run: go test ./internal/experts -run x -bench QueueDepth -benchtime 1x
// With SLUICE_BENCH_STORE=DIR (a packed model) it reads DIR's expert store
// instead, at its record size.
func BenchmarkQueueDepth(b *testing.B) {
	strides := []int64{32 << 10, 2 << 20}
	var path string
	if dir := os.Getenv("SLUICE_BENCH_STORE"); dir != "" {
		man, err := format.ReadManifest(dir)
		if err != nil {
			b.Fatal(err)
		}
		st := man.Stores[0]
		path, strides = filepath.Join(dir, st.File), []int64{st.Stride}
	} else {
		path = writeDepthFile(b)
	}
	for _, stride := range strides {
		for _, qd := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("record%dKiB/depth%d", stride>>10, qd), func(b *testing.B) {
				var bw float64
				for b.Loop() {
					var err error
					if bw, err = MeasureRead(path, stride, qd, 2*time.Second); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(bw/1e6, "MB/s")
			})
		}
	}
}

// writeDepthFile writes BenchmarkQueueDepth's 2 GiB file under
// SLUICE_BENCH_DIR or the temp dir, removed when the benchmark ends.
func writeDepthFile(b *testing.B) string {
	dir := os.Getenv("SLUICE_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	path := filepath.Join(dir, "depth.bin")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(path) })
	chunk := make([]byte, 8<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for written := 0; written < 2<<30; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}
