/*
 * ganglion generate: one prompt through a local gang, text or tokens printed.
 *
 *   ganglion generate --model DIR --tp N --pp M (--prompt TEXT | --chat QUESTION [--system S]
 *                     | --prompt-ids 1,2,3) [--max-tokens N] [--temperature T] [--top-k K]
 *                     [--top-p P] [--seed S] [serve flags]
 *
 * It starts `ganglion serve --local` (one node per pipeline stage, tp ranks each -- ep when
 * --ep is above --tp -- unless --nnodes / --nproc-per-node say otherwise) on free loopback
 * ports, waits for /readyz,
 * posts the prompt (--prompt and --prompt-ids to /v1/completions, --chat to
 * /v1/chat/completions through the model's chat template), and stops the gang. Text
 * prompts print the generated text; --prompt-ids prints the generated token ids on one
 * line and the server's JSON answer on the next. The gang's logs go to a temporary file
 * whose path is printed when anything fails.
 */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmds.h"
#include "ganglion/common.h"
#include "ganglion/serve.h"
#include "proc.h"

extern char **environ;

#define GEN_MAX_ARGS 96
#define GEN_BODY_MAX (1 << 20)
#define GEN_STOP_GRACE_MS 10000

/* generate's own flags; everything else is a serve flag passed to the gang. */
typedef struct gen_opts {
    char prompt_ids[GEN_BODY_MAX / 64];
    char prompt[GEN_BODY_MAX / 64];
    char chat[GEN_BODY_MAX / 64];
    char system[GEN_BODY_MAX / 64];
    int64_t max_tokens;
    char temperature[32], top_k[32], top_p[32], seed[32]; /* "" when not given */
    int verbose;
} gen_opts;

#define GEN_STR(f_, fld, hp) GANG_OPT_STR(gen_opts, f_, fld, "", hp)
static const gang_param_info gen_items[] = {
    GEN_STR("prompt", prompt, "a text prompt (completions; the text is printed)"),
    GEN_STR("chat", chat, "a question for the chat endpoint (the model's chat template)"),
    GEN_STR("system", system, "with --chat: a system message first"),
    GEN_STR("prompt-ids", prompt_ids, "the prompt's token ids, comma-separated"),
    {.flag = "max-tokens",
     .type = GANG_PARAM_INT,
     .def = "0",
     .lo = 0,
     .hi = 1 << 20,
     .help = "tokens to generate at most (0: 16 for --prompt-ids, 256 for text)",
     .offset = offsetof(gen_opts, max_tokens)},
    GEN_STR("temperature", temperature, "sampling temperature (the server's default)"),
    GEN_STR("top-k", top_k, "top-k sampling (the server's default)"),
    GEN_STR("top-p", top_p, "nucleus sampling (the server's default)"),
    GEN_STR("seed", seed, "sampling seed (the server's default)"),
    {.flag = "verbose",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "the gang's log on this terminal instead of a file",
     .offset = offsetof(gen_opts, verbose)},
};
static const gang_opt_table gen_table = GANG_OPT_TABLE(gen_items);
static const gang_opt_cmd gen_cmd = {
    "generate",
    "--model DIR [--tp N] [--pp M] (--prompt TEXT | --chat Q | --prompt-ids 1,2,3) [flags]",
    "Starts serve --local (one node per pipeline stage, tp ranks each, or ep when --ep is\n"
    "above --tp, unless --nnodes / --nproc-per-node say otherwise) on free loopback ports,\n"
    "posts the prompt (--chat to\n"
    "/v1/chat/completions, the others to /v1/completions), prints the generated text (with\n"
    "--prompt-ids: the token ids on one line and the server's JSON answer on the next),\n"
    "and stops the gang.",
    &gen_table, 1};

/* Adds key = the number in text to obj, unless text is empty (the server's default). */
static int gen_add_number(cJSON *obj, const char *key, const char *text, int integer)
{
    if (!text[0])
        return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(v) ||
        (integer && (v != floor(v) || fabs(v) > 9007199254740992.0)))
        return GANG_EUSAGE;
    return cJSON_AddNumberToObject(obj, key, v) ? 0 : GANG_ENOMEM;
}

/*
 * The completion request's body from o, written as JSON by cJSON (so no flag value can
 * change its shape): GANG_EUSAGE for a bad --prompt-ids list or a non-numeric sampling
 * flag, GANG_ERANGE when the body does not fit cap.
 */
static int gen_body(const gen_opts *o, char *body, size_t cap)
{
    static int64_t ids[GEN_BODY_MAX / 128];
    int rc = GANG_ENOMEM;
    int64_t max_tokens = o->max_tokens ? o->max_tokens : o->prompt_ids[0] ? 16 : 256;
    cJSON *req = cJSON_CreateObject();
    if (!req)
        goto out;
    if (o->chat[0]) {
        cJSON *msgs = cJSON_AddArrayToObject(req, "messages"), *m;
        if (o->system[0] && (!(m = cJSON_CreateObject()) || !cJSON_AddItemToArray(msgs, m) ||
                             !cJSON_AddStringToObject(m, "role", "system") ||
                             !cJSON_AddStringToObject(m, "content", o->system)))
            goto out;
        if (!(m = cJSON_CreateObject()) || !cJSON_AddItemToArray(msgs, m) ||
            !cJSON_AddStringToObject(m, "role", "user") ||
            !cJSON_AddStringToObject(m, "content", o->chat))
            goto out;
    } else if (o->prompt[0]) {
        if (!cJSON_AddStringToObject(req, "prompt", o->prompt))
            goto out;
    } else {
        int n = gang_parse_i64_list(o->prompt_ids, 0, INT32_MAX, ids,
                                    (int)(sizeof(ids) / sizeof(ids[0])));
        cJSON *prompt = cJSON_AddArrayToObject(req, "prompt");
        if (n < 1) {
            rc = GANG_EUSAGE;
            goto out;
        }
        for (int i = 0; i < n; i++) {
            cJSON *id = cJSON_CreateNumber((double)ids[i]);
            if (!prompt || !id || !cJSON_AddItemToArray(prompt, id))
                goto out;
        }
    }
    if (!cJSON_AddNumberToObject(req, "max_tokens", (double)max_tokens))
        goto out;
    if ((rc = gen_add_number(req, "temperature", o->temperature, 0)) != 0 ||
        (rc = gen_add_number(req, "top_k", o->top_k, 1)) != 0 ||
        (rc = gen_add_number(req, "top_p", o->top_p, 0)) != 0 ||
        (rc = gen_add_number(req, "seed", o->seed, 1)) != 0)
        goto out;
    rc = cJSON_PrintPreallocated(req, body, (int)(cap > INT32_MAX ? INT32_MAX : cap), 0)
             ? 0
             : GANG_ERANGE;
out:
    cJSON_Delete(req);
    return rc;
}

/*
 * Parses the command line: generate's table, the rest serve flags (into p, after the
 * environment, and into pass[] for the gang, minus --local). Returns 0, GANG_OPTS_HELP or
 * GANG_EUSAGE (printed).
 */
static int gen_parse(int argc, char **argv, gen_opts *o, gang_params *p, char **pass, int *npass,
                     int *layout_given)
{
    char **rest = calloc((size_t)argc + 1, sizeof(*rest));
    char err[256];
    int nrest = 0, rc;

    if (rest == NULL)
        return GANG_ENOMEM;
    rc = gang_opts_cli(&gen_cmd, o, argc, argv, rest, &nrest);
    if (rc != 0)
        goto out;
    *npass = 0;
    for (int i = 0; i < nrest; i++) {
        if (strcmp(rest[i], "--local") == 0)
            continue; /* always local */
        if (strncmp(rest[i], "--nnodes", 8) == 0)
            layout_given[0] = 1;
        if (strncmp(rest[i], "--nproc-per-node", 16) == 0)
            layout_given[1] = 1;
        if (*npass + 16 >= GEN_MAX_ARGS) {
            rc = gang_opts_usage_error(&gen_cmd, "too many arguments");
            goto out;
        }
        pass[(*npass)++] = rest[i];
    }
    rc = gang_params_load(p, environ, *npass, pass, NULL, NULL, err, sizeof(err));
    if (rc != 0)
        rc = gang_opts_usage_error(&gen_cmd, "%s", err);
    else if (!!o->prompt_ids[0] + !!o->prompt[0] + !!o->chat[0] != 1)
        rc = gang_opts_usage_error(&gen_cmd, "give one of --prompt, --chat and --prompt-ids");
    else if (o->system[0] && !o->chat[0])
        rc = gang_opts_usage_error(&gen_cmd, "--system goes with --chat");
    else if (p->model[0] == '\0')
        rc = gang_opts_usage_error(&gen_cmd, "--model DIR is required");
out:
    free(rest);
    return rc;
}

/*
 * Starts `serve --local` on fresh ports with the effective parameters p (forwarded by
 * gang_params_forward_args, as local mode hands them to its agents): one node per
 * pipeline stage and tp ranks each unless --nnodes / --nproc-per-node were given. The
 * gang's output goes to logfd.
 */
static int gen_start(const gang_params *p, const int *layout_given, int logfd, int *http_port,
                     pid_t *child)
{
    int ports[2];
    char **args = NULL;
    int na = 0;
    gang_params q = *p;
    gang_args fwd = {NULL, 0};

    if (gang_proc_pick_ports(2, ports) != 0) {
        fprintf(stderr, "ganglion generate: no free loopback port\n");
        return GANG_EAGAIN;
    }
    *http_port = ports[0];
    q.http_port = ports[0];
    q.rdzv_port = ports[1];
    if (!layout_given[0])
        q.nnodes = q.pp;
    if (!layout_given[1]) /* a stage: the TP group, or the EP group when --ep is wider */
        q.nproc_per_node = q.ep > q.tp ? q.ep : q.tp;
    int rc = gang_params_forward_args(&q, NULL, &fwd);
    if (rc == 0 && (args = calloc((size_t)fwd.argc + 4, sizeof(*args))) == NULL)
        rc = GANG_ENOMEM;
    if (rc != 0)
        goto out_free;
    args[na++] = "ganglion";
    args[na++] = "serve";
    args[na++] = "--local";
    for (int i = 0; i < fwd.argc; i++)
        args[na++] = fwd.argv[i];
    args[na] = NULL;
    gang_spawn sp = {.path = "/proc/self/exe", .out_fd = logfd, .err_fd = logfd, .close_fd = -1};
    rc = gang_proc_spawn(args, &sp, child);
    if (rc != 0)
        fprintf(stderr, "ganglion generate: fork: %s\n", gang_strerror(rc));
out_free:
    free(args);
    gang_args_free(&fwd);
    return rc;
}

/* One request to the gang on 127.0.0.1:port: the status code (body in *out), or < 0. */
static int gen_http(int port, const char *method, const char *path, const char *body,
                    int timeout_ms, char **out)
{
    int status = 0;
    *out = NULL;
    int rc = gang_http_fetch("127.0.0.1", port, method, path, body, timeout_ms, &status, out);
    return rc != 0 ? rc : status;
}

/*
 * Waits for /readyz (or the gang's early exit), posts the completion and prints the
 * tokens and the answer. Returns the exit code; *child becomes 0 once reaped.
 */
static int gen_run(const gang_params *p, const gen_opts *o, const char *body, int http_port,
                   pid_t *child, const char *logpath)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)p->start_timeout_ms + 60000;
    int status = 0, ready = 0, rc;
    char *resp = NULL;

    while (!ready && gang_now_ms() < deadline) {
        if (waitpid(*child, &status, WNOHANG) == *child) {
            *child = 0;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : GANG_EXIT_INTERNAL;
            fprintf(stderr,
                    "ganglion generate: the gang exited with %d before serving; its "
                    "log: %s\n",
                    code, logpath);
            return code ? code : GANG_EXIT_INTERNAL;
        }
        ready = gen_http(http_port, "GET", "/readyz", NULL, 1000, &resp) == 200;
        free(resp);
        if (!ready)
            usleep(100 * 1000);
    }
    if (!ready) {
        fprintf(stderr,
                "ganglion generate: the gang did not become ready in time; its log: "
                "%s\n",
                logpath);
        return GANG_EXIT_TEMPFAIL;
    }
    rc = gen_http(http_port, "POST", o->chat[0] ? "/v1/chat/completions" : "/v1/completions", body,
                  (int)p->request_timeout_ms + 5000, &resp);
    if (rc != 200) {
        fprintf(stderr, "ganglion generate: the completion failed (%d): %s\nits log: %s\n", rc,
                rc > 0 && resp ? resp : gang_strerror(rc), logpath);
        free(resp);
        return rc == 400 ? GANG_EXIT_USAGE : GANG_EXIT_TEMPFAIL;
    }
    cJSON *a = cJSON_Parse(resp);
    cJSON *ch = a ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "choices"), 0) : NULL;
    cJSON *toks = ch ? cJSON_GetObjectItemCaseSensitive(ch, "tokens") : NULL;
    cJSON *text = !ch          ? NULL
                  : o->chat[0] ? cJSON_GetObjectItemCaseSensitive(
                                     cJSON_GetObjectItemCaseSensitive(ch, "message"), "content")
                  : o->prompt[0] ? cJSON_GetObjectItemCaseSensitive(ch, "text")
                                 : NULL;
    int code = GANG_EXIT_TEMPFAIL;
    if (!o->prompt_ids[0] && cJSON_IsString(text)) {
        printf("%s\n", text->valuestring);
        code = GANG_EXIT_OK;
    } else if (o->prompt_ids[0] && cJSON_IsArray(toks)) {
        const cJSON *t;
        int first = 1;
        cJSON_ArrayForEach(t, toks)
        {
            printf("%s%d", first ? "" : " ", (int)t->valuedouble);
            first = 0;
        }
        printf("\n%s\n", resp);
        code = GANG_EXIT_OK;
    } else {
        fprintf(stderr, "ganglion generate: unexpected answer: %s\n", resp);
    }
    cJSON_Delete(a);
    free(resp);
    return code;
}

int gang_cmd_generate(int argc, char **argv)
{
    static gen_opts o;
    static char body[GEN_BODY_MAX / 8];
    char *pass[GEN_MAX_ARGS];
    int npass = 0, layout_given[2] = {0, 0}, http_port = 0;
    gang_params p;
    pid_t child;

    int rc = gen_parse(argc, argv, &o, &p, pass, &npass, layout_given);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    if (gen_body(&o, body, sizeof(body)) != 0) {
        gang_opts_usage_error(&gen_cmd, "--prompt-ids must be a comma-separated list of token "
                                        "ids; --temperature and --top-p numbers; --top-k and "
                                        "--seed integers (and everything must fit in 128 KiB)");
        return GANG_EXIT_USAGE;
    }
    char logpath[] = "/tmp/ganglion-generate-XXXXXX";
    int logfd = mkstemp(logpath);
    if (logfd < 0) {
        fprintf(stderr, "ganglion generate: cannot create a log file: %s\n", strerror(errno));
        return GANG_EXIT_TEMPFAIL;
    }
    rc = gen_start(&p, layout_given, o.verbose ? -1 : logfd, &http_port, &child);
    close(logfd);
    if (rc != 0)
        return GANG_EXIT_TEMPFAIL;
    int exit_code = gen_run(&p, &o, body, http_port, &child, logpath);
    if (child > 0)
        gang_proc_stop(&child, 1, 0, GEN_STOP_GRACE_MS, GEN_STOP_GRACE_MS);
    if (exit_code == GANG_EXIT_OK)
        unlink(logpath);
    return exit_code;
}
