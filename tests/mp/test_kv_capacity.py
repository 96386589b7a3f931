#!/usr/bin/env python3
"""The paged KV cache at the default settings, on the real SmolLM2-135M-Instruct: a gang
started with no --kv-cache-mb and no --max-batch sizes its cache from the memory left
after the weights, and /status says what it holds: at least --max-batch (64 by default)
sequences of 256 tokens at once (the 30 layers x 3 kv heads x 64 of SmolLM2 take 720 KiB
per block of 16 positions), so 64 clients are all in flight together instead of one
after the other. 64 concurrent greedy requests all complete, and the ones also run alone
give exactly their solo tokens (batching and paging change what runs together, never the
numbers of a sequence). Meanwhile /metrics's KV gauges show the sequences running and the
blocks they hold (used + free = blocks), and once they are done an idle engine.

Prefix caching (on by default): two requests that share a 1,000-token system prompt, the
second's time to first token at least 5x lower than the first's (its prompt's first 62
blocks come from the cache), and /metrics counts the hit tokens. (That a hit gives the
tokens of a computed prefix is unit-engine's test_prefix_cache.) Each answer's
usage.prompt_tokens_details.cached_tokens says how many of its prompt tokens the cache
gave: 0, then at least 992.

SKIP (77), with the reason, when scripts/fetch-reference.sh cannot give the model."""
import os
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

H.TEST_DEADLINE_S = 200
CLIENTS = 64      # the default --max-batch
SEQ_TOKENS = 256  # the sequence length the cache must hold CLIENTS of
GEN = 8           # tokens each concurrent request generates


def fetch(what):
    """fetch-reference.sh WHAT, or SKIP (harness.fetch_reference)."""
    return H.fetch_reference(what, 60)


def request(i):
    return {"prompt": [1 + (97 * i + 13 * k) % 30000 for k in range(8 + i % 5)],
            "max_tokens": GEN, "temperature": 0.0, "ignore_eos": True}


def post(g, body, timeout=150.0):
    return H.http_post(g.addr(0), g.http_port, "/v1/completions", body, timeout)


def scenario(h):
    model = fetch("smollm2")
    serve_defaults(h, model)


def kv_gauges(g):
    """The KV cache and sequence gauges of node 0's /metrics, by name."""
    code, text = g.get(0, "/metrics")
    names = ("ganglion_kv_cache_blocks", "ganglion_kv_cache_blocks_used",
             "ganglion_kv_cache_blocks_free", "ganglion_kv_cache_blocks_cached",
             "ganglion_sequences_running", "ganglion_sequences_waiting",
             "ganglion_sequences_preempted_total")
    out = {}
    for line in (text or "").splitlines() if code == 200 else []:
        parts = line.split()
        if len(parts) == 2 and parts[0] in names:
            out[parts[0]] = int(float(parts[1]))
    return out


def check_kv_gauges(g, kv, samples):
    """While the 64 clients ran the gauges showed sequences running and blocks used, every
    sample adding up (used + free = blocks); once they are done, nothing runs or waits and
    no block is held (cached prefixes count as free)."""
    H.check(samples and all(len(x) == 7 for x in samples), "KV gauges missing: %r" % samples[:2])
    for x in samples:
        H.check(x["ganglion_kv_cache_blocks"] == kv["blocks"] and
                x["ganglion_kv_cache_blocks_used"] + x["ganglion_kv_cache_blocks_free"] ==
                x["ganglion_kv_cache_blocks"], "KV gauges do not add up: %r" % x)
    busy = max(x["ganglion_sequences_running"] for x in samples)
    used = max(x["ganglion_kv_cache_blocks_used"] for x in samples)
    H.check(busy >= CLIENTS // 2 and used >= busy,  # a running sequence holds a block at least
            "the gauges never showed the clients: max running %d, max blocks used %d"
            % (busy, used))
    end = H.wait_until(lambda: (lambda x: x if x.get("ganglion_sequences_running") == 0 and
                                x.get("ganglion_sequences_waiting") == 0 and
                                x.get("ganglion_kv_cache_blocks_used") == 0 else None)(
                                    kv_gauges(g)), 5, 0.1, "the KV gauges to show an idle engine")
    H.log("KV gauges: up to %d sequences running, %d of %d blocks used; idle after: %r"
          % (busy, used, kv["blocks"], end))


def serve_defaults(h, model):
    g = H.Gang(h, nnodes=1, nproc_per_node=1,
               extra=["--model", model, "--request-timeout-ms", "150000"])
    g.start_local()
    g.wait_serving(timeout=120)

    kv = g.status(0)["local_ranks"][0].get("kv_cache")
    H.log("/status kv_cache: %r" % kv)
    H.check(isinstance(kv, dict), "/status has no kv_cache object: %r" % kv)
    H.check(kv["max_sequences"] >= CLIENTS,
            "the default cache runs %d sequences at once, fewer than %d" % (kv["max_sequences"],
                                                                            CLIENTS))
    H.check(kv["tokens"] == kv["blocks"] * kv["block_size"] and kv["block_size"] == 16,
            "kv_cache figures do not add up: %r" % kv)
    H.check(kv["tokens"] >= CLIENTS * SEQ_TOKENS,
            "the default cache holds %d tokens, fewer than %d sequences of %d"
            % (kv["tokens"], CLIENTS, SEQ_TOKENS))
    H.check(kv["full_context_sequences"] == kv["blocks"] // (-(-kv["context"] // 16)),
            "full_context_sequences %r" % kv)

    solo = {}
    t0 = time.monotonic()
    for i in (0, 1, CLIENTS - 1):
        code, r = post(g, request(i))
        H.check(code == 200, "solo request %d answered %r %r" % (i, code, r))
        solo[i] = r["choices"][0]["tokens"]
    solo_s = (time.monotonic() - t0) / len(solo)

    results = [None] * CLIENTS
    samples, stop = [], threading.Event()

    def run(i):
        results[i] = post(g, request(i))

    def watch():  # the KV gauges of /metrics while the clients run
        while not stop.is_set():
            samples.append(kv_gauges(g))
            time.sleep(0.1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(170)
    wall = time.monotonic() - t0
    stop.set()
    watcher.join(10)
    check_kv_gauges(g, kv, samples)
    for i, res in enumerate(results):
        H.check(res is not None and res[0] == 200, "concurrent request %d: %r" % (i, res))
        toks = res[1]["choices"][0]["tokens"]
        H.check(len(toks) == GEN, "request %d has %d tokens" % (i, len(toks)))
        if i in solo:
            H.check(toks == solo[i], "request %d: %r concurrently, %r alone" % (i, toks, solo[i]))
    H.log("%d concurrent requests of %d tokens in %.1f s; one alone takes %.2f s (%.1fx the "
          "throughput of serving them one after the other)"
          % (CLIENTS, GEN, wall, solo_s, CLIENTS * solo_s / wall))

    # Prefix caching: a 1,000-token system prompt shared by two requests.
    system = [1 + (31 * k + 7) % 30000 for k in range(1000)]
    asks = [system + [200 + j, 300 + j, 400 + j] for j in range(2)]
    ttft, cached = [], []
    for q in asks:
        t0 = time.monotonic()
        code, r = post(g, {"prompt": q, "max_tokens": 1, "temperature": 0.0})
        ttft.append(time.monotonic() - t0)  # one token: the answer's time is its TTFT
        H.check(code == 200, "prefix request answered %r %r" % (code, r))
        u = r.get("usage", {})
        H.check(u.get("prompt_tokens") == len(q), "usage of a prefix request: %r" % u)
        cached.append(u.get("prompt_tokens_details", {}).get("cached_tokens"))
    # OpenAI's usage.prompt_tokens_details.cached_tokens: none the first time, the shared
    # prompt's full blocks (62 x 16 = 992 of its 1,000 tokens) the second.
    H.check(cached[0] == 0 and cached[1] is not None and 992 <= cached[1] < len(asks[1]),
            "cached_tokens of the two prefix requests: %r" % cached)
    H.log("shared 1000-token prefix: TTFT %.3f s, then %.3f s (%.1fx)"
          % (ttft[0], ttft[1], ttft[0] / ttft[1]))
    H.check(ttft[0] >= 5 * ttft[1], "the second TTFT %.3f s is not 5x below the first's %.3f s"
            % (ttft[1], ttft[0]))
    code, text = g.get(0, "/metrics")
    hits = [float(x.split()[1]) for x in text.splitlines()
            if x.startswith("ganglion_prefix_cache_hit_tokens_total ")]
    H.check(hits and hits[0] >= 992, "prefix cache hit tokens in /metrics: %r" % hits)


if __name__ == "__main__":
    H.run(scenario)
