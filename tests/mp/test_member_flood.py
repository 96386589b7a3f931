#!/usr/bin/env python3
"""A flood of 1,024 authenticated JOINs beyond the gang's size (every node index of
0..1023 on a gang of 2 nodes: duplicates of the two members and indices past the gang)
is refused, one REJECT each, while the gang keeps serving the same generation without a
restart; /metrics keeps the members at the gang size and shows the bounds."""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 2, 2
FLOOD = 1024


def metrics(g):
    code, text = g.get(0, "/metrics")
    H.check(code == 200, "/metrics answered %s" % code)
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            vals[parts[0]] = float(parts[1])
    return vals


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen = g.wait_serving(timeout=30)
    restarts = g.coord()["restarts_total"]
    t0 = time.monotonic()
    rejected = 0
    for i in range(FLOOD):
        c = H.WireClient("127.0.0.1", g.rdzv_port)
        try:
            m = c.handshake(g.job, i, NNODES, NPROC, token=h.token)
        finally:
            c.close()
        H.check(m.type == H.REJECT, "JOIN %d of the flood got %r, not a REJECT" % (i, m))
        rejected += 1
        if i % 256 == 255:
            g.assert_all_ready("after %d JOINs of the flood" % (i + 1))
    H.log("%d JOINs refused in %.2f s" % (rejected, time.monotonic() - t0))
    gang = g.coord()
    H.check(gang["state"] == "serving" and gang["generation"] == gen
            and gang["restarts_total"] == restarts,
            "the flood disturbed the gang: %r" % gang)
    g.assert_all_ready("after the flood")
    v = metrics(g)
    H.check(v.get("ganglion_gang_members") == NNODES
            and v.get("ganglion_gang_members_max") == NNODES,
            "members %r of %r after the flood" % (v.get("ganglion_gang_members"),
                                                  v.get("ganglion_gang_members_max")))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
