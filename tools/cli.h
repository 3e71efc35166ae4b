/* The tovl CLI's subcommands; each lives in its own tools/cmd_<name>.c. */
#ifndef TOVL_TOOLS_CLI_H
#define TOVL_TOOLS_CLI_H

/* Each returns the process exit status: 0 ok, 1 a check failed, 2 bad usage or input. */
int tovl_cmd_devices(int argc, char **argv);
int tovl_cmd_conform(int argc, char **argv);
int tovl_cmd_inspect(int argc, char **argv);
int tovl_cmd_run(int argc, char **argv);
int tovl_cmd_bench(int argc, char **argv);

#endif
