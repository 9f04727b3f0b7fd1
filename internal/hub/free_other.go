//go:build !linux && !darwin

package hub

// freeBytes cannot tell the free space here; the download finds out.
func freeBytes(string) int64 { return -1 }
