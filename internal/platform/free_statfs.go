//go:build linux || darwin

package platform

import "syscall"

// FreeBytes is the space available to this user on dir's file system, or
// -1 when it cannot be told: what a download or a writer of GBs checks
// before it starts, rather than filling the disk.
func FreeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(uint64(st.Bavail) * uint64(st.Bsize))
}
