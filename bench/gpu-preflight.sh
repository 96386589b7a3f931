#!/usr/bin/env bash
# The device check's first step (issue #24): in about five seconds, whether this machine
# can run the bundle at all, one line per thing checked, each "PASS what: detail" or
# "FAIL what: why", so that a run that cannot work says at once what is missing instead
# of failing later step by step.
#
#   bash bench/gpu-preflight.sh BUNDLE_DIR
#
# Checks: the commands the check uses; the NVIDIA driver (nvidia-smi answers) and a GPU the
# CUDA runtime sees (`ganglion info --labels`); that every carried binary resolves each of
# its libraries inside the bundle or among those the image provides (bench/device-image.txt,
# by soname; the loader's own answer, ldd); NCCL and cuBLASLt loadable (`ganglion info
# --libraries`: the run-time search, naming the file); the Python modules the references
# need (found, not imported: importing torch alone takes seconds).
# Exit status: 0 when every line is PASS, 1 otherwise.
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 BUNDLE_DIR" >&2
    exit 2
fi
B=$(cd "$1" && pwd) || exit 2
IMAGE=$B/bench/device-image.txt
[ -f "$IMAGE" ] || IMAGE=$(dirname "$0")/device-image.txt
fails=0

say() { # say PASS|FAIL WHAT DETAIL
    echo "preflight: $1 $2: $3"
    [ "$1" = PASS ] || fails=$((fails + 1))
}

# Commands.
while read -r c; do
    if command -v "$c" >/dev/null 2>&1; then
        say PASS "command $c" "$(command -v "$c")"
    else
        say FAIL "command $c" "not on PATH ($PATH)"
    fi
done < <(awk '$1 == "cmd" {print $2}' "$IMAGE")

# Driver and device.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    say FAIL driver "nvidia-smi is not on PATH: no NVIDIA driver here"
elif drv=$(timeout 3 nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>&1 |
    head -1) && [ -n "$drv" ] && ! [[ $drv =~ (failed|error|Error) ]]; then
    say PASS driver "$drv"
else
    say FAIL driver "nvidia-smi did not answer: ${drv:-nothing}"
fi
if [ -x "$B/bin/ganglion" ]; then
    labels=$(timeout 5 "$B/bin/ganglion" info --labels 2>&1)
    count=$(sed -n 's/^nvidia.com\/gpu.count=\([0-9]*\)$/\1/p' <<<"$labels" | head -1)
    if [ "${count:-0}" -ge 1 ]; then
        say PASS device "$count GPU(s): $(sed -n 's/^nvidia.com\/gpu.product=//p' <<<"$labels" | head -1)"
    else
        say FAIL device "the CUDA runtime sees no GPU: $(head -1 <<<"$labels")"
    fi
else
    say FAIL device "$B/bin/ganglion is missing: not a bundle (scripts/gpu-bundle.sh makes one)"
fi

# Libraries of the carried binaries.
declare -A HAVE=()
while read -r kind name; do
    [ "$kind" = lib ] && HAVE[$name]=1
done < <(grep -v '^#' "$IMAGE")
for f in "$B"/bin/*; do
    [ -x "$f" ] || continue
    bad=""
    while read -r soname _ path _; do
        [ "$path" = not ] || path=$(realpath -m "$path")
        case $path in
        "$B"/lib/*) ;;
        not) bad="$bad $soname(not found)" ;;
        *) [ -n "${HAVE[$soname]:-}" ] || bad="$bad $soname($path: not in the bundle nor the image)" ;;
        esac
    done < <(ldd "$f" 2>&1 | awk '/=>/ {print $1, $2, $3, $4}')
    if [ -z "$bad" ]; then
        say PASS "libraries of $(basename "$f")" "each in the bundle or the image"
    else
        say FAIL "libraries of $(basename "$f")" "${bad# }"
    fi
done

# NCCL and cuBLASLt, through the same search a GPU run uses.
if [ -x "$B/bin/ganglion" ]; then
    while IFS= read -r line; do
        [[ $line =~ ^library\ ([A-Za-z]+):\ (.*)$ ]] || continue
        name=${BASH_REMATCH[1]} where=${BASH_REMATCH[2]}
        if [[ $where == MISSING* ]]; then
            say FAIL "library $name" "$where"
        else
            say PASS "library $name" "$where"
        fi
    done < <(timeout 8 "$B/bin/ganglion" info --libraries 2>/dev/null)
fi

# Python modules (found, not imported).
mods=$(awk '$1 == "py" {print $2}' "$IMAGE" | tr '\n' ' ')
if command -v python3 >/dev/null 2>&1; then
    # shellcheck disable=SC2086 # one argument per module
    while read -r state mod; do
        if [ "$state" = found ]; then
            say PASS "python $mod" "found"
        else
            say FAIL "python $mod" "python3 ($(command -v python3)) has no module $mod"
        fi
    done < <(timeout 5 python3 -c '
import importlib.util, sys
for m in sys.argv[1:]:
    try:
        ok = importlib.util.find_spec(m) is not None
    except Exception:
        ok = False
    print("found" if ok else "missing", m)' $mods 2>&1)
else
    say FAIL python "python3 is not on PATH: the references (transformers) cannot run"
fi

echo "preflight: $([ $fails -eq 0 ] && echo PASS || echo "FAIL ($fails)")"
[ $fails -eq 0 ]
