#!/bin/sh
# bench/gpu-health-check.py (the health step of bench/gpu-check.sh) against the fake NVML:
# a GPU whose gauges all read must pass, and one whose utilisation reads 0 all along (as an
# NVML query answered "not supported" leaves it) must fail, naming the gauge.
#   gpu-health-check-fake.sh SOURCE_DIR GANGLION FAKE_NVML_LIBRARY WORKDIR
set -eu
src=$1 bin=$2 lib=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
printf 'gpu 0 name=FakeH200 util=35 temp=50\n' > "$work/ok.cfg"
printf 'gpu 0 name=FakeH200 util=0 temp=50\n' > "$work/zero.cfg"
run() {
    FAKE_NVML_CONFIG="$work/$1.cfg" python3 "$src/bench/gpu-health-check.py" --bin "$bin" \
        --dir "$work/$1" --seconds 4 --device cpu --nvml-library "$lib" > "$work/$1.json"
}
if ! run ok; then
    echo "FAIL: a fake GPU whose gauges all read did not pass:"; cat "$work/ok.json"; exit 1
fi
if run zero; then
    echo "FAIL: a utilisation gauge that never read above 0 passed:"; cat "$work/zero.json"
    exit 1
fi
if ! grep -q '"never_nonzero": \["DCGM_FI_DEV_GPU_UTIL"\]' "$work/zero.json"; then
    echo "FAIL: the failure does not name the gauge:"; cat "$work/zero.json"; exit 1
fi
echo "gpu-health-check-fake: passed (all gauges read: ok; utilisation stuck at 0: refused)"
