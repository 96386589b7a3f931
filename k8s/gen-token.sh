#!/usr/bin/env bash
# Writes the two secrets of a gang that k8s/base's secretGenerator turns into Secrets:
#   base/secrets/rdzv-token  -> Secret ganglion-rdzv-token (the rendezvous HMAC key, mounted
#                               at /etc/ganglion/token, passed as --token-file);
#   base/secrets/api-key     -> Secret ganglion-api-key (the key API clients send as
#                               "Authorization: Bearer KEY", mounted at /etc/ganglion/api-key,
#                               passed as --api-key-file).
#
#   k8s/gen-token.sh                     writes whichever of the two is missing
#   k8s/gen-token.sh --force [NAME]      writes a new one: NAME is rdzv-token or api-key
#                                        (both without NAME)
#
# Idempotent: existing files are kept. Rotating either means replacing whole gangs (a new
# Secret is a new Pod template), see docs/operations.md "Rotating the token" and "The API
# key". Each is 32 random bytes, hex-encoded (64 printable characters), created 0600 and
# git-ignored (k8s/.gitignore). GANGLION_TOKEN_OUT / GANGLION_API_KEY_OUT override where
# they go.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
force=0
only=""
for a in "$@"; do
    case "$a" in
    --force) force=1 ;;
    rdzv-token | api-key) only="$a" ;;
    *)
        echo "usage: $0 [--force] [rdzv-token|api-key]" >&2
        exit 2
        ;;
    esac
done

gen() { # gen NAME PATH
    local name="$1" out="$2" tmp
    if [ -n "$only" ] && [ "$only" != "$name" ]; then
        return 0
    fi
    if [ -s "$out" ] && [ "$force" = 0 ]; then
        echo "gen-token: $out exists (kept; --force $name writes a new one)"
        return 0
    fi
    mkdir -p "$(dirname "$out")"
    tmp="$(umask 077 && mktemp "$out.XXXXXX")"
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp"
    mv -f "$tmp" "$out"
    echo "gen-token: wrote a new $name to $out"
}

gen rdzv-token "${GANGLION_TOKEN_OUT:-$here/base/secrets/rdzv-token}"
gen api-key "${GANGLION_API_KEY_OUT:-$here/base/secrets/api-key}"
