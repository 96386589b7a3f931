#!/usr/bin/env python3
"""The spent restart budget is final for node 0's own member too (issue #28). Node 0's
agent holds the coordinator and a member that joins it like any other; when that member is
the one dropped (its agent's loop stalled past the heartbeat timeout: SIGSTOP here, an 8 MiB
prompt tokenized on the loop once) and the drop spends the budget, the member misses the
GIVE_UP broadcast and, re-joining, is refused with GANG_EBUDGET. That refusal must end it
as GIVE_UP would: every agent, node 0's included, reports "failed" and exits 75 after
--give-up-linger-ms (docs/operations.md), instead of node 0 re-joining forever with
/healthz 200."""
import os
import signal
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES = 2
LINGER_MS = 3000  # the harness's --give-up-linger-ms


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=1,
               extra=["--max-restarts", "0", "--restart-window-s", "600"])
    with open(h.termination_log, "w"):
        pass
    g.start_local(expect=(75,))
    g.wait_serving(timeout=30)
    pid = g.agent_pid(0)
    os.kill(pid, signal.SIGSTOP)  # node 0's loop stalls: coordinator and member alike
    try:
        time.sleep(2.5)  # past --heartbeat-timeout-ms 1000 (the harness's)
    finally:
        os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    H.log("node 0's agent stalled 2.5 s and resumed")
    # Within the linger (plus the re-join and scheduling slack) every agent has exited 75;
    # before the fix node 0's member re-joined forever and local mode never exited.
    code = g.local.wait(LINGER_MS / 1000 + 6)
    took = time.monotonic() - t0
    H.check(code == 75, "local mode exited %r, expected 75" % code)
    text = g.local.log_text()
    exits = [ln for ln in text.splitlines() if "local: agent" in ln and "exited with code" in ln]
    H.check(len(exits) == NNODES and all("code 75" in ln for ln in exits),
            "agent exits: %s" % "\n".join(exits))
    H.check("restart budget spent" in text, "no budget refusal in the logs")
    H.log("every agent exited 75, %.1f s after the stall (linger %d ms)" % (took, LINGER_MS))
    with open(h.termination_log) as f:
        H.check(f.read().strip(), "the termination log is empty")


if __name__ == "__main__":
    H.run(scenario)
