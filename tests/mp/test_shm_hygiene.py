#!/usr/bin/env python3
"""A formation aborted or killed at random points leaves /dev/shm as it was: kill -9 of
both ranks of a pair while the segment between them is still named (the peer never
opened it; caught by watching /dev/shm during a re-formation), kill -9 of an agent, and
a formation stalled by a worker stopped with SIGSTOP (aborted by the heartbeat or the
start timeout, whichever comes first).
Checked on a small gang and on 128 ranks on this one host, where every rank pair of a
node could share a segment: after every re-formation and after the gang stops, no
/dev/shm/ganglion-<job>-* segment is left (segments of other jobs are not looked at)."""
import os
import random
import signal
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

SHM = "/dev/shm"


def segments(job):
    prefix = "ganglion-%s-" % job.replace("-", "_")
    try:
        return sorted(n for n in os.listdir(SHM) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def random_worker(g, rng, nodes):
    node = rng.choice(nodes)
    lr = rng.randrange(g.nproc)
    return node, lr, g.worker_pid(node, lr)


def rank_pids(g, nnodes):
    return {n * g.nproc + lr: g.worker_pid(n, lr) for n in range(nnodes) for lr in range(g.nproc)}


def kill_holders(job, pids, deadline_s):
    """Waits for a segment of job that its peer has not opened yet (it is still named) and
    kills both ranks of the pair with SIGKILL, so that neither can unlink it. Returns the
    segment's name, or None when none showed up in time."""
    prefix = "ganglion-%s-" % job.replace("-", "_")
    end = time.time() + deadline_s
    while time.time() < end:
        for n in os.listdir(SHM):
            if not n.startswith(prefix):
                continue
            f = n.split("-")
            creator, hi = int(f[-5]), int(f[-1])
            for pid in (creator, pids.get(hi)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (OSError, TypeError):
                    pass
            return n
    return None


def scenario_for(h, nnodes, nproc, rounds, seed):
    job = "mp-shm-%d-%d" % (os.getpid(), nnodes * nproc)
    rng = random.Random(seed)
    H.check(not segments(job), "segments of job %s before the test" % job)
    g = H.Gang(h, nnodes=nnodes, nproc_per_node=nproc, job=job,
               extra=["--start-timeout-ms", "4000", "--max-restarts", "100"])
    t0 = time.time()
    g.start_local()
    gen = g.wait_serving(timeout=90)
    H.log("%d ranks serving generation %d after %.2f s" % (nnodes * nproc, gen, time.time() - t0))
    H.check(not segments(job), "segments left while serving: %r" % segments(job)[:5])
    caught = 0
    for k in range(rounds):
        what = ["holder", "agent", "stalled", "holder"][k % 4]
        node = rng.randrange(nnodes)
        pid = g.worker_pid(node, rng.randrange(nproc))
        if what == "holder":
            pids = rank_pids(g, nnodes)
            os.kill(pid, signal.SIGKILL)  # the gang re-forms...
            seg = kill_holders(job, pids, 3.0)  # ...and dies again half-way
            caught += seg is not None
            H.log("round %d: killed worker %d, then the pair of %s" % (k, pid, seg))
        elif what == "agent":
            victim = rng.randrange(1, nnodes)
            os.kill(g.agent_pid(victim), signal.SIGKILL)
            H.log("round %d: killed agent %d" % (k, victim))
        else:
            os.kill(pid, signal.SIGKILL)  # a re-formation starts...
            time.sleep(rng.uniform(0.0, 0.05))
            other = rng.choice([n for n in range(nnodes) if n != node])
            pid2 = g.worker_pid(other, rng.randrange(nproc))
            os.kill(pid2, signal.SIGSTOP)  # ...and stalls until the heartbeat / start timeout
            H.log("round %d: killed worker %d, stopped worker %d" % (k, pid, pid2))
        gen = g.wait_serving(timeout=90, min_gen=gen)
        H.log("round %d: serving generation %d" % (k, gen))
        left = segments(job)
        H.check(not left, "round %d (%s): %d segments left after re-forming: %r"
                % (k, what, len(left), left[:5]))
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")
    left = segments(job)
    H.check(not left, "%d segments left after the gang stopped: %r" % (len(left), left[:5]))
    return caught


def scenario(h):
    if not os.path.isdir(SHM):
        raise H.TestSkip("no %s on this host" % SHM)
    caught = scenario_for(h, nnodes=4, nproc=2, rounds=4, seed=14)
    caught += scenario_for(h, nnodes=16, nproc=8, rounds=4, seed=1024)
    # Without a pair killed while its segment was named the sweep was never needed.
    H.check(caught > 0, "no formation was caught holding a segment; the test proved nothing")


if __name__ == "__main__":
    H.run(scenario)
