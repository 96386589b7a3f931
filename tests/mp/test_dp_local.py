#!/usr/bin/env python3
"""`serve --local --dp 2` (issue #26): two independent local gangs (gang i on --rdzv-port +
2i and --http-port + 1 + 2i) behind `ganglion router` on 127.0.0.1:--http-port. The router
sees both replicas up on their own ports, answers completions with the tokens each gang
gives directly (greedy), spreads new prompts over both, and SIGTERM stops the whole tree
with exit 0 (the harness checks that nothing of it is left)."""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402


def scenario(h):
    model = H.mkmodel(h.bin, os.path.join(h.tmp, "model"), layers=2, hidden=64, heads=4,
                      kv_heads=2, ffn=128, vocab=256, max_pos=128, seed=5)
    # Ports: the router's, then two gangs' pairs above it, all checked free.
    for _ in range(50):
        base = 10000 + 2 * h.rng.randrange(4000)
        if all(H._port_free(p) for p in range(base, base + 5)) and \
                all(H._port_free(p) for p in range(base + 5000, base + 5005)):
            break
    http, rdzv = base, base + 5000
    p = h.spawn("dp", [h.bin, "serve", "--local", "--dp", "2", "--model", model,
                       "--http-port", str(http), "--rdzv-port", str(rdzv),
                       "--token-file", h.token_path, "--kv-cache-mb", "8"])

    def both_up():
        code, body = H.http_get("127.0.0.1", http, "/status", timeout=1.0)
        st = json.loads(body) if code == 200 else None
        return st if st and [r["up"] for r in st["replicas"]] == [True, True] else None

    st = H.wait_until(both_up, 30, 0.05, "the router to see both gangs up")
    names = [r["name"] for r in st["replicas"]]
    H.check(names == ["127.0.0.1:%d" % (http + 1), "127.0.0.1:%d" % (http + 3)],
            "replicas %r" % names)
    for k in range(6):
        body = {"prompt": [k + 1, 2 * k + 3, 5], "max_tokens": 6}
        code, via = H.http_post("127.0.0.1", http, "/v1/completions", body, timeout=30)
        H.check(code == 200, "router answered %r %r" % (code, via))
        for gang_port in (http + 1, http + 3):
            code, direct = H.http_post("127.0.0.1", gang_port, "/v1/completions", body,
                                       timeout=30)
            H.check(code == 200 and direct["choices"][0]["tokens"] ==
                    via["choices"][0]["tokens"], "gang on %d: %r %r" % (gang_port, code, direct))
    st = json.loads(H.http_get("127.0.0.1", http, "/status", timeout=1.0)[1])
    sent = [r["requests"] for r in st["replicas"]]
    H.check(min(sent) > 0, "the router used one gang only: %r" % sent)
    H.check(p.stop() == 0, "serve --local --dp did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
