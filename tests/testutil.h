/* Shared test helpers: seeded random data (a fresh seed per run, printed, or
 * TOVL_TEST_SEED to replay) and a wrapping backend that counts and can fail
 * device operations. */
#ifndef TOVL_TESTUTIL_H
#define TOVL_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "conform.h"
#include "tovl/backend.h"

/* The golden file shipped in the repo (tests/golden/), written by
 * `tovl conform --golden-out` on the CPU reference at its default seed. */
#define TU_CONFORM_GOLDEN TOVL_SOURCE_DIR "/tests/golden/conform-seed-1.json"

/* The whole suite on `dut` against the shipped golden file's digests, each
 * case's line on stderr; `ref` (may be NULL) places a difference. Asserts
 * that the file reads; fills *rep and returns the number of failed cases. */
size_t tu_conform_against_golden(tovl_backend *ref, tovl_backend *dut, const char *label, tovl_conform_report *rep);
/* The same with the CPU backend placing differences, expecting every case to
 * run and match (a port that keeps denormals: none may skip); closes dut. */
void tu_expect_golden_digests(tovl_backend *dut, const char *label);

/* The run's seed: TOVL_TEST_SEED when set, else fresh; printed once. */
uint64_t tu_seed(void);
/* A generator seeded from tu_seed() and a per-test salt. */
typedef struct tu_rng {
    uint64_t state;
} tu_rng;
tu_rng tu_rng_for(const char *test_name);
uint64_t tu_next(tu_rng *r);
uint32_t tu_below(tu_rng *r, uint32_t n);
/* A non-zero bf16 of random sign and magnitude 2^-8 .. 2^8. */
uint16_t tu_bf16(tu_rng *r);
void tu_fill_bf16(tu_rng *r, uint16_t *dst, size_t n);
/* n distinct ids below vocab. */
void tu_distinct_ids(tu_rng *r, uint32_t vocab, uint32_t n, uint32_t *ids);

/* A wrapping backend around the CPU backend. It counts operations and, when a
 * fail_*_at counter is N > 0, makes the Nth such operation fail. */
typedef struct tu_wrap {
    tovl_backend *inner;
    tovl_backend_iface iface;
    long alloc_calls, allocs, frees, uploads, downloads, fills, launches, syncs, lookups;
    long fail_alloc_at, fail_upload_at, fail_lookup_at, fail_launch_at;
    /* Kernels the wrapper hides (try_kernel answers 0), by name, NULL-terminated. */
    const char *hidden_kernels[5];
    /* When set, replaces the inner launch (mutation tests). */
    tovl_status (*launch_override)(struct tu_wrap *w, tovl_kernel k, const uint32_t grid[3], const void *args,
                                   size_t size, void *stream);
    /* More injection points (0 = never), counted by downloads, syncs, fills. */
    long fail_download_at, fail_sync_at, fail_fill_at;
    /* write_async calls (a whole batch fails), forwarded to the inner
     * backend's (its uploads when it has none); iface.iface_version = 1 hides
     * write_async and the fences, so the core takes its version-1 path. */
    long writes, fail_write_at;
} tu_wrap;

/* Opens a CPU backend wrapped; *wrap points at the counters (owned by the backend). */
tovl_backend *tu_wrap_cpu(tu_wrap **wrap);
/* The same around any backend by name ("vulkan", ...); NULL when it does not
 * open (tovl_last_error() says why). */
tovl_backend *tu_wrap_open(const char *name, tu_wrap **wrap);
/* Live device allocations (allocs - frees). */
long tu_live(const tu_wrap *w);

/* Whether backend `name` may run: TOVL_TEST_BACKENDS (a comma list, e.g.
 * "cpu" under Valgrind) names it, or is unset or empty. */
bool tu_backend_allowed(const char *name);

/* Backend `info` (an entry of tovl_backend_list) opened wrapped, for a test
 * run once per backend: skips with the reason when it is absent or
 * TOVL_TEST_BACKENDS leaves it out; prints "TAG: on NAME (DEVICE)", which the
 * GPU run's parts look for (scripts/lib/gpu-part.sh, expect_ran_on). */
tovl_backend *tu_open_listed(const tovl_backend_info *info, const char *tag, tu_wrap **wrap);

/* Runs the tovl binary at `tool` with `args` (a shell fragment) in `dir`
 * (NULL: here), its stdout discarded; returns its exit status (-1 when it did
 * not exit) with its stderr, cut to cap - 1 bytes, in err. Skips the test
 * when `tool` is not an executable (the tools were not built). */
int tu_run_cli(const char *tool, const char *dir, const char *args, char *err, size_t cap);
/* The same with its stdout kept too, cut to out_cap - 1 bytes, in out. */
int tu_run_cli_output(const char *tool, const char *dir, const char *args, char *out, size_t out_cap, char *err,
                      size_t err_cap);

/* A failure as the import code and the tools report one: status `want` and a
 * one-line tovl_last_error() naming every string of `names` (NULL-terminated;
 * TU_NAMES builds the list). `what` labels the check. */
void tu_expect_error(tovl_status st, tovl_status want, const char *const *names, const char *what);
/* The tovl binary at `tool`, run with `args` in `dir`, exits 2 with exactly
 * one line on stderr naming every string of `names`, and no sanitizer report. */
void tu_expect_cli_fails(const char *tool, const char *dir, const char *args, const char *const *names);
#define TU_NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The bench members of `be` (time_kernel, copy_bandwidth) answer: rowdiff over 64
 * identical rows timed 5 x 3 (numbers > 0, three repeats, no row flagged), a copy
 * of copy_bytes measured, and kernel handle 0 refused with TOVL_ERR_LAUNCH. */
void tu_expect_timing_members(tovl_backend *be, size_t copy_bytes);

/* Build an overlay from host data in one call (test shorthand). */
tovl_status tu_build(tovl_backend *be, uint32_t vocab, uint32_t hidden, const uint32_t *eids, const uint16_t *erows,
                     uint32_t ne, bool has_lm, const uint32_t *lids, const uint16_t *lrows, uint32_t nl, bool tied,
                     tovl_embed_overlay **out);

#endif
