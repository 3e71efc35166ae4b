/* Small helpers of the import code: strings, paths, whole-file reads, JSON
 * integers and bf16 conversion of tensors. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "../internal.h"
#include "import_internal.h"

void imp_str_vappend(imp_str *s, const char *fmt, va_list ap) {
    if (s->failed) {
        return;
    }
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n < 0) {
        s->failed = true;
        va_end(ap2);
        return;
    }
    size_t need = s->len + (size_t)n + 1;
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < need) {
            cap *= 2;
        }
        char *grown = realloc(s->buf, cap);
        if (!grown) {
            s->failed = true;
            va_end(ap2);
            return;
        }
        s->buf = grown;
        s->cap = cap;
    }
    vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap2);
    va_end(ap2);
    s->len += (size_t)n;
}

void imp_str_append(imp_str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    imp_str_vappend(s, fmt, ap);
    va_end(ap);
}

void imp_str_free(imp_str *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

char *imp_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) {
        memcpy(d, s, n);
    }
    return d;
}

char *imp_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        if (slash) {
            p[a++] = '/';
        }
        memcpy(p + a, name, b + 1);
    }
    return p;
}

bool imp_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

tovl_status imp_read_text(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return tovl_error(TOVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t used = 0, cap = 0;
    tovl_status st = TOVL_OK;
    for (;;) {
        if (used + 4096 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 8192;
            char *grown = realloc(buf, ncap);
            if (!grown) {
                st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory reading", path);
                break;
            }
            buf = grown;
            cap = ncap;
        }
        size_t got = fread(buf + used, 1, cap - used - 1, f);
        used += got;
        if (used > max_bytes) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: larger than %zu bytes, not a config file", path, max_bytes);
            break;
        }
        if (got == 0) {
            if (ferror(f)) {
                st = tovl_error(TOVL_ERR_IO, "%s: read error", path);
            }
            break;
        }
    }
    fclose(f);
    if (st != TOVL_OK) {
        free(buf);
        return st;
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    return TOVL_OK;
}

bool imp_json_uint(const cJSON *item, uint64_t max, uint64_t *out) {
    if (!cJSON_IsNumber(item)) {
        return false;
    }
    double v = item->valuedouble;
    /* 2^53: beyond it a double no longer holds every integer exactly. */
    if (!(v >= 0.0) || v > 9007199254740992.0 || v != floor(v) || v > (double)max) {
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool imp_dtype_is_float_row(const char *dtype) {
    return strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "F32") == 0;
}

float imp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13); /* Inf, NaN (payload kept; bf16 rounding canonicalises) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* Subnormal half: normalise (exact in f32). */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void imp_tensor_rows_to_bf16(const tovl_tensor *t, uint64_t first_row, uint64_t rows, uint64_t width,
                             uint16_t *dst) {
    const unsigned char *src = (const unsigned char *)t->data + first_row * width * t->elem_size;
    size_t n = (size_t)(rows * width);
    if (strcmp(t->dtype, "BF16") == 0) {
        memcpy(dst, src, n * sizeof(uint16_t));
    } else if (strcmp(t->dtype, "F16") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + i * 2, 2);
            dst[i] = tovl_f32_to_bf16(imp_f16_to_f32(h));
        }
    } else { /* F32 */
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + i * 4, 4);
            dst[i] = tovl_f32_to_bf16(f);
        }
    }
}
