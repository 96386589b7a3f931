#!/usr/bin/env python3
"""A ganglion client with the official `openai` package (pip install openai).

ganglion's coordinator speaks OpenAI's API, so the stock client works: point its base_url
at http://HOST:PORT/v1 and give it the gang's API key (the file passed to
`ganglion serve --api-key-file`). This example waits for the gang (GET /readyz, which
needs no key), then:

  1. lists the models (GET /v1/models);
  2. a text completion (POST /v1/completions, a string prompt);
  3. a chat completion (POST /v1/chat/completions, messages rendered by the model's chat
     template);
  4. the same chat streamed (stream=True: the answer printed as it arrives, then the usage);
  5. with --prompt-ids, a completion whose prompt is token ids (ganglion's own extension
     of the same endpoint; the answer also carries the generated "tokens").

Start a gang first, e.g. (see examples/local-gang/run.sh):

    MODEL=$(bash scripts/fetch-reference.sh smollm2 | tail -1)   # or any HF directory
    echo "my-secret-key" > /tmp/api-key
    ganglion serve --local --model "$MODEL" --nnodes 2 --pp 2 --api-key-file /tmp/api-key &
    python3 examples/python-client/client.py --url http://127.0.0.1:8000 \\
        --api-key-file /tmp/api-key

(scripts/fetch-reference.sh python prints a Python that has `openai`.) The key can also
come from $OPENAI_API_KEY. Errors arrive as the client's exceptions
(openai.AuthenticationError for 401, openai.BadRequestError for 400, ...); this client
prints them and exits 1.
"""
import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def wait_ready(base, timeout_s):
    """Polls GET /readyz (no key needed) until 200 or the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=1.0) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def main():
    ap = argparse.ArgumentParser(description="OpenAI-client calls to a ganglion gang")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="coordinator (agent 0)")
    ap.add_argument("--api-key-file", default="",
                    help="file holding the API key (default: $OPENAI_API_KEY)")
    ap.add_argument("--prompt", default="The capital of France is",
                    help="text prompt of the completion")
    ap.add_argument("--question", default="What is the capital of France?",
                    help="the user message of the chats")
    ap.add_argument("--prompt-ids", action="append", default=[],
                    help="comma-separated token ids: one more completion per use")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for /readyz")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    a = ap.parse_args()
    try:
        import openai
    except ImportError:
        print("this example needs the openai package: pip install openai "
              "(or run it with the Python of `bash scripts/fetch-reference.sh python`)")
        return 1
    base = a.url.rstrip("/")
    key = os.environ.get("OPENAI_API_KEY", "")
    if a.api_key_file:
        with open(a.api_key_file) as f:
            key = f.read().strip()

    if not wait_ready(base, a.wait):
        print("the gang at %s is not ready after %.0f s (GET /readyz)" % (base, a.wait))
        return 1
    # max_retries=0: show the server's answer instead of retrying it.
    client = openai.OpenAI(base_url=base + "/v1", api_key=key or "none",
                           timeout=a.timeout, max_retries=0)
    try:
        models = client.models.list().data
        model = models[0].id
        print("models: %s" % ", ".join(m.id for m in models))

        r = client.completions.create(model=model, prompt=a.prompt, max_tokens=a.max_tokens,
                                      temperature=a.temperature)
        print("completion: %r -> %r (%s, %d tokens)"
              % (a.prompt, r.choices[0].text, r.choices[0].finish_reason,
                 r.usage.completion_tokens))

        messages = [{"role": "user", "content": a.question}]
        r = client.chat.completions.create(model=model, messages=messages,
                                           max_tokens=a.max_tokens,
                                           temperature=a.temperature)
        answer = r.choices[0].message.content
        print("chat: %r -> %r (%s, %d tokens)"
              % (a.question, answer, r.choices[0].finish_reason, r.usage.completion_tokens))

        print("streamed chat: ", end="", flush=True)
        pieces, usage, finish = [], None, None
        for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=a.max_tokens,
                temperature=a.temperature, stream=True,
                stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    pieces.append(ch.delta.content)
                    print(ch.delta.content, end="", flush=True)
                finish = ch.finish_reason or finish
        print()
        print("streamed chat: %d chunks, %s, %s tokens; same text as unstreamed: %s"
              % (len(pieces), finish, usage.completion_tokens if usage else "?",
                 "".join(pieces) == answer))

        for ids in a.prompt_ids:
            prompt = [int(t) for t in ids.split(",")]
            r = client.completions.create(model=model, prompt=prompt, max_tokens=a.max_tokens,
                                          temperature=a.temperature)
            # "tokens" is ganglion's extension: the generated ids (extra fields are kept).
            toks = (r.choices[0].model_extra or {}).get("tokens")
            print("prompt ids %s -> %s (%s)"
                  % (ids, " ".join(map(str, toks or [])), r.choices[0].finish_reason))
    except openai.APIStatusError as e:
        print("HTTP %d: %s" % (e.status_code, e.message))
        return 1
    except openai.APIError as e:
        print("error: %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
