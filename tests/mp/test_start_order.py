#!/usr/bin/env python3
"""Pods start in any order: the members start first and find no coordinator (connection
refused), retry with bounded backoff while their probes say alive-but-not-ready, and the
gang forms as soon as agent 0 (the coordinator) appears. The members name the coordinator
by host name ("localhost"), so every attempt goes through name resolution again."""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 3, 1


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    for i in range(NNODES - 1, 0, -1):
        argv = [h.bin, "serve"] + g.flags + [
            "--node-index", str(i), "--bind-address", H.local_address(i),
            "--coordinator", "localhost:%d" % g.rdzv_port]
        g.agents[i] = h.spawn("agent%d" % i, argv, (0,))
    time.sleep(1.5)
    for i in range(1, NNODES):
        st = g.status(i)
        H.check(st is not None, "agent %d does not serve /status while waiting" % i)
        H.check(not st["coordinator"]["connected"], "agent %d claims a coordinator" % i)
        H.check(g.get(i, "/readyz")[0] == 503, "agent %d ready without a gang" % i)
        H.check(g.get(i, "/healthz")[0] == 200, "agent %d not alive while waiting" % i)
    H.log("members wait for the coordinator, alive and not ready")
    t0 = time.monotonic()
    g.start_agent(0)
    gen = g.wait_serving(timeout=20)
    took = time.monotonic() - t0
    H.log("gang serving in generation %d, %.2f s after the coordinator started" % (gen, took))
    # The retry delay is capped at --dns-backoff-max-ms (200 ms here): the members must not
    # have backed off into long sleeps while the coordinator was away.
    H.check(took < 5.0, "gang took %.2f s to form after the coordinator appeared" % took)
    g.assert_all_ready("after a late coordinator")
    codes = g.stop()
    H.check(codes == {i: 0 for i in range(NNODES)}, "agents exited %r, not all 0" % codes)


if __name__ == "__main__":
    H.run(scenario)
