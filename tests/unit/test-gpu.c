/*
 * cmocka tests of the gpu module against the fake NVML (tests/fake-nvml/), loaded by path
 * through the module's own dlopen: loading and refusals, samples, the fatal and warning
 * classification, the health watch (Xid events, level conditions, acknowledgement),
 * topology, the placement map on fake topologies, and the CPU binding.
 */
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "ganglion/gpu.h"

static char cfg_path[256];

static long long wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* Writes the fake's configuration (a new file each time, so its mtime check sees it). */
static void write_cfg(const char *text)
{
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", cfg_path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(rename(tmp, cfg_path), 0);
}

static void append_cfg(const char *line)
{
    FILE *f = fopen(cfg_path, "a");
    assert_non_null(f);
    fputs(line, f);
    fclose(f);
}

/* 8 GPUs on 2 NUMA nodes, NVLink pairs (0,2) (1,3) (4,6) (5,7): the index order is wrong
 * for TP 2, so the map must differ from the identity. */
static const char *topo_2x4_pairs = "gpu 0 numa=0 cpus=0\n"
                                    "gpu 1 numa=0 cpus=0\n"
                                    "gpu 2 numa=0 cpus=0\n"
                                    "gpu 3 numa=0 cpus=0\n"
                                    "gpu 4 numa=1 cpus=1\n"
                                    "gpu 5 numa=1 cpus=1\n"
                                    "gpu 6 numa=1 cpus=1\n"
                                    "gpu 7 numa=1 cpus=1\n"
                                    "nvlink 0 2\nnvlink 1 3\nnvlink 4 6\nnvlink 5 7\n";

static gang_nvml *open_fake(void)
{
    gang_nvml *n = NULL;
    char err[256];
    int rc = gang_nvml_open(FAKE_NVML_PATH, &n, err, sizeof(err));
    if (rc != 0)
        fail_msg("fake NVML: %s", err);
    return n;
}

static void test_open_refusals(void **state)
{
    (void)state;
    gang_nvml *n = NULL;
    char err[256] = "";
    assert_int_equal(gang_nvml_open("/nonexistent/libnvidia-ml.so.1", &n, err, sizeof(err)),
                     GANG_ENOENT);
    assert_null(n);
    assert_non_null(strstr(err, "cannot load"));
    /* A library without NVML's entry points (libc) is refused as such. */
    assert_int_equal(gang_nvml_open("libc.so.6", &n, err, sizeof(err)), GANG_EIO);
    assert_non_null(strstr(err, "lacks"));
    /* No configuration: the fake says "driver not loaded", like a node without one. */
    unsetenv("FAKE_NVML_CONFIG");
    assert_int_equal(gang_nvml_open(FAKE_NVML_PATH, &n, err, sizeof(err)), GANG_ENOENT);
    setenv("FAKE_NVML_CONFIG", cfg_path, 1);
}

static void test_sample_fields_and_verdicts(void **state)
{
    (void)state;
    char why[256];
    gang_gpu_sample s;
    long long now = wall_now();
    char text[1024];
    snprintf(text, sizeof(text),
             "gpu 0 name=H200 uuid=GPU-a util=37 temp=61 power=450000\n"
             "gpu 1 uuid=GPU-b\n"
             "gpu 2 uuid=GPU-c\n"
             "gpu 3 uuid=GPU-d\n"
             "throttle 0 0x40 %lld\n"
             "sbe 0 5 %lld\n"
             "dbe 1 2 %lld\n"
             "lost 2 %lld\n"
             "remap 3 %lld\n",
             now, now, now, now, now);
    write_cfg(text);
    gang_nvml *n = open_fake();
    uint32_t count;
    assert_int_equal(gang_nvml_count(n, &count), 0);
    assert_int_equal(count, 4);

    assert_int_equal(gang_nvml_sample(n, 0, &s), 0);
    assert_string_equal(s.uuid, "GPU-a");
    assert_string_equal(s.name, "H200");
    assert_int_equal(s.util_gpu, 37);
    assert_int_equal(s.temp_c, 61);
    assert_int_equal(s.power_mw, 450000);
    assert_int_equal(s.sm_clock_mhz, 1980);
    assert_int_equal(s.fb_total_mib, 143771);
    assert_int_equal(s.throttle_reasons, GANG_GPU_THROTTLE_HW_THERMAL);
    assert_int_equal(s.ecc_sbe_volatile, 5);
    /* Throttling and single-bit errors are not fatal. */
    assert_int_equal(gang_gpu_sample_fatal(&s, why, sizeof(why)), 0);

    assert_int_equal(gang_nvml_sample(n, 1, &s), 0);
    assert_int_equal(s.ecc_dbe_volatile, 2);
    assert_int_equal(gang_gpu_sample_fatal(&s, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "double-bit"));
    assert_non_null(strstr(why, "GPU 1"));

    assert_int_equal(gang_nvml_sample(n, 2, &s), 0);
    assert_int_equal(s.lost, 1);
    assert_int_equal(gang_gpu_sample_fatal(&s, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "does not answer"));

    assert_int_equal(gang_nvml_sample(n, 3, &s), 0);
    assert_int_equal(s.remap_pending, 1);
    assert_int_equal(gang_gpu_sample_fatal(&s, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "remapping"));

    assert_int_equal(gang_nvml_sample(n, 9, &s), GANG_EINVAL);
    gang_nvml_close(n);
}

static void test_xid_table_and_kinds(void **state)
{
    (void)state;
    static const uint32_t fatal[] = {48, 63, 64, 74, 79, 94, 95};
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        assert_int_equal(gang_gpu_xid_is_fatal(fatal[i]), 1);
    assert_int_equal(gang_gpu_xid_is_fatal(13), 0);
    assert_int_equal(gang_gpu_xid_is_fatal(31), 0);
    assert_int_equal(gang_gpu_xid_is_fatal(12345), 0);
    assert_string_equal(gang_gpu_xid_text(79), "GPU has fallen off the bus");

    int32_t gpu;
    char kind[24];
    assert_int_equal(gang_gpu_fault_kind("rank 3 (node 0 local 3): GPU 5 (GPU-x): Xid 79 (GPU "
                                         "has fallen off the bus)",
                                         &gpu, kind, sizeof(kind)),
                     1);
    assert_int_equal(gpu, 5);
    assert_string_equal(kind, "xid_79");
    gang_gpu_fault_kind("GPU 2 (u) does not answer: lost", &gpu, kind, sizeof(kind));
    assert_string_equal(kind, "lost");
    gang_gpu_fault_kind("GPU 0 (u): 3 double-bit ECC error(s)", &gpu, kind, sizeof(kind));
    assert_string_equal(kind, "dbe");
    gang_gpu_fault_kind("GPU 0 (u): pages pending retirement", &gpu, kind, sizeof(kind));
    assert_string_equal(kind, "retired_pending");
    assert_int_equal(gang_gpu_fault_kind("peer lost", &gpu, kind, sizeof(kind)), 0);
    assert_int_equal(gpu, -1);
    assert_string_equal(kind, "other");
}

static int faults_seen;
static void count_fault(void *ctx)
{
    (void)ctx;
    __atomic_add_fetch(&faults_seen, 1, __ATOMIC_SEQ_CST);
}

/* Polls until the watch reports a fault or about 2 s pass; returns what it said. */
static int wait_fault(gang_gpu_watch *w, char *why, size_t cap)
{
    for (int i = 0; i < 200; i++) {
        if (gang_gpu_watch_fault(w, 0, why, cap))
            return 1;
        usleep(10000);
    }
    return 0;
}

/* Polls the watch's sample until pred holds or about 3 s pass; returns whether it held. */
static int wait_sample(gang_gpu_watch *w, int (*pred)(const gang_gpu_sample *s))
{
    gang_gpu_sample s;
    for (int i = 0; i < 300; i++) {
        gang_gpu_watch_get(w, &s);
        if (pred(&s))
            return 1;
        usleep(10000);
    }
    return 0;
}

static int has_uuid(const gang_gpu_sample *s)
{
    return s->uuid[0] != '\0';
}
static int has_xid(const gang_gpu_sample *s)
{
    return s->n_xid > 0;
}
static int not_fatal(const gang_gpu_sample *s)
{
    return !s->fatal;
}
static int throttled(const gang_gpu_sample *s)
{
    return s->warning;
}

static void test_watch_xid_and_levels(void **state)
{
    (void)state;
    char why[256], line[128];
    gang_gpu_sample s;
    write_cfg("gpu 0 uuid=GPU-w0\ngpu 1 uuid=GPU-w1\n");
    gang_nvml *n = open_fake();
    gang_gpu_watch *w = NULL;
    gang_gpu_watch_config wc = {
        .nvml = n, .gpu = 1, .interval_ms = 50, .on_fault = count_fault, .ctx = NULL};
    assert_int_equal(gang_gpu_watch_start(&wc, &w), 0);
    faults_seen = 0;
    assert_true(wait_sample(w, has_uuid)); /* the first sample */
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 0);

    /* A non-fatal Xid is counted, nothing fails; an Xid on another GPU is not ours. */
    snprintf(line, sizeof(line), "xid 1 13 %lld\nxid 0 79 %lld\n", wall_now(), wall_now());
    append_cfg(line);
    assert_true(wait_sample(w, has_xid));
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 0);
    gang_gpu_watch_get(w, &s);
    assert_int_equal(s.n_xid, 1);
    assert_int_equal(s.xid[0].code, 13);
    assert_int_equal(s.last_xid, 13);

    /* Xid 79 on GPU 1: fatal, latched until acknowledged, named with the GPU's UUID. */
    long long t0 = wall_now();
    snprintf(line, sizeof(line), "xid 1 79 %lld\n", t0);
    append_cfg(line);
    assert_int_equal(wait_fault(w, why, sizeof(why)), 1);
    long long dt = wall_now() - t0;
    assert_true(dt < 1000); /* the event wakes the watch; no sampling interval to wait */
    assert_non_null(strstr(why, "GPU 1 (GPU-w1): Xid 79"));
    assert_int_equal(__atomic_load_n(&faults_seen, __ATOMIC_SEQ_CST), 1);
    gang_gpu_watch_get(w, &s);
    assert_int_equal(s.fatal, 1);
    assert_int_equal(s.last_xid, 79);
    assert_int_equal(gang_gpu_watch_fault(w, 1, why, sizeof(why)), 1); /* ack */
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 0);

    /* A level condition (lost) holds through acknowledgements until it clears. */
    t0 = wall_now();
    snprintf(line, sizeof(line), "lost 1 %lld %lld\n", t0, t0 + 1000);
    append_cfg(line);
    assert_int_equal(wait_fault(w, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "does not answer"));
    assert_non_null(strstr(why, "GPU-w1")); /* identity kept from before it was lost */
    assert_int_equal(gang_gpu_watch_fault(w, 1, why, sizeof(why)), 1);
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 1);
    assert_true(wait_sample(w, not_fatal)); /* clears when the GPU answers again */
    assert_true(wall_now() >= t0 + 1000);
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 0);
    assert_int_equal(__atomic_load_n(&faults_seen, __ATOMIC_SEQ_CST), 2);

    /* Throttling is a warning in the sample, never a fault. */
    snprintf(line, sizeof(line), "throttle 1 0x4 %lld\n", wall_now());
    append_cfg(line);
    assert_true(wait_sample(w, throttled));
    gang_gpu_watch_get(w, &s);
    assert_int_equal(s.warning, 1);
    assert_int_equal(s.fatal, 0);
    assert_int_equal(gang_gpu_watch_fault(w, 0, why, sizeof(why)), 0);
    gang_gpu_watch_stop(w);

    /* A GPU that leaves the device count (fell off the bus) is lost. */
    write_cfg("gpu 0 uuid=GPU-w0\n");
    assert_int_equal(gang_gpu_watch_start(&wc, &w), 0);
    assert_int_equal(wait_fault(w, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "GPU 1"));
    assert_non_null(strstr(why, "does not answer"));
    gang_gpu_watch_stop(w);

    wc.interval_ms = 0;
    assert_int_equal(gang_gpu_watch_start(&wc, &w), GANG_EINVAL);
    gang_nvml_close(n);
}

static void test_topology_and_place(void **state)
{
    (void)state;
    char err[256];
    uint32_t map[GANG_GPU_MAX];
    gang_gpu_topology *t = malloc(sizeof(*t));
    assert_non_null(t);
    write_cfg(topo_2x4_pairs);
    gang_nvml *n = open_fake();
    assert_int_equal(gang_nvml_topology(n, t, err, sizeof(err)), 0);
    assert_int_equal(t->count, 8);
    assert_int_equal(t->nislands, 4);
    assert_int_equal(t->gpu[5].numa_node, 1);
    assert_int_equal(t->island[0], t->island[2]);
    assert_int_not_equal(t->island[0], t->island[1]);
    assert_int_equal(t->nvlink[4][6], 1);
    assert_int_equal(t->nvlink[4][5], 0);

    /* TP 2: each pair of consecutive ranks on one NVLink pair. */
    static const uint32_t want_tp2[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    assert_int_equal(gang_gpu_place(t, 8, 2, map), 0);
    assert_memory_equal(map, want_tp2, sizeof(want_tp2));
    /* TP 1: the identity. */
    assert_int_equal(gang_gpu_place(t, 8, 1, map), 0);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(map[i], i);
    /* TP 4: no island holds 4, so index order. */
    assert_int_equal(gang_gpu_place(t, 8, 4, map), 0);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(map[i], i);
    /* Refusals: more ranks than GPUs, TP that does not divide the node. */
    assert_int_equal(gang_gpu_place(t, 9, 1, map), GANG_EINVAL);
    assert_int_equal(gang_gpu_place(t, 6, 4, map), GANG_EINVAL);
    gang_nvml_close(n);

    /* Islands of 4 and 2 (GPUs 0-3 all-to-all, 4-5 a pair), TP 2 on 6 ranks: best fit puts
     * the first group on the pair and keeps the big island whole. */
    write_cfg("gpu 0\ngpu 1\ngpu 2\ngpu 3\ngpu 4\ngpu 5\n"
              "nvlink 0 1\nnvlink 0 2\nnvlink 0 3\nnvlink 1 2\nnvlink 1 3\nnvlink 2 3\n"
              "nvlink 4 5\n");
    n = open_fake();
    assert_int_equal(gang_nvml_topology(n, t, err, sizeof(err)), 0);
    assert_int_equal(t->nislands, 2);
    static const uint32_t want_best[6] = {4, 5, 0, 1, 2, 3};
    assert_int_equal(gang_gpu_place(t, 6, 2, map), 0);
    assert_memory_equal(map, want_best, sizeof(want_best));
    static const uint32_t want_tp4[4] = {0, 1, 2, 3};
    assert_int_equal(gang_gpu_place(t, 4, 4, map), 0);
    assert_memory_equal(map, want_tp4, sizeof(want_tp4));
    gang_nvml_close(n);
    free(t);
}

static void test_bind_to_allowed_cpus(void **state)
{
    (void)state;
    cpu_set_t before, after;
    char desc[256];
    gang_gpu_info g;
    assert_int_equal(sched_getaffinity(0, sizeof(before), &before), 0);
    int first = -1;
    for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
        if (CPU_ISSET(i, &before))
            first = i;
    assert_true(first >= 0);

    /* The GPU's CPUs are the first allowed one plus one that does not exist here. */
    memset(&g, 0, sizeof(g));
    g.index = 3;
    g.numa_node = -1;
    g.cpus[first / 8] |= (uint8_t)(1u << (first % 8));
    g.cpus[1000 / 8] |= (uint8_t)(1u << (1000 % 8));
    assert_int_equal(gang_gpu_bind(&g, desc, sizeof(desc)), 0);
    assert_int_equal(sched_getaffinity(0, sizeof(after), &after), 0);
    assert_int_equal(CPU_COUNT(&after), 1);
    assert_true(CPU_ISSET(first, &after));
    assert_non_null(strstr(desc, "bound to 1 CPU"));

    /* None of the GPU's CPUs is allowed: the affinity stays as it is. */
    memset(g.cpus, 0, sizeof(g.cpus));
    g.cpus[1000 / 8] |= (uint8_t)(1u << (1000 % 8));
    assert_int_equal(gang_gpu_bind(&g, desc, sizeof(desc)), 0);
    assert_non_null(strstr(desc, "affinity unchanged"));
    assert_int_equal(sched_getaffinity(0, sizeof(after), &after), 0);
    assert_int_equal(CPU_COUNT(&after), 1);
    assert_int_equal(sched_setaffinity(0, sizeof(before), &before), 0);

    /* Memory: MPOL_PREFERRED on the GPU's NUMA node (node 0 exists wherever NUMA does). */
    g.numa_node = 0;
    assert_int_equal(gang_gpu_bind(&g, desc, sizeof(desc)), 0);
    int mode = -1;
    unsigned long mask = 0;
    if (syscall(SYS_get_mempolicy, &mode, &mask, 8 * sizeof(mask) + 1, NULL, 0) != 0) {
        printf("SKIP the memory-policy check: get_mempolicy: %s (kernel without NUMA)\n",
               strerror(errno));
        assert_non_null(strstr(desc, "not bindable"));
    } else {
        assert_int_equal(mode, 1); /* MPOL_PREFERRED */
        assert_int_equal(mask, 1ul);
        assert_non_null(strstr(desc, "memory preferred on NUMA node 0"));
        assert_int_equal(syscall(SYS_set_mempolicy, 0, NULL, 0), 0); /* MPOL_DEFAULT */
    }
    assert_int_equal(sched_setaffinity(0, sizeof(before), &before), 0);
}

static void test_bus_ids_and_cpu_lists(void **state)
{
    (void)state;
    char buf[64];
    uint8_t cpus[GANG_GPU_CPUS_MAX / 8] = {0};
    assert_int_equal(gang_gpu_bus_id_equal("00000000:19:00.0", "0000:19:00.0"), 1);
    assert_int_equal(gang_gpu_bus_id_equal("00000000:19:00.0", "0000:1a:00.0"), 0);
    assert_int_equal(gang_gpu_bus_id_equal("garbage", "0000:19:00.0"), 0);
    cpus[0] = 0x0f; /* 0-3 */
    cpus[1] = 0x01; /* 8 */
    gang_gpu_cpus_format(cpus, buf, sizeof(buf));
    assert_string_equal(buf, "0-3,8");
}

int main(void)
{
    snprintf(cfg_path, sizeof(cfg_path), "/tmp/ganglion-test-gpu-%d.conf", (int)getpid());
    setenv("FAKE_NVML_CONFIG", cfg_path, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_refusals),
        cmocka_unit_test(test_sample_fields_and_verdicts),
        cmocka_unit_test(test_xid_table_and_kinds),
        cmocka_unit_test(test_watch_xid_and_levels),
        cmocka_unit_test(test_topology_and_place),
        cmocka_unit_test(test_bind_to_allowed_cpus),
        cmocka_unit_test(test_bus_ids_and_cpu_lists),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(cfg_path);
    return rc;
}
