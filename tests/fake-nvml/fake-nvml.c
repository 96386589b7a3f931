/*
 * A fake NVML for the tests: a shared library with the entry points gpu/nvml-api.h
 * declares, loaded by ganglion through the same dlopen path as the real one
 * (--nvml-library). It describes devices, topology and faults from a text file named by
 * the environment variable FAKE_NVML_CONFIG, read again whenever it changes, so a test
 * can inject a fault into running workers by appending a line. Without the variable (or
 * the file) nvmlInit_v2 answers NVML_ERROR_DRIVER_NOT_LOADED, like a node without a driver.
 *
 * Lines ('#' starts a comment; times are Unix milliseconds, 0 = always):
 *   gpu I [name=S] [uuid=S] [bus=S] [numa=N] [cpus=LIST] [util=P] [temp=C] [power=MW]
 *   nvlink A B                      A and B are NVLink peers
 *   xid GPU CODE AT                 an Xid event at AT, delivered once to every process
 *                                   that registered the GPU and started before AT
 *   lost GPU FROM [UNTIL]           every query of GPU, its handle included, answers
 *                                   NVML_ERROR_GPU_IS_LOST
 *   dbe GPU COUNT FROM [UNTIL]      volatile double-bit ECC count
 *   sbe GPU COUNT FROM [UNTIL]      volatile single-bit ECC count
 *   retired GPU FROM [UNTIL]        pages pending retirement
 *   remap GPU FROM [UNTIL]          rows pending remapping
 *   throttle GPU MASK FROM [UNTIL]  clock throttle reasons (hex or decimal)
 * Test code: it reads its environment directly and keeps everything in static storage.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include "nvml-api.h"

/*
 * The entry points this library exports, the names gpu/nvml.c looks up with dlsym; each
 * has the type of its pointer in gpu/nvml-api.h (the table at the end of this file checks
 * that at compile time).
 */
nvml_ret nvmlInit_v2(void);
nvml_ret nvmlShutdown(void);
const char *nvmlErrorString(nvml_ret r);
nvml_ret nvmlDeviceGetCount_v2(unsigned int *count);
nvml_ret nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml_device *dev);
nvml_ret nvmlDeviceGetName(nvml_device dev, char *buf, unsigned int len);
nvml_ret nvmlDeviceGetUUID(nvml_device dev, char *buf, unsigned int len);
nvml_ret nvmlDeviceGetPciInfo_v3(nvml_device dev, nvml_pci_info *pci);
nvml_ret nvmlDeviceGetUtilizationRates(nvml_device dev, nvml_utilization *u);
nvml_ret nvmlDeviceGetMemoryInfo(nvml_device dev, nvml_memory *m);
nvml_ret nvmlDeviceGetTemperature(nvml_device dev, int sensor, unsigned int *c);
nvml_ret nvmlDeviceGetPowerUsage(nvml_device dev, unsigned int *mw);
nvml_ret nvmlDeviceGetClockInfo(nvml_device dev, int clock, unsigned int *mhz);
nvml_ret nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device dev, unsigned long long *r);
nvml_ret nvmlDeviceGetTotalEccErrors(nvml_device dev, int type, int counter,
                                     unsigned long long *count);
nvml_ret nvmlDeviceGetRetiredPagesPendingStatus(nvml_device dev, int *state);
nvml_ret nvmlDeviceGetRemappedRows(nvml_device dev, unsigned int *corr, unsigned int *unc,
                                   unsigned int *pending, unsigned int *failed);
nvml_ret nvmlDeviceGetCpuAffinity(nvml_device dev, unsigned int n, unsigned long *set);
nvml_ret nvmlDeviceGetMemoryAffinity(nvml_device dev, unsigned int n, unsigned long *set,
                                     int scope);
nvml_ret nvmlDeviceGetP2PStatus(nvml_device a, nvml_device b, int caps, int *status);
nvml_ret nvmlEventSetCreate(nvml_event_set *set);
nvml_ret nvmlEventSetFree(nvml_event_set set);
nvml_ret nvmlDeviceRegisterEvents(nvml_device dev, unsigned long long types, nvml_event_set set);
nvml_ret nvmlEventSetWait_v2(nvml_event_set set, nvml_event_data *data, unsigned int timeout_ms);

#define FAKE_MAX_GPUS 16
#define FAKE_MAX_RULES 256

struct nvml_device_st {
    unsigned index;
};

typedef struct fake_gpu {
    char name[64], uuid[64], bus[32];
    int numa;
    char cpus[128];
    unsigned util, temp, power;
} fake_gpu;

typedef struct fake_rule {
    char kind[16];
    unsigned gpu;
    long long value;
    long long from, until; /* until 0 = forever */
} fake_rule;

static struct {
    pthread_mutex_t mu;
    int init;
    long long init_ms;
    struct stat st; /* of the last read, to notice changes */
    unsigned ngpus;
    fake_gpu gpu[FAKE_MAX_GPUS];
    unsigned char nvlink[FAKE_MAX_GPUS][FAKE_MAX_GPUS];
    unsigned nrules;
    fake_rule rule[FAKE_MAX_RULES];
    unsigned char delivered[FAKE_MAX_RULES];
    struct nvml_device_st dev[FAKE_MAX_GPUS];
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct nvml_event_set_st {
    unsigned char registered[FAKE_MAX_GPUS];
};

static long long now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void parse_gpu(char *rest)
{
    char *tok = strtok(rest, " \t\n");
    if (tok == NULL)
        return;
    unsigned i = (unsigned)atoi(tok);
    if (i >= FAKE_MAX_GPUS)
        return;
    fake_gpu *g = &fk.gpu[i];
    snprintf(g->name, sizeof(g->name), "Fake H200");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-fake-%u", i);
    snprintf(g->bus, sizeof(g->bus), "00000000:%02X:00.0", 0x10 + i);
    g->numa = -1;
    g->cpus[0] = '\0';
    g->util = 0;
    g->temp = 40;
    g->power = 100000;
    while ((tok = strtok(NULL, " \t\n")) != NULL) {
        char *eq = strchr(tok, '=');
        if (eq == NULL)
            continue;
        *eq++ = '\0';
        if (strcmp(tok, "name") == 0)
            snprintf(g->name, sizeof(g->name), "%s", eq);
        else if (strcmp(tok, "uuid") == 0)
            snprintf(g->uuid, sizeof(g->uuid), "%s", eq);
        else if (strcmp(tok, "bus") == 0)
            snprintf(g->bus, sizeof(g->bus), "%s", eq);
        else if (strcmp(tok, "numa") == 0)
            g->numa = atoi(eq);
        else if (strcmp(tok, "cpus") == 0)
            snprintf(g->cpus, sizeof(g->cpus), "%s", eq);
        else if (strcmp(tok, "util") == 0)
            g->util = (unsigned)atoi(eq);
        else if (strcmp(tok, "temp") == 0)
            g->temp = (unsigned)atoi(eq);
        else if (strcmp(tok, "power") == 0)
            g->power = (unsigned)atoi(eq);
    }
    if (i + 1 > fk.ngpus)
        fk.ngpus = i + 1;
}

/* One rule line: "KIND GPU [VALUE] FROM [UNTIL]" (xid: "xid GPU CODE AT"). */
static void parse_rule(const char *kind, const char *rest)
{
    if (fk.nrules >= FAKE_MAX_RULES)
        return;
    fake_rule *r = &fk.rule[fk.nrules];
    memset(r, 0, sizeof(*r));
    snprintf(r->kind, sizeof(r->kind), "%s", kind);
    int valued = strcmp(kind, "xid") == 0 || strcmp(kind, "dbe") == 0 || strcmp(kind, "sbe") == 0 ||
                 strcmp(kind, "throttle") == 0;
    int n = valued ? sscanf(rest, "%u %lli %lld %lld", &r->gpu, &r->value, &r->from, &r->until)
                   : sscanf(rest, "%u %lld %lld", &r->gpu, &r->from, &r->until);
    if (n < (valued ? 3 : 2) || r->gpu >= FAKE_MAX_GPUS)
        return;
    fk.nrules++;
}

/* Reads the file again when it changed since the last read. Caller holds fk.mu. */
static int reload(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat st;
    if (path == NULL || stat(path, &st) != 0)
        return -1;
    if (st.st_size == fk.st.st_size && st.st_mtim.tv_sec == fk.st.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == fk.st.st_mtim.tv_nsec && fk.ngpus > 0)
        return 0;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    fk.st = st;
    fk.ngpus = 0;
    fk.nrules = 0; /* rules keep their line order, so delivered[] stays aligned */
    memset(fk.nvlink, 0, sizeof(fk.nvlink));
    char line[512], kind[16];
    int off;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (line[0] == '#' || sscanf(line, "%15s %n", kind, &off) < 1)
            continue;
        if (strcmp(kind, "gpu") == 0) {
            parse_gpu(line + off);
        } else if (strcmp(kind, "nvlink") == 0) {
            unsigned a, b;
            if (sscanf(line + off, "%u %u", &a, &b) == 2 && a < FAKE_MAX_GPUS && b < FAKE_MAX_GPUS)
                fk.nvlink[a][b] = fk.nvlink[b][a] = 1;
        } else {
            parse_rule(kind, line + off);
        }
    }
    fclose(f);
    return 0;
}

/* The value of the active rule of kind for gpu (its value, or 1), 0 when none is active. */
static unsigned long long active(const char *kind, unsigned gpu)
{
    long long t = now_ms();
    unsigned long long v = 0;
    for (unsigned i = 0; i < fk.nrules; i++) {
        const fake_rule *r = &fk.rule[i];
        if (r->gpu == gpu && strcmp(r->kind, kind) == 0 && t >= r->from &&
            (r->until == 0 || t < r->until))
            v = r->value ? (unsigned long long)r->value : 1;
    }
    return v;
}

/* Common prologue of a device query: the index of dev, or an NVML error. */
static nvml_ret dev_check(nvml_device dev, unsigned *idx)
{
    pthread_mutex_lock(&fk.mu);
    reload();
    if (!fk.init || dev == NULL || dev->index >= fk.ngpus) {
        pthread_mutex_unlock(&fk.mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *idx = dev->index;
    if (active("lost", *idx)) {
        pthread_mutex_unlock(&fk.mu);
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS; /* with fk.mu held */
}

nvml_ret nvmlInit_v2(void)
{
    pthread_mutex_lock(&fk.mu);
    int ok = reload() == 0;
    if (ok) {
        fk.init = 1;
        fk.init_ms = now_ms();
        for (unsigned i = 0; i < FAKE_MAX_GPUS; i++)
            fk.dev[i].index = i;
    }
    pthread_mutex_unlock(&fk.mu);
    return ok ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

nvml_ret nvmlShutdown(void)
{
    pthread_mutex_lock(&fk.mu);
    fk.init = 0;
    pthread_mutex_unlock(&fk.mu);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvml_ret r)
{
    switch (r) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    default:
        return "fake NVML error";
    }
}

nvml_ret nvmlDeviceGetCount_v2(unsigned int *count)
{
    pthread_mutex_lock(&fk.mu);
    reload();
    *count = fk.ngpus;
    pthread_mutex_unlock(&fk.mu);
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvml_device *dev)
{
    if (index >= FAKE_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&fk.mu);
    reload();
    int lost = active("lost", index) != 0;
    pthread_mutex_unlock(&fk.mu);
    *dev = &fk.dev[index];
    return lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

#define QUERY_BEGIN(dev)                                                                           \
    unsigned idx;                                                                                  \
    nvml_ret rc_ = dev_check(dev, &idx);                                                           \
    if (rc_ != NVML_SUCCESS)                                                                       \
        return rc_;                                                                                \
    const fake_gpu *g = &fk.gpu[idx];                                                              \
    (void)g
#define QUERY_END() pthread_mutex_unlock(&fk.mu)

nvml_ret nvmlDeviceGetName(nvml_device dev, char *buf, unsigned int len)
{
    QUERY_BEGIN(dev);
    snprintf(buf, len, "%s", g->name);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetUUID(nvml_device dev, char *buf, unsigned int len)
{
    QUERY_BEGIN(dev);
    snprintf(buf, len, "%s", g->uuid);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetPciInfo_v3(nvml_device dev, nvml_pci_info *pci)
{
    QUERY_BEGIN(dev);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->bus_id, sizeof(pci->bus_id), "%s", g->bus);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetUtilizationRates(nvml_device dev, nvml_utilization *u)
{
    QUERY_BEGIN(dev);
    u->gpu = g->util;
    u->memory = g->util / 2;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetMemoryInfo(nvml_device dev, nvml_memory *m)
{
    QUERY_BEGIN(dev);
    m->total = 143771ull << 20;
    m->used = 1024ull << 20;
    m->free = m->total - m->used;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetTemperature(nvml_device dev, int sensor, unsigned int *c)
{
    QUERY_BEGIN(dev);
    (void)sensor;
    *c = g->temp;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetPowerUsage(nvml_device dev, unsigned int *mw)
{
    QUERY_BEGIN(dev);
    *mw = g->power;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetClockInfo(nvml_device dev, int clock, unsigned int *mhz)
{
    QUERY_BEGIN(dev);
    *mhz = clock == NVML_CLOCK_SM ? 1980 : 3201;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device dev, unsigned long long *r)
{
    QUERY_BEGIN(dev);
    *r = active("throttle", idx);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetTotalEccErrors(nvml_device dev, int type, int counter,
                                     unsigned long long *count)
{
    QUERY_BEGIN(dev);
    (void)counter;
    *count = active(type == NVML_MEMORY_ERROR_UNCORRECTED ? "dbe" : "sbe", idx);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetRetiredPagesPendingStatus(nvml_device dev, int *state)
{
    QUERY_BEGIN(dev);
    *state = active("retired", idx) != 0;
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetRemappedRows(nvml_device dev, unsigned int *corr, unsigned int *unc,
                                   unsigned int *pending, unsigned int *failed)
{
    QUERY_BEGIN(dev);
    *corr = *unc = *failed = 0;
    *pending = active("remap", idx) != 0;
    QUERY_END();
    return NVML_SUCCESS;
}

/* Sets the bits of a CPU list ("0-3,8") in an unsigned-long mask of n words. */
static void list_to_mask(const char *list, unsigned n, unsigned long *set)
{
    const unsigned bits = 8 * sizeof(unsigned long);
    memset(set, 0, n * sizeof(*set));
    while (*list) {
        char *end;
        unsigned long a = strtoul(list, &end, 10), b = a;
        if (end == list)
            return;
        if (*end == '-')
            b = strtoul(end + 1, &end, 10);
        for (unsigned long i = a; i <= b && i / bits < n; i++)
            set[i / bits] |= 1ul << (i % bits);
        list = *end == ',' ? end + 1 : end;
        if (*end != ',')
            break;
    }
}

nvml_ret nvmlDeviceGetCpuAffinity(nvml_device dev, unsigned int n, unsigned long *set)
{
    QUERY_BEGIN(dev);
    list_to_mask(g->cpus, n, set);
    QUERY_END();
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetMemoryAffinity(nvml_device dev, unsigned int n, unsigned long *set, int scope)
{
    QUERY_BEGIN(dev);
    (void)scope;
    memset(set, 0, n * sizeof(*set));
    int numa = g->numa;
    QUERY_END();
    if (numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if ((unsigned)numa < n * 8 * sizeof(unsigned long))
        set[numa / (8 * sizeof(unsigned long))] |= 1ul << (numa % (8 * sizeof(unsigned long)));
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceGetP2PStatus(nvml_device a, nvml_device b, int caps, int *status)
{
    unsigned ia;
    nvml_ret rc = dev_check(a, &ia);
    if (rc != NVML_SUCCESS)
        return rc;
    int linked = b != NULL && b->index < fk.ngpus && fk.nvlink[ia][b->index];
    pthread_mutex_unlock(&fk.mu);
    *status = caps == NVML_P2P_CAPS_INDEX_NVLINK && linked ? NVML_P2P_STATUS_OK : 5;
    return NVML_SUCCESS;
}

nvml_ret nvmlEventSetCreate(nvml_event_set *set)
{
    *set = calloc(1, sizeof(**set));
    return *set != NULL ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvml_ret nvmlEventSetFree(nvml_event_set set)
{
    free(set);
    return NVML_SUCCESS;
}

nvml_ret nvmlDeviceRegisterEvents(nvml_device dev, unsigned long long types, nvml_event_set set)
{
    QUERY_BEGIN(dev);
    if (types & NVML_EVENT_TYPE_XID_CRITICAL_ERROR)
        set->registered[idx] = 1;
    QUERY_END();
    return NVML_SUCCESS;
}

/* The first undelivered Xid for a GPU of set that is due; marks it delivered. */
static int take_xid(nvml_event_set set, nvml_event_data *data)
{
    long long t = now_ms();
    for (unsigned i = 0; i < fk.nrules; i++) {
        const fake_rule *r = &fk.rule[i];
        if (strcmp(r->kind, "xid") != 0 || fk.delivered[i] || !set->registered[r->gpu] ||
            r->from > t)
            continue;
        fk.delivered[i] = 1;
        if (r->from < fk.init_ms)
            continue; /* before this process looked: not its event */
        memset(data, 0, sizeof(*data));
        data->device = &fk.dev[r->gpu];
        data->event_type = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
        data->event_data = (unsigned long long)r->value;
        return 1;
    }
    return 0;
}

nvml_ret nvmlEventSetWait_v2(nvml_event_set set, nvml_event_data *data, unsigned int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        pthread_mutex_lock(&fk.mu);
        reload();
        int got = take_xid(set, data);
        pthread_mutex_unlock(&fk.mu);
        if (got)
            return NVML_SUCCESS;
        if (now_ms() >= deadline)
            return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Each entry point against its pointer type in gpu/nvml-api.h: a signature that drifts from
 * what gpu/nvml.c calls through fails to compile here. */
#define FAKE_FIELD(field, type, symbol) type field;
#define FAKE_ENTRY(field, type, symbol) .field = symbol,
static const struct {
    GANG_NVML_ENTRIES(FAKE_FIELD)
} fake_entry_types __attribute__((used)) = {GANG_NVML_ENTRIES(FAKE_ENTRY)};
