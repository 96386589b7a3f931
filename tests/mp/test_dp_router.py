#!/usr/bin/env python3
"""Data-parallel replicas behind `ganglion router` (issue #26): two gangs (one rank each,
`serve --local`) of the same tiny model and a router in front of them.

* The router's load of each replica includes its free KV blocks (ganglion_kv_cache_blocks_free
  of its coordinator), in /status and /metrics.
* Greedy answers through the router equal one gang's, streamed and not, completions and
  chat; /v1/models goes through too; /healthz, /readyz, /status, /metrics answer; a router
  that finds the replicas by DNS (--replicas-dns) routes the same.
* Prefix affinity: 4 conversations, each with its own 48-token prefix, 3 turns each: the
  follow-ups are routed by prefix (ganglion_router_decisions_total{reason="prefix"}),
  both replicas get work, and the replicas' own prefix caches hit on the follow-ups.
* Failure: with 24 calls in flight (20 unstreamed, 4 streamed), kill -9 of replica A's
  agent: every call is answered exactly once; every unstreamed one with 200 and the single
  gang's tokens (moved to replica B by the router); every stream completes with the same
  tokens, exactly once each (one A had begun resumes on B). The router counts the moves,
  marks A down, and up again once local mode has restarted it, and routes to it again.
* A stream whose replica's agent is killed after its first token resumes on the other
  replica: the client's stream ends with [DONE] and its tokens are exactly the single
  gang's, none twice (ganglion_router_stream_resumes_total, no stream error).
* A sampled stream without a seed cannot be resumed with the same text: cut the same way,
  it ends with an SSE error event and no [DONE], its tokens a prefix of what it had (never
  spliced with another replica's different text)."""
import http.client
import json
import os
import signal
import sys
import threading

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

VOCAB = 256
CTX = 512
H.TEST_DEADLINE_S = 200


def router_get(port, path):
    return H.http_get("127.0.0.1", port, path, timeout=2.0)


def router_metrics(port):
    code, text = router_get(port, "/metrics")
    H.check(code == 200, "router /metrics answered %r" % code)
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            name, _, v = ln.rpartition(" ")
            out[name] = float(v)
    return out


def replica_metric(g, name):
    code, text = g.get(0, "/metrics")
    H.check(code == 200, "replica /metrics answered %r" % code)
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    return 0.0


def post(port, path, body, timeout=60.0):
    return H.http_post("127.0.0.1", port, path, body, timeout)


def stream(port, path, body, timeout=60.0, on_token=None):
    """(tokens, done, error event or None) of a streamed call; on_token() after each
    event with tokens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:  # (the body is read only then: it is the stream itself)
        raise H.TestFailure("stream answered %r %r" % (r.status, r.read()[:300]))
    toks, done, err = [], False, None
    for raw in r:
        line = raw.decode().rstrip("\r\n")
        if not line:
            continue
        H.check(line.startswith("data: "), "not an SSE data line: %r" % line)
        H.check(not done, "data after [DONE]: %r" % line)
        if line[6:] == "[DONE]":
            done = True
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            H.check(err is None, "two error events")
            err = ev
            continue
        H.check(err is None, "data after an error event: %r" % line)
        for ch in ev.get("choices", []):
            toks += ch.get("tokens", [])
        if on_token is not None and toks:
            on_token()
    conn.close()
    return toks, done, err


def prompt_of(conv, turn):
    """A 48-token prefix of its own per conversation, then the turn's tokens."""
    prefix = [(conv * 37 + i * 11) % (VOCAB - 3) + 2 for i in range(48)]
    return prefix + [(turn * 13 + i) % (VOCAB - 3) + 2 for i in range(5 + turn)]


def start_router(h, ports):
    rport = h.free_port_pair()[1]
    reps = ",".join("127.0.0.1:%d" % p for p in ports)
    p = h.spawn("router", [h.bin, "router", "--replicas", reps, "--http-port", str(rport),
                           "--bind-address", "127.0.0.1", "--poll-interval-ms", "50",
                           "--poll-timeout-ms", "500", "--request-timeout-ms", "60000",
                           "--load-slack", "64"])
    return p, rport


def replicas_up(rport, want):
    code, body = router_get(rport, "/status")
    if code != 200:
        return None
    st = json.loads(body)
    return st if [r["up"] for r in st["replicas"]] == want else None


def check_kv_free(ga, gb, rport):
    """The router's load of each replica includes the free KV blocks its coordinator
    reports (ganglion_kv_cache_blocks_free), in /status and /metrics."""
    want = [replica_metric(g, "ganglion_kv_cache_blocks_free") for g in (ga, gb)]
    H.check(all(w > 0 for w in want), "the replicas report no free KV blocks: %r" % want)

    def seen():
        st = json.loads(router_get(rport, "/status")[1])
        return [r["kv_free_blocks"] for r in st["replicas"]] == want

    H.wait_until(seen, 10, 0.05, "the router to report the replicas' %r free KV blocks" % want)
    m = router_metrics(rport)
    got = [v for k, v in m.items() if k.startswith("ganglion_router_replica_kv_free_blocks{")]
    H.check(sorted(got) == sorted(want), "kv free blocks in /metrics %r, want %r" % (got, want))
    H.log("the router sees %r free KV blocks on the replicas" % want)


def check_same_answers(g, rport):
    for body in ({"prompt": [1, 5, 9, 13, 17], "max_tokens": 16},
                 {"prompt": prompt_of(9, 0), "max_tokens": 8}):
        code, want = post(g.http_port, "/v1/completions", body)
        H.check(code == 200, "replica answered %r %r" % (code, want))
        code, got = post(rport, "/v1/completions", body)
        H.check(code == 200, "router answered %r %r" % (code, got))
        got_t, want_t = got["choices"][0]["tokens"], want["choices"][0]["tokens"]
        H.check(got_t == want_t, "router tokens %r != one gang's %r" % (got_t, want_t))
        toks, done, err = stream(rport, "/v1/completions", body)
        H.check(done and err is None and toks == want["choices"][0]["tokens"],
                "streamed through the router: %r %r %r" % (toks, done, err))
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    code, r = post(rport, "/v1/chat/completions", chat)
    H.check(code in (200, 400), "chat through the router answered %r %r" % (code, r))
    code, body = router_get(rport, "/v1/models")
    H.check(code == 200 and "data" in json.loads(body), "/v1/models: %r %r" % (code, body))
    H.check(router_get(rport, "/nowhere")[0] == 404, "an unknown path is not 404")


def check_dns_router(h, ga, gb):
    """Replicas found by DNS (--replicas-dns): each name's addresses, re-resolved."""
    dport = h.free_port_pair()[1]
    names = ",".join("localhost:%d" % g.http_port for g in (ga, gb))
    p = h.spawn("router-dns", [h.bin, "router", "--replicas-dns", names, "--http-port",
                               str(dport), "--bind-address", "127.0.0.1",
                               "--dns-interval-ms", "50", "--poll-interval-ms", "50"])
    st = H.wait_until(lambda: replicas_up(dport, [True, True]), 10, 0.05,
                      "the replicas of --replicas-dns to come up")
    H.check(sorted(r["name"] for r in st["replicas"]) ==
            sorted("127.0.0.1:%d" % g.http_port for g in (ga, gb)), "found %r" % st)
    body = {"prompt": [2, 4, 6, 8], "max_tokens": 6}
    code, want = post(gb.http_port, "/v1/completions", body)
    code2, got = post(dport, "/v1/completions", body)
    H.check(code == 200 and code2 == 200 and got["choices"][0]["tokens"] ==
            want["choices"][0]["tokens"], "through --replicas-dns: %r %r" % (code2, got))
    H.check(p.stop() == 0, "the DNS router did not exit 0")


def check_affinity(ga, gb, rport):
    before = router_metrics(rport)
    hits0 = replica_metric(ga, "ganglion_prefix_cache_hit_tokens_total") + \
        replica_metric(gb, "ganglion_prefix_cache_hit_tokens_total")
    for turn in range(3):
        for conv in range(4):
            code, r = post(rport, "/v1/completions", {"prompt": prompt_of(conv, turn),
                                                      "max_tokens": 4})
            H.check(code == 200, "conversation %d turn %d: %r %r" % (conv, turn, code, r))
    m = router_metrics(rport)
    prefix = m['ganglion_router_decisions_total{reason="prefix"}'] - \
        before['ganglion_router_decisions_total{reason="prefix"}']
    H.check(prefix >= 8, "only %d of the 8 follow-up turns were routed by prefix" % prefix)
    sent = [m[k] for k in m if k.startswith("ganglion_router_replica_requests_total")]
    H.check(len(sent) == 2 and min(sent) > 0, "a replica got no work: %r" % sent)
    hits = replica_metric(ga, "ganglion_prefix_cache_hit_tokens_total") + \
        replica_metric(gb, "ganglion_prefix_cache_hit_tokens_total") - hits0
    H.check(hits >= 8 * 48, "the replicas' caches hit %d tokens on 8 follow-ups of 48" % hits)
    H.log("affinity: %d follow-ups by prefix, %d cached tokens hit, requests %r"
          % (prefix, hits, sent))


def check_kill(h, ga, gb, rport):
    # 8 distinct prompts, 3 calls each; their references from replica B alone, in parallel.
    bodies = [{"prompt": prompt_of(20 + i % 8, 1), "max_tokens": 300} for i in range(24)]
    refs = {}

    def reference(i):
        code, r = post(gb.http_port, "/v1/completions", bodies[i], timeout=120)
        refs[i] = r["choices"][0]["tokens"] if code == 200 else None

    ref_threads = [threading.Thread(target=reference, args=(i,), daemon=True) for i in range(8)]
    for t in ref_threads:
        t.start()
    for t in ref_threads:
        t.join(150)
    H.check(all(refs.get(i) for i in range(8)), "a reference call failed: %r" % refs.keys())
    want = [refs[i % 8] for i in range(24)]
    results = [None] * len(bodies)

    def run(i):
        try:
            if i % 6 == 5:
                results[i] = ("stream",) + stream(rport, "/v1/completions", bodies[i])
            else:
                results[i] = ("plain",) + post(rport, "/v1/completions", bodies[i])
        except Exception as e:  # noqa: BLE001 (reported below as a lost call)
            results[i] = ("exception", repr(e))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
    # Replica A's worker is held (SIGSTOP) until its agent dies: on a quiet machine the tiny
    # model could otherwise answer every call before the router's table is read.
    worker_a = ga.worker_pid(0, 0)
    os.kill(worker_a, signal.SIGSTOP)
    try:
        for t in threads:
            t.start()

        def busy_on_a():
            st = json.loads(router_get(rport, "/status")[1])
            return st["replicas"][0]["in_flight"] > 0

        H.wait_until(busy_on_a, 20, 0.005, "calls in flight on replica A")
        victim = ga.agent_pid(0)
        os.kill(victim, signal.SIGKILL)
    finally:
        try:
            os.kill(worker_a, signal.SIGCONT)
        except ProcessLookupError:
            pass  # gone with its agent
    H.log("killed replica A's agent (pid %d)" % victim)
    for t in threads:
        t.join(90)
        H.check(not t.is_alive(), "a call through the router did not finish")
    cut = 0
    for i, res in enumerate(results):
        H.check(res is not None and res[0] != "exception", "call %d lost: %r" % (i, res))
        if res[0] == "plain":
            code, r = res[1], res[2]
            H.check(code == 200, "call %d answered %r %r" % (i, code, r))
            H.check(r["choices"][0]["tokens"] == want[i], "call %d: wrong tokens" % i)
        else:
            toks, done, err = res[1], res[2], res[3]
            H.check(err is None and done and toks == want[i],
                    "stream %d: %d tokens (want %d), done %r, error %r"
                    % (i, len(toks), len(want[i]), done, err))
    m = router_metrics(rport)
    acc, ans = m["ganglion_router_requests_total"], m["ganglion_router_answered_total"]
    H.check(acc == ans, "router accepted %r calls, answered %r" % (acc, ans))
    resumed = m["ganglion_router_stream_resumes_total"]
    H.check(m["ganglion_router_retries_total"] + resumed >= 1,
            "no call was moved although replica A died with calls in flight")
    H.check(m["ganglion_router_stream_errors_total"] == cut, "stream errors %r != %d" %
            (m["ganglion_router_stream_errors_total"], cut))
    H.log("kill: %d calls answered, %d moved to B, %d streams resumed on B after tokens"
          % (len(bodies), m["ganglion_router_retries_total"], resumed))


def try_stream_cut(ga, gb, rport, body):
    """One try: (index of the replica killed or None, the stream's result). The tiny model
    answers 400 tokens in well under a second: at the first token the client reads, both
    replicas' workers are stopped (SIGSTOP, from the reading thread), the one serving the
    stream loses its agent, then both continue. On a loaded machine the whole stream may
    already be through the router by then (nothing in flight): the caller tries again."""
    workers = [g.worker_pid(0, 0) for g in (ga, gb)]
    first = threading.Event()

    def on_token():
        if not first.is_set():
            for w in workers:
                os.kill(w, signal.SIGSTOP)
            first.set()

    res, victim = [], None
    t = threading.Thread(target=lambda: res.append(stream(rport, "/v1/completions", body,
                                                          on_token=on_token)), daemon=True)
    t.start()
    try:
        H.check(first.wait(30), "no first token through the router")
        st = json.loads(router_get(rport, "/status")[1])
        serving = [i for i, rep in enumerate(st["replicas"]) if rep["in_flight"] > 0]
        H.check(len(serving) <= 1, "the stream is in flight on %r" % serving)
        if serving:
            victim = serving[0]
            os.kill((ga, gb)[victim].agent_pid(0), signal.SIGKILL)
    finally:
        for w in workers:
            try:
                os.kill(w, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the killed agent's worker, gone with it (SIGKILL stops a stopped one)
    t.join(30)
    H.check(res, "the stream did not end")
    return victim, res[0]


def cut_stream(ga, gb, rport, body):
    """Streams body through the router and kills the serving replica's agent after the
    first token read (tries again while the stream ends before that)."""
    for _ in range(5):
        victim, res = try_stream_cut(ga, gb, rport, body)
        if victim is not None:
            return victim, res
        H.log("the stream finished before the first token was read; again")
    raise H.TestFailure("the stream was never in flight at its first token")


def check_stream_resume(ga, gb, rport):
    """A stream whose replica dies after its first token resumes on the other replica with
    exactly the single gang's tokens."""
    body = {"prompt": [7, 8, 9], "max_tokens": 400}
    code, r = post(gb.http_port, "/v1/completions", body)
    H.check(code == 200, "reference answered %r" % code)
    want = r["choices"][0]["tokens"]
    m0 = router_metrics(rport)
    victim, (toks, done, err) = cut_stream(ga, gb, rport, body)
    H.check(err is None and done, "stream after its replica died: done %r, error %r"
            % (done, err))
    H.check(toks == want, "the resumed stream's %d tokens are not the %d right ones (first "
            "difference at %r)" % (len(toks), len(want),
                                   next((i for i, (a, b) in enumerate(zip(toks, want))
                                         if a != b), None)))
    m = router_metrics(rport)
    H.check(m["ganglion_router_stream_resumes_total"] ==
            m0["ganglion_router_stream_resumes_total"] + 1, "resumes %r -> %r" %
            (m0["ganglion_router_stream_resumes_total"], m["ganglion_router_stream_resumes_total"]))
    H.check(m["ganglion_router_stream_errors_total"] == m0["ganglion_router_stream_errors_total"],
            "a stream error was counted")
    H.log("stream cut on replica %d at its first token read: resumed, %d tokens, all right"
          % (victim, len(toks)))
    return victim


def check_stream_cut(ga, gb, rport):
    """An unseeded sampled stream whose replica dies after its first token cannot go on
    with the same text: it ends with an error event, its tokens what the client had."""
    body = {"prompt": [7, 8, 9], "max_tokens": 400, "temperature": 1.0}
    before = router_metrics(rport)["ganglion_router_stream_errors_total"]
    victim, (toks, done, err) = cut_stream(ga, gb, rport, body)
    H.check(err is not None and not done, "stream after its replica died: done %r, error %r"
            % (done, err))
    H.check(toks and len(toks) < 400, "the cut stream had %d tokens" % len(toks))
    after = router_metrics(rport)["ganglion_router_stream_errors_total"]
    H.check(after == before + 1, "stream errors went from %r to %r" % (before, after))
    H.log("unseeded stream cut after %d tokens on replica %d, error %r" % (len(toks), victim, err))


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=4, hidden=256, heads=4,
                      kv_heads=2, ffn=512, vocab=VOCAB, max_pos=CTX, seed=11)
    extra = ["--model", model, "--max-batch", "4", "--kv-cache-mb", "64",
             "--request-timeout-ms", "60000", "--step-timeout-ms", "5000"]
    ga = H.Gang(h, nnodes=1, extra=extra, job="dp-a")
    gb = H.Gang(h, nnodes=1, extra=extra, job="dp-b")
    ga.start_local(expect=(0,))
    gb.start_local(expect=(0,))
    router, rport = start_router(h, [ga.http_port, gb.http_port])
    H.wait_until(lambda: router_get(rport, "/healthz")[0] == 200, 10, 0.05, "router /healthz")
    ga.wait_serving(timeout=60)
    gb.wait_serving(timeout=60)
    H.wait_until(lambda: replicas_up(rport, [True, True]), 10, 0.05, "both replicas up")
    H.check(router_get(rport, "/readyz")[0] == 200, "router not ready with 2 replicas up")
    check_kv_free(ga, gb, rport)
    check_same_answers(gb, rport)
    check_dns_router(h, ga, gb)
    check_affinity(ga, gb, rport)
    check_kill(h, ga, gb, rport)
    H.wait_until(lambda: replicas_up(rport, [True, True]), 60, 0.05,
                 "replica A to come back up in the router")
    code, r = post(rport, "/v1/completions", {"prompt": [3, 4, 5], "max_tokens": 4})
    H.check(code == 200, "after the restart: %r %r" % (code, r))
    check_stream_resume(ga, gb, rport)
    H.wait_until(lambda: replicas_up(rport, [True, True]), 60, 0.05,
                 "the replica of the resumed stream to come back up")
    ga.wait_serving(timeout=60)
    gb.wait_serving(timeout=60)
    check_stream_cut(ga, gb, rport)
    H.wait_until(lambda: replicas_up(rport, [True, True]), 60, 0.05,
                 "the replica of the cut stream to come back up")
    H.check(router.stop() == 0, "router did not exit 0")
    H.check(ga.stop()["local"] == 0 and gb.stop()["local"] == 0, "a gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
