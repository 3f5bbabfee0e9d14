/* test_grammar.c - constrained sampling's parts: byte grammars (what they
 * match, their bounds, left recursion refused), JSON schemas compiled to
 * grammars (texts each schema takes and refuses; bad schemas, each with its
 * path and message), tool-call grammars and the parse of a reply, the
 * vocabulary mask against the token-by-token check on a real vocabulary,
 * and the sampler's fast path against masking first (the same token, and
 * the same random stream after it). */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "testutil.h"
#include "text/constrain.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/sampler.h"
#include "text/tokenizer.h"
#include "text/tool_call.h"
#include "text/vocab_gguf.h"

static bool matches(const bt_grammar *g, const char *s) { return bt_grammar_match(g, s, strlen(s)); }

/* ---- grammars ---- */

START_TEST(test_grammar_basics) {
    char err[256];
    bt_grammar *g = bt_grammar_new();
    /* root ::= "ab" digit{1,3} ("x" | "yz" | nothing) */
    int32_t d = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, d);
    bt_grammar_add_range(g, d, '0', '9');
    int32_t ds = bt_grammar_repeat(g, d, 1, 3);
    int32_t tail = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, tail);
    bt_grammar_add_lit(g, tail, "x", 1);
    bt_grammar_add_alt(g, tail);
    bt_grammar_add_lit(g, tail, "yz", 2);
    bt_grammar_add_alt(g, tail);
    int32_t root = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, root);
    bt_grammar_add_lit(g, root, "ab", 2);
    bt_grammar_add_ref(g, root, ds);
    bt_grammar_add_ref(g, root, tail);
    ck_assert_int_eq(bt_grammar_finish(g, root, err, sizeof err), BT_OK);
    ck_assert(matches(g, "ab1"));
    ck_assert(matches(g, "ab123x"));
    ck_assert(matches(g, "ab12yz"));
    ck_assert(!matches(g, "ab"));
    ck_assert(!matches(g, "ab1234"));
    ck_assert(!matches(g, "ab1y"));
    ck_assert(!matches(g, "ab1xx"));
    /* a state: complete after "ab1", not closed; closed after "ab1x" */
    bt_grammar_state *s = bt_grammar_state_new(g), *t = bt_grammar_state_new(g);
    ck_assert(!bt_grammar_state_complete(s));
    ck_assert(bt_grammar_state_bytes(s, "ab1", 3, t));
    ck_assert(bt_grammar_state_complete(s) && !bt_grammar_state_closed(s));
    ck_assert(bt_grammar_state_bytes(s, "x", 1, t));
    ck_assert(bt_grammar_state_complete(s) && bt_grammar_state_closed(s));
    ck_assert(!bt_grammar_state_bytes(s, "x", 1, t));
    ck_assert(bt_grammar_state_empty(s));
    bt_grammar_state_free(s);
    bt_grammar_state_free(t);
    bt_grammar_free(g);
}
END_TEST

START_TEST(test_grammar_refused) {
    char err[256];
    /* left recursion through a nullable rule: e ::= n e "x" | "y", n ::= "" | "a" */
    bt_grammar *g = bt_grammar_new();
    int32_t n = bt_grammar_add_rule(g), e = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, n);
    bt_grammar_add_alt(g, n);
    bt_grammar_add_lit(g, n, "a", 1);
    bt_grammar_add_alt(g, e);
    bt_grammar_add_ref(g, e, n);
    bt_grammar_add_ref(g, e, e);
    bt_grammar_add_lit(g, e, "x", 1);
    bt_grammar_add_alt(g, e);
    bt_grammar_add_lit(g, e, "y", 1);
    ck_assert_int_eq(bt_grammar_finish(g, e, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "grammar: rule 1 is left-recursive");
    bt_grammar_free(g);
    /* right recursion is fine, and deep nesting stops at the depth bound: p ::= "(" p ")" | "" */
    g = bt_grammar_new();
    int32_t p = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, p);
    bt_grammar_add_lit(g, p, "(", 1);
    bt_grammar_add_ref(g, p, p);
    bt_grammar_add_lit(g, p, ")", 1);
    bt_grammar_add_alt(g, p);
    ck_assert_int_eq(bt_grammar_finish(g, p, err, sizeof err), BT_OK);
    ck_assert(matches(g, "((()))"));
    ck_assert(!matches(g, "(()"));
    char deep[2 * BT_GRAMMAR_MAX_DEPTH + 8];
    int k = BT_GRAMMAR_MAX_DEPTH + 2;
    for (int i = 0; i < k; i++) deep[i] = '(', deep[k + i] = ')';
    ck_assert(!bt_grammar_match(g, deep, 2 * (size_t)k));
    bt_grammar_free(g);
    /* a rule without an alternative */
    g = bt_grammar_new();
    int32_t r = bt_grammar_add_rule(g), q = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, r);
    bt_grammar_add_ref(g, r, q);
    ck_assert_int_eq(bt_grammar_finish(g, r, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "grammar: rule 1 has no alternative");
    bt_grammar_free(g);
}
END_TEST

/* ---- JSON schemas ---- */

/* g for schema (finished), or NULL with where/err */
static bt_grammar *schema_grammar(const char *schema, char *where, char *err) {
    bt_grammar *g = bt_grammar_new();
    bt_json_rules j;
    bt_json_rules_init(&j, g);
    int32_t r = bt_json_schema_compile(&j, schema, strlen(schema), where, 256, err, 256);
    if (r < 0 || bt_grammar_finish(g, r, err, 256) != BT_OK) {
        bt_grammar_free(g);
        return NULL;
    }
    return g;
}

static void expect_texts(const char *schema, const char *const *good, const char *const *bad) {
    char where[256], err[256];
    bt_grammar *g = schema_grammar(schema, where, err);
    ck_assert_msg(g, "%s: %s: %s", schema, where, err);
    for (int i = 0; good[i]; i++) ck_assert_msg(matches(g, good[i]), "%s should take %s", schema, good[i]);
    for (int i = 0; bad[i]; i++) ck_assert_msg(!matches(g, bad[i]), "%s should refuse %s", schema, bad[i]);
    bt_grammar_free(g);
}

START_TEST(test_schema_texts) {
    expect_texts("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                 "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2}},"
                 "\"required\":[\"name\"]}",
                 (const char *const[]){"{\"name\":\"x\"}", "{\"name\": \"\\u00e9t\\u00E9 \\\"q\\\"\", \"age\": -12}",
                                       "{\"name\":\"\xc3\xa9\",\"tags\":[\"a\",\"b\"]}",
                                       "{\n  \"name\": \"a\",\n  \"age\": 0\n}",
                                       "{\"name\":\"a\",\"age\":3,\"tags\":[]}", NULL},
                 (const char *const[]){"{}", "{\"age\":1}", "{\"name\":\"a\",\"other\":1}",
                                       "{\"name\":\"a\",\"tags\":[\"a\",\"b\",\"c\"]}", "{\"name\":\"a\",\"age\":01}",
                                       "{\"name\":\"a\",\"age\":1.5}", "{\"age\":1,\"name\":\"a\"}",
                                       "{\"name\":\"\xc3\"}", "{\"name\":\"\xed\xa0\x80\"}", "{\"name\":\"a\nb\"}",
                                       " {\"name\":\"a\"}", "{\"name\":\"a\"} ", NULL});
    /* optional properties only, enum, const, number, boolean, null, anyOf, type lists */
    expect_texts("{\"properties\":{\"a\":{\"enum\":[\"x\",1,null]},\"b\":{\"const\":{\"k\":[true]}},"
                 "\"c\":{\"type\":\"number\"},\"d\":{\"type\":[\"boolean\",\"null\"]},"
                 "\"e\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}}}",
                 (const char *const[]){"{}", "{\"a\":\"x\"}", "{\"a\":null,\"c\":-0.5e+10}", "{\"b\":{\"k\":[true]}}",
                                       "{\"c\":1E3,\"d\":false}", "{\"d\":null,\"e\":\"ab\"}", "{\"e\":7}", NULL},
                 (const char *const[]){"{\"a\":\"y\"}", "{\"b\":{\"k\":[false]}}", "{\"c\":.5}", "{\"c\":1.}",
                                       "{\"d\":0}", "{\"e\":\"abc\"}", "{,\"c\":1}", "{\"c\":1,}", NULL});
    /* $ref (recursive), $defs, additionalProperties, minItems, minLength */
    expect_texts("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                 "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
                 "\"$ref\":\"#/$defs/node\"}",
                 (const char *const[]){"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3}]}", NULL},
                 (const char *const[]){"{\"v\":1,\"kids\":[{}]}", NULL});
    expect_texts("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
                 (const char *const[]){"{}", "{\"a\":1,\"z\":[1,{\"q\":null}]}", "{\"z\":\"y\"}", NULL},
                 (const char *const[]){"{\"z\":}", NULL});
    expect_texts("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},\"minItems\":2}",
                 (const char *const[]){"[\"a\",\"abc\"]", "[ \"a\" , \"b\" , \"c\" ]", NULL},
                 (const char *const[]){"[]", "[\"a\"]", "[\"\",\"a\"]", "[\"abcd\",\"a\"]", NULL});
    /* any object; a schema of true */
    expect_texts("{\"type\":\"object\"}", (const char *const[]){"{}", "{\"a\":{\"b\":[1,2.5,\"c\",null]}}", NULL},
                 (const char *const[]){"[]", "\"a\"", "{\"a\"}", NULL});
    expect_texts("true", (const char *const[]){"1", "[]", "\"s\"", "{\"a\":false}", NULL},
                 (const char *const[]){"", "nul", NULL});
}
END_TEST

static void expect_bad(const char *schema, const char *where, const char *msg) {
    char w[256], err[256];
    bt_grammar *g = schema_grammar(schema, w, err);
    ck_assert_msg(!g, "%s should be refused", schema);
    ck_assert_str_eq(w, where);
    ck_assert_str_eq(err, msg);
}

START_TEST(test_schema_bad) {
    expect_bad("{\"type\":\"object\",", "",
               "the schema is not valid JSON: line 1, column 17: string or '}' expected near end of file");
    expect_bad("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":2}}}",
               "properties.age.multipleOf", "the schema keyword 'multipleOf' is not supported");
    expect_bad("{\"type\":\"object\",\"minProperties\":1}", "minProperties",
               "the schema keyword 'minProperties' is not supported");
    expect_bad("{\"type\":\"strin\"}", "type",
               "unknown type 'strin' (object, array, string, number, integer, boolean, null)");
    expect_bad("{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "",
               "'required' names 'b', which is not in 'properties'");
    expect_bad("{\"$ref\":\"#/$defs/missing\"}", "",
               "'$ref' '#/$defs/missing' does not name a schema of this document (\"#/$defs/Name\")");
    expect_bad("{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"not\":{}}}},"
               "\"$ref\":\"#/$defs/a\"}",
               "$defs.a.items.not", "the schema keyword 'not' is not supported");
    expect_bad("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "", "'maxItems' 2 is below 'minItems' 3");
    expect_bad("{\"type\":\"array\",\"maxItems\":100000}", "maxItems", "'maxItems' must be an integer from 0 to 4096");
    expect_bad("false", "", "the schema 'false' allows no value");
    expect_bad("{\"anyOf\":[{\"type\":\"integer\"},3]}", "anyOf[1]", "a schema must be an object or a boolean");
    expect_bad("{\"allOf\":[{},{}]}", "", "'allOf' is supported with one schema only");
    expect_bad("{\"enum\":[]}", "enum", "'enum' must be an array of 1 to 4096 entries");
    /* a $ref cycle with no text in between: refused when the grammar is sealed */
    char w[256], err[256];
    ck_assert(!schema_grammar("{\"$ref\":\"#\"}", w, err));
    ck_assert_msg(strstr(err, "left-recursive"), "%s", err);
    /* ambiguity: 14 nested anyOf, each level another way to read the same digits */
    char amb[64 * 14 + 64] = "";
    for (int i = 0; i < 14; i++) strcat(amb, "{\"anyOf\":[{\"type\":\"integer\"},");
    strcat(amb, "{\"type\":\"integer\"}");
    for (int i = 0; i < 14; i++) strcat(amb, "]}");
    bt_grammar *g = schema_grammar(amb, w, err);
    ck_assert_msg(g, "%s", err);
    ck_assert(matches(g, "123"));
    ck_assert(!matches(g, "12a"));
    bt_grammar_free(g);
    /* nesting past the depth bound */
    char deep[64 * 20 + 64] = "";
    for (int i = 0; i < 70; i++) strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 70; i++) strcat(deep, "}");
    ck_assert(!schema_grammar(deep, w, err));
    ck_assert_str_eq(err, "schemas nested deeper than 64");
}
END_TEST

/* ---- integer bounds, patterns, formats, tuples ---- */

/* the schema {"type":"integer", bounds} takes exactly the integers lo..hi among -1100..1100 */
static void expect_int_range(const char *bounds, long lo, long hi) {
    char schema[256], where[256], err[256], t[32];
    snprintf(schema, sizeof schema, "{\"type\":\"integer\",%s}", bounds);
    bt_grammar *g = schema_grammar(schema, where, err);
    ck_assert_msg(g, "%s: %s: %s", schema, where, err);
    for (long v = -1100; v <= 1100; v++) {
        snprintf(t, sizeof t, "%ld", v);
        ck_assert_msg(matches(g, t) == (v >= lo && v <= hi), "%s: %s", schema, t);
    }
    static const char *const never[] = {"01", "-01", "+1", "1.0", "1e2", "", "-", "00", NULL};
    for (int i = 0; never[i]; i++) ck_assert_msg(!matches(g, never[i]), "%s should refuse %s", schema, never[i]);
    bt_grammar_free(g);
}

START_TEST(test_schema_integer_bounds) {
    expect_int_range("\"minimum\":0,\"maximum\":1000", 0, 1000);
    expect_int_range("\"minimum\":-15,\"maximum\":27", -15, 27);
    expect_int_range("\"minimum\":-27,\"maximum\":-15", -27, -15);
    expect_int_range("\"minimum\":1,\"maximum\":9", 1, 9);
    expect_int_range("\"minimum\":10,\"maximum\":99", 10, 99);
    expect_int_range("\"minimum\":19,\"maximum\":201", 19, 201);
    expect_int_range("\"minimum\":-999,\"maximum\":999", -999, 999);
    expect_int_range("\"minimum\":-1000,\"maximum\":-1", -1000, -1);
    expect_int_range("\"minimum\":5,\"maximum\":5", 5, 5);
    expect_int_range("\"minimum\":0,\"maximum\":0", 0, 0);
    expect_int_range("\"minimum\":-5,\"maximum\":0", -5, 0);
    expect_int_range("\"minimum\":123", 123, 100000);
    expect_int_range("\"minimum\":-15", -15, 100000);
    expect_int_range("\"minimum\":0", 0, 100000);
    expect_int_range("\"maximum\":27", -100000, 27);
    expect_int_range("\"maximum\":-15", -100000, -15);
    expect_int_range("\"maximum\":0", -100000, 0);
    expect_int_range("\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":10", 3, 9);
    expect_int_range("\"exclusiveMinimum\":-4,\"exclusiveMaximum\":-2.5", -3, -3);
    expect_int_range("\"minimum\":1.5,\"maximum\":7.5", 2, 7);
    expect_int_range("\"minimum\":-7.5,\"maximum\":7.9", -7, 7);
    expect_int_range("\"minimum\":3,\"exclusiveMinimum\":5,\"maximum\":20,\"exclusiveMaximum\":30", 6, 20);
    expect_int_range("\"minimum\":-1e300,\"maximum\":1e300", -100000, 100000);
    /* random bounds against the arithmetic */
    bt_rng rng;
    bt_rng_seed(&rng, 7);
    for (int k = 0; k < 40; k++) {
        long a = (long)(bt_rng_next(&rng) % 2001) - 1000, b = (long)(bt_rng_next(&rng) % 2001) - 1000;
        char bounds[64];
        snprintf(bounds, sizeof bounds, "\"minimum\":%ld,\"maximum\":%ld", a < b ? a : b, a < b ? b : a);
        expect_int_range(bounds, a < b ? a : b, a < b ? b : a);
    }
    /* 16 digits, as the integer without bounds */
    expect_texts("{\"type\":\"integer\",\"minimum\":5}", (const char *const[]){"9999999999999999", "5", NULL},
                 (const char *const[]){"10000000000000000", "4", "-5", NULL});
    expect_texts("{\"type\":[\"integer\",\"null\"],\"maximum\":-9999999999999998}",
                 (const char *const[]){"-9999999999999999", "-9999999999999998", "null", NULL},
                 (const char *const[]){"-9999999999999997", "0", NULL});
    /* number bounds are not enforced (as llama.cpp) */
    expect_texts("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", (const char *const[]){"0.5", "7", "-2.5", NULL},
                 (const char *const[]){"a", NULL});
}
END_TEST

/* {"type":"string","pattern":pattern}: takes the JSON texts good, refuses bad */
static void expect_pattern(const char *pattern, const char *const *good, const char *const *bad) {
    json_t *s = json_pack("{s:s, s:s}", "type", "string", "pattern", pattern);
    char *text = json_dumps(s, JSON_COMPACT);
    expect_texts(text, good, bad);
    free(text);
    json_decref(s);
}

START_TEST(test_schema_pattern) {
    expect_pattern("^[a-z]+$", (const char *const[]){"\"abc\"", "\"z\"", NULL},
                   (const char *const[]){"\"\"", "\"aB\"", "\"a b\"", "abc", NULL});
    expect_pattern("^\\d{3}-\\d{4}$", (const char *const[]){"\"555-1234\"", NULL},
                   (const char *const[]){"\"55-1234\"", "\"5555-1234\"", "\"555-12345\"", "\"abc-defg\"", NULL});
    expect_pattern("^(foo|bar)+baz?$", (const char *const[]){"\"fooba\"", "\"barfoobaz\"", NULL},
                   (const char *const[]){"\"ba\"", "\"foobazz\"", "\"fobaz\"", NULL});
    expect_pattern("^a{2,3}$", (const char *const[]){"\"aa\"", "\"aaa\"", NULL},
                   (const char *const[]){"\"a\"", "\"aaaa\"", NULL});
    expect_pattern("^a{2,}$", (const char *const[]){"\"aa\"", "\"aaaaa\"", NULL}, (const char *const[]){"\"a\"", NULL});
    expect_pattern("^a{0}b$", (const char *const[]){"\"b\"", NULL}, (const char *const[]){"\"ab\"", NULL});
    /* a negated class: escapes and UTF-8 as JSON writes them */
    expect_pattern("^[^0-9]*$",
                   (const char *const[]){"\"\"", "\"abc\"", "\"a\\\"b\\\\\"", "\"\xc3\xa9\"", "\"\\n\\u001f\\u001F\"", NULL},
                   (const char *const[]){"\"a1\"", "\"\\u0041\"", "\"a\"b\"", NULL});
    expect_pattern("^.$",
                   (const char *const[]){"\"a\"", "\"\xc3\xa9\"", "\"\xe2\x82\xac\"", "\"\xf0\x9f\x98\x80\"", "\"\\\"\"",
                                         "\"\\t\"", NULL},
                   (const char *const[]){"\"\\n\"", "\"\\r\"", "\"ab\"", "\"\"", "\"\xe2\x80\xa8\"", NULL});
    expect_pattern("^[^]$", (const char *const[]){"\"\\n\"", "\"x\"", NULL}, (const char *const[]){"\"\"", NULL});
    /* anchors: a side without one is free */
    expect_pattern("abc", (const char *const[]){"\"xxabcyy\"", "\"abc\"", "\"\\nabc\"", NULL},
                   (const char *const[]){"\"abx\"", "\"\"", NULL});
    expect_pattern("^ab", (const char *const[]){"\"abzzz\"", "\"ab\"", NULL}, (const char *const[]){"\"xab\"", NULL});
    expect_pattern("c$", (const char *const[]){"\"abc\"", NULL}, (const char *const[]){"\"ca\"", NULL});
    expect_pattern("^a|b$", (const char *const[]){"\"axx\"", "\"xxb\"", NULL}, (const char *const[]){"\"xax\"", NULL});
    /* escapes, classes, groups, lazy quantifiers */
    expect_pattern("^\\w+@\\w+\\.com$", (const char *const[]){"\"a_1@b.com\"", NULL},
                   (const char *const[]){"\"a@b.org\"", "\"a@bxcom\"", "\"@b.com\"", NULL});
    expect_pattern("^[\\u00e0-\\u00ff]+$", (const char *const[]){"\"\xc3\xa0\xc3\xbf\"", NULL},
                   (const char *const[]){"\"a\"", "\"\xc4\x80\"", NULL});
    expect_pattern("^\\s?x$", (const char *const[]){"\"x\"", "\" x\"", "\"\\tx\"", NULL},
                   (const char *const[]){"\"  x\"", NULL});
    expect_pattern("^[A-Fa-f0-9-]{3}$", (const char *const[]){"\"a-F\"", NULL},
                   (const char *const[]){"\"g00\"", "\"a-\"", NULL});
    expect_pattern("^\\.\\*\\(\\)\\[\\{$", (const char *const[]){"\".*()[{\"", NULL},
                   (const char *const[]){"\"a*()[{\"", NULL});
    expect_pattern("^(?:ab)*$", (const char *const[]){"\"\"", "\"abab\"", NULL}, (const char *const[]){"\"aba\"", NULL});
    expect_pattern("^x*?y+?$", (const char *const[]){"\"xxy\"", "\"y\"", NULL}, (const char *const[]){"\"x\"", NULL});
    expect_pattern("^\\x41\\u0042\\uD83D\\uDE00$", (const char *const[]){"\"AB\xf0\x9f\x98\x80\"", NULL},
                   (const char *const[]){"\"AB\"", NULL});
    expect_pattern("^\"\\\\$", (const char *const[]){"\"\\\"\\\\\"", NULL}, (const char *const[]){"\"\\\"\"", NULL});
    expect_pattern("^[\\d\\s]+$", (const char *const[]){"\"1 2\"", NULL}, (const char *const[]){"\"1a\"", NULL});
    expect_pattern("^()a(b|)$", (const char *const[]){"\"a\"", "\"ab\"", NULL}, (const char *const[]){"\"b\"", NULL});
    expect_pattern("^a{,2}}$", (const char *const[]){"\"a{,2}}\"", NULL}, (const char *const[]){"\"aa\"", NULL});
    /* nested counts stay linear: 4096 x 4096 */
    expect_pattern("^(a{0,4096}){0,4096}b$", (const char *const[]){"\"b\"", "\"aaab\"", NULL},
                   (const char *const[]){"\"a\"", NULL});
    /* no type: a pattern makes it a string */
    expect_texts("{\"pattern\":\"^a$\"}", (const char *const[]){"\"a\"", NULL}, (const char *const[]){"1", NULL});
}
END_TEST

static void expect_bad_pattern(const char *pattern, const char *msg) {
    json_t *s = json_pack("{s:{s:{s:s}}}", "properties", "code", "pattern", pattern);
    char *text = json_dumps(s, JSON_COMPACT);
    expect_bad(text, "properties.code.pattern", msg);
    free(text);
    json_decref(s);
}

START_TEST(test_schema_pattern_bad) {
    expect_bad_pattern("^(?=a)", "'pattern' at offset 1: a group '(?' other than '(?:' (a lookaround, a named group) "
                                 "is not supported");
    expect_bad_pattern("(a", "'pattern' at offset 0: '(' is not closed");
    expect_bad_pattern("a)", "'pattern' at offset 1: ')' without its '('");
    expect_bad_pattern("x[a", "'pattern' at offset 1: '[' is not closed");
    expect_bad_pattern("*a", "'pattern' at offset 0: '*' has nothing to repeat");
    expect_bad_pattern("a**", "'pattern' at offset 2: '*' has nothing to repeat");
    expect_bad_pattern("(a)\\1", "'pattern' at offset 3: '\\1' (a backreference) is not supported");
    expect_bad_pattern("a\\b", "'pattern' at offset 1: '\\b' (a word boundary) is not supported");
    expect_bad_pattern("\\p{L}", "'pattern' at offset 0: the escape '\\p' is not supported");
    expect_bad_pattern("a{3,2}", "'pattern' at offset 1: the count's maximum 2 is below its minimum 3");
    expect_bad_pattern("a{5000}", "'pattern' at offset 1: a count past 4096");
    expect_bad_pattern("(a*)*", "'pattern' at offset 4: an unbounded repetition of what may be empty (as '(a*)*') is "
                                "not supported");
    expect_bad_pattern("[z-a]", "'pattern' at offset 1: the range's start is after its end");
    expect_bad_pattern("[\\d-z]", "'pattern' at offset 1: a range with a class escape (\\d, \\w, \\s) as an end");
    expect_bad_pattern("a^", "'pattern' at offset 1: '^' is supported only at the start ('^') or end ('$') of the "
                             "pattern or of a top-level alternative");
    expect_bad_pattern("(a$)", "'pattern' at offset 2: '$' is supported only at the start ('^') or end ('$') of the "
                               "pattern or of a top-level alternative");
    expect_bad_pattern("[]", "'pattern' at offset 0: '[]' matches no character");
    expect_bad_pattern("a\\", "'pattern' at offset 1: a '\\' ends the pattern");
    expect_bad_pattern("\\uD800", "'pattern' at offset 0: a lone surrogate '\\uD800'");
    expect_bad_pattern("\\x4", "'pattern' at offset 0: '\\x' needs 2 hex digits");
    expect_bad("{\"type\":\"string\",\"pattern\":3}", "pattern", "'pattern' must be a string");
    expect_bad("{\"type\":\"string\",\"pattern\":\"^a$\",\"maxLength\":3}", "maxLength",
               "'maxLength' beside 'pattern' is not supported");
    expect_bad("{\"type\":\"string\",\"format\":\"date\",\"minLength\":3}", "minLength",
               "'minLength' beside 'format' is not supported");
    expect_bad("{\"type\":\"string\",\"format\":\"uuid\",\"pattern\":\"a\"}", "format",
               "'format' beside 'pattern' is not supported");
    expect_bad("{\"type\":\"string\",\"format\":1}", "format", "'format' must be a string");
    expect_bad("{\"type\":\"integer\",\"minimum\":\"1\"}", "minimum", "'minimum' must be a number");
    expect_bad("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMaximum\":5}", "",
               "no integer of at most 16 digits is within the bounds (from 5 to 4)");
    expect_bad("{\"type\":\"integer\",\"minimum\":1e20}", "",
               "no integer of at most 16 digits is within the bounds (from 10000000000000000 to 9999999999999999)");
    /* deep groups */
    char deep[256] = "";
    for (int i = 0; i < 70; i++) strcat(deep, "(");
    expect_bad_pattern(deep, "'pattern' at offset 64: groups nested deeper than 64");
}
END_TEST

START_TEST(test_schema_format_tuple) {
    expect_texts("{\"type\":\"string\",\"format\":\"date\"}", (const char *const[]){"\"2024-02-29\"", "\"1999-12-31\"", NULL},
                 (const char *const[]){"\"2024-13-01\"", "\"2024-1-01\"", "\"24-01-01\"", "\"2024-01-32\"", NULL});
    expect_texts("{\"type\":\"string\",\"format\":\"time\"}",
                 (const char *const[]){"\"12:34:56Z\"", "\"23:59:59.123+05:30\"", NULL},
                 (const char *const[]){"\"24:00:00Z\"", "\"12:34:56\"", "\"12:60:00Z\"", NULL});
    expect_texts("{\"format\":\"date-time\"}", (const char *const[]){"\"2024-01-02T03:04:05Z\"", NULL},
                 (const char *const[]){"\"2024-01-02 03:04:05Z\"", "1", NULL});
    for (int i = 0; i < 2; i++)
        expect_texts(i ? "{\"type\":\"string\",\"format\":\"uuid4\"}" : "{\"type\":\"string\",\"format\":\"uuid\"}",
                     (const char *const[]){"\"123e4567-e89b-12d3-A456-426614174000\"", NULL},
                     (const char *const[]){"\"123e4567e89b-12d3-a456-426614174000\"", "\"123e4567-e89b-12d3-a456\"",
                                           NULL});
    /* an unknown format is an annotation, on a string or not */
    expect_texts("{\"type\":\"string\",\"format\":\"email\",\"maxLength\":2}",
                 (const char *const[]){"\"ab\"", NULL}, (const char *const[]){"\"abc\"", NULL});
    expect_texts("{\"type\":\"integer\",\"format\":\"int32\"}", (const char *const[]){"-5", NULL},
                 (const char *const[]){"\"5\"", NULL});
    /* tuples: exactly their schemas */
    expect_texts("{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}",
                 (const char *const[]){"[1,\"a\"]", "[ 1 , \"a\" ]", NULL},
                 (const char *const[]){"[1]", "[1,\"a\",2]", "[\"a\",1]", "[]", NULL});
    expect_texts("{\"type\":\"array\",\"items\":[{\"const\":1}],\"uniqueItems\":false}", (const char *const[]){"[1]", NULL},
                 (const char *const[]){"[2]", "[1,1]", NULL});
    expect_texts("{\"type\":\"array\",\"prefixItems\":[]}", (const char *const[]){"[]", "[ ]", NULL},
                 (const char *const[]){"[1]", NULL});
    expect_bad("{\"prefixItems\":[{}],\"items\":{}}", "items",
               "'items' beside 'prefixItems' (a tuple of exactly its schemas) is not supported");
    expect_bad("{\"type\":\"array\",\"items\":[{}],\"minItems\":1}", "minItems",
               "'minItems' beside 'items' (a tuple of exactly its schemas) is not supported");
    expect_bad("{\"prefixItems\":[{\"type\":\"strin\"}]}", "prefixItems[0].type",
               "unknown type 'strin' (object, array, string, number, integer, boolean, null)");
    expect_bad("{\"type\":\"array\",\"prefixItems\":{}}", "prefixItems", "'prefixItems' must be an array of schemas");
    expect_bad("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems", "'uniqueItems' true is not supported");
}
END_TEST

/* ---- tool calls ---- */

START_TEST(test_tool_calls) {
    char where[256], err[256];
    ck_assert_int_eq(bt_tool_format_detect("{% if tools %}<tool_call>{% endif %}"), BT_TOOL_FORMAT_HERMES);
    ck_assert_int_eq(bt_tool_format_detect("{{ messages }}"), BT_TOOL_FORMAT_NONE);
    const struct bt_tool tools[2] = {
        {"get_weather",
         "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}"},
        {"now", NULL},
    };
    bt_grammar *g;
    int bad_tool;
    ck_assert_int_eq(bt_tool_grammar_build(BT_TOOL_FORMAT_HERMES, tools, 2, -1, 2, &g, &bad_tool, where, sizeof where,
                                           err, sizeof err),
                     BT_OK);
    ck_assert(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                         "</tool_call>"));
    ck_assert(matches(g, "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"now\","
                         "\"arguments\":{\"tz\":1}}</tool_call>"));
    ck_assert(!matches(g, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{}}</tool_call>"));
    ck_assert(!matches(g, "<tool_call>{\"name\":\"other\",\"arguments\":{}}</tool_call>"));
    ck_assert(!matches(g, "hello"));
    bt_grammar_free(g);
    /* one named function, one call */
    ck_assert_int_eq(bt_tool_grammar_build(BT_TOOL_FORMAT_HERMES, tools, 2, 1, 1, &g, &bad_tool, where, sizeof where,
                                           err, sizeof err),
                     BT_OK);
    ck_assert(matches(g, "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>"));
    ck_assert(!matches(g, "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"now\","
                          "\"arguments\":{}}</tool_call>"));
    bt_grammar_free(g);
    /* a bad parameters schema names the tool and the path */
    const struct bt_tool bad[1] = {
        {"f", "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"multipleOf\":3}}}"}};
    ck_assert_int_eq(bt_tool_grammar_build(BT_TOOL_FORMAT_HERMES, bad, 1, -1, 1, &g, &bad_tool, where, sizeof where,
                                           err, sizeof err),
                     BT_ERR_INVALID);
    ck_assert_int_eq(bad_tool, 0);
    ck_assert_str_eq(where, "properties.x.multipleOf");
    /* parse: calls and the text outside them */
    const char *reply = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                        "</tool_call>\n<tool_call>{\"name\":\"now\",\"arguments\":\"{\\\"tz\\\": 2}\"}</tool_call>\n";
    struct bt_tool_call *calls;
    char *content;
    ck_assert_int_eq(bt_tool_calls_parse(BT_TOOL_FORMAT_HERMES, reply, strlen(reply), &calls, &content), 2);
    ck_assert_str_eq(calls[0].name, "get_weather");
    ck_assert_str_eq(calls[0].arguments, "{\"city\":\"Oslo\"}");
    ck_assert_str_eq(calls[1].name, "now");
    ck_assert_str_eq(calls[1].arguments, "{\"tz\":2}");
    ck_assert_str_eq(content, "Let me look.");
    bt_tool_calls_free(calls, 2);
    free(content);
    /* a call that is not well formed: all of it is text */
    const char *broken = "<tool_call>{\"name\": 3}</tool_call>";
    ck_assert_int_eq(bt_tool_calls_parse(BT_TOOL_FORMAT_HERMES, broken, strlen(broken), &calls, &content), 0);
    ck_assert_str_eq(content, broken);
    free(content);
    /* what a stream may show: before the mark, or before a tail that may become it */
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_HERMES, "abc <tool", 9), 4);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_HERMES, "abc <tool_call>{", 16), 4);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_HERMES, "abc <b>", 7), 7);
}
END_TEST

/* ---- the vocabulary mask ---- */

START_TEST(test_mask_matches_check) {
    char path[512], err[256], where[256];
    bt_tokenizer *tok;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-qwen2.gguf", BATON_TEST_DATA);
    ck_assert_msg(bt_tokenizer_load(path, &tok, NULL, err, sizeof err) == BT_OK, "%s", err);
    bt_token_trie *trie;
    ck_assert_int_eq(bt_token_trie_new(tok, &trie, err, sizeof err), BT_OK);
    bt_grammar *g = schema_grammar("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                                   "\"n\":{\"type\":\"integer\"}},\"required\":[\"name\"]}",
                                   where, err);
    ck_assert_msg(g, "%s", err);
    bt_constraint *c = bt_constraint_new(g, trie);
    const uint32_t nv = bt_tokenizer_n_tokens(tok);
    uint8_t *mask = malloc(nv);
    /* after each of these prefixes, the mask is the token-by-token check */
    const char *steps[] = {"", "{", "\"name", "\": \"h\xc3\xa9", "llo", "\"", ", \"n\": 4", "2}", NULL};
    int32_t eos = bt_tokenizer_eos(tok);
    for (int s = 0; steps[s]; s++) {
        bt_tokens t = {0};
        ck_assert_int_eq(bt_tokenizer_tokenize(tok, steps[s], strlen(steps[s]), 0, 0, &t, err, sizeof err), BT_OK);
        for (size_t i = 0; i < t.n; i++) ck_assert(bt_constraint_accept(c, t.ids[i]));
        bt_tokens_free(&t);
        const bool end_ok = bt_constraint_complete(c);
        bt_constraint_mask(c, end_ok, mask);
        uint32_t n_allowed = 0;
        for (uint32_t id = 0; id < nv; id++) {
            ck_assert_msg(mask[id] == bt_constraint_allows(c, (int32_t)id, end_ok), "step %d token %u", s, id);
            n_allowed += mask[id];
        }
        ck_assert_uint_gt(n_allowed, 0);
        ck_assert_int_eq(mask[eos], steps[s + 1] == NULL);
    }
    /* complete: only the end may come */
    ck_assert(bt_constraint_complete(c));
    bt_constraint_mask(c, true, mask);
    for (uint32_t id = 0; id < nv; id++) ck_assert_int_eq(mask[id], bt_tokenizer_is_eog(tok, (int32_t)id) != 0);
    free(mask);
    bt_constraint_free(c);
    bt_grammar_free(g);
    bt_token_trie_free(trie);
    bt_tokenizer_free(tok);
}
END_TEST

/* ---- the sampler's fast path against masking first ---- */

static bool allow_from(void *user, int32_t id) { return ((const uint8_t *)user)[id] != 0; }

START_TEST(test_fast_path_equals_mask) {
    enum { NV = 300 };
    char err[256];
    bt_rng r;
    bt_rng_seed(&r, 7);
    float logits[NV];
    uint8_t allowed[NV];
    int decided = 0;
    for (int trial = 0; trial < 400; trial++) {
        bt_sampler_params p;
        bt_sampler_params_default(&p);
        p.seed = (uint64_t)trial;
        p.temp = trial % 4 == 0 ? 0.0f : 0.7f;
        p.top_k = trial % 3 == 0 ? 0 : 1 + trial % 20;
        p.top_p = trial % 2 ? 0.9f : 1.0f;
        p.min_p = trial % 5 ? 0.02f : 0.0f;
        const double density = trial % 7 == 0 ? 0.02 : 0.6;
        for (int i = 0; i < NV; i++) {
            logits[i] = (float)(bt_rng_uniform(&r) * 8.0 - 4.0);
            if (i % 17 == 0) logits[i] = logits[0]; /* ties */
            allowed[i] = bt_rng_uniform(&r) < density;
        }
        bt_sampler *a, *b;
        ck_assert_int_eq(bt_sampler_create(&p, NV, &a, err, sizeof err), BT_OK);
        ck_assert_int_eq(bt_sampler_create(&p, NV, &b, err, sizeof err), BT_OK);
        int32_t fast = bt_sampler_sample_checked(a, logits, allow_from, allowed);
        if (fast < 0)
            fast = bt_sampler_sample_masked(a, logits, allowed);
        else
            decided++;
        int32_t slow = bt_sampler_sample_masked(b, logits, allowed);
        ck_assert_int_eq(fast, slow);
        ck_assert(slow < 0 || allowed[slow]);
        /* the random streams are in step afterwards */
        ck_assert_int_eq(bt_sampler_sample(a, logits), bt_sampler_sample(b, logits));
        bt_sampler_free(a);
        bt_sampler_free(b);
    }
    ck_assert_int_gt(decided, 50); /* the fast path did settle many */
    /* nothing allowed: -1 */
    memset(allowed, 0, sizeof allowed);
    bt_sampler_params p;
    bt_sampler_params_default(&p);
    bt_sampler *a;
    ck_assert_int_eq(bt_sampler_create(&p, NV, &a, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_sample_masked(a, logits, allowed), -1);
    bt_sampler_free(a);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("grammar");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_grammar_basics);
    tcase_add_test(tc, test_grammar_refused);
    tcase_add_test(tc, test_schema_texts);
    tcase_add_test(tc, test_schema_bad);
    tcase_add_test(tc, test_schema_integer_bounds);
    tcase_add_test(tc, test_schema_pattern);
    tcase_add_test(tc, test_schema_pattern_bad);
    tcase_add_test(tc, test_schema_format_tuple);
    tcase_add_test(tc, test_tool_calls);
    tcase_add_test(tc, test_mask_matches_check);
    tcase_add_test(tc, test_fast_path_equals_mask);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
