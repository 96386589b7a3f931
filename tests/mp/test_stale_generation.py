#!/usr/bin/env python3
"""Generation fencing, played at the protocol level. A gang of 2 nodes x 1 rank where the
test itself is node 1: a Python client of wire protocol v2 authenticates (HMAC over the
token; every later frame carries a session tag both ways), REJOINs, receives START(G), makes a real
worker process join rank 0's data plane as rank 1 (the test plays that worker's agent), and answers
with a READY of an older generation first. That READY must not count: the gang
stays "starting", /readyz stays 503, the member is not dropped, and a log line says why.
Only READY(G) makes the gang serve. This is done for generation 1 (a READY of
generation 0) and, after the member aborts generation 1 itself, for generation 2 (a
replayed READY of generation 1).

Then the session tags (docs/protocol.md §5.3): node 1 joins again four times and sends two
heartbeats, correctly tagged (accepted: the connection stays, and the coordinator's own
tagged heartbeats verify here), with a wrong tag, replayed, or swapped. Each tampered
connection is closed at once, with a log line saying why."""
import os
import re
import socket
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402


def form(g, agent0, c, rejoin_gen):
    """REJOIN, START(G), join the data plane, a stale READY that must not count, then
    READY(G). Returns (G, the WorkerPeer)."""
    c.hb_state[0] = H.RANK_IDLE
    c.send(H.REJOIN, rejoin_gen, H.p_u32(1))
    start = c.expect(H.START, timeout=10)
    gen = start.generation
    H.log("START: %r" % start)
    H.check(start.f["world_size"] == 2, "START world_size %d" % start.f["world_size"])
    H.check(gen > rejoin_gen, "START carries generation %d after %d" % (gen, rejoin_gen))
    c.hb_state[0] = H.RANK_STARTING
    # Our rank 1 joins rank 0's data plane, as the real worker would; without it rank 0
    # never becomes ready and the gang could not serve whatever READY we send.
    peer = H.WorkerPeer(g.h, start.f["blob"], gen, rank=1, world=2,
                        hb_interval_ms=g.hb_interval_ms)

    log_before = len(agent0.log_text())
    c.send(H.READY, gen - 1, H.p_u32(1))
    H.log("sent a stale READY (generation %d)" % (gen - 1))
    time.sleep(5 * g.hb_interval_ms / 1000)
    gang = g.coord()
    H.check(gang["state"] == "starting", "after a stale READY the gang is %r (expected still "
            "starting)" % gang["state"])
    H.check(gang["generation"] == gen, "coordinator generation %d, START said %d"
            % (gang["generation"], gen))
    H.check(g.get(0, "/readyz")[0] != 200, "/readyz is 200 after a stale READY only")
    H.check(not c.closed.is_set(), "the coordinator dropped the member for a stale message")
    new_log = agent0.log_text()[log_before:]
    H.check(re.search(r"stale|older generation|ESTALE", new_log, re.I),
            "no log line about the stale READY; the log says:\n%s" % new_log[-2000:])

    c.hb_state[0] = H.RANK_READY
    c.send(H.READY, gen, H.p_u32(1))
    H.log("sent READY(%d)" % gen)
    H.wait_until(lambda: (g.coord() or {}).get("state") == "serving", 5, 0.02,
                 "the gang to serve after the current READY")
    H.check(g.coord()["generation"] == gen, "serving the wrong generation")
    H.wait_until(lambda: g.get(0, "/readyz")[0] == 200, 5, 0.05, "agent 0 /readyz 200")
    H.check(peer.error is None, "data plane: %r" % peer.error)
    H.log("gang serving generation %d with the Python member" % gen)
    return gen, peer


def join_node1(g, h):
    """A fresh connection welcomed as node 1 (retrying while the coordinator still holds the
    previous one: REJECT duplicate)."""
    deadline = time.monotonic() + 10
    while True:
        c = H.WireClient("127.0.0.1", g.rdzv_port)
        w = c.handshake(g.job, node_index=1, nnodes=2, nproc_per_node=1, token=h.token,
                        host="127.0.0.2")
        if w.type == H.WELCOME:
            H.check(c.session is not None, "no session after a WELCOME with a token")
            return c
        c.close()
        H.check(w.type == H.REJECT and w.f["code"] == H.EDUPLICATE and
                time.monotonic() < deadline, "JOIN as node 1 got %r" % w)
        time.sleep(0.05)


def session_tags(g, h, agent0):
    def hb(c):
        return c.tagged(H.HEARTBEAT, 0, H.p_heartbeat(1, 0, [H.RANK_IDLE], [0]))

    for name in ("correctly tagged", "wrong tag", "replayed", "reordered"):
        c = join_node1(g, h)
        try:
            f0, f1 = hb(c), hb(c)  # sequence numbers 0 and 1
            log_before = len(agent0.log_text())
            if name == "correctly tagged":
                c.send_raw(f0 + f1)
                got = []
                deadline = time.monotonic() + 4 * g.hb_interval_ms / 1000
                while time.monotonic() < deadline:
                    try:
                        # recv() checks every coordinator tag: a wrong one raises ValueError
                        got.append(c.recv(max(0.01, deadline - time.monotonic())))
                    except socket.timeout:
                        break
                H.check(any(m.type == H.HEARTBEAT for m in got),
                        "%s: no coordinator heartbeat arrived (got %r)" % (name, got))
                c.send(H.HEARTBEAT, 0, H.p_heartbeat(1, 0, [H.RANK_IDLE], [0]))  # seq 2
                time.sleep(2 * g.hb_interval_ms / 1000)
                c.sock.settimeout(0.2)
                try:
                    H.check(c.sock.recv(1, socket.MSG_PEEK) != b"",
                            "%s: the coordinator closed a correct member" % name)
                except socket.timeout:
                    pass
                H.check("rejected frame" not in agent0.log_text()[log_before:],
                        "%s: the coordinator rejected a correctly tagged frame" % name)
                H.log("%s: accepted, %d tagged frames from the coordinator verified"
                      % (name, len(got)))
                continue
            if name == "wrong tag":
                c.send_raw(f0[:-1] + bytes([f0[-1] ^ 1]))
            elif name == "replayed":
                c.send_raw(f0 + f0)
            else:
                c.send_raw(f1 + f0)
            t0 = time.monotonic()
            c.wait_closed(3.0)
            took = time.monotonic() - t0
            H.check(took < g.hb_timeout_ms / 1000 * 0.8, "%s: closed after %.3f s, not at "
                    "once (by the heartbeat timeout instead?)" % (name, took))
            H.wait_until(lambda: "rejected frame" in agent0.log_text()[log_before:], 3, 0.02,
                         "a log line about the rejected frame (%s)" % name)
            H.log("%s: closed after %.3f s" % (name, took))
        finally:
            c.close()


def scenario(h):
    g = H.Gang(h, nnodes=2, nproc_per_node=1)
    agent0 = g.start_agent(0)
    H.wait_until(lambda: g.status(0), 15, 0.05, "agent 0's /status")

    c = H.WireClient("127.0.0.1", g.rdzv_port)
    w = c.handshake(g.job, node_index=1, nnodes=2, nproc_per_node=1, token=h.token,
                    host="127.0.0.2")
    H.check(w.type == H.WELCOME, "expected WELCOME, got %r" % w)
    H.check(w.f["heartbeat_interval_ms"] == g.hb_interval_ms, "WELCOME heartbeat settings %r" % w)
    H.log("welcomed as node 1: %r" % w)
    c.start_member_threads(node_index=1, nranks=1, interval_ms=g.hb_interval_ms)

    gen1, peer = form(g, agent0, c, w.f["generation"])

    # Our rank fails: the coordinator must abort generation 1 everywhere, us included.
    c.send(H.ABORT, gen1, H.p_abort(1, H.EPEER, "mp test: simulated failure of rank 1"))
    ab = c.expect(H.ABORT, timeout=5)
    H.log("coordinator broadcast %r" % ab)
    H.check(ab.generation == gen1, "ABORT for generation %d, expected %d" % (ab.generation, gen1))
    peer.close()
    st = H.wait_until(lambda: (g.status(0) or {}).get("last_failure"), 5, 0.02,
                      "last_failure on the coordinator")
    H.check(st.get("rank") == 1, "last_failure %r" % st)

    gen2, peer = form(g, agent0, c, gen1)
    H.check(gen2 == gen1 + 1, "generation %d after %d" % (gen2, gen1))
    peer.close()

    # A member that leaves makes the coordinator abort the generation (lost connection).
    c.close()
    H.wait_until(lambda: (g.coord() or {}).get("state") != "serving", 5, 0.02,
                 "the coordinator to notice the departed member")
    H.check(g.get(0, "/readyz")[0] != 200, "/readyz still 200 without node 1")

    session_tags(g, h, agent0)


if __name__ == "__main__":
    H.run(scenario)
