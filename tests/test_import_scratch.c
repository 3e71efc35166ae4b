/* A scratch folder per test for the import tests (linked into each of them):
 * import_scratch_setup makes /tmp/tovl-import-XXXXXX, import_path names a
 * file in it, import_scratch_teardown removes it with everything inside. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char import_root[64];

static void rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char sub[1024];
        while (d && (e = readdir(d))) {
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                rm_tree(sub);
            }
        }
        if (d) {
            closedir(d);
        }
        rmdir(path);
    } else {
        remove(path);
    }
}

void import_scratch_setup(void);
void import_scratch_teardown(void);
const char *import_path(const char *rel);

void import_scratch_setup(void) {
    snprintf(import_root, sizeof import_root, "/tmp/tovl-import-XXXXXX");
    cr_assert(mkdtemp(import_root), "mkdtemp: %s", strerror(errno));
}

void import_scratch_teardown(void) {
    rm_tree(import_root);
}

/* import_root/rel, in one of a few rotating buffers so calls can nest. */
const char *import_path(const char *rel) {
    static char bufs[8][1024];
    static int next;
    char *p = bufs[next++ % 8];
    snprintf(p, sizeof bufs[0], "%s/%s", import_root, rel);
    return p;
}
