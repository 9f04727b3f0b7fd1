//go:build !linux && !darwin

package platform

// FreeBytes cannot tell the free space here; the writer finds out.
func FreeBytes(string) int64 { return -1 }
