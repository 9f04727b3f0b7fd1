package platform

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// available counts free, speculative and purgeable pages (what macOS can
// hand out without paging anything of ours), as vm_stat reports them,
// capped by hw.memsize.
func available() (int64, string) {
	total, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return -1, fmt.Sprintf("sysctl hw.memsize: %v", err)
	}
	page, err := unix.SysctlUint32("hw.pagesize")
	if err != nil {
		return -1, fmt.Sprintf("sysctl hw.pagesize: %v", err)
	}
	var pages uint64
	for _, k := range []string{"vm.page_free_count", "vm.page_speculative_count", "vm.page_purgeable_count"} {
		n, err := unix.SysctlUint32(k)
		if err != nil {
			return -1, fmt.Sprintf("sysctl %s: %v", k, err)
		}
		pages += uint64(n)
	}
	free := min(pages*uint64(page), total)
	return int64(free), fmt.Sprintf("free+speculative+purgeable pages %s of %s", mib(int64(free)), mib(int64(total)))
}
