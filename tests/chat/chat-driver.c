/*
 * Test driver of the chat-template interpreter for tests/chat/compare.py:
 *
 *   chat-driver TEMPLATE_FILE CASES_JSON
 *
 * CASES_JSON is an array of {"messages": [...], "add_generation_prompt": bool,
 * "bos_token": str, "eos_token": str, "extra": {variables}} ("extra" optional). For each case one
 * line: "OK <output in hex>" or "ERR <code name> <message>". Exit 0 unless the inputs cannot be
 * read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ganglion/text.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = (n + 65536 + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        size_t r = fread(buf + n, 1, 65536, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static const char *str_or(const cJSON *o, const char *key, const char *dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : dflt;
}

int main(int argc, char **argv)
{
    size_t tlen, clen;
    char err[512] = "";
    if (argc != 3) {
        fprintf(stderr, "usage: chat-driver TEMPLATE_FILE CASES_JSON\n");
        return 2;
    }
    char *tpl = slurp(argv[1], &tlen), *cases = slurp(argv[2], &clen);
    if (!tpl || !cases) {
        fprintf(stderr, "chat-driver: cannot read the inputs\n");
        return 2;
    }
    gang_chat_template *t = NULL;
    int rc = gang_chat_template_parse(tpl, tlen, &t, err, sizeof(err));
    cJSON *root = cJSON_Parse(cases), *c;
    if (!root) {
        fprintf(stderr, "chat-driver: bad cases JSON\n");
        return 2;
    }
    cJSON_ArrayForEach(c, root)
    {
        if (rc) {
            printf("ERR %s %s\n", gang_err_name(rc), err);
            continue;
        }
        cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "messages");
        char *mj = cJSON_PrintUnformatted(m);
        cJSON *x = cJSON_GetObjectItemCaseSensitive(c, "extra");
        char *xj = x ? cJSON_PrintUnformatted(x) : NULL;
        gang_chat_render_opts o = {
            .add_generation_prompt =
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt")),
            .bos_token = str_or(c, "bos_token", NULL),
            .eos_token = str_or(c, "eos_token", NULL),
            .extra_json = xj,
            .extra_len = xj ? strlen(xj) : 0};
        char *out = NULL;
        size_t n = 0;
        int r = gang_chat_render(t, mj, strlen(mj), &o, &out, &n, err, sizeof(err));
        if (r) {
            printf("ERR %s %s\n", gang_err_name(r), err);
        } else {
            printf("OK ");
            for (size_t i = 0; i < n; i++)
                printf("%02x", (unsigned char)out[i]);
            printf("\n");
        }
        free(out);
        free(mj);
        free(xj);
    }
    cJSON_Delete(root);
    gang_chat_template_free(t);
    free(tpl);
    free(cases);
    return 0;
}
