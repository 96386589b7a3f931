/*
 * The one set-up of an engine from the serving flags (engine.h, gang_engine_setup): the
 * workers (launcher/worker-engine.c) and `ganglion bench decode` both call it, so that
 * the KV cache's type and budget cannot differ between what serves and what is measured
 * (they once did: the benchmark ran an f32 cache where serve ran the weights' bf16).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ganglion/kernels.h"
#include "ganglion/engine.h"
#include "ganglion/model.h"
#include "ganglion/common.h"

/* The host's MemAvailable in bytes, 0 when /proc/meminfo cannot be read. */
static uint64_t setup_host_available(void)
{
    uint64_t avail_kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &avail_kb) == 1)
            break;
    }
    if (f != NULL)
        fclose(f);
    return avail_kb * 1024;
}

uint64_t gang_engine_kv_budget(const gang_engine_setup *s, const gang_kernels *k)
{
    gang_kernels_pool_stats ps;
    uint64_t ranks = s->ranks_per_host > 0 ? s->ranks_per_host : 1;

    if (s->kv_cache_bytes != 0)
        return s->kv_cache_bytes;
    if (k != NULL && gang_kernels_pool_stats_get(k, &ps) == 0 && ps.pool_bytes > 0)
        return ps.largest_free / 100 * GANG_KV_DEVICE_SHARE;
    return setup_host_available() / 100 * GANG_KV_HOST_SHARE / ranks;
}

void gang_engine_setup_config(const gang_engine_setup *s, gang_kernels_wtype wt, uint64_t kv_bytes,
                              gang_engine_config *out)
{
    memset(out, 0, sizeof(*out));
    out->max_batch = s->max_batch;
    out->max_ctx = s->max_ctx;
    out->kv_cache_bytes = kv_bytes;
    out->microbatches = s->microbatches;
    out->max_step_tokens = s->max_step_tokens;
    out->kv_dtype = s->kv_dtype_auto ? gang_engine_kv_dtype_auto(wt) : s->kv_dtype;
    out->prefix_caching = s->prefix_caching;
    out->cuda_graphs = s->cuda_graphs;
}

int gang_engine_setup_init(const gang_engine_setup *s, gang_model *m, gang_kernels *k,
                           gang_engine **out, gang_engine_config *used, char *err, size_t errlen)
{
    gang_engine_config ec;

    gang_engine_setup_config(s, m->wtype, gang_engine_kv_budget(s, k), &ec);
    if (used != NULL)
        *used = ec;
    int rc = gang_engine_init_on(m, k, &ec, out, err, errlen);
    if (rc != 0 || s->model_dir == NULL || s->model_dir[0] == '\0')
        return rc;
    /* In the background: a model without a usable tokenizer serves token ids only, and
     * no grammar ever comes. */
    char why[256];
    if (gang_engine_load_vocab(*out, s->model_dir, why, sizeof(why)) != 0)
        gang_warn("grammars are not enforced on this rank: %s", why);
    return 0;
}
