/* Every class of bad input to the import code and to `tovl run` / `tovl
 * inspect`: a clear error naming the file and the tensor or config field, a
 * non-zero exit, and nothing leaked on the device (a counting backend) or
 * crashed. Host leaks are checked by the sanitizer build. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "tovl/tovl.h"

#define V 97
#define H 20

/* ---- a scratch folder per test -------------------------------------------- */

/* Scratch folders (tests/test_import_scratch.c). */
extern char import_root[64];
void import_scratch_setup(void);
void import_scratch_teardown(void);
const char *import_path(const char *rel);
#define P(rel) import_path(rel)

TestSuite(safetensors_bad, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(model_bad, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(adapter_bad, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(resolve_bad, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(cli_bad, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(model_layouts, .init = import_scratch_setup, .fini = import_scratch_teardown);

static void mkdir_p(const char *rel) {
    cr_assert(mkdir(P(rel), 0755) == 0 || errno == EEXIST, "mkdir %s", rel);
}

static void write_bytes(const char *rel, const void *data, size_t n) {
    FILE *f = fopen(P(rel), "wb");
    cr_assert(f, "cannot write %s", rel);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *rel, const char *text) {
    write_bytes(rel, text, strlen(text));
}

/* A raw safetensors file: `len` as the header length (UINT64_MAX: the real
 * one), the header text, then `data_len` bytes of data. */
static void write_raw_st(const char *rel, const char *header, uint64_t len, size_t data_len) {
    size_t hl = strlen(header);
    uint64_t n = len == UINT64_MAX ? hl : len;
    unsigned char *buf = calloc(1, 8 + hl + data_len + 1);
    cr_assert(buf);
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)(n >> (8 * i));
    }
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) {
        buf[8 + hl + i] = (unsigned char)(i * 7u + 1u);
    }
    write_bytes(rel, buf, 8 + hl + data_len);
    free(buf);
}

#define expect_error tu_expect_error
#define NAMES TU_NAMES

/* ---- safetensors ------------------------------------------------------------ */

static void st_case(const char *header, uint64_t len, size_t data_len, tovl_status want, const char *const *names,
                    const char *what) {
    write_raw_st("x.safetensors", header, len, data_len);
    tovl_safetensors *f = (tovl_safetensors *)(uintptr_t)1;
    tovl_status st = tovl_safetensors_open(P("x.safetensors"), &f);
    expect_error(st, want, names, what);
    cr_expect_null(f, "%s: out not reset to NULL", what);
    if (st == TOVL_OK) {
        tovl_safetensors_close(f);
    }
}

static const char *OK_HDR = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}";

Test(safetensors_bad, valid_control) {
    /* The control: the same writer makes a file that opens. */
    write_raw_st("x.safetensors", OK_HDR, UINT64_MAX, 12);
    tovl_safetensors *f;
    cr_assert_eq(tovl_safetensors_open(P("x.safetensors"), &f), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(tovl_safetensors_count(f), 1);
    tovl_safetensors_close(f);
}

Test(safetensors_bad, truncated) {
    write_bytes("x.safetensors", "\x10\x00\x00", 3);
    tovl_safetensors *f;
    expect_error(tovl_safetensors_open(P("x.safetensors"), &f), TOVL_ERR_FORMAT, NAMES("x.safetensors", "truncated"),
                 "3-byte file");
    write_bytes("x.safetensors", "", 0);
    expect_error(tovl_safetensors_open(P("x.safetensors"), &f), TOVL_ERR_FORMAT, NAMES("x.safetensors", "truncated"),
                 "empty file");
    /* Data cut short: the range runs past the end. */
    st_case(OK_HDR, UINT64_MAX, 7, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'a'", "outside the data area"),
            "data cut short");
}

Test(safetensors_bad, header_length_past_end) {
    st_case(OK_HDR, 1u << 20, 12, TOVL_ERR_FORMAT, NAMES("x.safetensors", "header length", "past the end"),
            "header length 1 MiB in a small file");
    st_case(OK_HDR, UINT64_MAX - 1, 12, TOVL_ERR_FORMAT, NAMES("x.safetensors", "past the end"),
            "header length 2^64-2");
}

Test(safetensors_bad, invalid_json) {
    st_case("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}", UINT64_MAX, 12, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "not valid JSON"), "unterminated object");
    st_case("{\"a\": nul}", UINT64_MAX, 0, TOVL_ERR_FORMAT, NAMES("x.safetensors", "JSON"), "bad literal");
    st_case("[1, 2]", UINT64_MAX, 0, TOVL_ERR_FORMAT, NAMES("x.safetensors", "JSON object"), "an array");
    st_case("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}} x", UINT64_MAX, 12, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "after its JSON object"), "trailing garbage");
    st_case("{\"a\":5}", UINT64_MAX, 0, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'a'", "not a JSON object"),
            "entry not an object");
    st_case("{\"__metadata__\":{\"k\":1}}", UINT64_MAX, 0, TOVL_ERR_FORMAT, NAMES("x.safetensors", "__metadata__"),
            "metadata value not a string");
}

Test(safetensors_bad, unknown_dtype) {
    st_case("{\"w\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,2]}}", UINT64_MAX, 2, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "unknown dtype 'F7'"), "dtype F7");
    st_case("{\"w\":{\"dtype\":3,\"shape\":[2],\"data_offsets\":[0,2]}}", UINT64_MAX, 2, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "dtype"), "dtype a number");
}

Test(safetensors_bad, range_outside_file) {
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[100,108]}}", UINT64_MAX, 16, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "outside the data area"), "range past the data");
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9,8]}}", UINT64_MAX, 16, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "end before"), "begin after end");
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", UINT64_MAX, 16, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "data_offsets"), "negative offset");
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1]}}", UINT64_MAX, 16, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "data_offsets"), "fractional offset");
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", UINT64_MAX, 16, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "data_offsets"), "one offset");
}

Test(safetensors_bad, overlapping_ranges) {
    st_case("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
            UINT64_MAX, 16, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'a'", "'b'", "overlap"), "overlap");
    st_case("{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
            "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]}}",
            UINT64_MAX, 16, TOVL_ERR_FORMAT, NAMES("x.safetensors", "overlap"), "nested ranges");
    st_case("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
            "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
            UINT64_MAX, 16, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'a'", "twice"), "duplicate name");
}

Test(safetensors_bad, shape_dtype_bytes_mismatch) {
    st_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", UINT64_MAX, 24, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "24 bytes", "hold 12"), "F32 [2,3] in 12 bytes");
    st_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,12]}}", UINT64_MAX, 24, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "shape"), "negative dim");
    st_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,12]}}",
            UINT64_MAX, 24, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'w'", "more than"), "element count overflow");
    st_case("{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", UINT64_MAX, 24, TOVL_ERR_FORMAT,
            NAMES("x.safetensors", "'w'", "shape"), "shape not a list");
    st_case("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
            UINT64_MAX, 4, TOVL_ERR_FORMAT, NAMES("x.safetensors", "'w'", "rank 17"), "rank 17");
}

Test(safetensors_bad, missing_file) {
    tovl_safetensors *f;
    expect_error(tovl_safetensors_open(P("nope.safetensors"), &f), TOVL_ERR_IO, NAMES("nope.safetensors"),
                 "missing file");
}

/* ---- model folders ------------------------------------------------------- */

static uint16_t rows_a[V * H], rows_b[V * H];

/* A valid model folder `dir` (tied or not), matrices of `dtype`. */
static void make_model(const char *dir, bool tied, const char *config_extra) {
    tu_rng r = tu_rng_for(dir);
    tu_fill_bf16(&r, rows_a, V * H);
    tu_fill_bf16(&r, rows_b, V * H);
    mkdir_p(dir);
    char rel[256], text[512];
    snprintf(rel, sizeof rel, "%s/config.json", dir);
    snprintf(text, sizeof text, "{\"vocab_size\": %d, \"hidden_size\": %d, \"tie_word_embeddings\": %s%s}", V, H,
             tied ? "true" : "false", config_extra ? config_extra : "");
    write_text(rel, text);
    uint64_t shape[2] = {V, H};
    tovl_tensor t[2] = {{.name = "model.embed_tokens.weight", .dtype = "BF16", .ndim = 2, .shape = shape, .data = rows_a},
                        {.name = "lm_head.weight", .dtype = "BF16", .ndim = 2, .shape = shape, .data = rows_b}};
    snprintf(rel, sizeof rel, "%s/model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), t, tied ? 1 : 2, NULL, 0), TOVL_OK, "%s", tovl_last_error());
}

static tovl_status open_model(const char *dir, tovl_model **m) {
    *m = (tovl_model *)(uintptr_t)1;
    tovl_status st = tovl_model_open(P(dir), 0, m);
    if (st != TOVL_OK) {
        cr_expect_null(*m, "model out not reset to NULL");
    }
    return st;
}

Test(model_bad, valid_control) {
    make_model("m", false, NULL);
    tovl_model *m;
    cr_assert_eq(open_model("m", &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(tovl_model_get_info(m)->vocab, V);
    cr_expect(!tovl_model_get_info(m)->tied);
    tovl_model_close(m);
}

Test(model_bad, missing_config_json) {
    make_model("m", false, NULL);
    remove(P("m/config.json"));
    tovl_model *m;
    expect_error(open_model("m", &m), TOVL_ERR_IO, NAMES("config.json", "missing"), "no config.json");
}

Test(model_bad, config_fields) {
    tovl_model *m;
    make_model("m", false, NULL);
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 20");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "JSON"), "config not JSON");
    /* A field config.json lacks is the embedding's (transformers sized it so). */
    write_text("m/config.json", "{\"hidden_size\": 20, \"tie_word_embeddings\": false}");
    cr_assert_eq(open_model("m", &m), TOVL_OK, "no vocab_size: %s", tovl_last_error());
    cr_expect_eq(tovl_model_get_info(m)->config_vocab, V);
    tovl_model_close(m);
    write_text("m/config.json", "{\"text_config\": {\"vocab_size\": 97, \"hidden_size\": 20.5}}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "'text_config.hidden_size'"),
                 "nested hidden 20.5");
    write_text("m/config.json", "{\"vocab_size\": 97, \"text_config\": 3}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "'text_config'"), "text_config a number");
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 20.5}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "'hidden_size'"), "hidden 20.5");
    write_text("m/config.json", "{\"vocab_size\": -97, \"hidden_size\": 20}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "'vocab_size'"), "vocab negative");
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": \"yes\"}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("config.json", "'tie_word_embeddings'"), "tie a string");
}

Test(model_bad, shapes_against_config) {
    tovl_model *m;
    make_model("m", false, NULL);
    write_text("m/config.json", "{\"vocab_size\": 98, \"hidden_size\": 20, \"tie_word_embeddings\": false}");
    expect_error(open_model("m", &m), TOVL_ERR_SHAPE_MISMATCH,
                 NAMES("model.safetensors", "model.embed_tokens.weight", "config.json", "vocab_size 98"),
                 "vocab_size disagrees");
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 21, \"tie_word_embeddings\": false}");
    expect_error(open_model("m", &m), TOVL_ERR_SHAPE_MISMATCH, NAMES("model.embed_tokens.weight", "hidden_size 21"),
                 "hidden_size disagrees");
}

Test(model_bad, untied_without_lm_head) {
    tovl_model *m;
    make_model("m", true, NULL);
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": false}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("model.safetensors", "lm_head.weight", "missing"),
                 "untied, no lm_head");
}

Test(model_bad, weights_missing_or_wrong_dtype) {
    tovl_model *m;
    make_model("m", false, NULL);
    remove(P("m/model.safetensors"));
    expect_error(open_model("m", &m), TOVL_ERR_IO, NAMES("model.safetensors.index.json"), "no weights");
    int32_t ints[V * H] = {0};
    uint64_t shape[2] = {V, H};
    tovl_tensor t = {.name = "model.embed_tokens.weight", .dtype = "I32", .ndim = 2, .shape = shape, .data = ints};
    cr_assert_eq(tovl_safetensors_write(P("m/model.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    write_text("m/config.json", "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": true}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("model.embed_tokens.weight", "I32"), "I32 embedding");
    write_raw_st("m/model.safetensors", "{\"x\":", UINT64_MAX, 0);
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("model.safetensors", "JSON"), "weights not JSON");
}

Test(model_bad, sharded_index) {
    tovl_model *m;
    make_model("m", false, NULL);
    remove(P("m/model.safetensors"));
    write_text("m/model.safetensors.index.json", "{\"weight_map\": {\"model.embed_tokens.weight\": \"../evil\","
               " \"lm_head.weight\": \"shard-1.safetensors\"}}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT,
                 NAMES("model.safetensors.index.json", "model.embed_tokens.weight", "not a file name"), "path escape");
    write_text("m/model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"shard-1.safetensors\","
               " \"lm_head.weight\": \"shard-1.safetensors\"}}");
    expect_error(open_model("m", &m), TOVL_ERR_IO, NAMES("shard-1.safetensors"), "missing shard");
    write_text("m/model.safetensors.index.json", "{\"weight_map\": [1]}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT, NAMES("model.safetensors.index.json", "'weight_map'"),
                 "weight_map not an object");
    uint64_t shape[2] = {V, H};
    tovl_tensor t = {.name = "lm_head.weight", .dtype = "BF16", .ndim = 2, .shape = shape, .data = rows_b};
    cr_assert_eq(tovl_safetensors_write(P("m/shard-1.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    write_text("m/model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"shard-1.safetensors\","
               " \"lm_head.weight\": \"shard-1.safetensors\"}}");
    expect_error(open_model("m", &m), TOVL_ERR_FORMAT,
                 NAMES("model.safetensors.index.json", "model.embed_tokens.weight", "shard-1.safetensors"),
                 "tensor not in its shard");
}

/* ---- adapter folders -------------------------------------------------------- */

static float delta[64 * H];

/* An adapter with trainable tokens: config text `tti` (JSON) and one delta
 * tensor of `rows` rows for `module` (embed_tokens or lm_head, Llama's paths;
 * another name is the module path itself; NULL: none). */
static void make_tt_adapter(const char *dir, const char *tti, const char *module, uint32_t rows, uint32_t width,
                            const char *dtype) {
    mkdir_p(dir);
    char rel[256], text[1024], name[256];
    snprintf(rel, sizeof rel, "%s/adapter_config.json", dir);
    snprintf(text, sizeof text, "{\"peft_type\": \"LORA\", \"r\": 2, \"trainable_token_indices\": %s, "
             "\"modules_to_save\": null}", tti);
    write_text(rel, text);
    tu_rng r = tu_rng_for(dir);
    for (size_t i = 0; i < sizeof delta / sizeof delta[0]; i++) {
        delta[i] = tovl_bf16_to_f32(tu_bf16(&r)) / 64.0f;
    }
    uint64_t shape[2] = {rows, width}, lshape[2] = {2, width};
    snprintf(name, sizeof name, "base_model.model.%s.token_adapter.trainable_tokens_delta",
             !module || strcmp(module, "embed_tokens") == 0 ? "model.embed_tokens" : module);
    tovl_tensor t[2] = {{.name = name, .dtype = dtype, .ndim = 2, .shape = shape, .data = delta},
                        {.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", .dtype = "F32",
                         .ndim = 2, .shape = lshape, .data = delta}};
    snprintf(rel, sizeof rel, "%s/adapter_model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), module ? t : t + 1, module ? 2 : 1, NULL, 0), TOVL_OK);
}

static tovl_status open_adapter(const char *dir, tovl_adapter **a) {
    *a = (tovl_adapter *)(uintptr_t)1;
    tovl_status st = tovl_adapter_open(P(dir), a);
    if (st != TOVL_OK) {
        cr_expect_null(*a, "adapter out not reset to NULL");
    }
    return st;
}

Test(adapter_bad, valid_control) {
    make_tt_adapter("a", "[1, 5, 96]", "embed_tokens", 3, H, "F32");
    tovl_adapter *a;
    cr_assert_eq(open_adapter("a", &a), TOVL_OK, "%s", tovl_last_error());
    const tovl_adapter_info *i = tovl_adapter_get_info(a);
    cr_expect_eq(i->source_count, 1);
    cr_expect_eq(i->other_tensors, 1);
    cr_expect_str_eq(i->format, "peft trainable_token_indices");
    tovl_adapter_close(a);
}

Test(adapter_bad, not_an_adapter_folder) {
    tovl_adapter *a;
    mkdir_p("empty");
    expect_error(open_adapter("empty", &a), TOVL_ERR_IO, NAMES("empty", "adapter_config.json"), "empty folder");
    expect_error(open_adapter("missing", &a), TOVL_ERR_IO, NAMES("missing"), "missing folder");
}

Test(adapter_bad, config_json_invalid) {
    tovl_adapter *a;
    make_tt_adapter("a", "[1]", "embed_tokens", 1, H, "F32");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": [1,]}");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "JSON"), "trailing comma");
    write_text("a/adapter_config.json", "[]");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "object"), "an array");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": [1], \"trainable_token_indices\": [2]}");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "trainable_token_indices"),
                 "duplicated field");
}

Test(adapter_bad, config_fields) {
    tovl_adapter *a;
    make_tt_adapter("a", "\"all\"", "embed_tokens", 1, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'trainable_token_indices'"),
                 "tti a string");
    make_tt_adapter("a", "[1, -2]", "embed_tokens", 2, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "trainable_token_indices",
                 "entry 1"), "negative id");
    make_tt_adapter("a", "[1, 2.5]", "embed_tokens", 2, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "entry 1"), "fractional id");
    make_tt_adapter("a", "{\"q_proj\": [1]}", "embed_tokens", 1, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED,
                 NAMES("adapter_config.json", "trainable_token_indices.q_proj"), "unknown module");
    make_tt_adapter("a", "[1]", "embed_tokens", 1, H, "F32");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": [1], \"ensure_weight_tying\": 1}");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'ensure_weight_tying'"),
                 "ewt a number");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": [1], \"modules_to_save\": \"lm_head\"}");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'modules_to_save'"),
                 "mts a string");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": [1], \"modules_to_save\": [\"embed_tokens\"]}");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "modules_to_save"),
                 "module both token-trained and saved");
}

Test(adapter_bad, duplicated_ids) {
    tovl_adapter *a;
    make_tt_adapter("a", "[1, 5, 1]", "embed_tokens", 3, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_DUPLICATE_ID,
                 NAMES("adapter_config.json", "trainable_token_indices", "id 1", "twice"), "list");
    make_tt_adapter("a", "{\"embed_tokens\": [7], \"lm_head\": [3, 3]}", "embed_tokens", 1, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_DUPLICATE_ID,
                 NAMES("adapter_config.json", "trainable_token_indices.lm_head", "id 3"), "dict");
}

Test(adapter_bad, tensors_against_config) {
    tovl_adapter *a;
    make_tt_adapter("a", "[1, 5, 9]", "embed_tokens", 2, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_SHAPE_MISMATCH,
                 NAMES("adapter_model.safetensors", "trainable_tokens_delta", "2 rows", "3 ids"), "rows != ids");
    make_tt_adapter("a", "[1, 5]", NULL, 0, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_config.json", "trainable_token_indices", "trainable_tokens_delta", "missing"),
                 "delta missing");
    make_tt_adapter("a", "null", "embed_tokens", 2, H, "F32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_model.safetensors", "trainable_tokens_delta", "no trainable_token_indices"),
                 "delta without ids");
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "I32");
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_model.safetensors", "trainable_tokens_delta", "I32"), "integer delta");
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    remove(P("a/adapter_model.safetensors"));
    write_text("a/adapter_model.bin", "pickle");
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED, NAMES("adapter_model.bin"), "pickled weights");
    remove(P("a/adapter_model.bin"));
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "adapter_model.safetensors"),
                 "weights missing");
}

/* A standalone Trainable Tokens adapter (peft_type TRAINABLE_TOKENS): the
 * config's other members `fields` (JSON text) and, per name in `names` (after
 * "base_model.model."), an F32 delta of `rows` rows, each with other values. */
static void make_method_adapter(const char *dir, const char *fields, uint32_t rows, const char *const *names) {
    mkdir_p(dir);
    char rel[256], text[1024], full[4][256];
    snprintf(rel, sizeof rel, "%s/adapter_config.json", dir);
    snprintf(text, sizeof text, "{\"peft_type\": \"TRAINABLE_TOKENS\", \"init_weights\": true, %s}", fields);
    write_text(rel, text);
    tu_rng r = tu_rng_for(dir);
    for (size_t i = 0; i < sizeof delta / sizeof delta[0]; i++) {
        delta[i] = tovl_bf16_to_f32(tu_bf16(&r)) / 64.0f;
    }
    uint64_t shape[2] = {rows, H};
    tovl_tensor t[4];
    size_t n = 0;
    for (; names[n]; n++) {
        cr_assert(n < 4 && (n + 1) * rows * H <= sizeof delta / sizeof delta[0]);
        snprintf(full[n], sizeof full[n], "base_model.model.%s", names[n]);
        t[n] = (tovl_tensor){.name = full[n], .dtype = "F32", .ndim = 2, .shape = shape, .data = delta + n * rows * H};
    }
    snprintf(rel, sizeof rel, "%s/adapter_model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), t, n, NULL, 0), TOVL_OK);
}

#define METHOD_EMBED "model.embed_tokens.trainable_tokens_delta"
#define METHOD_LM "lm_head.trainable_tokens_delta"

Test(adapter_bad, method_valid_control) {
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": [\"embed_tokens\"]", 2,
                        NAMES(METHOD_EMBED, METHOD_LM));
    tovl_adapter *a;
    cr_assert_eq(open_adapter("a", &a), TOVL_OK, "%s", tovl_last_error());
    const tovl_adapter_info *i = tovl_adapter_get_info(a);
    cr_expect_str_eq(i->format, "peft TRAINABLE_TOKENS");
    cr_assert_eq(i->source_count, 2);
    for (size_t k = 0; k < 2; k++) {
        cr_expect_eq(i->sources[k].kind, TOVL_SOURCE_TRAINABLE_TOKENS);
        cr_expect_str_eq(i->sources[k].config_field, "token_indices");
        cr_expect(i->sources[k].ids && i->sources[k].ids[0] == 1 && i->sources[k].ids[1] == 5);
    }
    tovl_adapter_close(a);
    /* target_modules as PEFT writes it when left unset: the embedding's full name. */
    make_method_adapter("b", "\"token_indices\": [1, 5], \"target_modules\": \"model.embed_tokens\"", 2,
                        NAMES(METHOD_EMBED));
    cr_assert_eq(open_adapter("b", &a), TOVL_OK, "%s", tovl_last_error());
    tovl_adapter_close(a);
    make_method_adapter("c", "\"token_indices\": [1, 5], \"target_modules\": null", 2, NAMES(METHOD_EMBED));
    cr_assert_eq(open_adapter("c", &a), TOVL_OK, "%s", tovl_last_error());
    tovl_adapter_close(a);
}

Test(adapter_bad, method_config_fields) {
    tovl_adapter *a;
    const char *const *embed = NAMES(METHOD_EMBED);
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": \".*embed_tokens\"", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED,
                 NAMES("adapter_config.json", "'target_modules'", ".*embed_tokens", "regular expression"), "regex");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": [\"embed_tokens\", \"v_proj\"]", 2,
                        embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED, NAMES("adapter_config.json", "'target_modules'", "'v_proj'"),
                 "other module");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": []", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'target_modules'"), "no module");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": [3]", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'target_modules'", "entry 0"),
                 "module a number");
    make_method_adapter("a", "\"target_modules\": [\"embed_tokens\"]", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'token_indices'", "missing"),
                 "no ids");
    make_method_adapter("a", "\"token_indices\": [5, 1, 5]", 3, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_DUPLICATE_ID, NAMES("adapter_config.json", "'token_indices'", "id 5"),
                 "duplicate id");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"token_indices\": [1, 5]", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_config.json", "'token_indices'", "2 times"),
                 "field twice");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"trainable_token_indices\": [1, 5]", 2, embed);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_config.json", "'trainable_token_indices'", "TRAINABLE_TOKENS"), "a LoRA field");
}

Test(adapter_bad, method_tensors_against_config) {
    tovl_adapter *a;
    const char *ids = "\"token_indices\": [1, 5], \"target_modules\": [\"embed_tokens\"]";
    make_method_adapter("a", ids, 2, NAMES("model.embed_tokens.token_adapter.trainable_tokens_delta"));
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_model.safetensors", "token_adapter.trainable_tokens_delta", "does not know"),
                 "a LoRA tensor name");
    make_method_adapter("a", ids, 2, NAMES(METHOD_EMBED, "model.layers.0.self_attn.q_proj.trainable_tokens_delta"));
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED,
                 NAMES("adapter_model.safetensors", "q_proj.trainable_tokens_delta", "not an input embedding or an lm_head"),
                 "tokens on q_proj");
    make_method_adapter("a", ids, 2, NAMES(METHOD_EMBED, METHOD_LM, "lm_head.base_layer.trainable_tokens_delta"));
    expect_error(open_adapter("a", &a), TOVL_ERR_UNSUPPORTED,
                 NAMES("adapter_model.safetensors", "lm_head.base_layer.trainable_tokens_delta", "tied model"),
                 "the tensor PEFT saves for a tied model's two targets");
    make_method_adapter("a", ids, 2, NAMES(METHOD_LM));
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_config.json", "'token_indices'", "base_model.model." METHOD_EMBED, "missing"),
                 "embedding delta missing");
    make_method_adapter("a", "\"token_indices\": [1, 5], \"target_modules\": [\"lm_head\"]", 2,
                        NAMES(METHOD_EMBED, METHOD_LM));
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT,
                 NAMES("adapter_model.safetensors", METHOD_EMBED, "target_modules entry for embed_tokens"),
                 "embedding delta, lm_head targeted");
    make_method_adapter("a", ids, 3, NAMES(METHOD_EMBED));
    expect_error(open_adapter("a", &a), TOVL_ERR_SHAPE_MISMATCH,
                 NAMES("adapter_model.safetensors", METHOD_EMBED, "3 rows", "2 ids"), "rows != ids");
}

Test(adapter_bad, truncated_adapter_file) {
    tovl_adapter *a;
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    FILE *f = fopen(P("a/adapter_model.safetensors"), "r+b");
    cr_assert(f);
    cr_assert_eq(ftruncate(fileno(f), 100), 0);
    fclose(f);
    expect_error(open_adapter("a", &a), TOVL_ERR_FORMAT, NAMES("adapter_model.safetensors"), "truncated");
}

Test(adapter_bad, vllm_file) {
    tovl_adapter *a;
    mkdir_p("v");
    uint64_t shape[2] = {2, H};
    tovl_tensor t = {.name = "something_else", .dtype = "F32", .ndim = 2, .shape = shape, .data = delta};
    cr_assert_eq(tovl_safetensors_write(P("v/new_embeddings.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    expect_error(open_adapter("v", &a), TOVL_ERR_FORMAT,
                 NAMES("new_embeddings.safetensors", "input_embeddings", "output_embeddings"), "no known tensor");
    uint64_t shape3[3] = {2, H, 1};
    tovl_tensor t3 = {.name = "input_embeddings", .dtype = "F32", .ndim = 3, .shape = shape3, .data = delta};
    cr_assert_eq(tovl_safetensors_write(P("v/new_embeddings.safetensors"), &t3, 1, NULL, 0), TOVL_OK);
    expect_error(open_adapter("v", &a), TOVL_ERR_SHAPE_MISMATCH,
                 NAMES("new_embeddings.safetensors", "input_embeddings", "rank 3"), "rank 3");
}

/* ---- resolving against a model, on a counting backend --------------------- */

/* Resolve and build; both must fail with `want`, naming `names`, leaking nothing. */
static void resolve_fails(const char *model_dir, uint32_t padded, const char *adapter_dir, tovl_status want,
                          const char *const *names, const char *what) {
    tovl_model *m;
    tovl_adapter *a;
    cr_assert_eq(tovl_model_open(P(model_dir), padded, &m), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(P(adapter_dir), &a), TOVL_OK, "%s: %s", what, tovl_last_error());
    tu_wrap *w;
    tovl_backend *be = tu_wrap_cpu(&w);
    cr_assert(be);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_adapter_rows *rows = (tovl_adapter_rows *)(uintptr_t)1;
    expect_error(tovl_adapter_resolve(be, &k, a, m, &rows), want, names, what);
    cr_expect_null(rows, "%s: rows not reset", what);
    tovl_embed_overlay *ov = (tovl_embed_overlay *)(uintptr_t)1;
    expect_error(tovl_adapter_build_overlay(be, &k, a, m, &ov), want, names, what);
    cr_expect_null(ov, "%s: overlay not reset", what);
    cr_expect_eq(tu_live(w), 0, "%s: %ld device allocations leaked", what, tu_live(w));
    tovl_backend_close(be);
    tovl_adapter_close(a);
    tovl_model_close(m);
}

Test(resolve_bad, ids_out_of_vocab) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 97]", "embed_tokens", 2, H, "F32");
    resolve_fails("m", 0, "a", TOVL_ERR_ID_OUT_OF_RANGE,
                  NAMES("adapter_model.safetensors", "trainable_tokens_delta", "id 97", "served vocab 97",
                        "vocab_size is 97"), "id 97");
    make_tt_adapter("b", "{\"lm_head\": [1, 120]}", "lm_head", 2, H, "F32");
    resolve_fails("m", 120, "b", TOVL_ERR_ID_OUT_OF_RANGE,
                  NAMES("adapter_model.safetensors", "lm_head.token_adapter.trainable_tokens_delta",
                        "trainable_token_indices.lm_head", "id 120", "served vocab 120", "vocab_size is 97"),
                  "id 120, padded vocab 120");
}

/* An id in the padded tail [vocab_size, served vocab) is an added token: its
 * row comes from the adapter, on a tied model for the lm_head too. */
Test(resolve_bad, ids_in_the_padded_tail_are_added_tokens) {
    make_model("t", true, NULL);
    make_tt_adapter("a", "[1, 97, 119]", "embed_tokens", 3, H, "F32");
    tovl_model *m;
    tovl_adapter *a;
    tovl_adapter_rows *rows;
    cr_assert_eq(tovl_model_open(P("t"), 120, &m), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(P("a"), &a), TOVL_OK, "%s", tovl_last_error());
    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    cr_assert_eq(tovl_adapter_resolve(be, &k, a, m, &rows), TOVL_OK, "%s", tovl_last_error());
    const tovl_adapter_rows_info *ri = tovl_adapter_rows_get_info(rows);
    const uint32_t want[3] = {1, 97, 119};
    cr_assert_eq(ri->desc.embed.count, 3);
    cr_expect_eq(ri->warning_count, 0);
    cr_expect(!ri->desc.has_lmhead && ri->desc.tied, "a tied lm_head follows the embedding rows");
    for (uint32_t j = 0; j < 3; j++) {
        cr_expect_eq(ri->desc.embed.ids[j], want[j]);
        for (uint32_t x = 0; x < H; x++) {
            cr_expect_eq(ri->desc.embed.rows[j * H + x], tovl_f32_to_bf16(delta[j * H + x]), "id %u element %u",
                         want[j], x);
        }
    }
    tovl_adapter_rows_free(rows);
    tovl_backend_close(be);
    tovl_adapter_close(a);
    tovl_model_close(m);
}

Test(resolve_bad, method_tied_rules) {
    make_model("t", true, NULL);
    make_model("u", false, NULL);
    /* Both modules of a tied model targeted: PEFT cannot run it. */
    make_method_adapter("both", "\"token_indices\": [1, 5], \"target_modules\": [\"embed_tokens\", \"lm_head\"]",
                        2, NAMES(METHOD_EMBED, METHOD_LM));
    resolve_fails("t", 0, "both", TOVL_ERR_UNSUPPORTED, NAMES("adapter_config.json", "'target_modules'", "tied model"),
                  "both targets, tied");
    /* The tied copy PEFT saves must equal the embedding's delta (one parameter in PEFT). */
    make_method_adapter("copy", "\"token_indices\": [1, 5], \"target_modules\": [\"embed_tokens\"]", 2,
                        NAMES(METHOD_EMBED, METHOD_LM));
    resolve_fails("t", 0, "copy", TOVL_ERR_FORMAT, NAMES("adapter_model.safetensors", METHOD_EMBED, METHOD_LM, "differ"),
                  "tied copy differs");
    /* ... and belongs to a tied model. */
    resolve_fails("u", 0, "copy", TOVL_ERR_FORMAT, NAMES("adapter_model.safetensors", METHOD_LM, "untied"),
                  "tied copy on an untied model");
    /* lm_head targeted, its delta absent. */
    make_method_adapter("lm", "\"token_indices\": [1, 5], \"target_modules\": [\"lm_head\"]", 2, NAMES("other"));
    resolve_fails("u", 0, "lm", TOVL_ERR_FORMAT, NAMES("'token_indices'", "base_model.model." METHOD_LM, "missing"),
                  "lm_head delta missing");
}

Test(resolve_bad, hidden_size_mismatch) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H + 4, "F32");
    resolve_fails("m", 0, "a", TOVL_ERR_SHAPE_MISMATCH,
                  NAMES("adapter_model.safetensors", "trainable_tokens_delta", "width 24", "hidden_size is 20"),
                  "width 24");
}

/* A modules_to_save adapter with `rows` rows in each matrix. */
static void make_mts_adapter(const char *dir, uint32_t rows, const char *extra_config) {
    mkdir_p(dir);
    char rel[256], text[512];
    snprintf(rel, sizeof rel, "%s/adapter_config.json", dir);
    snprintf(text, sizeof text, "{\"modules_to_save\": [\"embed_tokens\", \"lm_head\"]%s}",
             extra_config ? extra_config : "");
    write_text(rel, text);
    uint16_t *m = calloc((size_t)rows * H, 2);
    cr_assert(m);
    memcpy(m, rows_a, (size_t)(rows < V ? rows : V) * H * 2u);
    uint64_t shape[2] = {rows, H};
    tovl_tensor t[2] = {{.name = "base_model.model.model.embed_tokens.weight", .dtype = "BF16", .ndim = 2,
                         .shape = shape, .data = m},
                        {.name = "base_model.model.lm_head.weight", .dtype = "BF16", .ndim = 2, .shape = shape,
                         .data = m}};
    snprintf(rel, sizeof rel, "%s/adapter_model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), t, 2, NULL, 0), TOVL_OK);
    free(m);
}

Test(resolve_bad, adapter_built_for_another_vocab) {
    make_model("m", false, NULL);
    make_mts_adapter("a", V - 8, NULL);
    resolve_fails("m", 0, "a", TOVL_ERR_VOCAB_MISMATCH,
                  NAMES("adapter_model.safetensors", "base_model.model.", "89 rows", "vocab_size is 97"), "89 rows");
}

Test(resolve_bad, full_matrix_needs_rowdiff) {
    make_model("m", false, NULL);
    make_mts_adapter("a", V, NULL);
    tovl_model *m;
    tovl_adapter *a;
    cr_assert_eq(tovl_model_open(P("m"), 0, &m), TOVL_OK);
    cr_assert_eq(tovl_adapter_open(P("a"), &a), TOVL_OK);
    tu_wrap *w;
    tovl_backend *be = tu_wrap_cpu(&w);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    k.rowdiff = 0;
    tovl_embed_overlay *ov;
    expect_error(tovl_adapter_build_overlay(be, &k, a, m, &ov), TOVL_ERR_KERNEL_MISSING,
                 NAMES("adapter_model.safetensors", "rowdiff"), "rowdiff missing");
    cr_expect_eq(tu_live(w), 0);
    tovl_backend_close(be);
    tovl_adapter_close(a);
    tovl_model_close(m);
}

Test(resolve_bad, tied_rules_peft_refuses) {
    make_model("t", true, NULL);
    make_model("u", false, NULL);
    /* ensure_weight_tying with different ids for the tied embedding and lm_head. */
    make_tt_adapter("a", "{\"embed_tokens\": [1, 2], \"lm_head\": [3]}", "embed_tokens", 2, H, "F32");
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": {\"embed_tokens\": [1, 2], \"lm_head\": [3]},"
               " \"ensure_weight_tying\": true}");
    resolve_fails("t", 0, "a", TOVL_ERR_FORMAT, NAMES("adapter_config.json", "ensure_weight_tying"), "ewt ids");
    /* lm_head ids listed but their tensor absent (an untied model needs it). */
    write_text("a/adapter_config.json", "{\"trainable_token_indices\": {\"embed_tokens\": [1, 2], \"lm_head\": [3]}}");
    resolve_fails("u", 0, "a", TOVL_ERR_FORMAT,
                  NAMES("trainable_token_indices.lm_head", "lm_head.token_adapter.trainable_tokens_delta", "missing"),
                  "lm_head delta missing");
    resolve_fails("t", 0, "a", TOVL_ERR_FORMAT, NAMES("trainable_token_indices.lm_head", "missing"),
                  "lm_head delta missing, tied, other ids");
}

Test(resolve_bad, vllm_rows_beyond_vocab) {
    make_model("m", false, NULL);
    mkdir_p("v");
    uint64_t shape[2] = {3, H};
    tovl_tensor t = {.name = "input_embeddings", .dtype = "F32", .ndim = 2, .shape = shape, .data = delta};
    cr_assert_eq(tovl_safetensors_write(P("v/new_embeddings.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    resolve_fails("m", 0, "v", TOVL_ERR_ID_OUT_OF_RANGE,
                  NAMES("new_embeddings.safetensors", "input_embeddings", "97..99", "at least 100"), "no padding");
    resolve_fails("m", 99, "v", TOVL_ERR_ID_OUT_OF_RANGE, NAMES("input_embeddings"), "padding too small");
}

/* ---- the CLI -------------------------------------------------------------- */

/* Run the binary in the import scratch folder; the exit status and the stderr text. */
static int cli(const char *args, char *err, size_t cap) {
    return tu_run_cli(TOVL_CLI, import_root, args, err, cap);
}

/* Exit 2, exactly one line on stderr, naming each of `names`. */
static void cli_fails(const char *args, const char *const *names) {
    tu_expect_cli_fails(TOVL_CLI, import_root, args, names);
}

/* A batch file with `T` ids (all `id`), optional slots and hidden [T, width]. */
static void make_batch(const char *rel, uint32_t T, int32_t id, int32_t slot, bool with_slots, uint32_t width,
                       const char *ids_dtype) {
    int32_t ids[16], slots[16];
    uint16_t hidden[16 * 32];
    cr_assert(T <= 16 && width <= 32);
    for (uint32_t t = 0; t < T; t++) {
        ids[t] = t == T - 1 ? id : (int32_t)t;
        slots[t] = t == T - 1 ? slot : 0;
    }
    tu_rng r = tu_rng_for(rel);
    tu_fill_bf16(&r, hidden, (size_t)T * width);
    uint64_t s1[1] = {T}, s2[2] = {T, width};
    tovl_tensor t[3] = {{.name = "ids", .dtype = ids_dtype, .ndim = 1, .shape = s1, .data = ids},
                        {.name = "hidden", .dtype = "BF16", .ndim = 2, .shape = s2, .data = hidden},
                        {.name = "slots", .dtype = "I32", .ndim = 1, .shape = s1, .data = slots}};
    cr_assert_eq(tovl_safetensors_write(P(rel), t, with_slots ? 3 : 2, NULL, 0), TOVL_OK);
}

Test(cli_bad, run_valid_control) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    make_batch("b.safetensors", 8, 5, 0, true, H, "I32");
    char err[4096];
    cr_assert_eq(cli("run --base m --adapter a --batch b.safetensors --out o.safetensors", err, sizeof err), 0,
                 "%s", err);
    tovl_safetensors *o;
    cr_assert_eq(tovl_safetensors_open(P("o.safetensors"), &o), TOVL_OK);
    cr_expect(tovl_safetensors_find(o, "embed") && tovl_safetensors_find(o, "logits"));
    tovl_safetensors_close(o);
}

Test(cli_bad, run_bad_batch) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    const char *run = "run --base m --adapter a --batch b.safetensors --out o.safetensors";
    make_batch("b.safetensors", 8, V, 0, true, H, "I32");
    cli_fails(run, NAMES("b.safetensors", "'ids'", "ids[7] = 97"));
    make_batch("b.safetensors", 8, -3, 0, true, H, "I32");
    cli_fails(run, NAMES("b.safetensors", "'ids'", "-3"));
    make_batch("b.safetensors", 8, 5, 0, true, H + 1, "I32");
    cli_fails(run, NAMES("b.safetensors", "'hidden'", "width 21", "hidden_size is 20"));
    make_batch("b.safetensors", 8, 5, 1, true, H, "I32");
    cli_fails(run, NAMES("b.safetensors", "'slots'", "slots[7] = 1", "1 adapter"));
    make_batch("b.safetensors", 8, 5, 0, true, H, "U32");
    cli_fails(run, NAMES("b.safetensors", "'ids'", "U32"));
    write_raw_st("b.safetensors", "{\"ids\":{\"dtype\":\"I32\",\"shape\":[8],\"data_offsets\":[0,32]}}", 900, 32);
    cli_fails(run, NAMES("b.safetensors", "header length"));
    uint16_t one = 0;
    uint64_t s1[1] = {1};
    tovl_tensor t = {.name = "hidden", .dtype = "BF16", .ndim = 1, .shape = s1, .data = &one};
    cr_assert_eq(tovl_safetensors_write(P("b.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    cli_fails(run, NAMES("b.safetensors", "'ids'", "missing"));
    cli_fails("run --base m --adapter a --batch nope.safetensors --out o.safetensors", NAMES("nope.safetensors"));
    cr_expect(access(P("o.safetensors"), F_OK) != 0, "an output file was written after a failure");
}

Test(cli_bad, run_bad_model_or_adapter) {
    make_model("m", false, NULL);
    make_model("t", true, NULL);
    make_tt_adapter("a", "[1, 5, 1]", "embed_tokens", 3, H, "F32");
    make_batch("b.safetensors", 8, 5, 0, true, H, "I32");
    cli_fails("run --base m --adapter a --batch b.safetensors --out o.safetensors",
              NAMES("adapter_config.json", "trainable_token_indices", "id 1"));
    make_tt_adapter("a2", "[1, 5]", "embed_tokens", 2, H + 2, "F32");
    cli_fails("run --base m --adapter a2 --batch b.safetensors --out o.safetensors",
              NAMES("adapter_model.safetensors", "trainable_tokens_delta", "hidden_size"));
    remove(P("t/config.json"));
    cli_fails("run --base t --batch b.safetensors --out o.safetensors", NAMES("config.json", "missing"));
    make_mts_adapter("small", V - 1, NULL);
    cli_fails("run --base m --adapter small --batch b.safetensors --out o.safetensors",
              NAMES("adapter_model.safetensors", "96 rows", "vocab_size is 97"));
    cli_fails("run --base m --adapter a --batch b.safetensors --out o.safetensors --logits f16", NAMES("--logits"));
    cli_fails("run --base m --batch b.safetensors --out o.safetensors --backend nosuch", NAMES("nosuch"));
    cr_expect(access(P("o.safetensors"), F_OK) != 0, "an output file was written after a failure");
}

Test(cli_bad, run_trainable_id_beyond_the_served_vocab) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 100]", "embed_tokens", 2, H, "F32");
    make_batch("b.safetensors", 8, 100, 0, true, H, "I32");
    const char *run = "run --base m --adapter a --batch b.safetensors --out o.safetensors";
    char args[256], err[4096];
    snprintf(args, sizeof args, "%s --vocab 100", run);
    cli_fails(args, NAMES("model.embed_tokens.token_adapter.trainable_tokens_delta", "id 100", "served vocab 100",
                          "vocab_size is 97", "at least 101"));
    cli_fails(run, NAMES("trainable_tokens_delta", "id 100", "served vocab 97", "vocab_size is 97"));
    cr_expect(access(P("o.safetensors"), F_OK) != 0, "an output file was written after a failure");
    snprintf(args, sizeof args, "%s --vocab 101", run);
    cr_expect_eq(cli(args, err, sizeof err), 0, "id 100 is served at --vocab 101: %s", err);
}

Test(cli_bad, inspect) {
    make_model("m", false, NULL);
    make_tt_adapter("a", "[1, 97]", "embed_tokens", 2, H, "F32");
    char err[4096];
    cr_expect_eq(cli("inspect a", err, sizeof err), 0, "without --base the ids are not checked: %s", err);
    cli_fails("inspect a --base m", NAMES("trainable_tokens_delta", "id 97"));
    cli_fails("inspect nowhere", NAMES("nowhere"));
    write_text("a/adapter_config.json", "{");
    cli_fails("inspect a --json", NAMES("adapter_config.json", "JSON"));
}

/* ---- other families' layouts, the fallback, the caller's names ------------ */

/* A model folder whose model.safetensors holds tensors `names` (NULL-ended),
 * each [rows[i], H] of random bf16; config.json is `config`. */
static void make_layout(const char *dir, const char *config, const char *const *names, const uint64_t *rows) {
    mkdir_p(dir);
    char rel[256];
    snprintf(rel, sizeof rel, "%s/config.json", dir);
    write_text(rel, config);
    tu_rng r = tu_rng_for(config);
    tu_fill_bf16(&r, rows_a, V * H);
    tovl_tensor t[8];
    uint64_t shapes[8][2];
    size_t n = 0;
    for (; names[n]; n++) {
        cr_assert(n < 8 && rows[n] <= V);
        shapes[n][0] = rows[n];
        shapes[n][1] = H;
        t[n] = (tovl_tensor){.name = names[n], .dtype = "BF16", .ndim = 2, .shape = shapes[n], .data = rows_a};
    }
    snprintf(rel, sizeof rel, "%s/model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), t, n, NULL, 0), TOVL_OK, "%s", tovl_last_error());
}

static tovl_status open_named(const char *dir, const char *embed, const char *lm, tovl_model **m) {
    tovl_model_names names = {.embed_tensor = embed, .lmhead_tensor = lm};
    *m = (tovl_model *)(uintptr_t)1;
    tovl_status st = tovl_model_open_named(P(dir), 0, &names, m);
    if (st != TOVL_OK) {
        cr_expect_null(*m, "model out not reset to NULL");
    }
    return st;
}

#define CONFIG_TIED "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": true}"
#define CONFIG_UNTIED "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": false}"

Test(model_layouts, known_families_and_nesting) {
    const uint64_t rows[] = {V, V, 64};
    tovl_model *m;
    make_layout("neox", "{\"vocab_size\": 97, \"hidden_size\": 20}",
                NAMES("gpt_neox.embed_in.weight", "embed_out.weight"), rows);
    cr_assert_eq(open_model("neox", &m), TOVL_OK, "%s", tovl_last_error());
    const tovl_model_info *mi = tovl_model_get_info(m);
    cr_expect(!mi->tied && mi->tied_inferred);
    cr_expect_str_eq(mi->embed_tensor, "gpt_neox.embed_in.weight");
    cr_expect_str_eq(mi->lmhead_tensor, "embed_out.weight");
    cr_expect_str_eq(mi->embed_module, "gpt_neox.embed_in");
    cr_expect_str_eq(mi->lmhead_module, "lm_head", "transformers 5 loads embed_out.weight into lm_head");
    tovl_model_close(m);
    /* GPT-2 names its width n_embd; a multimodal config nests the text model's fields. */
    make_layout("gpt2", "{\"vocab_size\": 97, \"n_embd\": 20}", NAMES("transformer.wte.weight", "transformer.wpe.weight"),
                (const uint64_t[]){V, 64});
    cr_assert_eq(open_model("gpt2", &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect(tovl_model_get_info(m)->tied && tovl_model_get_info(m)->hidden == H);
    cr_expect_str_eq(tovl_model_get_info(m)->lmhead_module, "lm_head");
    tovl_model_close(m);
    make_layout("vl", "{\"tie_word_embeddings\": false, \"text_config\": {\"vocab_size\": 97, \"hidden_size\": 20, "
                "\"tie_word_embeddings\": true}}", NAMES("language_model.model.embed_tokens.weight",
                "language_model.lm_head.weight"), rows);
    cr_assert_eq(open_model("vl", &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect(tovl_model_get_info(m)->tied, "transformers 5: text_config's tie_word_embeddings true ties");
    tovl_model_close(m);
    make_layout("vl5", "{\"text_config\": {\"vocab_size\": 97, \"hidden_size\": 20}}",
                NAMES("model.language_model.embed_tokens.weight", "lm_head.weight", "model.visual.embeddings.weight"),
                (const uint64_t[]){V, V, 16});
    cr_assert_eq(open_model("vl5", &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect_str_eq(tovl_model_get_info(m)->embed_tensor, "model.language_model.embed_tokens.weight");
    cr_expect(!tovl_model_get_info(m)->tied);
    tovl_model_close(m);
}

Test(model_layouts, fallback_takes_the_one_embedding_like_tensor) {
    tovl_model *m;
    /* tok_embeddings is not a known layout; the position table has the wrong shape. */
    make_layout("f", CONFIG_TIED, NAMES("net.tok_embeddings.weight", "net.pos.embeddings.weight"),
                (const uint64_t[]){V, 64});
    cr_assert_eq(open_model("f", &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect_str_eq(tovl_model_get_info(m)->embed_tensor, "net.tok_embeddings.weight");
    cr_expect(strstr(tovl_model_get_info(m)->layout, "not a known layout") != NULL);
    tovl_model_close(m);
}

Test(model_layouts, never_guesses) {
    tovl_model *m;
    make_layout("two", CONFIG_TIED, NAMES("model.embed_tokens.weight", "transformer.wte.weight"),
                (const uint64_t[]){V, V});
    expect_error(open_model("two", &m), TOVL_ERR_FORMAT,
                 NAMES("model.safetensors", "two candidate", "'model.embed_tokens.weight'", "'transformer.wte.weight'",
                       "--embed-tensor"), "two known layouts");
    make_layout("two", CONFIG_TIED, NAMES("a.embeddings.weight", "b.tok_embeddings.weight"), (const uint64_t[]){V, V});
    expect_error(open_model("two", &m), TOVL_ERR_FORMAT,
                 NAMES("two candidate", "'a.embeddings.weight'", "'b.tok_embeddings.weight'"), "two fallbacks");
    make_layout("two", CONFIG_UNTIED, NAMES("model.embed_tokens.weight", "lm_head.weight", "embed_out.weight"),
                (const uint64_t[]){V, V, V});
    expect_error(open_model("two", &m), TOVL_ERR_FORMAT,
                 NAMES("two candidate lm_head", "'lm_head.weight'", "'embed_out.weight'", "--lmhead-tensor"),
                 "two lm_heads");
    make_layout("unknown", CONFIG_TIED, NAMES("encoder.tokens.weight", "decoder.proj.weight"),
                (const uint64_t[]){V, V});
    expect_error(open_model("unknown", &m), TOVL_ERR_FORMAT,
                 NAMES("model.safetensors", "no input embedding", "'model.embed_tokens.weight'",
                       "'gpt_neox.embed_in.weight'", "'backbone.embeddings.weight'", "--embed-tensor"),
                 "unknown layout");
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    cli_fails("inspect a --base unknown", NAMES("no input embedding"));
    make_layout("noout", CONFIG_UNTIED, NAMES("transformer.wte.weight", "head.weight"), (const uint64_t[]){V, V});
    expect_error(open_model("noout", &m), TOVL_ERR_FORMAT,
                 NAMES("lm_head tensor is missing", "'embed_out.weight'", "tie_word_embeddings false",
                       "--lmhead-tensor"), "untied, lm_head unknown");
}

Test(model_layouts, caller_names_the_tensors) {
    tovl_model *m;
    make_layout("u", CONFIG_UNTIED, NAMES("encoder.tokens.weight", "decoder.proj.weight", "pos.weight"),
                (const uint64_t[]){V, V, 64});
    cr_assert_eq(open_named("u", "encoder.tokens.weight", "decoder.proj.weight", &m), TOVL_OK, "%s",
                 tovl_last_error());
    const tovl_model_info *mi = tovl_model_get_info(m);
    cr_expect(!mi->tied);
    cr_expect_str_eq(mi->embed_module, "encoder.tokens");
    cr_expect_str_eq(mi->lmhead_module, "decoder.proj");
    cr_expect_str_eq(mi->layout, "tensors named by the caller");
    tovl_model_close(m);
    expect_error(open_named("u", "encoder.token.weight", "decoder.proj.weight", &m), TOVL_ERR_FORMAT,
                 NAMES("model.safetensors", "'encoder.token.weight'", "input embedding", "not there"), "missing");
    expect_error(open_named("u", "encoder.tokens.weight", "decoder.projection", &m), TOVL_ERR_FORMAT,
                 NAMES("'decoder.projection'", "lm_head", "not there"), "missing lm_head");
    expect_error(open_named("u", "pos.weight", "decoder.proj.weight", &m), TOVL_ERR_SHAPE_MISMATCH,
                 NAMES("'pos.weight'", "shape [64, 20]", "vocab_size 97"), "wrong shape");
    expect_error(open_named("u", "", NULL, &m), TOVL_ERR_INVALID_ARGUMENT, NAMES("embed_tensor", "empty"), "empty");
    cr_assert_eq(open_named("u", "encoder.tokens.weight", "encoder.tokens.weight", &m), TOVL_OK, "%s",
                 tovl_last_error());
    cr_expect(tovl_model_get_info(m)->tied, "the caller's tie wins over tie_word_embeddings false");
    tovl_model_close(m);
    make_layout("t", CONFIG_TIED, NAMES("encoder.tokens.weight", "decoder.proj.weight"), (const uint64_t[]){V, V});
    expect_error(open_named("t", "encoder.tokens.weight", "decoder.proj.weight", &m), TOVL_ERR_FORMAT,
                 NAMES("'decoder.proj.weight'", "tie_word_embeddings true"), "lm_head named, config tied");
    cr_assert_eq(open_named("t", "encoder.tokens.weight", "encoder.tokens.weight", &m), TOVL_OK, "%s",
                 tovl_last_error());
    cr_expect(tovl_model_get_info(m)->tied, "an lm_head equal to the embedding is tied");
    tovl_model_close(m);
    char err[4096];
    make_tt_adapter("a", "[1, 5]", "embed_tokens", 2, H, "F32");
    cli_fails("inspect a --base u --embed-tensor pos.weight --lmhead-tensor decoder.proj.weight",
              NAMES("'pos.weight'", "shape [64, 20]"));
    cli_fails("inspect a --base u --embed-tensor nope", NAMES("'nope'", "not there"));
    cli_fails("inspect a --embed-tensor encoder.tokens.weight", NAMES("--base"));
    make_batch("b.safetensors", 8, 5, 0, true, H, "I32");
    cli_fails("run --base u --adapter a --batch b.safetensors --out o.safetensors --embed-tensor "
              "encoder.tokens.weight --lmhead-tensor nope.weight", NAMES("'nope.weight'", "not there"));
    cr_expect(access(P("o.safetensors"), F_OK) != 0, "an output file was written after a failure");
    /* vLLM's rows name no module, so they serve under any layout. */
    mkdir_p("v");
    uint64_t one[2] = {1, H};
    tovl_tensor extra = {.name = "input_embeddings", .dtype = "BF16", .ndim = 2, .shape = one, .data = rows_a};
    cr_assert_eq(tovl_safetensors_write(P("v/new_embeddings.safetensors"), &extra, 1, NULL, 0), TOVL_OK);
    cr_expect_eq(cli("run --base u --adapter v --vocab 98 --batch b.safetensors --out o.safetensors --embed-tensor "
                     "encoder.tokens.weight --lmhead-tensor decoder.proj.weight", err, sizeof err), 0, "%s", err);
}

/* An adapter made on another family names modules the base does not have. */
Test(model_layouts, adapter_of_another_family) {
    tovl_model *m;
    tovl_adapter *a;
    cr_assert_eq(tovl_model_open(TOVL_FAMILY_FIXTURES "/bases/opt_tied", 0, &m), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(TOVL_FAMILY_FIXTURES "/gpt2_tied_method/adapter", &a), TOVL_OK, "%s",
                 tovl_last_error());
    tu_wrap *w;
    tovl_backend *be = tu_wrap_cpu(&w);
    cr_assert(be);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_adapter_rows *rows = (tovl_adapter_rows *)(uintptr_t)1;
    expect_error(tovl_adapter_resolve(be, &k, a, m, &rows), TOVL_ERR_VOCAB_MISMATCH,
                 NAMES("transformer.wte.trainable_tokens_delta", "'transformer.wte'", "'model.decoder.embed_tokens'",
                       "another model family"), "GPT-2 adapter on OPT");
    cr_expect_null(rows);
    cr_expect_eq(tu_live(w), 0, "%ld device allocations leaked", tu_live(w));
    tovl_backend_close(be);
    tovl_adapter_close(a);
    tovl_model_close(m);
    cli_fails("inspect " TOVL_FAMILY_FIXTURES "/gpt_neox_untied_lora_tt/adapter --base " TOVL_FAMILY_FIXTURES
              "/bases/falcon_untied", NAMES("'gpt_neox.embed_in'", "'transformer.word_embeddings'"));
}

/* transformers 4 named GPT-NeoX's lm_head module embed_out, as its checkpoint does. */
Test(model_layouts, keys_are_the_modules_own_names) {
    make_layout("neox", "{\"vocab_size\": 97, \"hidden_size\": 20, \"tie_word_embeddings\": false}",
                NAMES("gpt_neox.embed_in.weight", "embed_out.weight"), (const uint64_t[]){V, V});
    make_model("llama", false, NULL);
    make_tt_adapter("a", "{\"embed_out\": [3, 7]}", "embed_out", 2, H, "F32");
    tovl_model *m;
    tovl_adapter *a;
    cr_assert_eq(tovl_model_open(P("neox"), 0, &m), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(P("a"), &a), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(tovl_adapter_get_info(a)->sources[0].module, TOVL_MODULE_LMHEAD);
    cr_expect_str_eq(tovl_adapter_get_info(a)->sources[0].module_path, "embed_out");
    tu_wrap *w;
    tovl_backend *be = tu_wrap_cpu(&w);
    cr_assert(be);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_adapter_rows *rows;
    cr_assert_eq(tovl_adapter_resolve(be, &k, a, m, &rows), TOVL_OK, "%s", tovl_last_error());
    const tovl_overlay_desc *d = &tovl_adapter_rows_get_info(rows)->desc;
    cr_expect(d->has_lmhead && d->lmhead.count == 2 && d->lmhead.ids[0] == 3 && d->lmhead.ids[1] == 7);
    tovl_adapter_rows_free(rows);
    tovl_model_close(m);
    tovl_adapter_close(a);
    tovl_backend_close(be);
    resolve_fails("llama", 0, "a", TOVL_ERR_VOCAB_MISMATCH, NAMES("'embed_out'", "'lm_head'", "another model family"),
                  "GPT-NeoX key on a Llama base");
}
