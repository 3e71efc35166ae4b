#include "testutil.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t tu_seed(void) {
    static uint64_t seed;
    static bool have;
    if (!have) {
        const char *env = getenv("TOVL_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
        }
        have = true;
        fprintf(stderr, "tovl tests: seed %" PRIu64 " (replay with TOVL_TEST_SEED=%" PRIu64 ")\n", seed, seed);
    }
    return seed;
}

uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

tu_rng tu_rng_for(const char *test_name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = test_name; *p; p++) {
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    }
    tu_rng r = {tu_seed() ^ h};
    tu_next(&r);
    return r;
}

uint32_t tu_below(tu_rng *r, uint32_t n) {
    return n ? (uint32_t)(tu_next(r) % n) : 0;
}

uint16_t tu_bf16(tu_rng *r) {
    float v = ldexpf(1.0f + (float)tu_below(r, 1u << 16) / 65536.0f, (int)tu_below(r, 17) - 8);
    return tovl_f32_to_bf16((tu_next(r) & 1) ? -v : v);
}

void tu_fill_bf16(tu_rng *r, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = tu_bf16(r);
    }
}

void tu_distinct_ids(tu_rng *r, uint32_t vocab, uint32_t n, uint32_t *ids) {
    for (uint32_t j = 0; j < n; j++) {
        bool dup;
        do {
            ids[j] = tu_below(r, vocab);
            dup = false;
            for (uint32_t k = 0; k < j; k++) {
                dup = dup || ids[k] == ids[j];
            }
        } while (dup);
    }
}

/* ---- the wrapping backend ---- */
#define INNER(w) tovl_backend_get_iface((w)->inner)
#define INNER_CTX(w) tovl_backend_get_context((w)->inner)

static void w_destroy(void *ctx) {
    tu_wrap *w = ctx;
    tovl_backend_close(w->inner);
    free(w);
}
static const char *w_device(void *ctx) {
    tu_wrap *w = ctx;
    return INNER(w)->device(INNER_CTX(w));
}
static const char *w_property(void *ctx, const char *key) {
    tu_wrap *w = ctx;
    return INNER(w)->property ? INNER(w)->property(INNER_CTX(w), key) : NULL;
}
static tovl_status w_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    tu_wrap *w = ctx;
    w->alloc_calls++;
    if (w->fail_alloc_at > 0 && w->alloc_calls == w->fail_alloc_at) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "test: injected allocation failure");
    }
    tovl_status st = INNER(w)->alloc(INNER_CTX(w), bytes, out);
    if (st == TOVL_OK) {
        w->allocs++;
    }
    return st;
}
static void w_free(void *ctx, tovl_devptr p) {
    tu_wrap *w = ctx;
    w->frees++;
    INNER(w)->free(INNER_CTX(w), p);
}
static tovl_status w_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    tu_wrap *w = ctx;
    w->uploads++;
    if (w->fail_upload_at > 0 && w->uploads == w->fail_upload_at) {
        return tovl_error(TOVL_ERR_DEVICE, "test: injected upload failure");
    }
    return INNER(w)->upload(INNER_CTX(w), dst, src, bytes);
}
static tovl_status w_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    tu_wrap *w = ctx;
    w->downloads++;
    if (w->fail_download_at > 0 && w->downloads == w->fail_download_at) {
        return tovl_error(TOVL_ERR_DEVICE, "test: injected download failure");
    }
    return INNER(w)->download(INNER_CTX(w), dst, src, bytes);
}
static tovl_status w_fill(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    tu_wrap *w = ctx;
    w->fills++;
    if (w->fail_fill_at > 0 && w->fills == w->fail_fill_at) {
        return tovl_error(TOVL_ERR_DEVICE, "test: injected fill failure");
    }
    return INNER(w)->fill_u32(INNER_CTX(w), dst, pattern, bytes);
}
static tovl_kernel w_try_kernel(void *ctx, const char *name) {
    tu_wrap *w = ctx;
    w->lookups++;
    if (w->fail_lookup_at > 0 && w->lookups == w->fail_lookup_at) {
        return 0;
    }
    for (int i = 0; i < 5 && w->hidden_kernels[i]; i++) {
        if (strcmp(w->hidden_kernels[i], name) == 0) {
            return 0;
        }
    }
    return INNER(w)->try_kernel(INNER_CTX(w), name);
}
static tovl_status w_launch(void *ctx, tovl_kernel k, const uint32_t grid[3], const void *args, size_t size,
                            void *stream) {
    tu_wrap *w = ctx;
    w->launches++;
    if (w->fail_launch_at > 0 && w->launches == w->fail_launch_at) {
        return tovl_error(TOVL_ERR_LAUNCH, "test: injected launch failure");
    }
    if (w->launch_override) {
        return w->launch_override(w, k, grid, args, size, stream);
    }
    return INNER(w)->launch(INNER_CTX(w), k, grid, args, size, stream);
}
static tovl_status w_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    tu_wrap *w = ctx;
    w->writes++;
    if (w->fail_write_at > 0 && w->writes == w->fail_write_at) {
        return tovl_error(TOVL_ERR_DEVICE, "test: injected write_async failure");
    }
    const tovl_backend_iface *in = INNER(w);
    if (in->iface_version >= 2 && in->write_async) {
        return in->write_async(INNER_CTX(w), writes, count, stream);
    }
    tovl_status st = TOVL_OK;
    for (uint32_t i = 0; st == TOVL_OK && i < count; i++) {
        st = in->upload(INNER_CTX(w), writes[i].dst, writes[i].src, writes[i].bytes);
    }
    return st;
}
static tovl_status w_fence_record(void *ctx, void *stream, tovl_fence *out) {
    tu_wrap *w = ctx;
    return INNER(w)->fence_record(INNER_CTX(w), stream, out);
}
static tovl_status w_fence_query(void *ctx, tovl_fence fence, bool *passed) {
    tu_wrap *w = ctx;
    return INNER(w)->fence_query(INNER_CTX(w), fence, passed);
}
static void w_fence_destroy(void *ctx, tovl_fence fence) {
    tu_wrap *w = ctx;
    INNER(w)->fence_destroy(INNER_CTX(w), fence);
}
static tovl_status w_sync(void *ctx, void *stream) {
    tu_wrap *w = ctx;
    w->syncs++;
    if (w->fail_sync_at > 0 && w->syncs == w->fail_sync_at) {
        return tovl_error(TOVL_ERR_DEVICE, "test: injected synchronize failure");
    }
    return INNER(w)->synchronize(INNER_CTX(w), stream);
}

tovl_backend *tu_wrap_cpu(tu_wrap **wrap) {
    return tu_wrap_open("cpu", wrap);
}

tovl_backend *tu_wrap_open(const char *name, tu_wrap **wrap) {
    tu_wrap *w = calloc(1, sizeof *w);
    if (!w || tovl_backend_open(name, &w->inner) != TOVL_OK) {
        free(w);
        return NULL;
    }
    w->iface = (tovl_backend_iface){
        .iface_version = TOVL_BACKEND_IFACE_VERSION,
        .name = "wrap",
        .destroy = w_destroy,
        .device = w_device,
        .property = w_property,
        .alloc = w_alloc,
        .free = w_free,
        .upload = w_upload,
        .download = w_download,
        .fill_u32 = w_fill,
        .try_kernel = w_try_kernel,
        .launch = w_launch,
        .synchronize = w_sync,
        .write_async = w_write_async,
    };
    const tovl_backend_iface *in = tovl_backend_get_iface(w->inner);
    if (in->iface_version >= 2 && in->fence_record) {
        w->iface.fence_record = w_fence_record;
        w->iface.fence_query = w_fence_query;
        w->iface.fence_destroy = w_fence_destroy;
    }
    tovl_backend *be = NULL;
    if (tovl_backend_create(&w->iface, w, &be) != TOVL_OK) {
        return NULL;
    }
    *wrap = w;
    return be;
}

long tu_live(const tu_wrap *w) {
    return w->allocs - w->frees;
}

bool tu_backend_allowed(const char *name) {
    const char *list = getenv("TOVL_TEST_BACKENDS");
    if (!list || !*list) {
        return true;
    }
    size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len) {
        bool start = p == list || p[-1] == ',';
        bool end = p[len] == '\0' || p[len] == ',';
        if (start && end) {
            return true;
        }
    }
    return false;
}

tovl_backend *tu_open_listed(const tovl_backend_info *info, const char *tag, tu_wrap **wrap) {
    if (!info->available) {
        cr_skip_test("%s backend unavailable: %s", info->name, info->reason);
    }
    if (!tu_backend_allowed(info->name)) {
        cr_skip_test("%s backend left out by TOVL_TEST_BACKENDS=%s", info->name, getenv("TOVL_TEST_BACKENDS"));
    }
    tovl_backend *be = tu_wrap_open(info->name, wrap);
    cr_assert_not_null(be, "%s listed as available but does not open: %s", info->name, tovl_last_error());
    fprintf(stderr, "%s: on %s (%s)\n", tag, info->name, tovl_backend_device(be));
    return be;
}


tovl_status tu_build(tovl_backend *be, uint32_t vocab, uint32_t hidden, const uint32_t *eids, const uint16_t *erows,
                     uint32_t ne, bool has_lm, const uint32_t *lids, const uint16_t *lrows, uint32_t nl, bool tied,
                     tovl_embed_overlay **out) {
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_overlay_desc d = {
        .adapter = "test-adapter",
        .vocab = vocab,
        .hidden = hidden,
        .embed = {"embed.weight", eids, erows, ne, hidden},
        .has_lmhead = has_lm,
        .lmhead = {"lm_head.weight", lids, lrows, nl, hidden},
        .tied = tied,
    };
    return tovl_build_overlay(be, &k, &d, out);
}

void tu_expect_error(tovl_status st, tovl_status want, const char *const *names, const char *what) {
    const char *detail = tovl_last_error();
    cr_expect_eq(st, want, "%s: status %s, wanted %s (detail: %s)", what, tovl_status_str(st), tovl_status_str(want),
                 detail);
    cr_expect(strchr(detail, '\n') == NULL, "%s: the detail is more than one line: %s", what, detail);
    for (const char *const *n = names; *n; n++) {
        cr_expect(strstr(detail, *n) != NULL, "%s: the detail does not name '%s': %s", what, *n, detail);
    }
}

void tu_expect_cli_fails(const char *tool, const char *dir, const char *args, const char *const *names) {
    char err[4096];
    const int rc = tu_run_cli(tool, dir, args, err, sizeof err);
    cr_expect_eq(rc, 2, "tovl %s: exit %d, wanted 2 (stderr: %s)", args, rc, err);
    size_t lines = 0;
    for (const char *p = err; *p; p++) {
        lines += *p == '\n';
    }
    cr_expect_eq(lines, 1, "tovl %s: %zu lines on stderr, wanted one: %s", args, lines, err);
    for (const char *const *n = names; *n; n++) {
        cr_expect(strstr(err, *n) != NULL, "tovl %s: stderr does not name '%s': %s", args, *n, err);
    }
    cr_expect(strstr(err, "Sanitizer") == NULL && strstr(err, "leak") == NULL, "tovl %s: %s", args, err);
}

/* A temporary file for one of the CLI's output streams; its path in `path`. */
static void cli_stream_file(char path[32]) {
    strcpy(path, "/tmp/tovl_cli_out_XXXXXX");
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp for the CLI's output");
    close(fd);
}

/* Reads the file at `path` into buf (cut to cap - 1 bytes) and removes it. */
static void cli_stream_take(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    const size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f) {
        fclose(f);
    }
    unlink(path);
}

int tu_run_cli_output(const char *tool, const char *dir, const char *args, char *out, size_t out_cap, char *err,
                      size_t err_cap) {
    if (access(tool, X_OK) != 0) {
        cr_skip_test("the tovl binary is not built: %s", tool);
    }
    char out_path[32], err_path[32];
    cli_stream_file(out_path);
    cli_stream_file(err_path);
    char cmd[4096];
    const int len = snprintf(cmd, sizeof cmd, "%s%s%s'%s' %s >'%s' 2>'%s'", dir ? "cd '" : "", dir ? dir : "",
                             dir ? "' && " : "", tool, args, out ? out_path : "/dev/null", err_path);
    cr_assert(len > 0 && (size_t)len < sizeof cmd, "the CLI command line is too long: %s", args);
    const int rc = system(cmd);
    if (out) {
        cli_stream_take(out_path, out, out_cap);
    } else {
        unlink(out_path);
    }
    cli_stream_take(err_path, err, err_cap);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int tu_run_cli(const char *tool, const char *dir, const char *args, char *err, size_t cap) {
    return tu_run_cli_output(tool, dir, args, NULL, 0, err, cap);
}

void tu_expect_timing_members(tovl_backend *be, size_t copy_bytes) {
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    cr_assert_not_null(iface->time_kernel);
    cr_assert_not_null(iface->copy_bandwidth);
    enum { rows = 64, h = 256 };
    tovl_devptr buf = 0;
    cr_assert_eq(tovl_alloc(be, 2u * rows * h * 2 + rows * 4, &buf), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, buf, 0x3F803F80u, 2u * rows * h * 2), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, buf + 2u * rows * h * 2, 0xEEEEEEEEu, rows * 4), TOVL_OK);
    tovl_rowdiff_args a = {.a = buf, .b = buf + rows * h * 2, .flags = buf + 2u * rows * h * 2, .rows = rows, .h = h};
    const uint32_t grid[3] = {rows, 1, 1};
    tovl_kernel_timing t = {0};
    cr_assert_eq(iface->time_kernel(ctx, tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF), grid, &a, sizeof a, 5, 3, &t),
                 TOVL_OK, "%s", tovl_last_error());
    cr_expect_gt(t.batched_us, 0.0);
    cr_expect_gt(t.single_us, 0.0);
    cr_expect_eq(t.repeats, 3);
    uint32_t flags[rows];
    cr_assert_eq(tovl_download(be, flags, a.flags, sizeof flags), TOVL_OK);
    for (uint32_t i = 0; i < rows; i++) {
        cr_expect_eq(flags[i], 0, "timed rowdiff wrote flag %u for identical rows", flags[i]);
    }
    double gbps = 0;
    cr_assert_eq(iface->copy_bandwidth(ctx, copy_bytes, 3, &gbps), TOVL_OK, "%s", tovl_last_error());
    cr_expect_gt(gbps, 0.0);
    cr_expect_eq(iface->time_kernel(ctx, 0, grid, &a, sizeof a, 5, 3, &t), TOVL_ERR_LAUNCH);
    tovl_free(be, buf);
}

size_t tu_conform_against_golden(tovl_backend *ref, tovl_backend *dut, const char *label, tovl_conform_report *rep) {
    tovl_conform_golden golden;
    char err[512];
    cr_assert_eq(tovl_conform_golden_read(TU_CONFORM_GOLDEN, &golden, err, sizeof err), 0, "%s", err);
    fprintf(stderr, "conform %s on %s against %s (suite %s, seed %llu)\n", label ? label : tovl_backend_name(dut),
            tovl_backend_device(dut), TU_CONFORM_GOLDEN, TOVL_CONFORM_SUITE, (unsigned long long)golden.seed);
    const tovl_conform_options opt = {.ref = ref, .dut = dut, .golden = &golden, .label = label, .log = stderr};
    const size_t failed = tovl_conform_run(&opt, rep);
    tovl_conform_golden_free(&golden);
    return failed;
}

void tu_expect_golden_digests(tovl_backend *dut, const char *label) {
    tovl_backend *ref = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK, "%s", tovl_last_error());
    tovl_conform_report rep = {0};
    cr_expect_eq(tu_conform_against_golden(ref, dut, label, &rep), 0, "cases differ from %s", TU_CONFORM_GOLDEN);
    cr_expect_eq(rep.passed, tovl_conform_case_count(), "denormals are kept: every case runs and passes");
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
    tovl_backend_close(ref);
}
