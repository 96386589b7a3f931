/*
 * The parameter registry. params.def is expanded twice: once into the gang_params struct
 * (common.h) and once here into a table of descriptors with each field's offset, so
 * flags, environment twins, defaults, validation and --help all come from one list.
 */
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <math.h>
#include <strings.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/common.h"

#define ENV_NAME_MAX 96

static const gang_param_info registry[] = {
#define GANG_PARAM_INT_(field, flag, def, lo, hi, attr, help)                                      \
    {flag, GANG_PARAM_INT, #def, lo, hi, help, offsetof(gang_params, field), 0, 0, 0},
#define GANG_PARAM_STR_(field, flag, def, attr, help)                                              \
    {flag, GANG_PARAM_STR, def, 0, 0, help, offsetof(gang_params, field), 0, 0, 0},
#define GANG_PARAM_BOOL_(field, flag, def, attr, help)                                             \
    {flag, GANG_PARAM_BOOL, #def, 0, 1, help, offsetof(gang_params, field), 0, 0, 0},
#include "ganglion/params.def"
#undef GANG_PARAM_INT_
#undef GANG_PARAM_STR_
#undef GANG_PARAM_BOOL_
};
#define REGISTRY_LEN (sizeof(registry) / sizeof(registry[0]))

/* The attribute column, index for index with registry[] (kept out of gang_param_info so
 * that option tables, which have no such column, need not spell it). */
static const unsigned char registry_attr[] = {
#define GANG_PARAM_INT_(field, flag, def, lo, hi, attr, help) attr,
#define GANG_PARAM_STR_(field, flag, def, attr, help) attr,
#define GANG_PARAM_BOOL_(field, flag, def, attr, help) attr,
#include "ganglion/params.def"
#undef GANG_PARAM_INT_
#undef GANG_PARAM_STR_
#undef GANG_PARAM_BOOL_
};
_Static_assert(sizeof(registry_attr) == REGISTRY_LEN, "one attribute per registry entry");

/* Environment names are derived, not stored, so they can never disagree with the flag. */
void gang_param_env_name(const char *flag, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "GANGLION_");
    for (const char *f = flag; *f && n + 1 < cap; f++)
        out[n++] = *f == '-' ? '_' : (char)toupper((unsigned char)*f);
    out[n] = '\0';
}

const gang_param_info *gang_params_registry(size_t *count)
{
    *count = REGISTRY_LEN;
    return registry;
}

static const gang_opt_table params_table = {registry, REGISTRY_LEN};

const gang_param_info *gang_opts_find(const gang_opt_table *t, const char *flag, size_t len)
{
    for (size_t i = 0; i < t->count; i++) {
        if (strlen(t->items[i].flag) == len && strncmp(t->items[i].flag, flag, len) == 0)
            return &t->items[i];
    }
    return NULL;
}

static int set_bool(const gang_param_info *pi, const char *value, int *out, char *err,
                    size_t errlen)
{
    if (strcmp(value, "1") == 0 || strcasecmp(value, "true") == 0 ||
        strcasecmp(value, "yes") == 0 || strcasecmp(value, "on") == 0)
        *out = 1;
    else if (strcmp(value, "0") == 0 || strcasecmp(value, "false") == 0 ||
             strcasecmp(value, "no") == 0 || strcasecmp(value, "off") == 0 || !*value)
        *out = 0;
    else {
        snprintf(err, errlen, "--%s: '%s' is not a boolean (true/false)", pi->flag, value);
        return GANG_EUSAGE;
    }
    return 0;
}

static int set_double(const gang_param_info *pi, const char *value, double *out, char *err,
                      size_t errlen)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    int bounded = pi->dlo < pi->dhi;
    if (*value == '\0' || end == NULL || *end != '\0' || errno != 0 || !isfinite(v) ||
        (bounded && (v < pi->dlo || v > pi->dhi))) {
        if (bounded)
            snprintf(err, errlen, "--%s: '%s' is not a number in [%g, %g]", pi->flag, value,
                     pi->dlo, pi->dhi);
        else
            snprintf(err, errlen, "--%s: '%s' is not a number", pi->flag, value);
        return GANG_EUSAGE;
    }
    *out = v;
    return 0;
}

/* Parses value for the descriptor pi and stores it at base + pi->offset; err on failure. */
static int set_param(void *obj, const gang_param_info *pi, const char *value, char *err,
                     size_t errlen)
{
    char *base = (char *)obj + pi->offset;
    switch (pi->type) {
    case GANG_PARAM_INT: {
        int64_t v;
        int rc = gang_parse_i64(value, pi->lo, pi->hi, &v);
        if (rc != 0) {
            snprintf(err, errlen, "--%s: '%s' is not an integer in [%lld, %lld]", pi->flag, value,
                     (long long)pi->lo, (long long)pi->hi);
            return GANG_EUSAGE;
        }
        *(int64_t *)(void *)base = v;
        return 0;
    }
    case GANG_PARAM_BOOL:
        return set_bool(pi, value, (int *)(void *)base, err, errlen);
    case GANG_PARAM_DOUBLE:
        return set_double(pi, value, (double *)(void *)base, err, errlen);
    case GANG_PARAM_STR: {
        size_t cap = pi->str_cap ? pi->str_cap : GANG_PARAM_STR_MAX;
        if (gang_strlcpy(base, value, cap) != 0) {
            snprintf(err, errlen, "--%s: value longer than %zu bytes", pi->flag, cap - 1);
            return GANG_EUSAGE;
        }
        return 0;
    }
    }
    snprintf(err, errlen, "--%s: unknown parameter type", pi->flag);
    return GANG_EINTERNAL;
}

void gang_opts_defaults(const gang_opt_table *t, void *base)
{
    char err[128];
    for (size_t i = 0; i < t->count; i++) {
        if (t->items[i].type == GANG_PARAM_STR)
            *((char *)base + t->items[i].offset) = '\0';
        set_param(base, &t->items[i], t->items[i].def, err, sizeof(err));
    }
}

int gang_opts_set(const gang_opt_table *t, void *base, const char *flag, const char *value,
                  char *err, size_t errlen)
{
    const gang_param_info *pi = gang_opts_find(t, flag, strlen(flag));
    if (pi == NULL) {
        snprintf(err, errlen, "unknown parameter --%s", flag);
        return GANG_EUSAGE;
    }
    return set_param(base, pi, value, err, errlen);
}

int gang_param_env_bool(const char *flag, int *out)
{
    const gang_param_info *pi = gang_opts_find(&params_table, flag, strlen(flag));
    char name[96], err[160];
    const char *v;
    int b;

    if (pi == NULL || pi->type != GANG_PARAM_BOOL)
        return GANG_EINVAL;
    gang_param_env_name(flag, name, sizeof(name));
    if ((v = getenv(name)) == NULL)
        return 0;
    if (set_bool(pi, v, &b, err, sizeof(err)) != 0) {
        gang_warn("%s (%s): ignored", err, name);
        return GANG_EUSAGE;
    }
    *out = b;
    return 1;
}

void gang_params_defaults(gang_params *p)
{
    memset(p, 0, sizeof(*p));
    gang_opts_defaults(&params_table, p);
}

int gang_params_set(gang_params *p, const char *flag, const char *value, char *err, size_t errlen)
{
    return gang_opts_set(&params_table, p, flag, value, err, errlen);
}

int gang_params_from_env(gang_params *p, char *const *envp, char *err, size_t errlen)
{
    char name[ENV_NAME_MAX];
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        gang_param_env_name(registry[i].flag, name, sizeof(name));
        size_t nl = strlen(name);
        for (char *const *e = envp; e && *e; e++) {
            if (strncmp(*e, name, nl) == 0 && (*e)[nl] == '=') {
                int rc = set_param(p, &registry[i], *e + nl + 1, err, errlen);
                if (rc != 0) {
                    size_t used = strlen(err);
                    snprintf(err + used, errlen - used, " (from %s)", name);
                    return rc;
                }
            }
        }
    }
    return 0;
}

/*
 * Flags: "--name value", "--name=value", and "--name" alone for booleans (a boolean takes
 * a value only with '='). Positional arguments and unknown flags go to rest when the
 * caller accepts them; an unknown flag's value cannot be told apart from a positional
 * argument, so callers that accept rest parse it themselves.
 */
int gang_opts_parse_args(const gang_opt_table *t, void *base, int argc, char **argv, char **rest,
                         int *nrest, char *err, size_t errlen)
{
    if (nrest)
        *nrest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const gang_param_info *pi = NULL;
        const char *eq = NULL;
        if (strncmp(a, "--", 2) == 0 && a[2]) {
            eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            pi = gang_opts_find(t, a + 2, len);
        }
        if (pi == NULL) {
            if (rest == NULL) {
                snprintf(err, errlen, "unknown argument '%s' (see --help)", a);
                return GANG_EUSAGE;
            }
            rest[(*nrest)++] = argv[i];
            continue;
        }
        const char *value;
        if (eq)
            value = eq + 1;
        else if (pi->type == GANG_PARAM_BOOL)
            value = "1";
        else if (i + 1 < argc)
            value = argv[++i];
        else {
            snprintf(err, errlen, "--%s needs a value", pi->flag);
            return GANG_EUSAGE;
        }
        int rc = set_param(base, pi, value, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int gang_params_parse_args(gang_params *p, int argc, char **argv, char **rest, int *nrest,
                           char *err, size_t errlen)
{
    return gang_opts_parse_args(&params_table, p, argc, argv, rest, nrest, err, errlen);
}

int gang_params_load(gang_params *p, char *const *envp, int argc, char **argv, char **rest,
                     int *nrest, char *err, size_t errlen)
{
    gang_params_defaults(p);
    int rc = gang_params_from_env(p, envp, err, errlen);
    if (rc == 0)
        rc = gang_params_parse_args(p, argc, argv, rest, nrest, err, errlen);
    if (rc == 0)
        gang_dynlib_configure(p);
    return rc;
}

void gang_opts_print_help(const gang_opt_table *t, FILE *out, int with_env)
{
    static const char *const metavar[] = {" N", " S", "", " X"};
    char name[ENV_NAME_MAX];
    for (size_t i = 0; i < t->count; i++) {
        const gang_param_info *pi = &t->items[i];
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s%s", pi->flag, metavar[pi->type]);
        if (with_env) {
            gang_param_env_name(pi->flag, name, sizeof(name));
            fprintf(out, "  %-30s %s [env %s, default '%s']\n", flag, pi->help, name, pi->def);
        } else {
            fprintf(out, "  %-30s %s [default '%s']\n", flag, pi->help, pi->def);
        }
    }
}

void gang_params_print_help(FILE *out)
{
    gang_opts_print_help(&params_table, out, 1);
}

void gang_params_print_values(const gang_params *p, FILE *out)
{
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        const gang_param_info *pi = &registry[i];
        const char *base = (const char *)p + pi->offset;
        switch (pi->type) {
        case GANG_PARAM_INT:
            fprintf(out, "%s=%lld\n", pi->flag, (long long)*(const int64_t *)(const void *)base);
            break;
        case GANG_PARAM_BOOL:
            fprintf(out, "%s=%s\n", pi->flag, *(const int *)(const void *)base ? "true" : "false");
            break;
        case GANG_PARAM_STR:
            fprintf(out, "%s=%s\n", pi->flag, base);
            break;
        case GANG_PARAM_DOUBLE:
            fprintf(out, "%s=%g\n", pi->flag, *(const double *)(const void *)base);
            break;
        }
    }
}

/* ---------------------------------------------------------------------------------
 * Forwarding: the registry's GANG_PARAM_FWD entries as a child's command line.
 * --------------------------------------------------------------------------------- */

unsigned gang_param_attr(const gang_param_info *pi)
{
    if (pi < registry || pi >= registry + REGISTRY_LEN)
        return GANG_PARAM_NOFWD;
    return registry_attr[pi - registry];
}

static int flag_in(const char *flag, const char *const *list)
{
    for (; list && *list; list++) {
        if (strcmp(flag, *list) == 0)
            return 1;
    }
    return 0;
}

/* Writes "--flag=value" of registry[i] from p into out[cap] (cap 0: measure only). */
static int format_forwarded(const gang_params *p, size_t i, char *out, size_t cap)
{
    const gang_param_info *pi = &registry[i];
    const char *base = (const char *)p + pi->offset;
    switch (pi->type) {
    case GANG_PARAM_INT:
        return snprintf(out, cap, "--%s=%lld", pi->flag,
                        (long long)*(const int64_t *)(const void *)base);
    case GANG_PARAM_BOOL:
        return snprintf(out, cap, "--%s=%d", pi->flag, *(const int *)(const void *)base ? 1 : 0);
    case GANG_PARAM_DOUBLE: /* the registry has none; kept exact for the day it does */
        return snprintf(out, cap, "--%s=%.17g", pi->flag, *(const double *)(const void *)base);
    case GANG_PARAM_STR:
        break;
    }
    return snprintf(out, cap, "--%s=%s", pi->flag, base);
}

/*
 * Two passes over the registry: the first measures, the second writes the strings behind
 * the pointer array of the same allocation.
 */
int gang_params_forward_args(const gang_params *p, const char *const *omit, gang_args *out)
{
    size_t n = 0, bytes = 0;
    out->argv = NULL;
    out->argc = 0;
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        if (registry_attr[i] != GANG_PARAM_FWD || flag_in(registry[i].flag, omit))
            continue;
        n++;
        bytes += (size_t)format_forwarded(p, i, NULL, 0) + 1;
    }
    char **argv = malloc((n + 1) * sizeof(*argv) + bytes);
    if (argv == NULL)
        return GANG_ENOMEM;
    char *store = (char *)(argv + n + 1);
    size_t k = 0, left = bytes;
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        if (registry_attr[i] != GANG_PARAM_FWD || flag_in(registry[i].flag, omit))
            continue;
        size_t len = (size_t)format_forwarded(p, i, store, left) + 1;
        argv[k++] = store;
        store += len;
        left -= len;
    }
    argv[k] = NULL;
    out->argv = argv;
    out->argc = (int)k;
    return 0;
}

int gang_args_copy(const gang_args *src, gang_args *dst)
{
    size_t bytes = 0;
    dst->argv = NULL;
    dst->argc = 0;
    for (int i = 0; i < src->argc; i++)
        bytes += strlen(src->argv[i]) + 1;
    char **argv = malloc(((size_t)src->argc + 1) * sizeof(*argv) + bytes);
    if (argv == NULL)
        return GANG_ENOMEM;
    char *store = (char *)(argv + src->argc + 1);
    for (int i = 0; i < src->argc; i++) {
        size_t len = strlen(src->argv[i]) + 1;
        memcpy(store, src->argv[i], len);
        argv[i] = store;
        store += len;
    }
    argv[src->argc] = NULL;
    dst->argv = argv;
    dst->argc = src->argc;
    return 0;
}

void gang_args_free(gang_args *a)
{
    if (a == NULL)
        return;
    free(a->argv);
    a->argv = NULL;
    a->argc = 0;
}

/* ---------------------------------------------------------------------------------
 * Subcommand command lines over option tables.
 * --------------------------------------------------------------------------------- */

void gang_opts_cli_help(const gang_opt_cmd *cmd, FILE *out)
{
    fprintf(out, "usage: ganglion %s %s\n", cmd->name, cmd->synopsis ? cmd->synopsis : "");
    if (cmd->about != NULL)
        fprintf(out, "%s\n", cmd->about);
    if (cmd->table != NULL && cmd->table->count > 0) {
        fprintf(out, "\noptions:\n");
        gang_opts_print_help(cmd->table, out, 0);
    }
    if (cmd->serve_flags) {
        fprintf(out, "\nserve flags (each with an environment twin GANGLION_<FLAG>):\n");
        gang_params_print_help(out);
    }
}

int gang_opts_usage_error(const gang_opt_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    char msg[768];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (strstr(msg, "--help") != NULL)
        fprintf(stderr, "ganglion %s: %s\n", cmd->name, msg);
    else
        fprintf(stderr, "ganglion %s: %s (see ganglion %s --help)\n", cmd->name, msg, cmd->name);
    return GANG_EUSAGE;
}

int gang_opts_cli(const gang_opt_cmd *cmd, void *base, int argc, char **argv, char **rest,
                  int *nrest)
{
    static const gang_opt_table empty = {NULL, 0};
    const gang_opt_table *t = cmd->table ? cmd->table : &empty;
    char err[512];

    gang_opts_defaults(t, base);
    if (nrest)
        *nrest = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            gang_opts_cli_help(cmd, stdout);
            return GANG_OPTS_HELP;
        }
    }
    if (argc <= 1)
        return 0;
    if (gang_opts_parse_args(t, base, argc - 1, argv + 1, rest, nrest, err, sizeof(err)) != 0)
        return gang_opts_usage_error(cmd, "%s", err);
    return 0;
}

int gang_opts_choice(const char *flag, const char *value, const char *choices, char *err,
                     size_t errlen)
{
    size_t vl = strlen(value);
    int idx = 0;
    for (const char *c = choices; *c; idx++) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        if (cl == vl && strncmp(c, value, vl) == 0)
            return idx;
        c += cl + (bar != NULL);
    }
    snprintf(err, errlen, "--%s: '%s' is not one of %s", flag, value, choices);
    return GANG_EUSAGE;
}

int gang_parse_i64_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int cap)
{
    char tok[32];
    int n = 0;
    const char *p = s;

    if (*p == '\0')
        return GANG_EINVAL;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n >= cap || len == 0 || len >= sizeof(tok))
            return GANG_EINVAL;
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (gang_parse_i64(tok, lo, hi, &out[n]) != 0)
            return GANG_EINVAL;
        n++;
        if (comma == NULL)
            return n;
        p = comma + 1;
    }
}
