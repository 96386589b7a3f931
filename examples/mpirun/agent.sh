#!/usr/bin/env bash
# One ganglion agent per MPI rank (started by examples/mpirun/run.sh, or by your own
# mpirun line). Open MPI exports OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE to every
# process, and ganglion takes its node index and --nnodes from them; it only needs to be
# told where rank 0's coordinator listens (COORDINATOR=HOST:PORT). Every other argument is
# passed to `ganglion serve`.
#
# ONE_HOST=1 (a demo on one machine): every rank binds its own loopback address,
# 127.0.0.<rank+1>, so that all agents can use the same HTTP and rendezvous ports, as
# `ganglion serve --local` does. On real nodes leave it unset: each agent listens on
# --bind-address (default 0.0.0.0) and advertises this host's address to the others.
set -euo pipefail
GANGLION=${GANGLION:-ganglion}
: "${COORDINATOR:?set COORDINATOR=HOST:PORT (rank 0 node and --rdzv-port)}"
: "${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun}"
extra=()
if [ "${ONE_HOST:-0}" = 1 ]; then
    extra+=(--bind-address "127.0.0.$((OMPI_COMM_WORLD_RANK + 1))")
fi
exec "$GANGLION" serve --coordinator "$COORDINATOR" "${extra[@]}" "$@"
