/*
 * GPU health: which conditions are fatal, and the watch thread of one GPU.
 *
 * Two kinds of fatal condition:
 *   - events: an Xid of the fatal list (gang_gpu_xid_is_fatal) delivered by
 *     nvmlEventSetWait_v2. An event is latched until its owner acknowledges it (it made
 *     the rank fail once); Xid codes outside the list are counted and logged only;
 *   - levels, read from every sample: the device no longer answers, volatile double-bit
 *     ECC errors (> 0 since the driver loaded: the memory is corrupt until a reset), pages
 *     pending retirement, rows pending remapping. They hold as long as the sample says
 *     so, which after a real fault is until the GPU is reset: that is what makes a fault
 *     "persist across a restart" for the agent.
 * Warnings (clock throttling for thermal or power reasons) are logged when they change and
 * exported in the sample; they never fail a rank.
 *
 * The thread waits on the event set with a timeout of at most WATCH_SLICE_MS, so an Xid
 * is seen at once and a stop is honoured within that slice plus one NVML call.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ganglion/common.h"
#include "ganglion/gpu.h"
#include "gpu-internal.h"

#define WATCH_SLICE_MS 100

/* The fatal Xid list (docs/operations.md, "GPU health"), with a short text for each. */
static const struct {
    uint32_t code;
    int fatal;
    const char *text;
} xid_table[] = {
    {13, 0, "graphics engine exception"},
    {31, 0, "GPU memory page fault"},
    {43, 0, "GPU stopped processing"},
    {45, 0, "preemptive cleanup"},
    {48, 1, "double-bit ECC error"},
    {61, 0, "internal micro-controller breakpoint"},
    {62, 0, "internal micro-controller halt"},
    {63, 1, "ECC page retirement or row remapping recorded"},
    {64, 1, "ECC page retirement or row remapping failed"},
    {74, 1, "NVLink error"},
    {79, 1, "GPU has fallen off the bus"},
    {92, 0, "high single-bit ECC error rate"},
    {94, 1, "contained ECC error"},
    {95, 1, "uncontained ECC error"},
    {119, 1, "GSP RPC timeout"},
    {120, 1, "GSP error"},
    {140, 1, "unrecovered ECC error"},
};

int gang_gpu_xid_is_fatal(uint32_t xid)
{
    for (size_t i = 0; i < sizeof(xid_table) / sizeof(xid_table[0]); i++)
        if (xid_table[i].code == xid)
            return xid_table[i].fatal;
    return 0;
}

const char *gang_gpu_xid_text(uint32_t xid)
{
    for (size_t i = 0; i < sizeof(xid_table) / sizeof(xid_table[0]); i++)
        if (xid_table[i].code == xid)
            return xid_table[i].text;
    return "see NVIDIA's Xid catalog";
}

int gang_gpu_sample_fatal(const gang_gpu_sample *s, char *reason, size_t cap)
{
    if (s->lost)
        snprintf(reason, cap, "GPU %u (%s) does not answer: lost or fallen off the bus", s->gpu,
                 s->uuid[0] ? s->uuid : "uuid unknown");
    else if (s->ecc_dbe_volatile > 0)
        snprintf(reason, cap, "GPU %u (%s): %llu double-bit ECC error(s) since the driver loaded",
                 s->gpu, s->uuid, (unsigned long long)s->ecc_dbe_volatile);
    else if (s->retired_pending)
        snprintf(reason, cap, "GPU %u (%s): pages pending retirement (reset the GPU)", s->gpu,
                 s->uuid);
    else if (s->remap_pending)
        snprintf(reason, cap, "GPU %u (%s): rows pending remapping (reset the GPU)", s->gpu,
                 s->uuid);
    else
        return 0;
    return 1;
}

struct gang_gpu_watch {
    gang_gpu_watch_config cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;                         /* under mu */
    nvml_event_set set;               /* NULL: the GPU gives no Xid events, sample only */
    gang_gpu_sample cur;              /* under mu: the latest sample, Xid counts, verdict */
    char latched[GANG_GPU_FAULT_MAX]; /* under mu: an unacknowledged fatal Xid, "" none */
    char level[GANG_GPU_FAULT_MAX];   /* under mu: the level condition of the last sample */
};

/* Counts one Xid of code in s's slots (the last slot absorbs codes beyond the table). */
static void xid_count(gang_gpu_sample *s, uint32_t code)
{
    uint32_t i;
    for (i = 0; i < s->n_xid; i++)
        if (s->xid[i].code == code)
            break;
    if (i == s->n_xid) {
        if (s->n_xid == GANG_GPU_XID_SLOTS)
            i = GANG_GPU_XID_SLOTS - 1;
        else
            s->xid[s->n_xid++].code = code;
    }
    s->xid[i].count++;
    s->last_xid = code;
}

/* Fills the verdict fields of w->cur from the latched Xid and the level condition. */
static void watch_verdict(gang_gpu_watch *w)
{
    w->cur.fatal = w->latched[0] != '\0' || w->level[0] != '\0';
    gang_strlcpy(w->cur.fault, w->latched[0] ? w->latched : w->level, sizeof(w->cur.fault));
    w->cur.warning = (w->cur.throttle_reasons & GANG_GPU_THROTTLE_WARN_MASK) != 0;
}

static void watch_on_xid(gang_gpu_watch *w, uint32_t code)
{
    int fatal = gang_gpu_xid_is_fatal(code);
    pthread_mutex_lock(&w->mu);
    xid_count(&w->cur, code);
    if (fatal) {
        snprintf(w->latched, sizeof(w->latched), "GPU %u (%s): Xid %u (%s)", w->cfg.gpu,
                 w->cur.uuid[0] ? w->cur.uuid : "uuid unknown", code, gang_gpu_xid_text(code));
        w->cur.fatal_total++;
    }
    watch_verdict(w);
    pthread_mutex_unlock(&w->mu);
    if (fatal) {
        gang_error("GPU health: GPU %u: fatal Xid %u (%s)", w->cfg.gpu, code,
                   gang_gpu_xid_text(code));
        w->cfg.on_fault(w->cfg.ctx);
    } else {
        gang_warn("GPU health: GPU %u: Xid %u (%s), not fatal", w->cfg.gpu, code,
                  gang_gpu_xid_text(code));
    }
}

/* Takes a sample and updates the verdict; notifies a level condition that is new. */
static void watch_sample(gang_gpu_watch *w)
{
    gang_gpu_sample s;
    char level[GANG_GPU_FAULT_MAX] = "";
    if (gang_nvml_sample(w->cfg.nvml, w->cfg.gpu, &s) == GANG_EINVAL) {
        /* The GPU was there when the watch started: one that left the device count fell
         * off the bus. */
        memset(&s, 0, sizeof(s));
        s.gpu = w->cfg.gpu;
        s.valid = 1;
        s.lost = 1;
    }
    pthread_mutex_lock(&w->mu);
    if (s.lost && w->cur.uuid[0]) { /* keep the identity of a GPU that stopped answering */
        memcpy(s.uuid, w->cur.uuid, sizeof(s.uuid));
        memcpy(s.name, w->cur.name, sizeof(s.name));
        memcpy(s.bus_id, w->cur.bus_id, sizeof(s.bus_id));
    }
    gang_gpu_sample_fatal(&s, level, sizeof(level));
    int fresh = level[0] != '\0' && w->level[0] == '\0';
    uint64_t was_warn = w->cur.throttle_reasons & GANG_GPU_THROTTLE_WARN_MASK;
    uint64_t now_warn = s.throttle_reasons & GANG_GPU_THROTTLE_WARN_MASK;
    s.last_xid = w->cur.last_xid;
    s.n_xid = w->cur.n_xid;
    memcpy(s.xid, w->cur.xid, sizeof(s.xid));
    s.fatal_total = w->cur.fatal_total + (fresh ? 1 : 0);
    w->cur = s;
    gang_strlcpy(w->level, level, sizeof(w->level));
    watch_verdict(w);
    pthread_mutex_unlock(&w->mu);
    if (was_warn != now_warn)
        gang_warn("GPU health: GPU %u throttle reasons 0x%llx (warning, not fatal)", w->cfg.gpu,
                  (unsigned long long)s.throttle_reasons);
    if (fresh) {
        gang_error("GPU health: %s", level);
        w->cfg.on_fault(w->cfg.ctx);
    }
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int watch_stopping(gang_gpu_watch *w)
{
    pthread_mutex_lock(&w->mu);
    int s = w->stop;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* The thread: Xid events as they come, a sample every interval, until stopped. */
static void *watch_main(void *arg)
{
    gang_gpu_watch *w = arg;
    gang_nvml *n = w->cfg.nvml;
    uint64_t next = gang_now_ms();
    while (!watch_stopping(w)) {
        uint64_t now = gang_now_ms();
        if (now >= next) {
            watch_sample(w);
            next = now + w->cfg.interval_ms;
            continue;
        }
        uint64_t slice = next - now < WATCH_SLICE_MS ? next - now : WATCH_SLICE_MS;
        if (w->set == NULL) {
            sleep_ms(slice);
            continue;
        }
        nvml_event_data ev;
        memset(&ev, 0, sizeof(ev));
        nvml_ret r = n->wait(w->set, &ev, (unsigned)slice);
        if (r == NVML_SUCCESS && (ev.event_type & NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
            watch_on_xid(w, (uint32_t)ev.event_data);
        else if (r != NVML_SUCCESS && r != NVML_ERROR_TIMEOUT)
            sleep_ms(slice); /* a lost GPU answers at once: do not spin */
    }
    return NULL;
}

/* Creates the event set and registers the GPU's Xid events; w->set stays NULL otherwise. */
static void watch_events(gang_gpu_watch *w)
{
    gang_nvml *n = w->cfg.nvml;
    nvml_device dev;
    if (n->set_create == NULL || n->reg == NULL || n->wait == NULL || n->set_free == NULL ||
        gang__nvml_device(n, w->cfg.gpu, &dev) != 0)
        return;
    if (n->set_create(&w->set) != NVML_SUCCESS) {
        w->set = NULL;
        return;
    }
    nvml_ret r = n->reg(dev, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, w->set);
    if (r != NVML_SUCCESS) {
        gang_warn("GPU health: GPU %u gives no Xid events (%s): sampling only", w->cfg.gpu,
                  gang__nvml_error(n, r));
        n->set_free(w->set);
        w->set = NULL;
    }
}

int gang_gpu_watch_start(const gang_gpu_watch_config *cfg, gang_gpu_watch **out)
{
    *out = NULL;
    if (cfg->nvml == NULL || cfg->interval_ms == 0 || cfg->on_fault == NULL)
        return GANG_EINVAL;
    gang_gpu_watch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return GANG_ENOMEM;
    w->cfg = *cfg;
    w->cur.gpu = cfg->gpu;
    pthread_mutex_init(&w->mu, NULL);
    watch_events(w);
    int rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0) {
        if (w->set != NULL)
            cfg->nvml->set_free(w->set);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return gang_err_from_errno(rc);
    }
    *out = w;
    return 0;
}

void gang_gpu_watch_stop(gang_gpu_watch *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    if (w->set != NULL)
        w->cfg.nvml->set_free(w->set);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void gang_gpu_watch_get(gang_gpu_watch *w, gang_gpu_sample *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->cur;
    pthread_mutex_unlock(&w->mu);
}

int gang_gpu_watch_fault(gang_gpu_watch *w, int ack, char *reason, size_t cap)
{
    pthread_mutex_lock(&w->mu);
    int fatal = w->cur.fatal;
    if (fatal)
        gang_strlcpy(reason, w->cur.fault, cap);
    if (ack) {
        w->latched[0] = '\0';
        watch_verdict(w);
    }
    pthread_mutex_unlock(&w->mu);
    return fatal;
}

int gang_gpu_fault_kind(const char *reason, int32_t *gpu, char *kind, size_t cap)
{
    const char *p = strstr(reason, "GPU ");
    unsigned g, x;
    *gpu = -1;
    while (p != NULL && sscanf(p, "GPU %u", &g) != 1)
        p = strstr(p + 4, "GPU ");
    if (p == NULL) {
        gang_strlcpy(kind, "other", cap);
        return 0;
    }
    *gpu = (int32_t)g;
    const char *xid = strstr(p, "Xid ");
    if (xid != NULL && sscanf(xid, "Xid %u", &x) == 1)
        snprintf(kind, cap, "xid_%u", x);
    else if (strstr(p, "does not answer") != NULL)
        gang_strlcpy(kind, "lost", cap);
    else if (strstr(p, "double-bit") != NULL)
        gang_strlcpy(kind, "dbe", cap);
    else if (strstr(p, "retirement") != NULL)
        gang_strlcpy(kind, "retired_pending", cap);
    else if (strstr(p, "remapping") != NULL)
        gang_strlcpy(kind, "remap_pending", cap);
    else
        gang_strlcpy(kind, "other", cap);
    return 1;
}
