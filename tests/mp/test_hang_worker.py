#!/usr/bin/env python3
"""SIGSTOP of a worker (a hang, not a crash): every agent learns of it within the
heartbeat timeout plus one interval (plus a small slack for a loaded 2-core machine), the
hung worker is replaced, and the gang serves the next generation."""
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 4, 2
SLACK_MS = 400


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen0 = g.wait_serving(timeout=30)
    pid = g.worker_pid(3, 0)
    bound = g.hb_timeout_ms + g.hb_interval_ms
    t_stop = H.wall_ms()
    os.kill(pid, signal.SIGSTOP)
    H.log("stopped worker pid %d (node 3, local rank 0) in generation %d" % (pid, gen0))
    try:
        def all_saw_abort():
            seen = {}
            for i in range(NNODES):
                st = g.status(i)
                if not st or st.get("last_abort_wall_ms", 0) < t_stop:
                    return None
                seen[i] = st["last_abort_wall_ms"] - t_stop
            return seen

        seen = H.wait_until(all_saw_abort, 10, 0.01, "every agent to record the ABORT")
        H.log("hang detected after %r ms (bound %d + slack %d)" % (seen, bound, SLACK_MS))
        H.check(max(seen.values()) <= bound + SLACK_MS,
                "hang detected after %d ms, beyond heartbeat timeout + interval (%d ms) + %d ms"
                % (max(seen.values()), bound, SLACK_MS))
        H.check(min(seen.values()) >= g.hb_timeout_ms - 2 * g.hb_interval_ms,
                "hang 'detected' after %d ms, before the heartbeat timeout could expire: "
                "was something else killed?" % min(seen.values()))
        gen = g.wait_serving(timeout=20, min_gen=gen0)
        H.check(gen == gen0 + 1, "re-formed in generation %d, expected %d" % (gen, gen0 + 1))
        H.check(not H.pid_alive(pid), "the hung worker %d was not killed" % pid)
        new_pid = g.worker_pid(3, 0)
        H.check(new_pid != pid and H.pid_alive(new_pid), "the hung worker was not replaced")
        lf = g.status(0).get("last_failure") or {}
        H.check(lf.get("rank") == 6 and lf.get("reason"), "last_failure: %r" % lf)
        H.log("last failure: %s %s" % (lf.get("code"), lf.get("reason")))
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
