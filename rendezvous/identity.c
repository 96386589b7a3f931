/*
 * Identity discovery (docs/design.md §3): which node of the gang this agent is, how many nodes
 * there are, and where the coordinator listens. The sources are tried in a fixed order and
 * the first one that is present wins; a source that is present but inconsistent is an
 * error, never a reason to fall through to the next one, because silently picking another
 * identity would make two Pods claim the same node index.
 *
 * Everything here is a pure function of the parameters, the environment array and the
 * host name that the caller passes: no getenv(), no gethostname(), no I/O. That keeps the
 * rules testable and lets the caller log the decision once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ganglion/rendezvous.h"

/* Largest node count the registry accepts for --nnodes; sources may not exceed it either. */
#define IDENTITY_MAX_NODES 4096

const char *gang_identity_source_name(gang_identity_source s)
{
    switch (s) {
    case GANG_ID_FLAGS:
        return "flags";
    case GANG_ID_MPI:
        return "mpi";
    case GANG_ID_LWS:
        return "leaderworkerset";
    case GANG_ID_STATEFULSET:
        return "statefulset";
    }
    return "unknown";
}

/*
 * Looks name up in envp (a NULL-terminated "K=V" array; NULL counts as empty). Returns
 * the value, or NULL when the variable is absent or set to the empty string: an empty
 * value is what a Kubernetes env entry with an unresolved field reference produces, and
 * treating it as "absent" keeps such a Pod from being routed into a half-configured
 * source. The first occurrence wins, as with getenv().
 */
static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);

    if (envp == NULL)
        return NULL;
    for (size_t i = 0; envp[i] != NULL; i++) {
        if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
            return envp[i][n + 1] != '\0' ? envp[i] + n + 1 : NULL;
    }
    return NULL;
}

/*
 * Parses a non-negative decimal index strictly: digits only (no sign, no spaces, no
 * trailing junk) and within [lo, hi]. Returns 0, GANG_EINVAL for bad syntax or
 * GANG_ERANGE when the value is outside the bounds. strtol() alone would accept " 3",
 * "+3" and "3abc", which for a rank number hides a broken manifest.
 */
static int parse_index(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v = 0;
    size_t i;

    if (s == NULL || s[0] == '\0')
        return GANG_EINVAL;
    for (i = 0; s[i] != '\0'; i++) {
        if (s[i] < '0' || s[i] > '9')
            return GANG_EINVAL;
        /* Saturate instead of overflowing; anything this large is out of range anyway. */
        if (v <= (INT64_MAX - 9) / 10)
            v = v * 10 + (s[i] - '0');
        else
            v = INT64_MAX;
    }
    if (v < lo || v > hi)
        return GANG_ERANGE;
    *out = v;
    return 0;
}

/*
 * Splits "host:port" or "[v6]:port". The host must be non-empty and fit hostcap with its
 * NUL; an unbracketed host may not contain ':' (an IPv6 literal needs brackets, otherwise
 * "::1:80" is ambiguous), and neither form may contain whitespace, control characters or
 * stray brackets. The port is decimal digits only, 1..65535. Returns 0, GANG_EINVAL for
 * bad syntax, GANG_ERANGE for a port out of range or a host that does not fit hostcap.
 * host and *port are written only on success.
 */
int gang_parse_host_port(const char *s, char *host, size_t hostcap, uint16_t *port)
{
    const char *h, *colon;
    size_t hlen;
    int64_t v;
    int rc;

    if (s == NULL || host == NULL || port == NULL)
        return GANG_EINVAL;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');

        if (close == NULL || close[1] != ':')
            return GANG_EINVAL;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
        if (memchr(h, ':', hlen) == NULL)
            return GANG_EINVAL; /* brackets are for IPv6 literals only */
    } else {
        colon = strchr(s, ':');
        if (colon == NULL || strchr(colon + 1, ':') != NULL)
            return GANG_EINVAL;
        h = s;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0)
        return GANG_EINVAL;
    for (size_t i = 0; i < hlen; i++) {
        unsigned char c = (unsigned char)h[i];

        if (c <= 0x20 || c >= 0x7f || c == '[' || c == ']' || c == '/')
            return GANG_EINVAL;
    }
    rc = parse_index(colon + 1, 1, 65535, &v);
    if (rc < 0)
        return rc;
    if (hlen >= hostcap)
        return GANG_ERANGE;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return 0;
}

/* Fills the coordinator address from --coordinator, with an error that names the flag. */
static int coordinator_from_flag(const gang_params *p, gang_identity *id, const char *why,
                                 char *err, size_t errlen)
{
    int rc = gang_parse_host_port(p->coordinator, id->coordinator_host,
                                  sizeof(id->coordinator_host), &id->coordinator_port);

    if (rc < 0)
        gang_set_err(err, errlen,
                     "--coordinator '%s' (%s): expected HOST:PORT or [IPv6]:PORT with a port in "
                     "1..65535 and a host shorter than %d bytes",
                     p->coordinator, why, GANG_HOST_MAX);
    return rc < 0 ? GANG_EUSAGE : 0;
}

/*
 * Sets the coordinator port from --rdzv-port for sources that only learn the host. Port 0
 * means "any free port" to the coordinator's listener, which is fine for node 0 itself
 * (tests rely on it) but cannot be dialled by anyone else.
 */
static int coordinator_port_from_param(const gang_params *p, gang_identity *id, char *err,
                                       size_t errlen)
{
    if (p->rdzv_port < 0 || p->rdzv_port > 65535 || (p->rdzv_port == 0 && id->node_index != 0)) {
        gang_set_err(err, errlen,
                     "--rdzv-port %lld cannot be used to reach the coordinator: pass a port in "
                     "1..65535 (or --coordinator HOST:PORT)",
                     (long long)p->rdzv_port);
        return GANG_EUSAGE;
    }
    id->coordinator_port = (uint16_t)p->rdzv_port;
    return 0;
}

/*
 * Reconciles a world size reported by a launcher (MPI, LWS) with --nnodes: the flag's
 * default of 1 means "not given", so the source's size is taken; any other value must
 * agree, because two views of the gang size would deadlock the rendezvous.
 */
static int reconcile_nnodes(const gang_params *p, int64_t size, const char *var, gang_identity *id,
                            char *err, size_t errlen)
{
    if (p->nnodes != 1 && p->nnodes != size) {
        gang_set_err(err, errlen, "%s=%lld disagrees with --nnodes %lld", var, (long long)size,
                     (long long)p->nnodes);
        return GANG_EUSAGE;
    }
    id->nnodes = (int32_t)size;
    return 0;
}

/*
 * Reads an index or size variable with a message that names it. [lo, hi] bounds the value;
 * the message says what the bound means (the caller knows whether it is a group size).
 */
static int env_index(char *const *envp, const char *var, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen)
{
    const char *s = env_get(envp, var);
    int rc;

    if (s == NULL) {
        gang_set_err(err, errlen, "%s is not set (or empty)", var);
        return GANG_EUSAGE;
    }
    rc = parse_index(s, lo, hi, out);
    if (rc == GANG_EINVAL) {
        gang_set_err(err, errlen, "%s='%s' is not a non-negative decimal integer", var, s);
        return GANG_EUSAGE;
    }
    if (rc < 0) {
        gang_set_err(err, errlen, "%s=%s is outside [%lld, %lld]", var, s, (long long)lo,
                     (long long)hi);
        return GANG_EUSAGE;
    }
    return 0;
}

/*
 * The StatefulSet naming rule: a Pod's host name is NAME-ORDINAL (only its first DNS
 * label counts, so a Pod with setHostnameAsFQDN works too). Splits it into the NAME part
 * (written to name, capacity namecap) and the ordinal. Returns 0 or GANG_EUSAGE.
 */
static int split_ordinal(const char *hostname, char *name, size_t namecap, int64_t *ordinal,
                         char *err, size_t errlen)
{
    size_t len, dash, i;

    if (hostname == NULL || hostname[0] == '\0') {
        gang_set_err(err, errlen,
                     "no host name to derive the StatefulSet ordinal from (pass --hostname)");
        return GANG_EUSAGE;
    }
    len = strcspn(hostname, ".");
    for (i = len; i > 0 && hostname[i - 1] >= '0' && hostname[i - 1] <= '9'; i--)
        ;
    if (i == len || i < 2 || hostname[i - 1] != '-' || len - i > 9) {
        gang_set_err(err, errlen,
                     "host name '%s' is not NAME-ORDINAL as in a StatefulSet Pod (set --hostname "
                     "or GANGLION_HOSTNAME, or pass --coordinator HOST:PORT)",
                     hostname);
        return GANG_EUSAGE;
    }
    dash = i - 1;
    if (dash >= namecap) {
        gang_set_err(err, errlen, "host name '%s' is too long", hostname);
        return GANG_EUSAGE;
    }
    memcpy(name, hostname, dash);
    name[dash] = '\0';
    /* The digit run is at most 9 characters long, so this cannot fail. */
    *ordinal = 0;
    for (; i < len; i++)
        *ordinal = *ordinal * 10 + (hostname[i] - '0');
    return 0;
}

/*
 * Builds NAME-0.SERVICE.NAMESPACE.svc.DOMAIN (without ".DOMAIN" when the domain is empty,
 * leaving the rest to the resolver's search path) and the port from --rdzv-port.
 */
static int statefulset_coordinator(const gang_params *p, char *const *envp, const char *name,
                                   gang_identity *id, char *err, size_t errlen)
{
    const char *ns = p->namespace_[0] != '\0' ? p->namespace_ : env_get(envp, "POD_NAMESPACE");
    int n;

    if (ns == NULL)
        ns = "default";
    if (p->cluster_domain[0] != '\0')
        n = snprintf(id->coordinator_host, sizeof(id->coordinator_host), "%s-0.%s.%s.svc.%s", name,
                     p->service, ns, p->cluster_domain);
    else
        n = snprintf(id->coordinator_host, sizeof(id->coordinator_host), "%s-0.%s.%s.svc", name,
                     p->service, ns);
    if (n < 0 || (size_t)n >= sizeof(id->coordinator_host)) {
        gang_set_err(
            err, errlen,
            "coordinator name for StatefulSet '%s', service '%s', namespace '%s' is longer "
            "than %d bytes",
            name, p->service, ns, GANG_HOST_MAX - 1);
        return GANG_EUSAGE;
    }
    return coordinator_port_from_param(p, id, err, errlen);
}

static const char *effective_hostname(const gang_params *p, const char *hostname)
{
    return p->hostname[0] != '\0' ? p->hostname : hostname;
}

/* Source 1: --node-index given explicitly. */
static int from_flags(const gang_params *p, char *const *envp, const char *hostname,
                      gang_identity *id, char *err, size_t errlen)
{
    id->source = GANG_ID_FLAGS;
    id->node_index = (int32_t)p->node_index;
    id->nnodes = (int32_t)p->nnodes;
    if (p->node_index >= p->nnodes) {
        gang_set_err(err, errlen, "--node-index %lld is outside [0, --nnodes %lld)",
                     (long long)p->node_index, (long long)p->nnodes);
        return GANG_EUSAGE;
    }
    if (p->coordinator[0] != '\0')
        return coordinator_from_flag(p, id, "with --node-index", err, errlen);
    if (p->service[0] != '\0') {
        char name[GANG_HOST_MAX];
        int64_t ordinal;
        int rc = split_ordinal(effective_hostname(p, hostname), name, sizeof(name), &ordinal, err,
                               errlen);

        if (rc < 0)
            return rc;
        return statefulset_coordinator(p, envp, name, id, err, errlen);
    }
    if (p->node_index == 0) {
        /*
         * Node 0 hosts the coordinator itself. A wildcard bind address is not something
         * to dial, so loopback stands in for it; a specific one is used as is.
         */
        const char *b = p->bind_address;
        const char *host =
            (b[0] == '\0' || strcmp(b, "0.0.0.0") == 0 || strcmp(b, "::") == 0) ? "127.0.0.1" : b;

        if (gang_strlcpy(id->coordinator_host, host, sizeof(id->coordinator_host)) < 0) {
            gang_set_err(err, errlen, "--bind-address '%s' is too long", b);
            return GANG_EUSAGE;
        }
        return coordinator_port_from_param(p, id, err, errlen);
    }
    gang_set_err(err, errlen,
                 "--node-index %lld needs the coordinator's address: pass --coordinator HOST:PORT "
                 "(or --service for a StatefulSet)",
                 (long long)p->node_index);
    return GANG_EUSAGE;
}

/* Source 2: Open MPI's per-process variables, one agent per MPI process. */
static int from_mpi(const gang_params *p, char *const *envp, gang_identity *id, char *err,
                    size_t errlen)
{
    int64_t rank, size;
    int rc;

    id->source = GANG_ID_MPI;
    rc = env_index(envp, "OMPI_COMM_WORLD_SIZE", 1, IDENTITY_MAX_NODES, &size, err, errlen);
    if (rc < 0)
        return rc;
    rc = env_index(envp, "OMPI_COMM_WORLD_RANK", 0, size - 1, &rank, err, errlen);
    if (rc < 0)
        return rc;
    id->node_index = (int32_t)rank;
    rc = reconcile_nnodes(p, size, "OMPI_COMM_WORLD_SIZE", id, err, errlen);
    if (rc < 0)
        return rc;
    /* mpirun tells us who we are but not where rank 0's agent listens. */
    if (p->coordinator[0] == '\0') {
        gang_set_err(err, errlen,
                     "OMPI_COMM_WORLD_RANK is set, but the coordinator is unknown: under mpirun "
                     "pass --coordinator HOST:PORT (or GANGLION_COORDINATOR)");
        return GANG_EUSAGE;
    }
    return coordinator_from_flag(p, id, "under mpirun", err, errlen);
}

/* Source 3: a LeaderWorkerSet group; the leader (worker index 0) is the coordinator. */
static int from_lws(const gang_params *p, char *const *envp, gang_identity *id, char *err,
                    size_t errlen)
{
    const char *leader;
    int64_t index, size;
    int rc;

    id->source = GANG_ID_LWS;
    rc = env_index(envp, "LWS_GROUP_SIZE", 1, IDENTITY_MAX_NODES, &size, err, errlen);
    if (rc < 0)
        return rc;
    rc = env_index(envp, "LWS_WORKER_INDEX", 0, size - 1, &index, err, errlen);
    if (rc < 0)
        return rc;
    id->node_index = (int32_t)index;
    rc = reconcile_nnodes(p, size, "LWS_GROUP_SIZE", id, err, errlen);
    if (rc < 0)
        return rc;
    if (p->coordinator[0] != '\0')
        return coordinator_from_flag(p, id, "overriding LWS_LEADER_ADDRESS", err, errlen);
    leader = env_get(envp, "LWS_LEADER_ADDRESS");
    if (leader == NULL) {
        gang_set_err(err, errlen, "LWS_LEADER_ADDRESS is not set (or empty)");
        return GANG_EUSAGE;
    }
    if (strpbrk(leader, " \t\r\n/[]") != NULL ||
        gang_strlcpy(id->coordinator_host, leader, sizeof(id->coordinator_host)) < 0) {
        gang_set_err(err, errlen, "LWS_LEADER_ADDRESS='%s' is not a host name or address", leader);
        return GANG_EUSAGE;
    }
    return coordinator_port_from_param(p, id, err, errlen);
}

/* Source 4: a StatefulSet Pod behind a headless Service. */
static int from_statefulset(const gang_params *p, char *const *envp, const char *hostname,
                            gang_identity *id, char *err, size_t errlen)
{
    char name[GANG_HOST_MAX];
    int64_t ordinal;
    int rc;

    id->source = GANG_ID_STATEFULSET;
    rc = split_ordinal(effective_hostname(p, hostname), name, sizeof(name), &ordinal, err, errlen);
    if (rc < 0)
        return rc;
    if (ordinal >= p->nnodes) {
        gang_set_err(err, errlen,
                     "StatefulSet ordinal %lld (host name '%s') is outside [0, --nnodes %lld): set "
                     "--nnodes (GANGLION_NNODES) to the number of replicas",
                     (long long)ordinal, effective_hostname(p, hostname), (long long)p->nnodes);
        return GANG_EUSAGE;
    }
    id->node_index = (int32_t)ordinal;
    id->nnodes = (int32_t)p->nnodes;
    if (p->coordinator[0] != '\0')
        return coordinator_from_flag(p, id, "overriding the StatefulSet rule", err, errlen);
    return statefulset_coordinator(p, envp, name, id, err, errlen);
}

/*
 * See rendezvous.h. Sources are tried in order: flags (--node-index >= 0), MPI (either
 * OMPI_COMM_WORLD_RANK or _SIZE present), LeaderWorkerSet (any of the three LWS_*
 * variables present), StatefulSet (--service set). An explicit --coordinator always
 * overrides the address a source would derive. On error *id is left zeroed apart from
 * the source that was being tried.
 */
int gang_identity_discover(const gang_params *p, char *const *envp, const char *hostname,
                           gang_identity *id, char *err, size_t errlen)
{
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (p == NULL || id == NULL) {
        gang_set_err(err, errlen, "internal: no parameters or identity to fill");
        return GANG_EINVAL;
    }
    memset(id, 0, sizeof(*id));
    if (p->node_index >= 0)
        rc = from_flags(p, envp, hostname, id, err, errlen);
    else if (env_get(envp, "OMPI_COMM_WORLD_RANK") != NULL ||
             env_get(envp, "OMPI_COMM_WORLD_SIZE") != NULL)
        rc = from_mpi(p, envp, id, err, errlen);
    else if (env_get(envp, "LWS_WORKER_INDEX") != NULL || env_get(envp, "LWS_GROUP_SIZE") != NULL ||
             env_get(envp, "LWS_LEADER_ADDRESS") != NULL)
        rc = from_lws(p, envp, id, err, errlen);
    else if (p->service[0] != '\0')
        rc = from_statefulset(p, envp, hostname, id, err, errlen);
    else {
        gang_set_err(err, errlen,
                     "cannot tell which node this is: pass --node-index and --coordinator, run "
                     "under mpirun, in a LeaderWorkerSet, or in a StatefulSet with --service "
                     "(GANGLION_SERVICE)");
        return GANG_EUSAGE;
    }
    if (rc < 0) {
        gang_identity_source src = id->source;

        memset(id, 0, sizeof(*id));
        id->source = src;
        return rc;
    }
    id->is_coordinator = id->node_index == 0;
    return 0;
}
