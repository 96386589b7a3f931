#!/usr/bin/env python3
"""kill -9 of the coordinator's agent (node 0): the members notice the lost coordinator
within the heartbeat timeout, keep their workers alive, and rejoin when local mode has
restarted it; the restarted coordinator continues the generation count upward from what
its members report."""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 4, 2
SLACK_MS = 1000


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen0 = g.wait_serving(timeout=30)
    # Move the generation past 1, so that "continues upward" is not trivially true.
    os.kill(g.worker_pid(1, 0), signal.SIGKILL)
    gen0 = g.wait_serving(timeout=20, min_gen=gen0)
    member_workers = {i: sorted(g.worker_pid(i, lr) for lr in range(NPROC))
                      for i in range(1, NNODES)}
    coord = g.agent_pid(0)
    t_kill = H.wall_ms()
    os.kill(coord, signal.SIGKILL)
    H.log("killed the coordinator agent (pid %d) in generation %d" % (coord, gen0))

    def members_noticed():
        seen = {}
        for i in range(1, NNODES):
            st = g.status(i)
            if not st or st.get("last_abort_wall_ms", 0) < t_kill:
                return None
            seen[i] = st["last_abort_wall_ms"] - t_kill
        return seen

    seen = H.wait_until(members_noticed, 10, 0.01, "every member to notice the lost coordinator")
    H.log("members noticed after %r ms" % seen)
    H.check(max(seen.values()) <= g.hb_timeout_ms + g.hb_interval_ms + SLACK_MS,
            "a member noticed the lost coordinator only after %d ms" % max(seen.values()))
    H.check(all(not g.status(i)["ready"] for i in range(1, NNODES)),
            "a member still claims ready without its coordinator")

    gen = g.wait_serving(timeout=30, min_gen=gen0)
    H.log("gang re-formed in generation %d (was %d)" % (gen, gen0))
    H.check(g.agent_pid(0) != coord, "the coordinator agent was not restarted")
    for i, pids in member_workers.items():
        now = sorted(g.worker_pid(i, lr) for lr in range(NPROC))
        H.check(now == pids, "node %d's workers were replaced (%r -> %r); they should have "
                "stayed alive while the coordinator was away" % (i, pids, now))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
