/*
 * bcryptprimitives.dll with the one export Go's Windows runtime needs and
 * Wine 8 (Debian bookworm) lacks: ProcessPrng, which Go 1.22 and later call
 * at start-up for every random byte. It forwards to RtlGenRandom
 * (advapi32's SystemFunction036), which Wine has long implemented.
 * scripts/wine-test.sh builds it with mingw-w64 and puts it in the Wine
 * prefix's system32, where the runtime looks for it.
 */
#include <windows.h>

/* RtlGenRandom takes a ULONG length, so larger requests go in pieces. */
BOOLEAN WINAPI SystemFunction036(PVOID buf, ULONG len);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
	while (len > 0) {
		ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
		if (!SystemFunction036(data, n))
			return FALSE;
		data += n;
		len -= n;
	}
	return TRUE;
}

BOOL WINAPI DllMain(HINSTANCE inst, DWORD reason, LPVOID reserved)
{
	(void)inst; (void)reason; (void)reserved;
	return TRUE;
}
