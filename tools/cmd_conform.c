/* tovl conform: the conformance suite on every present backend (or one),
 * against the CPU reference, or against a golden file of digests written on
 * another machine (--against); a table backend x kernel x case; exit 1 on any
 * mismatch. --golden-out writes the reference's digests, --json and --junit
 * the results. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "conform.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tovl conform [--backend NAME] [--seed N] [--json FILE] [--junit FILE] [--verbose]\n"
            "                    [--golden-out FILE | --against FILE] [--cuda-image FILE]\n\n"
            "Runs every conformance case of suite %s on each present backend (or only NAME)\n"
            "and on the CPU reference, compares outputs bit for bit with guards around every\n"
            "output, and prints a table; --verbose prints each case's SHA-256 of its output.\n"
            "  --golden-out FILE  also write the CPU reference's digests (at --seed, default %u)\n"
            "  --against FILE     compare each backend's digests with a golden file instead, at\n"
            "                     its seed; the CPU reference runs only to place a difference\n"
            "  --junit FILE       the results as JUnit XML (a testsuite per backend)\n"
            "  --cuda-image FILE  the cuda backend on the kernels of FILE (cubin, fatbin or PTX)\n"
            "Exit status 1 on any mismatch, 2 on bad usage or a bad golden file.\n",
            TOVL_CONFORM_SUITE, TOVL_CONFORM_GOLDEN_SEED);
}

typedef struct conform_opts {
    const char *only, *json, *junit, *golden_out, *against, *cuda_image;
    uint64_t seed;
    bool seed_given;
    int verbose;
} conform_opts;

/* A backend the suite ran on (or could not). */
typedef struct ran_backend {
    char name[16];
    bool available;
    char text[256]; /* device, or why not */
} ran_backend;

/* Writes `text` to `path`; 0, or 2 with the error printed. */
static int write_text(const char *path, const char *what, const char *text) {
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) {
        ok = 0;
    }
    if (!ok) {
        fprintf(stderr, "tovl conform: cannot write %s file '%s'\n", what, path);
        return 2;
    }
    return 0;
}

static int write_json(const conform_opts *o, const tovl_conform_report *rep, const ran_backend *ran, size_t n_ran) {
    cJSON *root = cJSON_CreateObject();
    char seed_text[32];
    snprintf(seed_text, sizeof seed_text, "%" PRIu64, o->seed);
    cJSON_AddStringToObject(root, "suite", TOVL_CONFORM_SUITE);
    cJSON_AddStringToObject(root, "seed", seed_text);
    cJSON_AddStringToObject(root, "against", o->against ? o->against : "cpu reference");
    cJSON *backends = cJSON_AddArrayToObject(root, "backends");
    for (size_t i = 0; i < n_ran; i++) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "name", ran[i].name);
        cJSON_AddBoolToObject(b, "available", ran[i].available);
        cJSON_AddStringToObject(b, ran[i].available ? "device" : "reason", ran[i].text);
        cJSON_AddItemToArray(backends, b);
    }
    cJSON *results = cJSON_AddArrayToObject(root, "results");
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "backend", r->backend);
        cJSON_AddStringToObject(x, "kernel", r->kernel);
        cJSON_AddStringToObject(x, "case", r->case_name);
        cJSON_AddStringToObject(x, "result", r->skipped ? "skipped" : r->passed ? "passed" : "failed");
        cJSON_AddStringToObject(x, "buffer", r->buffer);
        if (r->sha256[0]) {
            cJSON_AddStringToObject(x, "sha256", r->sha256);
        } else {
            cJSON_AddNullToObject(x, "sha256");
        }
        cJSON_AddStringToObject(x, "detail", r->detail);
        cJSON_AddItemToArray(results, x);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    size_t len = text ? strlen(text) : 0;
    char *line = text ? realloc(text, len + 2) : NULL;
    if (line) {
        memcpy(line + len, "\n", 2);
    }
    int rc = write_text(o->json, "--json", line ? line : NULL);
    free(line ? line : text);
    return rc;
}

/* XML text with &, <, >, " and control characters escaped. */
static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t') {
                fputc('?', f);
            } else {
                fputc(*s, f);
            }
        }
    }
}

/* JUnit XML: a testsuite per backend, a testcase per (kernel, case), named
 * "kernel/case"; a failure's message is its buffer and the result's detail
 * (the first cell that differs, or the digests). */
static int write_junit(const conform_opts *o, const tovl_conform_report *rep, const ran_backend *ran, size_t n_ran) {
    FILE *f = fopen(o->junit, "w");
    if (!f) {
        fprintf(stderr, "tovl conform: cannot write --junit file '%s'\n", o->junit);
        return 2;
    }
    size_t tests = rep->count, failures = rep->failed, skipped = rep->skipped;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<testsuites name=\"tovl conform %s seed %" PRIu64 "\" tests=\"%zu\" failures=\"%zu\" skipped=\"%zu\">\n",
            TOVL_CONFORM_SUITE, o->seed, tests, failures, skipped);
    for (size_t b = 0; b < n_ran; b++) {
        size_t n = 0, nf = 0, ns = 0;
        for (size_t i = 0; i < rep->count; i++) {
            const tovl_conform_result *r = &rep->results[i];
            if (!strcmp(r->backend, ran[b].name)) {
                n++;
                nf += !r->passed && !r->skipped;
                ns += r->skipped;
            }
        }
        if (!ran[b].available) {
            continue; /* a backend that is not here has no testsuite: the JSON says why */
        }
        fprintf(f, "  <testsuite name=\"");
        xml_text(f, ran[b].name);
        fprintf(f, "\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"%zu\">\n", n, nf, ns);
        fprintf(f, "    <properties>\n      <property name=\"suite\" value=\"%s\"/>\n", TOVL_CONFORM_SUITE);
        fprintf(f, "      <property name=\"seed\" value=\"%" PRIu64 "\"/>\n      <property name=\"device\" value=\"",
                o->seed);
        xml_text(f, ran[b].text);
        fprintf(f, "\"/>\n      <property name=\"against\" value=\"");
        xml_text(f, o->against ? o->against : "cpu reference");
        fprintf(f, "\"/>\n    </properties>\n");
        for (size_t i = 0; i < rep->count; i++) {
            const tovl_conform_result *r = &rep->results[i];
            if (strcmp(r->backend, ran[b].name) != 0) {
                continue;
            }
            fprintf(f, "    <testcase classname=\"tovl.conform.");
            xml_text(f, r->backend);
            fprintf(f, "\" name=\"%s/%s\"", r->kernel, r->case_name);
            if (r->passed && !r->skipped) {
                fprintf(f, "/>\n");
                continue;
            }
            fprintf(f, ">\n      <%s message=\"", r->skipped ? "skipped" : "failure");
            /* a failure names its buffer first (a golden mismatch's detail already does) */
            const size_t named = strlen(r->buffer);
            if (!r->skipped && (strncmp(r->detail, r->buffer, named) != 0 || r->detail[named] != ':')) {
                xml_text(f, r->buffer);
                xml_text(f, ": ");
            }
            xml_text(f, r->detail);
            fprintf(f, "\"/>\n    </testcase>\n");
        }
        fprintf(f, "  </testsuite>\n");
    }
    fprintf(f, "</testsuites>\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "tovl conform: cannot write --junit file '%s'\n", o->junit);
        return 2;
    }
    return 0;
}

/* The result of (kernel, case) on backend b, or NULL. */
static const tovl_conform_result *find(const tovl_conform_report *rep, const char *backend, const char *kernel,
                                       const char *case_name) {
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        if (!strcmp(r->backend, backend) && !strcmp(r->kernel, kernel) && !strcmp(r->case_name, case_name)) {
            return r;
        }
    }
    return NULL;
}

static void print_table(const tovl_conform_report *rep, const ran_backend *ran, size_t n) {
    printf("\n%-20s %-26s", "kernel", "case");
    for (size_t b = 0; b < n; b++) {
        printf(" %-7s", ran[b].name);
    }
    printf("\n");
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        if (strcmp(r->backend, rep->results[0].backend) != 0) {
            continue; /* one line per (kernel, case): walk the first backend's results */
        }
        printf("%-20s %-26s", r->kernel, r->case_name);
        for (size_t b = 0; b < n; b++) {
            const tovl_conform_result *x = find(rep, ran[b].name, r->kernel, r->case_name);
            printf(" %-7s", !x ? "-" : x->skipped ? "skip" : x->passed ? "ok" : "FAIL");
        }
        printf("\n");
    }
}

/* 0: parsed; 1: --help shown; 2: bad usage (message printed). */
static int parse_args(int argc, char **argv, conform_opts *o) {
    memset(o, 0, sizeof *o);
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"backend", required_argument, NULL, 'b'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"junit", required_argument, NULL, 'u'},
                                         {"golden-out", required_argument, NULL, 'g'},
                                         {"against", required_argument, NULL, 'a'},
                                         {"cuda-image", required_argument, NULL, 'i'},
                                         {"verbose", no_argument, NULL, 'v'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'h':
            usage(stdout);
            return 1;
        case 'b': o->only = optarg; break;
        case 'j': o->json = optarg; break;
        case 'u': o->junit = optarg; break;
        case 'g': o->golden_out = optarg; break;
        case 'a': o->against = optarg; break;
        case 'i': o->cuda_image = optarg; break;
        case 'v': o->verbose = 1; break;
        case 's':
            o->seed = strtoull(optarg, &end, 0);
            if (*end || !*optarg || optarg[0] == '-') {
                fprintf(stderr, "tovl conform: --seed '%s' is not a number\n", optarg);
                return 2;
            }
            o->seed_given = true;
            break;
        default:
            return tovl_cli_bad_option("tovl conform", c, argv, opts, usage);
        }
    }
    if (tovl_cli_no_operands("tovl conform", argc, argv, usage)) {
        return 2;
    }
    if (o->golden_out && o->against) {
        fprintf(stderr, "tovl conform: --golden-out and --against exclude each other\n");
        return 2;
    }
    if (o->cuda_image && o->only && strcmp(o->only, "cuda") != 0) {
        fprintf(stderr, "tovl conform: --cuda-image runs on the cuda backend, not '%s'\n", o->only);
        return 2;
    }
    if (!o->seed_given) {
        o->seed = o->golden_out ? TOVL_CONFORM_GOLDEN_SEED : tovl_conform_fresh_seed();
    }
    return 0;
}

/* --golden-out: the reference alone, at the seed, its digests written. */
static int write_golden(const conform_opts *o, tovl_backend *ref) {
    tovl_conform_report rep = {0};
    const tovl_conform_options opt = {.dut = ref, .seed = o->seed, .label = "cpu"};
    tovl_conform_run(&opt, &rep);
    char err[512];
    int rc = tovl_conform_golden_write(o->golden_out, o->seed, "cpu", &rep, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tovl conform: %s\n", err);
        rc = rep.failed ? 1 : 2;
    } else {
        printf("golden file %s: suite %s, seed %" PRIu64 ", %zu digests of the CPU reference\n", o->golden_out,
               TOVL_CONFORM_SUITE, o->seed, rep.count);
    }
    tovl_conform_report_free(&rep);
    return rc;
}

int tovl_cmd_conform(int argc, char **argv) {
    conform_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        return prc == 1 ? 0 : 2;
    }
    tovl_conform_golden golden = {0};
    if (o.against) {
        char err[512];
        if (tovl_conform_golden_read(o.against, &golden, err, sizeof err) != 0) {
            fprintf(stderr, "tovl conform: %s\n", err);
            return 2;
        }
        if (o.seed_given && o.seed != golden.seed) {
            fprintf(stderr, "tovl conform: golden file '%s' is for seed %" PRIu64 ", not --seed %" PRIu64 "\n",
                    o.against, golden.seed, o.seed);
            tovl_conform_golden_free(&golden);
            return 2;
        }
        o.seed = golden.seed;
    }
    /* --cuda-image: opened before anything is printed, so a bad file is a usage error alone */
    tovl_backend *image_dut = NULL;
    if (o.cuda_image && tovl_cli_open_cuda_image("tovl conform", o.cuda_image, &image_dut) != 0) {
        tovl_conform_golden_free(&golden);
        return 2;
    }
    printf("tovl conform: suite %s, seed %" PRIu64 " (replay with --seed %" PRIu64 ")\n", TOVL_CONFORM_SUITE, o.seed,
           o.seed);
    if (o.against) {
        printf("against golden file %s (digests of %s)\n", o.against, golden.backend);
    }
    tovl_backend_info all[8];
    ran_backend ran[8];
    /* --cuda-image: the cuda backend on those kernels only, named apart from the CUDA port's */
    size_t n_all = o.cuda_image ? 1 : tovl_backend_list(all, 8), n = 0;
    if (o.cuda_image) {
        all[0] = (tovl_backend_info){.name = "cuda-image", .available = true};
    }
    for (size_t i = 0; i < n_all && i < 8; i++) {
        if (!o.only || o.cuda_image || !strcmp(o.only, all[i].name)) {
            ran_backend *r = &ran[n++];
            snprintf(r->name, sizeof r->name, "%s", all[i].name);
            r->available = all[i].available;
            snprintf(r->text, sizeof r->text, "%s", all[i].available ? all[i].device : all[i].reason);
        }
    }
    if (o.only && n == 0) {
        fprintf(stderr, "tovl conform: unknown backend '%s'\n", o.only);
        tovl_conform_golden_free(&golden);
        return 2;
    }
    tovl_backend *ref = NULL;
    if (tovl_backend_open("cpu", &ref) != TOVL_OK) {
        fprintf(stderr, "tovl conform: cannot open the CPU reference: %s\n", tovl_last_error());
        tovl_conform_golden_free(&golden);
        return 1;
    }
    tovl_conform_report rep = {0};
    int status = 0;
    size_t shown = 0;
    ran_backend shown_ran[8];
    for (size_t i = 0; i < n; i++) {
        if (!ran[i].available) {
            printf("%-7s skipped: %s\n", ran[i].name, ran[i].text);
            if (o.only) {
                status = 1; /* asked for this backend explicitly: it must be there */
            }
            continue;
        }
        tovl_backend *dut = NULL;
        if (o.cuda_image) {
            dut = image_dut;
            snprintf(ran[i].text, sizeof ran[i].text, "%.180s, kernels of %.50s", tovl_backend_device(dut),
                     o.cuda_image);
        } else if (tovl_backend_open(ran[i].name, &dut) != TOVL_OK) {
            printf("%-7s failed to open: %s\n", ran[i].name, tovl_last_error());
            status = 1;
            continue;
        }
        if (!o.cuda_image) {
            snprintf(ran[i].text, sizeof ran[i].text, "%s", tovl_backend_device(dut));
        }
        printf("%-7s %s\n", ran[i].name, ran[i].text);
        fflush(stdout);
        size_t before_pass = rep.passed, before_skip = rep.skipped;
        const tovl_conform_options opt = {.ref = ref, .dut = dut, .golden = o.against ? &golden : NULL,
                                          .seed = o.seed, .label = ran[i].name, .log = o.verbose ? stdout : NULL};
        size_t failed = tovl_conform_run(&opt, &rep);
        printf("%-7s %zu passed, %zu failed, %zu skipped\n", ran[i].name, rep.passed - before_pass, failed,
               rep.skipped - before_skip);
        if (failed && status == 0) {
            status = 1;
        }
        shown_ran[shown++] = ran[i];
        tovl_backend_close(dut);
    }
    if (rep.count) {
        print_table(&rep, shown_ran, shown);
        for (size_t i = 0; i < rep.count; i++) {
            const tovl_conform_result *r = &rep.results[i];
            if (!r->passed || r->skipped) {
                printf("%s %s %s %s: %s\n", r->skipped ? "SKIP" : "FAIL", r->backend, r->kernel, r->case_name,
                       r->detail);
            }
        }
    }
    printf("\nconform: %zu passed, %zu failed, %zu skipped (suite %s, seed %" PRIu64 "%s%s)\n", rep.passed,
           rep.failed, rep.skipped, TOVL_CONFORM_SUITE, o.seed, o.against ? ", against " : "",
           o.against ? o.against : "");
    if (o.golden_out) {
        const int grc = write_golden(&o, ref);
        status = grc > status ? grc : status;
    }
    if (o.json && write_json(&o, &rep, ran, n) != 0) {
        status = 2;
    }
    if (o.junit && write_junit(&o, &rep, ran, n) != 0) {
        status = 2;
    }
    tovl_conform_report_free(&rep);
    tovl_conform_golden_free(&golden);
    tovl_backend_close(ref);
    return status;
}
