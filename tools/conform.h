/* The conformance suite: runs every kernel case on a backend under test and on
 * the CPU reference, with sentinels around every output, and compares bits;
 * or compares the SHA-256 of every output with a golden file written on
 * another machine. Used by `tovl conform` and by the test suite
 * (tests/test_conform.c). */
#ifndef TOVL_TOOLS_CONFORM_H
#define TOVL_TOOLS_CONFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tovl/tovl.h"

/* The suite's identity: the case list and the generator of their data. Bump
 * the number whenever a case, its data or its output changes, and write the
 * shipped golden file again (docs/CONFORMANCE.md). */
#define TOVL_CONFORM_SUITE_NAME "tovl-conform"
#define TOVL_CONFORM_SUITE_VERSION 1
#define TOVL_CONFORM_SUITE "tovl-conform/1"
/* The seed of golden files unless --seed says otherwise (the shipped one's). */
#define TOVL_CONFORM_GOLDEN_SEED 1u

#define TOVL_SHA256_HEX 65 /* 64 hex digits and a NUL */

typedef struct tovl_conform_result {
    char backend[16];
    char kernel[32];
    char case_name[48];
    char buffer[8];   /* the output buffer: "hidden", "logits" or "flags" */
    bool passed;
    bool skipped;     /* not applicable on this backend (detail says why); not a failure */
    char sha256[TOVL_SHA256_HEX]; /* of the output's bytes, guards excluded; "" when it did not run */
    char detail[384]; /* first mismatch (row, column), or why it failed; "" when passed */
} tovl_conform_result;

typedef struct tovl_conform_report {
    tovl_conform_result *results;
    size_t count, capacity;
    size_t passed, failed, skipped;
} tovl_conform_report;

/* One digest of a golden file. */
typedef struct tovl_conform_digest {
    char kernel[32];
    char case_name[48];
    char buffer[8];
    char sha256[TOVL_SHA256_HEX];
} tovl_conform_digest;

/* A golden file: the digests of every (kernel, case) of this suite at one seed. */
typedef struct tovl_conform_golden {
    uint64_t seed;
    char backend[16]; /* the backend whose outputs they are */
    tovl_conform_digest *digests;
    size_t count;
} tovl_conform_golden;

/* Run every case on `dut` against `ref` (the CPU backend), appending one result
 * per (kernel, case). `seed` makes the random data; `log` (may be NULL) gets a
 * progress line per case. Returns the number of failed cases added. */
size_t tovl_conform_backend(tovl_backend *ref, tovl_backend *dut, uint64_t seed, FILE *log,
                            tovl_conform_report *report);

/* The suite in any of its three ways:
 *  - golden == NULL, ref != NULL: dut's outputs against ref's, bit for bit
 *    (tovl_conform_backend);
 *  - golden != NULL: dut's digests against the golden file's, at its seed;
 *    where one differs and ref is given, ref runs the case too and the detail
 *    names the first cell that differs from it;
 *  - both NULL: dut alone, for its digests (a golden file's).
 * Guards, and that the output changed at all, are checked in every way. */
typedef struct tovl_conform_options {
    tovl_backend *ref, *dut;
    const tovl_conform_golden *golden;
    uint64_t seed;     /* ignored with a golden file: its seed */
    const char *label; /* the results' backend name; NULL: the dut's */
    FILE *log;
} tovl_conform_options;
size_t tovl_conform_run(const tovl_conform_options *opt, tovl_conform_report *report);
void tovl_conform_report_free(tovl_conform_report *report);

/* Golden files (JSON): the suite id, the seed, the backend and one digest per
 * (kernel, case). Both return 0, or 2 with a message naming the file and what
 * is wrong in err (a file of another suite or version, truncated or not JSON,
 * an unknown backend, a case missing, extra or given twice, a digest that is
 * not 64 hex digits). write takes the results of `backend` in rep, which must
 * all have passed. */
int tovl_conform_golden_write(const char *path, uint64_t seed, const char *backend, const tovl_conform_report *rep,
                              char *err, size_t err_size);
int tovl_conform_golden_read(const char *path, tovl_conform_golden *golden, char *err, size_t err_size);
void tovl_conform_golden_free(tovl_conform_golden *golden);

/* SHA-256 of `size` bytes as 64 lowercase hex digits. */
void tovl_sha256_hex(const void *data, size_t size, char out[TOVL_SHA256_HEX]);

/* The cases' names and kernels, in the order the suite runs them. */
size_t tovl_conform_case_count(void);
const char *tovl_conform_case_name(size_t i);
const char *tovl_conform_case_kernel(size_t i);

/* A fresh seed from the clock and pid (printed by callers so runs can be replayed). */
uint64_t tovl_conform_fresh_seed(void);

#endif
