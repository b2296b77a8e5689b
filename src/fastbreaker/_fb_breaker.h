/* The C layout of one circuit breaker and of what a BreakerMap shares with its breakers.
 *
 * Downstream Cython code sees fb_breaker_t only as an opaque pointer (see _breaker_c.pxd): the
 * fields below may change between releases without breaking code compiled against the API.
 */
#ifndef FB_BREAKER_H
#define FB_BREAKER_H

#include <stdint.h>

/* Outcome codes of fb_breaker_release() (FB_TIMEOUT: a failure that was a timeout). */
enum { FB_SUCCESS = 0, FB_SLOW = 1, FB_FAILURE = 2, FB_NEUTRAL = 3, FB_TIMEOUT = 4 };
/* Non-permit results of fb_breaker_acquire(). */
enum { FB_REJECTED = -1, FB_NEED_CLOCK = -2 };

typedef struct fb_group_s {
    int64_t open;        /* breakers not CLOSED */
    int64_t size;        /* breakers held by the map */
    int64_t suppressed;  /* automatic trips refused by the bound */
    int64_t num, den;    /* max_open_ratio as an exact fraction */
} fb_group_t;

typedef struct fb_config_s {
    int64_t failure_threshold, min_calls, window, half_open_max, success_threshold;
    int64_t reset_ns, max_reset_ns, probe_timeout_ns, slow_ns;
    double failure_rate, slow_rate;
    int64_t bucket_ns, buckets;  /* the time window (bucket_ns 0: none) */
    int use_c_clock;
    int dry_run;         /* admit what would be rejected (its permit is stale) */
    int timed;           /* the call paths time calls (slow_call_duration or record_latency) */
    int shared;          /* Config.shared: the config of a BreakerMap's breakers (in padding) */
    int64_t nlat;        /* the latency histogram's words (a count per bound, +Inf, the sum), or 0 */
    fb_group_t *group;   /* NULL for a breaker outside a BreakerMap */
    void *owner;         /* the Python Config object that owns this struct */
} fb_config_t;

typedef struct fb_window_s {
    int64_t agg;         /* recorded | failures << 21 | slow << 42, each biased by 2**20 */
    int64_t head;        /* next ring position (mod window) */
    int64_t slots[1];    /* 2-bit outcome codes, 32 per word (allocated to size) */
} fb_window_t;

/* What a breaker needs only once it has tripped, timed out, run dry or joined a fleet, or when
 * its options ask for a latency histogram: allocated on first need (one CAS installs it; a
 * loser frees its copy), so that a healthy CLOSED breaker in a map of 10,000 hosts carries one
 * NULL pointer for all of it. */
typedef struct fb_extra_s {
    int64_t opened, would_reject, open_ns, probe_ok, probe_failed, timeouts;
    /* outcomes a healthy CLOSED breaker does not have: rejections, slow calls, neutral
     * (ignored) outcomes, stale permits (here rather than in fb_state_t since issue 26: four
     * words less per breaker of a BreakerMap) */
    int64_t rejected, slow_calls, ignored, stale;
    int64_t open_from;   /* OPEN: when the episode began (since_ns minus a fleet's shift) */
    int64_t fleet_gen;   /* the last fleet generation applied (written under a claim) */
    int64_t lat[1];      /* the latency histogram (cfg->nlat words), when timing */
} fb_extra_t;

/* The words every admission and outcome changes. A local breaker holds them inline (own); a
 * breaker in a SharedRegion points at a block of the region, which holds no pointers: the state,
 * then the claim record (fb_claim_t), then fb_extra_t, then the window. */
typedef struct fb_state_s {
    int64_t word;        /* state | busy | probes in flight | probe successes | level | generation */
    int64_t gen_hi;      /* the generation's bits above the word's 22: a permit is the full count */
    int64_t since_ns;    /* OPEN: trip time; HALF_OPEN: latest probe admission */
    int64_t consec;      /* generation << 40 | consecutive failures */
    int64_t permitted, successes, failures;  /* the rarer counts are fb_extra_t's */
} fb_state_t;

/* Who holds the busy bit of a shared breaker: the busy word it claimed, its process id and
 * CLOCK_MONOTONIC ns when it claimed (written right after the claiming CAS). */
typedef struct fb_claim_s {
    int64_t word, pid, ns;
} fb_claim_t;

/* Free-threaded builds (and the tests' striped copy of the core): a breaker that threads take
 * turns on counts its admissions, rejections and successes in per-CPU stripes, one cache line
 * each, so that a CLOSED call on one breaker from several cores writes no shared line
 * (_fb_stripe.h; metrics() adds them up). */
#if defined(Py_GIL_DISABLED) || defined(FB_STRIPED_FOR_TESTS)
#define FB_STRIPED 1
#endif

typedef struct fb_stripe_s {
    int64_t permitted, rejected, successes;
    int64_t pad[5];  /* a stripe is a cache line of its own */
} fb_stripe_t;

typedef struct fb_breaker_s {
    fb_state_t *s;       /* &own, or the state block in a SharedRegion */
    /* The window: NULL in consecutive mode; the count window; or the time window, tagged by its
     * low bit set: tw = (int64_t *)((uintptr_t)win - 1), where tw[0] is the latest epoch a bucket
     * was reset for and tw[1 + i] bucket i, tag (epoch mod 2**22) << 42 | slow << 28 |
     * failed << 14 | recorded, in 14-bit saturating counts. */
    fb_window_t *win;
    fb_config_t *cfg;
    fb_extra_t *x;       /* NULL until needed (see fb_extra_t); in a region, its block */
    fb_state_t own;
#ifdef FB_STRIPED
    fb_stripe_t *stripes;  /* NULL until threads have taken FB_TURNS turns (a local breaker only) */
    int64_t last_thread;   /* until then: the thread that counted last, */
    int64_t turns;         /* and how often that changed */
#endif
} fb_breaker_t;

#endif
