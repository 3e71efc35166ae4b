/* A loader thread beside a serving thread on every backend present here that
 * runs kernels on the host's threads (cpu, and Vulkan: lavapipe in CI), as a
 * plain program: the ThreadSanitizer run (scripts/sanitize.sh) builds it with
 * -fsanitize=thread, which Criterion's runner does not survive. Exit 0 when
 * every replay saw one whole adapter; 1 with the reason otherwise. The
 * Criterion suites run the same check (test_slots, test_vulkan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slots_check.h"
#include "testutil.h"

int main(void) {
    int failed = 0, ran = 0;
    const char *const names[] = {"cpu", "vulkan"};
    for (int i = 0; i < 2; i++) {
        tovl_backend *be = NULL;
        if (tovl_backend_open(names[i], &be) != TOVL_OK) {
            const bool required = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
            fprintf(stderr, "stress_slots: %s %s: %s\n", names[i], required ? "required in CI but absent" : "absent",
                    tovl_last_error());
            failed += required;
            continue;
        }
        char tag[48];
        snprintf(tag, sizeof tag, "stress_slots_%s", names[i]);
        const char *why = slots_threaded_run(be, tag, i == 0 ? 1000 : 200);
        if (why) {
            fprintf(stderr, "stress_slots: FAILED: %s\n", why);
            failed++;
        }
        ran++;
        tovl_backend_close(be);
    }
    printf("stress_slots: %d backends, %d failed\n", ran, failed);
    return failed ? 1 : 0;
}
