#!/usr/bin/env python3
"""kill -9 of a worker: every agent sees the ABORT, the coordinator records the failed
rank and its reason, and the gang is READY again in the next generation. Done twice: a
worker of node 2, then rank 0 itself (the one that produces the bootstrap blob)."""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 4, 2


def kill_and_check(g, gen0, node, local_rank):
    pid = g.worker_pid(node, local_rank)
    rank = node * NPROC + local_rank
    t_kill = H.wall_ms()
    os.kill(pid, signal.SIGKILL)
    H.log("killed worker rank %d (node %d, pid %d) in generation %d" % (rank, node, pid, gen0))

    def all_saw_abort():
        seen = {}
        for i in range(NNODES):
            st = g.status(i)
            if not st or st.get("last_abort_wall_ms", 0) < t_kill:
                return None
            seen[i] = st["last_abort_wall_ms"] - t_kill
        return seen

    seen = H.wait_until(all_saw_abort, 10, 0.01, "every agent to record the ABORT")
    H.log("abort seen after %r ms (per node)" % seen)
    gen = g.wait_serving(timeout=20, min_gen=gen0)
    H.check(gen == gen0 + 1, "gang re-formed in generation %d, expected the next one (%d)"
            % (gen, gen0 + 1))
    st = g.status(0)
    lf = st.get("last_failure")
    H.check(lf is not None, "coordinator /status has no last_failure")
    H.check(lf.get("rank") == rank,
            "last_failure names rank %r, expected %d" % (lf.get("rank"), rank))
    H.check(lf.get("reason"), "last_failure has no reason: %r" % lf)
    H.check(lf.get("wall_ms", 0) >= t_kill, "last_failure is older than the kill: %r" % lf)
    new_pid = g.worker_pid(node, local_rank)
    H.check(new_pid != pid and H.pid_alive(new_pid), "rank %d was not respawned" % rank)
    H.check(not H.pid_alive(pid), "killed worker %d still alive" % pid)
    H.check(g.coord()["restarts_total"] >= 1, "restarts_total not counted")
    return gen


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen = g.wait_serving(timeout=30)
    gen = kill_and_check(g, gen, node=2, local_rank=1)
    gen = kill_and_check(g, gen, node=0, local_rank=0)
    code, text = g.get(0, "/metrics")
    H.check(code == 200 and "ganglion_gang_restarts_total" in text, "/metrics after restarts")
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
