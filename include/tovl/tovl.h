/*
 * tovl: per-adapter token overlays for multi-LoRA LLM serving.
 *
 * This is the one header a user reads to learn the whole API. The contract it
 * implements is docs/SPEC.md (a copy of the project's token-overlay spec).
 *
 * An engine keeps one base model and up to `max_loras` adapters in slots. Some
 * adapters replace a few token rows of the input embedding and of the lm_head.
 * tovl turns those rows into per-slot overlays (tovl_embed_overlay), gathers the
 * slots into one pool of device tables (tovl_token_overlay_set) and patches a
 * mixed batch after the embedding gather and after the lm_head projection with
 * two hooks that never allocate or synchronize.
 *
 * Engine-side sequence:
 *
 *   tovl_backend *be;            tovl_backend_open("auto", &be);
 *   tovl_overlay_kernels k  =    tovl_overlay_kernels_resolve(be);
 *   tovl_embed_overlay *ov;      tovl_build_overlay(be, &k, &desc, &ov);
 *   tovl_token_overlay_set *set; tovl_token_overlay_set_from_slots(be, slots, max_loras, tied, &set);
 *   tovl_embed_overlay_release(ov);          // the set holds its own reference
 *   per forward pass:
 *     tovl_embed_hook(set, &k, &embed_args, stream);   // after the embedding gather
 *     tovl_lmhead_hook(set, &k, &lmhead_args, stream); // after the lm_head projection
 *   tovl_token_overlay_set_destroy(set); tovl_backend_close(be);
 *
 * Spec names and C names: GpuBackend = tovl_backend, KernelHandle = tovl_kernel,
 * OverlayKernels = tovl_overlay_kernels, EmbedOverlay = tovl_embed_overlay,
 * build_overlay = tovl_build_overlay, TokenOverlaySet = tovl_token_overlay_set,
 * from_slots = tovl_token_overlay_set_from_slots, try_kernel = tovl_try_kernel.
 *
 * Threads: a backend and the objects built on it may be used from one thread at
 * a time. The error detail (tovl_last_error) is per thread.
 */
#ifndef TOVL_TOVL_H
#define TOVL_TOVL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TOVL_API
#elif defined(__GNUC__)
#define TOVL_API __attribute__((visibility("default")))
#else
#define TOVL_API
#endif

#define TOVL_VERSION_MAJOR 0
#define TOVL_VERSION_MINOR 1
#define TOVL_VERSION_PATCH 0
TOVL_API const char *tovl_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes: one enum, grouped by cause (hundreds digit).                */
/* ------------------------------------------------------------------------ */
typedef enum tovl_status {
    TOVL_OK = 0,

    /* 1xx: the caller passed something wrong. */
    TOVL_ERR_INVALID_ARGUMENT = 100, /* NULL pointer, zero size, bad enum value */
    TOVL_ERR_DUPLICATE_ID = 101,     /* a token id appears twice in one overlay part */
    TOVL_ERR_ID_OUT_OF_RANGE = 102,  /* a token id >= vocab */
    TOVL_ERR_SHAPE_MISMATCH = 103,   /* a row width or tensor shape disagrees */
    TOVL_ERR_VOCAB_MISMATCH = 104,   /* overlays built for different vocab sizes */
    TOVL_ERR_CAPACITY = 105,         /* more rows than a fixed-shape set's slot may hold */

    /* 2xx: the environment lacks something. */
    TOVL_ERR_BACKEND_UNAVAILABLE = 200, /* runtime or device not found (see tovl_backend_list) */
    TOVL_ERR_KERNEL_MISSING = 201,      /* a kernel this operation needs resolved to handle 0 */
    TOVL_ERR_UNSUPPORTED = 202,         /* the backend cannot do this (feature, dtype) */
    TOVL_ERR_UNKNOWN_BACKEND = 203,     /* no backend of that name exists in tovl */

    /* 3xx: the device or its driver failed. */
    TOVL_ERR_OUT_OF_MEMORY = 300, /* host or device allocation failed */
    TOVL_ERR_DEVICE = 301,        /* a driver call failed; the detail has its code */
    TOVL_ERR_LAUNCH = 302,        /* a kernel launch failed */

    /* 4xx: files and formats (adapter and model import). */
    TOVL_ERR_IO = 400,     /* a file could not be opened, read or written */
    TOVL_ERR_FORMAT = 401, /* a file is malformed (header, JSON, dtype, ranges) */

    /* 9xx: a bug in tovl itself. */
    TOVL_ERR_INTERNAL = 900
} tovl_status;

/* A fixed English name for a status ("TOVL_ERR_DUPLICATE_ID: duplicate token id"). */
TOVL_API const char *tovl_status_str(tovl_status status);

/* The detail of the last failure on this thread: which tensor, which id, which
 * kernel, which driver call. Empty string after success of a call that sets it;
 * never NULL. Every function returning tovl_status != TOVL_OK sets it. */
TOVL_API const char *tovl_last_error(void);

/* ------------------------------------------------------------------------ */
/* Backends                                                                  */
/* ------------------------------------------------------------------------ */
typedef struct tovl_backend tovl_backend;

/* Device memory is addressed by a 64-bit device pointer: a CUDA/HIP device
 * pointer, a VkDeviceAddress, or a host pointer on the CPU backend. 0 = none. */
typedef uint64_t tovl_devptr;

/* One entry of tovl_backend_list. */
typedef struct tovl_backend_info {
    const char *name;     /* "cpu", "cuda", "hip", "vulkan" */
    bool compiled;        /* built into this library */
    bool available;       /* opens on this machine */
    char reason[256];     /* why not available ("libcuda.so.1 not found: ..."), else "" */
    char device[256];     /* device description when available, else "" */
} tovl_backend_info;

/* Every backend tovl knows, in preference order for "auto" (cuda, hip, vulkan,
 * cpu). Probes each by opening and closing it. Writes up to `capacity` entries
 * and returns the number of backends (call with capacity 0 to count). */
TOVL_API size_t tovl_backend_list(tovl_backend_info *out, size_t capacity);

/* Open a backend by name: "cpu", "cuda", "hip", "vulkan", or "auto" (the first
 * available of cuda, hip, vulkan, cpu). Device choice per backend comes from
 * TOVL_CUDA_DEVICE, TOVL_HIP_DEVICE, TOVL_VULKAN_DEVICE. On failure *out is NULL
 * and tovl_last_error() says why. */
TOVL_API tovl_status tovl_backend_open(const char *name, tovl_backend **out);
/* Destroy the sets and release the overlays built on a backend before closing it. */
TOVL_API void tovl_backend_close(tovl_backend *backend);

TOVL_API const char *tovl_backend_name(const tovl_backend *backend);
TOVL_API const char *tovl_backend_device(const tovl_backend *backend);
/* Backend-specific facts as text, NULL when unknown. Keys every backend may
 * answer: "subgroup_size", "f32_denormals" ("preserved" | "flushed" | ...),
 * "driver". */
TOVL_API const char *tovl_backend_property(const tovl_backend *backend, const char *key);

/* Device memory helpers (synchronous; not for the forward path). */
TOVL_API tovl_status tovl_alloc(tovl_backend *backend, size_t bytes, tovl_devptr *out);
TOVL_API void tovl_free(tovl_backend *backend, tovl_devptr ptr);
TOVL_API tovl_status tovl_upload(tovl_backend *backend, tovl_devptr dst, const void *src, size_t bytes);
TOVL_API tovl_status tovl_download(tovl_backend *backend, void *dst, tovl_devptr src, size_t bytes);
/* Fill `bytes` (a multiple of 4) with a repeated 32-bit pattern. */
TOVL_API tovl_status tovl_fill_u32(tovl_backend *backend, tovl_devptr dst, uint32_t pattern, size_t bytes);
/* Wait for all work on `stream` (NULL = the backend's own). */
TOVL_API tovl_status tovl_synchronize(tovl_backend *backend, void *stream);

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */
/* A kernel handle; 0 means "this backend does not have that kernel". */
typedef uint64_t tovl_kernel;

#define TOVL_KERNEL_ROWDIFF "rowdiff"
#define TOVL_KERNEL_EMBED_OVERLAY "embed_overlay"
#define TOVL_KERNEL_LMHEAD_OVERLAY_BF16 "lmhead_overlay_bf16"
#define TOVL_KERNEL_LMHEAD_OVERLAY_F32 "lmhead_overlay_f32"

/* Look a kernel up by name; 0 when the backend lacks it. */
TOVL_API tovl_kernel tovl_try_kernel(tovl_backend *backend, const char *name);

/* The four token-overlay kernels, resolved once. A missing one is 0: the hooks
 * then return success without a launch, and tovl_build_overlay refuses an
 * adapter whose tensors need it. */
typedef struct tovl_overlay_kernels {
    tovl_kernel rowdiff;
    tovl_kernel embed_overlay;
    tovl_kernel lmhead_overlay_bf16;
    tovl_kernel lmhead_overlay_f32;
} tovl_overlay_kernels;

/* All handles zero: "no overlay kernel loaded". */
#define TOVL_OVERLAY_KERNELS_NONE ((tovl_overlay_kernels){0, 0, 0, 0})

TOVL_API tovl_overlay_kernels tovl_overlay_kernels_resolve(tovl_backend *backend);

/* ------------------------------------------------------------------------ */
/* One adapter's overlay (EmbedOverlay)                                      */
/* ------------------------------------------------------------------------ */
typedef struct tovl_embed_overlay tovl_embed_overlay;

/* Host rows for one part of an overlay. */
typedef struct tovl_overlay_rows {
    const char *tensor;   /* name of the source tensor, used in error messages */
    const uint32_t *ids;  /* [count] distinct token ids, each < vocab */
    const uint16_t *rows; /* [count, width] bf16 bit patterns, row j for ids[j] */
    uint32_t count;
    uint32_t width;       /* the source tensor's row width; must equal hidden */
} tovl_overlay_rows;

typedef struct tovl_overlay_desc {
    const char *adapter;  /* adapter name for error messages (may be NULL) */
    uint32_t vocab;       /* the model's (padded) vocabulary, > 0 */
    uint32_t hidden;      /* hidden size, > 0 */
    tovl_overlay_rows embed;   /* count 0: no embed rows */
    /* lm_head part: absent (has_lmhead false), or present with count >= 0.
     * Present with count 0 means "leave the lm_head alone", even when tied. */
    bool has_lmhead;
    tovl_overlay_rows lmhead;
    /* The model ties its lm_head to its embedding: then embed rows without an
     * own lm_head part also patch the lm_head, and need the lm_head kernels. */
    bool tied;
} tovl_overlay_desc;

/* Validate `desc`, upload its rows and ids, and fill slot_map on the device.
 * Errors (nothing is leaked; *out stays NULL):
 *   TOVL_ERR_DUPLICATE_ID / TOVL_ERR_ID_OUT_OF_RANGE / TOVL_ERR_SHAPE_MISMATCH
 *     name the tensor and the id or width;
 *   TOVL_ERR_KERNEL_MISSING names the kernel the rows need (embed rows:
 *     embed_overlay; lm_head rows, own or tied: both lm_head kernels).
 * The overlay starts with one reference, released by tovl_embed_overlay_release. */
TOVL_API tovl_status tovl_build_overlay(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                        const tovl_overlay_desc *desc, tovl_embed_overlay **out);
TOVL_API void tovl_embed_overlay_retain(tovl_embed_overlay *overlay);
TOVL_API void tovl_embed_overlay_release(tovl_embed_overlay *overlay);

/* Read-only views of a built overlay (device pointers; 0 when absent). */
typedef struct tovl_embed_overlay_view {
    uint32_t vocab, hidden;
    uint32_t embed_count;        /* n */
    tovl_devptr embed_ids;       /* u32[n] */
    tovl_devptr embed_rows;      /* bf16 [n, hidden] */
    tovl_devptr slot_map;        /* i32[vocab], slot_map[ids[j]] = j, else -1 */
    bool has_lmhead;
    uint32_t lmhead_count;       /* m */
    tovl_devptr lmhead_ids;      /* u32[m] */
    tovl_devptr lmhead_rows;     /* bf16 [m, hidden] */
} tovl_embed_overlay_view;
TOVL_API tovl_embed_overlay_view tovl_embed_overlay_get_view(const tovl_embed_overlay *overlay);

/* Find the rows of two device bf16 matrices [rows, hidden] that differ (spec:
 * rowdiff; tol 0 = any bit differs, tol > 0 = |a-b| > tol or NaN on one side).
 * Synchronous. Writes the indices of differing rows, increasing, into
 * `changed` (capacity `rows`) and their number into *n_changed.
 * TOVL_ERR_KERNEL_MISSING when kernels->rowdiff is 0. */
TOVL_API tovl_status tovl_rowdiff(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                  tovl_devptr a, tovl_devptr b, uint32_t rows, uint32_t hidden,
                                  float tol, uint32_t *changed, uint32_t *n_changed);

/* ------------------------------------------------------------------------ */
/* The adapter pool (TokenOverlaySet)                                        */
/* ------------------------------------------------------------------------ */
typedef struct tovl_token_overlay_set tovl_token_overlay_set;

/* Build the device tables for `max_loras` slots; overlays[s] NULL = empty slot.
 * The set retains each overlay it points into. A slot's lm_head cells are its
 * own lm_head part when present; else, when `tied`, its embed rows and ids;
 * else none. Errors: TOVL_ERR_VOCAB_MISMATCH / TOVL_ERR_SHAPE_MISMATCH (two
 * overlays of different vocab or hidden size; names both slots). */
TOVL_API tovl_status tovl_token_overlay_set_from_slots(tovl_backend *backend,
                                                       tovl_embed_overlay *const *overlays,
                                                       uint32_t max_loras, bool tied,
                                                       tovl_token_overlay_set **out);
TOVL_API void tovl_token_overlay_set_destroy(tovl_token_overlay_set *set);

/* True when at least one slot has an overlay; an engine keeps only active
 * from_slots sets (a fixed-shape set's hooks launch whether or not it is). */
TOVL_API bool tovl_token_overlay_set_any_active(const tovl_token_overlay_set *set);
/* The common vocab of the present overlays (0 when none); a fixed-shape set's vocab. */
TOVL_API uint32_t tovl_token_overlay_set_vocab(const tovl_token_overlay_set *set);
/* The hidden size of the present overlays (0 when none); a fixed-shape set's hidden. */
TOVL_API uint32_t tovl_token_overlay_set_hidden(const tovl_token_overlay_set *set);
/* The lm_head kernels' max_n: the largest lm_head row count of a from_slots
 * set (its launch's grid.y), the lm_head capacity of a fixed-shape set (whose
 * launch is shaped for at most 64 rows a slot; the kernels loop over more). */
TOVL_API uint32_t tovl_token_overlay_set_max_n_override(const tovl_token_overlay_set *set);
/* The lm_head launch's logical grid.y (kernel_args.h), for engines that launch
 * the kernels themselves: max_n_override for a from_slots set, at most 64 for
 * a fixed-shape set (the kernels loop over the rows past it). */
TOVL_API uint32_t tovl_token_overlay_set_lmhead_grid_y(const tovl_token_overlay_set *set);
TOVL_API uint32_t tovl_token_overlay_set_max_loras(const tovl_token_overlay_set *set);

/* The device tables, for engines that launch the kernels themselves. */
typedef struct tovl_overlay_tables {
    tovl_devptr embed_slot_map_table; /* u64[max_loras] */
    tovl_devptr embed_rows_table;     /* u64[max_loras] */
    tovl_devptr embed_n_table;        /* u32[max_loras] */
    tovl_devptr lmhead_rows_table;    /* u64[max_loras] */
    tovl_devptr lmhead_ids_table;     /* u64[max_loras] */
    tovl_devptr n_override_table;     /* u32[max_loras] */
} tovl_overlay_tables;
TOVL_API tovl_overlay_tables tovl_token_overlay_set_tables(const tovl_token_overlay_set *set);

/* ------------------------------------------------------------------------ */
/* Fixed-shape sets: slots loaded and unloaded in place                      */
/* ------------------------------------------------------------------------ */
/* A set built by from_slots is immutable: its tables and its lm_head grid
 * follow its contents, so a swap builds a new set and a captured CUDA graph
 * (or a recorded Vulkan command buffer) must be captured again. A fixed-shape
 * set keeps one shape for its whole life: its device tables never move, and
 * the hooks make the same launch (kernels, grid, arguments) for the same T
 * whatever is loaded, also while every slot is empty; each slot's counts are
 * read on the device. So a graph captured once with both hooks keeps serving
 * every adapter loaded later. docs/INTEGRATION.md (Fixed-shape sets). */
typedef struct tovl_set_shape {
    uint32_t max_loras;       /* slots, > 0 */
    uint32_t vocab;           /* the served (padded) vocab every overlay must have, > 0 */
    uint32_t hidden;          /* hidden size every overlay must have, > 0 */
    bool tied;                /* the model ties its lm_head to its embedding */
    uint32_t embed_capacity;  /* the most embedding rows one slot may hold */
    uint32_t lmhead_capacity; /* the most lm_head cells one slot may hold: its own lm_head part, or its
                                 embedding rows in a tied set; the lm_head kernels' max_n */
} tovl_set_shape;

/* Create a fixed-shape set with every slot empty. Its device memory is the
 * six tables (40 bytes a slot), allocated here: the rows stay in the
 * overlays, which the set retains while a slot points at them. A capacity
 * costs no memory, and little time: the lm_head launch is shaped for at most
 * 64 rows a slot (the kernels loop over the rows past them) and blocks past
 * every slot's rows leave early (docs/PERFORMANCE.md, Fixed-shape sets).
 * Errors: TOVL_ERR_INVALID_ARGUMENT names the field that is 0 or NULL. */
TOVL_API tovl_status tovl_token_overlay_set_create(tovl_backend *backend, const tovl_set_shape *shape,
                                                   tovl_token_overlay_set **out);
/* Load `overlay` into `slot`, replacing what the slot held, ordered on
 * `stream` (CUstream, hipStream_t, a VkCommandBuffer being recorded, NULL =
 * the backend's own): work enqueued on the stream before the call sees the
 * old contents, work enqueued after sees the new, and no launch sees a mix.
 * The host call never waits for the device (a backend of iface version 1:
 * it synchronizes the stream). The set retains the overlay; the replaced one
 * is released once the device has passed the swap, which the set checks at
 * every load, unload and tovl_token_overlay_set_collect. Load between graph
 * replays, never while the stream is being captured (refused on CUDA and HIP).
 * A refused load changes nothing: the slot keeps its adapter and its bits.
 * Errors: TOVL_ERR_INVALID_ARGUMENT (not a fixed-shape set, slot >= max_loras,
 * NULL overlay, another backend's overlay, a tied rule other than the set's),
 * TOVL_ERR_VOCAB_MISMATCH / TOVL_ERR_SHAPE_MISMATCH (vocab or hidden other
 * than the set's), TOVL_ERR_CAPACITY (more embedding rows or lm_head cells
 * than the capacity); each names the adapter, the value and the limit. */
TOVL_API tovl_status tovl_token_overlay_set_load(tovl_token_overlay_set *set, uint32_t slot,
                                                 tovl_embed_overlay *overlay, void *stream);
/* Empty `slot`, ordered on `stream` as tovl_token_overlay_set_load. */
TOVL_API tovl_status tovl_token_overlay_set_unload(tovl_token_overlay_set *set, uint32_t slot, void *stream);
/* Release the replaced overlays the device has passed; *pending (may be NULL)
 * gets how many are still held. Never waits. */
TOVL_API tovl_status tovl_token_overlay_set_collect(tovl_token_overlay_set *set, uint32_t *pending);
/* True for a set made by tovl_token_overlay_set_create. */
TOVL_API bool tovl_token_overlay_set_is_fixed(const tovl_token_overlay_set *set);
/* The overlay a fixed-shape set's slot holds (NULL: empty, or not such a set).
 * Borrowed: retain it to keep it past the next load or unload of that slot. */
TOVL_API tovl_embed_overlay *tovl_token_overlay_set_slot(tovl_token_overlay_set *set, uint32_t slot);

/* ------------------------------------------------------------------------ */
/* Tensor parallelism: vocab-parallel shards                                 */
/* ------------------------------------------------------------------------ */
/* Under tensor parallelism (vLLM's VocabParallelEmbedding, ParallelLMHead)
 * each rank computes the logits of one contiguous range of the vocabulary. A
 * shard set patches only that range's cells, in the rank's logits shard; the
 * shards' outputs concatenated equal one unsharded set's output bit for bit.
 * docs/INTEGRATION.md (Tensor parallelism) names the attach points. */

/* The pad multiple vLLM uses for the vocabulary (DEFAULT_VOCAB_PADDING_SIZE). */
#define TOVL_VOCAB_PAD_DEFAULT 64

/* vLLM's split of the vocabulary over `world_size` ranks: the vocabulary is
 * padded up to a multiple of `pad_multiple` (vLLM: 64; 0 means 64) and cut
 * into world_size equal ranges; rank r gets [start, end) of the padded vocab.
 * When world_size does not divide the padded vocab (vLLM refuses such a split)
 * the shards are ceil(padded / world_size) wide and the last one is shorter;
 * a rank past the padded vocab then gets the empty range [padded, padded).
 * A range that starts at or past `vocab` holds only padding (this happens
 * only when vocab < world_size * pad_multiple): no overlay cell lies in it,
 * so that rank builds no shard set and skips the lm_head hook.
 * Errors: TOVL_ERR_INVALID_ARGUMENT (NULL start or end, vocab or world_size
 * 0, rank >= world_size, a padded vocab above 2^32 - 1); *start and *end are
 * then 0. */
TOVL_API tovl_status tovl_vocab_shard_range(uint32_t vocab, uint32_t world_size, uint32_t rank,
                                           uint32_t pad_multiple, uint32_t *start, uint32_t *end);

/* A set for one vocab shard [vocab_start, vocab_end) of the served vocab (end
 * may pass the overlays' vocab up to the padded vocab: cells past it are never
 * overlaid). Its lm_head cells are the overlay ids inside the shard, written at
 * column id - vocab_start of the rank's logits shard (the hook's ld must be >=
 * vocab_end - vocab_start); it holds only that shard's lm_head rows on the
 * device (copies it owns, with the ids already shifted, so the kernels are the
 * unsharded ones; the overlays it retains keep their whole parts), and its
 * grid.y (tovl_token_overlay_set_max_n_override) is the largest slot's count
 * inside the shard. The embedding side is the full
 * overlay: tovl_embed_hook on a shard set does exactly what it does on the
 * unsharded set. Attach it after the embedding's all-reduce, where every rank
 * holds whole hidden rows; a per-shard patch before the all-reduce is not
 * offered, because it is not exact: the other ranks contribute +0.0 and
 * -0.0 + +0.0 is +0.0, so an overlay row's -0.0 would be lost.
 * The range rule: vocab_start < vocab_end, and vocab_start < the overlays'
 * vocab (a shard that begins past the served vocab holds no cell); vocab_end
 * has no upper bound of its own beyond the hook's ld (any engine padding is
 * allowed). An empty pool accepts any non-empty range. Errors:
 *   TOVL_ERR_INVALID_ARGUMENT: vocab_start >= vocab_end (names both), and the
 *     errors of tovl_token_overlay_set_from_slots;
 *   TOVL_ERR_ID_OUT_OF_RANGE: vocab_start >= the overlays' vocab (names both);
 *   TOVL_ERR_VOCAB_MISMATCH / TOVL_ERR_SHAPE_MISMATCH as from_slots.
 * tovl_token_overlay_set_vocab still answers the overlays' whole vocab. */
TOVL_API tovl_status tovl_token_overlay_set_from_slots_shard(tovl_backend *backend,
                                                             tovl_embed_overlay *const *overlays,
                                                             uint32_t max_loras, bool tied, uint32_t vocab_start,
                                                             uint32_t vocab_end, tovl_token_overlay_set **out);
/* A fixed-shape set (tovl_token_overlay_set_create) for one vocab shard
 * [vocab_start, vocab_end), as from_slots_shard is for from_slots: the lm_head
 * hook patches the rank's logits shard, the embed hook the whole rows, and the
 * slots load and unload in place, ordered on a stream, so every rank's captured
 * graphs keep serving while the ranks load the same slots at the same step. A
 * load writes the slot's in-shard ids, shifted by -vocab_start, into memory
 * the set owns (4 bytes a cell of lmhead_capacity, a slot) and points at the
 * overlay's own rows: with ids in increasing order, as the importer makes
 * them, they are one run of the overlay's part. The capacity counts an
 * overlay's whole lm_head cells, not only its shard's, so every rank accepts
 * or refuses a load alike, and every rank's launch is the same. The range
 * rule and its errors are from_slots_shard's, against shape.vocab; the other
 * errors are tovl_token_overlay_set_create's. */
TOVL_API tovl_status tovl_token_overlay_set_create_shard(tovl_backend *backend, const tovl_set_shape *shape,
                                                         uint32_t vocab_start, uint32_t vocab_end,
                                                         tovl_token_overlay_set **out);
/* The shard a set covers: [0, vocab) for an unsharded set ([0, 0) for a NULL
 * set or an unsharded empty pool). Either pointer may be NULL. */
TOVL_API void tovl_token_overlay_set_shard_range(const tovl_token_overlay_set *set, uint32_t *vocab_start,
                                                 uint32_t *vocab_end);

/* ------------------------------------------------------------------------ */
/* Forward hooks                                                             */
/* ------------------------------------------------------------------------ */
/* Either a per-row slot array (i32, < 0 or >= max_loras = no adapter), or, when
 * `slots` is 0, one `active_slot` for every row (< 0: no launch at all). */

/* After the embedding gather, before any embedding scale. */
typedef struct tovl_embed_hook_args {
    tovl_devptr hidden;    /* bf16 [T, hidden_size], patched in place */
    tovl_devptr token_ids; /* u32 [T] (i32 ids are read as u32: negatives are >= vocab) */
    tovl_devptr slots;     /* i32 [T], or 0 */
    int32_t active_slot;   /* used when slots == 0 */
    uint32_t T;
    uint32_t hidden_size;  /* must equal the set's hidden */
} tovl_embed_hook_args;

typedef enum tovl_logits_dtype {
    TOVL_LOGITS_BF16 = 0,
    TOVL_LOGITS_F32 = 1
} tovl_logits_dtype;

/* After the lm_head projection, before any logit softcap. */
typedef struct tovl_lmhead_hook_args {
    tovl_devptr logits;       /* [T, ld] of logits_dtype, patched in place */
    tovl_logits_dtype logits_dtype;
    uint64_t ld;              /* row stride in elements, >= the set's vocab (a shard set: >= its shard's width) */
    tovl_devptr hidden;       /* bf16 [T, hidden_size] final hidden states */
    tovl_devptr slots;        /* i32 [T] per logits row, or 0 */
    int32_t active_slot;
    uint32_t T;
    uint32_t hidden_size;
} tovl_lmhead_hook_args;

/* Enqueue on `stream` (CUstream, hipStream_t, VkCommandBuffer being recorded;
 * NULL = the backend's own). Never allocates, copies to the host or
 * synchronizes, so both can be captured in a CUDA/HIP graph. A zero kernel
 * handle, an inactive set, T = 0 or active_slot < 0 without slots: success
 * without a launch. */
TOVL_API tovl_status tovl_embed_hook(const tovl_token_overlay_set *set, const tovl_overlay_kernels *kernels,
                                     const tovl_embed_hook_args *args, void *stream);
TOVL_API tovl_status tovl_lmhead_hook(const tovl_token_overlay_set *set, const tovl_overlay_kernels *kernels,
                                      const tovl_lmhead_hook_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* bf16 helpers (the spec's conversion rules)                                */
/* ------------------------------------------------------------------------ */
/* f32 -> bf16, nearest-even; every NaN becomes 0x7FC0. */
TOVL_API uint16_t tovl_f32_to_bf16(float value);
/* bf16 -> f32, exact. */
TOVL_API float tovl_bf16_to_f32(uint16_t bits);

/* ------------------------------------------------------------------------ */
/* Adapters and base models (import)                                         */
/* ------------------------------------------------------------------------ */
/* Reading safetensors files, Hugging Face base model folders and PEFT / vLLM
 * adapter folders, and turning an adapter into overlay rows with exactly what
 * PEFT computes (docs/ADAPTERS.md lists every format and tied-model rule).
 * Every file is validated before anything in it is trusted. Every error is
 * TOVL_ERR_IO (a file cannot be opened, read or written), TOVL_ERR_FORMAT
 * (malformed), TOVL_ERR_SHAPE_MISMATCH, TOVL_ERR_ID_OUT_OF_RANGE,
 * TOVL_ERR_DUPLICATE_ID or TOVL_ERR_VOCAB_MISMATCH, and its detail is one line
 * naming the file and the tensor or config field. Nothing is leaked on failure. */

/* One tensor of a safetensors file: a view into the (memory-mapped) file. */
typedef struct tovl_tensor {
    const char *name;
    const char *dtype;      /* as in the file: "BF16", "F16", "F32", "I32", ... */
    uint32_t elem_size;     /* bytes per element */
    uint32_t ndim;
    const uint64_t *shape;  /* [ndim] */
    uint64_t count;         /* elements: the product of shape (1 for ndim 0) */
    const void *data;       /* count * elem_size bytes, not necessarily aligned */
} tovl_tensor;

typedef struct tovl_safetensors tovl_safetensors;

/* Map a safetensors file read-only and validate its whole header: the header
 * length lies within the file, the header is one JSON object (no duplicate
 * names), every dtype is known, shape x element size equals the byte range,
 * every range lies inside the data area and no two overlap. */
TOVL_API tovl_status tovl_safetensors_open(const char *path, tovl_safetensors **out);
/* The same over bytes in memory (not copied: they must outlive the object);
 * `name` is used in error messages. */
TOVL_API tovl_status tovl_safetensors_open_memory(const void *bytes, size_t size, const char *name,
                                                  tovl_safetensors **out);
TOVL_API void tovl_safetensors_close(tovl_safetensors *file);
TOVL_API const char *tovl_safetensors_path(const tovl_safetensors *file);
/* Tensors in order of their data offsets. */
TOVL_API size_t tovl_safetensors_count(const tovl_safetensors *file);
TOVL_API const tovl_tensor *tovl_safetensors_at(const tovl_safetensors *file, size_t index);
/* NULL when absent. */
TOVL_API const tovl_tensor *tovl_safetensors_find(const tovl_safetensors *file, const char *name);

/* Write `count` tensors (name, dtype, ndim, shape, data; elem_size and count
 * are derived) and optional string metadata (`metadata` holds key, value,
 * key, value, ...; NULL when n_metadata is 0). Written to a temporary file
 * and renamed, so `path` never holds a half-written file. */
TOVL_API tovl_status tovl_safetensors_write(const char *path, const tovl_tensor *tensors, size_t count,
                                            const char *const *metadata, size_t n_metadata);

/* A base model folder: config.json (vocab_size, hidden_size,
 * tie_word_embeddings, at the top or in a multimodal model's text_config) and
 * model.safetensors or model.safetensors.index.json holding the input
 * embedding and, untied, the lm_head. The two tensors are found by the
 * family's names (Llama-style model.embed_tokens / lm_head, multimodal
 * model.language_model.* and language_model.model.*, GPT-NeoX, GPT-2/GPT-J,
 * BLOOM/Falcon, OPT, Mamba), else as the one tensor named like an embedding
 * (never a guess between two), or named by the caller (tovl_model_names).
 * docs/ADAPTERS.md has the table. Rows are bf16; F16 and F32 matrices are
 * converted (nearest-even). */
typedef struct tovl_model tovl_model;

typedef struct tovl_model_info {
    const char *dir;
    uint32_t vocab;          /* the served vocab: config vocab_size, or the padded vocab asked for */
    uint32_t config_vocab;   /* config.json vocab_size (rows of the embedding) */
    uint32_t hidden;         /* config.json hidden_size */
    bool tied;               /* the lm_head is the embedding */
    bool tied_inferred;      /* config.json has no tie_word_embeddings: inferred from the lm_head's absence */
    const char *embed_file;  /* the file holding the input embedding */
    const char *embed_dtype; /* its dtype in the file */
    const char *lmhead_file; /* the file holding the lm_head; NULL when tied */
    const char *lmhead_dtype;
    const char *embed_tensor;  /* "model.embed_tokens.weight", "gpt_neox.embed_in.weight", ... */
    const char *lmhead_tensor; /* "lm_head.weight", "embed_out.weight", ...; NULL when tied */
    const char *embed_module;  /* the module paths a PEFT adapter's tensors must sit on ("gpt_neox.embed_in"); */
    const char *lmhead_module; /* the wrappers "model." and "language_model." are not compared */
    const char *layout;        /* which rule found the tensors: a family, the fallback, or the caller */
} tovl_model_info;

/* What the caller names instead of the detection; NULL fields are found. The
 * tensors are checkpoint names; the modules are the loaded model's paths, as
 * PEFT writes them (get_input_embeddings()'s name), when they differ from the
 * tensors'. An lmhead_tensor equal to embed_tensor means tied. */
typedef struct tovl_model_names {
    const char *embed_tensor;
    const char *lmhead_tensor;
    const char *embed_module;
    const char *lmhead_module;
} tovl_model_names;

/* Open a model folder. `padded_vocab` 0 serves config vocab_size rows; a
 * larger value is the engine's padded vocab: rows vocab_size .. padded_vocab-1
 * are zero in the base embedding and lm_head (where added tokens live: an
 * adapter's trainable ids there supply those rows). */
TOVL_API tovl_status tovl_model_open(const char *dir, uint32_t padded_vocab, tovl_model **out);
/* The same with tensor or module names given (`names` may be NULL). A named
 * tensor that is missing or has the wrong shape is an error; nothing found is
 * guessed. */
TOVL_API tovl_status tovl_model_open_named(const char *dir, uint32_t padded_vocab, const tovl_model_names *names,
                                           tovl_model **out);
TOVL_API void tovl_model_close(tovl_model *model);
/* The loaded model's module paths, for adapters resolved from now on (what
 * tovl.hf.attach finds through get_input_embeddings()); NULL keeps one. The
 * checkpoint tensors' own paths stay accepted. */
TOVL_API tovl_status tovl_model_set_modules(tovl_model *model, const char *embed_module, const char *lmhead_module);
TOVL_API const tovl_model_info *tovl_model_get_info(const tovl_model *model);
/* Base rows, bf16 [hidden]; NULL when id >= vocab. Tied: lmhead == embed. */
TOVL_API const uint16_t *tovl_model_embed_row(const tovl_model *model, uint32_t id);
TOVL_API const uint16_t *tovl_model_lmhead_row(const tovl_model *model, uint32_t id);
/* The base lm_head product on the host: logits[t * vocab + v] =
 * dot(hidden[t, :], lm_head row v) in f32, in the spec's fixed dot order, on
 * the CPU backend's kernels (every core, the CPU's vector width; the
 * TOVL_CPU_THREADS and TOVL_CPU_SIMD variables apply).
 * `hidden` is bf16 [T, hidden]; `logits` holds T * vocab floats. */
TOVL_API tovl_status tovl_model_lmhead_product(const tovl_model *model, const uint16_t *hidden, uint32_t T,
                                               float *logits);

/* An adapter folder: adapter_config.json with adapter_model.safetensors
 * (PEFT: LoRA's trainable_token_indices and modules_to_save, or the
 * standalone Trainable Tokens method, peft_type TRAINABLE_TOKENS), and/or
 * new_embeddings.safetensors (vLLM's extra vocabulary). Opening parses and
 * validates the files; it needs no model. docs/ADAPTERS.md lists every
 * format and rule. */
typedef struct tovl_adapter tovl_adapter;

/* Where overlay rows come from. */
typedef enum tovl_adapter_source_kind {
    TOVL_SOURCE_TRAINABLE_TOKENS = 0, /* PEFT trainable_tokens_delta (LoRA's trainable_token_indices or the
                                         TRAINABLE_TOKENS method): replacement rows for listed ids */
    TOVL_SOURCE_MODULES_TO_SAVE = 1,  /* PEFT modules_to_save: the module's full matrix (a copy) */
    TOVL_SOURCE_SAVED_BASE = 2,       /* a saved (resized) base layer, loaded into the base weight */
    TOVL_SOURCE_VLLM_EXTRA_VOCAB = 3  /* new_embeddings.safetensors: rows for ids base_vocab + k */
} tovl_adapter_source_kind;

typedef enum tovl_adapter_module {
    TOVL_MODULE_EMBED = 0,  /* the input embedding (embed_tokens, embed_in, wte, word_embeddings, embeddings) */
    TOVL_MODULE_LMHEAD = 1  /* the output projection (lm_head, embed_out) */
} tovl_adapter_module;

typedef struct tovl_adapter_source {
    tovl_adapter_source_kind kind;
    tovl_adapter_module module;
    const char *file;         /* path of the safetensors file */
    const char *tensor;       /* tensor name */
    const char *dtype;
    uint32_t rows, width;     /* the tensor's shape */
    const uint32_t *ids;      /* trainable tokens: the config's ids [rows]; else NULL */
    const char *config_field; /* the adapter_config.json field that declared it ("trainable_token_indices",
                                 "trainable_token_indices.lm_head", "token_indices", ...), or NULL */
    const char *module_path;  /* the module it sits on, "base_model.model." removed ("gpt_neox.embed_in");
                                 NULL for vLLM rows (they name no module) */
} tovl_adapter_source;

typedef struct tovl_adapter_info {
    const char *dir;
    const char *format;         /* "peft trainable_token_indices", "peft TRAINABLE_TOKENS" (the standalone
                                   method), "peft modules_to_save", "peft saved embedding layers",
                                   "vllm new_embeddings", joined with " + "; "none" when the adapter has
                                   no token overlay */
    bool ensure_weight_tying;   /* adapter_config.json ensure_weight_tying */
    size_t source_count;
    const tovl_adapter_source *sources;
    size_t other_tensors;       /* tensors that are not token overlays (LoRA matrices, ...) */
} tovl_adapter_info;

TOVL_API tovl_status tovl_adapter_open(const char *dir, tovl_adapter **out);
TOVL_API void tovl_adapter_close(tovl_adapter *adapter);
TOVL_API const tovl_adapter_info *tovl_adapter_get_info(const tovl_adapter *adapter);

/* An adapter resolved against a base model: the host rows of its overlay,
 * exactly what PEFT computes for this model (tied rules included). Full
 * matrices are uploaded and compared with the base on `backend` with rowdiff
 * (tol 0), keeping only the changed rows. */
typedef struct tovl_adapter_rows tovl_adapter_rows;

typedef struct tovl_adapter_rows_info {
    /* Ready for tovl_build_overlay (points into the object): vocab and hidden
     * are the model's, ids increase, `tied` is the model's. */
    tovl_overlay_desc desc;
    const char *embed_sources;   /* the tensors the embed rows came from, "" when none */
    const char *lmhead_sources;
    const char *lmhead_rule;     /* one line: how the lm_head part was decided */
    size_t warning_count;        /* e.g. rows beyond the served vocab, dropped */
    const char *const *warnings;
} tovl_adapter_rows_info;

TOVL_API tovl_status tovl_adapter_resolve(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                          const tovl_adapter *adapter, const tovl_model *model,
                                          tovl_adapter_rows **out);
TOVL_API void tovl_adapter_rows_free(tovl_adapter_rows *rows);
TOVL_API const tovl_adapter_rows_info *tovl_adapter_rows_get_info(const tovl_adapter_rows *rows);

/* tovl_adapter_resolve then tovl_build_overlay. */
TOVL_API tovl_status tovl_adapter_build_overlay(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                                const tovl_adapter *adapter, const tovl_model *model,
                                                tovl_embed_overlay **out);

#ifdef __cplusplus
}
#endif
#endif /* TOVL_TOVL_H */
