package main

import (
	"fmt"
	"os"
	"syscall"
)

// chunk is how much is mapped and locked at a time, so that a failure
// says how far it got.
const chunk = 256 << 20

// hold maps n bytes of anonymous memory and locks them resident.
func hold(n int64) (release func(), err error) {
	// Best effort: without it the OOM killer would pick the holder, the
	// largest process, and lift the cap.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		fmt.Fprintf(os.Stderr, "memhold: the OOM killer may pick this process: %v\n", err)
	}
	var maps [][]byte
	release = func() {
		for _, m := range maps {
			syscall.Munlock(m)
			syscall.Munmap(m)
		}
	}
	for done := int64(0); done < n; {
		sz := min(n-done, chunk)
		m, err := syscall.Mmap(-1, 0, int(sz), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			release()
			return nil, fmt.Errorf("map %d bytes after %d: %v", sz, done, err)
		}
		maps = append(maps, m)
		if err := syscall.Mlock(m); err != nil {
			release()
			return nil, fmt.Errorf("lock %d bytes after %d: %v (needs root, CAP_IPC_LOCK or RLIMIT_MEMLOCK; or the memory is not there)", sz, done, err)
		}
		done += sz
	}
	return release, nil
}
