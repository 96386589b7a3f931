#!/usr/bin/env python3
"""Hostile bytes on the rendezvous port do not disturb the coordinator. While a 2 x 1
gang serves, connections send: garbage, garbage before even reading the CHALLENGE, a
header claiming an oversized payload, an unknown protocol version, an unknown message
type, a JOIN with trailing bytes, a READY before any JOIN, half a header then silence,
and a header whose payload never completes. Every one is closed (the malformed ones at
once, the stalled ones at the handshake deadline), and after each the gang still serves
the same generation with /readyz 200 everywhere and fresh heartbeats; a legitimate JOIN
is still answered."""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 2, 1
HANDSHAKE_S = 1.0  # the gang's --handshake-timeout-ms
PROMPT_S = 0.8     # a malformed frame is refused from its header, well before that


def join_payload(h, g):
    return H.p_join(g.job, 1, NNODES, NPROC, 1, 1, H.EMPTY_DIGEST, 0, "127.0.0.2",
                    os.urandom(32), bytes(32))


def garbage():
    b = bytearray(os.urandom(256))
    b[0] = 0x00  # never the magic
    return bytes(b)


def scenario(h):
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC)
    g.start_local()
    gen = g.wait_serving(timeout=30)
    restarts = g.coord()["restarts_total"]

    cases = [
        # name, read the CHALLENGE first, bytes to send, closed promptly (else: at deadline),
        # REJECT code allowed before the close (None: any)
        ("garbage bytes", True, garbage(), True, None),
        ("garbage before the CHALLENGE is read", False, garbage(), True, None),
        ("oversized frame", True, H.frame(H.JOIN, 0, b"", payload_len=H.MAX_PAYLOAD + 1), True,
         None),
        ("huge payload length", True, H.frame(H.JOIN, 0, b"", payload_len=0xFFFFFFFF), True,
         None),
        ("unknown protocol version (v1)", True, H.frame(H.JOIN, 0, join_payload(h, g), version=1),
         True, H.EVERSION),
        ("unknown message type", True, H.frame(99, 0, b""), True, None),
        ("JOIN with trailing bytes", True, H.frame(H.JOIN, 0, join_payload(h, g) + b"xx"), True,
         None),
        ("READY before JOIN", True, H.frame(H.READY, 1, H.p_u32(1)), True, None),
        ("half a header, then silence", True, H.frame(H.JOIN, 0, join_payload(h, g))[:10],
         False, None),
        ("a payload that never completes", True,
         H.frame(H.JOIN, 0, join_payload(h, g))[:H.HEADER.size + 40], False, None),
    ]
    for name, read_challenge, data, prompt, reject_code in cases:
        c = H.WireClient("127.0.0.1", g.rdzv_port)
        try:
            t0 = time.monotonic()
            if read_challenge:
                ch = c.recv()
                H.check(ch.type == H.CHALLENGE, "%s: first frame %r" % (name, ch))
            c.send_raw(data)
            got = c.wait_closed(HANDSHAKE_S + 3.0)
            took = time.monotonic() - t0
        except (ConnectionResetError, BrokenPipeError):
            got, took = [], time.monotonic() - t0
        finally:
            c.close()
        got = [m for m in got if m.type != H.CHALLENGE]
        H.log("%s: closed after %.3f s, frames before the close: %r" % (name, took, got))
        if prompt:
            H.check(took < PROMPT_S, "%s: took %.3f s to close; a malformed frame should be "
                    "refused at once, not at the handshake deadline" % (name, took))
        else:
            H.check(took >= HANDSHAKE_S * 0.8, "%s: closed after %.3f s, before the handshake "
                    "deadline (%.1f s) - closed for the wrong reason?" % (name, took, HANDSHAKE_S))
        for m in got:
            H.check(m.type == H.REJECT, "%s: the coordinator answered %r" % (name, m))
            if reject_code is not None:
                H.check(m.f["code"] == reject_code, "%s: REJECT code %d, expected %d"
                        % (name, m.f["code"], reject_code))
        g.assert_all_ready("after: %s" % name)
        gang = g.coord()
        H.check(gang["state"] == "serving" and gang["generation"] == gen
                and gang["restarts_total"] == restarts, "%s disturbed the gang: %r" % (name, gang))
        for r in gang["ranks"]:
            H.check(0 <= r["heartbeat_age_ms"] < g.hb_timeout_ms, "stale heartbeat: %r" % r)

    # The coordinator still does its job for a legitimate peer.
    c = H.WireClient("127.0.0.1", g.rdzv_port)
    try:
        m = c.handshake(g.job, 1, NNODES, NPROC, token=h.token)
        H.check(m.type == H.REJECT and m.f["code"] == H.EDUPLICATE,
                "a legitimate JOIN as node 1 got %r, expected REJECT duplicate" % m)
    finally:
        c.close()
    H.check(g.stop()["local"] == 0, "local gang did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
