/*
 * Identity discovery: every source, their precedence, every error path, and the
 * HOST:PORT parser. Discovery is a pure function, so each test builds a parameter set and
 * an environment array by hand and checks the identity (or the message naming the culprit).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/rendezvous.h"
#include "rdzv-tests.h"

typedef struct id_case {
    gang_params p;
    gang_identity id;
    char err[512];
} id_case;

static void id_case_init(id_case *c)
{
    memset(c, 0, sizeof(*c));
    gang_params_defaults(&c->p);
}

static int discover(id_case *c, char *const *envp, const char *hostname)
{
    return gang_identity_discover(&c->p, envp, hostname, &c->id, c->err, sizeof(c->err));
}

/* Asserts that discovery fails with GANG_EUSAGE and that the message mentions what. */
static void expect_usage_error(id_case *c, char *const *envp, const char *hostname,
                               const char *what)
{
    assert_int_equal(discover(c, envp, hostname), GANG_EUSAGE);
    if (strstr(c->err, what) == NULL)
        fail_msg("error message '%s' does not mention '%s'", c->err, what);
}

/* ----------------------------------------------------------------------------- flags */

static void test_flags_with_coordinator(void **state)
{
    char *env[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.node_index = 2;
    c.p.nnodes = 3;
    strcpy(c.p.coordinator, "coord.example:1234");
    /* Flags win over the MPI variables that are present too. */
    assert_int_equal(discover(&c, env, "web-7"), 0);
    assert_int_equal(c.id.source, GANG_ID_FLAGS);
    assert_int_equal(c.id.node_index, 2);
    assert_int_equal(c.id.nnodes, 3);
    assert_string_equal(c.id.coordinator_host, "coord.example");
    assert_int_equal(c.id.coordinator_port, 1234);
    assert_false(c.id.is_coordinator);
    assert_string_equal(c.err, "");
}

static void test_flags_node0_defaults_to_bind_address(void **state)
{
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.node_index = 0;
    c.p.nnodes = 2;
    assert_int_equal(discover(&c, NULL, NULL), 0);
    assert_int_equal(c.id.source, GANG_ID_FLAGS);
    assert_true(c.id.is_coordinator);
    assert_string_equal(c.id.coordinator_host, "127.0.0.1");
    assert_int_equal(c.id.coordinator_port, 29400);

    strcpy(c.p.bind_address, "10.1.2.3");
    c.p.rdzv_port = 4000;
    assert_int_equal(discover(&c, NULL, NULL), 0);
    assert_string_equal(c.id.coordinator_host, "10.1.2.3");
    assert_int_equal(c.id.coordinator_port, 4000);

    strcpy(c.p.bind_address, "::");
    assert_int_equal(discover(&c, NULL, NULL), 0);
    assert_string_equal(c.id.coordinator_host, "127.0.0.1");

    /* Port 0 (ephemeral) is fine for the coordinator itself. */
    c.p.rdzv_port = 0;
    assert_int_equal(discover(&c, NULL, NULL), 0);
    assert_int_equal(c.id.coordinator_port, 0);
}

static void test_flags_with_service(void **state)
{
    char *env[] = {"POD_NAMESPACE=infer", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.node_index = 1;
    c.p.nnodes = 4;
    strcpy(c.p.service, "llm-hl");
    /* The flag's index wins over the ordinal; only the NAME part of the host is used. */
    assert_int_equal(discover(&c, env, "llm-3"), 0);
    assert_int_equal(c.id.source, GANG_ID_FLAGS);
    assert_int_equal(c.id.node_index, 1);
    assert_string_equal(c.id.coordinator_host, "llm-0.llm-hl.infer.svc.cluster.local");
    assert_int_equal(c.id.coordinator_port, 29400);

    expect_usage_error(&c, env, "no-ordinal", "no-ordinal");
}

static void test_flags_errors(void **state)
{
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.node_index = 1;
    c.p.nnodes = 2;
    expect_usage_error(&c, NULL, "host", "--coordinator");
    assert_int_equal(c.id.source, GANG_ID_FLAGS);

    c.p.node_index = 2;
    expect_usage_error(&c, NULL, "host", "--node-index 2");

    c.p.node_index = 1;
    strcpy(c.p.coordinator, "nohost");
    expect_usage_error(&c, NULL, "host", "--coordinator 'nohost'");
    strcpy(c.p.coordinator, "h:0");
    expect_usage_error(&c, NULL, "host", "--coordinator");

    /* A non-zero node cannot dial an ephemeral port. */
    c.p.coordinator[0] = '\0';
    strcpy(c.p.service, "svc");
    c.p.rdzv_port = 0;
    expect_usage_error(&c, NULL, "x-1", "--rdzv-port");
}

/* ------------------------------------------------------------------------------- MPI */

static void test_mpi(void **state)
{
    char *env[] = {"PATH=/bin",          "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                   "LWS_WORKER_INDEX=1", "LWS_GROUP_SIZE=2",       NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    strcpy(c.p.coordinator, "[fd00::1]:29400");
    strcpy(c.p.service, "svc");
    /* --nnodes left at its default: the MPI world size is taken. MPI wins over LWS. */
    assert_int_equal(discover(&c, env, "web-0"), 0);
    assert_int_equal(c.id.source, GANG_ID_MPI);
    assert_int_equal(c.id.node_index, 2);
    assert_int_equal(c.id.nnodes, 4);
    assert_string_equal(c.id.coordinator_host, "fd00::1");
    assert_int_equal(c.id.coordinator_port, 29400);
    assert_false(c.id.is_coordinator);

    c.p.nnodes = 4;
    assert_int_equal(discover(&c, env, NULL), 0);
    assert_int_equal(c.id.nnodes, 4);

    c.p.nnodes = 3;
    expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_SIZE=4 disagrees with --nnodes 3");
    assert_int_equal(c.id.source, GANG_ID_MPI);
}

static void test_mpi_rank0_is_coordinator(void **state)
{
    char *env[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    strcpy(c.p.coordinator, "10.0.0.1:5");
    assert_int_equal(discover(&c, env, NULL), 0);
    assert_true(c.id.is_coordinator);
    assert_int_equal(c.id.nnodes, 1);
}

static void test_mpi_errors(void **state)
{
    id_case c;

    (void)state;
    id_case_init(&c);
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "--coordinator HOST:PORT");
        strcpy(c.p.coordinator, "bad");
        expect_usage_error(&c, env, NULL, "--coordinator 'bad'");
    }
    strcpy(c.p.coordinator, "h:1");
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=1", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_SIZE is not set");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_RANK is not set");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=", "OMPI_COMM_WORLD_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_RANK is not set");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_RANK=2 is outside [0, 1]");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=0", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_SIZE=0 is outside");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=5000", NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_SIZE=5000 is outside");
    }
    {
        char *env[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=99999999999999999999999",
                       NULL};

        expect_usage_error(&c, env, NULL, "OMPI_COMM_WORLD_SIZE=99999999999999999999999");
    }
    /* Strict integers: no junk, no sign, no blanks. */
    static const char *const bad_ranks[] = {"1x", " 1", "1 ", "+1", "-1", "0x1", "1.0"};
    for (size_t i = 0; i < sizeof(bad_ranks) / sizeof(bad_ranks[0]); i++) {
        char var[64];
        char *env[] = {var, "OMPI_COMM_WORLD_SIZE=2", NULL};

        snprintf(var, sizeof(var), "OMPI_COMM_WORLD_RANK=%s", bad_ranks[i]);
        expect_usage_error(&c, env, NULL, "not a non-negative decimal integer");
    }
}

/* ------------------------------------------------------------------------------- LWS */

static void test_lws(void **state)
{
    char *env[] = {"LWS_LEADER_ADDRESS=llm-0.llm.ns", "LWS_WORKER_INDEX=3", "LWS_GROUP_SIZE=4",
                   NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    strcpy(c.p.service, "svc"); /* LWS wins over the StatefulSet rule. */
    c.p.rdzv_port = 29500;
    assert_int_equal(discover(&c, env, "llm-0-3"), 0);
    assert_int_equal(c.id.source, GANG_ID_LWS);
    assert_int_equal(c.id.node_index, 3);
    assert_int_equal(c.id.nnodes, 4);
    assert_string_equal(c.id.coordinator_host, "llm-0.llm.ns");
    assert_int_equal(c.id.coordinator_port, 29500);
    assert_false(c.id.is_coordinator);

    /* An explicit --coordinator overrides the leader address. */
    strcpy(c.p.coordinator, "10.9.8.7:1");
    assert_int_equal(discover(&c, env, NULL), 0);
    assert_string_equal(c.id.coordinator_host, "10.9.8.7");
    assert_int_equal(c.id.coordinator_port, 1);
}

static void test_lws_leader(void **state)
{
    char *env[] = {"LWS_LEADER_ADDRESS=leader", "LWS_WORKER_INDEX=0", "LWS_GROUP_SIZE=2", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.nnodes = 2;
    assert_int_equal(discover(&c, env, NULL), 0);
    assert_true(c.id.is_coordinator);
    assert_int_equal(c.id.node_index, 0);
}

static void test_lws_errors(void **state)
{
    id_case c;

    (void)state;
    id_case_init(&c);
    {
        char *env[] = {"LWS_WORKER_INDEX=1", "LWS_GROUP_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "LWS_LEADER_ADDRESS is not set");
        assert_int_equal(c.id.source, GANG_ID_LWS);
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_GROUP_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "LWS_WORKER_INDEX is not set");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=0", NULL};

        expect_usage_error(&c, env, NULL, "LWS_GROUP_SIZE is not set");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=2", "LWS_GROUP_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "LWS_WORKER_INDEX=2 is outside [0, 1]");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=a", "LWS_GROUP_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "LWS_WORKER_INDEX='a'");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=0", "LWS_GROUP_SIZE=2x", NULL};

        expect_usage_error(&c, env, NULL, "LWS_GROUP_SIZE='2x'");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=0", "LWS_GROUP_SIZE=2", NULL};

        c.p.nnodes = 3;
        expect_usage_error(&c, env, NULL, "LWS_GROUP_SIZE=2 disagrees with --nnodes 3");
        c.p.nnodes = 1;
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=a b", "LWS_WORKER_INDEX=0", "LWS_GROUP_SIZE=2", NULL};

        expect_usage_error(&c, env, NULL, "LWS_LEADER_ADDRESS='a b'");
    }
    {
        char *env[] = {"LWS_LEADER_ADDRESS=l", "LWS_WORKER_INDEX=1", "LWS_GROUP_SIZE=2", NULL};

        c.p.rdzv_port = 0;
        expect_usage_error(&c, env, NULL, "--rdzv-port 0");
    }
}

/* ----------------------------------------------------------------------- StatefulSet */

static void test_statefulset(void **state)
{
    char *env[] = {"HOME=/root", "POD_NAMESPACE=prod", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.nnodes = 4;
    strcpy(c.p.service, "llm-headless");
    assert_int_equal(discover(&c, env, "llm-tp2-3"), 0);
    assert_int_equal(c.id.source, GANG_ID_STATEFULSET);
    assert_int_equal(c.id.node_index, 3);
    assert_int_equal(c.id.nnodes, 4);
    assert_string_equal(c.id.coordinator_host, "llm-tp2-0.llm-headless.prod.svc.cluster.local");
    assert_int_equal(c.id.coordinator_port, 29400);
    assert_false(c.id.is_coordinator);

    /* --namespace beats POD_NAMESPACE; the cluster domain is a parameter. */
    strcpy(c.p.namespace_, "explicit");
    strcpy(c.p.cluster_domain, "corp.internal");
    assert_int_equal(discover(&c, env, "llm-tp2-0"), 0);
    assert_true(c.id.is_coordinator);
    assert_string_equal(c.id.coordinator_host, "llm-tp2-0.llm-headless.explicit.svc.corp.internal");

    /* An empty domain leaves the name to the resolver's search path. */
    c.p.cluster_domain[0] = '\0';
    assert_int_equal(discover(&c, env, "llm-tp2-1"), 0);
    assert_string_equal(c.id.coordinator_host, "llm-tp2-0.llm-headless.explicit.svc");
}

static void test_statefulset_namespace_default_and_hostname(void **state)
{
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.nnodes = 2;
    strcpy(c.p.service, "s");
    /* No namespace anywhere: "default". A FQDN host name counts by its first label. */
    assert_int_equal(discover(&c, NULL, "web-1.s.default.svc.cluster.local"), 0);
    assert_int_equal(c.id.node_index, 1);
    assert_string_equal(c.id.coordinator_host, "web-0.s.default.svc.cluster.local");

    /* An empty POD_NAMESPACE counts as absent. */
    {
        char *env[] = {"POD_NAMESPACE=", NULL};

        assert_int_equal(discover(&c, env, "web-1"), 0);
        assert_string_equal(c.id.coordinator_host, "web-0.s.default.svc.cluster.local");
    }

    /* --hostname overrides the machine's name. */
    strcpy(c.p.hostname, "other-0");
    assert_int_equal(discover(&c, NULL, "web-1"), 0);
    assert_int_equal(c.id.node_index, 0);
    assert_string_equal(c.id.coordinator_host, "other-0.s.default.svc.cluster.local");

    /* --coordinator overrides the derived address, not the ordinal. */
    c.p.hostname[0] = '\0';
    strcpy(c.p.coordinator, "[::1]:7");
    assert_int_equal(discover(&c, NULL, "web-1"), 0);
    assert_int_equal(c.id.source, GANG_ID_STATEFULSET);
    assert_int_equal(c.id.node_index, 1);
    assert_string_equal(c.id.coordinator_host, "::1");
    assert_int_equal(c.id.coordinator_port, 7);
}

static void test_statefulset_errors(void **state)
{
    static const char *const bad_hosts[] = {"web",     "web-",          "-3", "web-3a", "web3",
                                            "web-x.s", "web-1234567890"};
    char longname[300];
    id_case c;

    (void)state;
    id_case_init(&c);
    c.p.nnodes = 2;
    strcpy(c.p.service, "s");
    for (size_t i = 0; i < sizeof(bad_hosts) / sizeof(bad_hosts[0]); i++) {
        expect_usage_error(&c, NULL, bad_hosts[i], bad_hosts[i]);
        assert_int_equal(c.id.source, GANG_ID_STATEFULSET);
        assert_int_equal(c.id.node_index, 0);
        assert_string_equal(c.id.coordinator_host, "");
    }
    expect_usage_error(&c, NULL, NULL, "--hostname");
    expect_usage_error(&c, NULL, "", "--hostname");

    expect_usage_error(&c, NULL, "web-2", "ordinal 2");
    expect_usage_error(&c, NULL, "web-2", "--nnodes 2");

    /* The derived name must fit GANG_HOST_MAX. */
    memset(longname, 'a', 250);
    strcpy(longname + 250, "-1");
    expect_usage_error(&c, NULL, longname, "longer than");

    c.p.rdzv_port = 0;
    expect_usage_error(&c, NULL, "web-1", "--rdzv-port 0");
}

static void test_no_source(void **state)
{
    char *env[] = {"HOME=/", "OMPI_COMM_WORLD_RANK=", "LWS_WORKER_INDEX=", NULL};
    id_case c;

    (void)state;
    id_case_init(&c);
    expect_usage_error(&c, env, "web-0", "--node-index");
    expect_usage_error(&c, NULL, NULL, "GANGLION_SERVICE");
    /* NULL err buffer is allowed. */
    assert_int_equal(gang_identity_discover(&c.p, NULL, NULL, &c.id, NULL, 0), GANG_EUSAGE);
}

static void test_source_names(void **state)
{
    (void)state;
    assert_string_equal(gang_identity_source_name(GANG_ID_FLAGS), "flags");
    assert_string_equal(gang_identity_source_name(GANG_ID_MPI), "mpi");
    assert_string_equal(gang_identity_source_name(GANG_ID_LWS), "leaderworkerset");
    assert_string_equal(gang_identity_source_name(GANG_ID_STATEFULSET), "statefulset");
    assert_string_equal(gang_identity_source_name((gang_identity_source)42), "unknown");
}

/* --------------------------------------------------------------------------- HOST:PORT */

static void expect_host_port(const char *s, const char *host, uint16_t port)
{
    char h[GANG_HOST_MAX];
    uint16_t p = 0;
    int rc = gang_parse_host_port(s, h, sizeof(h), &p);

    if (rc != 0)
        fail_msg("'%s' was rejected (%d)", s, rc);
    assert_string_equal(h, host);
    assert_int_equal(p, port);
}

static void expect_host_port_error(const char *s, int want)
{
    char h[16] = "untouched";
    uint16_t p = 42;
    int rc = gang_parse_host_port(s, h, sizeof(h), &p);

    if (rc != want)
        fail_msg("'%s': got %d, want %d", s ? s : "(null)", rc, want);
    assert_string_equal(h, "untouched");
    assert_int_equal(p, 42);
}

static void test_host_port(void **state)
{
    char h[8];
    uint16_t p;

    (void)state;
    expect_host_port("a:1", "a", 1);
    expect_host_port("coord.ns.svc.cluster.local:29400", "coord.ns.svc.cluster.local", 29400);
    expect_host_port("10.0.0.1:65535", "10.0.0.1", 65535);
    expect_host_port("h:00080", "h", 80);
    expect_host_port("[::1]:80", "::1", 80);
    expect_host_port("[fe80::1%eth0]:29400", "fe80::1%eth0", 29400);

    expect_host_port_error(NULL, GANG_EINVAL);
    expect_host_port_error("", GANG_EINVAL);
    expect_host_port_error("host", GANG_EINVAL);
    expect_host_port_error("host:", GANG_EINVAL);
    expect_host_port_error(":80", GANG_EINVAL);
    expect_host_port_error("host:80x", GANG_EINVAL);
    expect_host_port_error("host:+80", GANG_EINVAL);
    expect_host_port_error("host:-1", GANG_EINVAL);
    expect_host_port_error("host: 80", GANG_EINVAL);
    expect_host_port_error("ho st:80", GANG_EINVAL);
    expect_host_port_error("host\n:80", GANG_EINVAL);
    expect_host_port_error("a/b:80", GANG_EINVAL);
    expect_host_port_error("::1:80", GANG_EINVAL);
    expect_host_port_error("h:80:81", GANG_EINVAL);
    expect_host_port_error("[::1]", GANG_EINVAL);
    expect_host_port_error("[::1]80", GANG_EINVAL);
    expect_host_port_error("[::1]:", GANG_EINVAL);
    expect_host_port_error("[]:80", GANG_EINVAL);
    expect_host_port_error("[host]:80", GANG_EINVAL);
    expect_host_port_error("[::1:80", GANG_EINVAL);
    expect_host_port_error("[::1]:80:1", GANG_EINVAL);
    expect_host_port_error("[[::1]]:80", GANG_EINVAL);
    expect_host_port_error("host:0", GANG_ERANGE);
    expect_host_port_error("host:65536", GANG_ERANGE);
    expect_host_port_error("host:99999999999999999999999999", GANG_ERANGE);
    /* The host must fit its buffer with the NUL: 15 characters fit in 16, 16 do not. */
    expect_host_port("abcdefghijklmno:1", "abcdefghijklmno", 1);
    expect_host_port_error("abcdefghijklmnop:1", GANG_ERANGE);

    assert_int_equal(gang_parse_host_port("a:1", h, sizeof(h), NULL), GANG_EINVAL);
    assert_int_equal(gang_parse_host_port("a:1", NULL, sizeof(h), &p), GANG_EINVAL);
    assert_int_equal(gang_parse_host_port("a:1", h, 0, &p), GANG_ERANGE);
    assert_int_equal(gang_parse_host_port("abcdefg:1", h, sizeof(h), &p), 0);
    assert_string_equal(h, "abcdefg");
}

int gang_test_identity(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_with_coordinator),
        cmocka_unit_test(test_flags_node0_defaults_to_bind_address),
        cmocka_unit_test(test_flags_with_service),
        cmocka_unit_test(test_flags_errors),
        cmocka_unit_test(test_mpi),
        cmocka_unit_test(test_mpi_rank0_is_coordinator),
        cmocka_unit_test(test_mpi_errors),
        cmocka_unit_test(test_lws),
        cmocka_unit_test(test_lws_leader),
        cmocka_unit_test(test_lws_errors),
        cmocka_unit_test(test_statefulset),
        cmocka_unit_test(test_statefulset_namespace_default_and_hostname),
        cmocka_unit_test(test_statefulset_errors),
        cmocka_unit_test(test_no_source),
        cmocka_unit_test(test_source_names),
        cmocka_unit_test(test_host_port),
    };

    return cmocka_run_group_tests_name("identity", tests, NULL, NULL);
}
