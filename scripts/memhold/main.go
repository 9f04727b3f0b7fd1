// Command memhold takes memory away from everything else on the machine:
// it allocates and locks (mlock) a given number of bytes, says so, and
// holds them until it is killed. scripts/compare-cap.sh starts it to run
// an engine with only so much RAM left, the same way for every engine,
// without touching the system's cgroups.
//
//	memhold BYTES
//
// It prints "locked N bytes" on stdout once all of them are resident, or
// exits with an error (and releases what it took) if the kernel will not
// lock that many. Locking needs root, CAP_IPC_LOCK or a large enough
// RLIMIT_MEMLOCK. It asks the kernel's OOM killer to spare it (an engine
// that overruns what is left should be the one killed, not the cap).
// Linux only.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: memhold BYTES")
		os.Exit(2)
	}
	n, err := strconv.ParseInt(os.Args[1], 10, 64)
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "memhold: %q: want a positive number of bytes\n", os.Args[1])
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	release, err := hold(n)
	if err != nil {
		fmt.Fprintf(os.Stderr, "memhold: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("locked %d bytes\n", n)
	<-sig
	release()
}
