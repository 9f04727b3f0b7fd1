//go:build amd64

package kernels

// cpuid executes CPUID with EAX = leaf and ECX = sub.
//
//go:noescape
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

// x86Model returns the CPU's vendor string ("AuthenticAMD",
// "GenuineIntel", ...) and its display family and model, as the kernel's
// /proc/cpuinfo reports them ("cpu family", "model"): x/sys/cpu gives
// features but not these.
func x86Model() (vendor string, family, model uint32) {
	_, b, c, d := cpuid(0, 0)
	v := make([]byte, 0, 12)
	for _, r := range [3]uint32{b, d, c} {
		v = append(v, byte(r), byte(r>>8), byte(r>>16), byte(r>>24))
	}
	a, _, _, _ := cpuid(1, 0)
	family = a >> 8 & 0xf
	model = a >> 4 & 0xf
	if family == 0xf {
		family += a >> 20 & 0xff
	}
	if family == 0x6 || family >= 0xf {
		model |= (a >> 16 & 0xf) << 4
	}
	return string(v), family, model
}

// halfWideZMM reports a CPU that runs 512-bit operations as two 256-bit
// halves: AMD's family 25 (0x19) with AVX-512, i.e. Zen 4 (Zen 3, the
// same family, has no AVX-512 and never asks).
func halfWideZMM() bool {
	v, f, _ := x86Model()
	return v == "AuthenticAMD" && f == 0x19
}

// amdCPU reports an AMD CPU.
func amdCPU() bool {
	v, _, _ := x86Model()
	return v == "AuthenticAMD"
}
