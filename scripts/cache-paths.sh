# Where the fetch scripts keep what they download, sourced by scripts/fetch-*.sh and the
# tests that call them: one definition of the three places.
#   GANGLION_CACHE      packages and converted models: /var/cache/ganglion as root, else
#                       ${XDG_CACHE_HOME:-~/.cache}/ganglion
#   GANGLION_TOK_VENV   the tokenizer venv (tokenizers, gguf, sentencepiece):
#                       /opt/ganglion-tok-venv as root, else <cache>/tok-venv
#   GANGLION_REF_VENV   the reference venv (transformers on Debian's torch, openai):
#                       /opt/ganglion-ref-venv as root, else <cache>/ref-venv
# Each may be set in the environment; this sets CACHE, TOK_VENV and REF_VENV.
# shellcheck shell=bash
# shellcheck disable=SC2034 # the three are for the scripts that source this file
if [ "$(id -u)" -eq 0 ]; then
    CACHE="${GANGLION_CACHE:-/var/cache/ganglion}"
    TOK_VENV="${GANGLION_TOK_VENV:-/opt/ganglion-tok-venv}"
    REF_VENV="${GANGLION_REF_VENV:-/opt/ganglion-ref-venv}"
else
    CACHE="${GANGLION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ganglion}"
    TOK_VENV="${GANGLION_TOK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ganglion/tok-venv}"
    REF_VENV="${GANGLION_REF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ganglion/ref-venv}"
fi
