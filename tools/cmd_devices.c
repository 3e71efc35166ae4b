/* tovl devices: every backend tovl knows, whether it is present (or why not),
 * its device, the four kernels resolved or missing, and device facts. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tovl/tovl.h"

static const char *const kernel_names[] = {TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY,
                                           TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};
static const char *const property_keys[] = {"driver", "subgroup_size", "f32_denormals", "float_controls",
                                            "programmatic_dependent_launch"};

static void usage(FILE *f) {
    fprintf(f, "usage: tovl devices\n\nLists each backend: present or why not, its device, whether each of the\n"
               "four kernels resolved, and device facts (subgroup size, f32 denormals).\n");
}

int tovl_cmd_devices(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        return tovl_cli_bad_option("tovl devices", c, argv, opts, usage);
    }
    if (tovl_cli_no_operands("tovl devices", argc, argv, usage)) {
        return 2;
    }
    tovl_backend_info infos[8];
    size_t n = tovl_backend_list(infos, 8);
    for (size_t i = 0; i < n && i < 8; i++) {
        const tovl_backend_info *info = &infos[i];
        if (!info->available) {
            printf("%-7s unavailable: %s\n", info->name, info->reason);
            continue;
        }
        tovl_backend *be = NULL;
        if (tovl_backend_open(info->name, &be) != TOVL_OK) {
            printf("%-7s unavailable: %s\n", info->name, tovl_last_error());
            continue;
        }
        printf("%-7s present: %s\n", info->name, tovl_backend_device(be));
        for (size_t k = 0; k < 4; k++) {
            printf("          kernel %-20s %s\n", kernel_names[k],
                   tovl_try_kernel(be, kernel_names[k]) ? "resolved" : "MISSING");
        }
        for (size_t p = 0; p < sizeof property_keys / sizeof property_keys[0]; p++) {
            const char *v = tovl_backend_property(be, property_keys[p]);
            if (v) {
                printf("          %-27s %s\n", property_keys[p], v);
            }
        }
        tovl_backend_close(be);
    }
    return 0;
}
