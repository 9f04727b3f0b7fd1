package platform

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// available is the smaller of the cgroup's limit less its usage (v2
// memory.max, else v1 memory.limit_in_bytes) and MemAvailable.
func available() (int64, string) {
	best, src := int64(-1), "no MemAvailable in /proc/meminfo and no cgroup limit"
	if v, ok := readMeminfo("MemAvailable"); ok {
		best, src = v, fmt.Sprintf("MemAvailable %s", mib(v))
	}
	for _, p := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		lim, ok := readInt(p[0])
		if !ok || lim <= 0 || lim >= 1<<60 {
			continue // absent or "max" / unlimited
		}
		used, _ := readInt(p[1])
		if free := lim - used; best < 0 || free < best {
			best, src = free, fmt.Sprintf("cgroup limit %s (%s used)", mib(lim), mib(used))
		}
		break
	}
	return best, src
}

func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

func readMeminfo(key string) (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if ok && k == key {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				v, err := strconv.ParseInt(fs[0], 10, 64)
				return v << 10, err == nil
			}
		}
	}
	return 0, false
}
