/* libFuzzer target: one safetensors file from memory. A file that opens must
 * have every tensor's bytes inside the input (ASan checks each read) and
 * consistent shapes; conversions of float matrices must stay in bounds. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "import_internal.h"
#include "tovl/tovl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tovl_safetensors *f = NULL;
    if (tovl_safetensors_open_memory(data, size, "fuzz.safetensors", &f) != TOVL_OK) {
        if (f || tovl_last_error()[0] == '\0') {
            abort(); /* a failure must reset *out and say why */
        }
        return 0;
    }
    const uint8_t *end = data + size;
    for (size_t i = 0; i < tovl_safetensors_count(f); i++) {
        const tovl_tensor *t = tovl_safetensors_at(f, i);
        uint64_t count = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            count *= t->shape[d];
        }
        const uint8_t *p = t->data;
        uint64_t bytes = t->count * t->elem_size;
        if (count != t->count || p < data || bytes > (uint64_t)(end - p) ||
            tovl_safetensors_find(f, t->name) != t) {
            abort();
        }
        volatile uint8_t sink = 0;
        if (bytes) {
            sink ^= p[0];
            sink ^= p[bytes - 1];
        }
        (void)sink;
        /* Rows to bf16, as the importer reads adapter and model matrices. */
        if (t->ndim == 2 && imp_dtype_is_float_row(t->dtype) && t->shape[1] > 0 && t->count <= (1u << 16)) {
            uint16_t *rows = malloc((size_t)t->count * sizeof *rows + 2);
            if (rows) {
                imp_tensor_rows_to_bf16(t, 0, t->shape[0], t->shape[1], rows);
                free(rows);
            }
        }
    }
    tovl_safetensors_close(f);
    return 0;
}
