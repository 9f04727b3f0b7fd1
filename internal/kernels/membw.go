package kernels

import (
	"sync"
	"time"
)

// ReadBandwidth measures how fast threads goroutines together read buf
// (each its own contiguous share, every byte once per pass, passes times
// after one untimed pass), in bytes per second. buf should be several times
// the last-level cache, so that the figure is the memory's: it is the
// physical limit of a decode step, which reads each active weight once.
// It is 0, not a rate, when buf holds less than 256 bytes a thread or the
// passes took no time the clock could see (a coarse timer: Windows' under
// emulation ticks every few milliseconds).
func ReadBandwidth(buf []byte, threads, passes int) float64 {
	threads = max(threads, 1)
	n := readPar(buf, threads, readBytes) // the untimed pass
	if n == 0 {
		return 0
	}
	var total time.Duration
	for range max(passes, 1) {
		t0 := time.Now()
		readPar(buf, threads, readBytes)
		total += time.Since(t0)
	}
	if total <= 0 {
		return 0
	}
	return float64(n*max(passes, 1)) / total.Seconds()
}

// readPar reads buf once with read (readBytes, or another reader to set
// against it) on threads goroutines, each its own contiguous share
// (len(buf)/threads rounded down to 256 bytes; a tail past the last share
// is not read), waits for them, and returns the bytes read.
func readPar(buf []byte, threads int, read func([]byte) uint64) int {
	share := len(buf) / threads &^ 255
	if share == 0 {
		return 0
	}
	var wg sync.WaitGroup
	for i := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readSink.Add(read(buf[i*share : (i+1)*share]))
		}()
	}
	wg.Wait()
	return share * threads
}

// readSink keeps the sums alive so that no read is optimised away.
var readSink syncAdder

type syncAdder struct {
	mu sync.Mutex
	v  uint64
}

func (s *syncAdder) Add(v uint64) {
	s.mu.Lock()
	s.v += v
	s.mu.Unlock()
}

// readBytes sums b as uint64 words (len(b) a multiple of 256), with vector
// loads where available: a read at the speed the memory allows. It reads
// b's four quarters together, four streams of loads at once: one core
// reads that way up to a fifth faster than one stream at a time, whose
// hardware prefetch keeps fewer lines in flight (BenchmarkMemBWStreams),
// so that a single stream's figure would understate the memory's
// bandwidth and overstate a decode's share of it (BenchmarkQ4DecodeShare
// and the other benchmarks' plain reads read this way too).
func readBytes(b []byte) uint64 {
	if !useAVX2 || len(b) < 256 {
		return readGo(b)
	}
	n := len(b) / 1024 // blocks of 256 bytes in each quarter
	if n == 0 {
		return readAVX2(&b[0], len(b)/256)
	}
	q := 256 * n
	s := readAVX2x4(&b[0], &b[q], &b[2*q], &b[3*q], n)
	if rest := b[4*q:]; len(rest) >= 256 {
		s += readAVX2(&rest[0], len(rest)/256)
	}
	return s
}

// readGo is readBytes without vector loads.
func readGo(b []byte) uint64 {
	var s uint64
	for i := 0; i+8 <= len(b); i += 8 {
		s += uint64(b[i]) | uint64(b[i+7])<<56
	}
	return s
}
