/* dump_tensors.c - the eval callback behind `--dump-tensors` (see
 * dump_tensors.h). */
#include "dump_tensors.h"

#include <fnmatch.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* One element's value as a double (its type one of those with statistics). */
static double element(enum bt_type type, const uint8_t *p) {
    switch (type) {
    case BT_TYPE_F32: {
        float v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case BT_TYPE_F16: {
        bt_fp16_t v;
        memcpy(&v, p, sizeof v);
        return bt_fp16_to_fp32(v);
    }
    case BT_TYPE_BF16: {
        bt_bf16_t v;
        memcpy(&v, p, sizeof v);
        return bt_bf16_to_fp32(v);
    }
    default: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    }
}

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

bool bt_cli_dump_eval(struct bt_tensor *t, bool ask, void *user) {
    struct bt_cli_dump *d = user;
    if (ask) return fnmatch(d->pattern, t->name, 0) == 0;
    const size_t n = bt_nbytes(t);
    if (n > d->cap) {
        void *b = realloc(d->buf, n);
        if (!b) {
            fprintf(d->f, "dump: rank %d: %s: out of memory for its %zu bytes\n", d->rank, t->name, n);
            return true; /* the run goes on without this line */
        }
        d->buf = b;
        d->cap = n;
    }
    if (n > 0) bt_tensor_get(t, d->buf, 0, n);
    /* the elements in index order through the strides (a view may have gaps) */
    const bool stats = t->type == BT_TYPE_F32 || t->type == BT_TYPE_F16 || t->type == BT_TYPE_BF16 ||
                       t->type == BT_TYPE_I32;
    const size_t row = bt_row_size(t->type, t->ne[0]);
    uint64_t h = 0xcbf29ce484222325ULL;
    double lo = 0, hi = 0, sum = 0;
    int64_t count = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const uint8_t *r = (const uint8_t *)d->buf + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                if (!stats) { /* block types: whole rows, contiguous within */
                    h = fnv1a(h, r, row);
                    continue;
                }
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const uint8_t *p = r + i0 * t->nb[0];
                    h = fnv1a(h, p, bt_type_size(t->type));
                    const double v = element(t->type, p);
                    if (count == 0 || v < lo) lo = v;
                    if (count == 0 || v > hi) hi = v;
                    sum += v;
                    count++;
                }
            }
    char line[512];
    int len = snprintf(line, sizeof line, "dump: rank %d ubatch %llu %s %s %s [%lld,%lld,%lld,%lld]", d->rank,
                       (unsigned long long)d->ubatch(d->ctx), t->name, bt_op_name(t->op),
                       bt_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3]);
    if (stats && count > 0 && len > 0 && (size_t)len < sizeof line)
        len += snprintf(line + len, sizeof line - (size_t)len, " min %.6g max %.6g mean %.6g", lo, hi,
                        sum / (double)count);
    if (len > 0 && (size_t)len < sizeof line)
        snprintf(line + len, sizeof line - (size_t)len, " hash %016" PRIx64 "\n", h);
    fputs(line, d->f);
    fflush(d->f);
    d->n_lines++;
    return true;
}

void bt_cli_dump_free(struct bt_cli_dump *d) {
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}
