/*
 * model-logits: loads a model directory single-rank with gang_model_load, runs the
 * generation engine's forward pass on the given token ids (one request, one sampled
 * token) and prints the logits of the last position as JSON, {"logits": [...]}, with the
 * engine's raw logprobs of that step (the greedy token's and the top 5: "token",
 * "logprob", "top_ids", "top_logprobs"), for the numpy reference
 * (tests/reference/reference.py) to compare against.
 *
 *   model-logits DIR 1,2,3
 *
 * Exit codes: 0, 2 for usage, 3 for a model error, 70 for anything else.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"
#include "ganglion/model.h"

#define MAX_IDS 4096

/* Parses "1,2,3" into ids; returns the count, or 0 on a malformed list. */
static uint32_t parse_ids(const char *s, int32_t *ids)
{
    uint32_t n = 0;
    char *end;

    while (*s != '\0' && n < MAX_IDS) {
        long v = strtol(s, &end, 10);

        if (end == s || v < 0 || v > INT32_MAX)
            return 0;
        ids[n++] = (int32_t)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return 0;
    }
    return *s == '\0' ? n : 0;
}

/* Prints the logprobs of the step's TOKEN event (the fields after "logits"). */
static int print_logprobs(gang_engine *e)
{
    gang_gen_event ev;
    uint32_t i;

    while (gang_engine_poll(e, &ev) == 1) {
        if (ev.kind != GANG_GEN_TOKEN)
            continue;
        printf(",\"token\":%d,\"logprob\":%.9g,\"top_ids\":[", ev.token, (double)ev.logprob);
        for (i = 0; i < ev.n_top; i++)
            printf("%s%d", i > 0 ? "," : "", ev.top_ids[i]);
        printf("],\"top_logprobs\":[");
        for (i = 0; i < ev.n_top; i++)
            printf("%s%.9g", i > 0 ? "," : "", (double)ev.top_logprobs[i]);
        printf("]");
        return 0;
    }
    return GANG_EINTERNAL;
}

/* Runs one request of the prompt ids through a single-rank engine; prints its logits. */
static int run(gang_model *m, const int32_t *ids, uint32_t n)
{
    gang_engine_config cfg = {.max_batch = 1,
                              .max_ctx = n + 1,
                              .kv_cache_bytes = UINT64_C(1) << 40,
                              .microbatches = 1,
                              .max_step_tokens = n};
    gang_gen_request r;
    gang_engine *e = NULL;
    gang_kernels *k = NULL;
    const float *lg = NULL;
    char err[256];
    uint32_t i;
    int rc;

    rc = gang_engine_init(m, &cfg, &e, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "model-logits: engine: %s\n", err);
        return rc;
    }
    rc = gang_kernels_open("cpu", &k);
    if (rc != 0)
        goto out_engine;
    memset(&r, 0, sizeof(r));
    r.id = 1;
    r.prompt = ids;
    r.n_prompt = n;
    r.max_tokens = 1;
    r.sampling.top_p = 1.0f;
    r.sampling.logprobs = 1;
    r.sampling.top_logprobs = 5;
    rc = gang_engine_submit(e, &r, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "model-logits: %s\n", err);
        goto out_kernels;
    }
    rc = gang_engine_step(e, k, NULL, NULL, NULL, NULL, 600000);
    if (rc != 0)
        goto out_kernels;
    lg = gang__engine_logits(e, 0);
    if (lg == NULL) {
        rc = GANG_EINTERNAL;
        goto out_kernels;
    }
    printf("{\"logits\":[");
    for (i = 0; i < m->topo.vocab; i++)
        printf("%s%.9g", i > 0 ? "," : "", (double)lg[i]);
    printf("]");
    rc = print_logprobs(e);
    printf("}\n");

out_kernels:
    gang_kernels_close(k);
out_engine:
    gang_engine_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    static int32_t ids[MAX_IDS];
    gang_model_config mc;
    gang_topology t;
    gang_model *m = NULL;
    char err[512];
    uint32_t n;
    int rc;

    if (argc != 3 || (n = parse_ids(argv[2], ids)) == 0) {
        fprintf(stderr, "usage: model-logits DIR ID,ID,...\n");
        return GANG_EXIT_USAGE;
    }
    rc = gang_model_config_read(argv[1], &mc, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "model-logits: %s\n", err);
        return gang_exit_code_for(rc);
    }
    rc = gang_model_topology(&mc, 1, 1, 1, 1, &t, err, sizeof(err));
    if (rc == 0)
        rc = gang_model_load(argv[1], &t, 0, &m, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "model-logits: %s\n", err);
        return gang_exit_code_for(rc);
    }
    rc = run(m, ids, n);
    gang_model_free(m);
    if (rc != 0) {
        fprintf(stderr, "model-logits: %s\n", gang_strerror(rc));
        return gang_exit_code_for(rc);
    }
    return 0;
}
