/* tovl bench: placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int tovl_cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tovl bench: not implemented in this build\n");
    return 2;
}
