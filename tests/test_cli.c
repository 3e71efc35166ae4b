/* The tovl binary's command line: "--name value" and "--name=value" give the
 * same result, -h / --help print the command's usage on stdout and exit 0,
 * and an unknown or incomplete option exits 2 with the option named on
 * stderr (README, The CLI: 0 ok, 1 a check failed, 2 bad usage or input). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "tovl/tovl.h"

#define FIXTURES TOVL_EXTRA_FIXTURES
#define BASE FIXTURES "/bases/untied"
#define ADAPTER FIXTURES "/tt_dict_both_untied/adapter"
#define BATCH FIXTURES "/tt_dict_both_untied/expected.safetensors"

static const char *const commands[] = {"devices", "conform", "inspect", "run", "bench"};

typedef struct cli_result {
    int rc;
    char out[16384], err[4096];
} cli_result;

static cli_result *cli(const char *fmt, const char *a, const char *b) {
    static cli_result r;
    char args[2048];
    snprintf(args, sizeof args, fmt, a, b);
    r.rc = tu_run_cli_output(TOVL_CLI, NULL, args, r.out, sizeof r.out, r.err, sizeof r.err);
    return &r;
}

/* Exit 2 and the first stderr line names `what` (the usage may follow). */
static void expect_usage_error(const char *args, const char *what) {
    const cli_result *r = cli("%s%s", args, "");
    cr_expect_eq(r->rc, 2, "tovl %s: exit %d, wanted 2 (stderr: %s)", args, r->rc, r->err);
    const char *nl = strchr(r->err, '\n');
    const size_t first = nl ? (size_t)(nl - r->err) : strlen(r->err);
    const char *at = strstr(r->err, what);
    cr_expect(at && (size_t)(at - r->err) < first, "tovl %s: the first stderr line does not name %s: %s", args,
              what, r->err);
    cr_expect_eq(r->out[0], '\0', "tovl %s wrote to stdout: %s", args, r->out);
}

Test(cli_help, every_command_both_spellings) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const char *spellings[] = {"-h", "--help"};
        for (size_t s = 0; s < 2; s++) {
            const cli_result *r = cli("%s %s", commands[i], spellings[s]);
            char want[64];
            snprintf(want, sizeof want, "usage: tovl %s", commands[i]);
            cr_expect_eq(r->rc, 0, "tovl %s %s: exit %d (stderr: %s)", commands[i], spellings[s], r->rc, r->err);
            cr_expect(strncmp(r->out, want, strlen(want)) == 0, "tovl %s %s: stdout does not start with '%s': %s",
                      commands[i], spellings[s], want, r->out);
            cr_expect_eq(r->err[0], '\0', "tovl %s %s wrote to stderr: %s", commands[i], spellings[s], r->err);
        }
    }
}

Test(cli_help, top_level) {
    const char *spellings[] = {"-h", "--help"};
    for (size_t s = 0; s < 2; s++) {
        const cli_result *r = cli("%s%s", spellings[s], "");
        cr_expect_eq(r->rc, 0, "tovl %s: exit %d", spellings[s], r->rc);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
            cr_expect(strstr(r->out, commands[i]) != NULL, "tovl %s does not list %s: %s", spellings[s],
                      commands[i], r->out);
        }
    }
    const cli_result *r = cli("--version%s%s", "", "");
    cr_expect_eq(r->rc, 0);
    cr_expect(strstr(r->out, tovl_version()) != NULL, "tovl --version: %s", r->out);
    r = cli("%s%s", "", "");
    cr_expect_eq(r->rc, 2, "tovl without a command: exit %d", r->rc);
    cr_expect(strstr(r->err, "usage: tovl COMMAND") != NULL, "%s", r->err);
}

Test(cli_errors, unknown_options_are_named) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --bogus", commands[i]);
        expect_usage_error(args, "'--bogus'");
        snprintf(args, sizeof args, "%s --bogus=7", commands[i]);
        expect_usage_error(args, "unknown option '--bogus'");
        snprintf(args, sizeof args, "%s -x", commands[i]);
        expect_usage_error(args, "'-x'");
    }
    expect_usage_error("--bogus", "'--bogus'");
    expect_usage_error("nosuch", "unknown command 'nosuch'");
    expect_usage_error("devices extra", "unexpected argument 'extra'");
    expect_usage_error("conform extra", "unexpected argument 'extra'");
    expect_usage_error("bench extra", "unexpected argument 'extra'");
    expect_usage_error("bench --cuda-image /nonexistent/kernels.cubin", "'/nonexistent/kernels.cubin'");
    expect_usage_error("bench --backend vulkan --cuda-image /dev/null", "not 'vulkan'");
    expect_usage_error("bench --capacity 32", "--capacity 32 is below the 64 rows");
    expect_usage_error("bench --capacity 64,x", "'x' is not a capacity");
    expect_usage_error("bench --rows 0", "--rows '0'");
    expect_usage_error("inspect " ADAPTER " extra", "unexpected argument 'extra'");
    expect_usage_error("run --base " BASE " --batch " BATCH " --out /dev/null extra", "unexpected argument 'extra'");
    expect_usage_error("conform --verbose=1", "option '--verbose' takes no value");
    expect_usage_error("conform --cuda-image /nonexistent/kernels.cubin", "'/nonexistent/kernels.cubin'");
    expect_usage_error("conform --backend vulkan --cuda-image /dev/null", "not 'vulkan'");
    expect_usage_error("conform --against /nonexistent/golden.json", "'/nonexistent/golden.json'");
    expect_usage_error("run --digest=1", "option '--digest' takes no value");
    expect_usage_error("run --ba x", "option '--ba' is ambiguous");
}

Test(cli_errors, options_without_their_value) {
    const char *cases[][2] = {
        {"conform --backend", "--backend"}, {"conform --seed", "--seed"},   {"conform --json", "--json"},
        {"conform --junit", "--junit"}, {"conform --against", "--against"}, {"conform --golden-out", "--golden-out"},
        {"conform --cuda-image", "--cuda-image"},
        {"inspect " ADAPTER " --base", "--base"}, {"inspect " ADAPTER " --vocab", "--vocab"},
        {"inspect " ADAPTER " --backend", "--backend"},
        {"run --base " BASE " --batch " BATCH " --out", "--out"}, {"run --adapter", "--adapter"},
        {"run --logits", "--logits"}, {"run --vocab", "--vocab"},    {"bench --backend", "--backend"},
        {"bench --seed", "--seed"},     {"bench --tokens", "--tokens"}, {"bench --batch", "--batch"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "option '%s' needs a value", cases[i][1]);
        expect_usage_error(cases[i][0], what);
    }
}

/* A value check names the option and the value, in either spelling. */
Test(cli_errors, bad_values_both_spellings) {
    const char *cases[][3] = {
        {"conform --backend=nosuch", "conform --backend nosuch", "'nosuch'"},
        {"conform --seed=12x", "conform --seed 12x", "--seed '12x'"},
        {"inspect " ADAPTER " --vocab=-1", "inspect " ADAPTER " --vocab -1", "--vocab '-1'"},
        {"run --logits=f16", "run --logits f16", "--logits 'f16'"},
        {"bench --tokens=0", "bench --tokens 0", "--tokens '0'"},
        {"bench --repeats=0", "bench --repeats 0", "--repeats '0'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t s = 0; s < 2; s++) {
            const cli_result *r = cli("%s%s", cases[i][s], "");
            cr_expect_eq(r->rc, 2, "tovl %s: exit %d, wanted 2 (stderr: %s)", cases[i][s], r->rc, r->err);
            cr_expect(strstr(r->err, cases[i][2]) != NULL, "tovl %s: stderr does not name %s: %s", cases[i][s],
                      cases[i][2], r->err);
        }
    }
}

/* Reads a whole (small) file; NULL when it cannot. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    char *buf = malloc(1 << 20);
    *n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

/* The same run with every value spelled "--name=value" and "--name value"
 * (mixed with the operand first or last) writes the same bytes. */
Test(cli_spellings, run_writes_the_same_output) {
    char dir[] = "/tmp/tovl_cli_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    const cli_result *r = cli("run --backend=cpu --base=" BASE " --adapter=" ADAPTER " --batch=" BATCH
                              " --logits=f32 --vocab=131 --out=%s%s",
                              a, "");
    cr_assert_eq(r->rc, 0, "--name=value: exit %d: %s", r->rc, r->err);
    r = cli("run --backend cpu --base " BASE " --adapter " ADAPTER " --batch " BATCH
            " --logits f32 --vocab 131 --out %s%s",
            b, "");
    cr_assert_eq(r->rc, 0, "--name value: exit %d: %s", r->rc, r->err);
    size_t na = 0, nb = 0;
    char *da = slurp(a, &na), *db = slurp(b, &nb);
    cr_assert(da && db && na > 0, "the outputs were not written");
    cr_expect(na == nb && memcmp(da, db, na) == 0, "the two spellings wrote different files (%zu and %zu bytes)",
              na, nb);
    free(da);
    free(db);
    unlink(a);
    unlink(b);
    rmdir(dir);
}

Test(cli_spellings, inspect_prints_the_same_json) {
    static char first[16384];
    const cli_result *r = cli("inspect --json --base=" BASE " --backend=cpu " ADAPTER "%s%s", "", "");
    cr_assert_eq(r->rc, 0, "--name=value: exit %d: %s", r->rc, r->err);
    cr_assert(strstr(r->out, "\"base\"") != NULL, "no base in the JSON: %s", r->out);
    strcpy(first, r->out);
    r = cli("inspect " ADAPTER " --json --base " BASE " --backend cpu%s%s", "", "");
    cr_assert_eq(r->rc, 0, "--name value: exit %d: %s", r->rc, r->err);
    cr_expect_str_eq(r->out, first, "the two spellings printed different JSON");
}

/* make run's last step: the fixture adapters served through `tovl run`, one
 * per slot plus base rows; the script checks the unpatched rows itself. */
Test(cli_serve_demo, serves_every_slot) {
    /* scripts/valgrind.sh traces the programs a test starts; the Python
     * interpreter is not valgrind-clean, and the tovl it starts runs under
     * valgrind in the tests above. */
    const char *preload = getenv("LD_PRELOAD");
    if (preload && strstr(preload, "vgpreload")) {
        cr_skip_test("under valgrind: the demo runs Python, which is not valgrind-clean");
    }
    char dir[] = "/tmp/tovl_demo_XXXXXX", cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    const uint64_t seed = tu_seed();
    /* Without LD_PRELOAD: a sanitizer runtime preloaded for the tests would
     * report the shell's and Python's own leaks; tovl links its own. */
    snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD python3 '%s' '%s' --out '%s' --seed %llu 2>&1", TOVL_SERVE_DEMO,
             TOVL_CLI, dir, (unsigned long long)(seed & 0xFFFFFFFFu));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    static char out[8192];
    const size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    const int rc = pclose(p);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: %s", cmd, out);
    const char *want[] = {"backend cpu", "tt_dict_both_untied", "mts_both_untied", "(no adapter)",
                          "rows left as the base model's embedding: all equal", "ms wall clock"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_expect(strstr(out, want[i]) != NULL, "the summary lacks '%s':\n%s", want[i], out);
    }
    /* 6 slots x 3 rows + 4 base rows; 8 of them hit an overlaid id (two per
     * adapter with embed rows); 4 adapters with 3 lm_head rows, 3 rows each. */
    cr_expect(strstr(out, "  all                            22                   8                       36") != NULL,
              "the totals are not 22 rows, 8 patched, 36 cells:\n%s", out);
    char path[256];
    const char *files[] = {"batch.safetensors", "out.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_expect_eq(unlink(path), 0, "%s was not written", path);
    }
    rmdir(dir);
}

/* --capacity: fixed-shape sets checked against the from_slots set and timed beside it. */
Test(cli_bench, capacity_sets_are_checked_and_timed, .timeout = 300) {
    const cli_result *r = cli("bench --backend cpu --quick --hooks-only --tokens 3 --rows 4 --capacity 4,16%s%s",
                              "", "");
    cr_assert_eq(r->rc, 0, "exit %d: %s", r->rc, r->err);
    cr_expect(strstr(r->out, "outputs identical to the from_slots set's (2 checks)"), "%s", r->out);
    cr_expect(strstr(r->out, "load into a slot (cap 16)"), "%s", r->out);
    cr_expect(strstr(r->out, "T=3 8x4 cap 16"), "%s", r->out);
}
