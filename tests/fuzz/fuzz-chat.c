/*
 * libFuzzer target of the chat-template interpreter (text/chat-*.c). The input is a
 * template source, optionally followed by a NUL byte and a messages JSON array; without
 * one (or when it is not valid JSON) a fixed conversation is used. Every input must be
 * parsed or refused, and rendered or refused, within the small budgets below, without a
 * crash, a leak, a sanitizer report or an error code outside the contract.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/text.h"

static const char *const CONVERSATION =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi \\u00e9\"},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}],"
    "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]}]";

static int allowed(int rc)
{
    return rc == 0 || rc == GANG_EINVAL || rc == GANG_EMODEL || rc == GANG_ERANGE ||
           rc == GANG_ENOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const char *nul = memchr(src, 0, size);
    size_t tlen = nul ? (size_t)(nul - src) : size;
    gang_chat_template *t = NULL;
    char err[256];
    int rc = gang_chat_template_parse(src, tlen, &t, err, sizeof(err));
    if (!allowed(rc) || (rc && t))
        abort();
    if (rc)
        return 0;
    gang_chat_render_opts o = {.add_generation_prompt = 1,
                               .bos_token = "<s>",
                               .eos_token = "</s>",
                               .max_steps = 20000,
                               .max_output = 1u << 16};
    for (int pass = 0; pass < 2; pass++) {
        const char *msgs = CONVERSATION;
        size_t mlen = strlen(CONVERSATION);
        if (pass == 1) {
            if (!nul)
                break;
            msgs = nul + 1;
            mlen = size - tlen - 1;
        }
        char *out = NULL;
        size_t n = 0;
        rc = gang_chat_render(t, msgs, mlen, &o, &out, &n, err, sizeof(err));
        if (!allowed(rc) || (rc == 0) != (out != NULL) || (out && (n > o.max_output || out[n])))
            abort();
        free(out);
        o.add_generation_prompt = 0;
    }
    gang_chat_template_free(t);
    return 0;
}
