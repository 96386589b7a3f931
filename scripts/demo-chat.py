#!/usr/bin/env python3
"""The client side of `make demo` (scripts/demo.sh): one streamed chat completion through
the official `openai` package (the reference Python of scripts/fetch-reference.sh), the
answer printed as it arrives.

    demo-chat.py --url http://127.0.0.1:18000 --api-key-file KEY --question "..."
                 [--max-tokens N] [--temperature T] [--seed S] [--out FILE] [--summary FILE]
                 [--kill-pid PID --kill-after N]

--out FILE receives the answer's text exactly as streamed (the deltas joined), for the
demo's comparison. --kill-pid: after N content chunks, SIGKILL that process (a worker of
the gang) and keep reading: the stream must still complete. After the answer, one summary
line (chunks, finish reason, usage, seconds, time to the first token, the kill) goes to
--summary FILE, or to stdout. Exit 0 when the stream ended with a finish reason (and the
kill happened, when asked for); 1 on any error (printed); 2 usage.
"""
import argparse
import os
import signal
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the coordinator, http://HOST:PORT")
    ap.add_argument("--api-key-file", default="", help="file with the API key (else none)")
    ap.add_argument("--question", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=180.0,
                    help="seconds without progress before the client gives up")
    ap.add_argument("--out", default="", help="file for the answer's text")
    ap.add_argument("--summary", default="", help="file for the summary line (else stdout)")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--kill-after", type=int, default=12, help="content chunks before the kill")
    a = ap.parse_args()
    try:
        import openai
    except ImportError:
        print("demo-chat: the `openai` package is missing for %s "
              "(bash scripts/fetch-reference.sh python gives a Python with it)" % sys.executable)
        return 1
    key = "none"
    if a.api_key_file:
        with open(a.api_key_file) as f:
            key = f.read().strip()
    # max_retries=0: a retried request would hide what the gang did with the first one.
    client = openai.OpenAI(base_url=a.url.rstrip("/") + "/v1", api_key=key, max_retries=0,
                           timeout=a.timeout)
    model = client.models.list().data[0].id
    extra = {} if a.seed is None else {"seed": a.seed}
    t0 = time.monotonic()
    first = None
    chunks, finish, usage, killed_at = 0, None, None, 0
    text = []
    at_line_start = True
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": a.question}], stream=True,
        stream_options={"include_usage": True}, max_tokens=a.max_tokens,
        temperature=a.temperature, **extra)
    try:
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            piece = ch.delta.content or ""
            if ch.finish_reason:
                finish = ch.finish_reason
            if not piece:
                continue
            if first is None:
                first = time.monotonic() - t0
            chunks += 1
            text.append(piece)
            # The answer, indented, as it arrives.
            out = []
            for c in piece:
                if at_line_start:
                    out.append("    ")
                out.append(c)
                at_line_start = c == "\n"
            sys.stdout.write("".join(out))
            sys.stdout.flush()
            if a.kill_pid and not killed_at and chunks >= a.kill_after:
                os.kill(a.kill_pid, signal.SIGKILL)
                killed_at = chunks
                sys.stdout.write(" <<< kill -9 worker pid %d here >>>" % a.kill_pid)
                sys.stdout.flush()
    except openai.APIError as e:
        print("\ndemo-chat: the stream broke after %d chunks: %s" % (chunks, e))
        return 1
    finally:
        if a.out:
            with open(a.out, "w") as f:
                f.write("".join(text))
    secs = time.monotonic() - t0
    print("")
    if finish is None:
        print("demo-chat: the stream ended without a finish reason after %d chunks" % chunks)
        return 1
    if a.kill_pid and not killed_at:
        print("demo-chat: the answer ended after %d chunks, before the kill" % chunks)
        return 1
    line = ("%d chunks, finish_reason %s, %s prompt + %s completion tokens, %.1f s, first "
            "token after %.1f s" % (chunks, finish, usage.prompt_tokens if usage else "?",
                                    usage.completion_tokens if usage else "?", secs,
                                    first or 0.0))
    if killed_at:
        line += ", worker killed after chunk %d" % killed_at
    if a.summary:
        with open(a.summary, "w") as f:
            f.write(line + "\n")
    else:
        print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # a connection refused, an HTTP error: say it in one line
        print("\ndemo-chat: %s: %s" % (type(e).__name__, e))
        sys.exit(1)
