/* The tovl CLI's subcommands; each lives in its own tools/cmd_<name>.c. */
#ifndef TOVL_TOOLS_CLI_H
#define TOVL_TOOLS_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "tovl/tovl.h"

/* The most tensor-parallel ranks `run --tp` and `inspect --tp` take. */
#define TOVL_CLI_TP_MAX 1024

/* Each returns the process exit status: 0 ok, 1 a check failed, 2 bad usage or input. */
int tovl_cmd_devices(int argc, char **argv);
int tovl_cmd_conform(int argc, char **argv);
int tovl_cmd_inspect(int argc, char **argv);
int tovl_cmd_run(int argc, char **argv);
int tovl_cmd_bench(int argc, char **argv);

/* Options are parsed with getopt_long, so "--name value" and "--name=value"
 * both work, and "-h" / "--help" on every command. Each command's parse
 * begins with tovl_cli_getopt_start() and passes ":h" as the short options,
 * so that a missing value comes back as ':'. */
void tovl_cli_getopt_start(void);

/* For getopt_long's '?' or ':': prints "CMD: unknown option '--x'" (or needs
 * a value / takes no value / is ambiguous) and the usage to stderr; returns 2. */
int tovl_cli_bad_option(const char *cmd, int c, char **argv, const struct option *opts, void (*usage)(FILE *));

/* 0 when getopt_long left no operands; else names the first one, prints the
 * usage to stderr and returns 2. */
int tovl_cli_no_operands(const char *cmd, int argc, char **argv, void (*usage)(FILE *));

/* --cuda-image FILE (bench, conform): the CUDA backend on the kernels of FILE
 * (a cubin, fatbin or PTX, through tovl_cuda_backend_open_image) instead of
 * its own, so another port's kernel source compiled for NVIDIA, e.g. the HIP
 * port's (hip_on_cuda.h), runs with the same workload. 0 when opened; else
 * prints "CMD: ..." naming the file and returns 2. */
int tovl_cli_open_cuda_image(const char *cmd, const char *path, tovl_backend **be);

#endif
