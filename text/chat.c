/*
 * Chat templates, the public side (include/ganglion/text.h): parsing a template,
 * loading it from tokenizer_config.json, rendering a conversation with the variables
 * transformers' apply_chat_template passes (messages, add_generation_prompt, tools and
 * documents as none, bos_token, eos_token), within step, output and memory budgets.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "chat-internal.h"

static void set_err(char *err, size_t errlen, const char *msg, const char *arg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s%s", msg, arg ? arg : "");
}

int gang_chat_template_parse(const char *src, size_t len, gang_chat_template **out, char *err,
                             size_t errlen)
{
    if (!src || !out) {
        set_err(err, errlen, "chat template: NULL argument", NULL);
        return GANG_EINVAL;
    }
    *out = NULL;
    if (len > GANG_CHAT_MAX_TEMPLATE_BYTES) {
        set_err(err, errlen, "chat template larger than the 1 MiB allowed", NULL);
        return GANG_EMODEL;
    }
    gang_chat_template *t = calloc(1, sizeof(*t));
    chat_tok *toks = NULL;
    size_t ntoks = 0, n = 0;
    int rc = GANG_ENOMEM;
    if (!t)
        goto out_nomem;
    /* jinja2 reads \r\n and \r as \n, and drops one final newline */
    char *s = gang__chat_alloc(&t->arena, len + 1);
    if (!s)
        goto out_nomem;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    if ((rc = gang__chat_lex(&t->arena, s, n, &toks, &ntoks, err, errlen)))
        goto out_free;
    if ((rc = gang__chat_parse_tokens(&t->arena, toks, ntoks, &t->root, err, errlen)))
        goto out_free;
    free(toks);
    *out = t;
    return 0;
out_nomem:
    set_err(err, errlen, "chat template: out of memory", NULL);
out_free:
    free(toks);
    gang_chat_template_free(t);
    return rc;
}

/*
 * Gives T the bos_token / eos_token texts a render uses when its options name none (as
 * _load reads them from tokenizer_config.json); T takes the malloc'd strings (either may
 * be NULL: none), freeing the ones it held. For the loaders of other formats (a GGUF
 * file's token ids, model/gguf-vocab.c).
 */
void gang_chat_template_set_tokens(gang_chat_template *t, char *bos, char *eos)
{
    free(t->bos);
    free(t->eos);
    t->bos = bos;
    t->eos = eos;
}

void gang_chat_template_free(gang_chat_template *t)
{
    if (!t)
        return;
    gang__chat_arena_free(&t->arena);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* Reads PATH whole (at most CHAT_MAX_CONFIG_BYTES) into a NUL-terminated buffer. */
static int read_file(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    int rc = 0;
    if (!f) {
        rc = errno == ENOENT ? GANG_ENOENT : GANG_EIO;
        set_err(err, errlen, rc == GANG_ENOENT ? "no such file: " : "cannot open ", path);
        return rc;
    }
    if (fstat(fileno(f), &st) || st.st_size < 0 || (size_t)st.st_size > CHAT_MAX_CONFIG_BYTES) {
        set_err(err, errlen, "missing, unreadable or larger than 32 MiB: ", path);
        rc = GANG_EMODEL;
        goto out_close;
    }
    *len = (size_t)st.st_size;
    if (!(*buf = malloc(*len + 1))) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    if (fread(*buf, 1, *len, f) != *len) {
        set_err(err, errlen, "short read: ", path);
        free(*buf);
        *buf = NULL;
        rc = GANG_EIO;
        goto out_close;
    }
    (*buf)[*len] = 0;
out_close:
    fclose(f);
    return rc;
}

/* A special token's text: a string, or an AddedToken object's "content". */
static char *token_text(const cJSON *j)
{
    if (cJSON_IsObject(j))
        j = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(j) ? strdup(j->valuestring) : NULL;
}

int gang_chat_template_load(const char *dir, gang_chat_template **out, char *err, size_t errlen)
{
    char path[4096], *buf = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    const cJSON *tpl;
    int rc;
    if (!dir || !out) {
        set_err(err, errlen, "chat template: NULL argument", NULL);
        return GANG_EINVAL;
    }
    *out = NULL;
    if ((size_t)snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir) >= sizeof(path)) {
        set_err(err, errlen, "model directory path too long", NULL);
        return GANG_EINVAL;
    }
    if ((rc = read_file(path, &buf, &len, err, errlen)))
        return rc;
    rc = GANG_EMODEL;
    if (!(root = cJSON_ParseWithLength(buf, len)) || !cJSON_IsObject(root)) {
        set_err(err, errlen, "not a JSON object: ", path);
        goto out_free;
    }
    tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(tpl)) {
        const cJSON *e, *found = NULL;
        cJSON_ArrayForEach(e, tpl)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                found = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        tpl = found;
    }
    if (!tpl || cJSON_IsNull(tpl)) {
        set_err(err, errlen, "no chat_template (or no template named \"default\") in ", path);
        rc = GANG_ENOENT;
        goto out_free;
    }
    if (!cJSON_IsString(tpl)) {
        set_err(err, errlen, "chat_template is not a string in ", path);
        goto out_free;
    }
    if ((rc = gang_chat_template_parse(tpl->valuestring, strlen(tpl->valuestring), out, err,
                                       errlen)))
        goto out_free;
    (*out)->bos = token_text(cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
    (*out)->eos = token_text(cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
out_free:
    cJSON_Delete(root);
    free(buf);
    return rc;
}

/* The variables of a render: messages and transformers' keyword arguments, then the
 * members of EXTRA (a JSON object, or NULL). */
static int set_globals(chat_ctx *c, const gang_chat_template *t, const cJSON *msgs,
                       const cJSON *extra, const gang_chat_render_opts *o)
{
    cv v;
    int rc = gang__cv_from_cjson(c, msgs, &v, 0);
    const char *bos = o && o->bos_token ? o->bos_token : t->bos ? t->bos : "";
    const char *eos = o && o->eos_token ? o->eos_token : t->eos ? t->eos : "";
    if (rc || (rc = gang__chat_frame_set(c, c->globals, "messages", 8, &v)))
        return rc;
    v = (cv){.kind = CV_BOOL};
    v.u.b = o && o->add_generation_prompt;
    if ((rc = gang__chat_frame_set(c, c->globals, "add_generation_prompt", 21, &v)))
        return rc;
    v = (cv){.kind = CV_NONE};
    if ((rc = gang__chat_frame_set(c, c->globals, "tools", 5, &v)) ||
        (rc = gang__chat_frame_set(c, c->globals, "documents", 9, &v)))
        return rc;
    v = gang__cv_str(bos, strlen(bos));
    if ((rc = gang__chat_frame_set(c, c->globals, "bos_token", 9, &v)))
        return rc;
    v = gang__cv_str(eos, strlen(eos));
    if ((rc = gang__chat_frame_set(c, c->globals, "eos_token", 9, &v)) || !extra)
        return rc;
    for (const cJSON *e = extra->child; e; e = e->next) {
        if ((rc = gang__cv_from_cjson(c, e, &v, 1)) ||
            (rc = gang__chat_frame_set(c, c->globals, e->string, strlen(e->string), &v)))
            return rc;
    }
    return 0;
}

int gang_chat_render(const gang_chat_template *t, const char *messages_json, size_t len,
                     const gang_chat_render_opts *o, char **out, size_t *out_len, char *err,
                     size_t errlen)
{
    if (!t || !messages_json || !out || !out_len) {
        set_err(err, errlen, "chat template: NULL argument", NULL);
        return GANG_EINVAL;
    }
    *out = NULL;
    *out_len = 0;
    chat_frame globals = {0};
    chat_ctx c = {.err = err, .errlen = errlen, .globals = &globals, .frame = &globals, .line = 1};
    c.max_steps = o && o->max_steps ? o->max_steps : GANG_CHAT_DEFAULT_STEPS;
    c.out.limit = o && o->max_output ? o->max_output : GANG_CHAT_DEFAULT_OUTPUT;
    c.arena.limit =
        c.out.limit > (SIZE_MAX - (16u << 20)) / 16 ? SIZE_MAX : 16 * c.out.limit + (16u << 20);
    int rc;
    cJSON *extra = NULL;
    const char *end = NULL;
    cJSON *msgs = cJSON_ParseWithLengthOpts(messages_json, len, &end, 0);
    while (msgs && end && end < messages_json + len &&
           (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        end++;
    if (!msgs || !cJSON_IsArray(msgs) || (end && end < messages_json + len && *end)) {
        set_err(err, errlen, "messages: not a JSON array", NULL);
        rc = GANG_EINVAL;
        goto out_free;
    }
    if (o && o->extra_json) {
        extra = cJSON_ParseWithLength(o->extra_json, o->extra_len);
        if (!extra || !cJSON_IsObject(extra)) {
            set_err(err, errlen, "extra variables: not a JSON object", NULL);
            rc = GANG_EINVAL;
            goto out_free;
        }
    }
    if ((rc = set_globals(&c, t, msgs, extra, o)))
        goto out_free;
    rc = gang__chat_exec(&c, t->root);
    if (rc == 0) {
        if (!c.out.p && !(c.out.p = calloc(1, 1))) {
            set_err(err, errlen, "out of memory", NULL);
            rc = GANG_ENOMEM;
            goto out_free;
        }
        *out = c.out.p;
        *out_len = c.out.n;
        c.out.p = NULL;
    } else if (rc > 0) {
        set_err(err, errlen, "chat template: loop control outside a loop", NULL);
        rc = GANG_EINTERNAL;
    }
out_free:
    free(c.out.p);
    gang__chat_arena_free(&c.arena);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    return rc;
}
