/* dump_tensors.h - `--dump-tensors PATTERN`: the eval callback that prints
 * each computed node whose name matches PATTERN (fnmatch), from the rank
 * that computes it, with its shape and statistics, so that a wrong token
 * across ranks can be traced to the first tensor that differs. */
#ifndef BATON_CLI_DUMP_TENSORS_H
#define BATON_CLI_DUMP_TENSORS_H

#include <stdio.h>

#include <stdbool.h>
#include <stdint.h>

#include "baton/backend.h"

struct bt_cli_dump {
    const char *pattern;        /* fnmatch glob on node names */
    int rank;
    /* the number of the ubatch being computed (the engine's, the runtime's) */
    uint64_t (*ubatch)(const void *ctx);
    const void *ctx;
    FILE *f;                    /* where the lines go (one write each) */
    void *buf;                  /* a node's bytes, grown as needed */
    size_t cap;
    unsigned long long n_lines; /* lines written */
};

/* One line per matching node once computed:
 *   dump: rank R ubatch U NAME OP TYPE [ne0,ne1,ne2,ne3] min A max B mean C hash H
 * (min/max/mean for F32, F16, BF16 and I32 tensors; hash: FNV-1a 64 of the
 * elements' bytes in index order, the same for equal values whatever the
 * rank, strides or thread count).  user: a struct bt_cli_dump. */
bool bt_cli_dump_eval(struct bt_tensor *t, bool ask, void *user);
void bt_cli_dump_free(struct bt_cli_dump *d);

#endif
