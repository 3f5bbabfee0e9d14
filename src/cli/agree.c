/* agree.c - the ranks of one run agree on their options (agree.h): every
 * rank's verdict on its command line and its values of the options that must
 * be equal go to rank 0 in one gather; rank 0 names the first rank and option
 * at fault and broadcasts the exit code. */
#include "agree.h"

#include "common.h"
#include "signals.h"
#include "run/bringup.h"

#include <limits.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_BYTES 512

/* What one rank sends: its verdict, then n values. */
struct record_head {
    int32_t rc;
    int32_t n;
    char err[ERR_BYTES];
};
struct record_item {
    char value[BT_CLI_AGREE_VALUE];
    uint8_t given;
};

void bt_cli_agree_add(struct bt_cli_agree_item *items, int *n, const char *option, bool given, const char *fmt, ...) {
    struct bt_cli_agree_item *it = &items[(*n)++];
    it->option = option;
    it->given = given;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->value, sizeof it->value, fmt, ap);
    va_end(ap);
}

void bt_cli_agree_add_where(struct bt_cli_agree_item *items, int *n, const char *topology, const char *backend) {
    bt_cli_agree_add(items, n, "--topology", topology != NULL && *topology, "%s", topology ? topology : "");
    bt_cli_agree_add(items, n, "--backend", backend != NULL, "%s", backend ? backend : "");
}

bool bt_cli_env_many_ranks(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return true;
    }
    return false;
}

/* A rank's record, rounded up so that the next rank's head is aligned in the
 * gathered array (an item is BT_CLI_AGREE_VALUE + 1 bytes). */
static size_t record_bytes(int n) {
    const size_t a = _Alignof(struct record_head);
    return (sizeof(struct record_head) + (size_t)n * sizeof(struct record_item) + a - 1) / a * a;
}

static void describe(char *buf, size_t len, const char *option, const struct record_item *it) {
    if (it->given && it->value[0]) snprintf(buf, len, "with %s %s", option, it->value);
    else if (it->given) snprintf(buf, len, "with %s", option);
    else snprintf(buf, len, "without %s", option);
}

/* Rank 0: the exit code and message for all records (P of them). */
static int judge(const uint8_t *all, int P, int n, const struct bt_cli_agree_item *items, const char *prog,
                 char *msg, size_t len) {
    const size_t rb = record_bytes(n);
    for (int r = 0; r < P; r++) {
        const struct record_head *h = (const struct record_head *)(all + rb * (size_t)r);
        if (h->rc == 0 && h->n == n) continue;
        if (h->n != n) {
            snprintf(msg, len, "%s: rank %d runs a different baton program than rank 0 (%d options to agree on, rank 0: %d)",
                     prog, r, (int)h->n, n);
            return 2;
        }
        if (r == 0) snprintf(msg, len, "%s: %.*s", prog, ERR_BYTES, h->err);
        else snprintf(msg, len, "%s: rank %d: %.*s", prog, r, ERR_BYTES, h->err);
        return h->rc;
    }
    const struct record_item *mine = (const struct record_item *)(all + sizeof(struct record_head));
    for (int r = 1; r < P; r++) {
        const struct record_item *theirs = (const struct record_item *)(all + rb * (size_t)r + sizeof(struct record_head));
        for (int i = 0; i < n; i++) {
            if (theirs[i].given == mine[i].given &&
                (!mine[i].given || strncmp(theirs[i].value, mine[i].value, BT_CLI_AGREE_VALUE) == 0))
                continue;
            char a[BT_CLI_AGREE_VALUE + 64], b[BT_CLI_AGREE_VALUE + 64];
            describe(a, sizeof a, items[i].option, &theirs[i]);
            describe(b, sizeof b, items[i].option, &mine[i]);
            snprintf(msg, len, "%s: rank %d was started %s but rank 0 %s; every rank needs the same %s", prog, r, a, b,
                     items[i].option);
            return 2;
        }
    }
    return 0;
}

int bt_cli_agree(bt_transport *t, const char *prog, int rc, const char *err, const struct bt_cli_agree_item *items,
                 int n) {
    const int P = t->size;
    const size_t rb = record_bytes(n);
    uint8_t *mine = calloc(1, rb);
    uint8_t *all = t->rank == 0 ? calloc((size_t)P, rb) : NULL;
    if (!mine || (t->rank == 0 && !all)) {
        fprintf(stderr, "%s: rank %d: out of memory\n", prog, t->rank);
        t->iface.abort(t, 1);
        return 1;
    }
    struct record_head *h = (struct record_head *)mine;
    h->rc = rc;
    h->n = n;
    snprintf(h->err, sizeof h->err, "%s", rc && err ? err : "");
    struct record_item *it = (struct record_item *)(mine + sizeof *h);
    for (int i = 0; i < n; i++) {
        it[i].given = items[i].given;
        if (items[i].given) memcpy(it[i].value, items[i].value, BT_CLI_AGREE_VALUE);
        it[i].value[BT_CLI_AGREE_VALUE - 1] = '\0';
    }
    int32_t verdict = 0;
    if (t->iface.gather(t, mine, rb, all, 0) != BT_OK) {
        fprintf(stderr, "%s: rank %d: %s\n", prog, t->rank, t->error);
        t->iface.abort(t, 1);
    }
    if (t->rank == 0) {
        char msg[2 * ERR_BYTES];
        verdict = judge(all, P, n, items, prog, msg, sizeof msg);
        if (verdict) fprintf(stderr, "%s\n", msg);
    }
    if (t->iface.bcast(t, &verdict, sizeof verdict, 0) != BT_OK) {
        fprintf(stderr, "%s: rank %d: %s\n", prog, t->rank, t->error);
        t->iface.abort(t, 1);
    }
    free(mine);
    free(all);
    return verdict;
}

bool bt_cli_rank_start(struct bt_rank *R, const struct bt_rank_config *c, int env_rank, int *prc, char *perr,
                       size_t n, int *argc, char ***argv) {
    bool bare = false; /* the start's own message (a topology's FILE:LINE:COLUMN: ...) */
    if (bt_rank_start(R, c, *prc != 0, bt_cli_env_many_ranks(), argc, argv) != BT_OK && !*prc) {
        snprintf(perr, n, "%s", R->error);
        *prc = R->exit_code;
        bare = true;
    }
    if (R->t) {
        bt_cli_signals_install(c->prog, R->rank); /* again, for the world rank */
        return true;
    }
    const bool prefix = *prc && !bare;
    if (env_rank == 0) fprintf(stderr, "%s%s%s\n", prefix ? c->prog : "", prefix ? ": " : "", *prc ? perr : R->error);
    bt_rank_free(R);
    if (!*prc) *prc = 1;
    return false;
}

void bt_cli_rank_end(struct bt_rank *R, int rc) {
    if (rc != 0) bt_cli_signals_ending();
    bt_rank_free(R);
}

int bt_cli_rank_agree(struct bt_rank *R, const struct bt_rank_config *c, int prc, char *perr, size_t n_perr,
                      const struct bt_cli_agree_item *items, int n_items, char *err, size_t n_err) {
    err[0] = '\0';
    if (!prc && R->have_topo && bt_topology_check_world(&R->topo, R->size, perr, n_perr) != BT_OK) prc = 1;
    /* a CPU rank's threads from the topology, against this node's cores (a
     * --threads given on the command line was checked when it was parsed) */
    if (!prc && c->threads == 0 && R->have_topo && R->topo.n_ranks == R->size) {
        const struct bt_topo_rank *tr = bt_topology_rank(&R->topo, R->rank);
        char what[PATH_MAX + 64];
        snprintf(what, sizeof what, "%s:%d:%d: rank %d: threads", c->topology, tr->threads_pos.line,
                 tr->threads_pos.col, R->rank);
        if (tr->backend == BT_TOPO_BACKEND_CPU && !bt_cli_threads_check(tr->threads, what, perr, n_perr)) prc = 1;
    }
    const int rc = bt_cli_agree(R->t, c->prog, prc, perr, items, n_items);
    if (rc != 0) return rc;
    if (bt_rank_setup(R, c) != BT_OK) {
        snprintf(err, n_err, "%s", R->error);
        return R->exit_code;
    }
    if (R->note[0]) fprintf(stderr, "%s: %s\n", c->prog, R->note); /* rank 0's only */
    return 0;
}
