/* jinja_tool.c - render a chat template with a JSON context, for
 * tests/jinja_test.py, which compares the output with Python's jinja2.
 *
 *   jinja_tool TEMPLATE CONTEXT.json [NOW]
 *
 * NOW: the seconds since the epoch strftime_now formats.  Prints the output
 * and exits 0; a template that raises prints "raised: MESSAGE" on stderr and
 * exits 3; any other error prints "error: MESSAGE" and exits 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *p = malloc(cap);
    for (size_t k; p && (k = fread(p + len, 1, cap - len - 1, f)) > 0;) {
        len += k;
        if (cap - len < 2) {
            char *q = realloc(p, cap *= 2);
            if (!q) free(p);
            p = q;
        }
    }
    fclose(f);
    if (p) p[len] = 0;
    *n = len;
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: jinja_tool TEMPLATE CONTEXT.json [NOW]\n");
        return 2;
    }
    size_t tn, cn;
    char *src = slurp(argv[1], &tn), *ctx = slurp(argv[2], &cn);
    if (!src || !ctx) {
        fprintf(stderr, "error: cannot read %s\n", src ? argv[2] : argv[1]);
        return 2;
    }
    char err[1024];
    bt_jinja *t;
    if (bt_jinja_parse(src, tn, &t, err, sizeof err) != BT_OK) {
        fprintf(stderr, "error: %s: %s\n", argv[1], err);
        free(src), free(ctx);
        return 2;
    }
    bt_jinja_opts o = {.now = argc > 3 ? strtoll(argv[3], NULL, 10) : 0};
    char *out;
    size_t n;
    enum bt_status st = bt_jinja_render(t, ctx, &o, &out, &n, err, sizeof err);
    bt_jinja_free(t);
    free(src), free(ctx);
    if (st == BT_ERR_ABORTED) {
        fprintf(stderr, "raised: %s\n", err);
        return 3;
    }
    if (st != BT_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    fwrite(out, 1, n, stdout);
    free(out);
    return 0;
}
