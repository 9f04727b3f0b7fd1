#!/usr/bin/env bash
# Runs sluice's windows/amd64 build under Wine: the platform, kernel and
# expert-streaming tests and the per-block model tests, and the binary
# itself (run, pack, streamed run through FILE_FLAG_NO_BUFFERING reads,
# serve, Ctrl-C), comparing its tokens and packed files with the Linux
# build's. Wine is not Windows: it checks that the Windows code paths run
# and compute the same bits, not how they behave on NTFS or real hardware.
#
# Needs wine (Debian: wine64) and mingw-w64 (gcc-mingw-w64-x86-64); without
# them it says so in one line and exits 0. Go 1.22 and later need
# ProcessPrng from bcryptprimitives.dll, which Wine 8 lacks: the script
# builds a stand-in from scripts/wine/processprng.c into a fresh Wine prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
for tool in wine wineboot x86_64-w64-mingw32-gcc curl; do
  if ! command -v $tool >/dev/null; then
    echo "wine-test: skipped: $tool not found (apt-get install wine64 gcc-mingw-w64-x86-64 curl)"
    exit 0
  fi
done
root=$PWD
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  WINEPREFIX="$work/prefix" wineserver -k 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export WINEPREFIX="$work/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree=;mshtml="
step() { echo "wine-test: [${SECONDS}s] $*"; }

step "$(wine --version), prefix $WINEPREFIX"
wineboot -i >/dev/null 2>&1
sys32="$WINEPREFIX/drive_c/windows/system32"
test -d "$sys32" || { echo "wine-test: wineboot made no $sys32" >&2; exit 1; }
# The runtime loads bcryptprimitives.dll from system32 only.
x86_64-w64-mingw32-gcc -O2 -shared -nostartfiles -Wl,--entry,DllMain \
  -o "$sys32/bcryptprimitives.dll" scripts/wine/processprng.c -ladvapi32
step "prefix ready, ProcessPrng stand-in built"

# Wine 8 answers FileDispositionInformationEx with STATUS_NOT_IMPLEMENTED,
# which Go's os.RemoveAll does not take as a cue for its older way of
# deleting, so every t.TempDir cleanup would fail. The test binaries (never
# sluice.exe) get a file, through -overlay so that it is in no other build,
# that turns Go's own fallback on.
cat >"$work/wine_fallback.go" <<'EOF'
package platform

import _ "unsafe"

//go:linkname wineDeleteatFallback internal/syscall/windows.TestDeleteatFallback
var wineDeleteatFallback bool

func init() { wineDeleteatFallback = true }
EOF
printf '{"Replace":{"%s":"%s"}}\n' "$root/internal/platform/zz_wine_fallback_windows.go" "$work/wine_fallback.go" >"$work/overlay.json"

wintest() { # package, then test flags
  local pkg=$1
  shift
  GOOS=windows GOARCH=amd64 CGO_ENABLED=0 go test -c -overlay "$work/overlay.json" -ldflags=-checklinkname=0 \
    -o "$work/$pkg.test.exe" "./internal/$pkg"
  step "internal/$pkg tests $*"
  # From the package directory, so that ../shared resolves (Wine maps / as Z:).
  (cd "internal/$pkg" && wine "$work/$pkg.test.exe" "$@")
}
wintest platform -test.v
# TestPoolLateWorkerWake is left out: it stalls workers with sleeps of
# 150-500 us, which take milliseconds under Wine, so its 4000 operations
# need about 75 s there and trip its one-minute hang limit without hanging.
wintest kernels -test.skip TestPoolLateWorkerWake
wintest model -test.run 'TestLayers|TestRoute|TestBadInput|TestStateCopy|TestMTPErrors|TestDecodeAllocs'
wintest experts -test.short -test.run 'TestGreedyAnyPool|TestDecodeAllocs|TestSmallPoolErrors|TestBufferedFallback|TestLowBits|TestStreamDelivers'

# The binary, against the Linux build of the same tree.
GOOS=windows GOARCH=amd64 CGO_ENABLED=0 go build -o "$work/sluice.exe" ./cmd/sluice
CGO_ENABLED=0 go build -tags nocuda -o "$work/sluice" ./cmd/sluice
tokens() { sed -n 's/.*"tokens":\(\[[0-9,]*\]\).*/\1/p' "$1"; }
same() { # what, linux file, windows file
  if [ "$(tokens "$2")" != "$(tokens "$3")" ] || [ -z "$(tokens "$2")" ]; then
    echo "wine-test: $1: windows tokens differ from linux's" >&2
    echo "linux:   $(tokens "$2")" >&2
    echo "windows: $(tokens "$3")" >&2
    exit 1
  fi
  step "$1: same $(tokens "$2" | tr -cd , | wc -c | awk '{print $1+1}') tokens as linux"
}
cd "$work"
prompt="def fibonacci(n):"
./sluice run -p "$prompt" -n 32 --temp 0 --json >lin-run.json 2>/dev/null
wine ./sluice.exe run -p "$prompt" -n 32 --temp 0 --json >win-run.json
same "run, bundled model, greedy" lin-run.json win-run.json
./sluice run -p "$prompt" -n 32 --seed 7 --json >lin-seed.json 2>/dev/null
wine ./sluice.exe run -p "$prompt" -n 32 --seed 7 --json >win-seed.json
same "run, bundled model, sampled with --seed 7" lin-seed.json win-seed.json

src="$root/../shared/models/tiny-qwen3-moe"
./sluice pack "$src" lin-pack >/dev/null 2>&1
wine ./sluice.exe pack "$src" win-pack >/dev/null
diff -r lin-pack win-pack
step "pack tiny-qwen3-moe: the same files, byte for byte"
# 2 MiB is 17% of the experts: misses are read from the store.
./sluice run -m lin-pack -p "The capital of France is" -n 24 --temp 0 --pool-mb 2 --json >lin-pool.json 2>/dev/null
wine ./sluice.exe run -m win-pack -p "The capital of France is" -n 24 --temp 0 --pool-mb 2 --json >win-pool.json
same "run -m (packed on windows) --pool-mb 2" lin-pool.json win-pool.json
wine ./sluice.exe run -m win-pack -p "The capital of France is" -n 4 --temp 0 --pool-mb 2 2>win-pool.err >/dev/null
grep -q 'FILE_FLAG_NO_BUFFERING' win-pool.err || {
  echo "wine-test: the streamed run did not read through FILE_FLAG_NO_BUFFERING:" >&2
  cat win-pool.err >&2
  exit 1
}
step "$(grep -o 'pool [0-9]* slots.*' win-pool.err | head -1)"

# serve: one request from Linux, then Ctrl-C (Wine turns SIGINT into a
# console CTRL_C_EVENT) must shut it down cleanly.
port=$((20000 + RANDOM % 20000))
wine ./sluice.exe serve --addr 127.0.0.1:$port >serve.out 2>serve.err &
pids+=($!)
for _ in $(seq 1 120); do
  curl -s -o /dev/null "http://127.0.0.1:$port/v1/models" && break
  sleep 0.5
done
req='{"messages":[{"role":"user","content":"Write a haiku about rivers."}],"max_tokens":16,"temperature":0}'
if ! curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$req" >serve.json; then
  echo "wine-test: serve did not answer on port $port" >&2
  cat serve.err >&2
  exit 1
fi
grep -q '"completion_tokens":16' serve.json || { echo "wine-test: unexpected serve reply: $(cat serve.json)" >&2; exit 1; }
step "serve answered a chat completion from Linux's curl"
kill -INT "${pids[0]}"
rc=0
wait "${pids[0]}" || rc=$?
pids=()
if [ $rc -ne 0 ] || ! grep -q 'sluice serve: stopped' serve.err; then
  echo "wine-test: serve after Ctrl-C: exit $rc" >&2
  cat serve.err >&2
  exit 1
fi
step "serve stopped cleanly on Ctrl-C"
# Interrupted mid-generation: once text has appeared, long before the
# context fills.
wine ./sluice.exe run -p "Once upon a time" -n 100000 --ignore-eos >run-int.out 2>run-int.err &
p=$!
pids+=($p)
for _ in $(seq 1 100); do
  [ -s run-int.out ] && break
  sleep 0.1
done
kill -INT $p
rc=0
wait $p || rc=$?
pids=()
if [ $rc -ne 130 ] || ! grep -q 'interrupted' run-int.err; then
  echo "wine-test: run after Ctrl-C: exit $rc, want 130" >&2
  cat run-int.err >&2
  exit 1
fi
step "run stopped with exit 130 on Ctrl-C"
step "passed"
