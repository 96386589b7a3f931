#!/usr/bin/env python3
"""A local gang of 4 nodes x 2 ranks forms: every agent serves the same generation, every
rank is ready, the probes and /metrics tell the truth, and SIGTERM stops it all cleanly."""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

METRICS = ["ganglion_generation", "ganglion_gang_restarts_total", "ganglion_rendezvous_seconds",
           "ganglion_heartbeat_age_seconds", "ganglion_state"]


def scenario(h):
    g = H.Gang(h, nnodes=4, nproc_per_node=2)
    g.start_local()
    gen = g.wait_serving(timeout=30)
    H.log("gang serving generation %d" % gen)

    pids = set()
    for i in range(4):
        st = g.status(i)
        H.check(st["node_index"] == i, "node %d reports node_index %r" % (i, st["node_index"]))
        H.check(st["nnodes"] == 4 and st["nproc_per_node"] == 2, "node %d shape: %r" % (i, st))
        H.check(st["is_coordinator"] == (i == 0), "node %d is_coordinator wrong" % i)
        H.check(st["healthy"] is True, "node %d not healthy" % i)
        H.check(st["coordinator"]["connected"] is True, "node %d not connected" % i)
        ranks = st["local_ranks"]
        H.check(len(ranks) == 2, "node %d has %d local ranks" % (i, len(ranks)))
        for r in ranks:
            H.check(r["rank"] == i * 2 + r["local_rank"], "node %d rank numbering: %r" % (i, r))
            H.check(r["state"] == "ready", "node %d rank %d state %s" % (i, r["rank"], r["state"]))
            H.check(H.pid_alive(r["pid"]), "worker pid %d is not alive" % r["pid"])
            pids.add(r["pid"])
        H.check(g.get(i, "/healthz")[0] == 200, "node %d /healthz not 200" % i)
        H.check(("gang" in st) == (i == 0), "only the coordinator reports 'gang'")
    H.check(len(pids) == 8, "expected 8 distinct worker pids, got %r" % pids)

    gang = g.coord()
    H.check(gang["members"] == 4, "coordinator counts %r members" % gang["members"])
    H.check(len(gang["ranks"]) == 8, "coordinator lists %d ranks" % len(gang["ranks"]))
    for r in gang["ranks"]:
        H.check(r["state"] == "ready", "coordinator: rank %r not ready" % r)
        H.check(r["node"] == r["rank"] // 2, "coordinator: rank %r on the wrong node" % r)
        H.check(r["heartbeat_age_ms"] < g.hb_timeout_ms, "stale heartbeat %r" % r)
    H.check(gang["rendezvous_seconds"] > 0, "rendezvous_seconds %r" % gang["rendezvous_seconds"])

    code, text = g.get(0, "/metrics")
    H.check(code == 200, "/metrics answered %s" % code)
    for m in METRICS:
        H.check(m in text, "/metrics lacks %s" % m)

    codes = g.stop()
    H.check(codes["local"] == 0, "local gang exited %r after SIGTERM" % codes["local"])
    H.wait_until(lambda: not any(H.pid_alive(p) for p in pids), 5, what="every worker to exit")


if __name__ == "__main__":
    H.run(scenario)
