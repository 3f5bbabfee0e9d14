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
 * Built with -DBT_FUZZ_STANDALONE it is a plain program that runs the same
 * function over the files and folders given on the command line: ctest runs
 * it over tests/fuzz/schema_seeds/ under ASan and UBSan. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

#ifdef BT_FUZZ_STANDALONE
static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = buf && n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf) return 1;
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int n = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "%s: cannot stat\n", argv[a]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[a])) return 1;
            n++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (!d) return 1;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[a], e->d_name);
            if (run_file(p)) {
                closedir(d);
                return 1;
            }
            n++;
        }
        closedir(d);
    }
    printf("fuzz_json_schema: %d inputs, no crash\n", n);
    return 0;
}
#endif
