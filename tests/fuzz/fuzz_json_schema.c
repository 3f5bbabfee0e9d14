/* fuzz_json_schema.c - libFuzzer harness for JSON schemas compiled to
 * grammars and the grammars' parse states (src/text/json_schema.c,
 * src/text/grammar.c; tests/fuzz/run_json_schema.sh).
 *
 * An input is a schema (JSON text), optionally followed by a NUL and a text.
 * The schema is compiled from an exact-size heap copy; when it compiles, the
 * text is run through a parse state byte by byte and through
 * bt_grammar_match, which must agree (a text that matches leaves a complete
 * state).  A schema that does not compile must say why and where.  Whatever
 * the input: an answer, never a crash, a leak or a hang (every expansion is
 * bounded).
 *
 * Linked with standalone.c it is a plain program that runs the same
 * function over the files and folders given on the command line: ctest runs
 * it over tests/fuzz/schema_seeds/ under ASan and UBSan. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"
#include "text/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t sn = nul ? (size_t)(nul - data) : size, tn = nul ? size - sn - 1 : 0;
    char *schema = malloc(sn ? sn : 1), *text = malloc(tn ? tn : 1);
    bt_grammar *g = bt_grammar_new();
    if (!schema || !text || !g) goto out;
    memcpy(schema, data, sn);
    if (tn) memcpy(text, nul + 1, tn);
    bt_json_rules j;
    bt_json_rules_init(&j, g);
    char where[256], err[512];
    int32_t r = bt_json_schema_compile(&j, schema, sn, where, sizeof where, err, sizeof err);
    if (r < 0 || bt_grammar_finish(g, r, err, sizeof err) != BT_OK) {
        if (!err[0]) abort(); /* every failure says why */
        goto out;
    }
    bt_grammar_state *s = bt_grammar_state_new(g), *t = bt_grammar_state_new(g);
    if (s && t) {
        bool alive = true;
        for (size_t i = 0; i < tn && alive; i++) {
            alive = bt_grammar_state_byte(s, (uint8_t)text[i], t);
            bt_grammar_state_copy(s, t);
            if (alive == bt_grammar_state_empty(s)) abort(); /* a refused byte leaves nothing */
        }
        if ((alive && bt_grammar_state_complete(s)) != bt_grammar_match(g, text, tn)) abort();
    }
    bt_grammar_state_free(s);
    bt_grammar_state_free(t);
out:
    bt_grammar_free(g);
    free(schema);
    free(text);
    return 0;
}
