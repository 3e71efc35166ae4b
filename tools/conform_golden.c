/* Golden files of the conformance suite: the SHA-256 of every case's output at
 * one seed, as JSON (cJSON), so that a run on one machine can be compared with
 * a run on another without the first one's outputs:
 *
 *   {"suite": "tovl-conform/1", "seed": "1", "backend": "cpu",
 *    "digests": [{"kernel": "embed_overlay", "case": "mixed_untied",
 *                 "buffer": "hidden", "sha256": "<64 hex digits>"}, ...]}
 *
 * The seed is a string (a u64 does not survive a JSON double). Reading checks
 * everything a later comparison relies on, so that a bad file is refused with
 * its fault named rather than read as a set of failures. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"

static int fail(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return 2;
}

int tovl_conform_golden_write(const char *path, uint64_t seed, const char *backend, const tovl_conform_report *rep,
                              char *err, size_t err_size) {
    cJSON *root = cJSON_CreateObject();
    char seed_text[32];
    snprintf(seed_text, sizeof seed_text, "%" PRIu64, seed);
    cJSON_AddStringToObject(root, "suite", TOVL_CONFORM_SUITE);
    cJSON_AddStringToObject(root, "seed", seed_text);
    cJSON_AddStringToObject(root, "backend", backend);
    cJSON *digests = cJSON_AddArrayToObject(root, "digests");
    size_t n = 0;
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        if (strcmp(r->backend, backend) != 0) {
            continue;
        }
        if (!r->passed || r->skipped || !r->sha256[0]) {
            cJSON_Delete(root);
            return fail(err, err_size, "golden file '%s' not written: %s %s on %s %s%s%s", path, r->kernel,
                        r->case_name, backend, r->skipped ? "skipped" : "failed", r->detail[0] ? ": " : "",
                        r->detail);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kernel", r->kernel);
        cJSON_AddStringToObject(o, "case", r->case_name);
        cJSON_AddStringToObject(o, "buffer", r->buffer);
        cJSON_AddStringToObject(o, "sha256", r->sha256);
        cJSON_AddItemToArray(digests, o);
        n++;
    }
    if (n != tovl_conform_case_count()) {
        cJSON_Delete(root);
        return fail(err, err_size, "golden file '%s' not written: %zu results of %s, the suite has %zu cases", path, n,
                    backend, tovl_conform_case_count());
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) {
        ok = 0;
    }
    free(text);
    return ok ? 0 : fail(err, err_size, "cannot write golden file '%s': %s", path, strerror(errno));
}

/* The whole file, NUL-terminated; NULL with err set when it cannot be read. */
static char *read_text(const char *path, size_t *size, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(err, err_size, "cannot open golden file '%s': %s", path, strerror(errno));
        return NULL;
    }
    /* A golden file of this suite is about 15 KB; 16 MiB bounds a wrong file. */
    const size_t limit = (size_t)16 << 20;
    char *text = malloc(limit + 1);
    size_t n = text ? fread(text, 1, limit + 1, f) : 0;
    const bool bad = ferror(f) != 0;
    fclose(f);
    if (!text || bad || n > limit) {
        fail(err, err_size, "golden file '%s': %s", path,
             !text ? "out of memory" : bad ? "read error" : "larger than 16 MiB: not a golden file");
        free(text);
        return NULL;
    }
    text[n] = '\0';
    *size = n;
    return text;
}

/* A string member of o, or NULL. */
static const char *member(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The backends tovl has (tovl_backend_info.name), without probing them. */
static bool is_backend_name(const char *name) {
    static const char *const names[] = {"cpu", "cuda", "hip", "vulkan"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* "tovl-conform/N" against this suite's id: 0 when equal. */
static int check_suite(const char *path, const char *suite, char *err, size_t err_size) {
    const size_t prefix = strlen(TOVL_CONFORM_SUITE_NAME "/");
    char *end = NULL;
    const char *digits = suite + prefix;
    const unsigned long version =
        strncmp(suite, TOVL_CONFORM_SUITE_NAME "/", prefix) == 0 && *digits >= '0' && *digits <= '9'
            ? strtoul(digits, &end, 10)
            : 0;
    if (!end || *end) {
        return fail(err, err_size, "golden file '%s' is for suite '%s', not a version of %s", path, suite,
                    TOVL_CONFORM_SUITE_NAME);
    }
    if (version > TOVL_CONFORM_SUITE_VERSION) {
        return fail(err, err_size,
                    "golden file '%s' is from a newer suite, %s; this tovl runs %s: compare with a tovl that "
                    "runs %s, or write the golden file again with this one",
                    path, suite, TOVL_CONFORM_SUITE, suite);
    }
    if (version < TOVL_CONFORM_SUITE_VERSION) {
        return fail(err, err_size,
                    "golden file '%s' is for an older suite, %s; this tovl runs %s: write it again with "
                    "tovl conform --golden-out",
                    path, suite, TOVL_CONFORM_SUITE);
    }
    return 0;
}

/* The index of (kernel, case) in the suite, or -1. */
static long case_index(const char *kernel, const char *case_name) {
    for (size_t i = 0; i < tovl_conform_case_count(); i++) {
        if (!strcmp(tovl_conform_case_kernel(i), kernel) && !strcmp(tovl_conform_case_name(i), case_name)) {
            return (long)i;
        }
    }
    return -1;
}

static bool is_sha256_hex(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) {
            return false;
        }
    }
    return n == TOVL_SHA256_HEX - 1;
}

/* The digests array, checked entry by entry against the suite's cases. */
static int read_digests(const char *path, const cJSON *digests, tovl_conform_golden *g, char *err, size_t err_size) {
    const size_t cases = tovl_conform_case_count();
    if (!cJSON_IsArray(digests)) {
        return fail(err, err_size, "golden file '%s': no \"digests\" array", path);
    }
    g->digests = calloc(cases, sizeof *g->digests);
    if (!g->digests) {
        return fail(err, err_size, "golden file '%s': out of memory", path);
    }
    size_t i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, digests) {
        const char *kernel = member(d, "kernel"), *case_name = member(d, "case"), *buffer = member(d, "buffer"),
                   *sha = member(d, "sha256");
        if (!kernel || !case_name || !buffer || !sha) {
            return fail(err, err_size, "golden file '%s': digest %zu lacks a string \"kernel\", \"case\", "
                        "\"buffer\" or \"sha256\"", path, i);
        }
        const long at = case_index(kernel, case_name);
        if (at < 0) {
            return fail(err, err_size, "golden file '%s': digest %zu is of %s %s, which suite %s does not have",
                        path, i, kernel, case_name, TOVL_CONFORM_SUITE);
        }
        tovl_conform_digest *slot = &g->digests[at];
        if (slot->sha256[0]) {
            return fail(err, err_size, "golden file '%s': %s %s is given twice", path, kernel, case_name);
        }
        if (!is_sha256_hex(sha)) {
            return fail(err, err_size, "golden file '%s': %s %s: sha256 '%.80s' is not 64 lowercase hex digits", path,
                        kernel, case_name, sha);
        }
        snprintf(slot->kernel, sizeof slot->kernel, "%s", kernel);
        snprintf(slot->case_name, sizeof slot->case_name, "%s", case_name);
        snprintf(slot->buffer, sizeof slot->buffer, "%.7s", buffer);
        snprintf(slot->sha256, sizeof slot->sha256, "%s", sha);
        i++;
    }
    for (size_t k = 0; k < cases; k++) {
        if (!g->digests[k].sha256[0]) {
            return fail(err, err_size, "golden file '%s': no digest of %s %s (%zu of the suite's %zu cases given)",
                        path, tovl_conform_case_kernel(k), tovl_conform_case_name(k), i, cases);
        }
    }
    g->count = cases;
    return 0;
}

/* Whether JSON text stops inside a string or before closing every object
 * and array it opened: a truncated file, rather than one that is not JSON. */
static bool ends_open(const char *t, size_t n) {
    long depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (t[i] == '\\') {
                i++;
            } else if (t[i] == '"') {
                in_string = false;
            }
        } else if (t[i] == '"') {
            in_string = true;
        } else if (t[i] == '{' || t[i] == '[') {
            depth++;
        } else if (t[i] == '}' || t[i] == ']') {
            depth--;
        }
    }
    return in_string || depth > 0;
}

int tovl_conform_golden_read(const char *path, tovl_conform_golden *g, char *err, size_t err_size) {
    memset(g, 0, sizeof *g);
    size_t size = 0;
    char *text = read_text(path, &size, err, err_size);
    if (!text) {
        return 2;
    }
    const char *stop = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, size + 1, &stop, true) /* the NUL included */;
    int rc = 0;
    if (!root && size == 0) {
        rc = fail(err, err_size, "golden file '%s' is empty", path);
    } else if (!root) {
        const size_t at = stop && stop >= text ? (size_t)(stop - text) : size;
        rc = ends_open(text, size)
                 ? fail(err, err_size, "golden file '%s' is truncated: it ends at byte %zu inside an object, an "
                        "array or a string", path, size)
                 : fail(err, err_size, "golden file '%s' is not JSON (error at byte %zu of %zu)", path, at, size);
    } else if (!cJSON_IsObject(root)) {
        rc = fail(err, err_size, "golden file '%s': not a JSON object", path);
    }
    const char *suite = rc ? NULL : member(root, "suite"), *seed = rc ? NULL : member(root, "seed");
    const char *backend = rc ? NULL : member(root, "backend");
    if (!rc && (!suite || !seed || !backend)) {
        rc = fail(err, err_size, "golden file '%s': \"suite\", \"seed\" and \"backend\" must be strings", path);
    }
    if (!rc) {
        rc = check_suite(path, suite, err, err_size);
    }
    if (!rc) {
        char *end = NULL;
        errno = 0;
        g->seed = strtoull(seed, &end, 10);
        if (errno || end == seed || *end || seed[0] == '-') {
            rc = fail(err, err_size, "golden file '%s': seed '%.40s' is not a u64", path, seed);
        }
    }
    if (!rc && !is_backend_name(backend)) {
        rc = fail(err, err_size, "golden file '%s': unknown backend '%.40s' (tovl has cpu, cuda, hip and vulkan)",
                  path, backend);
    }
    if (!rc) {
        snprintf(g->backend, sizeof g->backend, "%s", backend);
        rc = read_digests(path, cJSON_GetObjectItemCaseSensitive(root, "digests"), g, err, err_size);
    }
    cJSON_Delete(root);
    free(text);
    if (rc) {
        tovl_conform_golden_free(g);
    }
    return rc;
}

void tovl_conform_golden_free(tovl_conform_golden *g) {
    free(g->digests);
    memset(g, 0, sizeof *g);
}
