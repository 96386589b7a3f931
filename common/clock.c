/* Clocks, deadlines, and bounded exponential backoff with jitter. */
#include <errno.h>
#include <time.h>

#include "ganglion/common.h"

uint64_t gang_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t gang_now_ms(void)
{
    return gang_now_ns() / 1000000ull;
}

uint64_t gang_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void gang_sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void gang_backoff_init(gang_backoff *b, uint64_t initial_ms, uint64_t max_ms, uint64_t seed)
{
    b->initial_ms = initial_ms;
    b->max_ms = max_ms < initial_ms ? initial_ms : max_ms;
    b->attempt = 0;
    b->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
}

/* xorshift64*: not cryptographic, only spreads retries apart. */
static uint64_t backoff_rand(gang_backoff *b)
{
    uint64_t x = b->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/*
 * Returns the next delay and advances the attempt counter. The nominal delay doubles per
 * attempt up to max_ms; the result lies in [nominal/2, nominal].
 */
uint64_t gang_backoff_next(gang_backoff *b)
{
    uint64_t d = b->initial_ms;
    for (uint32_t i = 0; i < b->attempt && d < b->max_ms; i++)
        d *= 2;
    if (d > b->max_ms)
        d = b->max_ms;
    if (b->attempt < 64)
        b->attempt++;
    uint64_t half = d / 2;
    return half + (d - half ? backoff_rand(b) % (d - half + 1) : 0);
}

void gang_backoff_reset(gang_backoff *b)
{
    b->attempt = 0;
}

uint64_t gang_deadline_after(uint64_t timeout_ms)
{
    uint64_t now = gang_now_ms();

    return timeout_ms > UINT64_MAX - now ? UINT64_MAX : now + timeout_ms;
}

int gang_deadline_left(uint64_t deadline, uint64_t *left)
{
    uint64_t now = gang_now_ms();

    if (left == NULL)
        return GANG_EINVAL;
    if (now >= deadline)
        return GANG_ETIMEDOUT;
    *left = deadline - now;
    return 0;
}
