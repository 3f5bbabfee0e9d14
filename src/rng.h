/* rng.h - a random stream with no global state: xoshiro256** seeded through
 * splitmix64, the same numbers on every machine (the sampler's draws, a
 * random-weight model's values). */
#ifndef BATON_RNG_H
#define BATON_RNG_H

#include <stdint.h>

typedef struct bt_rng {
    uint64_t s[4];
} bt_rng;
void bt_rng_seed(bt_rng *r, uint64_t seed);
uint64_t bt_rng_next(bt_rng *r);
double bt_rng_uniform(bt_rng *r); /* [0, 1), 53 random bits */

#endif
