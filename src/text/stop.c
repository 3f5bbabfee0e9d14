/* stop.c - the end of a generation (end-of-generation token, stop string,
 * token limit) and the text that may stream out before it.  The held-back
 * text is the longest tail that is the start of some stop string: any stop
 * string that appears later must begin inside it, so only it is searched. */
#define _GNU_SOURCE /* memmem */
#include "stop.h"
#include "../mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bt_stopper {
    char **stops;
    size_t *stop_len;
    size_t n_stops;
    int64_t max_tokens, n_tokens;
    bt_detok_stream ds;
    char *held; /* text not shown yet */
    size_t n_held, cap_held;
    char *out; /* what the last push gives */
    size_t cap_out;
    int done;
    int ignore_eog; /* an end-of-generation token is one more token (ignore_eos) */
    int32_t shown;  /* a control token whose text is shown (-1: none) */
};

void bt_stopper_set_ignore_eog(bt_stopper *s, int on) { s->ignore_eog = on != 0; }

void bt_stopper_show_token(bt_stopper *s, int32_t id) { s->shown = id; }

void bt_stopper_free(bt_stopper *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_stops; i++) free(s->stops[i]);
    BT_FREE_ALL(s->stops, s->stop_len, s->held, s->out, s);
}

enum bt_status bt_stopper_create(const char *const *stops, size_t n_stops, int64_t max_tokens, bt_stopper **out,
                                 char *err, size_t errlen) {
    *out = NULL;
    if (max_tokens == 0 || max_tokens < -1) {
        snprintf(err, errlen, "-n %lld: the number of tokens to generate must be positive (or -1: no limit)",
                 (long long)max_tokens);
        return BT_ERR_INVALID;
    }
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) {
            snprintf(err, errlen, "stop string %zu is empty", i + 1);
            return BT_ERR_INVALID;
        }
        int64_t bad = bt_utf8_check(stops[i], strlen(stops[i]));
        if (bad >= 0) {
            snprintf(err, errlen, "stop string %zu: invalid UTF-8 at byte %lld", i + 1, (long long)bad);
            return BT_ERR_INVALID;
        }
    }
    bt_stopper *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->max_tokens = max_tokens;
    s->shown = -1;
    s->n_stops = n_stops;
    s->stops = calloc(n_stops ? n_stops : 1, sizeof *s->stops);
    s->stop_len = calloc(n_stops ? n_stops : 1, sizeof *s->stop_len);
    if (!s->stops || !s->stop_len) goto nomem;
    for (size_t i = 0; i < n_stops; i++) {
        s->stop_len[i] = strlen(stops[i]);
        if (!(s->stops[i] = malloc(s->stop_len[i] + 1))) goto nomem;
        memcpy(s->stops[i], stops[i], s->stop_len[i] + 1);
    }
    bt_detok_stream_init(&s->ds);
    *out = s;
    return BT_OK;
nomem:
    bt_stopper_free(s);
    snprintf(err, errlen, "out of memory for the stop strings");
    return BT_ERR_NOMEM;
}

static int reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* give held[0..n) as the output and keep the rest */
static void give(bt_stopper *s, size_t n, const char **text, size_t *len) {
    memcpy(s->out, s->held, n);
    memmove(s->held, s->held + n, s->n_held - n);
    s->n_held -= n;
    *text = s->out;
    *len = n;
}

enum bt_stop_reason bt_stopper_push(bt_stopper *s, const bt_tokenizer *tok, int32_t id, const char **text,
                                    size_t *len) {
    *text = "";
    *len = 0;
    if (s->done) return BT_STOP_NONE;
    s->n_tokens++;
    int eog = !s->ignore_eog && bt_tokenizer_is_eog(tok, id);
    const int special = id == s->shown;
    size_t pl;
    bt_tokenizer_piece(tok, id, special, &pl);
    /* room for the piece, a pending partial character, or the flush's U+FFFDs */
    if (reserve(&s->held, &s->cap_held, s->n_held + pl + 16) || reserve(&s->out, &s->cap_out, s->cap_held)) {
        s->done = 1; /* out of memory: end here rather than lose text silently */
        return BT_STOP_LIMIT;
    }
    if (!eog) {
        long n = bt_detok_stream_push(&s->ds, tok, id, special, s->held + s->n_held, s->cap_held - s->n_held);
        BT_ASSERT(n >= 0);
        s->n_held += (size_t)n;
    }
    /* a stop string in the held text ends the output before it */
    size_t cut = s->n_held + 1;
    for (size_t i = 0; i < s->n_stops; i++) {
        if (s->stop_len[i] > s->n_held) continue;
        const char *m = memmem(s->held, s->n_held, s->stops[i], s->stop_len[i]);
        if (m && (size_t)(m - s->held) < cut) cut = (size_t)(m - s->held);
    }
    if (cut <= s->n_held) {
        s->done = 1;
        give(s, cut, text, len);
        return BT_STOP_STRING;
    }
    int end = eog || (s->max_tokens > 0 && s->n_tokens >= s->max_tokens);
    if (end) {
        long n = bt_detok_stream_flush(&s->ds, s->held + s->n_held, s->cap_held - s->n_held);
        BT_ASSERT(n >= 0);
        s->n_held += (size_t)n;
        s->done = 1;
        give(s, s->n_held, text, len);
        return eog ? BT_STOP_EOG : BT_STOP_LIMIT;
    }
    /* hold back the longest tail that is the start of a stop string */
    size_t hold = 0;
    for (size_t i = 0; i < s->n_stops; i++) {
        size_t k = s->stop_len[i] - 1 < s->n_held ? s->stop_len[i] - 1 : s->n_held;
        for (; k > hold; k--)
            if (!memcmp(s->held + s->n_held - k, s->stops[i], k)) {
                hold = k;
                break;
            }
    }
    give(s, s->n_held - hold, text, len);
    return BT_STOP_NONE;
}
