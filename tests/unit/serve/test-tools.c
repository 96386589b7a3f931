/*
 * Unit tests of the tool-call parser of the chat API (serve/api-tools.c,
 * gang__api_tool_calls): the answer formats of the model families under tool_choice
 * "auto" (Hermes / Qwen <tool_call>, Llama 3.x's bare {"name", "parameters"}, Mistral's
 * [TOOL_CALLS] array), the grammar's form under a forced choice, calls of unknown
 * functions ignored, the content before a call kept, parallel_tool_calls false keeping
 * one call, and "none" parsing nothing. (The end-to-end tests with the model are
 * tests/mp/test_tool_calls.py.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../../serve/api-internal.h"
#include "serve-tests.h"

static char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]";

/* The calls parsed from text under mode; *head: the content before them. */
static cJSON *calls_of(int mode, int parallel, const char *text, size_t *head)
{
    static api_call c;
    static api_seq s;
    memset(&c, 0, sizeof(c));
    memset(&s, 0, sizeof(s));
    c.kind = API_CHAT;
    c.id = 7;
    c.p.tools_mode = mode;
    c.p.parallel_tools = parallel;
    c.p.tools_json = tools;
    s.call = &c;
    static char buf[1024];
    snprintf(buf, sizeof(buf), "%s", text);
    s.text = buf;
    s.text_len = strlen(buf);
    return gang__api_tool_calls(&c, &s, head);
}

/* Call i's name and arguments equal name and args. */
static void call_is(cJSON *calls, int i, const char *name, const char *args)
{
    cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, i), "function");
    assert_non_null(fn);
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, name);
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, args);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, i), "type")->valuestring,
                        "function");
}

static void test_auto_formats(void **state)
{
    size_t head = 99;
    (void)state;
    cJSON *c = calls_of(API_TOOLS_AUTO, 1,
                        "Let me check.<tool_call>{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"add\", "
                        "\"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>",
                        &head);
    assert_int_equal(cJSON_GetArraySize(c), 2);
    call_is(c, 0, "get_weather", "{\"city\":\"Paris\"}");
    call_is(c, 1, "add", "{\"a\":1,\"b\":2}");
    assert_int_equal(head, strlen("Let me check."));
    cJSON_Delete(c);
    c = calls_of(API_TOOLS_AUTO, 0,
                 "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>"
                 "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>",
                 &head);
    assert_int_equal(cJSON_GetArraySize(c), 1); /* parallel_tool_calls false */
    assert_int_equal(head, 0);
    cJSON_Delete(c);
    c = calls_of(API_TOOLS_AUTO, 1, " {\"name\": \"add\", \"parameters\": {\"a\": 3}}", &head);
    assert_int_equal(cJSON_GetArraySize(c), 1);
    call_is(c, 0, "add", "{\"a\":3}");
    cJSON_Delete(c);
    c = calls_of(API_TOOLS_AUTO, 1,
                 "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
                 "\\\"Oslo\\\"}\"}]",
                 &head);
    assert_int_equal(cJSON_GetArraySize(c), 1);
    call_is(c, 0, "get_weather", "{\"city\": \"Oslo\"}");
    cJSON_Delete(c);
    /* Text, an unknown function, a malformed call: no calls. */
    assert_null(calls_of(API_TOOLS_AUTO, 1, "The weather is fine.", &head));
    assert_null(calls_of(API_TOOLS_AUTO, 1, "{\"name\": \"rm\", \"arguments\": {}}", &head));
    assert_null(calls_of(API_TOOLS_AUTO, 1, "<tool_call>{\"name\": \"add\", </tool_call>", &head));
    assert_null(calls_of(API_TOOLS_OFF, 1, "<tool_call>{\"name\":\"add\"}</tool_call>", &head));
}

static void test_forced_form(void **state)
{
    size_t head = 99;
    (void)state;
    cJSON *c = calls_of(API_TOOLS_FORCED, 1, "{\"add\": {\"a\": 2, \"b\": 3}}", &head);
    assert_int_equal(cJSON_GetArraySize(c), 1);
    call_is(c, 0, "add", "{\"a\":2,\"b\":3}");
    assert_int_equal(head, 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 0), "id")->valuestring,
                        "call_7_0_0");
    cJSON_Delete(c);
    /* Cut by max_tokens before the grammar's end: no call (the text is answered). */
    assert_null(calls_of(API_TOOLS_FORCED, 1, "{\"add\": {\"a\": 2", &head));
}

int gang_test_tools(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_formats),
        cmocka_unit_test(test_forced_form),
    };
    return cmocka_run_group_tests_name("tools", tests, NULL, NULL);
}
