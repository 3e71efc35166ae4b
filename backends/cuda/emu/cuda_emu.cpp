/*
 * The fiber runtime behind cuda_emu.h: one block at a time, one fiber per CUDA
 * thread, switching only at barriers and warp collectives.
 */
#include "cuda_emu.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu_api.h"
#include "emu_kernels.h"
#include "tovl/backend.h"

/* Switching between fibers. On x86-64 a few instructions that save the
 * callee-saved registers and swap stacks; elsewhere, and under
 * AddressSanitizer (which must see stack switches), ucontext, whose every
 * switch also costs a system call for the signal mask. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TOVL_EMU_FAST_SWITCH 1
extern "C" void tovl_emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".p2align 4\n"
        ".hidden tovl_emu_switch\n"
        ".globl tovl_emu_switch\n"
        ".type tovl_emu_switch, @function\n"
        "tovl_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size tovl_emu_switch, .-tovl_emu_switch\n");
#else
#define TOVL_EMU_FAST_SWITCH 0
#include <ucontext.h>
#endif

namespace tovl_emu {
namespace {

constexpr size_t STACK_BYTES = 128 * 1024;

struct Context {
#if TOVL_EMU_FAST_SWITCH
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
};

/* Make `c` start `entry` (which never returns) on `stack`. */
void context_start(Context &c, std::vector<char> &stack, void (*entry)()) {
#if TOVL_EMU_FAST_SWITCH
    uintptr_t top = ((uintptr_t)stack.data() + stack.size()) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;              /* entry's return address: it never returns */
    *--sp = (void *)entry;        /* where tovl_emu_switch's ret lands */
    for (int i = 0; i < 6; i++) { /* rbp, rbx, r12..r15 */
        *--sp = nullptr;
    }
    c.sp = sp;
#else
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack.data();
    c.uc.uc_stack.ss_size = stack.size();
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
#endif
}

void context_switch(Context &save, Context &load) {
#if TOVL_EMU_FAST_SWITCH
    tovl_emu_switch(&save.sp, load.sp);
#else
    swapcontext(&save.uc, &load.uc);
#endif
}
/* Lanes per warp: 32 (NVIDIA; RDNA's wave32) or 64 (CDNA's wave64), per launch. */
constexpr unsigned MAX_WARP = 64;

enum class State { Ready, Waiting, Done };

/* A 16-byte cp.async in flight: its source is read when it is issued, its
 * destination written when a wait completes its group. */
struct AsyncCopy {
    void *dst;
    unsigned char data[16];
};

struct Fiber {
    Context context;
    std::vector<char> stack;
    emu_dim3 tid;
    unsigned warp = 0, lane = 0;
    State state = State::Ready;
    std::vector<AsyncCopy> open;                 /* issued since the last commit */
    std::deque<std::vector<AsyncCopy>> groups;   /* committed, oldest first */
};

/* Closes a fiber's open group of copies (cp.async.commit_group). */
void commit_open(Fiber &f) {
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}

/* Lands the copies of a fiber's oldest committed groups until `pending` are left. */
void land_groups(Fiber &f, size_t pending) {
    while (f.groups.size() > pending) {
        for (const AsyncCopy &c : f.groups.front()) {
            memcpy(c.dst, c.data, sizeof c.data);
        }
        f.groups.pop_front();
    }
}

/* A barrier: the waiting fibers resume once `expected` have arrived. */
struct Gate {
    unsigned arrived = 0;
    std::vector<Fiber *> waiting;
};

/* A warp's collective in progress: what kind, and each lane's value. */
struct WarpCollective {
    Gate deposit, collect;
    const char *op = nullptr;
    uint32_t value[MAX_WARP];
};

struct Launch {
    KernelThunk kernel = nullptr;
    const void *args = nullptr;
    emu_dim3 grid{}, block{}, block_index{};
    unsigned warp = 32; /* lanes per warp of this launch */
    std::vector<Fiber> fibers;
    std::vector<WarpCollective> warps;
    Gate block_gate;
    unsigned done = 0;
    Context scheduler;
    Fiber *current = nullptr;
    std::mt19937_64 order;
    bool failed = false;
    std::string error;
};

Launch *g_launch;

[[noreturn]] void stop(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Record the first error and abandon the running fiber for good. */
void stop(const char *fmt, ...) {
    Launch &L = *g_launch;
    if (!L.failed) {
        char text[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        char where[96];
        snprintf(where, sizeof where, " (block %u,%u,%u thread %u,%u,%u)", L.block_index.x, L.block_index.y,
                 L.block_index.z, L.current ? L.current->tid.x : 0, L.current ? L.current->tid.y : 0,
                 L.current ? L.current->tid.z : 0);
        L.error = std::string(text) + where;
        L.failed = true;
    }
    context_switch(L.current->context, L.scheduler);
    abort(); /* never resumed */
}

void yield() {
    Launch &L = *g_launch;
    context_switch(L.current->context, L.scheduler);
}

/* Arrive at `gate` of `expected` fibers and wait for the others. */
void arrive(Gate &gate, unsigned expected) {
    Fiber *self = g_launch->current;
    if (++gate.arrived == expected) {
        for (Fiber *f : gate.waiting) {
            f->state = State::Ready;
        }
        gate.waiting.clear();
        gate.arrived = 0;
        self->state = State::Ready;
    } else {
        self->state = State::Waiting;
        gate.waiting.push_back(self);
    }
    yield();
}

unsigned lanes_in_warp(unsigned warp) {
    const Launch &L = *g_launch;
    const unsigned threads = (unsigned)L.fibers.size();
    return std::min(L.warp, threads - warp * L.warp);
}

/* The mask naming every lane of a warp of this launch. */
uint64_t all_lanes() {
    return g_launch->warp == 64 ? ~(uint64_t)0 : 0xFFFFFFFFu;
}

/* Enter a warp collective: all lanes must be alive and do the same one. */
WarpCollective &collective_begin(const char *op, uint64_t mask, uint32_t value) {
    Launch &L = *g_launch;
    Fiber *self = L.current;
    const unsigned lanes = lanes_in_warp(self->warp);
    if (mask != all_lanes()) {
        stop("%s with mask 0x%llx in a warp of %u lanes: the kernels use full warps only", op,
             (unsigned long long)mask, L.warp);
    }
    for (unsigned l = 0; l < lanes; l++) {
        if (L.fibers[self->warp * L.warp + l].state == State::Done) {
            stop("%s while lane %u of the warp has exited", op, l);
        }
    }
    WarpCollective &c = L.warps[self->warp];
    if (c.deposit.arrived == 0) {
        c.op = op;
    } else if (c.op != op) {
        stop("%s while other lanes of the warp are in %s", op, c.op);
    }
    c.value[self->lane] = value;
    arrive(c.deposit, lanes);
    return c;
}

/* Leave it once every lane has read the values. */
void collective_end(WarpCollective &c) {
    arrive(c.collect, lanes_in_warp(g_launch->current->warp));
}

void fiber_entry() {
    Launch &L = *g_launch;
    L.kernel(L.args);
    Fiber *self = L.current;
    /* Copies still in flight land after the thread (nothing reads them). */
    commit_open(*self);
    land_groups(*self, 0);
    self->state = State::Done;
    L.done++;
    if (!L.block_gate.waiting.empty()) {
        stop("thread exited while %zu threads wait at __syncthreads", L.block_gate.waiting.size());
    }
    if (!L.warps[self->warp].deposit.waiting.empty()) {
        stop("thread exited while its warp waits in %s", L.warps[self->warp].op);
    }
    yield();
}

std::string describe_deadlock() {
    const Launch &L = *g_launch;
    std::string text = "deadlock: " + std::to_string(L.block_gate.waiting.size()) + " threads at __syncthreads";
    for (size_t w = 0; w < L.warps.size(); w++) {
        if (!L.warps[w].deposit.waiting.empty()) {
            text += ", warp " + std::to_string(w) + ": " + std::to_string(L.warps[w].deposit.waiting.size()) +
                    " lanes in " + L.warps[w].op;
        }
    }
    return text + ", " + std::to_string(L.done) + " exited";
}

/* Run one block to completion (or to the first error). */
bool run_block() {
    Launch &L = *g_launch;
    L.block_gate = Gate{};
    for (WarpCollective &c : L.warps) {
        c = WarpCollective{};
    }
    L.done = 0;
    for (Fiber &f : L.fibers) {
        context_start(f.context, f.stack, fiber_entry);
        f.state = State::Ready;
        f.open.clear();
        f.groups.clear();
    }
    std::vector<Fiber *> ready;
    for (;;) {
        ready.clear();
        for (Fiber &f : L.fibers) {
            if (f.state == State::Ready) {
                ready.push_back(&f);
            }
        }
        if (ready.empty()) {
            if (L.done != L.fibers.size()) {
                L.failed = true;
                L.error = describe_deadlock();
            }
            return !L.failed;
        }
        std::shuffle(ready.begin(), ready.end(), L.order);
        for (Fiber *f : ready) {
            if (f->state != State::Ready) {
                continue;
            }
            L.current = f;
            context_switch(L.scheduler, f->context);
            if (L.failed) {
                return false;
            }
        }
    }
}

} // namespace

const emu_dim3 &thread_idx() {
    return g_launch->current->tid;
}
const emu_dim3 &block_idx() {
    return g_launch->block_index;
}
const emu_dim3 &block_dim() {
    return g_launch->block;
}
const emu_dim3 &grid_dim() {
    return g_launch->grid;
}
unsigned warp_size() {
    return g_launch->warp;
}

void copy_async16(void *shared_dst, const void *global_src) {
    check_aligned(shared_dst, 16);
    check_aligned(global_src, 16);
    AsyncCopy c;
    c.dst = shared_dst;
    memcpy(c.data, global_src, sizeof c.data);
    g_launch->current->open.push_back(c);
    /* Until a wait lands it, the destination reads as poison: code that
     * reads it earlier (a wait or a barrier missing) sees wrong values. */
    memset(shared_dst, ASYNC_POISON, sizeof c.data);
}

void copy_async_commit() {
    commit_open(*g_launch->current);
}

void copy_async_wait(unsigned pending) {
    land_groups(*g_launch->current, pending);
}

void syncthreads() {
    Launch &L = *g_launch;
    if (L.done) {
        stop("__syncthreads after %u threads of the block exited", L.done);
    }
    arrive(L.block_gate, (unsigned)L.fibers.size());
}

void syncwarp(uint64_t mask) {
    collective_end(collective_begin("__syncwarp", mask, 0));
}

uint64_t ballot(uint64_t mask, bool predicate) {
    WarpCollective &c = collective_begin("ballot", mask, predicate);
    uint64_t result = 0;
    for (unsigned l = 0; l < lanes_in_warp(g_launch->current->warp); l++) {
        result |= (uint64_t)(c.value[l] ? 1u : 0u) << l;
    }
    collective_end(c);
    return result;
}

uint64_t match_any(uint64_t mask, uint32_t value) {
    WarpCollective &c = collective_begin("__match_any_sync", mask, value);
    uint64_t result = 0;
    for (unsigned l = 0; l < lanes_in_warp(g_launch->current->warp); l++) {
        result |= (uint64_t)(c.value[l] == value ? 1u : 0u) << l;
    }
    collective_end(c);
    return result;
}

namespace {
/* The value lane `from` deposited; a lane past the warp (unsigned wrap
 * included, for shfl_up) keeps its own, as CUDA's and HIP's shuffles do. */
uint32_t shuffle_from(const char *op, uint64_t mask, uint32_t bits, unsigned from) {
    WarpCollective &c = collective_begin(op, mask, bits);
    const uint32_t result = from < g_launch->warp ? c.value[from] : bits;
    collective_end(c);
    return result;
}

/* Shuffles over segments of `width` lanes (a power of two, at most the
 * warp): lane `lane`'s segment starts at its lane rounded down to width. */
unsigned segment_base(unsigned width) {
    const unsigned w = width == 0 || width > g_launch->warp ? g_launch->warp : width;
    if (w & (w - 1)) {
        stop("shuffle width %u is not a power of two", width);
    }
    return g_launch->current->lane & ~(w - 1);
}
unsigned segment_width(unsigned width) {
    return width == 0 || width > g_launch->warp ? g_launch->warp : width;
}
} // namespace

uint32_t shfl_idx(uint64_t mask, uint32_t bits, unsigned src_lane, unsigned width) {
    /* The source lane is taken modulo the segment width. */
    return shuffle_from("shfl", mask, bits, segment_base(width) + src_lane % segment_width(width));
}

uint32_t shfl_down(uint64_t mask, uint32_t bits, unsigned delta, unsigned width) {
    const unsigned base = segment_base(width), lane = g_launch->current->lane;
    const unsigned from = lane - base + delta < segment_width(width) ? lane + delta : UINT32_MAX;
    return shuffle_from("shfl_down", mask, bits, from);
}

uint32_t shfl_up(uint64_t mask, uint32_t bits, unsigned delta, unsigned width) {
    const unsigned base = segment_base(width), lane = g_launch->current->lane;
    const unsigned from = lane - base >= delta ? lane - delta : UINT32_MAX;
    return shuffle_from("shfl_up", mask, bits, from);
}

uint32_t shfl_xor(uint64_t mask, uint32_t bits, unsigned lane_mask, unsigned width) {
    const unsigned base = segment_base(width), lane = g_launch->current->lane;
    const unsigned from = lane ^ lane_mask;
    return shuffle_from("shfl_xor", mask, bits, from - base < segment_width(width) ? from : lane);
}

void check_aligned(const void *p, size_t alignment) {
    if ((uintptr_t)p % alignment != 0) {
        stop("misaligned %zu-byte access at %p", alignment, p);
    }
}

} // namespace tovl_emu

namespace tovl_emu {

tovl_status run_kernel(const char *port, const char *function, KernelThunk kernel, const uint32_t grid[3],
                       const uint32_t block[3], const void *args, uint64_t seed, unsigned warp) {
    if (!kernel) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s-emu: no kernel named %s", port, function);
    }
    if (warp != 32 && warp != 64) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s-emu: warp width %u (32 or 64)", port, warp);
    }
    const uint64_t threads = (uint64_t)block[0] * block[1] * block[2];
    if (threads == 0 || threads > 1024 || threads % warp != 0) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s-emu: %s with %llu threads per block (whole warps of %u)", port,
                          function, (unsigned long long)threads, warp);
    }
    static Launch launch;
    Launch &L = launch;
    g_launch = &L;
    L.kernel = kernel;
    L.args = args;
    L.grid = {grid[0], grid[1], grid[2]};
    L.block = {block[0], block[1], block[2]};
    L.warp = warp;
    L.failed = false;
    L.error.clear();
    L.order.seed(seed);
    L.fibers.resize(threads);
    L.warps.resize(threads / warp);
    unsigned i = 0;
    for (unsigned z = 0; z < block[2]; z++) {
        for (unsigned y = 0; y < block[1]; y++) {
            for (unsigned x = 0; x < block[0]; x++, i++) {
                Fiber &f = L.fibers[i];
                if (f.stack.empty()) {
                    f.stack.resize(STACK_BYTES);
                }
                f.tid = {x, y, z};
                f.warp = i / warp;
                f.lane = i % warp;
            }
        }
    }
    for (unsigned z = 0; z < grid[2]; z++) {
        for (unsigned y = 0; y < grid[1]; y++) {
            for (unsigned x = 0; x < grid[0]; x++) {
                L.block_index = {x, y, z};
                if (!run_block()) {
                    return tovl_error(TOVL_ERR_LAUNCH, "%s-emu: %s (warp of %u): %s", port, function, warp,
                                      L.error.c_str());
                }
            }
        }
    }
    return TOVL_OK;
}

} // namespace tovl_emu

extern "C" tovl_status tovl_cuda_emu_launch(const char *function, const uint32_t grid[3], const uint32_t block[3],
                                            const void *args, uint64_t seed) {
    /* NVIDIA's warps are 32 wide: the CUDA port's kernels assume it. */
    return tovl_emu::run_kernel("cuda", function, tovl_emu::find_kernel(function), grid, block, args, seed, 32);
}

extern "C" void tovl_cuda_emu_set_sm_count(uint32_t sms) {
    tovl_emu::set_sm_count(sms);
}
