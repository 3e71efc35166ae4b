/* safetensors reader (memory-mapped, validated before anything is trusted)
 * and a small writer.
 *
 * Layout: u64 little-endian N, N bytes of JSON header, then the data area.
 * The header maps each tensor name to {dtype, shape, data_offsets: [begin,
 * end]} (offsets relative to the data area), plus an optional
 * "__metadata__" object of strings. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "../internal.h"
#include "import_internal.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Ranks above this are not tensors any model import needs. */
#define ST_MAX_NDIM 16

struct tovl_safetensors {
    char *path;
    const unsigned char *bytes;
    size_t size;
    bool mapped;
    size_t count;
    tovl_tensor *tensors;     /* ordered by data offset */
    uint64_t *shapes;         /* all tensors' dims, one allocation */
    char *names;              /* all names, one allocation */
    const tovl_tensor **by_name; /* sorted by name, for lookup */
};

static const struct {
    const char *name;
    uint32_t size;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8},
};

uint32_t imp_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(dtype, dtypes[i].name) == 0) {
            return dtypes[i].size;
        }
    }
    return 0;
}

/* The canonical static name for a dtype (the tensor views point at it). */
static const char *dtype_canonical(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(dtype, dtypes[i].name) == 0) {
            return dtypes[i].name;
        }
    }
    return NULL;
}

static void st_free(tovl_safetensors *f) {
    if (!f) {
        return;
    }
    if (f->mapped && f->bytes) {
        munmap((void *)(uintptr_t)f->bytes, f->size);
    }
    free(f->tensors);
    free(f->shapes);
    free(f->names);
    free(f->by_name);
    free(f->path);
    free(f);
}

void tovl_safetensors_close(tovl_safetensors *file) {
    st_free(file);
}

/* Parsed but not yet laid out: one per header entry. */
typedef struct st_entry {
    const cJSON *item;
    const char *dtype;
    uint32_t elem;
    uint32_t ndim;
    uint64_t begin, end, count;
} st_entry;

static int cmp_entry_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) {
        return x->begin < y->begin ? -1 : 1;
    }
    return x->end < y->end ? -1 : (x->end > y->end);
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const tovl_tensor *const *)a)->name, (*(const tovl_tensor *const *)b)->name);
}

/* Validate one header entry; fills e. */
static tovl_status parse_entry(const char *path, const cJSON *item, uint64_t data_size, st_entry *e) {
    const char *name = item->string;
    if (!cJSON_IsObject(item)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object", path, name);
    }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': 'dtype' missing or not a string", path, name);
    }
    e->dtype = dtype_canonical(dtype->valuestring);
    if (!e->dtype) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", path, name,
                          dtype->valuestring);
    }
    e->elem = imp_dtype_size(e->dtype);
    if (!cJSON_IsArray(shape)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': 'shape' missing or not an array", path, name);
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_NDIM) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': rank %d is above %d", path, name, ndim, ST_MAX_NDIM);
    }
    e->ndim = (uint32_t)ndim;
    /* Element count with overflow checks: the byte count must fit the file. */
    uint64_t count = 1;
    bool huge = false;
    for (const cJSON *d = shape->child; d; d = d->next) {
        uint64_t dim;
        if (!imp_json_uint(d, UINT64_MAX, &dim)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': shape has an entry that is not a non-negative integer",
                              path, name);
        }
        if (dim != 0 && count > UINT64_MAX / dim) {
            huge = true;
        }
        count = huge ? count : count * dim;
    }
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' missing or not [begin, end]", path, name);
    }
    if (!imp_json_uint(offsets->child, UINT64_MAX, &e->begin) ||
        !imp_json_uint(offsets->child->next, UINT64_MAX, &e->end)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': data_offsets are not non-negative integers", path, name);
    }
    if (e->begin > e->end) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path,
                          name, (unsigned long long)e->begin, (unsigned long long)e->end);
    }
    if (e->end > data_size) {
        return tovl_error(TOVL_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the data area (%llu bytes)", path,
                          name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)data_size);
    }
    if (huge || count > UINT64_MAX / e->elem || count * e->elem != e->end - e->begin) {
        return tovl_error(TOVL_ERR_FORMAT,
                          "%s: tensor '%s': shape and dtype %s need %s%llu bytes but data_offsets hold %llu", path,
                          name, e->dtype, huge || count > UINT64_MAX / e->elem ? "more than " : "",
                          huge || count > UINT64_MAX / e->elem ? (unsigned long long)UINT64_MAX
                                                               : (unsigned long long)(count * e->elem),
                          (unsigned long long)(e->end - e->begin));
    }
    e->count = count;
    e->item = item;
    return TOVL_OK;
}

static tovl_status check_metadata(const char *path, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: '__metadata__' is not a JSON object", path);
    }
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: '__metadata__' entry '%s' is not a string", path, m->string);
        }
    }
    return TOVL_OK;
}

/* Lay the validated entries out into f (sorted by offset; no overlaps). */
static tovl_status build_tensors(tovl_safetensors *f, st_entry *entries, size_t n, const unsigned char *data) {
    qsort(entries, n, sizeof *entries, cmp_entry_begin);
    size_t name_bytes = 0, dims = 0, reach = 0; /* reach: the entry ending last so far */
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && entries[i].begin < entries[reach].end) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", f->path,
                              entries[reach].item->string, (unsigned long long)entries[reach].begin,
                              (unsigned long long)entries[reach].end, entries[i].item->string,
                              (unsigned long long)entries[i].begin, (unsigned long long)entries[i].end);
        }
        if (entries[i].end > entries[reach].end) {
            reach = i;
        }
        name_bytes += strlen(entries[i].item->string) + 1;
        dims += entries[i].ndim;
    }
    f->count = n;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->shapes = calloc(dims ? dims : 1, sizeof *f->shapes);
    f->names = malloc(name_bytes ? name_bytes : 1);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    if (!f->tensors || !f->shapes || !f->names || !f->by_name) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", f->path, n);
    }
    char *name = f->names;
    uint64_t *shape = f->shapes;
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        tovl_tensor *t = &f->tensors[i];
        size_t len = strlen(e->item->string) + 1;
        memcpy(name, e->item->string, len);
        t->name = name;
        name += len;
        t->dtype = e->dtype;
        t->elem_size = e->elem;
        t->ndim = e->ndim;
        t->shape = shape;
        uint32_t d = 0;
        for (const cJSON *dim = cJSON_GetObjectItemCaseSensitive(e->item, "shape")->child; dim; dim = dim->next) {
            uint64_t v = 0;
            imp_json_uint(dim, UINT64_MAX, &v);
            shape[d++] = v;
        }
        shape += e->ndim;
        t->count = e->count;
        t->data = data + e->begin;
        f->by_name[i] = t;
    }
    qsort(f->by_name, n, sizeof *f->by_name, cmp_by_name);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(f->by_name[i]->name, f->by_name[i - 1]->name) == 0) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path,
                              f->by_name[i]->name);
        }
    }
    return TOVL_OK;
}

/* Validate the bytes of f and build its tensor table. */
static tovl_status parse(tovl_safetensors *f) {
    if (f->size < 8) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", f->path,
                          f->size);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) {
        n = (n << 8) | f->bytes[i];
    }
    if (n > f->size - 8) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                          f->path, (unsigned long long)n, f->size);
    }
    if (n > ST_MAX_HEADER) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: header length %llu is above the 100 MB limit", f->path,
                          (unsigned long long)n);
    }
    if (n < 2 || f->bytes[8] != '{') {
        return tovl_error(TOVL_ERR_FORMAT, "%s: header does not start with a JSON object", f->path);
    }
    const char *text = (const char *)f->bytes + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, false);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + n ? (size_t)(at - text) : 0;
        return tovl_error(TOVL_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu of %llu)", f->path, off,
                          (unsigned long long)n);
    }
    tovl_status st = TOVL_OK;
    /* After the object only padding spaces may follow. */
    for (const char *p = end; p && p < text + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: header has bytes after its JSON object (at byte %zu)", f->path,
                            (size_t)(p - text));
            break;
        }
    }
    if (st == TOVL_OK && !cJSON_IsObject(root)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    size_t count = 0;
    for (const cJSON *it = root->child; st == TOVL_OK && it; it = it->next) {
        count++;
    }
    st_entry *entries = st == TOVL_OK ? calloc(count ? count : 1, sizeof *entries) : NULL;
    if (st == TOVL_OK && !entries) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", f->path);
    }
    uint64_t data_size = f->size - 8 - n;
    size_t used = 0;
    bool seen_meta = false;
    for (const cJSON *it = root->child; st == TOVL_OK && it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (seen_meta) {
                st = tovl_error(TOVL_ERR_FORMAT, "%s: '__metadata__' appears twice in the header", f->path);
            } else {
                seen_meta = true;
                st = check_metadata(f->path, it);
            }
            continue;
        }
        st = parse_entry(f->path, it, data_size, &entries[used]);
        used++;
    }
    if (st == TOVL_OK) {
        st = build_tensors(f, entries, used, f->bytes + 8 + n);
    }
    free(entries);
    cJSON_Delete(root);
    return st;
}

static tovl_status st_new(const char *path, tovl_safetensors **out) {
    tovl_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = imp_strdup(path ? path : "(memory)"))) {
        free(f);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path ? path : "(memory)");
    }
    *out = f;
    return TOVL_OK;
}

/* Parse f (unless mapping it failed: st); hand it out, or free it. */
static tovl_status parse_and_publish(tovl_safetensors *f, tovl_status st, tovl_safetensors **out) {
    if (st == TOVL_OK) {
        st = parse(f);
    }
    if (st != TOVL_OK) {
        st_free(f);
        return st;
    }
    tovl_clear_error();
    *out = f;
    return TOVL_OK;
}

tovl_status tovl_safetensors_open_memory(const void *bytes, size_t size, const char *name, tovl_safetensors **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_safetensors_open_memory: out is NULL");
    }
    *out = NULL;
    if (!bytes && size) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_safetensors_open_memory: bytes is NULL");
    }
    tovl_safetensors *f = NULL; /* set by st_new on success; gcc -O2 cannot see that */
    tovl_status st = st_new(name, &f);
    if (st != TOVL_OK) {
        return st;
    }
    f->bytes = bytes;
    f->size = size;
    return parse_and_publish(f, TOVL_OK, out);
}

tovl_status tovl_safetensors_open(const char *path, tovl_safetensors **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_safetensors_open: out is NULL");
    }
    *out = NULL;
    if (!path) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_safetensors_open: path is NULL");
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return tovl_error(TOVL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tovl_error(TOVL_ERR_IO, "%s: not a regular file", path);
    }
    tovl_safetensors *f = NULL; /* set by st_new on success; gcc -O2 cannot see that */
    tovl_status st = st_new(path, &f);
    if (st != TOVL_OK) {
        close(fd);
        return st;
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = tovl_error(TOVL_ERR_IO, "%s: cannot map %zu bytes: %s", path, f->size, strerror(errno));
        } else {
            f->bytes = p;
            f->mapped = true;
        }
    }
    close(fd);
    return parse_and_publish(f, st, out);
}

const char *tovl_safetensors_path(const tovl_safetensors *file) {
    return file ? file->path : NULL;
}

size_t tovl_safetensors_count(const tovl_safetensors *file) {
    return file ? file->count : 0;
}

const tovl_tensor *tovl_safetensors_at(const tovl_safetensors *file, size_t index) {
    return file && index < file->count ? &file->tensors[index] : NULL;
}

const tovl_tensor *tovl_safetensors_find(const tovl_safetensors *file, const char *name) {
    if (!file || !name) {
        return NULL;
    }
    size_t lo = 0, hi = file->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const tovl_tensor *t = file->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) {
            return t;
        }
        if (c < 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

/* ---- writer ------------------------------------------------------------- */

static tovl_status write_all(FILE *fp, const void *data, size_t bytes, const char *path) {
    if (bytes && fwrite(data, 1, bytes, fp) != bytes) {
        return tovl_error(TOVL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return TOVL_OK;
}

/* The header JSON for the tensors, laid out in order. */
static tovl_status header_json(const char *path, const tovl_tensor *tensors, size_t count,
                               const char *const *metadata, size_t n_metadata, char **out) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && n_metadata) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (size_t i = 0; ok && i < n_metadata; i++) {
            ok = cJSON_AddStringToObject(meta, metadata[2 * i], metadata[2 * i + 1]) != NULL;
        }
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < count; i++) {
        const tovl_tensor *t = &tensors[i];
        uint64_t bytes = (uint64_t)imp_dtype_size(t->dtype);
        for (uint32_t d = 0; d < t->ndim; d++) {
            bytes *= t->shape[d];
        }
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offs && cJSON_AddStringToObject(e, "dtype", t->dtype);
        for (uint32_t d = 0; ok && d < t->ndim; d++) {
            cJSON *num = cJSON_CreateNumber((double)t->shape[d]);
            ok = num && cJSON_AddItemToArray(shape, num);
        }
        cJSON *b = ok ? cJSON_CreateNumber((double)offset) : NULL;
        ok = b && cJSON_AddItemToArray(offs, b);
        cJSON *en = ok ? cJSON_CreateNumber((double)(offset + bytes)) : NULL;
        ok = en && cJSON_AddItemToArray(offs, en);
        offset += bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", path);
    }
    *out = text;
    return TOVL_OK;
}

tovl_status tovl_safetensors_write(const char *path, const tovl_tensor *tensors, size_t count,
                                   const char *const *metadata, size_t n_metadata) {
    if (!path || (count && !tensors) || (n_metadata && !metadata)) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_safetensors_write: NULL argument");
    }
    for (size_t i = 0; i < count; i++) {
        const tovl_tensor *t = &tensors[i];
        if (!t->name || !t->dtype || imp_dtype_size(t->dtype) == 0 || (t->ndim && !t->shape) ||
            t->ndim > ST_MAX_NDIM || strcmp(t->name, "__metadata__") == 0) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: tensor %zu ('%s'): bad name, dtype or shape", path, i,
                              t->name ? t->name : "(null)");
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(tensors[j].name, t->name) == 0) {
                return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: tensor name '%s' given twice", path, t->name);
            }
        }
    }
    for (size_t i = 0; i < 2 * n_metadata; i++) {
        if (!metadata[i]) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: metadata entry %zu is NULL", path, i);
        }
    }
    char *header;
    tovl_status st = header_json(path, tensors, count, metadata, n_metadata, &header);
    if (st != TOVL_OK) {
        return st;
    }
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7u) & ~(size_t)7u; /* 8-byte aligned data area, padded with spaces */
    char *tmp = malloc(strlen(path) + 32);
    if (!tmp) {
        free(header);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    snprintf(tmp, strlen(path) + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        st = tovl_error(TOVL_ERR_IO, "%s: cannot create (as %s): %s", path, tmp, strerror(errno));
        free(tmp);
        free(header);
        return st;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) {
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    }
    st = write_all(fp, len8, 8, path);
    if (st == TOVL_OK) {
        st = write_all(fp, header, hlen, path);
    }
    for (size_t i = hlen; st == TOVL_OK && i < padded; i++) {
        st = write_all(fp, " ", 1, path);
    }
    for (size_t i = 0; st == TOVL_OK && i < count; i++) {
        uint64_t bytes = imp_dtype_size(tensors[i].dtype);
        for (uint32_t d = 0; d < tensors[i].ndim; d++) {
            bytes *= tensors[i].shape[d];
        }
        if (bytes && !tensors[i].data) {
            st = tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has no data", path, tensors[i].name);
        } else {
            st = write_all(fp, tensors[i].data, (size_t)bytes, path);
        }
    }
    if (fclose(fp) != 0 && st == TOVL_OK) {
        st = tovl_error(TOVL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    if (st == TOVL_OK && rename(tmp, path) != 0) {
        st = tovl_error(TOVL_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    }
    if (st != TOVL_OK) {
        remove(tmp);
    } else {
        tovl_clear_error();
    }
    free(tmp);
    free(header);
    return st;
}
