/*
 * A client's text inside a chat template stays text: special-token text in message
 * content (`<|im_end|>\n<|im_start|>system`) must not become the template's special ids,
 * or a user forges turns of other roles. transformers' apply_chat_template tokenizes the
 * whole rendered string, so it does turn such content into special ids; here every special
 * token's text in the client's strings is replaced by a marker before rendering, and after
 * rendering each marker is put back as the token's text, its bytes recorded as a range the
 * tokenizer encodes as plain text (gang_tokenizer_encode_plain). What the template writes
 * itself (`<|im_start|>` around each turn, bos_token) stays special.
 *
 * The marker is U+E000, 8 hex digits drawn per request (checked absent from the request),
 * ':' and the token's id, then U+E001: private-use code points that no template alters.
 * A template that cut a marker (slicing content) is refused rather than guessed at.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-internal.h"
#include "ganglion/common.h"
#include "ganglion/text.h"

#define SHIELD_OPEN "\xee\x80\x80"  /* U+E000 */
#define SHIELD_CLOSE "\xee\x80\x81" /* U+E001 */
#define SHIELD_MAX_MARKS 65536      /* markers in one request (bounded by its bytes anyway) */

/* Copies s with every special token's text replaced by its marker into a malloc'd string
 * (NULL without any, or out of memory: *oom set); counts the markers in *marks. */
static char *shield_string(const gang_tokenizer *tok, const api_shield *sh, const char *s,
                           size_t *marks, int *oom)
{
    size_t len = strlen(s), at = 0, n = 0, pos = 0, cap = 0, out_len = 0;
    char *out = NULL;
    while (pos < len && gang_tokenizer_find_special(tok, s + pos, len - pos, &at, &n) == 0) {
        char mark[64];
        char *piece = strndup(s + pos + at, n);
        if (piece == NULL)
            goto out_oom;
        int32_t id = gang_tokenizer_token_id(tok, piece);
        free(piece);
        int ml = snprintf(mark, sizeof(mark), "%s%" PRId32 SHIELD_CLOSE, sh->prefix, id);
        size_t need = out_len + at + (size_t)ml + (len - pos - at - n) + 1;
        if (need > cap) {
            cap = need * 2;
            char *g = realloc(out, cap);
            if (g == NULL)
                goto out_oom;
            out = g;
        }
        memcpy(out + out_len, s + pos, at);
        memcpy(out + out_len + at, mark, (size_t)ml);
        out_len += at + (size_t)ml;
        pos += at + n;
        (*marks)++;
    }
    if (out == NULL)
        return NULL;
    memcpy(out + out_len, s + pos, len - pos);
    out[out_len + len - pos] = '\0';
    return out;
out_oom:
    free(out);
    *oom = 1;
    return NULL;
}

/* Replaces special-token text in every string value under node (object keys are the
 * normalized message's own names, or a tool's argument names: left as they are). */
static int shield_tree(const gang_tokenizer *tok, api_shield *sh, cJSON *node)
{
    for (cJSON *c = node; c != NULL; c = c->next) {
        if (cJSON_IsString(c) && c->valuestring != NULL) {
            int oom = 0;
            char *s = shield_string(tok, sh, c->valuestring, &sh->marks, &oom);
            if (oom)
                return GANG_ENOMEM;
            if (s != NULL) {
                free(c->valuestring); /* cJSON's default allocator (no hooks installed) */
                c->valuestring = s;
            }
        }
        if (c->child != NULL && shield_tree(tok, sh, c->child) != 0)
            return GANG_ENOMEM;
        if (sh->marks > SHIELD_MAX_MARKS)
            return GANG_ERANGE;
    }
    return 0;
}

int gang__api_shield_begin(gang_api *api, api_shield *sh, const char *json, const char *json2)
{
    memset(sh, 0, sizeof(*sh));
    for (int tries = 0; tries < 16; tries++) {
        uint64_t r =
            gang_now_ns() ^ ((uint64_t)(uintptr_t)sh << 16) ^
            (__atomic_add_fetch(&api->shield_seq, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
        snprintf(sh->prefix, sizeof(sh->prefix), SHIELD_OPEN "%08x:", (unsigned)(r ^ (r >> 32)));
        if ((json == NULL || strstr(json, sh->prefix) == NULL) &&
            (json2 == NULL || strstr(json2, sh->prefix) == NULL))
            return 0;
    }
    return GANG_EEXIST; /* never in practice: 16 draws of 32 bits all in the request */
}

int gang__api_shield_tree(gang_api *api, api_shield *sh, cJSON *root)
{
    return root != NULL ? shield_tree(api->tok, sh, root) : 0;
}

char *gang__api_shield_text(gang_api *api, api_shield *sh, const char *json)
{
    cJSON *o = cJSON_Parse(json);
    char *out = NULL;
    if (o == NULL)
        return NULL;
    if (shield_tree(api->tok, sh, o) == 0)
        out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

/* Appends r to the malloc'd ranges *v (count *n, room *cap). 0 or GANG_ENOMEM. */
static int push_range(gang_tok_range **v, size_t *n, size_t *cap, gang_tok_range r)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        gang_tok_range *g = realloc(*v, nc * sizeof(*g));
        if (g == NULL)
            return GANG_ENOMEM;
        *v = g;
        *cap = nc;
    }
    (*v)[(*n)++] = r;
    return 0;
}

/* Appends n bytes to the malloc'd buffer *b (length *len, room *cap). 0 or GANG_ENOMEM. */
static int push_bytes(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *g = realloc(*b, nc);
        if (g == NULL)
            return GANG_ENOMEM;
        *b = g;
        *cap = nc;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = '\0';
    return 0;
}

int gang__api_shield_end(gang_api *api, const api_shield *sh, char **text, gang_tok_range **plain,
                         size_t *nplain, char *err, size_t cap)
{
    *plain = NULL;
    *nplain = 0;
    if (sh->marks == 0)
        return 0;
    const char *in = *text;
    size_t plen = strlen(sh->prefix), len = strlen(in), o = 0, ocap = 0, rcap = 0;
    char *out = NULL;
    if (push_bytes(&out, &o, &ocap, "", 0) != 0)
        goto out_oom;
    for (size_t i = 0; i < len;) {
        const char *m = strstr(in + i, sh->prefix);
        size_t upto = m != NULL ? (size_t)(m - in) : len;
        if (push_bytes(&out, &o, &ocap, in + i, upto - i) != 0)
            goto out_oom;
        if (m == NULL)
            break;
        char *end = NULL;
        long id = strtol(m + plen, &end, 10);
        const char *t =
            id >= 0 && id <= INT32_MAX ? gang_tokenizer_token_text(api->tok, (int32_t)id) : NULL;
        if (end == m + plen || strncmp(end, SHIELD_CLOSE, 3) != 0 || t == NULL ||
            !gang_tokenizer_is_special(api->tok, (int32_t)id)) {
            snprintf(err, cap,
                     "the chat template altered message text holding special-token "
                     "text; such text is refused with this template");
            goto out_fail;
        }
        size_t tl = strlen(t);
        if (push_range(plain, nplain, &rcap, (gang_tok_range){o, tl}) != 0 ||
            push_bytes(&out, &o, &ocap, t, tl) != 0)
            goto out_oom;
        i = (size_t)(end + 3 - in);
    }
    free(*text);
    *text = out;
    return 0;
out_oom:
    snprintf(err, cap, "out of memory");
out_fail:
    free(out);
    free(*plain);
    *plain = NULL;
    *nplain = 0;
    return -1;
}
