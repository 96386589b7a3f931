/*
 * Replicas found by DNS (--replicas-dns NAME:PORT,...): every IPv4 address of NAME is one
 * replica, as a headless Service lists the Ready Pods it selects (one Pod 0 per gang, or
 * one leader per LeaderWorkerSet group). Each name is resolved again every
 * --dns-interval-ms on libuv's thread pool, so a gang added, removed or restarted with a
 * new address is followed without restarting the router.
 *
 * Reconciling keeps the router's replica slots stable: an address that stays keeps its
 * slot (its block table, its counters); a new address takes a free slot (one whose
 * address went away and that has no call in flight, else a new one, up to
 * GANG_ROUTER_MAX_REPLICAS); an address that went away makes its slot inactive and down,
 * which moves its unanswered calls elsewhere. A failed resolution changes nothing: a DNS
 * outage must not take every replica away.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "router-internal.h"

int gang__router_dns_parse(router *r, const gang_opt_cmd *cmd)
{
    char *copy = strdup(r->o.replicas_dns), *save = NULL;
    int rc = 0;
    /* Fixed room: each entry's work request points at the entry itself. */
    r->dns = calloc(ROUTER_DNS_MAX_NAMES, sizeof(*r->dns));
    if (copy == NULL || r->dns == NULL) {
        free(copy);
        return GANG_ENOMEM;
    }
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(t, ':');
        long port = colon != NULL ? strtol(colon + 1, NULL, 10) : 0;
        if (r->ndns == ROUTER_DNS_MAX_NAMES || colon == NULL || colon == t ||
            (size_t)(colon - t) >= ROUTER_HOST_MAX || port < 1 || port > 65535) {
            rc =
                gang_opts_usage_error(cmd, "--replicas-dns: '%s' is not NAME:PORT (at most 16)", t);
            break;
        }
        router_dns *d = &r->dns[r->ndns];
        d->r = r;
        d->index = r->ndns++;
        memcpy(d->host, t, (size_t)(colon - t));
        d->port = (int)port;
        d->work.data = d;
    }
    free(copy);
    return rc;
}

/* Pool thread: every IPv4 address of the name, deduplicated. */
static void dns_work(uv_work_t *w)
{
    router_dns *d = w->data;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    d->naddrs = 0;
    d->err = getaddrinfo(d->host, NULL, &hints, &ai) != 0 ? GANG_ERESOLVE : 0;
    for (struct addrinfo *p = ai; p != NULL && d->naddrs < ROUTER_DNS_MAX_ADDRS; p = p->ai_next) {
        char a[64];
        int dup = 0;
        inet_ntop(AF_INET, &((struct sockaddr_in *)p->ai_addr)->sin_addr, a, sizeof a);
        for (uint32_t k = 0; k < d->naddrs; k++)
            dup |= strcmp(d->addrs[k], a) == 0;
        if (!dup)
            snprintf(d->addrs[d->naddrs++], sizeof d->addrs[0], "%s", a);
    }
    if (ai != NULL)
        freeaddrinfo(ai);
}

/* A slot for a new address of d: a free one of any name, else a new one; NULL when full. */
static router_replica *free_slot(router *r)
{
    for (uint32_t i = 0; i < r->nreps; i++) {
        router_replica *rep = &r->reps[i];
        if (!rep->active && rep->dns >= 0 && rep->inflight == 0 && !rep->polling)
            return rep;
    }
    if (r->nreps == GANG_ROUTER_MAX_REPLICAS)
        return NULL;
    router_replica *rep = &r->reps[r->nreps];
    rep->index = r->nreps++;
    return rep;
}

/* Loop thread: the slots of d follow its addresses. */
static void dns_done(uv_work_t *w, int status)
{
    router_dns *d = w->data;
    router *r = d->r;
    d->busy = 0;
    if (status != 0 || r->stopping || d->err != 0)
        return;
    int found[ROUTER_DNS_MAX_ADDRS] = {0};
    for (uint32_t i = 0; i < r->nreps; i++) {
        router_replica *rep = &r->reps[i];
        if (!rep->active || rep->dns != (int32_t)d->index)
            continue;
        int keep = 0;
        for (uint32_t k = 0; k < d->naddrs && !keep; k++) {
            if (strcmp(rep->host, d->addrs[k]) == 0)
                keep = found[k] = 1;
        }
        if (!keep) {
            gang__router_set_up(r, i, 0, "its address left the DNS name");
            rep->active = 0;
            gang_info("router: replica %s left %s", rep->name, d->host);
        }
    }
    for (uint32_t k = 0; k < d->naddrs; k++) {
        if (found[k])
            continue;
        router_replica *rep = free_slot(r);
        if (rep == NULL) {
            gang_warn("router: %s has more addresses than %u replicas", d->host,
                      GANG_ROUTER_MAX_REPLICAS);
            break;
        }
        uint32_t index = rep->index;
        memset(rep, 0, sizeof(*rep));
        rep->r = r;
        rep->index = index;
        rep->active = 1;
        rep->dns = (int32_t)d->index;
        rep->kv_free = UINT32_MAX; /* (until its first poll) */
        rep->port = d->port;
        rep->work.data = rep;
        snprintf(rep->host, sizeof rep->host, "%s", d->addrs[k]);
        snprintf(rep->name, sizeof rep->name, "%s:%d", rep->host, rep->port);
        gang__router_load_changed(r, index);
        gang_info("router: replica %s found in %s", rep->name, d->host);
    }
}

static void on_dns_timer(uv_timer_t *t)
{
    router *r = t->data;
    for (uint32_t k = 0; k < r->ndns; k++) {
        router_dns *d = &r->dns[k];
        if (!d->busy && uv_queue_work(r->loop, &d->work, dns_work, dns_done) == 0)
            d->busy = 1;
    }
}

void gang__router_dns_start(router *r)
{
    uv_timer_init(r->loop, &r->dns_timer);
    r->dns_timer.data = r;
    if (r->ndns > 0)
        uv_timer_start(&r->dns_timer, on_dns_timer, 0, (uint64_t)r->o.dns_interval_ms);
}

void gang__router_dns_stop(router *r)
{
    uv_close((uv_handle_t *)&r->dns_timer, NULL);
}
