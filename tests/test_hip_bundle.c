/* The HIP code-object bundle embedded in the library, read back byte by byte
 * (no AMD GPU needed): one code object per configured gfx target, each an
 * AMDGPU ELF for that very machine, with the four kernels and their kernel
 * descriptors, built without denormal flushing. The reader is checked on
 * damaged copies too, so it cannot pass by accepting anything. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip/hip_bundle.h"
#include "hip/token_overlay_shape.h"

#define MAX_ENTRIES 32
static const char bundle_magic[] = "__CLANG_OFFLOAD_BUNDLE__";
static const char amdgcn_prefix[] = "hipv4-amdgcn-amd-amdhsa--";
static const char *const kernel_names[] = {"rowdiff", "embed_overlay", "lmhead_overlay_bf16", "lmhead_overlay_f32"};
#define KERNEL_COUNT 4

/* EF_AMDGPU_MACH_* of the targets the build may produce (LLVM's ELF.h). */
static const struct {
    const char *gfx;
    unsigned mach;
} machines[] = {
    {"gfx908", 0x030}, {"gfx90a", 0x03f}, {"gfx940", 0x040}, {"gfx942", 0x04c},  {"gfx1030", 0x036},
    {"gfx1100", 0x041}, {"gfx1101", 0x046}, {"gfx1200", 0x048}, {"gfx1201", 0x04e},
};

typedef struct entry {
    char id[128];
    const unsigned char *data;
    size_t size;
} entry;

typedef struct kernel_facts {
    bool has_code, has_descriptor;
    uint32_t lds_bytes, rsrc1;
    uint16_t code_properties;
} kernel_facts;

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint16_t rd16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static bool in_bounds(size_t total, uint64_t off, uint64_t len) {
    return off <= total && len <= total - off;
}

/* The clang offload bundle: magic, u64 count, then per entry u64 offset,
 * u64 size, u64 id length and the id. Returns the count, or -1 (why in err). */
static int read_bundle(const unsigned char *b, size_t n, entry *out, char *err, size_t err_size) {
    size_t magic_len = sizeof bundle_magic - 1;
    if (n < magic_len + 8 || memcmp(b, bundle_magic, magic_len) != 0) {
        snprintf(err, err_size, "no offload-bundle magic");
        return -1;
    }
    uint64_t count = rd64(b + magic_len);
    if (count == 0 || count > MAX_ENTRIES) {
        snprintf(err, err_size, "%llu entries", (unsigned long long)count);
        return -1;
    }
    size_t pos = magic_len + 8;
    for (uint64_t i = 0; i < count; i++) {
        if (!in_bounds(n, pos, 24)) {
            snprintf(err, err_size, "entry %llu header past the end", (unsigned long long)i);
            return -1;
        }
        uint64_t off = rd64(b + pos), size = rd64(b + pos + 8), id_len = rd64(b + pos + 16);
        pos += 24;
        if (id_len >= sizeof out[i].id || !in_bounds(n, pos, id_len) || !in_bounds(n, off, size)) {
            snprintf(err, err_size, "entry %llu out of bounds", (unsigned long long)i);
            return -1;
        }
        memcpy(out[i].id, b + pos, id_len);
        out[i].id[id_len] = '\0';
        out[i].data = b + off;
        out[i].size = size;
        pos += id_len;
    }
    return (int)count;
}

/* An AMDGPU ELF64 code object: its e_flags and, per kernel, whether the code
 * symbol (FUNC) and the 64-byte kernel descriptor "<name>.kd" (OBJECT) are
 * there, with the descriptor's LDS size, COMPUTE_PGM_RSRC1 and code properties. */
static bool read_code_object(const unsigned char *e, size_t n, uint32_t *flags, kernel_facts facts[KERNEL_COUNT],
                             char *err, size_t err_size) {
    memset(facts, 0, sizeof(kernel_facts) * KERNEL_COUNT);
    if (n < 64 || memcmp(e, "\177ELF", 4) != 0 || e[4] != 2 || e[5] != 1) {
        snprintf(err, err_size, "not a little-endian ELF64");
        return false;
    }
    if (rd16(e + 18) != 224) {
        snprintf(err, err_size, "e_machine %u is not EM_AMDGPU (224)", rd16(e + 18));
        return false;
    }
    *flags = rd32(e + 48);
    uint64_t shoff = rd64(e + 40);
    uint16_t shentsize = rd16(e + 58), shnum = rd16(e + 60);
    if (shentsize != 64 || !in_bounds(n, shoff, (uint64_t)shnum * 64)) {
        snprintf(err, err_size, "section headers out of bounds");
        return false;
    }
    const unsigned char *sh = e + shoff;
    bool have_symtab = false;
    for (uint16_t s = 0; s < shnum; s++) {
        const unsigned char *h = sh + (size_t)s * 64;
        if (rd32(h + 4) != 2 /* SHT_SYMTAB */) {
            continue;
        }
        have_symtab = true;
        uint64_t sym_off = rd64(h + 24), sym_size = rd64(h + 32);
        uint32_t link = rd32(h + 40);
        if (link >= shnum || !in_bounds(n, sym_off, sym_size)) {
            snprintf(err, err_size, "symbol table out of bounds");
            return false;
        }
        const unsigned char *strh = sh + (size_t)link * 64;
        uint64_t str_off = rd64(strh + 24), str_size = rd64(strh + 32);
        if (!in_bounds(n, str_off, str_size)) {
            snprintf(err, err_size, "string table out of bounds");
            return false;
        }
        for (uint64_t j = 0; j + 24 <= sym_size; j += 24) {
            const unsigned char *sym = e + sym_off + j;
            uint32_t name_off = rd32(sym);
            if (name_off >= str_size) {
                continue;
            }
            const char *name = (const char *)e + str_off + name_off;
            size_t name_max = (size_t)(str_size - name_off);
            unsigned type = sym[4] & 0xF, bind = sym[4] >> 4;
            uint16_t shndx = rd16(sym + 6);
            uint64_t value = rd64(sym + 8), size = rd64(sym + 16);
            for (int k = 0; k < KERNEL_COUNT; k++) {
                size_t len = strlen(kernel_names[k]);
                if (len >= name_max || strncmp(name, kernel_names[k], len) != 0) {
                    continue;
                }
                if (name[len] == '\0' && type == 2 /* STT_FUNC */ && bind == 1 /* GLOBAL */ && size > 0) {
                    facts[k].has_code = true;
                } else if (len + 3 < name_max && strcmp(name + len, ".kd") == 0 && type == 1 /* STT_OBJECT */ &&
                           size == 64 && shndx < shnum) {
                    const unsigned char *dh = sh + (size_t)shndx * 64;
                    uint64_t file_off = rd64(dh + 24) + (value - rd64(dh + 16));
                    if (!in_bounds(n, file_off, 64)) {
                        snprintf(err, err_size, "%s.kd out of bounds", kernel_names[k]);
                        return false;
                    }
                    facts[k].has_descriptor = true;
                    facts[k].lds_bytes = rd32(e + file_off);
                    facts[k].rsrc1 = rd32(e + file_off + 48);
                    facts[k].code_properties = rd16(e + file_off + 56);
                }
            }
        }
    }
    if (!have_symtab) {
        snprintf(err, err_size, "no symbol table");
        return false;
    }
    return true;
}

static int expected_mach(const char *gfx) {
    for (size_t i = 0; i < sizeof machines / sizeof machines[0]; i++) {
        if (strcmp(machines[i].gfx, gfx) == 0) {
            return (int)machines[i].mach;
        }
    }
    return -1;
}

/* Whether space-separated `list` has `word`. */
static bool list_has(const char *list, const char *word) {
    size_t len = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += len) {
        if ((p == list || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0')) {
            return true;
        }
    }
    return false;
}

static int read_embedded(entry *entries) {
    char err[128] = "";
    int n = read_bundle(tovl_hip_bundle, tovl_hip_bundle_size, entries, err, sizeof err);
    cr_assert_gt(n, 0, "the embedded bundle (%zu bytes) is unreadable: %s", tovl_hip_bundle_size, err);
    return n;
}

Test(hip_bundle, one_code_object_per_configured_target) {
    entry entries[MAX_ENTRIES];
    int n = read_embedded(entries);
    char found[512] = "";
    int gfx_count = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(entries[i].id, "host-", 5) == 0) {
            cr_expect_eq(entries[i].size, 0, "the host entry should be empty");
            continue;
        }
        cr_assert(strncmp(entries[i].id, amdgcn_prefix, strlen(amdgcn_prefix)) == 0, "entry '%s'", entries[i].id);
        const char *gfx = entries[i].id + strlen(amdgcn_prefix);
        cr_assert_not(list_has(found, gfx), "%s appears twice", gfx);
        cr_assert(list_has(TOVL_HIP_EXPECTED_TARGETS, gfx), "%s is in the bundle but not configured", gfx);
        snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", gfx_count ? " " : "", gfx);
        gfx_count++;
    }
    cr_log_info("bundle: %zu bytes, code objects for %s", tovl_hip_bundle_size, found);
    /* Every configured target (the bundle keeps its own order), and every
     * target this toolchain must give. */
    cr_assert_str_eq(tovl_hip_bundle_targets, TOVL_HIP_EXPECTED_TARGETS);
    int expected = 0;
    char configured[] = TOVL_HIP_EXPECTED_TARGETS;
    for (char *save = NULL, *gfx = strtok_r(configured, " ", &save); gfx; gfx = strtok_r(NULL, " ", &save)) {
        cr_assert(list_has(found, gfx), "%s is configured but missing from the bundle", gfx);
        expected++;
    }
    cr_assert_eq(gfx_count, expected);
    char required[] = TOVL_HIP_REQUIRED_TARGETS;
    for (char *save = NULL, *gfx = strtok_r(required, " ", &save); gfx; gfx = strtok_r(NULL, " ", &save)) {
        cr_assert(list_has(found, gfx), "%s is required for this toolchain but missing from the bundle", gfx);
    }
}

Test(hip_bundle, every_code_object_has_the_four_kernels_for_its_machine) {
    entry entries[MAX_ENTRIES];
    int n = read_embedded(entries);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(entries[i].id, amdgcn_prefix, strlen(amdgcn_prefix)) != 0) {
            continue;
        }
        const char *gfx = entries[i].id + strlen(amdgcn_prefix);
        uint32_t flags = 0;
        kernel_facts facts[KERNEL_COUNT];
        char err[128] = "";
        cr_assert(read_code_object(entries[i].data, entries[i].size, &flags, facts, err, sizeof err), "%s: %s", gfx,
                  err);
        int mach = expected_mach(gfx);
        cr_assert_geq(mach, 0, "no machine number known for %s", gfx);
        cr_assert_eq(flags & 0xFFu, (unsigned)mach, "%s: e_flags 0x%x name machine 0x%02x, not 0x%02x", gfx, flags,
                     flags & 0xFFu, (unsigned)mach);
        bool wave32 = false;
        for (int k = 0; k < KERNEL_COUNT; k++) {
            cr_assert(facts[k].has_code, "%s: no kernel symbol %s", gfx, kernel_names[k]);
            cr_assert(facts[k].has_descriptor, "%s: no kernel descriptor %s.kd", gfx, kernel_names[k]);
            /* COMPUTE_PGM_RSRC1 FLOAT_DENORM_MODE_32 (bits 16-17) and _16_64
             * (18-19): 3 = denormals neither flushed on input nor output. */
            cr_assert_eq((facts[k].rsrc1 >> 16) & 3u, 3u, "%s %s: f32 denormals flushed (rsrc1 0x%08x)", gfx,
                         kernel_names[k], facts[k].rsrc1);
            cr_assert_eq((facts[k].rsrc1 >> 18) & 3u, 3u, "%s %s: f16/f64 denormals flushed", gfx, kernel_names[k]);
            /* kernel_code_properties bit 10: ENABLE_WAVEFRONT_SIZE32. */
            wave32 = (facts[k].code_properties >> 10) & 1u;
            if (strncmp(gfx, "gfx9", 4) == 0) {
                cr_assert_not(wave32, "%s is wave64 hardware", gfx);
            }
        }
        /* The lm_head tree lives in LDS: 8 rows x 256 lanes of f32 at least. */
        for (int k = 2; k < KERNEL_COUNT; k++) {
            cr_assert_geq(facts[k].lds_bytes, TOVL_HIP_LMHEAD_ROWS_PER_BLOCK * TOVL_HIP_BLOCK_THREADS * 4u, "%s %s",
                          gfx, kernel_names[k]);
        }
        cr_log_info("%s: machine 0x%02x, wave%d, lm_head LDS %u bytes, f32 denormals kept", gfx, (unsigned)mach,
                    wave32 ? 32 : 64, facts[2].lds_bytes);
        checked++;
    }
    cr_assert_gt(checked, 0, "no amdgcn code object in the bundle");
}

/* The same reader on damaged copies of the bundle must say no. */
Test(hip_bundle, the_reader_rejects_damaged_bundles) {
    entry entries[MAX_ENTRIES];
    char err[128];
    unsigned char *copy = malloc(tovl_hip_bundle_size);
    cr_assert_not_null(copy);

    memcpy(copy, tovl_hip_bundle, tovl_hip_bundle_size);
    copy[2] ^= 0x20;
    cr_assert_eq(read_bundle(copy, tovl_hip_bundle_size, entries, err, sizeof err), -1, "bad magic accepted");

    memcpy(copy, tovl_hip_bundle, tovl_hip_bundle_size);
    cr_assert_eq(read_bundle(copy, tovl_hip_bundle_size / 4, entries, err, sizeof err), -1, "truncation accepted");

    int n = read_embedded(entries);
    int gfx_entry = -1;
    for (int i = 0; i < n && gfx_entry < 0; i++) {
        gfx_entry = strncmp(entries[i].id, amdgcn_prefix, strlen(amdgcn_prefix)) == 0 ? i : -1;
    }
    cr_assert_geq(gfx_entry, 0);
    size_t off = (size_t)(entries[gfx_entry].data - tovl_hip_bundle), size = entries[gfx_entry].size;
    uint32_t flags;
    kernel_facts facts[KERNEL_COUNT];

    memcpy(copy, tovl_hip_bundle, tovl_hip_bundle_size);
    copy[off + 18] = 62; /* EM_X86_64 */
    cr_assert_not(read_code_object(copy + off, size, &flags, facts, err, sizeof err), "wrong machine accepted");

    /* Rename one kernel in the string table: the reader must miss it. */
    memcpy(copy, tovl_hip_bundle, tovl_hip_bundle_size);
    size_t renamed = 0;
    for (size_t i = off; i + 19 <= off + size; i++) {
        if (memcmp(copy + i, "lmhead_overlay_f32", 19) == 0) { /* the name and its NUL */
            copy[i] = 'L';
            renamed++;
        }
    }
    cr_assert_gt(renamed, 0);
    cr_assert(read_code_object(copy + off, size, &flags, facts, err, sizeof err), "%s", err);
    cr_assert_not(facts[3].has_code, "a renamed kernel was still found");
    cr_assert(facts[2].has_code && facts[2].has_descriptor, "the other kernels stay readable");
    free(copy);
}
