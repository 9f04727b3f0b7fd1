package platform

import (
	"time"

	"golang.org/x/sys/windows"
)

func cpuTime() (user, sys time.Duration, ok bool) {
	var created, exited, kernel, usr windows.Filetime
	if windows.GetProcessTimes(windows.CurrentProcess(), &created, &exited, &kernel, &usr) != nil {
		return 0, 0, false
	}
	// Filetimes count 100 ns ticks.
	ticks := func(f windows.Filetime) time.Duration {
		return time.Duration(uint64(f.HighDateTime)<<32|uint64(f.LowDateTime)) * 100
	}
	return ticks(usr), ticks(kernel), true
}
