/* What every tovl subcommand shares: starting getopt_long on its own argv and
 * reporting a bad option by name. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tovl/tovl_cuda.h"

void tovl_cli_getopt_start(void) {
    /* 0, not 1: glibc and musl then forget the state of an earlier parse
     * (the dispatcher's, whose "+" stops at the command name). */
    optind = 0;
    opterr = 0; /* the messages below name the command */
}

/* The long options `name` (without "--" and "=value") is a prefix of. */
static size_t prefix_matches(const char *name, size_t len, const struct option *opts) {
    size_t n = 0;
    for (const struct option *o = opts; o->name; o++) {
        n += strncmp(o->name, name, len) == 0;
    }
    return n;
}

int tovl_cli_bad_option(const char *cmd, int c, char **argv, const struct option *opts, void (*usage)(FILE *)) {
    const char *arg = argv[optind - 1];
    if (strncmp(arg, "--", 2) == 0) {
        const int len = (int)strcspn(arg, "=");
        const bool has_value = arg[len] == '=';
        if (c == ':') {
            fprintf(stderr, "%s: option '%.*s' needs a value\n", cmd, len, arg);
        } else if (optopt != 0 && has_value) {
            fprintf(stderr, "%s: option '%.*s' takes no value\n", cmd, len, arg);
        } else if (prefix_matches(arg + 2, (size_t)len - 2, opts) > 1) {
            fprintf(stderr, "%s: option '%.*s' is ambiguous\n", cmd, len, arg);
        } else {
            fprintf(stderr, "%s: unknown option '%.*s'\n", cmd, len, arg);
        }
    } else if (c == ':') {
        fprintf(stderr, "%s: option '-%c' needs a value\n", cmd, optopt);
    } else {
        fprintf(stderr, "%s: unknown option '-%c'\n", cmd, optopt);
    }
    usage(stderr);
    return 2;
}

int tovl_cli_no_operands(const char *cmd, int argc, char **argv, void (*usage)(FILE *)) {
    if (optind >= argc) {
        return 0;
    }
    fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, argv[optind]);
    usage(stderr);
    return 2;
}

int tovl_cli_open_cuda_image(const char *cmd, const char *path, tovl_backend **be) {
    FILE *f = fopen(path, "rb");
    char *image = NULL;
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        size = ftell(f);
    }
    if (size > 0 && fseek(f, 0, SEEK_SET) == 0) {
        image = malloc((size_t)size + 1); /* a NUL after PTX text */
    }
    const bool read = image && fread(image, 1, (size_t)size, f) == (size_t)size;
    if (f) {
        fclose(f);
    }
    if (!read) {
        fprintf(stderr, "%s: cannot read --cuda-image '%s'\n", cmd, path);
        free(image);
        return 2;
    }
    image[size] = '\0';
    const char *slash = strrchr(path, '/');
    tovl_status st = tovl_cuda_backend_open_image(image, (size_t)size + 1, slash ? slash + 1 : path, be);
    free(image);
    if (st != TOVL_OK) {
        fprintf(stderr, "%s: cannot open the cuda backend on '%s': %s\n", cmd, path, tovl_last_error());
        return 2;
    }
    return 0;
}
