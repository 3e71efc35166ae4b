/* A small pthread pool: its workers start once (at backend open) and sleep on
 * a condition variable between runs. A run wakes them and works itself; the
 * work is shared through the job's own atomic counter, so the caller alone can
 * finish it. A worker joins only while the run is open: when the caller is
 * done it closes the run and waits for the workers that joined, never for one
 * the scheduler has not woken yet (on a loaded machine that could take a time
 * slice of milliseconds). Nothing allocates after creation, so the hooks stay
 * allocation-free. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_simd.h"
#include "tovl/backend.h"

#define TOVL_CPU_MAX_THREADS 1024u

typedef struct pool_worker {
    tovl_cpu_pool *pool;
    unsigned index; /* 1 .. threads - 1; the caller is 0 */
    pthread_t thread;
} pool_worker;

struct tovl_cpu_pool {
    unsigned threads;      /* the caller included */
    unsigned started;      /* workers whose thread runs */
    pthread_mutex_t busy;  /* held by the thread running the pool */
    pthread_mutex_t lock;  /* guards everything below */
    pthread_cond_t wake, done;
    uint64_t generation;   /* bumped per run */
    unsigned want;         /* participants of this run, the caller included */
    bool open;             /* workers may still join this run */
    unsigned active;       /* workers that joined this run and are not done */
    bool stop;
    tovl_cpu_pool_fn fn;
    void *ctx;
    pool_worker workers[]; /* threads - 1 */
};

static void *worker_main(void *arg) {
    pool_worker *w = arg;
    tovl_cpu_pool *p = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && p->generation == seen) {
            pthread_cond_wait(&p->wake, &p->lock);
        }
        if (p->stop) {
            break;
        }
        seen = p->generation;
        if (!p->open || w->index >= p->want) {
            continue; /* too late for this run, or not in it */
        }
        p->active++;
        tovl_cpu_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->lock);
        fn(ctx, w->index);
        pthread_mutex_lock(&p->lock);
        if (--p->active == 0 && !p->open) {
            pthread_cond_signal(&p->done);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

tovl_status tovl_cpu_threads_from_env(unsigned *out) {
    const char *v = getenv("TOVL_CPU_THREADS");
    if (v && *v) {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (errno || *end || v[0] == '-' || n < 1 || n > TOVL_CPU_MAX_THREADS) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "TOVL_CPU_THREADS=%s: expected a thread count 1 .. %u", v,
                              TOVL_CPU_MAX_THREADS);
        }
        *out = (unsigned)n;
        return TOVL_OK;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    *out = online < 1 ? 1u : online > (long)TOVL_CPU_MAX_THREADS ? TOVL_CPU_MAX_THREADS : (unsigned)online;
    return TOVL_OK;
}

tovl_status tovl_cpu_pool_create(unsigned threads, tovl_cpu_pool **out) {
    *out = NULL;
    if (threads < 1 || threads > TOVL_CPU_MAX_THREADS) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cpu: thread count %u outside 1 .. %u", threads,
                          TOVL_CPU_MAX_THREADS);
    }
    tovl_cpu_pool *p = calloc(1, sizeof *p + (threads - 1) * sizeof p->workers[0]);
    if (!p) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: out of host memory for a pool of %u threads", threads);
    }
    p->threads = threads;
    pthread_mutex_init(&p->busy, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (unsigned i = 1; i < threads; i++) {
        pool_worker *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            tovl_cpu_pool_destroy(p);
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "cpu: pthread_create of worker %u of %u: %s", i, threads,
                              strerror(rc));
        }
        p->started = i;
    }
    *out = p;
    return TOVL_OK;
}

void tovl_cpu_pool_destroy(tovl_cpu_pool *p) {
    if (!p) {
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->started; i++) {
        pthread_join(p->workers[i].thread, NULL);
    }
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->busy);
    free(p);
}

unsigned tovl_cpu_pool_threads(const tovl_cpu_pool *p) {
    return p ? p->threads : 1u;
}

void tovl_cpu_pool_run(tovl_cpu_pool *p, unsigned want, tovl_cpu_pool_fn fn, void *ctx) {
    if (!p || p->threads == 1 || want <= 1 || pthread_mutex_trylock(&p->busy) != 0) {
        fn(ctx, 0); /* alone: no pool, one thread wanted, or the pool is busy */
        return;
    }
    want = want < p->threads ? want : p->threads;
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->want = want;
    p->open = true;
    p->active = 0;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    fn(ctx, 0);
    pthread_mutex_lock(&p->lock);
    p->open = false;
    while (p->active) {
        pthread_cond_wait(&p->done, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->busy);
}
