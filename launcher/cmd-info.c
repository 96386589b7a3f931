/*
 * ganglion info [--labels]: GPU discovery.
 *
 * Default output, per visible GPU: name, UUID, PCI bus id, memory, compute capability,
 * multiprocessors and MIG mode, then the peer-access matrix with NVLink marked where NVML
 * reports it. --labels prints GPU Feature Discovery style node labels instead (one
 * "key=value" per line), for comparing a node with what the NVIDIA GPU Operator would
 * label it with, or for setting labels by hand where GFD does not run.
 *
 * Sources: the kernels module's device query (CUDA runtime, linked statically, which
 * loads the driver itself) for what CUDA sees, and NVML, opened with
 * dlopen("libnvidia-ml.so.1") so that the binary needs no NVML at link time, for MIG mode
 * and NVLink. Each source may be missing: without a driver or GPU the command says so and
 * exits 0 (a GPU-less node is a valid place to run the agent); without NVML the MIG and
 * NVLink fields read "unknown".
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"

#define INFO_MAX_GPUS 64
#define INFO_MAX_NVLINKS 18 /* NVML_NVLINK_MAX_LINKS of current drivers (Hopper: 18) */

/* ---------------------------------------------------------------------------------
 * NVML through dlopen: the few entry points used, with the types they need (from NVML's
 * documented ABI: handles are opaque pointers, results and states are ints).
 * --------------------------------------------------------------------------------- */
typedef struct nvml_device *nvml_dev;
typedef int (*nvml_void_fn)(void);
typedef int (*nvml_by_uuid_fn)(const char *uuid, nvml_dev *out);
typedef int (*nvml_mig_fn)(nvml_dev d, unsigned *current, unsigned *pending);
typedef int (*nvml_link_fn)(nvml_dev d, unsigned link, unsigned *active);
typedef int (*nvml_p2p_fn)(nvml_dev a, nvml_dev b, int caps_index, int *status);
typedef int (*nvml_int_fn)(int *value);
typedef int (*nvml_str_fn)(char *buf, unsigned len);

#define NVML_OK 0
#define NVML_NOT_SUPPORTED 3
#define NVML_P2P_CAPS_NVLINK 2
#define NVML_P2P_OK 0

typedef struct nvml_api {
    void *lib;
    nvml_void_fn shutdown;
    nvml_by_uuid_fn by_uuid;
    nvml_mig_fn mig_mode;
    nvml_link_fn link_state;
    nvml_p2p_fn p2p_status;
    nvml_int_fn cuda_driver_version;
    nvml_str_fn driver_version;
} nvml_api;

/* Loads and initialises NVML; 0 with api->lib set, or -1 (NVML absent: fields unknown). */
static int nvml_open(nvml_api *api)
{
    nvml_void_fn init;

    memset(api, 0, sizeof(*api));
    api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (api->lib == NULL)
        return -1;
    /* dlsym returns void *; the conversion to a function pointer is what POSIX promises. */
    *(void **)&init = dlsym(api->lib, "nvmlInit_v2");
    *(void **)&api->shutdown = dlsym(api->lib, "nvmlShutdown");
    *(void **)&api->by_uuid = dlsym(api->lib, "nvmlDeviceGetHandleByUUID");
    *(void **)&api->mig_mode = dlsym(api->lib, "nvmlDeviceGetMigMode");
    *(void **)&api->link_state = dlsym(api->lib, "nvmlDeviceGetNvLinkState");
    *(void **)&api->p2p_status = dlsym(api->lib, "nvmlDeviceGetP2PStatus");
    *(void **)&api->cuda_driver_version = dlsym(api->lib, "nvmlSystemGetCudaDriverVersion");
    *(void **)&api->driver_version = dlsym(api->lib, "nvmlSystemGetDriverVersion");
    if (init == NULL || api->shutdown == NULL || init() != NVML_OK) {
        dlclose(api->lib);
        memset(api, 0, sizeof(*api));
        return -1;
    }
    return 0;
}

static void nvml_close(nvml_api *api)
{
    if (api->lib == NULL)
        return;
    api->shutdown();
    dlclose(api->lib);
    memset(api, 0, sizeof(*api));
}

/* What NVML adds about one GPU; -1 means unknown. */
typedef struct gpu_extra {
    nvml_dev dev;    /* NULL when NVML does not know the GPU */
    int mig_capable; /* 1, 0 or -1 */
    int mig_enabled; /* current mode: 1, 0 or -1 */
    int nvlinks;     /* active NVLinks, -1 unknown */
} gpu_extra;

static void nvml_describe(const nvml_api *api, const gang_device_info *g, gpu_extra *x)
{
    unsigned cur = 0, pend = 0, active = 0;
    int rc;

    x->dev = NULL;
    x->mig_capable = x->mig_enabled = x->nvlinks = -1;
    if (api->lib == NULL || api->by_uuid == NULL || api->by_uuid(g->uuid, &x->dev) != NVML_OK) {
        x->dev = NULL;
        return;
    }
    if (api->mig_mode != NULL) {
        rc = api->mig_mode(x->dev, &cur, &pend);
        if (rc == NVML_OK) {
            x->mig_capable = 1;
            x->mig_enabled = cur == 1;
        } else if (rc == NVML_NOT_SUPPORTED) {
            x->mig_capable = 0;
            x->mig_enabled = 0;
        }
    }
    if (api->link_state != NULL) {
        x->nvlinks = 0;
        for (unsigned l = 0; l < INFO_MAX_NVLINKS; l++) {
            if (api->link_state(x->dev, l, &active) != NVML_OK)
                break; /* no such link, or NVLink not supported */
            if (active)
                x->nvlinks++;
        }
    }
}

/* 1 when NVML reports an NVLink path between the two GPUs, 0 when not, -1 unknown. */
static int nvml_nvlink_between(const nvml_api *api, const gpu_extra *a, const gpu_extra *b)
{
    int status = -1;

    if (api->p2p_status == NULL || a->dev == NULL || b->dev == NULL)
        return -1;
    if (api->p2p_status(a->dev, b->dev, NVML_P2P_CAPS_NVLINK, &status) != NVML_OK)
        return -1;
    return status == NVML_P2P_OK;
}

/* ---------------------------------------------------------------------------------
 * Output.
 * --------------------------------------------------------------------------------- */
static const char *tri(int v, const char *yes, const char *no)
{
    return v < 0 ? "unknown" : (v ? yes : no);
}

/* GFD's gpu.family from the compute capability. */
static const char *gpu_family(int major, int minor)
{
    switch (major) {
    case 7:
        return minor >= 5 ? "turing" : "volta";
    case 8:
        return minor >= 9 ? "ada-lovelace" : "ampere";
    case 9:
        return "hopper";
    case 10:
    case 12:
        return "blackwell";
    default:
        return "undefined";
    }
}

/* GFD's product label: the name with spaces replaced by dashes. */
static void product_label(const char *name, char *out, size_t cap)
{
    size_t i;

    for (i = 0; name[i] != '\0' && i + 1 < cap; i++)
        out[i] = name[i] == ' ' ? '-' : name[i];
    out[i] = '\0';
}

static void print_labels(const gang_device_info *g, const gpu_extra *x, int n, const nvml_api *api)
{
    char product[256];
    int mig_capable = 0, cuda_ver = 0;

    /* GFD labels describe the node's GPU model: the first GPU's, as GFD does on the
     * (usual) homogeneous node. */
    product_label(g[0].name, product, sizeof(product));
    for (int i = 0; i < n; i++)
        if (x[i].mig_capable == 1)
            mig_capable = 1;
    printf("nvidia.com/gpu.present=true\n");
    printf("nvidia.com/gpu.count=%d\n", n);
    printf("nvidia.com/gpu.product=%s\n", product);
    printf("nvidia.com/gpu.memory=%llu\n", (unsigned long long)(g[0].total_bytes >> 20));
    printf("nvidia.com/gpu.family=%s\n", gpu_family(g[0].cc_major, g[0].cc_minor));
    printf("nvidia.com/gpu.compute.major=%d\n", g[0].cc_major);
    printf("nvidia.com/gpu.compute.minor=%d\n", g[0].cc_minor);
    printf("nvidia.com/mig.capable=%s\n", mig_capable ? "true" : "false");
    if (x[0].mig_enabled >= 0)
        printf("nvidia.com/mig.enabled=%s\n", x[0].mig_enabled ? "true" : "false");
    if (api->cuda_driver_version != NULL && api->cuda_driver_version(&cuda_ver) == NVML_OK) {
        printf("nvidia.com/cuda.driver.major=%d\n", cuda_ver / 1000);
        printf("nvidia.com/cuda.driver.minor=%d\n", (cuda_ver % 1000) / 10);
    }
}

static void print_devices(const gang_device_info *g, const gpu_extra *x, int n, const nvml_api *api)
{
    char drv[96] = "";

    if (api->driver_version != NULL && api->driver_version(drv, sizeof(drv)) != NVML_OK)
        drv[0] = '\0';
    printf("%d GPU(s) visible%s%s%s\n", n, drv[0] ? " (driver " : "", drv, drv[0] ? ")" : "");
    if (api->lib == NULL)
        printf("NVML (libnvidia-ml.so.1) not available: MIG and NVLink are unknown\n");
    for (int i = 0; i < n; i++) {
        printf("GPU %d: %s\n", g[i].index, g[i].name);
        printf("  uuid:               %s\n", g[i].uuid);
        printf("  pci bus id:         %s\n", g[i].pci_bus_id);
        printf("  memory:             %llu MiB total, %llu MiB free\n",
               (unsigned long long)(g[i].total_bytes >> 20),
               (unsigned long long)(g[i].free_bytes >> 20));
        printf("  compute capability: %d.%d (%s), %d SMs\n", g[i].cc_major, g[i].cc_minor,
               gpu_family(g[i].cc_major, g[i].cc_minor), g[i].sm_count);
        printf("  mig:                %s, %s\n", tri(x[i].mig_capable, "capable", "not capable"),
               tri(x[i].mig_enabled, "enabled", "disabled"));
        if (x[i].nvlinks < 0)
            printf("  nvlink:             unknown\n");
        else
            printf("  nvlink:             %d active link(s)\n", x[i].nvlinks);
    }
    if (n < 2)
        return;
    /* Peer matrix: X self, NV peer access over NVLink, P peer access (PCIe), - none. */
    printf("peer access (X self, NV nvlink, P peer access, - none, ? unknown):\n      ");
    for (int j = 0; j < n; j++)
        printf(" GPU%-2d", j);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("GPU%-2d ", i);
        for (int j = 0; j < n; j++) {
            const char *cell;
            int peer = gang_kernels_device_can_access_peer(i, j);

            if (i == j)
                cell = "X";
            else if (peer < 0)
                cell = "?";
            else if (nvml_nvlink_between(api, &x[i], &x[j]) == 1)
                cell = "NV";
            else
                cell = peer ? "P" : "-";
            printf(" %-5s", cell);
        }
        printf("\n");
    }
}

/* info's command line: one flag. */
typedef struct info_opts {
    int labels, libraries;
    char model[GANG_PARAM_STR_MAX];
    int64_t tp, pp, ep;
    char nvml_library[GANG_PARAM_STR_MAX];
    int64_t nproc_per_node;
} info_opts;

static const gang_param_info info_items[] = {
    {.flag = "labels",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "print GPU Feature Discovery style node labels instead",
     .offset = offsetof(info_opts, labels)},
    {.flag = "libraries",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "instead: load NCCL and cuBLASLt as a GPU run would and print which files "
             "(exit 1 when one is missing)",
     .offset = offsetof(info_opts, libraries)},
    GANG_OPT_STR(info_opts, "model", model, "",
                 "instead of the GPUs: what this model (directory or .gguf) needs"),
    GANG_OPT_INT(info_opts, "tp", tp, "1", 1, 64,
                 "with --model: the TP ranks to size for; else the TP degree of the placement"),
    GANG_OPT_INT(info_opts, "pp", pp, "1", 1, 64, "with --model: the pipeline stages"),
    GANG_OPT_INT(info_opts, "ep", ep, "1", 1, 64,
                 "with --model: a MoE model's experts, 1 (cut by columns) or --tp (split)"),
    GANG_OPT_STR(info_opts, "nvml-library", nvml_library, "",
                 "NVML library for the topology (empty = libnvidia-ml.so.1)"),
    GANG_OPT_INT(info_opts, "nproc-per-node", nproc_per_node, "0", 0, 64,
                 "local ranks the placement maps (0 = one per GPU)"),
};
static const gang_opt_table info_table = GANG_OPT_TABLE(info_items);
static const gang_opt_cmd info_cmd = {
    "info", "[--labels] [--nproc-per-node N --tp T] | --model PATH [--tp N] [--pp M] | --libraries",
    "GPU discovery: every visible GPU's name, UUID, PCI bus id, memory, compute\n"
    "capability, MIG mode, and the peer-access / NVLink matrix; then the NVML topology\n"
    "(NUMA node, local CPUs, NVLink islands) and the GPU each local rank gets.\n"
    "Exits 0 on a node without a GPU or driver, after saying so.\n"
    "With --model: the model's parameters, the f32 weights and KV bytes per token of the\n"
    "heaviest rank for --tp x --pp, and the layouts the model allows.",
    &info_table, 0};

/*
 * --libraries: loads NCCL and cuBLASLt through their run-time search (common/dynlib.c,
 * which logs every place tried) and prints "library NAME: FILE" or "library NAME: MISSING
 * (why)" on stdout, one line each. Needs no GPU. GANG_EXIT_OK when both loaded, 1 else.
 */
static int info_libraries(void)
{
    char path[1024];
    int bad = 0;
    const struct {
        const char *name;
        int (*load)(char *, size_t);
    } libs[] = {{"NCCL", gang_comm_nccl_library}, {"cuBLASLt", gang_kernels_cuda_library}};

    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        int rc = libs[i].load(path, sizeof(path));

        if (rc == 0)
            printf("library %s: %s\n", libs[i].name, path);
        else
            printf("library %s: MISSING (%s)\n", libs[i].name,
                   rc == GANG_ENOSYS ? "not built into this binary" : "not found, see the log");
        bad |= rc != 0;
    }
    return bad ? 1 : GANG_EXIT_OK;
}

int gang_cmd_info(int argc, char **argv)
{
    static gang_device_info gpus[INFO_MAX_GPUS];
    gpu_extra extra[INFO_MAX_GPUS];
    nvml_api api;
    info_opts o;
    int labels, n, rc;

    rc = gang_opts_cli(&info_cmd, &o, argc, argv, NULL, NULL);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    labels = o.labels;
    if (o.libraries)
        return info_libraries();
    if (o.model[0])
        return gang__info_model(o.model, o.tp, o.pp, o.ep);
    n = gang_kernels_device_count();
    if (n == 0) {
        gang_device_info probe;
        FILE *msg = labels ? stderr : stdout; /* --labels keeps stdout to labels only */

        if (gang_kernels_device_info(0, &probe) == GANG_ENOSYS)
            fprintf(msg, "ganglion info: CUDA support is not built into this binary "
                         "(GANGLION_CUDA=OFF or no toolkit at build time); no GPU can be used\n");
        else
            fprintf(msg, "ganglion info: no GPU visible (no NVIDIA driver, no device, or "
                         "CUDA_VISIBLE_DEVICES hides them)\n");
        if (labels)
            printf("nvidia.com/gpu.present=false\nnvidia.com/gpu.count=0\n");
        else
            gang__info_topology(o.nvml_library, o.nproc_per_node, o.tp);
        return GANG_EXIT_OK;
    }
    if (n > INFO_MAX_GPUS)
        n = INFO_MAX_GPUS;
    for (int i = 0; i < n; i++) {
        rc = gang_kernels_device_info(i, &gpus[i]);
        if (rc < 0) {
            fprintf(stderr, "ganglion info: cannot query GPU %d: %s\n", i, gang_strerror(rc));
            return GANG_EXIT_INTERNAL;
        }
    }
    nvml_open(&api);
    for (int i = 0; i < n; i++)
        nvml_describe(&api, &gpus[i], &extra[i]);
    if (labels)
        print_labels(gpus, extra, n, &api);
    else
        print_devices(gpus, extra, n, &api);
    nvml_close(&api);
    if (!labels)
        gang__info_topology(o.nvml_library, o.nproc_per_node, o.tp);
    return GANG_EXIT_OK;
}
