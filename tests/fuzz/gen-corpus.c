/*
 * Writes the seed corpus of fuzz-wire: one valid frame of every message type, the
 * extremes of each bounded field, and a few multi-frame streams, untagged (before and
 * without a token handshake) and tagged (fake-tag.h, as after one). Generated at build time
 * from the real encoder so that the seeds follow the protocol whenever it changes.
 *
 * Usage: gen-corpus OUTDIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/engine.h"
#include "ganglion/rendezvous.h"
#include "fake-tag.h"

static uint8_t stream[4 * GANG_WIRE_MAX_FRAME];
static size_t stream_len;
/* The same frames, each followed by its tag (sequence numbers from 0). */
static uint8_t tagged[4 * GANG_WIRE_MAX_FRAME];
static size_t tagged_len;
static uint64_t tagged_seq;

static int write_seed(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        return -1;
    }
    return 0;
}

/* Encodes m into a seed file of its own and appends it to the running stream. */
static int emit(const char *dir, const char *name, const gang_msg *m)
{
    size_t len = 0;
    int rc = gang_wire_encode(m, stream + stream_len, sizeof stream - stream_len, &len);

    if (rc != 0) {
        fprintf(stderr, "gen-corpus: cannot encode %s: %d\n", name, rc);
        return -1;
    }
    if (write_seed(dir, name, stream + stream_len, len) != 0)
        return -1;
    if (len + GANG_WIRE_TAG_SIZE > sizeof tagged - tagged_len) {
        fprintf(stderr, "gen-corpus: tagged stream full at %s\n", name);
        return -1;
    }
    memcpy(tagged + tagged_len, stream + stream_len, len);
    fake_tag(tagged_seq++, tagged + tagged_len, len, tagged + tagged_len + len);
    tagged_len += len + GANG_WIRE_TAG_SIZE;
    stream_len += len;
    return 0;
}

int main(int argc, char **argv)
{
    static gang_msg m;
    int bad = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: gen-corpus OUTDIR\n");
        return 2;
    }

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_CHALLENGE;
    memset(m.u.challenge.nonce, 0xA5, GANG_NONCE_SIZE);
    m.u.challenge.auth_required = 1;
    bad |= emit(argv[1], "challenge", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_JOIN;
    m.generation = 3;
    strcpy(m.u.join.job, "ganglion");
    m.u.join.node_index = 1;
    m.u.join.nnodes = 2;
    m.u.join.nproc_per_node = 4;
    m.u.join.tp = 4;
    m.u.join.pp = 2;
    m.u.join.generation_seen = 3;
    strcpy(m.u.join.host, "ganglion-1.ganglion.default.svc.cluster.local");
    bad |= emit(argv[1], "join", &m);
    memset(m.u.join.job, 'j', GANG_JOB_MAX - 1);
    memset(m.u.join.host, 'h', GANG_HOST_MAX - 1);
    bad |= emit(argv[1], "join-max-strings", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_WELCOME;
    m.generation = 4;
    m.u.welcome.heartbeat_interval_ms = 500;
    m.u.welcome.heartbeat_timeout_ms = 3000;
    m.u.welcome.generation = 4;
    bad |= emit(argv[1], "welcome", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_REJECT;
    m.u.reject.code = GANG_EDUPLICATE;
    strcpy(m.u.reject.reason, "node_index 1 is already a member");
    bad |= emit(argv[1], "reject", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_BLOB_REQUEST;
    m.generation = 5;
    m.u.blob.world_size = 8;
    bad |= emit(argv[1], "blob-request", &m);
    m.type = GANG_MSG_BLOB;
    m.u.blob.len = 128;
    memset(m.u.blob.data, 0x42, m.u.blob.len);
    bad |= emit(argv[1], "blob", &m);
    m.type = GANG_MSG_START;
    m.u.blob.len = GANG_BLOB_MAX;
    memset(m.u.blob.data, 0x17, m.u.blob.len);
    bad |= emit(argv[1], "start-max-blob", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_READY;
    m.generation = 5;
    m.u.ready.node_index = 1;
    bad |= emit(argv[1], "ready", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_HEARTBEAT;
    m.generation = 5;
    m.u.heartbeat.node_index = UINT32_MAX;
    m.u.heartbeat.state = GANG_STATE_SERVING;
    bad |= emit(argv[1], "heartbeat-coordinator", &m);
    m.u.heartbeat.node_index = 1;
    m.u.heartbeat.state = 0;
    m.u.heartbeat.nranks = GANG_MAX_LOCAL_RANKS;
    for (uint32_t i = 0; i < GANG_MAX_LOCAL_RANKS; i++) {
        m.u.heartbeat.rank_state[i] = (uint8_t)(i % 6);
        m.u.heartbeat.rank_age_ms[i] = i * 10;
    }
    bad |= emit(argv[1], "heartbeat-max-ranks", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_ABORT;
    m.generation = 5;
    m.u.abort.rank = -1;
    m.u.abort.code = GANG_EPEER;
    strcpy(m.u.abort.reason, "worker 3 exited with signal 9");
    bad |= emit(argv[1], "abort", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_REJOIN;
    m.generation = 5;
    m.u.rejoin.node_index = 1;
    bad |= emit(argv[1], "rejoin", &m);

    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_GIVE_UP;
    m.generation = 6;
    memset(m.u.give_up.reason, 'g', GANG_REASON_MAX - 1);
    bad |= emit(argv[1], "give-up-max-reason", &m);

    /* API frames carrying request messages, as a member's forwarding sends them: a kind
     * byte and the message (a SUBMIT with stops and ids, a DONE with a reason). */
    {
        static gang_req_msg r;
        const uint32_t kinds[] = {GANG_REQ_SUBMIT, GANG_REQ_DONE, GANG_REQ_CANCEL};
        const char *names[] = {"api-submit", "api-done", "api-cancel"};
        for (int k = 0; k < 3; k++) {
            gang_codec c;
            size_t len = 0;
            uint32_t kind = kinds[k];
            memset(&r, 0, sizeof r);
            r.id = 77;
            r.n_prompt = r.n_ids = 40;
            r.max_tokens = 8;
            r.sampling.top_p = 1.0f;
            r.sampling.n_stop = 2;
            r.sampling.stop[1] = 3;
            r.code = -22;
            strcpy(r.finish, "stop");
            strcpy(r.reason, "refused");
            memset(&m, 0, sizeof m);
            m.type = GANG_MSG_API;
            m.generation = 7;
            gang_codec_encoder(&c, m.u.api.data, sizeof m.u.api.data);
            gang_codec_uint(&c, &kind, 1, 0xFF);
            gang_req_codec(&c, kind, &r);
            if (gang_codec_finish(&c, &len) != 0)
                return 1;
            m.u.api.len = (uint32_t)len;
            bad |= emit(argv[1], names[k], &m);
        }
    }

    /* Every frame above back to back, and the same stream cut mid-frame. */
    bad |= write_seed(argv[1], "stream-all", stream, stream_len);
    bad |= write_seed(argv[1], "stream-cut", stream, stream_len / 3);
    bad |= write_seed(argv[1], "tagged-stream-all", tagged, tagged_len);
    bad |= write_seed(argv[1], "tagged-stream-cut", tagged, tagged_len / 3);
    return bad ? 1 : 0;
}
