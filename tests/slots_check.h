/*
 * The in-place slots check, shared by every backend's tests: a fixed-shape set
 * whose three hooks (embed, lm_head bf16, lm_head f32) are recorded once while
 * every slot is empty, then many rounds of random loads, unloads and reloads
 * of random adapters (row counts up to the capacity, embed-only, lm_head-only,
 * both, an explicitly empty lm_head), each followed by a replay of what was
 * recorded. Every replay's outputs must equal, bit for bit, what a from_slots
 * set of the same adapters gives on the CPU reference, with the poisoned
 * guards around every output untouched.
 *
 * A backend's test supplies how the hooks are recorded and replayed (a CUDA
 * graph, a Vulkan command buffer; slots_eager_replayer calls the hooks again)
 * and the stream loads are ordered on.
 */
#ifndef TOVL_TEST_SLOTS_CHECK_H
#define TOVL_TEST_SLOTS_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "tovl/tovl.h"

/* The three hook calls a replay runs; then, for the shard check, those of
 * the sets `next` leads to (NULL: none). */
typedef struct slots_hooks {
    const tovl_token_overlay_set *set;
    const tovl_overlay_kernels *kernels;
    tovl_embed_hook_args embed;
    tovl_lmhead_hook_args lm_bf16, lm_f32;
    const struct slots_hooks *next;
} slots_hooks;

typedef struct slots_replayer {
    /* Record the hooks once; `hooks` stays valid for the whole check. */
    void (*record)(void *user, const slots_hooks *hooks);
    /* Run what was recorded, and wait until it is done. */
    void (*replay)(void *user);
    /* The stream loads and unloads are ordered on (NULL: the backend's own). */
    void *load_stream;
    void *user;
} slots_replayer;

/* Remembers the hooks and calls them again on `stream` (NULL: the backend's
 * own) at each replay, then synchronizes it: for backends without graphs. */
typedef struct slots_eager {
    tovl_backend *be;
    void *stream;
    const slots_hooks *hooks;
} slots_eager;
slots_replayer slots_eager_replayer(slots_eager *state);
/* Enqueue the three hooks of `hooks` and of every set after it on `stream`
 * (a Criterion assertion on each). */
void slots_enqueue(const slots_hooks *hooks, void *stream);

typedef struct slots_config {
    uint32_t rounds;
    bool tied;
    uint32_t capacity; /* embed and lm_head capacity of each slot */
    /* 0, or: adapters past the first two hold 1 .. few_rows rows each, so that
     * the most rows a slot holds crosses few_rows from round to round (the
     * CUDA port's gated pair, backends/cuda/launch_shape.h); the check then
     * expects rounds on both sides. */
    uint32_t few_rows;
} slots_config;

/* The check above on `be`; `tag` names it in messages. */
void slots_check_rounds(tovl_backend *be, const slots_replayer *replayer, const slots_config *cfg, const char *tag);

/* The same rounds over vocab shards: for every world size N = 1 .. 8, one
 * fixed-shape shard set per rank (tovl_token_overlay_set_create_shard, vLLM's
 * split of `vocab` padded to 64), all recorded once while empty, every load
 * and unload applied to the same slot of every set. After each replay, each
 * N's shards of the bf16 and f32 logits, concatenated, and each rank's embed
 * output equal an unsharded from_slots set's on the CPU reference, bit for
 * bit; the pad columns past each shard's width and the guards are untouched.
 * A rank whose shard is padding only has no set, as in an engine. Adapters
 * mix ids in increasing order (the importer's) and shuffled, with every
 * shard edge of every N among them. */
typedef struct slots_shard_config {
    uint32_t rounds;
    bool tied;
    uint32_t vocab;
    uint32_t capacity;
} slots_shard_config;
void slots_check_shards(tovl_backend *be, const slots_replayer *replayer, const slots_shard_config *cfg,
                        const char *tag);

/* A loader thread loads A, loads B and unloads slot 0 of a one-slot set in a
 * loop while this thread runs both hooks `replays` times on the backend's own
 * stream: each hook's output must equal what it gives with the slot empty,
 * holding A or holding B, never a mix. NULL when it holds, else why not
 * (slots_threads.c: no Criterion call, for the ThreadSanitizer run). */
const char *slots_threaded_run(tovl_backend *be, const char *tag, uint32_t replays);

#endif
