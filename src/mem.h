/* mem.h - growing an array, and freeing the arrays a struct owns in one call.
 *
 * A growing array keeps its capacity in elements; bt_grow returns the array
 * with room for need of them (need >= 1), its capacity doubled from first
 * until they fit, or NULL (out of memory, or the size overflows) with the
 * array and *cap left as they were:
 *
 *     char *t = bt_grow(b->p, &b->cap, b->n + n + 1, 1, 256);
 *     if (!t) return false;
 *     b->p = t;
 *
 * A destructor names what its struct owns, the struct itself last:
 *
 *     BT_FREE_ALL(s->keys, s->vals, s);
 *
 * Every pointer is read before any is freed, so the struct may come last;
 * NULL ones are skipped, as free() skips them. */
#ifndef BATON_MEM_H
#define BATON_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static inline void *bt_grow(void *p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : first ? first : 1;
    while (c < need) {
        if (c > SIZE_MAX / 2) return NULL;
        c *= 2;
    }
    if (c > SIZE_MAX / elem) return NULL;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

static inline void bt_free_each(void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i]);
}

#define BT_FREE_ALL(...) \
    bt_free_each((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif
