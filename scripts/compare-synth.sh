#!/usr/bin/env bash
# Compare sluice with llama.cpp at real shapes on synthetic models, back to
# back, alternating runs so that machine noise hits both engines alike.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/compare-synth.sh [ROUNDS] [LIKE] [LAYERS...]
#
# `sluice synth --like LIKE --layers L --route router --gguf` writes each
# model twice, as a sluice pack and as a GGUF with the same weights and
# routers (4-bit, Q4_0), under $SYNTH_DIR (default: a temporary directory,
# removed at the end; each 4-layer qwen3-30b-a3b model takes about 3.5 GB).
# For every depth L (default 4 and 8) it runs `llama-bench -t 2 -p 512 -n
# 128` and `sluice bench --prompt 512 --gen 128 --threads 2`, then the
# decode after 512 tokens of context (`-p 0 -n 128 -d 512`, `--depth 512`),
# and prints the medians. The first and last depths then give a layer's
# decode time as the difference of the token times over the difference of
# the depths (what a deeper model adds per layer, without the LM head and
# embedding), against the bound of the memory's read bandwidth (sluice
# bench --membw) over the bytes a layer reads.
#
# THREADS (default 2) sets both engines' thread count. llama.cpp is built
# outside this repository from its public source; this script only runs the
# binary it is given.
#
# On a GPU (DEVICE=cuda): llama-bench runs with every layer offloaded and
# flash attention (-ngl 99 -fa 1), sluice with --device cuda, the context
# test at DEPTH tokens (default 512), and there is no per-layer line (the
# memory bandwidth measured is the host's). SLUICE names a sluice binary
# to run instead of building one (a machine without Go), SYNTH_ARGS adds
# synth flags (for example "--experts 64", so that a DeepSeek-V3 layer
# fits), PYTHON the Python to use (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
rounds=${1:-3}
threads=${THREADS:-2}
like=${2:-qwen3-30b-a3b}
shift $(($# > 2 ? 2 : $#))
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(4 8)
depth=${DEPTH:-512}
py=${PYTHON:-python3}
work=$(mktemp -d)
synth=${SYNTH_DIR:-$work/models}
trap 'rm -rf "$work"' EXIT
if [ -n "${SLUICE:-}" ]; then
  cp "$SLUICE" "$work/sluice"
else
  go build -o "$work/sluice" ./cmd/sluice
fi
lflags=(-t "$threads")
sflags=(--device cpu --threads "$threads")
if [ "${DEVICE:-cpu}" = cuda ]; then
  lflags+=(-ngl 99 -fa 1)
  sflags=(--device cuda)
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
llama() {
  local out=$1
  shift
  "$LLAMA_BENCH" -m "$synth/$like-$L.gguf" "${lflags[@]}" -r 1 -o json "$@" 2>/dev/null >"$work/l.json"
  "$py" - "$work/l.json" "$out" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = "pp" if r["n_prompt"] else "tg"
    open(sys.argv[2] + kind, "a").write("%s\n" % r["avg_ts"])
PY
}
sluice() {
  local out=$1
  shift
  "$work/sluice" bench -m "$synth/$like-$L" --prompt 512 --gen 128 "${sflags[@]}" --repeat 1 --json "$@" >"$work/s.json"
  "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); open(sys.argv[2]+"pp","a").write("%s\n" % d["prefill_tok_s"]); open(sys.argv[2]+"tg","a").write("%s\n" % d["decode_tok_s"])' "$work/s.json" "$out"
}
printf '%-22s %11s %11s %11s %11s %11s %11s %8s %8s %8s\n' model llama_pp512 sluice_pp512 llama_tg128 sluice_tg128 "llama_tg@$depth" "sluice_tg@$depth" pp_ratio tg_ratio "tg@$depth"
for L in "${depths[@]}"; do
  if [ ! -f "$synth/$like-$L.gguf" ]; then
    mkdir -p "$synth"
    # shellcheck disable=SC2086 # SYNTH_ARGS is a list of flags
    "$work/sluice" synth --like "$like" --layers "$L" --route router ${SYNTH_ARGS:-} --out "$synth/$like-$L" --gguf "$synth/$like-$L.gguf" 2>/dev/null
  fi
  rm -f "$work"/[ls][0d]*
  for r in $(seq "$rounds"); do
    llama "$work/l0" -p 512 -n 128
    sluice "$work/s0"
    llama "$work/ld" -p 0 -n 128 -d "$depth"
    sluice "$work/sd" --depth "$depth"
  done
  lp=$(median <"$work/l0pp"); lt=$(median <"$work/l0tg"); ld=$(median <"$work/ldtg")
  sp=$(median <"$work/s0pp"); st=$(median <"$work/s0tg"); sd=$(median <"$work/sdtg")
  echo "$L $lt $st $ld $sd" >>"$work/tg"
  awk -v m="$like-$L" -v lp="$lp" -v sp="$sp" -v lt="$lt" -v st="$st" -v ld="$ld" -v sd="$sd" \
    'BEGIN {printf "%-22s %11.1f %11.1f %11.2f %11.2f %11.2f %11.2f %8.2f %8.2f %8.2f\n", m, lp, sp, lt, st, ld, sd, sp / lp, st / lt, sd / ld}'
done
if [ ${#depths[@]} -gt 1 ] && [ "${DEVICE:-cpu}" != cuda ]; then
  L=${depths[0]}
  "$work/sluice" bench -m "$synth/$like-$L" --prompt 1 --gen 2 --repeat 1 --device cpu --threads "$threads" --membw --json >"$work/m.json"
  "$py" - "$work/tg" "$work/m.json" "$synth/$like-$L.gguf" <<'PY'
import json, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
(l0, *a), (l1, *b) = rows[0], rows[-1]
lim = json.load(open(sys.argv[2]))["decode_limit"]
bw = lim["bandwidth_gb_s"]
print("per layer (%d vs %d layers), ms: memory %.1f GB/s; a layer reads %.1f MB in sluice's q4 (bound %.3f ms), %.1f MB in Q4_0 (bound %.3f ms)" % (
    l1, l0, bw, lim["layer_mb"], lim["layer_mb"] / bw, lim["layer_mb_q4_0"], lim["layer_mb_q4_0"] / bw))
for i, n in enumerate(["llama tg128", "sluice tg128", "llama tg@512", "sluice tg@512"]):
    ms = (1000 / b[i] - 1000 / a[i]) / (l1 - l0)
    bound = (lim["layer_mb_q4_0"] if n.startswith("llama") else lim["layer_mb"]) / bw
    print("  %-14s %.3f ms/layer  (%.0f%% of its bandwidth bound)" % (n, ms, 100 * bound / ms))
PY
fi
