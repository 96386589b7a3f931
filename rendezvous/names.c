/*
 * Printable names of the rendezvous enums, for logs, /status and metrics labels. The
 * names are part of the external contract (dashboards match on them), so they never
 * change once released.
 */
#include "ganglion/rendezvous.h"

/*
 * Returns the lowercase name of a gang_rank_state ("ready", "failed", ...), or "unknown"
 * for any other value: the value may come off the wire, so it is never trusted as an
 * index. The string is static.
 */
const char *gang_rank_state_name(int s)
{
    switch (s) {
    case GANG_RANK_DOWN:
        return "down";
    case GANG_RANK_IDLE:
        return "idle";
    case GANG_RANK_STARTING:
        return "starting";
    case GANG_RANK_READY:
        return "ready";
    case GANG_RANK_ABORTING:
        return "aborting";
    case GANG_RANK_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

/*
 * Returns the lowercase name of a gang_state ("waiting", "serving", ...), or "unknown"
 * for any other value. The string is static.
 */
const char *gang_state_name(int s)
{
    switch (s) {
    case GANG_STATE_WAITING:
        return "waiting";
    case GANG_STATE_BACKOFF:
        return "backoff";
    case GANG_STATE_STARTING:
        return "starting";
    case GANG_STATE_SERVING:
        return "serving";
    case GANG_STATE_ABORTING:
        return "aborting";
    case GANG_STATE_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}
