package experts

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicelm/sluice/internal/platform"
)

// The stream's reads go one of two ways. With uncached reads on Linux they
// are submitted to the kernel by the forward's own goroutine as it asks for
// them and collected by it as it looks for finished ones (platform.Reads):
// no goroutine blocks in a read, so none holds one of the runtime's
// scheduler slots while the disk works (see platform.Reads for what that
// cost). Elsewhere, and for the page cache, whose reads would block in the
// submission, Options.Readers goroutines (Stream.reader) take requests from
// channels and block in pread. Both keep at most Readers reads in flight,
// demand misses before prefetches, and prefetches to preLimit of them.

// ReadSpin is how long a step that waits for a read polls for it before
// it sleeps in the kernel, and the patience (kernels.Pool.SetPatience) the
// engine gives the compute's idle workers while experts stream this way:
// a thread that sleeps through a read is woken by the scheduler, and on a
// virtual machine whose idle processors halt that takes hundreds of
// microseconds, against reads of 0.7 to 3 ms (a 2.65 MB record on the
// 2-core development VM). There, at a 10% pool of the 48-layer
// qwen3-30b-a3b synth, a runtime trace of the decode had the second
// thread waiting to run for 7% of the time and both threads asleep on
// reads for 17% with no polling; polling both, the cores were busy 1.99
// of the time against 1.79 without (1.76 with reader goroutines), and
// the decode ran 1.02x its limit against 1.25x with the goroutines
// (README, "Reads that hold no thread").
const ReadSpin = 3 * time.Millisecond

// KernelReads reports whether the stream's reads go through the kernel's
// asynchronous I/O rather than reader goroutines (kernelReads).
func (s *Stream) KernelReads() bool { return s.kr != nil }

// kernelReads is the queue of requests not yet submitted to platform.Reads
// and of the completions not yet taken.
type kernelReads struct {
	r       *platform.Reads
	queue   [2][]request // demand [0] and prefetch [1] requests waiting, from head
	head    [2]int
	out     [2]int // submitted and not yet collected, by kind
	done    []completion
	doneH   int
	scratch []platform.ReadDone
	refused bool  // a submission was refused (said once)
	err     error // a failure to collect in Poll, for the next wait
}

// Poll collects the reads the kernel has finished and submits the queued
// requests they leave room for, without waiting; it does nothing where
// the stream's reads are not the kernel's. The forward's goroutine calls
// it while it computes, between its calls into the stream (the engine
// sets it as the compute pool's idle hook, kernels.Pool.SetIdle): without
// it a read that finishes during a layer's compute leaves its place empty
// until the forward next calls the stream, and the read's end is counted
// only then, which inflates the time the stream's statistics see reads in
// flight and so understates the disk's bandwidth to adaptReaders.
//
// It must not block the compute: it submits only while the kernel takes
// the reads (a refused one would be read right there, and once one was,
// the queue waits for the forward's own calls), and where the kernel's
// ring cannot be read it costs a zero-timeout io_getevents.
func (s *Stream) Poll() {
	k := s.kr
	if k == nil || k.err != nil || s.stop == nil {
		return
	}
	k.err = s.collect(false, !k.refused)
}

// openReads starts the kernel's asynchronous reads for the stream when its
// reads are uncached and no reader has work to do after a read (tiling a
// record, widening a low-bit one); nil otherwise, and then the reader
// goroutines read.
func (s *Stream) openReads() *kernelReads {
	if !s.direct || s.o.Tile || (s.low != nil && s.o.widen) || s.o.goroutineReads {
		return nil
	}
	r, err := platform.NewReads(s.o.Readers)
	if err != nil {
		if !errors.Is(err, errors.ErrUnsupported) {
			fmt.Fprintf(s.o.Log, "experts: %v; reading in %d goroutines\n", err, s.o.Readers)
		}
		return nil
	}
	return &kernelReads{r: r}
}

// send queues request r, a prefetch or a demand miss, for the readers.
func (s *Stream) send(r request, pre bool) {
	k := s.kr
	if k == nil {
		if pre {
			s.pre <- r
		} else {
			s.demand <- r
		}
		return
	}
	i := 0
	if pre {
		i = 1
	}
	k.queue[i] = append(k.queue[i], r)
	s.submit(false)
}

// submit hands queued requests to the kernel while fewer than Readers are
// in flight: demand misses first, prefetches while fewer than preLimit of
// those are. force submits one prefetch past preLimit when nothing is in
// flight, so that a step waiting on a prefetched record cannot wait
// forever whatever preLimit is (it is at least 1 today). A request whose slot
// was cancelled completes as cancelled without a read; one the kernel
// refuses is read here, blocking.
func (s *Stream) submit(force bool) {
	k := s.kr
	for k.out[0]+k.out[1] < s.o.Readers {
		i := 0
		if k.head[0] == len(k.queue[0]) {
			if k.head[1] == len(k.queue[1]) {
				break
			}
			if k.out[1] >= int(s.preLimit.Load()) && !(force && k.out[0]+k.out[1] == 0) {
				break
			}
			i = 1
		}
		r := k.queue[i][k.head[i]]
		switch k.head[i]++; {
		case k.head[i] == len(k.queue[i]):
			k.queue[i], k.head[i] = k.queue[i][:0], 0
		case k.head[i] >= 64 && 2*k.head[i] >= len(k.queue[i]):
			// A queue that never empties (prefetches held back by
			// preLimit) must not grow without end.
			n := copy(k.queue[i], k.queue[i][k.head[i]:])
			k.queue[i], k.head[i] = k.queue[i][:n], 0
		}
		sl := &s.slots[r.slot]
		if sl.cancel.Load() {
			k.done = append(k.done, completion{slot: r.slot, cancelled: true})
			continue
		}
		f, buf := s.readInto(sl, r.low)
		s.stats.readStart()
		tag := uint64(r.slot)<<2 | uint64(i)
		if r.low {
			tag |= 2
		}
		if err := k.r.Submit(f, buf, r.off, tag); err != nil {
			if !k.refused {
				k.refused = true
				fmt.Fprintf(s.o.Log, "experts: %v; reading on the forward's thread when the kernel refuses a read\n", err)
			}
			err = preadFull(f, buf, r.off)
			s.stats.readEnd(int64(len(buf)))
			k.done = append(k.done, completion{slot: r.slot, err: err})
			continue
		}
		k.out[i]++
	}
}

// collect moves the reads the kernel has finished to the completions,
// waiting for one when wait is set, and submits what they leave room for
// when submit is set.
func (s *Stream) collect(wait, submit bool) error {
	k := s.kr
	var err error
	if k.scratch, err = k.r.Collect(k.scratch[:0], wait); err != nil {
		return fmt.Errorf("expert stream: %v", err)
	}
	for _, d := range k.scratch {
		si, low, i := int32(d.Tag>>2), d.Tag&2 != 0, int(d.Tag&1)
		n := s.recStride(low)
		s.stats.readEnd(n)
		k.out[i]--
		if d.Err == nil && d.N < n {
			// A short read (the file ends, or a filesystem that reads
			// in parts): the rest as pread would, here.
			f, buf := s.readInto(&s.slots[si], low)
			d.Err = preadFull(f, buf[d.N:], int64(s.slots[si].rec)*n+d.N)
		}
		k.done = append(k.done, completion{slot: si, err: d.Err})
	}
	if submit {
		s.submit(false)
	}
	return nil
}

// finished returns a finished read, waiting for one when wait is set;
// false when none has finished (and wait is not set).
func (s *Stream) finished(wait bool) (completion, bool, error) {
	k := s.kr
	if k == nil {
		if wait {
			return <-s.done, true, nil
		}
		select {
		case c := <-s.done:
			return c, true, nil
		default:
			return completion{}, false, nil
		}
	}
	var t0 time.Time
	for k.doneH == len(k.done) {
		if k.err != nil {
			// Poll failed to collect: what it did collect is served
			// first.
			return completion{}, false, k.err
		}
		k.done, k.doneH = k.done[:0], 0
		if err := s.collect(false, true); err != nil {
			return completion{}, false, err
		}
		if len(k.done) > 0 || !wait {
			break
		}
		if k.out[0]+k.out[1] == 0 {
			if s.submit(true); k.out[0]+k.out[1] == 0 && len(k.done) == 0 {
				return completion{}, false, fmt.Errorf("expert stream: waiting with no read in flight")
			}
			continue
		}
		if t0.IsZero() {
			t0 = time.Now()
		}
		if time.Since(t0) < ReadSpin {
			continue // poll the ring again
		}
		if err := s.collect(true, true); err != nil {
			return completion{}, false, err
		}
	}
	if k.doneH == len(k.done) {
		return completion{}, false, nil
	}
	c := k.done[k.doneH]
	k.doneH++
	return c, true, nil
}
