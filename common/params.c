/*
 * The parameter registry. params.def is expanded twice: once into the gang_params struct
 * (common.h) and once here into a table of descriptors with each field's offset, so
 * flags, environment twins, defaults, validation and --help all come from one list.
 */
#include <ctype.h>
#include <stddef.h>
#include <string.h>

#include "ganglion/common.h"

#define ENV_NAME_MAX 96

static const gang_param_info registry[] = {
#define GANG_PARAM_INT_(field, flag, def, lo, hi, help)                                    \
    {flag, GANG_PARAM_INT, #def, lo, hi, help, offsetof(gang_params, field)},
#define GANG_PARAM_STR_(field, flag, def, help)                                            \
    {flag, GANG_PARAM_STR, def, 0, 0, help, offsetof(gang_params, field)},
#define GANG_PARAM_BOOL_(field, flag, def, help)                                           \
    {flag, GANG_PARAM_BOOL, #def, 0, 1, help, offsetof(gang_params, field)},
#include "ganglion/params.def"
#undef GANG_PARAM_INT_
#undef GANG_PARAM_STR_
#undef GANG_PARAM_BOOL_
};
#define REGISTRY_LEN (sizeof(registry) / sizeof(registry[0]))

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

static const gang_param_info *find_param(const char *flag, size_t len)
{
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        if (strlen(registry[i].flag) == len && strncmp(registry[i].flag, flag, len) == 0)
            return &registry[i];
    }
    return NULL;
}

/* Parses value for the descriptor pi and stores it into p; a message goes to err. */
static int set_param(gang_params *p, const gang_param_info *pi, const char *value, char *err,
                     size_t errlen)
{
    char *base = (char *)p + pi->offset;
    switch (pi->type) {
    case GANG_PARAM_INT: {
        int64_t v;
        int rc = gang_parse_i64(value, pi->lo, pi->hi, &v);
        if (rc != 0) {
            snprintf(err, errlen, "--%s: '%s' is not an integer in [%lld, %lld]", pi->flag,
                     value, (long long)pi->lo, (long long)pi->hi);
            return GANG_EUSAGE;
        }
        *(int64_t *)(void *)base = v;
        return 0;
    }
    case GANG_PARAM_BOOL: {
        int v;
        if (strcmp(value, "1") == 0 || strcasecmp(value, "true") == 0 ||
            strcasecmp(value, "yes") == 0 || strcasecmp(value, "on") == 0)
            v = 1;
        else if (strcmp(value, "0") == 0 || strcasecmp(value, "false") == 0 ||
                 strcasecmp(value, "no") == 0 || strcasecmp(value, "off") == 0 || !*value)
            v = 0;
        else {
            snprintf(err, errlen, "--%s: '%s' is not a boolean (true/false)", pi->flag, value);
            return GANG_EUSAGE;
        }
        *(int *)(void *)base = v;
        return 0;
    }
    case GANG_PARAM_STR:
        if (gang_strlcpy(base, value, GANG_PARAM_STR_MAX) != 0) {
            snprintf(err, errlen, "--%s: value longer than %d bytes", pi->flag,
                     GANG_PARAM_STR_MAX - 1);
            return GANG_EUSAGE;
        }
        return 0;
    }
    snprintf(err, errlen, "--%s: unknown parameter type", pi->flag);
    return GANG_EINTERNAL;
}

void gang_params_defaults(gang_params *p)
{
    char err[64];
    memset(p, 0, sizeof(*p));
    for (size_t i = 0; i < REGISTRY_LEN; i++)
        set_param(p, &registry[i], registry[i].def, err, sizeof(err));
}

int gang_params_set(gang_params *p, const char *flag, const char *value, char *err,
                    size_t errlen)
{
    const gang_param_info *pi = find_param(flag, strlen(flag));
    if (pi == NULL) {
        snprintf(err, errlen, "unknown parameter --%s", flag);
        return GANG_EUSAGE;
    }
    return set_param(p, pi, value, err, errlen);
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
int gang_params_parse_args(gang_params *p, int argc, char **argv, char **rest, int *nrest,
                           char *err, size_t errlen)
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
            pi = find_param(a + 2, len);
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
        int rc = set_param(p, pi, value, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void gang_params_print_help(FILE *out)
{
    char name[ENV_NAME_MAX];
    for (size_t i = 0; i < REGISTRY_LEN; i++) {
        const gang_param_info *pi = &registry[i];
        gang_param_env_name(pi->flag, name, sizeof(name));
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s%s", pi->flag,
                 pi->type == GANG_PARAM_BOOL ? "" : (pi->type == GANG_PARAM_INT ? " N" : " S"));
        fprintf(out, "  %-30s %s [env %s, default '%s']\n", flag, pi->help, name, pi->def);
    }
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
        }
    }
}
