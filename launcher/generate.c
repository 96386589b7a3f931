/*
 * ganglion generate: one prompt through a local gang, tokens printed.
 *
 *   ganglion generate --model DIR --tp N --pp M --prompt-ids 1,2,3 [--max-tokens 16]
 *                     [--temperature T] [--top-k K] [--top-p P] [--seed S] [serve flags]
 *
 * It starts `ganglion serve --local` (one node per pipeline stage, tp ranks each, unless
 * --nnodes / --nproc-per-node say otherwise) on free loopback ports, waits for /readyz,
 * posts the prompt to /v1/completions, prints the generated token ids on one line and the
 * server's JSON answer on the next, and stops the gang. The gang's logs go to a temporary
 * file whose path is printed when anything fails.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmds.h"
#include "ganglion/common.h"

extern char **environ;

#define GEN_MAX_ARGS 96
#define GEN_BODY_MAX (1 << 20)

/* A free TCP port on 127.0.0.1 (bound once, then released), or -1. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/*
 * One HTTP/1.1 exchange with 127.0.0.1:port (Connection: close), bounded by timeout_ms.
 * Returns the status code and the body in out[0..cap) (NUL-terminated), or a negative
 * error (connection refused while the gang starts, timeout).
 */
static int http_do(int port, const char *method, const char *path, const char *body, char *out,
                   size_t cap, int timeout_ms)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gang_err_from_errno(errno);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        rc = gang_err_from_errno(errno);
        goto out;
    }
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    if (write(fd, head, (size_t)hl) != hl || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        rc = GANG_EIO;
        goto out;
    }
    size_t got = 0;
    for (;;) {
        uint64_t now = gang_now_ms();
        if (now >= deadline) {
            rc = GANG_ETIMEDOUT;
            goto out;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) <= 0)
            continue;
        ssize_t n = read(fd, out + got, cap - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || got + (size_t)n >= cap - 1) {
            if (n > 0)
                got += (size_t)n;
            break;
        }
        got += (size_t)n;
    }
    out[got] = '\0';
    int status = 0;
    if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) {
        rc = GANG_EPROTO;
        goto out;
    }
    char *b = strstr(out, "\r\n\r\n");
    if (b != NULL)
        memmove(out, b + 4, strlen(b + 4) + 1);
    rc = status;
out:
    close(fd);
    return rc;
}

/* Parses "1,2,3" into a JSON array text appended to buf; 0 or -1 for a bad list. */
static int ids_to_json(const char *list, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    const char *p = list;
    int count = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0'))
            return -1;
        n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "%s%ld", count ? "," : "", v);
        count++;
        p = *end == ',' ? end + 1 : end;
        if (n >= cap)
            return -1;
    }
    if (count == 0 || n + 2 > cap)
        return -1;
    buf[n++] = ']';
    buf[n] = '\0';
    return 0;
}

static int usage_error(const char *msg)
{
    fprintf(stderr,
            "ganglion generate: %s\n"
            "usage: ganglion generate --model DIR [--tp N] [--pp M] --prompt-ids 1,2,3 "
            "[--max-tokens 16] [--temperature T] [--top-k K] [--top-p P] [--seed S] "
            "[serve flags]\n",
            msg);
    return GANG_EXIT_USAGE;
}

int gang_cmd_generate(int argc, char **argv)
{
    const char *ids = NULL, *max_tokens = "16", *temperature = NULL, *top_k = NULL, *top_p = NULL,
               *seed = NULL;
    char *pass[GEN_MAX_ARGS];
    int npass = 0;
    int nnodes_given = 0, nproc_given = 0, verbose = 0;
    for (int i = 1; i < argc; i++) {
        const char **dst = NULL;
        if (strcmp(argv[i], "--prompt-ids") == 0)
            dst = &ids;
        else if (strcmp(argv[i], "--max-tokens") == 0)
            dst = &max_tokens;
        else if (strcmp(argv[i], "--temperature") == 0)
            dst = &temperature;
        else if (strcmp(argv[i], "--top-k") == 0)
            dst = &top_k;
        else if (strcmp(argv[i], "--top-p") == 0)
            dst = &top_p;
        else if (strcmp(argv[i], "--seed") == 0)
            dst = &seed;
        if (dst != NULL) {
            if (i + 1 >= argc)
                return usage_error("a flag is missing its value");
            *dst = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "--verbose") == 0) {
            verbose = 1;
            continue;
        }
        if (strcmp(argv[i], "--local") == 0)
            continue; /* always local */
        if (strncmp(argv[i], "--nnodes", 8) == 0)
            nnodes_given = 1;
        if (strncmp(argv[i], "--nproc-per-node", 16) == 0)
            nproc_given = 1;
        if (npass + 16 >= GEN_MAX_ARGS)
            return usage_error("too many arguments");
        pass[npass++] = argv[i];
    }
    if (ids == NULL)
        return usage_error("--prompt-ids is required");

    /* The effective parameters, to derive the default node layout. */
    gang_params p;
    char err[256];
    gang_params_defaults(&p);
    int rc = gang_params_from_env(&p, environ, err, sizeof(err));
    if (rc == 0)
        rc = gang_params_parse_args(&p, npass, pass, NULL, NULL, err, sizeof(err));
    if (rc != 0)
        return usage_error(err);
    if (p.model[0] == '\0')
        return usage_error("--model DIR is required");

    char body[GEN_BODY_MAX / 8];
    char prompt[GEN_BODY_MAX / 8];
    if (ids_to_json(ids, prompt, sizeof(prompt)) != 0)
        return usage_error("--prompt-ids must be a comma-separated list of token ids");
    int bl = snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%s", prompt, max_tokens);
    if (temperature)
        bl += snprintf(body + bl, sizeof(body) - (size_t)bl, ",\"temperature\":%s", temperature);
    if (top_k)
        bl += snprintf(body + bl, sizeof(body) - (size_t)bl, ",\"top_k\":%s", top_k);
    if (top_p)
        bl += snprintf(body + bl, sizeof(body) - (size_t)bl, ",\"top_p\":%s", top_p);
    if (seed)
        bl += snprintf(body + bl, sizeof(body) - (size_t)bl, ",\"seed\":%s", seed);
    snprintf(body + bl, sizeof(body) - (size_t)bl, "}");

    int http_port = free_port(), rdzv_port = free_port();
    if (http_port < 0 || rdzv_port < 0) {
        fprintf(stderr, "ganglion generate: no free loopback port\n");
        return GANG_EXIT_TEMPFAIL;
    }
    char a_http[32], a_rdzv[32], a_nnodes[32], a_nproc[32];
    snprintf(a_http, sizeof(a_http), "--http-port=%d", http_port);
    snprintf(a_rdzv, sizeof(a_rdzv), "--rdzv-port=%d", rdzv_port);
    snprintf(a_nnodes, sizeof(a_nnodes), "--nnodes=%lld", (long long)p.pp);
    snprintf(a_nproc, sizeof(a_nproc), "--nproc-per-node=%lld", (long long)p.tp);
    char *args[GEN_MAX_ARGS + 8];
    int na = 0;
    args[na++] = "ganglion";
    args[na++] = "serve";
    args[na++] = "--local";
    for (int i = 0; i < npass; i++)
        args[na++] = pass[i];
    args[na++] = a_http;
    args[na++] = a_rdzv;
    if (!nnodes_given)
        args[na++] = a_nnodes;
    if (!nproc_given)
        args[na++] = a_nproc;
    args[na] = NULL;

    char logpath[] = "/tmp/ganglion-generate-XXXXXX";
    int logfd = mkstemp(logpath);
    if (logfd < 0) {
        fprintf(stderr, "ganglion generate: cannot create a log file: %s\n", strerror(errno));
        return GANG_EXIT_TEMPFAIL;
    }
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "ganglion generate: fork: %s\n", strerror(errno));
        close(logfd);
        return GANG_EXIT_TEMPFAIL;
    }
    if (child == 0) {
        if (!verbose)
            dup2(logfd, 1), dup2(logfd, 2);
        execv("/proc/self/exe", args);
        _exit(GANG_EXIT_INTERNAL);
    }
    close(logfd);

    int exit_code = GANG_EXIT_TEMPFAIL;
    static char resp[GEN_BODY_MAX];
    uint64_t deadline = gang_now_ms() + (uint64_t)p.start_timeout_ms + 60000;
    int status = 0, ready = 0;
    while (gang_now_ms() < deadline) {
        pid_t w = waitpid(child, &status, WNOHANG);
        if (w == child) {
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : GANG_EXIT_INTERNAL;
            fprintf(stderr,
                    "ganglion generate: the gang exited with %d before serving; its log: "
                    "%s\n",
                    code, logpath);
            return code ? code : GANG_EXIT_INTERNAL;
        }
        if (http_do(http_port, "GET", "/readyz", NULL, resp, sizeof(resp), 1000) == 200) {
            ready = 1;
            break;
        }
        usleep(100 * 1000);
    }
    if (!ready) {
        fprintf(stderr, "ganglion generate: the gang did not become ready in time; its log: %s\n",
                logpath);
        goto out_stop;
    }
    rc = http_do(http_port, "POST", "/v1/completions", body, resp, sizeof(resp),
                 (int)p.request_timeout_ms + 5000);
    if (rc != 200) {
        fprintf(stderr, "ganglion generate: the completion failed (%d): %s\nits log: %s\n", rc,
                rc > 0 ? resp : gang_strerror(rc), logpath);
        exit_code = rc == 400 ? GANG_EXIT_USAGE : GANG_EXIT_TEMPFAIL;
        goto out_stop;
    }
    cJSON *o = cJSON_Parse(resp);
    cJSON *ch = o ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0) : NULL;
    cJSON *toks = ch ? cJSON_GetObjectItemCaseSensitive(ch, "tokens") : NULL;
    if (!cJSON_IsArray(toks)) {
        fprintf(stderr, "ganglion generate: unexpected answer: %s\n", resp);
        cJSON_Delete(o);
        goto out_stop;
    }
    const cJSON *t;
    int first = 1;
    cJSON_ArrayForEach(t, toks)
    {
        printf("%s%d", first ? "" : " ", (int)t->valuedouble);
        first = 0;
    }
    printf("\n%s\n", resp);
    cJSON_Delete(o);
    exit_code = GANG_EXIT_OK;

out_stop:
    kill(child, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(child, &status, WNOHANG) == child)
            goto out_done;
        usleep(50 * 1000);
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
out_done:
    if (exit_code == GANG_EXIT_OK)
        unlink(logpath);
    return exit_code;
}
