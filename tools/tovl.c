/* tovl: the command-line tool. Dispatches to tools/cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tovl/tovl.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"devices", tovl_cmd_devices, "list backends: present or why not, device, the four kernels"},
    {"conform", tovl_cmd_conform, "check every present backend bit for bit against the CPU reference"},
    {"inspect", tovl_cmd_inspect, "describe a PEFT / vLLM adapter folder"},
    {"run", tovl_cmd_run, "apply adapters to a batch file and write embeddings and logits"},
    {"bench", tovl_cmd_bench, "time the kernels on a backend (the device's clock, medians)"},
};

static void usage(FILE *f) {
    fprintf(f, "tovl %s: per-adapter token overlays for multi-LoRA serving\n\nusage: tovl COMMAND [options]\n\n",
            tovl_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    }
    fprintf(f, "\n'tovl COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    /* "+": stop at the command name; what follows is the command's. */
    while ((c = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("tovl %s\n", tovl_version());
            return 0;
        default:
            return tovl_cli_bad_option("tovl", c, argv, opts, usage);
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[optind];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) == 0) {
            return commands[i].run(argc - optind, argv + optind);
        }
    }
    fprintf(stderr, "tovl: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
