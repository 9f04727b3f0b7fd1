//go:build !linux

package platform

func machineCPU() (steal, total uint64, ok bool) { return 0, 0, false }
