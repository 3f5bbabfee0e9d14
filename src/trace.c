/* trace.c - the Chrome trace JSON writer (see trace.h). */
#include "trace.h"

#include <stdio.h>

#include "outfile.h"

static const char *kind_name(int kind) {
    return kind == BT_TRACE_COMPUTE ? "compute" : kind == BT_TRACE_WAIT ? "wait" : "send";
}

enum bt_status bt_trace_write_json(const struct bt_trace_event *all, size_t per, int n_ranks, const char *path,
                                   char *err, size_t errlen) {
    struct bt_outfile o;
    if (bt_outfile_open(&o, path, "the trace", err, errlen) != BT_OK) return BT_ERR_IO;
    FILE *f = o.f;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (int r = 0; r < n_ranks; r++) {
        fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}",
                r ? ",\n" : "", r, r);
        const struct bt_trace_event *ev = all + per * (size_t)r;
        for (int i = 1; i <= ev[0].k && (size_t)i < per; i++) {
            const struct bt_trace_event *e = &ev[i];
            char name[64];
            if (e->kind == BT_TRACE_COMPUTE) snprintf(name, sizeof name, "split %d mb %d", e->split, e->k);
            else if (e->kind == BT_TRACE_WAIT) snprintf(name, sizeof name, "wait rank %d mb %d", e->peer, e->k);
            else snprintf(name, sizeof name, "send rank %d mb %d", e->peer, e->k);
            fprintf(f,
                    ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
                    "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"micro_batch\": %d, \"split\": %d, "
                    "\"peer\": %d, \"bytes\": %lld}}",
                    name, kind_name(e->kind), r, 0, e->ts_us, e->dur_us, e->k, e->split, e->peer, (long long)e->bytes);
        }
    }
    fprintf(f, "\n]}\n");
    if (bt_outfile_commit(&o, "the trace", err, errlen) != BT_OK) return BT_ERR_IO;
    return BT_OK;
}
