#!/usr/bin/env python3
"""The health-watch step of bench/gpu-check.sh (issue #15), Python standard library only.

    python3 bench/gpu-health-check.py --bin BIN --dir DIR [--seconds 30]
                                      [--device cuda] [--nvml-library PATH]

1. NVML readable: `ganglion info` must print the NVML topology with at least one GPU.
2. Serves a tiny model (`serve --local`, one worker, --gpu-health-interval-ms 200) and
   keeps it busy with completions for --seconds, scraping /metrics every 2 s: the GPU
   gauges (DCGM_FI_DEV_GPU_UTIL, _FB_USED, _GPU_TEMP, _POWER_USAGE, _SM_CLOCK) must be
   there and each must read above zero at least once (an NVML query that is "not
   supported" leaves its gauge at 0: present but never read is not a working gauge),
   ganglion_gpu_fatal must stay 0, no GPU fault may be counted, and the gang must
   stay in its first generation (no false fault restarted it).
Prints one JSON line ("measure":"gpu_health") and exits 0 when all of that held, 1
otherwise; {"skipped": ...} and 0 with --device cuda on a machine without a GPU.
With --device cpu --nvml-library tests/libfake-nvml.so (and FAKE_NVML_CONFIG) the same
checks run against the fake NVML: that is how the script itself is tested without a GPU.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

from local_serve import free_port_pair, wait_ready

GAUGES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP",
          "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK")


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def samples(text, name):
    return [float(v) for v in re.findall(r"^%s\{[^}]*\} (\S+)$" % re.escape(name), text, re.M)]


def serve(args, port):
    model = os.path.join(args.dir, "model")
    subprocess.run([args.bin, "mkmodel", "--out", model, "--layers", "4", "--hidden", "64",
                    "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "256",
                    "--seed", "7"], check=True, capture_output=True, timeout=60)
    argv = [args.bin, "serve", "--local", "--model", model, "--nnodes", "1",
            "--nproc-per-node", "1", "--device", args.device, "--http-port", str(port),
            "--rdzv-port", str(port + 1), "--kv-cache-mb", "16", "--max-batch", "4",
            "--gpu-health-interval-ms", "200", "--termination-log", ""]
    if args.device == "cuda":
        argv += ["--gpu-memory-mb", "2048"]
    if args.nvml_library:
        argv += ["--nvml-library", args.nvml_library]
    log = open(os.path.join(args.dir, "serve.log"), "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def watch(args, base):
    """Load for args.seconds with metric scrapes; returns the result dict."""
    res = {"measure": "gpu_health", "device": args.device, "seconds": args.seconds,
           "scrapes": 0, "missing": [], "never_nonzero": list(GAUGES),
           "fatal_seen": 0, "faults_counted": 0,
           "max_util": 0.0, "max_temp_c": 0.0, "max_power_w": 0.0, "completions": 0}
    g0 = json.loads(get(base + "/status")[1])["generation"]
    end = time.time() + args.seconds
    next_scrape = 0.0
    body = json.dumps({"prompt": [1, 5, 9, 13], "max_tokens": 32}).encode()
    while time.time() < end:
        req = urllib.request.Request(base + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60).read()
            res["completions"] += 1
        except Exception as e:  # a restarting or failed gang: counted, and it fails the check
            res["completion_errors"] = res.get("completion_errors", 0) + 1
            res["last_error"] = str(e)
            time.sleep(0.2)
        if time.time() < next_scrape:
            continue
        next_scrape = time.time() + 2.0
        text = get(base + "/metrics")[1]
        res["scrapes"] += 1
        res["missing"] = sorted(set(res["missing"]) | {g for g in GAUGES if not samples(text, g)})
        res["never_nonzero"] = [g for g in res["never_nonzero"]
                                if not any(v > 0 for v in samples(text, g))]
        res["fatal_seen"] = max([res["fatal_seen"]] + samples(text, "ganglion_gpu_fatal"))
        res["faults_counted"] = sum(samples(text, "ganglion_gpu_faults_total"))
        res["max_util"] = max([res["max_util"]] + samples(text, "DCGM_FI_DEV_GPU_UTIL"))
        res["max_temp_c"] = max([res["max_temp_c"]] + samples(text, "DCGM_FI_DEV_GPU_TEMP"))
        res["max_power_w"] = max([res["max_power_w"]] + samples(text, "DCGM_FI_DEV_POWER_USAGE"))
    try:
        st = json.loads(get(base + "/status")[1])
    except Exception as e:
        st = {"generation": -1, "last_failure": "no /status: %s" % e}
    res["generation_start"], res["generation_end"] = g0, st["generation"]
    res["last_failure"] = st["last_failure"]
    res["ok"] = (res["scrapes"] > 0 and not res["missing"] and not res["never_nonzero"] and
                 res["fatal_seen"] == 0 and
                 res["faults_counted"] == 0 and g0 == st["generation"] and
                 not res.get("completion_errors") and
                 st["last_failure"] is None)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nvml-library", default="")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.device == "cuda":
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) \
            if any(os.access(os.path.join(p, "nvidia-smi"), os.X_OK)
                   for p in os.environ.get("PATH", "").split(":")) else None
        if smi is None or "GPU" not in smi.stdout:
            print(json.dumps({"skipped": "no GPU (nvidia-smi lists none)"}))
            return 0
    info_argv = [args.bin, "info"] + (["--nvml-library", args.nvml_library]
                                      if args.nvml_library else [])
    info = subprocess.run(info_argv, capture_output=True, text=True, timeout=30)
    m = re.search(r"GPU topology \(NVML\): (\d+) GPU", info.stdout)
    if not m or int(m.group(1)) < 1:
        print(json.dumps({"measure": "gpu_health", "ok": False,
                          "error": "NVML not readable", "info": info.stdout[-400:]}))
        return 1
    try:
        port = free_port_pair()
    except RuntimeError as e:
        sys.exit(str(e))
    proc = serve(args, port)
    try:
        base = "http://127.0.0.1:%d" % port
        try:
            wait_ready(base, proc, 60)
        except RuntimeError as e:
            sys.exit(str(e))
        res = watch(args, base)
        res["nvml_gpus"] = int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
