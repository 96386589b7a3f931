/*
 * The transport of disaggregated prefill/decode's KV transfers (issue #26,
 * launcher/worker-kv.c): the engine's gang_kv_hooks over TCP between the ranks of a
 * prefill gang and those of a decode gang that hold the same layers and kv heads (equal
 * TP, any PP: the engine names which layers of which rank). Internal to the launcher.
 */
#ifndef GANGLION_LAUNCHER_WORKER_KV_H
#define GANGLION_LAUNCHER_WORKER_KV_H

#include "worker.h"

typedef struct gang__wkv gang__wkv;

/*
 * Starts the transport of global rank `rank` for engine e with the config's role: a
 * prefill gang's rank with a --kv-port keeps its exports (at most kv_store_bytes, each
 * for kv_hold_ms) and serves them on kv_port + rank from a thread of its own; every rank
 * may fetch. Plugs the hooks into e (gang_engine_set_kv_hooks), with the rank's address
 * (kv_advertise when it is IPv4) for the export's list of node addresses. A listener that cannot be
 * opened is logged and leaves exports off (the decode gangs then prefill). Returns 0 and
 * *out, or GANG_ENOMEM. The loader thread calls it once; gang__wkv_stop (after the engine
 * stopped stepping) joins the thread and frees everything.
 */
int gang__wkv_start(const gang__wres_config *c, uint32_t rank, gang_engine *e, gang__wkv **out);
void gang__wkv_stop(gang__wkv *k);

#endif
