/* The conformance suite: runs every kernel case on a backend under test and on
 * the CPU reference, with sentinels around every output, and compares bits.
 * Used by `tovl conform` and by the test suite (tests/test_conform.c). */
#ifndef TOVL_TOOLS_CONFORM_H
#define TOVL_TOOLS_CONFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tovl/tovl.h"

typedef struct tovl_conform_result {
    char backend[16];
    char kernel[32];
    char case_name[48];
    bool passed;
    bool skipped;     /* not applicable on this backend (detail says why); not a failure */
    char detail[256]; /* first mismatch, or why it failed; "" when passed */
} tovl_conform_result;

typedef struct tovl_conform_report {
    tovl_conform_result *results;
    size_t count, capacity;
    size_t passed, failed, skipped;
} tovl_conform_report;

/* Run every case on `dut` against `ref` (the CPU backend), appending one result
 * per (kernel, case). `seed` makes the random data; `log` (may be NULL) gets a
 * progress line per case. Returns the number of failed cases added. */
size_t tovl_conform_backend(tovl_backend *ref, tovl_backend *dut, uint64_t seed, FILE *log,
                            tovl_conform_report *report);
void tovl_conform_report_free(tovl_conform_report *report);

/* The cases' names, for listings. */
size_t tovl_conform_case_count(void);
const char *tovl_conform_case_name(size_t i);

/* A fresh seed from the clock and pid (printed by callers so runs can be replayed). */
uint64_t tovl_conform_fresh_seed(void);

#endif
