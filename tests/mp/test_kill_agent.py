#!/usr/bin/env python3
"""kill -9 of a non-coordinator agent: the coordinator notices the lost connection, the
other agents see the ABORT, local mode restarts the agent (as kubelet would restart the
Pod), its orphaned workers go away, and the gang re-forms in a newer generation."""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 4, 2
VICTIM = 2


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen0 = g.wait_serving(timeout=30)
    agent = g.agent_pid(VICTIM)
    workers = [g.worker_pid(VICTIM, lr) for lr in range(NPROC)]
    t_kill = H.wall_ms()
    os.kill(agent, signal.SIGKILL)
    H.log("killed agent %d (pid %d; workers %r) in generation %d" % (VICTIM, agent, workers, gen0))

    def survivors_saw_abort():
        for i in range(NNODES):
            if i == VICTIM:
                continue
            st = g.status(i)
            if not st or st.get("last_abort_wall_ms", 0) < t_kill:
                return None
        return True

    H.wait_until(survivors_saw_abort, g.hb_timeout_ms / 1000 + 3, 0.01,
                 "the surviving agents to record the ABORT")
    H.log("survivors saw the abort")
    gen = g.wait_serving(timeout=30, min_gen=gen0)
    H.log("gang re-formed in generation %d" % gen)
    new_agent = g.agent_pid(VICTIM)
    H.check(new_agent != agent, "agent %d was not restarted" % VICTIM)
    H.wait_until(lambda: not any(H.pid_alive(p) for p in workers), 10, 0.05,
                 "the killed agent's workers to exit")
    st = g.status(VICTIM)
    H.check(all(r["pid"] not in workers for r in st["local_ranks"]),
            "restarted agent reports the old workers")
    H.check(g.coord()["members"] == NNODES, "coordinator does not count every member")
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
