#!/usr/bin/env python3
"""Bad members are refused and change nothing. While a 2 x 2 gang serves, a Python client
of wire protocol v2 tries to JOIN as: a duplicate of node 1, a member of a 3-node world, a
member with another model digest, a member with the wrong token, one with no MAC at all,
and one of another job. Each gets REJECT with the right code and a reason, the connection
is closed, a log line says why, and the gang keeps serving the same generation with
/readyz 200 on every agent."""
import hashlib
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 2, 2


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    local = g.start_local()
    gen = g.wait_serving(timeout=30)
    restarts = g.coord()["restarts_total"]

    cases = [
        # name, JOIN overrides, expected code
        ("duplicate rank", {}, H.EDUPLICATE),
        ("wrong world size", {"nnodes": 3}, H.EMISMATCH),
        ("wrong ranks per node", {"nproc_per_node": 4}, H.EMISMATCH),
        ("mismatched model digest", {"digest": hashlib.sha256(b"another model").digest()},
         H.EMISMATCH),
        ("wrong token", {"mac_token": "not-the-token-0123456789abcdef"}, H.EAUTH),
        ("no MAC", {"mac_token": None, "token": None}, H.EAUTH),
        ("another job", {"job": "someone-else"}, H.EMISMATCH),
    ]
    for name, over, code in cases:
        args = dict(job=g.job, node_index=1, nnodes=NNODES, nproc_per_node=NPROC, token=h.token)
        args.update(over)
        log_before = len(local.log_text())
        c = H.WireClient("127.0.0.1", g.rdzv_port)
        try:
            m = c.handshake(**args)
            H.check(m.type == H.REJECT, "%s: expected REJECT, got %r" % (name, m))
            H.check(m.f["code"] == code, "%s: REJECT code %d, expected %d (%s)"
                    % (name, m.f["code"], code, m.f["reason"]))
            H.check(m.f["reason"], "%s: REJECT without a reason" % name)
            c.wait_closed(3.0)
        finally:
            c.close()
        H.log("%s: REJECT %d %r, connection closed" % (name, m.f["code"], m.f["reason"]))
        # The refusal is logged by the coordinator, with the reason the member was given.
        H.wait_until(lambda: re.search(r"(refus|reject).*" + re.escape(m.f["reason"][:40]),
                                       local.log_text()[log_before:], re.I),
                     2, 0.05, "a log line about the %s" % name)
        g.assert_all_ready("after the %s" % name)
        gang = g.coord()
        H.check(gang["state"] == "serving" and gang["generation"] == gen,
                "%s disturbed the gang: %r" % (name, gang))
        H.check(gang["restarts_total"] == restarts, "%s caused a gang restart" % name)
        H.check(gang["members"] == NNODES,
                "%s changed the member count: %r" % (name, gang["members"]))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
