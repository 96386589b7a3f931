"""pytest plugin of bench/llama-suite.sh: runs llama.cpp's server test suite
(tools/server/tests) offline against llama-server or against ganglion, on one local GGUF.

The suite starts its server through utils.ServerProcess.start (flags of llama-server) and
fetches Hugging Face models through ServerPreset.load_all; here load_all does nothing and
start serves SUITE_GGUF with SUITE_TARGET:
  llama-server  the suite's own start (the llama-server of LLAMA_SERVER_BIN_PATH), with
                the model forced to the local file and --offline;
  ganglion      `ganglion serve --local --model FILE.gguf` on the suite's port, with the
                context (--max-ctx), the alias (--served-model-name) and the API key
                (--api-key-file) the test asked for, ready once /readyz answers 200;
                the requests the suite sends to llama-server's unprefixed paths
                (/chat/completions, /completions, /models) go to /v1/... (llama-server's
                /completions is its native /completion, not /v1/completions: the tests
                that read that answer's fields are listed in SUITE_XFAIL);
                the suite's OpenAI clients (openai.OpenAI) send through a transport that
                does the same /v1 mapping for a base URL without /v1 and replaces the
                OpenAI model names the suite sends (OPENAI_MODEL_NAMES: names of OpenAI's
                own models, which llama-server ignores) by the model the server serves
                (the first id of its /v1/models), so the test checks the behaviour it asks
                for (logprobs, the API key...) and not the name; any other unknown name
                still gets ganglion's 404 model_not_found;
                in the tests of TOKENIZE_SHAPE_TESTS only (test_logit_bias, whose
                assertion is about logit_bias), a POST /tokenize in llama.cpp's shape
                ({"content"}) is sent in ganglion's (vLLM's: {"prompt",
                "add_special_tokens": false}); both answer "tokens" (the tests of
                /tokenize's own shape are not translated)
Both servers render the GGUF's own chat template (SmolLM2's): the template files some tests
name are in llama.cpp's source tree, not in the sdist's tests.
For the ganglion target, the tests listed in SUITE_XFAIL (lines "node id<TAB>reason": what
llama.cpp-only behaviour the test asserts) are marked expected failures with that reason.
"""
import os
import subprocess
import tempfile
import time

import pytest

TARGET = os.environ.get("SUITE_TARGET", "llama-server")
GGUF = os.environ.get("SUITE_GGUF", "")
GANGLION = os.environ.get("SUITE_GANGLION_BIN", "")
XFAIL = os.environ.get("SUITE_XFAIL", "")
# --max-ctx when the test sets none (llama-server's default is the model's, 8192 for SmolLM2)
DEFAULT_CTX = 2048
V1_ALIASES = ("/chat/completions", "/completions", "/models")
# OpenAI model names the suite's OpenAI clients send (llama-server serves whatever is asked)
OPENAI_MODEL_NAMES = ("gpt-3.5-turbo", "gpt-3.5-turbo-instruct", "davinci-002")
# Tests whose llama.cpp-shaped POST /tokenize is translated to ganglion's shape
TOKENIZE_SHAPE_TESTS = ("unit/test_chat_completion.py::test_logit_bias",)
_current_test = [""]


def _xfail_list():
    out = {}
    if XFAIL and os.path.exists(XFAIL):
        with open(XFAIL) as f:
            for line in f:
                line = line.rstrip("\n")
                if line and not line.startswith("#") and "\t" in line:
                    node, reason = line.split("\t", 1)
                    out[node.strip()] = reason.strip()
    return out


def _start_ganglion(self, timeout_seconds):
    import utils
    port = int(self.server_port)
    args = [GANGLION, "serve", "--local", "--model", GGUF, "--http-port", str(port),
            "--rdzv-port", str(port + 1000), "--bind-address", "127.0.0.1",
            "--max-ctx", str(self.n_ctx or DEFAULT_CTX)]
    if self.model_alias:
        args += ["--served-model-name", self.model_alias]
    if self.api_key:
        fd, path = tempfile.mkstemp(prefix="ganglion-suite-key-")
        with os.fdopen(fd, "w") as f:
            f.write(self.api_key)
        args += ["--api-key-file", path]
    if self.cors_origins:
        args += ["--cors-allow-origin", self.cors_origins]
    print("tests: starting ganglion with: %s" % " ".join(args))
    self._log = open(os.devnull, "w")
    self.process = subprocess.Popen(args, stdout=self._log, stderr=self._log)
    utils.server_instances.add(self)
    t0 = time.time()
    while time.time() - t0 < timeout_seconds:
        try:
            r = self.make_request("GET", "/readyz")
            if r.status_code == 200:
                self.ready = True
                return
        except Exception:
            pass
        if self.process.poll() is not None:
            raise RuntimeError("ganglion exited with %d" % self.process.returncode)
        time.sleep(0.05)
    raise TimeoutError("ganglion did not become ready within %d s" % timeout_seconds)


def _v1_path(path):
    if path.split("?", 1)[0] in V1_ALIASES:
        return "/v1" + path
    return path


def _openai_transport():
    """An httpx transport for the suite's OpenAI clients on the ganglion run: the /v1
    mapping of make_url for a base URL without /v1, and OPENAI_MODEL_NAMES replaced by the
    first model id of the server's GET /v1/models (asked with the request's own headers)."""
    import json

    import httpx

    class Transport(httpx.HTTPTransport):
        def handle_request(self, request):
            url = request.url.copy_with(raw_path=_v1_path(request.url.raw_path.decode()).encode())
            content = request.read()
            try:
                body = json.loads(content) if content else None
            except ValueError:
                body = None
            if isinstance(body, dict) and body.get("model") in OPENAI_MODEL_NAMES:
                auth = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
                models = httpx.Request("GET", url.copy_with(raw_path=b"/v1/models"), headers=auth)
                listing = super().handle_request(models)
                listing.read()
                body["model"] = json.loads(listing.content)["data"][0]["id"]
                content = json.dumps(body).encode()
            headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
            request = httpx.Request(request.method, url, headers=headers, content=content,
                                    extensions=request.extensions)
            return super().handle_request(request)

    return Transport()


def _patch_openai():
    import httpx
    import openai
    init = openai.OpenAI.__init__

    def patched(self, *args, **kwargs):
        if kwargs.get("http_client") is None:
            kwargs["http_client"] = httpx.Client(transport=_openai_transport(), timeout=600)
        init(self, *args, **kwargs)

    openai.OpenAI.__init__ = patched


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid.split("[", 1)[0]


def pytest_configure(config):
    import utils
    utils.ServerPreset.load_all = staticmethod(lambda: None)
    suite_start = utils.ServerProcess.start

    def start(self, timeout_seconds=utils.DEFAULT_HTTP_TIMEOUT):
        # Every preset serves the one local GGUF: no download, whatever it named.
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
        self.model_file = GGUF
        self.offline = True
        # test_tool_call.py names template files of llama.cpp's source tree
        # (models/templates/*.jinja, not in the sdist): the GGUF's own template instead.
        self.chat_template_file = None
        if TARGET == "ganglion":
            return _start_ganglion(self, max(timeout_seconds, 60))
        return suite_start(self, max(timeout_seconds, 60))

    utils.ServerProcess.start = start
    if TARGET == "ganglion":
        suite_url = utils.ServerProcess.make_url

        def make_url(self, path, host=None):
            # llama-server also answers OpenAI's paths without the /v1 prefix; the suite
            # uses both. ganglion serves them under /v1 only, as OpenAI's base URL has it.
            return suite_url(self, _v1_path(path), host)

        utils.ServerProcess.make_url = make_url
        suite_request = utils.ServerProcess.make_request

        def make_request(self, method, path, data=None, *args, **kwargs):
            # llama.cpp's /tokenize shape -> ganglion's (vLLM's), in TOKENIZE_SHAPE_TESTS only
            if (_current_test[0] in TOKENIZE_SHAPE_TESTS and method == "POST"
                    and path == "/tokenize" and isinstance(data, dict) and "content" in data):
                data = {"prompt": data["content"], "add_special_tokens": False}
            return suite_request(self, method, path, data, *args, **kwargs)

        utils.ServerProcess.make_request = make_request
        _patch_openai()


def pytest_collection_modifyitems(config, items):
    if TARGET != "ganglion":
        return
    xf = _xfail_list()
    for item in items:
        reason = xf.get(item.nodeid)
        if reason is None:  # a whole parametrized test: "file::name"
            reason = xf.get(item.nodeid.split("[", 1)[0])
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
