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
                that read that answer's fields are listed in SUITE_XFAIL)
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
            if path.split("?", 1)[0] in V1_ALIASES:
                path = "/v1" + path
            return suite_url(self, path, host)

        utils.ServerProcess.make_url = make_url


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
