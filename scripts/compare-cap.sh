#!/usr/bin/env bash
# Compare sluice with llama.cpp under a memory cap: each engine gets RAM
# for its dense weights plus a fraction CAP of its expert bytes, and the
# rest of the machine's memory is held away from it by scripts/memhold
# (allocated and mlocked before the run, released after it; no cgroups).
#
#   LLAMA_BENCH=/path/to/llama-bench SYNTH_DIR=/big/disk scripts/compare-cap.sh [CAP...]
#
# LLAMA_BENCH=none runs sluice alone (no GGUF is written or read): its
# speed under each cap against its own limit, on a machine without the
# peer.
#
# CAP defaults to 0.25 and 0.10. The model is `sluice synth --like LIKE
# --route router --gguf` (default qwen3-30b-a3b, all its layers: about
# 17 GB as a sluice pack, 15 GB as the Q4_0 GGUF), written under SYNTH_DIR
# once and kept (the name compare-synth.sh uses for the same depth). Both
# engines route by the same random router weights; trained routers route
# more skewed, so hit rates here are on the pessimistic side.
#
# For every cap and round, the engines run in turns (the order rotating
# each round), each after the page cache is dropped (echo 3 >
# /proc/sys/vm/drop_caches, when permitted) and the holder has locked
# MemAvailable - (budget + SPARE_MB):
#   sluice bench --prompt 1 --gen GEN --repeat 1 --disk --json   (its
#       defaults: it sizes its expert pool from what MemAvailable says
#       as it starts; --disk measures the expert store's uncached read bandwidth
#       at its record size and queue depth, before and after the trial)
#   llama-bench -p 0 -n LLAMA_GEN -r 1          (default: the GGUF mmapped)
#   llama-bench -p 0 -n LLAMA_GEN -r 1 -mmp 0   (read into memory, if it starts)
#   llama-batched-bench -npp 1 -ntg LLAMA_GEN -npl 1 --no-repack   (only when
#       LLAMA_BATCHED_BENCH names it: the GGUF mmapped and used in place.
#       On CPUs where llama.cpp repacks Q4_0 weights (AVX2, for one), its
#       default copies the whole model into anonymous memory, which the
#       cap does not leave; --no-repack, an option of llama.cpp's common
#       tools but not of llama-bench, keeps the weights in the page cache,
#       as a user whose model does not fit would run it. It warms up on a
#       16-token batch, as llama-bench warms up, then decodes LLAMA_GEN tokens
#       after a 1-token prompt.)
# (sluice with --device cpu: the cap is on host memory, and on a GPU host
# its default would decode on the GPU)
# and the script prints the medians of decode tok/s, sluice's expert hit
# rate, MB of experts read per decoded token and pool share (its --json),
# and for every engine the MB read from disk during the whole run, load
# and warm-up included (/proc/vmstat pgpgin: the whole machine's, so run
# it on a quiet one). sluice's limit under the cap is max(its resident
# decode time per token, measured without a cap right before and right
# after each capped run when the model fits (their mean: the machine's
# speed drifts during the run), MB of experts read per token / the disk
# bandwidth of the same run):
# reads overlap compute, so neither can be beaten; the script prints the
# limit's tok/s and the measured time over the limit's (1.0 is the bound).
# Reads are not free of processor time, though (on a virtual machine the
# host's disk emulation takes time from the guest's cores that the guest
# never sees), so after each capped run it also runs the resident decode
# while scripts/readload reads the expert store at the rate that run read
# it, and prints the capped run's time over that one's, and the share of
# the machine's processor time the host took (steal, on a virtual
# machine; bench's decode_cpu_steal_share, Linux) during each capped
# decode and each resident decode beside the reads.
#
# Environment: LIKE, LAYERS (0 = all), ROUNDS (2), THREADS (2), GEN (128,
# llama-bench's default: a new text's first tokens miss more than the
# rest, so fewer tokens weigh them more), LLAMA_GEN (GEN: tokens
# llama.cpp's runs decode, fewer where it pages its weights from disk at
# a few seconds a token),
# SPARE_MB (0: memory left beyond the budget, for the rest of the machine),
# RUN_TIMEOUT (seconds a run may take, 1800), SLUICE, MEMHOLD and
# READLOAD (a sluice binary and scripts/memhold and scripts/readload
# binaries to run instead of building them: a machine without Go). Needs
# Linux, python3, and root or CAP_IPC_LOCK for the holder. Every engine runs with
# oom_score_adj 1000, so that when memory runs out the OOM killer takes it
# rather than the holder or other processes: a run killed for memory
# (llama.cpp with -mmp 0 when the model does not fit) is reported as
# failed, and one during which the holder died anyway as "cap lost". llama.cpp is built outside this
# repository from its public source; this script only runs the binary it
# is given.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary, or to none for sluice alone}"
peer=1
[ "$LLAMA_BENCH" != none ] || peer=0
: "${SYNTH_DIR:?set SYNTH_DIR to a directory for the model (GBs; not inside the repository)}"
caps=("$@")
[ ${#caps[@]} -gt 0 ] || caps=(0.25 0.10)
like=${LIKE:-qwen3-30b-a3b}
layers=${LAYERS:-0}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
gen=${GEN:-128}
lgen=${LLAMA_GEN:-$gen}
for v in "GEN=$gen" "LLAMA_GEN=$lgen" "ROUNDS=$rounds" "THREADS=$threads"; do
  case ${v#*=} in
    '' | *[!0-9]* | 0) echo "compare-cap.sh: ${v%%=*} must be a positive integer, not '${v#*=}'" >&2; exit 2 ;;
  esac
done
spare=$((${SPARE_MB:-0} * 1024 * 1024))
run_timeout=${RUN_TIMEOUT:-1800}
tag=$like
[ "$layers" = 0 ] || tag=$like-$layers
model=$SYNTH_DIR/$tag
work=$(mktemp -d)
hold_pid=
rl_pid=
cleanup() {
  if [ -n "$hold_pid" ]; then kill "$hold_pid" 2>/dev/null || true; wait "$hold_pid" 2>/dev/null || true; fi
  if [ -n "$rl_pid" ]; then kill "$rl_pid" 2>/dev/null || true; wait "$rl_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -n "${SLUICE:-}" ]; then cp "$SLUICE" "$work/sluice"; else go build -o "$work/sluice" ./cmd/sluice; fi
if [ -n "${MEMHOLD:-}" ]; then cp "$MEMHOLD" "$work/memhold"; else go build -o "$work/memhold" ./scripts/memhold; fi
if [ -n "${READLOAD:-}" ]; then cp "$READLOAD" "$work/readload"; else go build -o "$work/readload" ./scripts/readload; fi
if [ ! -f "$model/manifest.json" ] || { [ $peer = 1 ] && [ ! -f "$model.gguf" ]; }; then
  mkdir -p "$SYNTH_DIR"
  largs=()
  [ "$layers" = 0 ] || largs=(--layers "$layers")
  [ $peer = 0 ] || largs+=(--gguf "$model.gguf")
  if [ -f "$model/manifest.json" ] || { [ $peer = 1 ] && [ -f "$model.gguf" ]; }; then
    # One of the pair without the other (a pack written for sluice alone,
    # LLAMA_BENCH=none, has no GGUF beside it): write both again, so that
    # they hold the same weights.
    echo "$model and $(basename "$model").gguf are not both there: writing both again" >&2
    largs+=(--force)
  fi
  "$work/sluice" synth --like "$like" "${largs[@]}" --route router --out "$model"
fi

# Dense and expert bytes of both files: the pack from its manifest (the
# records of the model's MoE layers), the GGUF from its header (the
# *_exps tensors; the rest of the file counts as dense).
gguf=$model.gguf
[ $peer = 1 ] || gguf=
read -r s_dense s_exp g_dense g_exp < <(python3 - "$model/manifest.json" "$gguf" <<'PY'
import json, os, struct, sys
m = json.load(open(sys.argv[1]))
c = m["config"]
moe = c["num_hidden_layers"] - c.get("first_k_dense_replace", 0)
s_exp = moe * m["experts"] * m["stores"][0]["stride"]
if not sys.argv[2]:
    print(m["dense_bytes"], s_exp, 0, 0)
    sys.exit()
f = open(sys.argv[2], "rb")
def u(fmt):
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
def s():
    return f.read(u("Q")).decode()
sizes = {4: 4, 5: 4, 6: 4, 7: 1, 0: 1, 1: 1, 2: 2, 3: 2, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8: s()
    elif t == 9:
        et, n = u("I"), u("Q")
        for _ in range(n): skip(et)
    else: f.read(sizes[t])
assert f.read(4) == b"GGUF"
u("I"); nt, nkv = u("Q"), u("Q")
for _ in range(nkv):
    s(); skip(u("I"))
row = {0: (4, 1), 1: (2, 1), 2: (18, 32), 8: (34, 32), 39: (17, 32)}  # F32, F16, Q4_0, Q8_0, MXFP4
g_exp = 0
for _ in range(nt):
    name = s(); dims = [u("Q") for _ in range(u("I"))]; t = u("I"); u("Q")
    if "_exps." in name:
        b, per = row[t]
        n = b * dims[0] // per
        for d in dims[1:]: n *= d
        g_exp += n
g_dense = os.path.getsize(sys.argv[2]) - g_exp
print(m["dense_bytes"], s_exp, g_dense, g_exp)
PY
)
gb() { python3 -c "print('%.2f' % ($1 / 2**30))"; }
line="model $tag: sluice dense $(gb "$s_dense") GiB + experts $(gb "$s_exp") GiB"
[ $peer = 0 ] || line+="; GGUF dense $(gb "$g_dense") GiB + experts $(gb "$g_exp") GiB"
echo "$line"
echo "machine: $(awk '/^MemTotal/ {printf "%.1f GiB", $2/2^20}' /proc/meminfo), $(nproc) CPUs; threads $threads, $gen generated tokens ($lgen for llama.cpp), $rounds rounds"

meminfo() { awk -v k="$1:" '$1 == k {printf "%.0f\n", $2 * 1024}' /proc/meminfo; }
pgpgin() { awk '$1 == "pgpgin" {printf "%.0f\n", $2 * 1024}' /proc/vmstat; }

# capped BUDGET OUT CMD...: runs CMD with MemAvailable held down to BUDGET
# (+ SPARE_MB); writes CMD's stdout to OUT and "rc disk_bytes note" to
# OUT.meta.
capped() {
  local budget=$1 out=$2 note=ok rc=0
  shift 2
  sync
  echo 3 2>/dev/null >/proc/sys/vm/drop_caches || note=cache-kept
  local avail hold
  avail=$(meminfo MemAvailable)
  hold=$((avail - budget - spare))
  if [ "$hold" -gt 0 ]; then
    "$work/memhold" "$hold" >"$work/hold.out" 2>"$work/hold.err" &
    hold_pid=$!
    until grep -q locked "$work/hold.out" 2>/dev/null; do
      if ! kill -0 "$hold_pid" 2>/dev/null; then
        echo "memhold could not lock $hold bytes: $(cat "$work/hold.err")" >&2
        exit 1
      fi
      sleep 0.2
    done
  else
    note=no-hold
  fi
  local p0 p1
  p0=$(pgpgin)
  # The engine volunteers as the OOM killer's first victim (raising one's
  # own score needs no privilege; lowering the holder's may be refused).
  timeout "$run_timeout" sh -c 'echo 1000 >/proc/self/oom_score_adj 2>/dev/null; exec "$@"' sh "$@" >"$out" 2>"$out.err" || rc=$?
  p1=$(pgpgin)
  if [ -n "$hold_pid" ]; then
    if ! kill -0 "$hold_pid" 2>/dev/null; then note=cap-lost; fi
    kill "$hold_pid" 2>/dev/null || true
    wait "$hold_pid" 2>/dev/null || true
    hold_pid=
  fi
  echo "$rc $((p1 - p0)) $note" >"$out.meta"
}

run_engine() { # ENGINE BUDGET OUT
  case $1 in
    sluice) capped "$2" "$3" "$work/sluice" bench -m "$model" --device cpu --prompt 1 --gen "$gen" --threads "$threads" --repeat 1 --disk --json ;;
    llama) capped "$2" "$3" "$LLAMA_BENCH" -m "$model.gguf" -t "$threads" -r 1 -p 0 -n "$lgen" -o json ;;
    llama-nommap) capped "$2" "$3" "$LLAMA_BENCH" -m "$model.gguf" -t "$threads" -r 1 -p 0 -n "$lgen" -mmp 0 -o json ;;
    llama-norepack) capped "$2" "$3" "$LLAMA_BATCHED_BENCH" -m "$model.gguf" -t "$threads" -c $((lgen + 64)) -npp 1 -ntg "$lgen" -npl 1 --no-repack --output-format jsonl ;;
  esac
}

# resident_bench OUT [ERR]: sluice's resident decode (no cap; caches
# dropped first), its --json in OUT, its stderr in ERR (else discarded);
# the bench's exit status.
resident_bench() {
  sync
  echo 3 2>/dev/null >/proc/sys/vm/drop_caches || true
  "$work/sluice" bench -m "$model" --device cpu --prompt 1 --gen "$gen" --threads "$threads" --repeat 1 --json >"$1" 2>"${2:-/dev/null}"
}

# sluice's resident decode, without a cap (0 when it does not fit: the
# limit is then the disk's alone).
resident_ms=0
if resident_bench "$work/resident.json" "$work/resident.err"; then
  resident_ms=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(0 if d.get("experts") else 1000 / d["decode_tok_s"])' "$work/resident.json")
fi
echo "sluice resident decode: $(python3 -c "print('%.1f ms/token' % $resident_ms if $resident_ms else 'does not fit uncapped')")"

engines=(sluice llama llama-nommap)
[ $peer = 1 ] || engines=(sluice)
[ -z "${LLAMA_BATCHED_BENCH:-}" ] || engines+=(llama-norepack)
printf '%-6s %9s %9s | %9s %7s %7s %6s %8s %7s %8s | %9s %8s | %9s %8s | %9s %8s\n' cap "sluice_GB" "llama_GB" \
  "sluice_tg" hit% MB/tok pool% disk_MB disk_MBs "limit_tg" "llama_tg" disk_MB "nommap_tg" disk_MB "norepk_tg" disk_MB
for cap in "${caps[@]}"; do
  s_budget=$(python3 -c "print(int($s_dense + $cap * $s_exp))")
  g_budget=$(python3 -c "print(int($g_dense + $cap * $g_exp))")
  rm -f "$work"/r.*
  for r in $(seq "$rounds"); do
    for i in "${!engines[@]}"; do
      e=${engines[$(((i + r - 1) % ${#engines[@]}))]}
      b=$g_budget
      [ "$e" = sluice ] && b=$s_budget
      if [ "$e" = sluice ] && [ "$resident_ms" != 0 ]; then
        # The run's own resident decode, just before it: the machine's
        # speed drifts by tens of percent over minutes, more than the
        # gap to the limit being measured.
        resident_bench "$work/r.$e.$r.res" || true
      fi
      run_engine "$e" "$b" "$work/r.$e.$r"
      if [ "$e" = sluice ] && [ "$resident_ms" != 0 ]; then
        # And right after it, so that the limit brackets the run.
        resident_bench "$work/r.$e.$r.res2" || true
        # The resident decode again, while scripts/readload reads the
        # expert store at the rate the capped run read it (MB a token ×
        # tok/s, in records of its stride): what those reads cost the
        # compute where reading is not free of processor time.
        read -r rate rec < <(python3 -c 'import json,sys
try:
    d = json.load(open(sys.argv[1])); e = d["experts"]
    print("%.0f %d" % (e["mb_per_token"] * d["decode_tok_s"], e["pool_mb"] * 1e6 / e["pool_slots"]))
except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
    print("0 0")' "$work/r.$e.$r") || rate=0
        if [ "${rate:-0}" -gt 0 ]; then
          "$work/readload" "$model/experts.bin" "$rate" "$rec" 2>"$work/r.$e.$r.rl" &
          rl_pid=$!
          sleep 0.5
          if kill -0 "$rl_pid" 2>/dev/null; then
            resident_bench "$work/r.$e.$r.load" || true
            # A reader that stopped during the run leaves no figure.
            kill -0 "$rl_pid" 2>/dev/null || rm -f "$work/r.$e.$r.load"
            kill "$rl_pid" 2>/dev/null || true
          fi
          wait "$rl_pid" 2>/dev/null || true
          rl_pid=
          [ -f "$work/r.$e.$r.load" ] || echo "readload did not read throughout: $(cat "$work/r.$e.$r.rl")" >&2
        fi
      fi
    done
  done
  python3 - "$work" "$rounds" "$cap" "$s_budget" "$g_budget" "$gen" "$resident_ms" "${engines[@]}" <<'PY'
import json, statistics, sys
work, rounds, cap, sb, gb, gen = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
resident_ms = float(sys.argv[7])
engines = sys.argv[8:]
def load(p):
    # llama-batched-bench --output-format jsonl prints one object a line;
    # the others print one JSON document.
    text = open(p).read()
    if p.split("/")[-1].startswith("r.llama-norepack."):
        return [json.loads(l) for l in text.splitlines() if l.startswith("{")] or None
    return json.loads(text)
def resident_doc(r, ext):
    # round r's resident decode, r.sluice.R.EXT (res: just before the
    # capped run; res2: just after it; load: after that, beside readload),
    # None if there is none.
    try:
        return json.load(open("%s/r.sluice.%d.%s" % (work, r, ext)))
    except (OSError, ValueError):
        return None
def resident_run(r, ext):
    # ms a token of that decode, 0 if none.
    d = resident_doc(r, ext)
    if d and not d.get("experts") and d.get("decode_tok_s", 0) > 0:
        return 1000 / d["decode_tok_s"]
    return 0
def resident(r):
    # The mean of the resident decodes measured just before and just
    # after round r's capped run (the one of them there is), else the one
    # measured first.
    v = [m for m in (resident_run(r, "res"), resident_run(r, "res2")) if m]
    return sum(v) / len(v) if v else resident_ms
def runs(e):
    out = []
    if e not in engines:
        return out
    for r in range(1, rounds + 1):
        p = "%s/r.%s.%d" % (work, e, r)
        rc, disk, note = open(p + ".meta").read().split()
        d = None
        if rc == "0" and note != "cap-lost":
            try:
                d = load(p)
            except ValueError:
                pass
        if d is not None and e == "sluice":
            d["resident_ms"] = resident(r)
            d["resident_around"] = "/".join("%.1f" % resident_run(r, x) for x in ("res", "res2"))
            d["loaded_ms"] = resident_run(r, "load")
        out.append((int(rc), int(disk), note, d))
    return out
def med(xs):
    return statistics.median(xs) if xs else float("nan")
def status(rs):
    bad = [("cap lost" if n == "cap-lost" else "rc %d" % rc) for rc, _, n, d in rs if d is None]
    return "" if not bad else " (%d/%d failed: %s)" % (len(bad), len(rs), ", ".join(bad))
# Disk reads of the whole run in MB: load, warm-up (sluice: a full trial;
# llama-bench: one token) and the timed trial.
def disk(rs):
    return med([b / 1e6 for rc, b, n, d in rs if d is not None])
s, l, n, q = runs("sluice"), runs("llama"), runs("llama-nommap"), runs("llama-norepack")
sok = [d for *_, d in s if d]
st = med([d["decode_tok_s"] for d in sok])
x = [d.get("experts") for d in sok]
hit = med([100 * e["hit_rate"] for e in x if e]) if any(x) else 100.0
mbt = med([e["mb_per_token"] for e in x if e]) if any(x) else 0.0
pool = med([100 * e["pool_share"] for e in x if e]) if any(x) else 100.0
dmbs = med([e["disk_mb_s"] for e in x if e and e.get("disk_mb_s")]) if any(x) else float("nan")
# The limit of each run: its reads at its disk bandwidth, or the resident
# compute, whichever is longer; then the medians.
lims, ofl = [], []
for d in sok:
    e = d.get("experts")
    if e and e.get("disk_mb_s"):
        ms = max(d["resident_ms"], 1000 * e["mb_per_token"] / e["disk_mb_s"])
        lims.append(1000 / ms)
        ofl.append((1000 / d["decode_tok_s"]) / ms)
lim = med(lims)
def tg(rs):
    v = []
    for *_, d in rs:
        if d:
            v += [t["avg_ts"] if "avg_ts" in t else t["speed_tg"] for t in d if t.get("n_gen", t.get("tg", 0)) > 0]
    return med(v)
print("%-6s %9.2f %9.2f | %9.2f %7.1f %7.1f %6.0f %8.0f %7.0f %8.2f | %9.3g %8.0f | %9.3g %8.0f | %9.3g %8.0f%s%s%s%s" % (
    cap, sb / 2**30, gb / 2**30, st, hit, mbt, pool, disk(s), dmbs, lim, tg(l), disk(l), tg(n), disk(n), tg(q), disk(q),
    status(s) and " sluice" + status(s), status(l) and " llama" + status(l), status(n) and " nommap" + status(n),
    status(q) and " norepack" + status(q)))
notes = {r[2] for r in s + l + n + q} - {"ok", "cap-lost"}
if notes:
    print("       notes: %s" % ", ".join(sorted(notes)))
if ofl:
    print("       sluice's time per token over its limit's: %s (median %.2f); resident decode before/after each: %s ms/token" % (
        " ".join("%.2f" % v for v in ofl), med(ofl), " ".join(d["resident_around"] for d in sok)))
lo = [(1000 / d["decode_tok_s"]) / d["loaded_ms"] for d in sok if d.get("loaded_ms")]
if lo:
    print("       over its resident decode while the same reads run beside it: %s (median %.2f); that decode: %s ms/token" % (
        " ".join("%.2f" % v for v in lo), med(lo), " ".join("%.1f" % d["loaded_ms"] for d in sok if d.get("loaded_ms"))))
def steal(ds):
    # The share of the machine's processor time the host took during each
    # decode (bench's decode_cpu_steal_share: Linux, a virtual machine).
    return " ".join("%.1f%%" % (100 * d["decode_cpu_steal_share"]) for d in ds if d and "decode_cpu_steal_share" in d)
capped_steal = steal(sok)
if capped_steal:
    print("       the host's steal of the machine's processor time: %s capped; %s resident beside the reads" % (
        capped_steal, steal([resident_doc(r, "load") for r in range(1, rounds + 1)]) or "none"))
if sok:
    print("       sluice: %s" % sok[-1].get("experts_plan", ""))
PY
done
