package experts

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicelm/sluice/internal/platform"
)

// MeasureRead reads random whole records of stride bytes from path with
// uncached reads (buffered when refused) at queue depth qd for about d, and
// returns the bandwidth in bytes per second: the physical limit that the
// pool's miss reads are compared with, measured with the same record size
// and depth.
func MeasureRead(path string, stride int64, qd int, d time.Duration) (float64, error) {
	f, _, _, err := openRecords(path, false)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	n := fi.Size() / stride
	if n < 1 {
		return 0, fmt.Errorf("%s holds no whole record of %d bytes", path, stride)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	var firstErr error
	t0 := time.Now()
	for w := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBuf(stride)
			defer platform.Free(buf)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var got int64
			for time.Since(t0) < d {
				if err := preadFull(f, buf, rng.Int64N(n)*stride); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				got += stride
			}
			mu.Lock()
			total += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(t0).Seconds(), nil
}

// StorePath is the main expert store's file.
func (s *Stream) StorePath() string { return s.file.Name() }
