/* mem.h - freeing the arrays a struct owns in one call.
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
#include <stdlib.h>

static inline void bt_free_each(void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i]);
}

#define BT_FREE_ALL(...) \
    bt_free_each((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif
