/* test_jinja.c - the Jinja interpreter (src/text/jinja.c): what it writes for
 * each construct chat templates use, checked against the text jinja2 writes
 * (as transformers configures it: trim_blocks, lstrip_blocks); and each kind
 * of bad template with the exact message a user sees: a syntax error or an
 * unsupported statement at its line and column, raise_exception's own
 * message, an undefined's attribute, the loop, recursion and memory bounds,
 * a context that is not JSON.  tests/jinja_test.py compares whole real
 * templates with jinja2 itself. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "testutil.h"

static const char *k_ctx =
    "{\"messages\": [{\"role\": \"system\", \"content\": \" Be brief. \"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"x\": 1, \"y\": [true, null, 2.5, \"\\u00e9\\\"\"]}}}]}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"tools\": null}";

/* render src with k_ctx; the output, or "ERR(status): message" */
static char *render(const char *src, const bt_jinja_opts *o) {
    static char buf[4096];
    char err[512];
    bt_jinja *t;
    enum bt_status st = bt_jinja_parse(src, strlen(src), &t, err, sizeof err);
    if (st != BT_OK) {
        snprintf(buf, sizeof buf, "ERR(%d): %s", st, err);
        return buf;
    }
    char *out;
    st = bt_jinja_render(t, k_ctx, o, &out, NULL, err, sizeof err);
    bt_jinja_free(t);
    if (st != BT_OK) {
        snprintf(buf, sizeof buf, "ERR(%d): %s", st, err);
        return buf;
    }
    snprintf(buf, sizeof buf, "%s", out);
    free(out);
    return buf;
}

static const struct {
    const char *src, *want;
} k_cases[] = {
    /* whitespace: trim_blocks drops the newline after a tag, lstrip_blocks the indent before one */
    {"{% if true %}\n  A\n{% endif %}\n  {% if true %}B{% endif %}\nC", "  A\nBC"},
    {"a  {%- if true -%}  \n b {{- ' c ' -}} d{% endif %}", "ab c d"},
    {"x\n  {# comment #}\ny\n  {{ 'z' }}\n", "x\ny\n  z"},
    {"{%+ if true %}k{% endif +%}\nz", "k\nz"},
    /* loops and their loop.* */
    {"{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ loop.first }}{{ loop.last }}{{ loop.revindex0 }}"
     "{% if not loop.last %},{% endif %}{% endfor %}",
     "1/3TrueFalse2,2/3FalseFalse1,3/3FalseTrue0"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m.role }}{% endfor %}", "0user1assistant"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}", "empty"},
    {"{% for x in 'abc' %}{{ loop.cycle('odd', 'even') }}{% endfor %}", "oddevenodd"},
    {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;"},
    {"{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
     "{% endfor %}",
     "02"},
    {"{% for x in 'ab' %}{{ loop.previtem is defined }}{{ loop.nextitem | default('-') }}{% endfor %}", "FalsebTrue-"},
    /* scoping: a set inside a loop stays there; a namespace carries out */
    {"{% set n = 0 %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set n = n + 1 %}{% set ns.n = ns.n + 1 %}"
     "{% endfor %}{{ n }},{{ ns.n }}",
     "0,3"},
    {"{% set a, b = 1, 'x' %}{{ a }}{{ b }}{% set blk %}  in {{ a }}  {% endset %}[{{ blk }}]", "1x[  in 1  ]"},
    {"{% set t | upper %}up{% endset %}{{ t }}{% filter trim %}  f  {% endfilter %}", "UPf"},
    /* macros */
    {"{% macro m(a, b='d', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m(b=2, a=0) }}",
     "1dNone|1d3|02None"},
    /* expressions */
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 3 * 'ab' }} {{ 1 ~ none ~ true }}",
     "3 -4 2 1024 0.25 ababab 1NoneTrue"},
    {"{{ 1e16 }} {{ 1.5e-5 }} {{ 100.0 }} {{ 0.1 + 0.2 }} {{ 1.0 == 1 }} {{ 2 > 1 > 0 }}",
     "1e+16 1.5e-05 100.0 0.30000000000000004 True True"},
    {"{{ 'a' if false }}|{{ 'b' if 0 else 'c' }}|{{ none or 'd' }}|{{ 'e' and 0 }}|{{ not [] }}", "|c|d|0|True"},
    {"{{ [1, 'a', none, (1,), {'k': [true]}] }} {{ \"it's\" }} {{ ['it\\'s'] }}",
     "[1, 'a', None, (1,), {'k': [True]}] it's [\"it's\"]"},
    {"{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'role' in messages[0] }}{{ 'x' not in messages[0] }}", "TrueTrueTrueTrue"},
    {"{{ 'h\\u00e9llo'[1] }}{{ 'h\\u00e9llo'[-2:] }}{{ 'abcdef'[::2] }}{{ [1, 2, 3][::-1] }}{{ 'h\\u00e9' | length }}",
     "\xc3\xa9loace[3, 2, 1]2"},
    {"{{ messages[2].tool_calls[0].function.arguments.y[3] }}", "\xc3\xa9\""},
    /* tests */
    {"{{ tools is none }}{{ nothing is defined }}{{ messages is iterable }}{{ messages[0] is mapping }}"
     "{{ 'x' is string }}{{ 1 is number }}{{ true is boolean }}{{ 3 is odd }}{{ 1 is eq 1 }}{{ 'A' is upper }}",
     "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrue"},
    /* filters */
    {"{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list"
     " | length }}|{{ messages | rejectattr('tool_calls') | map(attribute='content') | map('trim') | join }}",
     "system,user,assistant|1|Be brief.Hi"},
    {"{{ messages[2].tool_calls[0].function.arguments | tojson }}", "{\"x\": 1, \"y\": [true, null, 2.5, \"\xc3\xa9\\\"\"]}"},
    {"{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=true) }}", "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}"},
    {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'x' | indent(2, true) }}", "a\n  b\n\n  c|  x"},
    {"{{ '  Hi There ' | trim | lower }}{{ 'ab' | upper }}{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}",
     "hi thereABHello WorldHello"},
    {"{{ none | default('d') }}{{ undefined_x | default('u') }}{{ '' | default('e', true) }}{{ 3 | string }}"
     "{{ '42' | int + 1 }}{{ '2.5' | float }}{{ [3, 1, 2] | sort | first }}{{ [3, 1, 2] | max }}{{ [1, 1, 2] | unique"
     " | list }}",
     "Noneue3432.513[1, 2]"},
    {"{{ {'b': 2, 'a': 1} | dictsort }}{{ {'a': 1} | items | list }}{{ 'a-b' | replace('-', '+') }}",
     "[('a', 1), ('b', 2)][('a', 1)]a+b"},
    {"{{ '<b>' | safe + '<i>' }}{{ '<b>' | e }}{{ ('<b>' | safe) ~ '<i>' }}", "<b>&lt;i&gt;&lt;b&gt;<b><i>"},
    /* methods */
    {"{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',', 1) }}"
     "|{{ 'x.y.z'.rsplit('.', 1) }}|{{ 'xxabc'.lstrip('x') }}",
     "a b|['a', 'b', '', 'c']|['a', 'b', 'c']|['a', 'b,c']|['x.y', 'z']|abc"},
    {"{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'aXa'.replace('a', 'b') }}{{ 'Ab'.upper() }}"
     "{{ 'a{}b{x}'.format(1, x=2) }}{{ '-'.join(['a', 'b']) }}{{ messages[0].get('nope', 'dflt') }}"
     "{{ messages[0].get('nope') }}{{ messages[0].keys() | list }}",
     "TrueTruebXbABa1b2a-bdfltNone['role', 'content']"},
    {"{{ strftime_now('%Y-%m-%d') }}", "2025-01-02"},
    {"{{ bos_token }}{% if add_generation_prompt %}<|assistant|>{% endif %}", "<s><|assistant|>"},
    {"{% generation %}kept{% endgeneration %}", "kept"},
    /* a list of 98 references to one list of 98 ..., 300 deep: == and < take the same list as equal at once,
     * as Python does, and two such lists built apart compare by identity once 2^20 comparisons are spent
     * (all of them would take 98^300) */
    {"{% set ns = namespace(x=1, y=1) %}{% for i in range(300) %}{% set ns.x = [ns.x * 98] %}"
     "{% set ns.y = [ns.y * 98] %}{% endfor %}{{ ns.x == ns.x }}{{ [ns.x] < [ns.x, 1] }}{{ ns.x == ns.y }}"
     "{{ ns.x != ns.y }}{{ [2, ns.x] > [1, ns.y] }}",
     "TrueTrueFalseTrueTrue"},
};

START_TEST(test_case) {
    bt_jinja_opts o = {.now = 1735787045};
    setenv("TZ", "UTC", 1);
    ck_assert_str_eq(render(k_cases[_i].src, &o), k_cases[_i].want);
}
END_TEST

static const struct {
    const char *src, *want;
} k_errors[] = {
    /* parse time: LINE:COLUMN */
    {"{% if x %}abc", "ERR(-1): 1:14: unexpected end of template: missing {% endif %}"},
    {"a\n{% include 'x' %}", "ERR(-1): 2:4: the statement 'include' is not supported"},
    {"{% for x in y recursive %}{% endfor %}", "ERR(-1): 1:15: recursive loops are not supported"},
    {"{{ 1 + }}", "ERR(-1): 1:8: unexpected end of print statement"},
    {"{% endfor %}", "ERR(-1): 1:4: unexpected 'endfor'"},
    {"{% frobnicate %}", "ERR(-1): 1:4: encountered unknown tag 'frobnicate'"},
    {"{{ 'abc }}", "ERR(-1): 1:4: unterminated string"},
    {"{{ x ]] }}", "ERR(-1): 1:6: unexpected ']'"},
    {"{# no end", "ERR(-1): 1:1: missing end of comment tag"},
    {"{{ x", "ERR(-1): 1:1: unexpected end of template: the tag is not closed"},
    {"{% for m in messages %}\n{{ m | nosuch }}{% endfor %}", "ERR(-1): 2:8: No filter named 'nosuch'."},
    {"{{ x is nosuch }}", "ERR(-1): 1:6: No test named 'nosuch'."},
    {"{{ f(*a) }}", "ERR(-1): 1:6: *args and **kwargs in calls are not supported"},
    /* an unknown filter under an if fails only when it runs, as jinja2 */
    {"{% if false %}{{ x | nosuch }}{% endif %}ok", "ok"},
    {"{% if true %}{{ x | nosuch }}{% endif %}", "ERR(-1): 1:21: No filter named 'nosuch' found."},
    /* the template's own refusal: its message, nothing else */
    {"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}",
     "ERR(-6): Conversation roles must alternate user/assistant/user/assistant/..."},
    /* ... and when it gives none, that it gave none */
    {"{{ raise_exception('') }}", "ERR(-6): the template raised an exception without a message"},
    {"x{{ raise_exception(nothing) | tojson }}", "ERR(-6): the template raised an exception without a message"},
    {"{{ 'a' + raise_exception() }}",
     "ERR(-1): 1:25: raise_exception() missing 1 required positional argument: 'message'"},
    /* undefined: printed as nothing, its attribute an error */
    {"[{{ nothing }}]{{ nothing.attr }}", "ERR(-1): 1:26: 'nothing' is undefined"},
    {"{{ messages[0].nope.x }}", "ERR(-1): 1:20: 'dict object' has no attribute 'nope'"},
    {"{{ 'a' + 1 }}", "ERR(-1): 1:8: can only concatenate str (not \"int\") to str"},
    {"{% for x in 5 %}{% endfor %}", "ERR(-1): 1:13: 'int' object is not iterable"},
    {"{{ nothing | tojson }}", "ERR(-1): 1:14: Object of type Undefined is not JSON serializable"},
    {"{{ messages | map(attribute='role') | tojson }}", "ERR(-1): 1:39: Object of type generator is not JSON serializable"},
    {"{{ [].append(1) }}", "ERR(-1): 1:13: access to attribute 'append' of 'list' object is unsafe."},
    {"{{ 9223372036854775807 + 1 }}", "ERR(-1): 1:24: integer overflow in +"},
    {"{% for a, b in [[1, 2], [3]] %}{% endfor %}", "ERR(-1): 1:26: not enough values to unpack (expected 2, got 1)"},
    /* bounds: loops, recursion, memory */
    {"{% set r = range(1001) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
     "ERR(-1): 1:54: the template ran more than 1000000 steps (loop iterations and macro calls)"},
    {"{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "ERR(-1): 1:21: nested too deep (more than 2000 levels of calls)"},
    {"{{ range(100001) }}", "ERR(-1): 1:9: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "ERR(-2): the template used more than 16 MiB"},
};

START_TEST(test_error) {
    bt_jinja_opts o = {.max_bytes = (size_t)16 << 20};
    ck_assert_str_eq(render(k_errors[_i].src, &o), k_errors[_i].want);
}
END_TEST

START_TEST(test_nesting_and_context) {
    /* deep nesting is a message, not a stack overflow */
    char *deep = malloc(40000);
    size_t n = 0;
    n += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 5000; i++) deep[n++] = '(';
    deep[n] = 0;
    ck_assert_str_eq(render(deep, NULL), "ERR(-1): 1:260: brackets nested too deep");
    n = 0;
    for (int i = 0; i < 3000; i++) n += (size_t)sprintf(deep + n, "{%% if 1 %%}");
    ck_assert_str_eq(render(deep, NULL), "ERR(-1): 1:2537: nested too deep (more than 256 levels)");
    free(deep);
    /* the context must be a JSON object */
    bt_jinja *t;
    char err[256], *out;
    ck_assert_int_eq(bt_jinja_parse("x", 1, &t, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_jinja_render(t, "[1, 2]", NULL, &out, NULL, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "the context is not valid JSON: the context is not an object at byte 6");
    ck_assert_int_eq(bt_jinja_render(t, "{\"a\": tru}", NULL, &out, NULL, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "the context is not valid JSON: an unexpected character at byte 6");
    /* jinja2 drops one newline at the end of a template and reads \r\n as \n */
    bt_jinja_free(t);
    ck_assert_int_eq(bt_jinja_parse("a\r\nb\n", 5, &t, err, sizeof err), BT_OK);
    size_t len;
    ck_assert_int_eq(bt_jinja_render(t, NULL, NULL, &out, &len, err, sizeof err), BT_OK);
    ck_assert_str_eq(out, "a\nb");
    ck_assert_uint_eq(len, 3);
    free(out);
    bt_jinja_free(t);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("jinja");
    TCase *tc = tcase_create("jinja");
    tcase_add_loop_test(tc, test_case, 0, (int)(sizeof k_cases / sizeof k_cases[0]));
    tcase_add_loop_test(tc, test_error, 0, (int)(sizeof k_errors / sizeof k_errors[0]));
    tcase_add_test(tc, test_nesting_and_context);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
