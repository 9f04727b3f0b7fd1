package platform

import (
	"bytes"
	"os"
	"strconv"
)

func machineCPU() (steal, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	return parseStat(b)
}

// parseStat reads the machine-wide "cpu" line of /proc/stat: user, nice,
// system, idle, iowait, irq, softirq, steal, then guest time that user
// already counts. steal is the eighth field, total the sum of the first
// eight; a kernel too old to count steal (fewer than eight) is refused.
func parseStat(b []byte) (steal, total uint64, ok bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, 0, false
	}
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i == 7 {
			steal = v
		}
	}
	return steal, total, true
}
