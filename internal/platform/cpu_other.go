//go:build !unix && !windows

package platform

import "time"

func cpuTime() (user, sys time.Duration, ok bool) { return 0, 0, false }
