/* tovl inspect: placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int tovl_cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tovl inspect: not implemented in this build\n");
    return 2;
}
