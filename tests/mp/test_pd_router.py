#!/usr/bin/env python3
"""Disaggregated prefill/decode behind `ganglion router` (issue #26): a gang started
`--role prefill --kv-port P`, one started `--role decode` (TP 2 each: two ranks, so every
transfer is two ranks' parts and rank 0's agreement) of the same tiny model, and a router
in front of them.

* The router learns the roles from the replicas' ganglion_role and says it is
  disaggregated in /status.
* Greedy answers through the router equal the decode gang's own (a single gang on the same
  requests), completions streamed and not, and chat: each call's prefill (max_tokens 1)
  went to the prefill gang first (its prompt-token counter grows by the prompts, the
  router counts the prefills, none failed), its answer came from the decode gang.
  Calls P/D does not split (n = 2) go straight to the decode gang, and are counted.
* KV transfer: every prompt of at least one full 16-token block is exported by the
  prefill gang (ganglion_kv_exports_total), handed over by the router with the prefill
  gang's address, and fetched by the decode gang, which starts from those blocks
  (ganglion_kv_imports_total, _imported_blocks_total, no fallback).
* KV transfer failure: a second decode gang with another token behind a second router:
  every fetch is refused by the prefill gang's ranks (the token is not proved), the decode
  gang prefills instead (ganglion_kv_import_fallbacks_total) and the tokens are still the
  single gang's.
* Prefill failure, fallback: with the prefill gang's agent stopped (SIGSTOP), every call
  still gets the single gang's tokens after --prefill-timeout-ms (the decode gang
  prefills it), counted in ganglion_router_pd_prefill_failures_total; with its agent
  killed (SIGKILL), the router marks it down and sends the calls straight to the decode
  gang (ganglion_router_pd_prefill_skipped_total) until local mode has restarted it, then
  splits calls again.
* A decode gang that dies for good mid-stream: a third router over the prefill gang and
  two decode gangs; after the first token of a long greedy stream, the decode gang serving
  it is killed (its whole `serve --local`, so it stays down): the router sends the call
  again through the prefill gang to the other decode gang, and the client's one stream
  ends with [DONE] and exactly the single gang's tokens, none twice
  (ganglion_router_stream_resumes_total)."""
import json
import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import test_dp_router as DP  # noqa: E402

VOCAB = 256
CTX = 512
H.TEST_DEADLINE_S = 200
PREFILL_TIMEOUT_MS = 1500


def start_router(h, prefill, decode):
    rport = h.free_port_pair()[1]
    reps = ",".join("127.0.0.1:%d" % g.http_port for g in (prefill, decode))
    p = h.spawn("router", [h.bin, "router", "--replicas", reps, "--http-port", str(rport),
                           "--bind-address", "127.0.0.1", "--poll-interval-ms", "50",
                           "--poll-timeout-ms", "300", "--request-timeout-ms", "60000",
                           "--prefill-timeout-ms", str(PREFILL_TIMEOUT_MS),
                           "--down-after-fails", "2"])
    return p, rport


def disaggregated(rport):
    code, body = DP.router_get(rport, "/status")
    if code != 200:
        return None
    st = json.loads(body)
    return st if st["disaggregated"] else None


def serving_since_ms(gang):
    """Wall-clock ms since which a gang's coordinator serves (its /status), or -1 while it
    does not answer or is not ready."""
    code, body = H.http_get("127.0.0.1", gang.http_port, "/status", timeout=1.0)
    if code != 200:
        return -1
    st = json.loads(body)
    return st["gang"]["serving_since_wall_ms"] if st.get("ready") and "gang" in st else -1


def bodies():
    out = []
    for i, n in enumerate((5, 40, 130)):
        prompt = [(i * 31 + k * 7) % (VOCAB - 3) + 2 for k in range(n)]
        out.append({"prompt": prompt, "max_tokens": 12})
    return out


def reference(decode, body):
    code, r = DP.post(decode.http_port, "/v1/completions", body)
    H.check(code == 200, "the decode gang alone answered %r %r" % (code, r))
    return r["choices"][0]["tokens"]


def check_equal(decode, rport, streamed=True):
    """Every body through the router equals the decode gang's own answer."""
    for body in bodies():
        want = reference(decode, body)
        code, got = DP.post(rport, "/v1/completions", body)
        H.check(code == 200, "router answered %r %r" % (code, got))
        H.check(got["choices"][0]["tokens"] == want, "router tokens %r != one gang's %r"
                % (got["choices"][0]["tokens"], want))
        if streamed:
            toks, done, err = DP.stream(rport, "/v1/completions", body)
            H.check(done and err is None and toks == want,
                    "streamed through the router: %r %r %r (want %r)" % (toks, done, err, want))


def kv_counts(g):
    return {k: DP.replica_metric(g, "ganglion_kv_" + k + "_total") for k in
            ("exports", "exported_blocks", "imports", "imported_blocks", "import_fallbacks")}


def check_pd(prefill, decode, rport):
    m0 = DP.router_metrics(rport)
    kp0, kd0 = kv_counts(prefill), kv_counts(decode)
    p0 = DP.replica_metric(prefill, "ganglion_prompt_tokens_total")
    check_equal(decode, rport)
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    code, direct = DP.post(decode.http_port, "/v1/chat/completions", chat)
    code2, routed = DP.post(rport, "/v1/chat/completions", chat)
    H.check(code == code2, "chat: router %r, decode gang %r" % (code2, code))
    if code == 200:
        H.check(routed["choices"][0]["message"] == direct["choices"][0]["message"],
                "chat through the router: %r != %r" % (routed, direct))
    m = DP.router_metrics(rport)
    prefills = m["ganglion_router_pd_prefills_total"] - m0["ganglion_router_pd_prefills_total"]
    calls = 2 * len(bodies()) + 1
    H.check(prefills == calls, "%d prefills for %d calls" % (prefills, calls))
    H.check(m["ganglion_router_pd_prefill_failures_total"] == 0, "a prefill failed: %r" % m)
    p1 = DP.replica_metric(prefill, "ganglion_prompt_tokens_total")
    want = 2 * sum(len(b["prompt"]) for b in bodies())
    H.check(p1 - p0 >= want, "the prefill gang saw %d prompt tokens, want >= %d"
            % (p1 - p0, want))
    H.check(m["ganglion_router_prefill_seconds_count"] >= calls, "prefill histogram: %r" % m)
    # The two prompts with full blocks (40 and 130 tokens: 2 and 8 blocks), plain and
    # streamed, moved their blocks; the 5-token one has none to move.
    kp, kd = kv_counts(prefill), kv_counts(decode)
    moved = {k: kd[k] - kd0[k] for k in kd}
    H.check(kp["exports"] - kp0["exports"] == 4 and
            kp["exported_blocks"] - kp0["exported_blocks"] == 20,
            "prefill exports %r -> %r" % (kp0, kp))
    handed = m["ganglion_router_pd_kv_handovers_total"] - \
        m0["ganglion_router_pd_kv_handovers_total"]
    H.check(handed == 4, "router handed %d transfers over, want 4" % handed)
    H.check(moved["imports"] == 4 and moved["imported_blocks"] == 20 and
            moved["import_fallbacks"] == 0, "decode imports: %r" % moved)
    # A call P/D does not split goes straight to the decode gang.
    skipped0 = m["ganglion_router_pd_prefill_skipped_total"]
    body = {"prompt": [9, 8, 7, 6], "max_tokens": 5, "n": 2}
    code, r = DP.post(rport, "/v1/completions", body)
    H.check(code == 200 and len(r["choices"]) == 2, "n=2 through the router: %r %r" % (code, r))
    m = DP.router_metrics(rport)
    H.check(m["ganglion_router_pd_prefill_skipped_total"] == skipped0 + 1,
            "n=2 was not counted as skipped")
    H.log("P/D: %d calls prefilled on the prefill gang (%d prompt tokens), answers equal; "
          "%d transfers of %d blocks fetched by the decode gang"
          % (prefills, p1 - p0, moved["imports"], moved["imported_blocks"]))


def check_kv_refused(h, prefill, decode, extra):
    """A decode gang without the prefill gang's token: every fetch is refused, every call
    falls back to a prefill on the decode gang with the same tokens."""
    other = os.path.join(h.tmp, "other-token")
    with open(other, "w") as f:
        f.write("another-token-not-the-gangs-0123456789\n")
    d2 = H.Gang(h, nnodes=1, nproc_per_node=2, token=False, job="pd-d2",
                extra=extra + ["--role", "decode", "--token-file", other])
    d2.start_local(expect=(0,))
    router2, rport2 = start_router(h, prefill, d2)
    d2.wait_serving(timeout=60)
    H.wait_until(lambda: disaggregated(rport2), 10, 0.05, "the second router to see both roles")
    k0 = kv_counts(d2)
    check_equal(decode, rport2, streamed=False)
    k1 = kv_counts(d2)
    H.check(k1["imports"] == k0["imports"] and
            k1["import_fallbacks"] - k0["import_fallbacks"] == 2,
            "with another token: imports %r -> %r" % (k0, k1))
    H.log("KV fetches without the token: refused, %d calls fell back with the right tokens"
          % (k1["import_fallbacks"] - k0["import_fallbacks"]))
    H.check(router2.stop() == 0, "the second router did not exit 0")
    H.check(d2.stop()["local"] == 0, "the second decode gang did not exit 0")


def check_prefill_stalled(prefill, decode, rport):
    """The prefill gang stops answering: every call falls back after the prefill deadline."""
    agent = prefill.agent_pid(0)
    before = DP.router_metrics(rport)["ganglion_router_pd_prefill_failures_total"]
    os.kill(agent, signal.SIGSTOP)
    try:
        body = bodies()[1]
        want = reference(decode, body)
        t0 = time.time()
        code, got = DP.post(rport, "/v1/completions", body, timeout=30)
        took = time.time() - t0
    finally:
        os.kill(agent, signal.SIGCONT)
    H.check(code == 200 and got["choices"][0]["tokens"] == want,
            "with the prefill gang stopped: %r %r (want %r)" % (code, got, want))
    after = DP.router_metrics(rport)["ganglion_router_pd_prefill_failures_total"]
    H.check(after >= before + 1, "no prefill failure counted: %r -> %r" % (before, after))
    H.log("prefill gang stopped: the call fell back after %.2f s with the right tokens" % took)


def check_prefill_killed(h, prefill, decode, rport):
    """The prefill gang dies under load: no call is lost or wrong; P/D resumes after."""
    refs = [reference(decode, b) for b in bodies()]
    results = [None] * 12

    def run(i):
        b = bodies()[i % 3]
        try:
            if i % 2:
                results[i] = ("stream",) + DP.stream(rport, "/v1/completions", b)
            else:
                results[i] = ("plain",) + DP.post(rport, "/v1/completions", b)
        except Exception as e:  # noqa: BLE001 (reported below as a lost call)
            results[i] = ("exception", repr(e))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(12)]
    for t in threads[:6]:
        t.start()
    t_kill_ms = time.time() * 1000.0
    victim = prefill.agent_pid(0)
    os.kill(victim, signal.SIGKILL)
    H.log("killed the prefill gang's agent (pid %d)" % victim)
    for t in threads[6:]:
        t.start()
    for t in threads:
        t.join(60)
        H.check(not t.is_alive(), "a call through the router did not finish")
    for i, res in enumerate(results):
        H.check(res is not None and res[0] != "exception", "call %d lost: %r" % (i, res))
        want = refs[i % 3]
        if res[0] == "plain":
            H.check(res[1] == 200 and res[2]["choices"][0]["tokens"] == want,
                    "call %d: %r %r" % (i, res[1], res[2]))
        else:
            H.check(res[2] and res[3] is None and res[1] == want,
                    "stream %d: %r done %r error %r" % (i, res[1], res[2], res[3]))
    m = DP.router_metrics(rport)
    H.check(m["ganglion_router_requests_total"] == m["ganglion_router_answered_total"],
            "router accepted %r, answered %r" % (m["ganglion_router_requests_total"],
                                                 m["ganglion_router_answered_total"]))
    H.log("prefill gang killed under 12 calls: all answered with the right tokens "
          "(prefill failures %d, skipped %d)" % (m["ganglion_router_pd_prefill_failures_total"],
                                                 m["ganglion_router_pd_prefill_skipped_total"]))
    # The router may still list the prefill gang as up from before the kill (it marks a
    # replica down only after --down-after-fails polls): wait for the restarted gang itself
    # to serve first (its generation starts again at 1: its coordinator was killed), then for
    # the router to route to it.
    H.wait_until(lambda: serving_since_ms(prefill) > t_kill_ms, 60, 0.05,
                 "the prefill gang to serve again after the kill")
    H.wait_until(lambda: disaggregated(rport), 60, 0.05,
                 "the restarted prefill gang to be back in the router")
    before = DP.router_metrics(rport)["ganglion_router_pd_prefills_total"]
    check_equal(decode, rport, streamed=False)
    after = DP.router_metrics(rport)["ganglion_router_pd_prefills_total"]
    H.check(after == before + len(bodies()), "P/D did not resume: %r -> %r" % (before, after))


def try_decode_kill(rport, body, gangs, workers):
    """Streams body; at its first token read, stops the decode gangs' workers and kills
    the serving gang for good (then continues the others). (result list, victim or None
    when nothing was in flight any more, the reading thread)."""
    first = threading.Event()

    def on_token():
        if not first.is_set():
            for w in workers:
                os.kill(w, signal.SIGSTOP)
            first.set()

    res, victim = [], None
    t = threading.Thread(target=lambda: res.append(DP.stream(rport, "/v1/completions", body,
                                                             on_token=on_token)), daemon=True)
    t.start()
    try:
        H.check(first.wait(30), "no first token through the router")
        st = json.loads(DP.router_get(rport, "/status")[1])
        serving = [i for i, r in enumerate(st["replicas"]) if r["in_flight"] > 0 and i in gangs]
        H.check(len(serving) <= 1, "the stream is in flight on %r" % serving)
        if serving:
            victim = gangs[serving[0]]
            victim.local.expect = {0, -signal.SIGKILL}
            victim.local.kill_group()
            H.log("killed decode gang %s for good after the first token"
                  % victim.flags[victim.flags.index("--job-name") + 1])
    finally:
        for w in workers:
            try:
                os.kill(w, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the dead gang's
    return res, victim, t


def check_decode_dies(h, prefill, decode, extra):
    """The decode gang serving a stream dies for good after its first token: the stream
    resumes on the other decode gang with the single gang's tokens. Returns the victim."""
    d3 = H.Gang(h, nnodes=1, nproc_per_node=2, job="pd-d3",
                extra=extra + ["--role", "decode"])
    d3.start_local(expect=(0,))
    rport = h.free_port_pair()[1]
    reps = ",".join("127.0.0.1:%d" % g.http_port for g in (prefill, decode, d3))
    router3 = h.spawn("router3", [h.bin, "router", "--replicas", reps, "--http-port",
                                  str(rport), "--bind-address", "127.0.0.1",
                                  "--poll-interval-ms", "50", "--poll-timeout-ms", "300",
                                  "--request-timeout-ms", "60000", "--prefill-timeout-ms",
                                  str(PREFILL_TIMEOUT_MS), "--down-after-fails", "2"])
    d3.wait_serving(timeout=60)
    H.wait_until(lambda: (disaggregated(rport) or {}).get("replicas") and
                 all(r["up"] for r in disaggregated(rport)["replicas"]), 20, 0.05,
                 "the third router to see its three replicas up")
    body = {"prompt": [(k * 5 + 3) % (VOCAB - 3) + 2 for k in range(40)], "max_tokens": 400}
    want = reference(decode, body)
    H.check(want == reference(d3, body), "the two decode gangs answer differently")
    gangs = {1: decode, 2: d3}
    workers = [g.worker_pid(0, r) for g in gangs.values() for r in (0, 1)]
    m0 = DP.router_metrics(rport)
    for _ in range(5):
        res, victim, t = try_decode_kill(rport, body, gangs, workers)
        if victim is not None:
            break
        t.join(60)
        H.check(res and res[0][0] == want and res[0][1], "an uncut stream: %r" % (res,))
        H.log("the stream finished before its first token was read; again")
    H.check(victim is not None, "the stream was never in flight at its first token")
    t.join(60)
    H.check(res, "the stream did not end")
    toks, done, err = res[0]
    H.check(err is None and done, "the stream after its decode gang died: done %r, error %r"
            % (done, err))
    H.check(toks == want, "the resumed stream's %d tokens differ from the %d of one gang"
            % (len(toks), len(want)))
    m = DP.router_metrics(rport)
    H.check(m["ganglion_router_stream_resumes_total"] ==
            m0["ganglion_router_stream_resumes_total"] + 1, "no resume counted: %r" % m)
    H.check(m["ganglion_router_pd_prefills_total"] >= m0["ganglion_router_pd_prefills_total"] + 2,
            "the resumed call did not go through the prefill gang again")
    H.log("decode gang died mid-stream: resumed on the other, %d tokens equal" % len(toks))
    H.check(router3.stop() == 0, "the third router did not exit 0")
    survivor = d3 if victim is decode else decode
    if survivor is d3:
        H.check(d3.stop()["local"] == 0, "the third decode gang did not exit 0")
    return victim


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=256, heads=4,
                      kv_heads=2, ffn=512, vocab=VOCAB, max_pos=CTX, seed=11)
    extra = ["--model", model, "--max-batch", "4", "--kv-cache-mb", "64",
             "--request-timeout-ms", "60000", "--step-timeout-ms", "5000"]
    extra += ["--tp", "2"]
    kv_port = h.free_port_pair()[0]
    prefill = H.Gang(h, nnodes=1, nproc_per_node=2, job="pd-p",
                     extra=extra + ["--role", "prefill", "--kv-port", str(kv_port)])
    decode = H.Gang(h, nnodes=1, nproc_per_node=2, extra=extra + ["--role", "decode"],
                    job="pd-d")
    prefill.start_local(expect=(0,))
    decode.start_local(expect=(0,))
    router, rport = start_router(h, prefill, decode)
    prefill.wait_serving(timeout=60)
    decode.wait_serving(timeout=60)
    H.check(DP.replica_metric(prefill, "ganglion_role") == 1, "prefill gang's ganglion_role")
    H.check(DP.replica_metric(decode, "ganglion_role") == 2, "decode gang's ganglion_role")
    st = H.wait_until(lambda: disaggregated(rport), 10, 0.05, "the router to see both roles")
    H.check([r["role"] for r in st["replicas"]] == ["prefill", "decode"], "roles %r" % st)
    check_pd(prefill, decode, rport)
    check_kv_refused(h, prefill, decode, extra)
    check_prefill_stalled(prefill, decode, rport)
    check_prefill_killed(h, prefill, decode, rport)
    victim = check_decode_dies(h, prefill, decode, extra)
    H.check(router.stop() == 0, "router did not exit 0")
    H.check(prefill.stop()["local"] == 0, "the prefill gang did not exit 0")
    if victim is not decode:
        H.check(decode.stop()["local"] == 0, "the decode gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
