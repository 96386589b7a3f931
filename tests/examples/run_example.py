#!/usr/bin/env python3
"""Smoke test of one example of examples/ (tests/examples.cmake runs one per example).

  run_example.py --bin PATH local-gang      examples/local-gang/run.sh (serve --local with
                                            an API key, curl): 401 without the key, a text
                                            completion and a chat of 8 tokens, the streamed
                                            chat ends with [DONE] and joins to the chat's text
  run_example.py --bin PATH python-client   a local gang with an API key started here, then
                                            examples/python-client/client.py (the openai
                                            package): models, completion, chat, streamed chat
                                            (same text) and an id prompt answered; without
                                            the key 401, a bad id 400, both exit 1
  run_example.py --bin PATH mpirun          examples/mpirun/run.sh under Open MPI's mpirun
  run_example.py --bin PATH kubernetes      examples/kubernetes/check.py: every Pod of the
                                            rendered overlay passes --check-config; a copy
                                            with replicas != --nnodes must fail

Both serve a random model made by `ganglion mkmodel` (SmolLM2's vocabulary size) with
SmolLM2-135M-Instruct's tokenizer files (tokenizer.json, tokenizer_config.json with the
chat template, special_tokens_map.json) copied from `scripts/fetch-reference.sh smollm2`,
and python-client runs under `scripts/fetch-reference.sh python` (which has `openai`);
when fetch-reference.sh fails they exit 77 with its reason.

Ports are picked free at run time (free on 127.0.0.1 and 127.0.0.2, where the second
agent listens). Every process the example starts carries a unique marker in its
environment; when the example is over, any process still carrying it is a leak: it is
killed (by pid) and the test fails. Every wait has a deadline.
Exit status: 0 passed, 1 failed, 77 skipped (a tool is missing; the reason is printed).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "examples")
SKIP = 77
MARK = "GANG_EXAMPLE_TEST_MARK"


def say(msg):
    print(msg, flush=True)


def free_ports(n):
    """n distinct TCP ports that are free on 127.0.0.1 and 127.0.0.2 right now."""
    ports = []
    deadline = time.monotonic() + 10
    while len(ports) < n and time.monotonic() < deadline:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.2", port))
        except OSError:
            continue
        if port not in ports:
            ports.append(port)
    if len(ports) < n:
        raise RuntimeError("no free ports")
    return ports


def marked_pids(mark):
    """Pids of the processes whose environment holds MARK=mark."""
    pids = []
    needle = ("%s=%s" % (MARK, mark)).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


class Run:
    """Runs commands with a marker in their environment; sweeps leaked processes."""

    def __init__(self, ganglion):
        self.mark = uuid.uuid4().hex
        self.env = dict(os.environ, GANGLION=ganglion, **{MARK: self.mark})
        self.failures = []

    def expect(self, cond, what, detail=""):
        say(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)
            if detail:
                say(detail)

    def run(self, argv, timeout, env=None, **kw):
        """Runs argv in its own process group; on timeout the group is killed."""
        p = subprocess.Popen(argv, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += "\n[killed: over its %d s deadline]" % timeout
            return 124, out
        return p.returncode, out

    def start(self, argv, log):
        return subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    @staticmethod
    def stop(p, grace=10):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    def sweep(self):
        """Fails the test for every process still marked after a short grace; kills it."""
        deadline = time.monotonic() + 5
        while marked_pids(self.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = marked_pids(self.mark)
        for pid in left:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
            except OSError:
                cmd = "?"
            say("     leaked pid %d: %s" % (pid, cmd))
        self.expect(not left, "no process of the example is left behind")


FETCH_TIMEOUT_S = 300  # a first fetch downloads the model and builds the venv
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class Skip(Exception):
    pass


def fetch_reference(r, what):
    """The path scripts/fetch-reference.sh prints for `what`; Skip with its reason."""
    rc, out = r.run(["bash", os.path.join(REPO, "scripts", "fetch-reference.sh"), what],
                    timeout=FETCH_TIMEOUT_S)
    lines = out.strip().splitlines()
    if rc != 0 or not lines or not os.path.exists(lines[-1]):
        reason = [ln for ln in lines if ln.startswith("fetch-reference:")][-3:] or lines[-3:]
        raise Skip("scripts/fetch-reference.sh %s failed (exit %d): %s"
                   % (what, rc, " | ".join(reason) or "no output"))
    return lines[-1]


def tokenized_model(r, ganglion, work):
    """A tiny random model with SmolLM2's tokenizer and chat template, in work/model."""
    ref = fetch_reference(r, "smollm2")
    missing = [f for f in TOKENIZER_FILES if not os.path.isfile(os.path.join(ref, f))]
    if missing:
        raise Skip("%s lacks %s (fetch-reference.sh is not finished?)" % (ref, missing))
    model = os.path.join(work, "model")
    rc, out = r.run([ganglion, "mkmodel", "--out", model, "--layers", "2", "--hidden", "64",
                     "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "49152",
                     "--seed", "1"], timeout=60)
    r.expect(rc == 0, "mkmodel (random weights, SmolLM2's vocabulary size)", out)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(ref, f), model)
    return model


def json_line(out, prefix):
    """The first line of out starting with prefix, parsed as JSON (None if none)."""
    for line in out.splitlines():
        if line.startswith(prefix):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def sse_chunks(out):
    """The `data: {...}` chunks of an SSE stream in out, and whether [DONE] ended it."""
    chunks, done = [], False
    for line in out.splitlines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: {"):
            chunks.append(json.loads(line[6:]))
    return chunks, done


def test_local_gang(r, ganglion):
    http, rdzv = free_ports(2)
    with tempfile.TemporaryDirectory(prefix="ganglion-example-") as work:
        model = tokenized_model(r, ganglion, work)
        env = {"HTTP_PORT": str(http), "RDZV_PORT": str(rdzv), "READY_TIMEOUT": "90",
               "MODEL": model, "MAX_TOKENS": "8"}
        rc, out = r.run(["bash", os.path.join(EXAMPLES, "local-gang", "run.sh")], timeout=150,
                        env=env)
        say(out)
    r.expect(rc == 0, "local-gang/run.sh exits 0 (exit %d)" % rc)
    r.expect(re.search(r'"invalid_api_key".* HTTP 401$', out, re.M) is not None,
             "without the API key: 401, invalid_api_key")
    models = json_line(out, '{"object":"list"')
    r.expect(models is not None and models["data"][0]["id"] == "model", "GET /v1/models")
    comp = json_line(out, '{"id":"cmpl-')
    r.expect(comp is not None and comp["object"] == "text_completion" and
             isinstance(comp["choices"][0]["text"], str) and comp["choices"][0]["text"] and
             comp["usage"]["completion_tokens"] == 8,
             "the text completion holds 8 tokens of text")
    chat = json_line(out, '{"id":"chatcmpl-')
    text = chat["choices"][0]["message"]["content"] if chat else None
    r.expect(chat is not None and chat["object"] == "chat.completion" and text and
             chat["usage"]["completion_tokens"] == 8, "the chat answer holds 8 tokens of text")
    chunks, done = sse_chunks(out)
    joined = "".join((c["choices"][0]["delta"].get("content") or "")
                     for c in chunks if c["choices"])
    usage = [c["usage"] for c in chunks if c.get("usage")]
    r.expect(done and chunks and all(c["object"] == "chat.completion.chunk" for c in chunks),
             "the streamed chat: chat.completion.chunk events, then data: [DONE]")
    r.expect(joined == text, "the streamed deltas join to the chat's text (%r vs %r)"
             % (joined, text))
    r.expect(usage and usage[-1]["completion_tokens"] == 8, "the stream's usage chunk: 8 tokens")
    r.sweep()


def completion_of(out):
    """The JSON answer of /v1/completions printed by an example script."""
    for line in out.splitlines():
        if line.startswith('{"id"'):
            return json.loads(line)
    return None


def test_script(r, script, extra_env=None):
    http, rdzv = free_ports(2)
    env = {"HTTP_PORT": str(http), "RDZV_PORT": str(rdzv), "READY_TIMEOUT": "90"}
    env.update(extra_env or {})
    rc, out = r.run(["bash", os.path.join(EXAMPLES, script)], timeout=150, env=env)
    say(out)
    r.expect(rc == 0, "%s exits 0 (exit %d)" % (script, rc))
    ans = completion_of(out)
    r.expect(ans is not None and len(ans["choices"][0]["tokens"]) == 8,
             "the completion holds 8 tokens")
    r.sweep()


def test_python_client(r, ganglion):
    http, rdzv = free_ports(2)
    client = os.path.join(EXAMPLES, "python-client", "client.py")
    py = fetch_reference(r, "python")
    with tempfile.TemporaryDirectory(prefix="ganglion-example-") as work:
        model = tokenized_model(r, ganglion, work)
        key = os.path.join(work, "api-key")
        with open(key, "w") as f:
            f.write("example-test-key-%s\n" % r.mark)
        with open(work + "/gang.log", "w") as log:
            gang = r.start([ganglion, "serve", "--local", "--model", model,
                            "--nnodes", "2", "--nproc-per-node", "1", "--tp", "1", "--pp", "2",
                            "--kv-cache-mb", "8", "--max-ctx", "256", "--api-key-file", key,
                            "--http-port", str(http), "--rdzv-port", str(rdzv)], log)
        try:
            url = "http://127.0.0.1:%d" % http
            rc, out = r.run([py, client, "--url", url, "--wait", "90", "--api-key-file", key,
                             "--prompt-ids", "1,2,3", "--max-tokens", "5"], timeout=150,
                            env={"OPENAI_API_KEY": ""})
            say(out)
            r.expect(rc == 0, "client.py: models, completion, chat, streamed chat, an id "
                     "prompt (exit %d)" % rc)
            r.expect(re.search(r"^models: model$", out, re.M) is not None, "the model listed")
            r.expect(re.search(r"^completion: .* \(length, 5 tokens\)$", out, re.M) is not None,
                     "a text completion of 5 tokens")
            r.expect(re.search(r"^chat: .* \(length, 5 tokens\)$", out, re.M) is not None,
                     "a chat answer of 5 tokens")
            r.expect(re.search(r"^streamed chat: 5 chunks, length, 5 tokens; same text as "
                               r"unstreamed: True$", out, re.M) is not None,
                     "the streamed chat: 5 chunks, the chat's text")
            m = re.search(r"^prompt ids 1,2,3 -> ([\d ]+) \(length\)$", out, re.M)
            r.expect(m is not None and len(m.group(1).split()) == 5,
                     "the id prompt: 5 generated ids")
            rc, out = r.run([py, client, "--url", url, "--wait", "10"], timeout=60,
                            env={"OPENAI_API_KEY": ""})
            say(out)
            r.expect(rc == 1 and "HTTP 401" in out, "without the API key: 401, exit 1")
            rc, out = r.run([py, client, "--url", url, "--wait", "10", "--api-key-file", key,
                             "--prompt-ids", "1,99999"], timeout=60)
            say(out)
            r.expect(rc == 1 and "HTTP 400" in out, "a token id outside the vocabulary: 400, "
                     "exit 1")
            if gang.poll() is not None:
                with open(work + "/gang.log") as f:
                    say(f.read()[-3000:])
            r.expect(gang.poll() is None, "the gang still runs")
        finally:
            r.stop(gang)
        r.expect(gang.returncode == 0, "the gang stops with exit 0 on SIGTERM (exit %s)"
                 % gang.returncode)
    r.sweep()


def test_kubernetes(r):
    check = os.path.join(EXAMPLES, "kubernetes", "check.py")
    rc, out = r.run([sys.executable, check], timeout=240)
    say(out)
    if rc == SKIP:
        return SKIP
    r.expect(rc == 0 and out.count("ok   ") == 2, "every Pod of the example passes (exit %d)"
             % rc)
    # A broken copy must fail: 3 replicas for a gang of --nnodes 2.
    with tempfile.TemporaryDirectory(prefix="ganglion-k8s-example-") as tmp:
        shutil.copytree(os.path.join(REPO, "k8s"), os.path.join(tmp, "k8s"))
        shutil.copytree(os.path.join(EXAMPLES, "kubernetes"),
                        os.path.join(tmp, "examples", "kubernetes"))
        kust = os.path.join(tmp, "examples", "kubernetes", "kustomization.yaml")
        with open(kust) as f:
            text = f.read()
        broken = text.replace("path: /spec/replicas\n        value: 2",
                              "path: /spec/replicas\n        value: 3")
        r.expect(broken != text, "the replicas patch is where the test expects it")
        with open(kust, "w") as f:
            f.write(broken)
        rc, out = r.run([sys.executable, os.path.join(tmp, "examples", "kubernetes", "check.py")],
                        timeout=240)
        say(out)
        r.expect(rc == 1 and "but 3 replicas" in out, "3 replicas with --nnodes 2 fail")
        # And one whose Pods lose --api-key-file (an open API) must fail too.
        with open(kust, "w") as f:
            f.write(re.sub(r"(?m)^ *- --api-key-file=\S*\n", "", text))
        rc, out = r.run([sys.executable, os.path.join(tmp, "examples", "kubernetes", "check.py")],
                        timeout=240)
        say(out)
        r.expect(rc == 1 and "no --api-key-file" in out, "Pods without --api-key-file fail")
    r.sweep()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the ganglion binary")
    ap.add_argument("example", choices=["local-gang", "python-client", "mpirun", "kubernetes"])
    a = ap.parse_args()
    ganglion = os.path.abspath(a.bin)
    r = Run(ganglion)
    try:
        return run_one(a, r, ganglion)
    except Skip as e:
        say("SKIP example-%s: %s" % (a.example, e))
        r.sweep()
        return SKIP


def run_one(a, r, ganglion):
    if a.example == "local-gang":
        test_local_gang(r, ganglion)
    elif a.example == "mpirun":
        if shutil.which(os.environ.get("MPIRUN", "mpirun")) is None:
            say("SKIP example-mpirun: mpirun not found (Open MPI: apt-get install openmpi-bin)")
            return SKIP
        test_script(r, "mpirun/run.sh")
    elif a.example == "python-client":
        test_python_client(r, ganglion)
    elif test_kubernetes(r) == SKIP:
        return SKIP
    if r.failures:
        say("%d check(s) failed" % len(r.failures))
        return 1
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
