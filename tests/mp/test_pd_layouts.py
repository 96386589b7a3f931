#!/usr/bin/env python3
"""Disaggregated prefill/decode between pools of different PP, and a prefill gang of two
nodes (issue #26): equal TP (1), any PP.

* Prefill PP 2 on two nodes (local mode: node 0 on 127.0.0.1, node 1 on 127.0.0.2, each
  serving its rank's KV exports on --kv-port + rank at its own address only) -> decode
  PP 1: the prefill gang's answer names its layout (layers 4, pp 2, tp 1) and each node's
  address ("hosts"); the decode rank fetches layers 0-1 from rank 0 at 127.0.0.1 and
  layers 2-3 from rank 1 at 127.0.0.2 (the replica's one address would be refused).
* Prefill PP 1 -> decode PP 2: each decode stage fetches its half of the layers from the
  one prefill rank.
* Prefill TP 2 x PP 2 on two nodes of two ranks -> decode TP 2 x PP 1: decode rank t
  fetches from ranks t (node 0) and 2 + t (node 1, ports --kv-port + 2 and + 3).
Both through a router: greedy tokens equal the decode gang's own (a single gang's), the
prompts with full blocks were exported and fetched (ganglion_kv_imports_total,
_imported_blocks_total), none fell back.
* A hand-over naming a layout of another model (5 layers) is not fetched: the decode gang
  prefills (ganglion_kv_import_layout_mismatches_total, _import_fallbacks_total) and the
  tokens are the same; a layout out of bounds (pp > layers, a host that is not IPv4) is a
  400."""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_dp_router as DP  # noqa: E402
import test_pd_router as PD  # noqa: E402

H.TEST_DEADLINE_S = 200


def kv_counts(g):
    c = PD.kv_counts(g)
    c["mismatches"] = DP.replica_metric(g, "ganglion_kv_import_layout_mismatches_total")
    return c


def check_routed(prefill, decode, rport, what):
    """Every body through the router equals the decode gang's own answer, and its full
    blocks were fetched, none fell back."""
    kp0, kd0 = kv_counts(prefill), kv_counts(decode)
    PD.check_equal(decode, rport, streamed=True)
    kp, kd = kv_counts(prefill), kv_counts(decode)
    moved = {k: kd[k] - kd0[k] for k in kd}
    # The 40- and 130-token prompts (2 and 8 full blocks), plain and streamed.
    H.check(kp["exports"] - kp0["exports"] == 4 and
            kp["exported_blocks"] - kp0["exported_blocks"] == 20,
            "%s: prefill exports %r -> %r" % (what, kp0, kp))
    H.check(moved["imports"] == 4 and moved["imported_blocks"] == 20 and
            moved["import_fallbacks"] == 0 and moved["mismatches"] == 0,
            "%s: decode imports %r" % (what, moved))
    H.log("%s: answers equal one gang's; %d transfers of %d blocks fetched, none fell back"
          % (what, moved["imports"], moved["imported_blocks"]))


def check_handover(prefill, decode, want_layout):
    """The prefill gang's answer names its layout; a layout that cannot feed the decode
    gang falls back (counted), one out of bounds is refused."""
    body = PD.bodies()[1]
    code, r = DP.post(prefill.http_port, "/v1/completions", dict(body, max_tokens=1))
    H.check(code == 200 and "kv_transfer" in r, "prefill answer: %r %r" % (code, r))
    kv = r["kv_transfer"]
    got = {k: kv.get(k) for k in want_layout}
    H.check(got == want_layout, "kv_transfer %r, want %r" % (kv, want_layout))
    want = PD.reference(decode, body)
    k0 = kv_counts(decode)
    other = dict(kv, host="127.0.0.1", layers=5, pp=1, tp=1)
    other.pop("hosts", None)
    other.pop("ranks_per_node", None)
    code, got = DP.post(decode.http_port, "/v1/completions", dict(body, kv_transfer=other))
    H.check(code == 200 and got["choices"][0]["tokens"] == want,
            "another model's layout: %r %r (want %r)" % (code, got, want))
    k1 = kv_counts(decode)
    H.check(k1["mismatches"] - k0["mismatches"] == 1 and
            k1["import_fallbacks"] - k0["import_fallbacks"] == 1 and
            k1["imports"] == k0["imports"], "layout mismatch counts %r -> %r" % (k0, k1))
    bads = (dict(other, layers=4, pp=5),
            dict(other, layers=4, hosts=["node-1"], ranks_per_node=1))
    for bad in bads:
        code, got = DP.post(decode.http_port, "/v1/completions", dict(body, kv_transfer=bad))
        H.check(code == 400, "layout %r answered %r %r" % (bad, code, got))
    H.log("hand-over %r; another model's layout prefilled (counted), bad ones refused"
          % want_layout)


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=128, heads=4,
                      kv_heads=2, ffn=256, vocab=PD.VOCAB, max_pos=PD.CTX, seed=13)
    extra = ["--model", model, "--max-batch", "4", "--kv-cache-mb", "32",
             "--request-timeout-ms", "60000", "--step-timeout-ms", "5000"]
    kv_a, kv_c = h.free_port_pair()
    kv_e = h.free_port_pair()[0]
    # prefill PP 2 over two nodes -> decode PP 1
    pa = H.Gang(h, nnodes=2, nproc_per_node=1, job="pdl-pa",
                extra=extra + ["--pp", "2", "--role", "prefill", "--kv-port", str(kv_a)])
    db = H.Gang(h, nnodes=1, nproc_per_node=1, job="pdl-db", extra=extra + ["--role", "decode"])
    # prefill PP 1 -> decode PP 2
    pc = H.Gang(h, nnodes=1, nproc_per_node=1, job="pdl-pc",
                extra=extra + ["--role", "prefill", "--kv-port", str(kv_c)])
    dd = H.Gang(h, nnodes=1, nproc_per_node=2, job="pdl-dd",
                extra=extra + ["--pp", "2", "--role", "decode"])
    # prefill TP 2 x PP 2 over two nodes -> decode TP 2 x PP 1
    pe = H.Gang(h, nnodes=2, nproc_per_node=2, job="pdl-pe",
                extra=extra + ["--tp", "2", "--pp", "2", "--role", "prefill", "--kv-port",
                               str(kv_e)])
    df = H.Gang(h, nnodes=1, nproc_per_node=2, job="pdl-df",
                extra=extra + ["--tp", "2", "--role", "decode"])
    gangs = (pa, db, pc, dd, pe, df)
    for g in gangs:
        g.start_local(expect=(0,))
    r1, rport1 = PD.start_router(h, pa, db)
    r2, rport2 = PD.start_router(h, pc, dd)
    r3, rport3 = PD.start_router(h, pe, df)
    for g in gangs:
        g.wait_serving(timeout=90)
    for rp in (rport1, rport2, rport3):
        H.wait_until(lambda: PD.disaggregated(rp), 20, 0.05, "a router to see both roles")
    check_routed(pa, db, rport1, "prefill PP 2 on 2 nodes -> decode PP 1")
    check_routed(pc, dd, rport2, "prefill PP 1 -> decode PP 2")
    check_routed(pe, df, rport3, "prefill TP 2 x PP 2 on 2 nodes -> decode TP 2 x PP 1")
    check_handover(pa, db, {"layers": 4, "pp": 2, "tp": 1, "ranks_per_node": 1,
                            "hosts": ["127.0.0.1", "127.0.0.2"]})
    check_handover(pc, dd, {"layers": 4, "pp": 1, "tp": 1, "hosts": None})
    check_handover(pe, df, {"layers": 4, "pp": 2, "tp": 2, "ranks_per_node": 2,
                            "hosts": ["127.0.0.1", "127.0.0.2"]})
    H.check(r1.stop() == 0 and r2.stop() == 0 and r3.stop() == 0, "a router did not exit 0")
    for g in gangs:
        H.check(g.stop()["local"] == 0, "gang %s did not exit 0" % g.job)


if __name__ == "__main__":
    H.run(scenario)
