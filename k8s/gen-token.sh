#!/usr/bin/env bash
# Writes the rendezvous HMAC token that k8s/base's secretGenerator turns into the Secret
# ganglion-rdzv-token (mounted read-only at /etc/ganglion/token in every gang Pod).
# Idempotent: an existing token is kept (rotating it means replacing whole gangs, see
# docs/operations.md "Rotating the token"); pass --force to write a new one.
# 32 random bytes, hex-encoded; the file is created 0600 and is git-ignored.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${GANGLION_TOKEN_OUT:-$here/base/secrets/rdzv-token}"
if [ -s "$out" ] && [ "${1:-}" != "--force" ]; then
    echo "gen-token: $out exists (kept; --force writes a new one)"
    exit 0
fi
mkdir -p "$(dirname "$out")"
umask 077
tmp="$(mktemp "$out.XXXXXX")"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp"
mv -f "$tmp" "$out"
echo "gen-token: wrote a new token to $out"
