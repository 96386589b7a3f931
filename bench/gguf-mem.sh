#!/usr/bin/env bash
# Issue #27, "Measure": load time to READY and peak resident memory per worker, ganglion
# (`serve --local`, the GGUF file's blocks mapped, and with --no-mmap) against llama.cpp's
# llama-server on the same file, interleaved, TRIALS rounds (the order rotates each round).
#
#   bench/gguf-mem.sh BIN FILE.gguf [TRIALS]      (env: LLAMA_BIN, CTX, THREADS)
#
# Each run: start, poll /readyz (ganglion) or /health (llama-server) every 50 ms until 200
# (the load time), one greedy completion of 16 tokens (every weight read once), then the
# serving process's VmHWM (peak RSS: ganglion's worker, whose pid its log names; the
# llama-server process) and its KV cache's size, both engines at CTX positions, one
# sequence, f16 KV (llama-server's default; ganglion --kv-cache-dtype f16 --kv-cache-mb
# sized to one sequence). llama-server runs with LLAMA_ARG_REPACK=false (this build
# crashes at start with its AMX repacking). Prints one TSV line per run and the medians,
# with the bound of the issue: file + KV + 64 MiB.
set -euo pipefail

BIN=${1:?usage: gguf-mem.sh BIN FILE.gguf [TRIALS]}
FILE=${2:?usage: gguf-mem.sh BIN FILE.gguf [TRIALS]}
TRIALS=${3:-3}
LLAMA_BIN=${LLAMA_BIN:-/var/cache/ganglion/llama.cpp-0.3.36/bin}
CTX=${CTX:-2048}
THREADS=${THREADS:-2}
WORK=$(mktemp -d /tmp/gguf-mem.XXXXXX)
PGID=""
R=""

cleanup() {
    if [ -n "$PGID" ]; then
        kill -TERM -- "-$PGID" 2>/dev/null || true
        sleep 0.5
        kill -KILL -- "-$PGID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

now() { date +%s.%N; }

# Polls URL until it answers 200, for at most 120 s; prints nothing, fails on timeout.
wait_200() {
    local url=$1 deadline=$((SECONDS + 120))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)" = 200 ]; then
            return 0
        fi
        sleep 0.05
    done
    echo "gguf-mem: $url not ready after 120 s (logs in $WORK)" >&2
    return 1
}

vmhwm_mib() { awk '/^VmHWM:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# KV bytes of one sequence of CTX positions in f16: layers x 2 x kv heads x head_dim x 2.
kv_mib() {
    /opt/ganglion-ref-venv/bin/python3 - "$FILE" "$CTX" <<'EOF'
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
f = {k: v for k, v in r.fields.items()}
arch = bytes(f["general.architecture"].parts[-1]).decode()
def num(key):
    return int(f[arch + "." + key].parts[-1][0])
layers, heads_kv = num("block_count"), num("attention.head_count_kv")
hd = num("attention.key_length") if arch + ".attention.key_length" in f \
    else num("embedding_length") // num("attention.head_count")
print("%.1f" % (layers * 2 * heads_kv * hd * 2 * int(sys.argv[2]) / 1048576.0))
EOF
}

PROMPT='{"prompt": [1, 504, 3458, 282, 4649, 314], "max_tokens": 16, "temperature": 0}'
LPROMPT='{"prompt": [1, 504, 3458, 282, 4649, 314], "n_predict": 16, "temperature": 0, "top_k": 1, "cache_prompt": false}'

# One ganglion run; $1: extra flag ("" or --no-mmap). Sets R to "load_s peak_mib".
run_ganglion() {
    local port=$((20000 + RANDOM % 6000 * 2)) log="$WORK/ganglion.$RANDOM.log" t0 t1 pid kvmb
    kvmb=$(awk -v k="$KV" 'BEGIN {printf "%d", k + 1}')
    t0=$(now)
    # shellcheck disable=SC2086  # $1: an optional flag
    setsid "$BIN" serve --local --model "$FILE" --max-ctx "$CTX" --max-batch 1 \
        --kv-cache-dtype f16 --kv-cache-mb "$kvmb" --http-port "$port" \
        --rdzv-port $((port + 1)) $1 >"$log" 2>&1 &
    PGID=$!
    wait_200 "http://127.0.0.1:$port/readyz"
    t1=$(now)
    curl -sf --max-time 120 -H 'Content-Type: application/json' -d "$PROMPT" \
        "http://127.0.0.1:$port/v1/completions" >/dev/null
    pid=$(sed -n 's/.*worker local rank 0 up (pid \([0-9]*\)).*/\1/p' "$log" | tail -1)
    R="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') $(vmhwm_mib "$pid")"
    cleanup
    PGID=""
}

# One llama-server run. Sets R to "load_s peak_mib".
run_llama() {
    local port=$((20000 + RANDOM % 6000 * 2)) log="$WORK/llama.$RANDOM.log" t0 t1
    t0=$(now)
    LLAMA_ARG_REPACK=false setsid "$LLAMA_BIN/llama-server" -m "$FILE" --port "$port" \
        -t "$THREADS" -c "$CTX" -np 1 >"$log" 2>&1 &
    PGID=$!
    wait_200 "http://127.0.0.1:$port/health"
    t1=$(now)
    curl -sf --max-time 120 -H 'Content-Type: application/json' -d "$LPROMPT" \
        "http://127.0.0.1:$port/completion" >/dev/null
    R="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') $(vmhwm_mib "$PGID")"
    cleanup
    PGID=""
}

KV=$(kv_mib)
SIZE=$(awk -v b="$(stat -c %s "$FILE")" 'BEGIN {printf "%.1f", b / 1048576}')
BOUND=$(awk -v s="$SIZE" -v k="$KV" 'BEGIN {printf "%.1f", s + k + 64}')
echo "# $(basename "$FILE"): $SIZE MiB, KV (f16, $CTX positions) $KV MiB, bound $BOUND MiB;" \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'trial\tengine\tload_s\tpeak_rss_mib\n'
ENGINES=(ganglion ganglion-no-mmap llama-server)
for ((t = 0; t < TRIALS; t++)); do
    for ((i = 0; i < 3; i++)); do
        e=${ENGINES[$(((i + t) % 3))]}
        case $e in
        ganglion) run_ganglion "" ;;
        ganglion-no-mmap) run_ganglion --no-mmap ;;
        llama-server) run_llama ;;
        esac
        printf '%d\t%s\t%s\n' "$t" "$e" "${R// /	}" | tee -a "$WORK/runs.tsv"
    done
done
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg); medians:"
for e in "${ENGINES[@]}"; do
    awk -v e="$e" -v bound="$BOUND" -F'\t' 'BEGIN {n = 0} $2 == e {l[n] = $3; r[n] = $4; n++}
        function med(a, n,   i, j, t) {
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
            return n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }
        END {printf "%s\tload %.2f s\tpeak RSS %.1f MiB\t(bound %s MiB)\n", e, med(l, n), med(r, n), bound}' \
        "$WORK/runs.tsv"
done
rm -rf "$WORK"
