/* tovl run: placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int tovl_cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tovl run: not implemented in this build\n");
    return 2;
}
