#!/usr/bin/env python3
"""The restart budget stops a crash loop: with --max-restarts 1, the first worker kill is
repaired, the second one spends the budget. The gang then stays down: /status shows state
"failed" with the reason on the coordinator and the agents while they linger, the agents
exit 75, local mode exits 75, and the termination log holds the reason."""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 3, 1


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC,
               extra=["--max-restarts", "1", "--restart-window-s", "600"])
    with open(h.termination_log, "w"):
        pass  # the agents write the reason only into a file that exists
    g.start_local(expect=(75,))
    gen = g.wait_serving(timeout=30)

    os.kill(g.worker_pid(1, 0), signal.SIGKILL)
    gen = g.wait_serving(timeout=20, min_gen=gen)
    H.log("first failure repaired: generation %d, budget left %r"
          % (gen, g.coord().get("budget_left")))
    H.check(g.coord().get("budget_left") == 0, "budget_left should be 0 after one restart of one")

    os.kill(g.worker_pid(2, 0), signal.SIGKILL)
    H.log("second worker killed; the budget is spent")

    def failed_everywhere():
        sts = [g.status(i) for i in range(NNODES)]
        if not all(sts) or sts[0].get("gang", {}).get("state") != "failed":
            return None
        return sts if all(s["state"] == "failed" for s in sts) else None

    sts = H.wait_until(failed_everywhere, 10, 0.02, "every agent to report state 'failed'")
    for i, st in enumerate(sts):
        lf = st.get("last_failure") or {}
        H.check(lf.get("reason"), "node %d: failed without a reason: %r" % (i, st))
        H.check(st["ready"] is False, "node %d claims ready while failed" % i)
        H.check(g.get(i, "/readyz")[0] != 200, "node %d /readyz is 200 while failed" % i)
        H.log("node %d failed: %s" % (i, lf.get("reason")))
    H.check(sts[0]["gang"]["budget_left"] == 0, "budget_left %r" % sts[0]["gang"]["budget_left"])

    code = g.local.wait(30)
    H.check(code == 75, "local mode exited %r, expected 75" % code)
    text = g.local.log_text()
    exits = [ln for ln in text.splitlines() if "local: agent" in ln and "exited with code" in ln]
    H.check(len(exits) == NNODES and all("code 75" in ln for ln in exits),
            "agent exits: %s" % "\n".join(exits))
    with open(h.termination_log) as f:
        reason = f.read()
    H.check(reason.strip(), "the termination log is empty")
    H.log("termination log: %s" % reason.strip()[:200])


if __name__ == "__main__":
    H.run(scenario)
