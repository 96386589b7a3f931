/*
 * Unit tests of the chat-template interpreter (text/chat-*.c): each construct against
 * the output jinja2 gives for it (whitespace control, expressions, loops, scoping,
 * filters, tests, macros), each refusal (syntax errors with their line, unsupported tags,
 * filters and methods, type errors, raise_exception), and the limits a hostile template
 * meets (steps, output, memory, nesting, recursion) within bounded time. The comparison
 * with transformers on real templates is tests/chat/compare.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/text.h"
#include "text-tests.h"

static const char *const MSGS = "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                "{\"role\":\"user\",\"content\":\"Hi \\ud83d\\ude00\"}]";

/* Renders TPL with MSGS (NULL: the two messages above); returns the code, the output in
 * OUT (malloc'd) and the message in ERR. */
static int render_opts(const char *tpl, const char *msgs, const gang_chat_render_opts *o,
                       char **out, char *err, size_t errlen)
{
    gang_chat_template *t = NULL;
    size_t n = 0;
    *out = NULL;
    int rc = gang_chat_template_parse(tpl, strlen(tpl), &t, err, errlen);
    if (rc)
        return rc;
    msgs = msgs ? msgs : MSGS;
    rc = gang_chat_render(t, msgs, strlen(msgs), o, out, &n, err, errlen);
    if (!rc)
        assert_int_equal(strlen(*out), n);
    gang_chat_template_free(t);
    return rc;
}

static void expect(const char *tpl, const char *want)
{
    char *out = NULL, err[512] = "";
    gang_chat_render_opts o = {.add_generation_prompt = 1, .bos_token = "<s>", .eos_token = "</s>"};
    int rc = render_opts(tpl, NULL, &o, &out, err, sizeof(err));
    if (rc || strcmp(out, want))
        fprintf(stderr, "template %s\n  rc %d (%s)\n  got  '%s'\n  want '%s'\n", tpl, rc, err,
                out ? out : "", want);
    assert_int_equal(rc, 0);
    assert_string_equal(out, want);
    free(out);
}

/* Expects TPL to fail with RC and a message containing NEEDLE. */
static void expect_error(const char *tpl, int want_rc, const char *needle)
{
    char *out = NULL, err[512] = "";
    int rc = render_opts(tpl, NULL, NULL, &out, err, sizeof(err));
    if (rc != want_rc || !strstr(err, needle))
        fprintf(stderr, "template %.80s\n  rc %d, want %d; message '%s' lacks '%s'\n", tpl, rc,
                want_rc, err, needle);
    assert_int_equal(rc, want_rc);
    assert_null(out);
    assert_non_null(strstr(err, needle));
}

static void test_whitespace(void **state)
{
    (void)state;
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc");
    expect("a  {{- 'b' -}}  \n c", "abc");
    expect("a {# note #} b", "a  b");
    expect("x\n  {# note #}\ny", "x\ny");
    expect("  {%+ if true %}x{% endif %}", "  x");
    expect("hi\n", "hi");
    expect("hi\n\n", "hi\n");
    expect("a\r\nb", "a\nb");
    expect("{% if true %}\nyes{% endif %}", "yes");
    expect("{{ 'v' }}\nafter", "v\nafter");
    expect("{%- if true -%}\n\n  x  \n{%- endif %}", "x");
    expect("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}", "  1\n  2\n");
}

static void test_expressions(void **state)
{
    (void)state;
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 2 }}", "3 -4 -2 1024 0.5");
    expect("{{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 ~ 'x' }} {{ 2 * 'c' }}", "ababab [1, 2] 1x cc");
    expect("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 2.0 }} {{ 1.5e-7 }} {{ 3 * 1.5 }}",
           "0.30000000000000004 1e+16 2.0 1.5e-07 4.5");
    expect("{{ 'y' if 1 else 'n' }}{{ 0 or 'z' }}{{ 1 and 2 }}{{ 'a' in 'cat' }}{{ 2 not in [1] }}",
           "yz2TrueTrue");
    expect("{{ not 0 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ none }} {{ [] }}",
           "True True True True None []");
    expect("{{ {'a': 1, 'b': [1, 'x']} }} {{ \"it's\" }} {{ ['it\\'s'] }}",
           "{'a': 1, 'b': [1, 'x']} it's [\"it's\"]");
    expect("{{ 'a' 'b' }}{{ '\\n\\t\\x41\\u00e9\\\\' }}", "ab\n\tA\xc3\xa9\\");
    expect("{{ {'a': {'b': 1}} }}|{{ {'a': {'b': 1}}['a'] }}|{% if {'k': {}} %}y{% endif %}",
           "{'a': {'b': 1}}|{'b': 1}|y");
    expect("{{ (1, 2)[0] }}{{ [1, 2, 3][-1] }}{{ {'k': 'v'}['k'] }}{{ {'k': 'v'}.k }}", "13vv");
    expect("{{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3, 4][::-2] }} {{ 'abc'[-2:] }} {{ 'abc'[5:] }}",
           "[2, 3] [4, 2] bc ");
    expect("{{ 'h\xc3\xa9llo'|length }} {{ 'h\xc3\xa9llo'[1] }} {{ 'h\xc3\xa9llo'[::-1] }}",
           "5 \xc3\xa9 oll\xc3\xa9h");
    expect("{{ missing }}|{{ missing is defined }}|{{ {'a': 1}.b is defined }}", "|False|False");
}

static void test_strings(void **state)
{
    (void)state;
    expect(
        "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() "
        "}}|",
        "a b|a|a|a|");
    expect("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}",
           "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']");
    expect("{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'x'.upper() }}"
           "{{ 'aXa'.replace('a', 'b') }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}",
           "TrueTrueXbXbHello WorldHello");
    expect("{{ '</think>x</think>answer'.split('</think>')[-1] }}", "answer");
    expect("{{ ' x '|trim }}|{{ 'ab'|upper }}|{{ 'it\\'s my-word'|title }}|{{ 'aab'|replace('a', "
           "'c', 1) }}",
           "x|AB|It's My-Word|cab");
    expect_error("{{ '\xc3\xa9'.upper() }}", GANG_EMODEL, "non-ASCII");
    expect_error("{{ 'ab'.endswith(['b']) }}", GANG_EMODEL, "tuple of strings");
    expect("{{ (1,) }}{{ (1, 'a') }}{{ () }}{{ (1, 'a')[1:] }}", "(1,)(1, 'a')()('a',)");
}

static void test_loops(void **state)
{
    (void)state;
    expect("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
           "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
           "10TrueFalse33|21FalseFalse32|32FalseTrue31|");
    expect("{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem }},{% endfor %}",
           "False2,True3,True,");
    expect("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}"
           "{% break %}{% endif %}{{ i }}{% endfor %}",
           "0134");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", "empty");
    expect("{% for x in range(6) if x is odd %}{{ x }}{{ loop.length }}{% endfor %}", "133353");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    expect("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}{% for c in 'h\xc3\xa9' %}[{{ c }}]"
           "{% endfor %}",
           "ab[h][\xc3\xa9]");
    expect("{% for i in range(2, 9, 3) %}{{ i }}{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}"
           "{% endfor %}",
           "258321");
}

static void test_scoping(void **state)
{
    (void)state;
    expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "21");
    expect("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", "2");
    expect("{% set ns = namespace(x=1, s='') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
           "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.x }} {{ ns.s }}",
           "4 12");
    expect("{% set a, b = [1, 2] %}{{ b }}{{ a }}", "21");
    expect("{% set x %}a{{ 1 }}{% endset %}[{{ x }}]", "[a1]");
    expect("{% set messages = messages[1:] %}{{ messages|length }}", "1");
    expect("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Bob') }}/"
           "{{ greet('Al', p='Yo') }}",
           "Hi Bob/Yo Al");
    expect("{% generation %}kept{% endgeneration %}", "kept");
}

static void test_tests_and_filters(void **state)
{
    (void)state;
    expect("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
           "{{ 3 is divisibleby 3 }}{{ 1 is not number }}{{ 'a' is iterable }}{{ 2 is even }}"
           "{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 'ab' is lower }}"
           "{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ none is sameas none }}",
           "FalseTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
    expect("{{ {'a': '\xc3\xa9', 'b': [1, none, true], 'c': 'q\"\\n'}|tojson }}",
           "{\"a\": \"\xc3\xa9\", \"b\": [1, null, true], \"c\": \"q\\\"\\n\"}");
    expect("{{ ['\xc3\xa9\xf0\x9f\x98\x80\xe4\xb8\x96', 'a']|tojson(ensure_ascii=true) }}",
           "[\"\\u00e9\\ud83d\\ude00\\u4e16\", \"a\"]");
    expect("{{ {'b': 1, 'a': [2]}|tojson(indent=2, sort_keys=true) }}",
           "{\n  \"a\": [\n    2\n  ],\n  \"b\": 1\n}");
    expect("{{ [1, 2]|length }}{{ 'abc'|count }}{{ [3, 4]|first }}{{ [3, 4]|last }}"
           "{{ ['a', 'b']|join('-') }}{{ nothing|default('d') }}{{ ''|default('e', true) }}"
           "{{ '42'|int + 1 }}{{ 'x'|int }}{{ '2.5'|float }}{{ 7|string }}{{ -3|abs }}",
           "2334a-bde4302.573");
    expect("{{ [{'a': 1}, {'a': 2}]|map(attribute='a')|list }}"
           "{{ [{'t': 'x'}, {'t': 'y'}]|selectattr('t', 'equalto', 'y')|list|length }}"
           "{{ [1, 0, 2]|select|list }}{{ ['a', 'code']|reject('equalto', 'code')|join(',') }}"
           "{{ [1, 2]|reverse|list }}{{ {'k': 'v'}|items|list }}{{ ['a', 'b']|map('upper')|join }}",
           "[1, 2]1[1, 2]a[2, 1][('k', 'v')]AB");
    /* jinja2's select/map/reverse give generators; |safe gives Markup, which escapes the
     * plain side of a + */
    expect(
        "{{ [1, 2]|select is iterable }}{{ [1]|select is sequence }}{{ 'y' if []|select "
        "else 'n' }}{% for x in [3, 4]|reverse %}{{ x }}{% endfor %}{{ [1]|map('string')|first }}",
        "TrueFalsey431");
    expect(
        "{{ '<b>'|safe + '<i>\"&\\'' }}|{{ '&' + 'x'|safe }}|{{ 'a'|safe ~ '<' }}|{{ 'q'|safe }}",
        "<b>&lt;i&gt;&#34;&amp;&#39;|&amp;x|a<|q");
    expect_error("{{ [1, 2]|map('string') }}", GANG_EMODEL, "generator");
    expect_error("{{ [1]|select|length }}", GANG_EMODEL, "generator");
    expect_error("{{ [1]|select|tojson }}", GANG_EMODEL, "generator");
    expect_error("{{ [1]|select|last }}", GANG_EMODEL, "generator");
    expect_error("{{ {'a': 1}.items() }}", GANG_EMODEL, "dict view");
    expect_error("{{ {'a': 1}|items|tojson }}", GANG_EMODEL, "generator");
    expect_error("{{ '0x1A'|int }}", GANG_EMODEL, "not supported");
    expect_error("{{ nothing|int }}", GANG_EMODEL, "undefined");
    expect_error("{{ {} in {} }}", GANG_EMODEL, "unhashable");
    expect_error("{{ {[1]: 2} }}", GANG_EMODEL, "unhashable");
    expect("{{ 3.0e-7 is lower }}{{ 1 is upper }}{{ 'AB1' is upper }}", "TrueFalseTrue");
    expect("{{ nothing is sequence }}{{ nothing is iterable }}{{ nothing is callable }}"
           "{{ nothing is mapping }}",
           "TrueTrueTrueFalse");
    expect_error("{{ {}|reverse }}", GANG_EMODEL, "generator");
    expect("{{ {}.items() is defined }}{{ 'y' if {}.keys() else 'n' }}{{ {'a': 1}.keys()|length }}"
           "{{ {'a': 1}.keys()[0] is defined }}{{ range(2, 9, 3)[-1] }}{{ [1]|select|first }}",
           "Truen1False81");
    expect_error("{{ ('a'|safe).strip() }}", GANG_EMODEL, "|safe");
    expect_error("{{ 'a'|safe|trim }}", GANG_EMODEL, "|safe");
    expect("{{ none|selectattr('type')|list }}{{ {'a': 1}.get('b', 5) }}{{ {'a': 1}.get('a') }}"
           "{{ {'a': 1}.keys()|list }}",
           "[]51['a']");
}

static void test_globals(void **state)
{
    (void)state;
    expect("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m['content'] }};{% endfor %}"
           "{% if add_generation_prompt %}A:{% endif %}{{ eos_token }}{{ tools is none }}"
           "{{ documents is none }}",
           "<s>system:Be brief.;user:Hi \xf0\x9f\x98\x80;A:</s>TrueTrue");
    char *out = NULL, err[256];
    const char *parts = "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hey\"}],"
                        "\"n\":1.5,\"z\":null}]";
    assert_int_equal(
        render_opts("{{ messages[0].content[0].text }}{{ messages[0].content is string "
                    "}}{{ messages[0].n }}{{ messages[0].z }}{{ add_generation_prompt }}"
                    "[{{ bos_token }}]",
                    parts, NULL, &out, err, sizeof(err)),
        0);
    assert_string_equal(out, "heyFalse1.5NoneFalse[]");
    free(out);
    assert_int_equal(render_opts("{{ strftime_now('%Y')|length }}{{ dict(a=1).a }}", NULL, NULL,
                                 &out, err, sizeof(err)),
                     0);
    assert_string_equal(out, "41");
    free(out);
    const char *extra = "{\"tools\": [{\"name\": \"f\"}], \"date_string\": \"1 Dec\", "
                        "\"enable_thinking\": false}";
    gang_chat_render_opts o = {.extra_json = extra, .extra_len = strlen(extra)};
    assert_int_equal(render_opts("{{ tools[0].name }}|{{ date_string }}|{{ enable_thinking }}|"
                                 "{{ tools|tojson }}",
                                 NULL, &o, &out, err, sizeof(err)),
                     0);
    assert_string_equal(out, "f|1 Dec|False|[{\"name\": \"f\"}]");
    free(out);
    o.extra_json = "[1]";
    o.extra_len = 3;
    assert_int_equal(render_opts("x", NULL, &o, &out, err, sizeof(err)), GANG_EINVAL);
    assert_non_null(strstr(err, "extra"));
}

static void test_syntax_errors(void **state)
{
    (void)state;
    expect_error("{% if x %}", GANG_EMODEL, "endif");
    expect_error("a\n{{ 1 + }}", GANG_EMODEL, "line 2");
    expect_error("{% include 'x' %}", GANG_EMODEL, "'include' is not supported");
    expect_error("{{ x|dictsort }}", GANG_EMODEL, "filter 'dictsort'");
    expect_error("{{ x is foo }}", GANG_EMODEL, "test 'foo'");
    expect_error("{% raw %}x{% endraw %}", GANG_EMODEL, "raw");
    expect_error("{% for x in y recursive %}{% endfor %}", GANG_EMODEL, "recursive");
    expect_error("{% break %}", GANG_EMODEL, "outside a loop");
    expect_error("{% endfor %}", GANG_EMODEL, "unexpected 'endfor'");
    expect_error("{{ 'abc }}", GANG_EMODEL, "unterminated string");
    expect_error("{{ 1 < 2 < 3 }}", GANG_EMODEL, "chained");
    expect_error("{{ x", GANG_EMODEL, "ends inside a tag");
    expect_error("{# x", GANG_EMODEL, "unterminated comment");
    expect_error("{{ f(*a) }}", GANG_EMODEL, "*args");
    expect_error("\n\n  {{ a $ b }}", GANG_EMODEL, "line 3, column 8");
}

static void test_runtime_errors(void **state)
{
    (void)state;
    expect_error("{{ x.y }}", GANG_EMODEL, "'x' is undefined");
    expect_error("\n{{ 'a' + 1 }}", GANG_EMODEL, "line 2");
    expect_error("{{ 'a' + 1 }}", GANG_EMODEL, "unsupported operand types for +: string and int");
    expect_error("{{ 'a'.format(1) }}", GANG_EMODEL, "format");
    expect_error("{{ 1 // 0 }}", GANG_EMODEL, "division by zero");
    expect_error("{% for x in 5 %}{% endfor %}", GANG_EMODEL, "not iterable");
    expect_error("{% set y = 1 %}{% set y.a = 2 %}", GANG_EMODEL, "cannot assign");
    expect_error("{{ 9223372036854775807 + 1 }}", GANG_ERANGE, "overflow");
    expect_error("{{ raise_exception('Only user and assistant roles!') }}", GANG_EINVAL,
                 "Only user and assistant roles!");
    expect_error("{{ {'a': 1}|tojson(separators=(',', ':')) }}", GANG_EMODEL, "separators");

    gang_chat_template *t = NULL;
    char err[256], *out = (char *)1;
    size_t n;
    assert_int_equal(gang_chat_template_parse(NULL, 0, &t, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_chat_template_parse("x", 1, &t, err, sizeof(err)), 0);
    assert_int_equal(gang_chat_render(t, "[{", 2, NULL, &out, &n, err, sizeof(err)), GANG_EINVAL);
    assert_null(out);
    assert_int_equal(gang_chat_render(t, "{}", 2, NULL, &out, &n, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_chat_render(t, "[] x", 4, NULL, &out, &n, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_chat_render(t, "[] \n", 4, NULL, &out, &n, err, sizeof(err)), 0);
    assert_string_equal(out, "x");
    free(out);
    assert_int_equal(gang_chat_render(NULL, "[]", 2, NULL, &out, &n, err, sizeof(err)),
                     GANG_EINVAL);
    gang_chat_template_free(t);
    assert_int_equal(
        gang_chat_template_parse("x", GANG_CHAT_MAX_TEMPLATE_BYTES + 1u, &t, err, sizeof(err)),
        GANG_EMODEL);
    assert_non_null(strstr(err, "1 MiB"));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs TPL under the default limits and expects WANT_RC (and NEEDLE) within 10 s. */
static void expect_bounded(const char *tpl, int want_rc, const char *needle)
{
    double t0 = now_s();
    expect_error(tpl, want_rc, needle);
    double took = now_s() - t0;
    if (took > 10.0)
        fprintf(stderr, "template %.60s took %.1f s\n", tpl, took);
    assert_true(took < 10.0);
}

static void test_limits(void **state)
{
    (void)state;
    expect_bounded("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                   "{% endfor %}",
                   GANG_ERANGE, "step limit");
    expect_bounded("{% for i in range(1000000000) %}{% endfor %}", GANG_ERANGE, "range()");
    expect_bounded("{{ 'x' * 100000000 }}", GANG_ERANGE, "output limit");
    expect_bounded("{% set ns = namespace(s='x') %}{% for i in range(100) %}"
                   "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   GANG_ERANGE, "limit");
    expect_bounded("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                   "{% set ns.l = ns.l + ns.l %}{% endfor %}",
                   GANG_ERANGE, "");
    expect_bounded("{% for i in range(100000) %}{{ 'abcdefghij' * 10 }}{% endfor %}", GANG_ERANGE,
                   "output limit");
    expect("{{ '' * 1099511627776 }}{{ [] * 1099511627776 }}{{ 'ab' * -1 }}{{ 1 ** "
           "4611686018427387904 "
           "}}{{ -1 ** 3 }}{{ 2 ** 62 }}",
           "[]1-14611686018427387904");
    expect_error("{{ 2 ** 63 }}", GANG_ERANGE, "overflow");
    expect_error("{{ 3 ** 40 }}", GANG_ERANGE, "overflow");
    expect_bounded("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", GANG_ERANGE,
                   "macro calls nested");
    expect_bounded("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(0) }}", GANG_ERANGE, "");

    /* nesting: parentheses, ifs, lists and unary minus, far past the cap */
    size_t depth = 20000;
    char *deep = malloc(depth * 12 + 64);
    assert_non_null(deep);
    const char *open[] = {"(", "[", "-", "not "};
    for (int kind = 0; kind < 4; kind++) {
        size_t k = 0;
        k += (size_t)sprintf(deep + k, "{{ ");
        for (size_t i = 0; i < depth; i++)
            k += (size_t)sprintf(deep + k, "%s", open[kind]);
        deep[k++] = '1';
        for (size_t i = 0; kind < 2 && i < depth; i++)
            deep[k++] = kind == 0 ? ')' : ']';
        strcpy(deep + k, " }}");
        expect_bounded(deep, GANG_EMODEL, "nesting deeper");
    }
    size_t k = 0;
    for (size_t i = 0; i < depth; i++)
        k += (size_t)sprintf(deep + k, "{%% if 1 %%}");
    deep[k] = 0;
    expect_bounded(deep, GANG_EMODEL, "nesting deeper");
    free(deep);

    /* long message text: indexing it is cheap, scanning it over and over is bounded */
    size_t big = 2u << 20;
    char *msgs = malloc(big + 64), *out0 = NULL, err0[256];
    assert_non_null(msgs);
    int k0 = sprintf(msgs, "[{\"role\":\"user\",\"content\":\"");
    memset(msgs + k0, 'a', big);
    strcpy(msgs + k0 + big - 1, "z\"}]");
    assert_int_equal(render_opts("{{ messages[0].content[-1] }}{{ messages[0].content|length }}",
                                 msgs, NULL, &out0, err0, sizeof(err0)),
                     0);
    assert_string_equal(out0, "z2097152");
    free(out0);
    const char *scans[] = {"{% for i in range(100000) %}{% if messages[0].content|length %}"
                           "{% endif %}{% endfor %}",
                           "{% for i in range(100000) %}{% if messages[0].content == 'x' %}"
                           "{% endif %}{% endfor %}",
                           "{% for i in range(100000) %}{% if messages[0].content.strip() %}"
                           "{% endif %}{% endfor %}"};
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        assert_int_equal(render_opts(scans[i], msgs, NULL, &out0, err0, sizeof(err0)), GANG_ERANGE);
        assert_non_null(strstr(err0, "step limit"));
        assert_true(now_s() - t0 < 10.0);
    }
    free(msgs);

    /* two 20000-key dicts in opposite orders: comparing them is quadratic, and bounded */
    size_t nk = 20000;
    char *dicts = malloc(nk * 40 + 64);
    assert_non_null(dicts);
    size_t at = (size_t)sprintf(dicts, "[{");
    for (size_t i = 0; i < nk; i++)
        at += (size_t)sprintf(dicts + at, "%s\"k%zu\":%zu", i ? "," : "", i, i);
    at += (size_t)sprintf(dicts + at, "},{");
    for (size_t i = nk; i-- > 0;)
        at += (size_t)sprintf(dicts + at, "\"k%zu\":%zu%s", i, i, i ? "," : "");
    strcpy(dicts + at, "}]");
    double t1 = now_s();
    assert_int_equal(
        render_opts("{{ messages[0] == messages[1] }}", dicts, NULL, &out0, err0, sizeof(err0)),
        GANG_ERANGE);
    assert_int_equal(render_opts("{{ messages[1]|tojson(sort_keys=true)|length }}"
                                 "{{ messages[0] == messages[0] }}",
                                 dicts, NULL, &out0, err0, sizeof(err0)),
                     0);
    assert_true(now_s() - t1 < 10.0);
    free(out0);
    free(dicts);

    /* a smaller budget given by the caller is honoured */
    char *out = NULL, err[256];
    gang_chat_render_opts o = {.max_steps = 50, .max_output = 8};
    assert_int_equal(
        render_opts("{% for i in range(100) %}{% endfor %}", NULL, &o, &out, err, sizeof(err)),
        GANG_ERANGE);
    assert_int_equal(render_opts("{{ '123456789' }}", NULL, &o, &out, err, sizeof(err)),
                     GANG_ERANGE);
    assert_int_equal(render_opts("{{ '12345678' }}", NULL, &o, &out, err, sizeof(err)), 0);
    assert_string_equal(out, "12345678");
    free(out);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/test-chat-XXXXXX", path[256], err[256], *out = NULL;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    gang_chat_template *t = NULL;
    size_t n;
    assert_int_equal(gang_chat_template_load(dir, &t, err, sizeof(err)), GANG_ENOENT);
    assert_non_null(strstr(err, "tokenizer_config.json"));
    write_file(path, "{\"bos_token\": \"<s>\"}");
    assert_int_equal(gang_chat_template_load(dir, &t, err, sizeof(err)), GANG_ENOENT);
    assert_non_null(strstr(err, "chat_template"));
    write_file(path, "{\"chat_template\": \"{% if %}\"}");
    assert_int_equal(gang_chat_template_load(dir, &t, err, sizeof(err)), GANG_EMODEL);
    write_file(path, "{\"chat_template\": 5}");
    assert_int_equal(gang_chat_template_load(dir, &t, err, sizeof(err)), GANG_EMODEL);
    write_file(path, "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": "
                     "\"<E>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                     "{\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0]"
                     ".content }}{{ eos_token }}\"}]}");
    assert_int_equal(gang_chat_template_load(dir, &t, err, sizeof(err)), 0);
    assert_int_equal(
        gang_chat_render(t, "[{\"content\":\"c\"}]", 17, NULL, &out, &n, err, sizeof(err)), 0);
    assert_string_equal(out, "<B>c<E>");
    free(out);
    gang_chat_render_opts o = {.bos_token = "b", .eos_token = "e"};
    assert_int_equal(
        gang_chat_render(t, "[{\"content\":\"c\"}]", 17, &o, &out, &n, err, sizeof(err)), 0);
    assert_string_equal(out, "bce");
    free(out);
    gang_chat_template_free(t);
    unlink(path);
    rmdir(dir);
}

int gang_test_chat(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace),     cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_strings),        cmocka_unit_test(test_loops),
        cmocka_unit_test(test_scoping),        cmocka_unit_test(test_tests_and_filters),
        cmocka_unit_test(test_globals),        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors), cmocka_unit_test(test_limits),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests_name("chat", tests, NULL, NULL);
}
