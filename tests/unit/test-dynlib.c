/*
 * common/dynlib.c: the search order for libraries opened at run time (explicit choice,
 * the Python environment's packages, the loader's search, the build directory), with a
 * real shared library (libcjson.so.1, which the build needs anyway) copied to places the
 * tests control, a real python3 for the package probe, and a python3 that hangs for the
 * probe's deadline. Each scenario that depends on the once-per-process probe runs in a
 * child process of its own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/common.h"

#define SONAME "libcjson.so.1"

static const char *const nccl_pkgs[] = {"nvidia.nccl", NULL};

static gang_dynlib spec(const char *soname, const char *const *pkgs)
{
    gang_dynlib s = {.what = "test",
                     .soname = soname,
                     .flag = "nccl-library",
                     .py_packages = pkgs,
                     .build_dir = "",
                     .probe_symbol = "cJSON_Parse"};
    return s;
}

/* The system's copy of the library, found through the loader. */
static int system_copy(char *path, size_t cap)
{
    gang_dynlib s = spec(SONAME, NULL);
    void *h;

    return gang_dynlib_open(&s, &h, path, cap);
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A fresh directory under TMPDIR (or /tmp). */
static void make_tmp(char *dir, size_t cap)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, cap, "%s/gang-dynlib-XXXXXX", t != NULL ? t : "/tmp");
    assert_non_null(mkdtemp(dir));
}

static void configure(const char *nccl_library, int probe_ms)
{
    gang_params p;
    gang_params_defaults(&p);
    gang_strlcpy(p.nccl_library, nccl_library, sizeof(p.nccl_library));
    p.lib_probe_timeout_ms = probe_ms;
    gang_dynlib_configure(&p);
}

/* An explicit file or directory is the only place tried: a wrong one fails even though
 * the loader would have found the library. */
static void test_dynlib_explicit(void **state)
{
    char sys[1024], dir[512], cmd[2048], loaded[1024];
    gang_dynlib s = spec(SONAME, NULL);
    void *h;
    (void)state;

    assert_int_equal(system_copy(sys, sizeof(sys)), 0);
    make_tmp(dir, sizeof(dir));
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/%s'", sys, dir, SONAME);
    assert_int_equal(run(cmd), 0);

    configure("/nonexistent/libnccl.so.2", 0);
    assert_int_equal(gang_dynlib_open(&s, &h, loaded, sizeof(loaded)), GANG_ENOENT);
    assert_null(h);

    configure(dir, 0); /* a directory: DIR/soname */
    assert_int_equal(gang_dynlib_open(&s, &h, loaded, sizeof(loaded)), 0);
    assert_non_null(h);
    snprintf(cmd, sizeof(cmd), "%s/%s", dir, SONAME);
    assert_string_equal(loaded, cmd);

    configure(cmd, 0); /* a file */
    assert_int_equal(gang_dynlib_open(&s, &h, loaded, sizeof(loaded)), 0);
    assert_string_equal(loaded, cmd);

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(run(cmd), 0);
    configure("", 0);
}

/* Nothing anywhere: GANG_ENOENT, no handle. */
static void test_dynlib_missing(void **state)
{
    gang_dynlib s = spec("libganglion-no-such-library.so.9", NULL);
    char loaded[256];
    void *h = (void *)&s;
    (void)state;

    configure("", 0);
    assert_int_equal(gang_dynlib_open(&s, &h, loaded, sizeof(loaded)), GANG_ENOENT);
    assert_null(h);
}

/*
 * In a child (the probe runs once per process): with PYTHONPATH holding a package
 * nvidia/nccl/lib/SONAME, the Python environment's copy wins over the loader's; a spec
 * without packages still gets the loader's. Exit 0 on success, a step number otherwise.
 */
static int child_python(const char *site, const char *want)
{
    char loaded[1024];
    gang_dynlib with = spec(SONAME, nccl_pkgs), without = spec(SONAME, NULL);
    void *h;

    setenv("PYTHONPATH", site, 1);
    configure("", 20000);
    if (gang_dynlib_open(&with, &h, loaded, sizeof(loaded)) != 0)
        return 1;
    if (strcmp(loaded, want) != 0) {
        fprintf(stderr, "loaded %s, want %s\n", loaded, want);
        return 2;
    }
    if (gang_dynlib_open(&without, &h, loaded, sizeof(loaded)) != 0)
        return 3;
    if (strcmp(loaded, want) == 0)
        return 4;
    return 0;
}

/* In a child: a python3 that never answers costs the probe's deadline, no more, and the
 * search goes on to the loader. */
static int child_hung_python(const char *bindir)
{
    char loaded[1024], path[4096];
    gang_dynlib s = spec(SONAME, nccl_pkgs);
    uint64_t t0;
    void *h;

    snprintf(path, sizeof(path), "%s:%s", bindir, getenv("PATH") != NULL ? getenv("PATH") : "");
    setenv("PATH", path, 1);
    configure("", 300);
    t0 = gang_now_ms();
    if (gang_dynlib_open(&s, &h, loaded, sizeof(loaded)) != 0)
        return 1;
    if (gang_now_ms() - t0 > 5000 || gang_now_ms() - t0 < 250) {
        fprintf(stderr, "the probe took %llu ms against a 300 ms deadline\n",
                (unsigned long long)(gang_now_ms() - t0));
        return 2;
    }
    return 0;
}

static int in_child(int (*fn)(const char *, const char *), const char *a, const char *b)
{
    int st = 0;
    pid_t pid = fork();

    if (pid == 0)
        _exit(fn(a, b));
    assert_true(pid > 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static int child_python_(const char *a, const char *b)
{
    return child_python(a, b);
}

static int child_hung_python_(const char *a, const char *b)
{
    (void)b;
    return child_hung_python(a);
}

static void test_dynlib_python_package(void **state)
{
    char sys[1024], dir[512], cmd[4096], want[1024], site[600];
    (void)state;

    if (run("python3 -c 'import sys' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "python3 is not on PATH: the package probe cannot be exercised\n");
        skip();
    }
    configure("", 0);
    assert_int_equal(system_copy(sys, sizeof(sys)), 0);
    make_tmp(dir, sizeof(dir));
    snprintf(site, sizeof(site), "%s/site", dir);
    snprintf(want, sizeof(want), "%s/nvidia/nccl/lib/%s", site, SONAME);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/nvidia/nccl/lib' && cp '%s' '%s'", site, sys, want);
    assert_int_equal(run(cmd), 0);
    assert_int_equal(in_child(child_python_, site, want), 0);

    snprintf(cmd, sizeof(cmd),
             "mkdir -p '%s/bin' && printf '#!/bin/sh\\nexec sleep 30\\n' > '%s/bin/python3' && "
             "chmod +x '%s/bin/python3'",
             dir, dir, dir);
    assert_int_equal(run(cmd), 0);
    snprintf(site, sizeof(site), "%s/bin", dir);
    assert_int_equal(in_child(child_hung_python_, site, NULL), 0);

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(run(cmd), 0);
}

/* The dynlib group of unit-common; returns the number of failed tests. */
int gang_test_dynlib(void);
int gang_test_dynlib(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynlib_explicit),
        cmocka_unit_test(test_dynlib_missing),
        cmocka_unit_test(test_dynlib_python_package),
    };
    return cmocka_run_group_tests_name("common/dynlib", tests, NULL, NULL);
}
