/* trace.h - the Chrome trace (chrome://tracing, Perfetto) of a distributed
 * run: the events one rank records (a split's compute, a send, a wait) and
 * the JSON file with every rank's events, one track per rank. */
#ifndef BATON_TRACE_H
#define BATON_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum bt_trace_kind { BT_TRACE_COMPUTE = 0, BT_TRACE_WAIT = 1, BT_TRACE_SEND = 2 };

struct bt_trace_event {
    double ts_us, dur_us; /* from the common start (after a barrier) */
    int32_t kind, k, split, peer;
    int64_t bytes;
};

/* Write the events of n_ranks ranks to path: rank r's events are
 * events[r * per + 1 .. r * per + events[r * per].k] (slot 0 of each rank
 * carries its count).  Written to a temporary name, then renamed: never
 * half-written.  BT_ERR_IO and a message in err when it cannot be. */
enum bt_status bt_trace_write_json(const struct bt_trace_event *events, size_t per, int n_ranks, const char *path,
                                   char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
