#!/usr/bin/env python3
"""Disaggregated prefill/decode with the KV blocks moved GPU to GPU over NCCL between the
two gangs' worker processes: the CUDA emulator's ctest pd-nccl-emu (tests/cuda-emu/,
docs/gpu.md "The CUDA emulator"; the pair: docs/design.md, "KV transfer over NCCL").

    pd-nccl.py --bin BIN      (with the emulator's GANGLION_CUDA_LIBRARY_DIR,
                               GANGLION_NCCL_LIBRARY and GANG_EMU_DEVICES=2)

A prefill gang (--role prefill --kv-port P) and a decode gang (--role decode), TP 2 each
over NCCL on --device cuda, each worker on its own emulated GPU, the gangs on two emulated
hosts (GANG_EMU_HOST: NCCL refuses two ranks of one communicator on one GPU, and decode
rank t pairs with prefill rank t), and a router in front of them
(tests/mp/test_pd_router.py's). Every greedy answer through the router equals the decode
gang's own; the prompts with full blocks (2 and 8 blocks, plain and streamed) were
exported by the prefill gang and fetched by the decode gang over the NCCL pair
(ganglion_kv_imports_device_total, no fallback). Then a prefill worker is killed: the
prefill gang re-forms with a new process and the next transfers pair with it over NCCL
again, the answers still the decode gang's own. Exit 0 pass, 1 fail.
"""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
MP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mp")
sys.path.insert(0, MP)
import harness as H  # noqa: E402
import test_dp_router as DP  # noqa: E402
import test_pd_router as PD  # noqa: E402

H.TEST_DEADLINE_S = 200


def nccl_flags():
    return ["--device", "cuda", "--backend", "nccl", "--gpu-memory-mb", "256",
            "--nccl-library", os.environ.get("GANGLION_NCCL_LIBRARY", ""),
            "--cuda-library-dir", os.environ.get("GANGLION_CUDA_LIBRARY_DIR", "")]


def start(h, gang, host):
    gang.local = h.spawn("local-" + host, [h.bin, "serve", "--local"] + gang.flags, (0,),
                         env={"GANG_EMU_HOST": host})


def scenario(h):
    H.check(os.environ.get("GANG_EMU_DEVICES") == "2",
            "run with GANG_EMU_DEVICES=2 (two emulated GPUs a gang: NCCL wants one per rank)")
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=128, heads=4,
                      kv_heads=2, ffn=256, vocab=PD.VOCAB, max_pos=PD.CTX, seed=11)
    extra = ["--model", model, "--max-batch", "4", "--kv-cache-mb", "32",
             "--request-timeout-ms", "60000", "--step-timeout-ms", "5000", "--tp", "2"]
    extra += nccl_flags()
    kv_port = h.free_port_pair()[0]
    prefill = H.Gang(h, nnodes=1, nproc_per_node=2, job="pd-p",
                     extra=extra + ["--role", "prefill", "--kv-port", str(kv_port)])
    decode = H.Gang(h, nnodes=1, nproc_per_node=2, job="pd-d",
                    extra=extra + ["--role", "decode"])
    start(h, prefill, "prefill-host")
    start(h, decode, "decode-host")
    router, rport = PD.start_router(h, prefill, decode)
    prefill.wait_serving(timeout=60)
    decode.wait_serving(timeout=60)
    H.wait_until(lambda: PD.disaggregated(rport), 10, 0.05, "the router to see both roles")

    kp0, kd0 = PD.kv_counts(prefill), PD.kv_counts(decode)
    dev0 = DP.replica_metric(decode, "ganglion_kv_imports_device_total")
    PD.check_equal(decode, rport)
    kp, kd = PD.kv_counts(prefill), PD.kv_counts(decode)
    moved = {k: kd[k] - kd0[k] for k in kd}
    dev = DP.replica_metric(decode, "ganglion_kv_imports_device_total") - dev0
    H.log("P/D over NCCL: prefill exported %d (%d blocks), decode imported %r, %d of them "
          "GPU to GPU" % (kp["exports"] - kp0["exports"],
                          kp["exported_blocks"] - kp0["exported_blocks"], moved, dev))
    H.check(kp["exports"] - kp0["exports"] == 4 and
            kp["exported_blocks"] - kp0["exported_blocks"] == 20,
            "prefill exports %r -> %r" % (kp0, kp))
    H.check(moved["imports"] == 4 and moved["imported_blocks"] == 20 and
            moved["import_fallbacks"] == 0, "decode imports: %r" % moved)
    H.check(dev == 4, "%d of the 4 imports went over the NCCL pair (the rest over TCP)" % dev)

    # A prefill worker killed: the prefill gang re-forms with a new process, and the next
    # transfers pair with it over new communicators (the dead process's unique ids and its
    # connections gone with it).
    gen0 = prefill.wait_serving(timeout=10)
    victim = prefill.worker_pid(0, 0)
    os.kill(victim, signal.SIGKILL)
    gen = prefill.wait_serving(timeout=30, min_gen=gen0)
    H.check(gen == gen0 + 1, "prefill gang serves generation %d, want %d" % (gen, gen0 + 1))
    PD.check_equal(decode, rport, streamed=False)
    dev2 = DP.replica_metric(decode, "ganglion_kv_imports_device_total") - dev0 - dev
    H.check(dev2 == 2, "after the prefill worker's death %d of the 2 imports went over the "
            "NCCL pair" % dev2)
    H.log("prefill worker %d killed: generation %d -> %d, the next 2 imports GPU to GPU again"
          % (victim, gen0, gen))
    H.check(router.stop() == 0, "router did not exit 0")
    H.check(prefill.stop()["local"] == 0, "the prefill gang did not exit 0")
    H.check(decode.stop()["local"] == 0, "the decode gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario, name="pd-nccl")
