/* tovl conform: the conformance suite on every present backend (or one),
 * against the CPU reference; a table backend x kernel x case; exit 1 on any
 * mismatch. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "conform.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tovl conform [--backend NAME] [--seed N] [--json FILE] [--verbose]\n\n"
               "Runs every conformance case on each present backend (or only NAME) and on the\n"
               "CPU reference, compares outputs bit for bit with guards around every output,\n"
               "and prints a table. Exit status 1 on any mismatch, 2 on bad usage.\n");
}

static int write_json(const char *path, uint64_t seed, const tovl_conform_report *rep,
                      const tovl_backend_info *infos, size_t n_infos) {
    cJSON *root = cJSON_CreateObject();
    char seed_text[32];
    snprintf(seed_text, sizeof seed_text, "%" PRIu64, seed);
    cJSON_AddStringToObject(root, "seed", seed_text);
    cJSON *backends = cJSON_AddArrayToObject(root, "backends");
    for (size_t i = 0; i < n_infos; i++) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "name", infos[i].name);
        cJSON_AddBoolToObject(b, "available", infos[i].available);
        cJSON_AddStringToObject(b, infos[i].available ? "device" : "reason",
                                infos[i].available ? infos[i].device : infos[i].reason);
        cJSON_AddItemToArray(backends, b);
    }
    cJSON *results = cJSON_AddArrayToObject(root, "results");
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "backend", r->backend);
        cJSON_AddStringToObject(o, "kernel", r->kernel);
        cJSON_AddStringToObject(o, "case", r->case_name);
        cJSON_AddStringToObject(o, "result", r->skipped ? "skipped" : r->passed ? "passed" : "failed");
        cJSON_AddStringToObject(o, "detail", r->detail);
        cJSON_AddItemToArray(results, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) {
        ok = 0;
    }
    free(text);
    if (!ok) {
        fprintf(stderr, "tovl conform: cannot write --json file '%s'\n", path);
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

static void print_table(const tovl_conform_report *rep, const tovl_backend_info *infos, size_t n) {
    printf("\n%-20s %-26s", "kernel", "case");
    for (size_t b = 0; b < n; b++) {
        printf(" %-7s", infos[b].name);
    }
    printf("\n");
    for (size_t i = 0; i < rep->count; i++) {
        const tovl_conform_result *r = &rep->results[i];
        if (strcmp(r->backend, rep->results[0].backend) != 0) {
            continue; /* one line per (kernel, case): walk the first backend's results */
        }
        printf("%-20s %-26s", r->kernel, r->case_name);
        for (size_t b = 0; b < n; b++) {
            const tovl_conform_result *x = find(rep, infos[b].name, r->kernel, r->case_name);
            printf(" %-7s", !x ? "-" : x->skipped ? "skip" : x->passed ? "ok" : "FAIL");
        }
        printf("\n");
    }
}

int tovl_cmd_conform(int argc, char **argv) {
    const char *only = NULL, *json = NULL;
    uint64_t seed = tovl_conform_fresh_seed();
    int verbose = 0;
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"backend", required_argument, NULL, 'b'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"verbose", no_argument, NULL, 'v'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'b':
            only = optarg;
            break;
        case 's':
            seed = strtoull(optarg, &end, 0);
            if (*end) {
                fprintf(stderr, "tovl conform: --seed '%s' is not a number\n", optarg);
                return 2;
            }
            break;
        case 'j':
            json = optarg;
            break;
        case 'v':
            verbose = 1;
            break;
        default:
            return tovl_cli_bad_option("tovl conform", c, argv, opts, usage);
        }
    }
    if (tovl_cli_no_operands("tovl conform", argc, argv, usage)) {
        return 2;
    }
    printf("tovl conform: seed %" PRIu64 " (replay with --seed %" PRIu64 ")\n", seed, seed);
    tovl_backend_info all[8], infos[8];
    size_t n_all = tovl_backend_list(all, 8), n = 0;
    for (size_t i = 0; i < n_all && i < 8; i++) {
        if (!only || !strcmp(only, all[i].name)) {
            infos[n++] = all[i];
        }
    }
    if (only && n == 0) {
        fprintf(stderr, "tovl conform: unknown backend '%s'\n", only);
        return 2;
    }
    tovl_backend *ref = NULL;
    if (tovl_backend_open("cpu", &ref) != TOVL_OK) {
        fprintf(stderr, "tovl conform: cannot open the CPU reference: %s\n", tovl_last_error());
        return 1;
    }
    tovl_conform_report rep = {0};
    int status = 0;
    size_t shown = 0;
    tovl_backend_info shown_infos[8];
    for (size_t i = 0; i < n; i++) {
        if (!infos[i].available) {
            printf("%-7s skipped: %s\n", infos[i].name, infos[i].reason);
            if (only) {
                status = 1; /* asked for this backend explicitly: it must be there */
            }
            continue;
        }
        tovl_backend *dut = NULL;
        if (tovl_backend_open(infos[i].name, &dut) != TOVL_OK) {
            printf("%-7s failed to open: %s\n", infos[i].name, tovl_last_error());
            status = 1;
            continue;
        }
        printf("%-7s %s\n", infos[i].name, tovl_backend_device(dut));
        fflush(stdout);
        size_t before_pass = rep.passed, before_skip = rep.skipped;
        size_t failed = tovl_conform_backend(ref, dut, seed, verbose ? stdout : NULL, &rep);
        printf("%-7s %zu passed, %zu failed, %zu skipped\n", infos[i].name, rep.passed - before_pass, failed,
               rep.skipped - before_skip);
        if (failed) {
            status = 1;
        }
        shown_infos[shown++] = infos[i];
        tovl_backend_close(dut);
    }
    if (rep.count) {
        print_table(&rep, shown_infos, shown);
        for (size_t i = 0; i < rep.count; i++) {
            const tovl_conform_result *r = &rep.results[i];
            if (!r->passed || r->skipped) {
                printf("%s %s %s %s: %s\n", r->skipped ? "SKIP" : "FAIL", r->backend, r->kernel, r->case_name,
                       r->detail);
            }
        }
    }
    printf("\nconform: %zu passed, %zu failed, %zu skipped (seed %" PRIu64 ")\n", rep.passed, rep.failed,
           rep.skipped, seed);
    if (json && write_json(json, seed, &rep, infos, n) != 0) {
        status = 2;
    }
    tovl_conform_report_free(&rep);
    tovl_backend_close(ref);
    return status;
}
