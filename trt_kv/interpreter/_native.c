/* The CPU interpreter's native helper: float16 conversions with the processor's own
 * instructions, products of rows against a weight, and attention (x86-64
 * AVX2, FMA and F16C; AVX-512 where the processor has it, for the panel product).
 *
 * Conversions. NumPy converts float16 one element at a time in C (~2-3 ns an element); these
 * convert eight at a time (~0.2 ns). Results are NumPy's bits exactly: finite values and
 * infinities are IEEE round-to-nearest-even either way; NaN, where the instructions and NumPy
 * differ (the instructions set the quiet bit, NumPy keeps the payload as it is), is redone in
 * NumPy's way by the scalar code below.
 *
 * Products. out [M, N] = x [M, K] @ w^T for a weight w [N, K] (nn.Linear layout), float16 or
 * float32, and M up to a decode step's batch: each weight element is read from memory once
 * (float16 as its 2 bytes, widened in registers, exact, where NumPy would need the weight
 * widened to float32 first), in one sequential stream up to 4 rows (see STREAM_ROWS), else the
 * next tile of weight rows fetched while this one is multiplied: memory is what a decode step
 * is bound by. Each output element is one float32 sum
 * in a fixed order (eight running lanes over K, then the lanes, then the K % 8 tail), so it
 * does not depend on which other rows or weight rows are computed in the same call. Products
 * of many rows (trt_kv_panels_*, a prefill chunk) are computed like a matrix product instead,
 * each element's sum in another fixed order (see PANEL), with AVX-512 where the processor has
 * it (trt_kv_panels_wide_*: the same bits).
 *
 * Loaded with ctypes by trt_kv/interpreter/native.py (no Python API here); built by
 * setup.py as an optional extension: without a C compiler, or on another processor, half.py
 * keeps its NumPy recipes. trt_kv_native_ready() says whether this processor can run the
 * rest: 0 if not, else the version of these functions' signatures; trt_kv_native_source()
 * gives the sha256 of this file as it was built. native.py loads a build only when
 * both are its own (a build left from an older checkout is passed over).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#ifndef TRT_KV_NATIVE_SOURCE
#define TRT_KV_NATIVE_SOURCE "" /* built by hand, not by setup.py: no hash to compare */
#endif

const char *trt_kv_native_source(void) { return TRT_KV_NATIVE_SOURCE; }

/* NumPy's float32 -> float16 bits for a NaN: the payload's top 10 bits, never all zero. */
static uint16_t nan_to_half(uint32_t f) {
    uint16_t h = (uint16_t)(((f >> 16) & 0x8000u) | 0x7c00u | ((f & 0x007fffffu) >> 13));
    return (h & 0x03ffu) ? h : (uint16_t)(h | 1u);
}

/* NumPy's float16 -> float32 bits for an infinity or NaN: the payload moved up as it is. */
static uint32_t special_to_float(uint16_t h) {
    return ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x03ffu) << 13);
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define F16C __attribute__((target("avx2,fma,f16c")))

#define SIGNATURES 14 /* change with any signature in this file */

int trt_kv_native_ready(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c")
               ? SIGNATURES
               : 0;
}

/* One float32 rounded to float16 and back, NumPy's bits (NaN included). */
F16C static float round_one(float x) {
    uint32_t f;
    memcpy(&f, &x, sizeof f);
    if ((f & 0x7fffffffu) > 0x7f800000u) { /* NaN */
        return bits_to_float(special_to_float(nan_to_half(f)));
    }
    __m128i h = _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT);
    return _mm_cvtss_f32(_mm_cvtph_ps(h));
}

/* y[i] = float32(float16(x[i])) for i < n, x and y contiguous (y may be x). */
F16C void trt_kv_round_float16(const float *x, float *y, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) { /* a NaN among them */
            for (size_t j = i; j < i + 8; j++) y[j] = round_one(x[j]);
            continue;
        }
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) y[i] = round_one(x[i]);
}

/* One float16 (as bits) widened to float32, NumPy's bits (NaN included). */
F16C static float widen_one(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u) return bits_to_float(special_to_float(h));
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* y[i] = float32(h[i]) for i < n, h (float16 bits) and y contiguous. */
F16C static void widen_run(const uint16_t *h, float *y, size_t n) {
    const __m128i exponent = _mm_set1_epi16(0x7c00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        __m128i e = _mm_and_si128(v, exponent);
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, exponent))) { /* an infinity or NaN */
            for (size_t j = i; j < i + 8; j++) y[j] = widen_one(h[j]);
            continue;
        }
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(v));
    }
    for (; i < n; i++) y[i] = widen_one(h[i]);
}

/* Rows of float16 (as bits) widened into y [rows, length], contiguous: row r of the input
 * starts at h + r * stride and holds length contiguous elements (a cache window). */
F16C void trt_kv_widen_float16(const uint16_t *h, size_t rows, size_t stride, size_t length,
                               float *y) {
    for (size_t r = 0; r < rows; r++) widen_run(h + r * stride, y + r * length, length);
}

/* The lanes of v summed in a fixed order. */
F16C static inline float lanes_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

/* -- a small pool of threads: a product's weight rows (N) split across them, never K, so
 * each element is the same sum whatever the count or whichever thread computes it ----------
 * A call's parts are claimed from a ticket (its generation and the next part) by the caller
 * and by every worker that wakes in time: on a busy machine, where a worker may wait for a
 * core, the caller runs the parts nobody took instead of waiting for it. */
typedef void (*range_fn)(void *arg, size_t lo, size_t hi);
#define MAX_THREADS 64
#define SPINS 20000 /* pauses a worker spins for the next call before it sleeps */
static struct {
    pthread_mutex_t call, lock; /* call: one caller at a time (others run alone) */
    pthread_cond_t wake;
    atomic_ulong generation;
    atomic_ulong ticket; /* generation << 24 | the call's parts << 12 | the next part to claim */
    atomic_size_t done;  /* parts of this call finished */
    int started;
    range_fn fn;
    void *arg;
    size_t n, unit, parts, threads; /* threads: those this call may run on (ids below) */
    unsigned long born[MAX_THREADS];
} pool = {.call = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static void part_range(size_t part, size_t *lo, size_t *hi) {
    size_t units = (pool.n + pool.unit - 1) / pool.unit;
    size_t a = units * part / pool.parts, b = units * (part + 1) / pool.parts;
    *lo = a * pool.unit;
    *hi = b * pool.unit < pool.n ? b * pool.unit : pool.n;
}

/* The ticket's fields: a call's parts and the next part to claim, 12 bits each (parts <=
 * MAX_THREADS * PARTS_A_THREAD), the generation above them. */
#define PART_BITS 12
#define PART_MASK ((1ul << PART_BITS) - 1)

/* Claim and run the parts of call g left unclaimed; none once g is over (a worker that woke
 * late finds the ticket of a later call, or no part left). The part count is read from the
 * ticket, never from pool.parts: the next call writes pool's fields before its ticket, and a
 * late worker comparing against them could claim a part of a call that is over and run it
 * with the next call's fields half written. */
static void run_parts(unsigned long g) {
    unsigned long t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    while (t >> 2 * PART_BITS == g && (t & PART_MASK) < (t >> PART_BITS & PART_MASK)) {
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1,
                                                   memory_order_acq_rel, memory_order_acquire))
            continue; /* t holds the ticket now: try again */
        size_t lo, hi;
        part_range(t & PART_MASK, &lo, &hi);
        if (lo < hi) pool.fn(pool.arg, lo, hi);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
}

static void *pool_worker(void *p) {
    size_t id = (size_t)p;
    unsigned long seen = pool.born[id]; /* the generation before its first call */
    for (;;) {
        unsigned long g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen &&
               spins++ < SPINS)
            _mm_pause();
        if (g == seen) {
            pthread_mutex_lock(&pool.lock);
            while ((g = atomic_load(&pool.generation)) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = g;
        if (id < pool.threads) run_parts(g);
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has none of the parent's workers */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    pool.call = pool.lock = fresh;
    pool.wake = cond;
    pool.started = 0;
}

#define PARTS_A_THREAD 4 /* parts a call is cut into, per thread: the caller takes those a
                            * worker late for a core leaves, and the threads even out */

/* fn(arg, lo, hi) over [0, n) on up to threads threads (this one included): in up to
 * PARTS_A_THREAD parts a thread, no more than n holds of least rows (rounded up), each as
 * even as whole units allow (a [576, 576] block product in two parts of 288 rows, not 464
 * and 112); alone when threads <= 1, when n is at most least rows, or while another call
 * runs. */
static void parallel(range_fn fn, void *arg, size_t n, size_t unit, size_t least,
                     size_t threads) {
    size_t units = (n + unit - 1) / unit, most = (n + least - 1) / least;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    size_t parts = threads * PARTS_A_THREAD < most ? threads * PARTS_A_THREAD : most;
    if (parts > units) parts = units;
    if (parts > threads) parts -= parts % threads; /* as many parts a thread: even shares */
    if (threads <= 1 || parts <= 1 || pthread_mutex_trylock(&pool.call)) {
        fn(arg, 0, n);
        return;
    }
    static int registered;
    if (!registered) registered = !pthread_atfork(NULL, NULL, pool_after_fork);
    while ((size_t)pool.started + 1 < threads) {
        pthread_t t;
        pool.born[pool.started + 1] = atomic_load(&pool.generation);
        if (pthread_create(&t, NULL, pool_worker, (void *)(size_t)(pool.started + 1))) break;
        pthread_detach(t);
        pool.started++;
    }
    pool.fn = fn, pool.arg = arg, pool.n = n, pool.unit = unit, pool.parts = parts;
    pool.threads = threads;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    unsigned long g = atomic_load(&pool.generation) + 1;
    atomic_store_explicit(&pool.ticket, g << 2 * PART_BITS | parts << PART_BITS,
                          memory_order_release);
    pthread_mutex_lock(&pool.lock);
    atomic_store_explicit(&pool.generation, g, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_parts(g);
    /* parts a worker took: spin, then yield (it may wait for a core mid-part) */
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < parts; spins++)
        if (spins < SPINS) _mm_pause();
        else sched_yield();
    pthread_mutex_unlock(&pool.call);
}

/* A product's operands, for the parts the pool runs (packed: the panels of x, or NULL). */
typedef struct {
    const void *w;
    size_t n, k;
    const float *x;
    size_t rows;
    float *out;
    const float *packed;
    size_t panels;
} dense_job;

/* Weight rows a part (a multiple of unit): at least ~64K weight elements, so that a small
 * product is not split into parts that cost more to hand out than to compute. */
static size_t part_rows(size_t k, size_t unit) {
    size_t rows = (65536 / (k ? k : 1) + unit - 1) / unit * unit;
    return rows > unit ? rows : unit;
}

#define TILE_W 4 /* weight rows a tile */
#define TILE_X 2 /* input rows a tile: TILE_W * TILE_X running sums, 8 of 16 registers */
/* Up to STREAM_ROWS input rows, the weight is read one row at a time against STREAM_X input
 * rows a tile (the weight row stays in L1 for the next tile): one sequential stream through
 * memory, which the processor's prefetcher follows at up to twice the rate of TILE_W rows read
 * side by side (measured on AMD EPYC: one input row ~26 against ~12.5 GB/s). With more rows
 * the arithmetic, no longer hidden behind memory, is what TILE_W x TILE_X tiles save. */
#define STREAM_X 4
#define STREAM_ROWS 4

/* Eight weight elements widened to float32: float16 with the conversion instruction. */
F16C static inline __m256 load8_float16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
F16C static inline __m256 load8_float32(const float *p) { return _mm256_loadu_ps(p); }
F16C static inline float one_float16(uint16_t h) { return widen_one(h); }
F16C static inline float one_float32(float f) { return f; }

/* tile_T: out[j * n + i] = x[j] . w[i] for i < nw (<= TILE_W) weight rows and j < nx
 * (<= TILE_X, or <= STREAM_X with one weight row) input rows, K = k; next: the weight rows of
 * the following tile, fetched into the cache meanwhile (with TILE_W rows side by side the
 * processor's prefetcher alone leaves the product waiting on memory), or NULL: none.
 * Always inlined with constant nw and nx: the loops unroll and the sums stay in registers.
 * trt_kv_product_T: out [rows, n] = x [rows, k] @ w^T for w [n, k] of type T, all three
 * contiguous; infinity or NaN in w gives what IEEE arithmetic gives (NaN payloads may differ
 * from NumPy's). */
#define PRODUCT(T, NAME)                                                                       \
    F16C static inline __attribute__((always_inline)) void tile_##NAME(                       \
        const T *w, size_t k, const float *x, size_t n, float *out, const size_t nw,         \
        const size_t nx, const T *next) {                                                     \
        __m256 acc[TILE_W][STREAM_X];                                                         \
        _Pragma("GCC unroll 4") for (size_t i = 0; i < nw; i++)                              \
            _Pragma("GCC unroll 4") for (size_t j = 0; j < nx; j++) acc[i][j] =             \
                _mm256_setzero_ps();                                                          \
        size_t c = 0;                                                                         \
        for (; c + 8 <= k; c += 8) {                                                          \
            __m256 xv[STREAM_X];                                                              \
            _Pragma("GCC unroll 4") for (size_t j = 0; j < nx; j++) xv[j] =                  \
                _mm256_loadu_ps(x + j * k + c);                                               \
            _Pragma("GCC unroll 4") for (size_t i = 0; i < nw; i++) {                        \
                __m256 wv = load8_##NAME(w + i * k + c);                                      \
                if (next) _mm_prefetch((const char *)(next + i * k + c), _MM_HINT_T0);        \
                _Pragma("GCC unroll 4") for (size_t j = 0; j < nx; j++) acc[i][j] =          \
                    _mm256_fmadd_ps(wv, xv[j], acc[i][j]);                                    \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 4") for (size_t i = 0; i < nw; i++)                              \
            _Pragma("GCC unroll 4") for (size_t j = 0; j < nx; j++) {                        \
            float s = lanes_sum(acc[i][j]);                                                   \
            for (size_t t = c; t < k; t++) s += one_##NAME(w[i * k + t]) * x[j * k + t];      \
            out[j * n + i] = s;                                                               \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    F16C static void product_rows_##NAME(const T *w, size_t n, size_t lo, size_t hi,          \
                                         size_t k, const float *x, size_t rows, float *out) { \
        if (rows <= STREAM_ROWS) {                                                            \
            for (size_t r = lo; r < hi; r++) {                                                \
                const T *wr = w + r * k;                                                      \
                size_t m = 0;                                                                 \
                for (; m + STREAM_X <= rows; m += STREAM_X)                                   \
                    tile_##NAME(wr, k, x + m * k, n, out + m * n + r, 1, STREAM_X, NULL);     \
                switch (rows - m) {                                                           \
                case 3: tile_##NAME(wr, k, x + m * k, n, out + m * n + r, 1, 3, NULL); break; \
                case 2: tile_##NAME(wr, k, x + m * k, n, out + m * n + r, 1, 2, NULL); break; \
                case 1: tile_##NAME(wr, k, x + m * k, n, out + m * n + r, 1, 1, NULL); break; \
                }                                                                             \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        size_t r = lo;                                                                        \
        for (; r + TILE_W <= hi; r += TILE_W) {                                               \
            const T *wr = w + r * k;                                                          \
            /* the next full tile to fetch, or this one again: every read stays inside w */   \
            const T *next = r + 2 * TILE_W <= hi ? wr + TILE_W * k : wr;                      \
            size_t m = 0;                                                                     \
            for (; m + TILE_X <= rows; m += TILE_X)                                           \
                tile_##NAME(wr, k, x + m * k, n, out + m * n + r, TILE_W, TILE_X, next);      \
            for (; m < rows; m++)                                                             \
                tile_##NAME(wr, k, x + m * k, n, out + m * n + r, TILE_W, 1, next);           \
        }                                                                                     \
        for (; r < hi; r++)                                                                   \
            for (size_t m = 0; m < rows; m++)                                                 \
                tile_##NAME(w + r * k, k, x + m * k, n, out + m * n + r, 1, 1, w + r * k);    \
    }                                                                                         \
                                                                                              \
    F16C static void product_part_##NAME(void *arg, size_t lo, size_t hi) {                   \
        const dense_job *j = arg;                                                             \
        product_rows_##NAME(j->w, j->n, lo, hi, j->k, j->x, j->rows, j->out);                 \
    }                                                                                         \
                                                                                              \
    F16C void trt_kv_product_##NAME(const T *w, size_t n, size_t k, const float *x,          \
                                    size_t rows, float *out, size_t threads) {                \
        dense_job j = {w, n, k, x, rows, out, NULL, 0};                                       \
        parallel(product_part_##NAME, &j, n, 16, part_rows(k, 16), threads);                   \
    }

PRODUCT(uint16_t, float16)
PRODUCT(float, float32)

/* Products of many rows (a prefill chunk): out [M, N] = x [M, K] @ w^T as above, computed
 * like a matrix product. x is first copied into panels of PANEL rows, each transposed
 * ([K][PANEL], rows past M zero); then each tile of weight rows (float16 widened into a float32
 * block first, exactly) is multiplied against every panel, one weight element broadcast
 * against the panel rows a step: with AVX2 (trt_kv_panels_*), PANEL_W weight rows against one
 * panel (two vectors of 8) in 12 of 16 registers; with AVX-512 (trt_kv_panels_wide_*, where
 * trt_kv_native_wide() says the processor has it), WIDE_W weight rows against two panels (a
 * vector of 16 each) in 24 of 32. The weight is read once; the panels (~300 KB at 128 rows of
 * 576) stay in L2. Each output element is one float32 sum over K in order (one lane of one
 * register, fused multiply-adds either way), whatever else is computed in the call: both give
 * the same bits. On one AMD EPYC (Zen 4) core here at 128 rows: ~80-90 GFLOPS with AVX2,
 * ~90-100 with AVX-512, against OpenBLAS's ~75-85 (which packs the weight first); about even
 * from 256 rows (linalg.panel_rows). */
#define PANEL 16  /* input rows a panel: two AVX2 vectors, one AVX-512 vector */
#define PANEL_W 6 /* AVX2: weight rows a tile, 6 x 2 running sums */
#define WIDE_W 12 /* AVX-512: weight rows a tile, 12 x 2 running sums (two panels) */
#define WIDE __attribute__((target("avx512f,avx2,fma,f16c")))

/* 1 when the processor (and the operating system) can run trt_kv_panels_wide_*, else 0. */
int trt_kv_native_wide(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
}

/* The eight vectors r[0..7] (rows of an 8 x 8 block) transposed in place: r[i] = column i. */
F16C static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* x [rows, k] copied into panels: panel p is [k][PANEL], its row j being x's row
 * p * PANEL + j (zero past rows). Eight whole rows go 8 x 8 blocks at a time, transposed in
 * registers (~2x faster than element by element); the rest element by element. */
F16C static void pack_panels(const float *x, size_t rows, size_t k, float *packed,
                             size_t panels) {
    for (size_t p = 0; p < panels; p++)
        for (size_t j = 0; j < PANEL; j += 8) {
            size_t row = p * PANEL + j, c = 0;
            float *dst = packed + p * PANEL * k + j;
            if (row + 8 <= rows)
                for (; c + 8 <= k; c += 8) {
                    __m256 r[8];
                    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] =
                        _mm256_loadu_ps(x + (row + i) * k + c);
                    transpose8(r);
                    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                        _mm256_storeu_ps(dst + (c + i) * PANEL, r[i]);
                }
            for (; c < k; c++)
                for (size_t i = 0; i < 8; i++)
                    dst[c * PANEL + i] = row + i < rows ? x[(row + i) * k + c] : 0.0f;
        }
}

/* The sums of weight row i (a row of PANEL or 2 * PANEL lanes, one per input row) written to
 * out's column i, rows below m. */
static inline void scatter(const float *sums, size_t i, float *out, size_t n, size_t m) {
    for (size_t j = 0; j < m; j++) out[j * n + i] = sums[j];
}

/* AVX2: nw (<= PANEL_W) weight rows against one panel (m <= PANEL of its rows written). Always
 * inlined with constant nw: the loops unroll and the sums stay in registers. */
F16C static inline __attribute__((always_inline)) void panel_tile(const float *w, size_t k,
                                                                  const float *panel, float *out,
                                                                  size_t n, size_t m,
                                                                  const int nw) {
    __m256 acc[PANEL_W][2];
    _Pragma("GCC unroll 6") for (int i = 0; i < nw; i++) acc[i][0] = acc[i][1] =
        _mm256_setzero_ps();
    for (size_t c = 0; c < k; c++) {
        __m256 x0 = _mm256_loadu_ps(panel + c * PANEL);
        __m256 x1 = _mm256_loadu_ps(panel + c * PANEL + 8);
        _Pragma("GCC unroll 6") for (int i = 0; i < nw; i++) {
            __m256 b = _mm256_broadcast_ss(w + i * k + c);
            acc[i][0] = _mm256_fmadd_ps(b, x0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(b, x1, acc[i][1]);
        }
    }
    float sums[PANEL];
    _Pragma("GCC unroll 6") for (int i = 0; i < nw; i++) {
        _mm256_storeu_ps(sums, acc[i][0]);
        _mm256_storeu_ps(sums + 8, acc[i][1]);
        scatter(sums, i, out, n, m);
    }
}

/* AVX-512: nw (<= WIDE_W) weight rows against np (1 or 2) panels, consecutive in packed
 * (m <= np * PANEL of their rows written); inlined with constant nw and np, as panel_tile. */
WIDE static inline __attribute__((always_inline)) void wide_tile(const float *w, size_t k,
                                                                 const float *panel, float *out,
                                                                 size_t n, size_t m, const int nw,
                                                                 const int np) {
    __m512 acc[WIDE_W][2];
    _Pragma("GCC unroll 12") for (int i = 0; i < nw; i++) acc[i][0] = acc[i][1] =
        _mm512_setzero_ps();
    for (size_t c = 0; c < k; c++) {
        __m512 x0 = _mm512_loadu_ps(panel + c * PANEL);
        __m512 x1 = np > 1 ? _mm512_loadu_ps(panel + (k + c) * PANEL) : x0;
        _Pragma("GCC unroll 12") for (int i = 0; i < nw; i++) {
            __m512 b = _mm512_set1_ps(w[i * k + c]);
            acc[i][0] = _mm512_fmadd_ps(b, x0, acc[i][0]);
            if (np > 1) acc[i][1] = _mm512_fmadd_ps(b, x1, acc[i][1]);
        }
    }
    float sums[2 * PANEL];
    _Pragma("GCC unroll 12") for (int i = 0; i < nw; i++) {
        _mm512_storeu_ps(sums, acc[i][0]);
        if (np > 1) _mm512_storeu_ps(sums + PANEL, acc[i][1]);
        scatter(sums, i, out, n, m);
    }
}

/* tiles_K: one tile of nw weight rows against the panels from panel on (m of their rows), with
 * the tile function of kind K (panels: AVX2, one panel; panels_wide: AVX-512, two). */
#define PANEL_CASE(NW)                                                                         \
    case NW: panel_tile(w, k, panel, out, n, m, NW); break;
F16C static void tiles_panels(const float *w, size_t nw, size_t k, const float *panel, float *out,
                              size_t n, size_t m) {
    switch (nw) {
        PANEL_CASE(6) PANEL_CASE(5) PANEL_CASE(4) PANEL_CASE(3) PANEL_CASE(2)
    default: panel_tile(w, k, panel, out, n, m, 1); break;
    }
}
#define WIDE_CASE(NW)                                                                          \
    case NW:                                                                                   \
        if (m > PANEL) wide_tile(w, k, panel, out, n, m, NW, 2);                               \
        else wide_tile(w, k, panel, out, n, m, NW, 1);                                         \
        break;
WIDE static void tiles_panels_wide(const float *w, size_t nw, size_t k, const float *panel,
                                   float *out, size_t n, size_t m) {
    switch (nw) {
        WIDE_CASE(12) WIDE_CASE(11) WIDE_CASE(10) WIDE_CASE(9) WIDE_CASE(8) WIDE_CASE(7)
        WIDE_CASE(6) WIDE_CASE(5) WIDE_CASE(4) WIDE_CASE(3) WIDE_CASE(2) WIDE_CASE(1)
    }
}

/* The weight rows of one tile as float32: float32 rows are used where they lie, float16 rows
 * widened into block (exactly, NumPy's bits: widen_run). */
F16C static inline const float *as_float32_float32(const float *w, size_t count, float *block) {
    (void)count, (void)block;
    return w;
}
F16C static inline const float *as_float32_float16(const uint16_t *w, size_t count, float *block) {
    widen_run(w, block, count);
    return block;
}

/* trt_kv_K_T: out [rows, n] = x [rows, k] @ w^T for w [n, k] of type T, all three contiguous,
 * in tiles of WIDTH weight rows against STEP panels (kind K, as tiles_K); returns 0, or -1
 * (nothing written) when the panels' memory cannot be had. */
#define PANELS(T, NAME, KIND, TARGET, WIDTH, STEP)                                             \
    TARGET static void KIND##_part_##NAME(void *arg, size_t lo, size_t hi) {                   \
        const dense_job *j = arg;                                                              \
        const T *w = j->w;                                                                     \
        const size_t k = j->k, n = j->n, rows = j->rows;                                       \
        float *block = malloc(WIDTH * k * sizeof(float) + 1); /* checked by the caller */     \
        if (!block) return;                                                                    \
        for (size_t r = lo; r < hi; r += WIDTH) {                                              \
            size_t nw = hi - r < WIDTH ? hi - r : WIDTH;                                       \
            const float *wf = as_float32_##NAME(w + r * k, nw * k, block);                     \
            for (size_t p = 0; p < j->panels; p += STEP) {                                     \
                size_t m = rows - p * PANEL < STEP * PANEL ? rows - p * PANEL : STEP * PANEL;  \
                const float *panel = j->packed + p * PANEL * k;                                \
                tiles_##KIND(wf, nw, k, panel, j->out + p * PANEL * n + r, n, m);              \
            }                                                                                  \
        }                                                                                      \
        free(block);                                                                           \
    }                                                                                          \
                                                                                               \
    TARGET int trt_kv_##KIND##_##NAME(const T *w, size_t n, size_t k, const float *x,          \
                                      size_t rows, float *out, size_t threads) {               \
        size_t panels = (rows + PANEL - 1) / PANEL;                                            \
        float *packed = malloc(panels * PANEL * k * sizeof(float) + 1); /* K 0 */              \
        void *probe = malloc(WIDTH * k * sizeof(float) + 1);                                   \
        if (!packed || !probe) {                                                               \
            free(packed), free(probe);                                                         \
            return -1;                                                                         \
        }                                                                                      \
        free(probe);                                                                           \
        pack_panels(x, rows, k, packed, panels);                                               \
        dense_job j = {w, n, k, x, rows, out, packed, panels};                                 \
        parallel(KIND##_part_##NAME, &j, n, WIDTH, part_rows(k, WIDTH), threads);                  \
        free(packed);                                                                          \
        return 0;                                                                              \
    }

PANELS(uint16_t, float16, panels, F16C, PANEL_W, 1)
PANELS(float, float32, panels, F16C, PANEL_W, 1)
PANELS(uint16_t, float16, panels_wide, WIDE, WIDE_W, 2)
PANELS(float, float32, panels_wide, WIDE, WIDE_W, 2)

/* e^x, 8 lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' expf polynomial (~1 ulp), times
 * 2^n. 0 below -87.3 (float32's smallest normal: the true value is a subnormal, < 1.2e-38)
 * and for -inf; +inf above 88 (e^88 is 1.7e38, float32's largest finite is 3.4e38); NaN
 * is not handled (the callers keep it apart). */
F16C static inline __m256 exp8(__m256 x) {
    const __m256 lowest = _mm256_set1_ps(-87.33654f), highest = _mm256_set1_ps(88.0f);
    __m256 under = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, highest, _CMP_GT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
    return _mm256_blendv_ps(_mm256_andnot_ps(under, y), _mm256_set1_ps(INFINITY), over);
}

/* y = 1 / (1 + e^-x) for float32 x [n] (y may be x): exp8 then one rounded addition and one
 * division, within ~3 ulps; NaN stays NaN, -inf gives 0, +inf 1, x < -88 the limit 0. */
F16C void trt_kv_sigmoid_float32(const float *x, float *y, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(s, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    }
    if (i < n) { /* the last few through one padded vector */
        float in[8] = {0}, out[8];
        memcpy(in, x + i, (n - i) * sizeof(float));
        trt_kv_sigmoid_float32(in, out, 8);
        memcpy(y + i, out, (n - i) * sizeof(float));
    }
}

/* Eight keep bytes as a lane mask (all ones where the byte is not 0). */
F16C static inline __m256 keep8(const uint8_t *keep) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)keep));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()));
}

/* Attention (scaled dot-product, GQA) of float32 rows against float32 keys and values, for the
 * fast plan: out [B, Nq, Sq, H] from q [B, Nq, Sq, H] (contiguous), k and v [B, Nkv, n, H]
 * (H contiguous, the other axes strided: a window of a cache [B, Nkv, S_max, H]) and keep
 * [B, KH, Sq, n] (bytes, contiguous; KH 1 or Nq: one mask for every head or one a head), which
 * says which keys each query row sees. Query head i reads KV head i / (Nq / Nkv). Rows go in
 * blocks of ATT_ROWS; a block's scores are computed only up to the last key one of its rows
 * sees (the keys transposed once per KV head, in blocks of 16: kt_at), so a key past the
 * causal diagonal costs nothing. Softmax as NumPy's reference does it (the peak subtracted;
 * exp8, within ~1 ulp of NumPy's exp), then the values weighted and summed and divided by the
 * total. A key no row of a block sees is never read (an unwritten cache row, NaN, cannot reach
 * any output); one another row of the block sees is read with weight 0. A row that sees no
 * key gives zeros; one whose seen scores hold NaN or +inf gives NaN (as the reference).
 * A decode step, up to ATT_ROWS query rows a KV head (group x Sq), skips the transposed copy,
 * which would cost it more than its scores: each key row is read where it lies and dotted
 * with the block's rows (direct_scores). The path depends on the shape only, never on B: each
 * row's result is the same whatever other rows and sequences the call holds. AVX2 only: the
 * step is bound by reading K and V (AVX-512 was not tried). */
#define ATT_ROWS 4 /* query rows whose scores are computed together */

/* One query row's softmax over its scores [0, seen) (seen a multiple of 16; keep padded with
 * 0 up to it), in place into weights; returns the total, 0 when the row sees no key or only
 * scores of -inf (the row is zeros), NaN when a seen score is NaN or +inf (the row is NaN). */
F16C static float softmax_row(float *scores, const uint8_t *keep, size_t seen, float scale) {
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    __m256 peak = minus_inf, bad = _mm256_setzero_ps();
    for (size_t j = 0; j < seen; j += 8) {
        __m256 m = keep8(keep + j), s = _mm256_loadu_ps(scores + j);
        if (scale != 1.0f) s = _mm256_mul_ps(s, sc);
        bad = _mm256_or_ps(bad, _mm256_and_ps(m, _mm256_cmp_ps(s, s, _CMP_UNORD_Q)));
        bad = _mm256_or_ps(bad, _mm256_and_ps(m, _mm256_cmp_ps(s, _mm256_set1_ps(INFINITY),
                                                              _CMP_EQ_OQ)));
        s = _mm256_blendv_ps(minus_inf, s, m);
        _mm256_storeu_ps(scores + j, s);
        peak = _mm256_max_ps(peak, s);
    }
    if (_mm256_movemask_ps(bad)) return NAN;
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, peak);
    for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
    if (top == -INFINITY) return 0.0f;
    __m256 total = _mm256_setzero_ps(), t = _mm256_set1_ps(top);
    for (size_t j = 0; j < seen; j += 8) {
        __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), t));
        _mm256_storeu_ps(scores + j, w);
        total = _mm256_add_ps(total, w);
    }
    return lanes_sum(total);
}

/* The values weighted for a block of ATT_ROWS rows: out[i] [h] = sum over keys j < last of
 * weights[i][j] * v_j, / total[i] (weights 0 where row i does not see key j). Each v_j is read
 * once for the block, 16 columns at a time against the rows' 2 x ATT_ROWS running sums; a key
 * no row of the block sees is skipped (never read). Rows whose total is not > 0 (see
 * softmax_row) are written zeros or NaN instead; rows from count on are computed and dropped. */
#define WEIGH_AHEAD 16 /* keys ahead whose values weigh_block fetches */
F16C static void weigh_block(const float *weights, size_t stride, const uint8_t *any, size_t last,
                             const float *v, size_t v_row, size_t h, const float *total,
                             float *const *out, size_t count) {
    size_t c0 = 0;
    for (; c0 + 16 <= h; c0 += 16) {
        __m256 acc[ATT_ROWS][2];
        for (int i = 0; i < ATT_ROWS; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (size_t j = 0; j < last; j++) {
            /* a column block of rows v_row apart: fetched ahead, as no prefetcher does */
            _mm_prefetch((const char *)(v + (j + WEIGH_AHEAD) * v_row + c0), _MM_HINT_T0);
            if (!any[j]) continue;
            __m256 v0 = _mm256_loadu_ps(v + j * v_row + c0);
            __m256 v1 = _mm256_loadu_ps(v + j * v_row + c0 + 8);
            _Pragma("GCC unroll 4") for (int i = 0; i < ATT_ROWS; i++) {
                __m256 w = _mm256_set1_ps(weights[i * stride + j]);
                acc[i][0] = _mm256_fmadd_ps(w, v0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w, v1, acc[i][1]);
            }
        }
        for (size_t i = 0; i < count; i++) {
            __m256 d = _mm256_set1_ps(total[i]);
            _mm256_storeu_ps(out[i] + c0, _mm256_div_ps(acc[i][0], d));
            _mm256_storeu_ps(out[i] + c0 + 8, _mm256_div_ps(acc[i][1], d));
        }
    }
    for (size_t i = 0; i < count; i++)
        for (size_t c = c0; c < h; c++) {
            float sum = 0.0f;
            for (size_t j = 0; j < last; j++)
                if (any[j]) sum += weights[i * stride + j] * v[j * v_row + c];
            out[i][c] = sum / total[i];
        }
    for (size_t i = 0; i < count; i++)
        if (!(total[i] > 0.0f)) /* no key, or NaN: zeros or NaN */
            for (size_t c = 0; c < h; c++) out[i][c] = total[i] == 0.0f ? 0.0f : NAN;
}

/* Where key j's element c lies in the transposed keys: blocks of 16 keys, each [h][16]
 * (contiguous: a block's scores read 4 KB in order at H = 64, not 64 lines a row apart). */
static inline size_t kt_at(size_t j, size_t c, size_t h) { return (j / 16 * h + c) * 16 + j % 16; }

/* kt = the keys k [n][h] (rows stride apart) transposed (kt_at), 0 from n to n16 (n rounded
 * up to 16): 8 x 8 blocks in registers, the rest one by one. */
F16C static void transpose_keys(const float *k, size_t stride, size_t n, size_t h, float *kt,
                                size_t n16) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        size_t c = 0;
        for (; c + 8 <= h; c += 8) {
            __m256 r[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] =
                _mm256_loadu_ps(k + (j + i) * stride + c);
            transpose8(r);
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(kt + kt_at(j, c + i, h), r[i]);
        }
        for (; c < h; c++)
            for (size_t i = 0; i < 8; i++) kt[kt_at(j + i, c, h)] = k[(j + i) * stride + c];
    }
    for (size_t c = 0; c < h; c++) {
        for (size_t i = j; i < n; i++) kt[kt_at(i, c, h)] = k[i * stride + c];
        for (size_t i = n; i < n16; i++) kt[kt_at(i, c, h)] = 0.0f;
    }
}

/* Scores of a decode step's few query rows (at most ATT_ROWS a KV head): each key row read
 * where it lies, H floats once, and dotted with each row (no transposed copy, which costs a
 * decode step more than its scores). */

/* 8 running sums a[i] (row i / 2, key i % 2) -> one vector of their 8 totals, lane i the
 * sum of a[i]'s lanes as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), whatever the
 * other vectors hold. */
F16C static inline __m256 sums8(const __m256 a[8]) {
    __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20),
                         _mm256_permute2f128_ps(g0, g1, 0x31));
}

/* Two rows of h floats, row apart, fetched into the cache (a decode step's keys and values
 * come from memory: other layers' weights went through the cache since they were written,
 * and the prefetchers pick up each KV head's short stream late). An asm statement: GCC 12
 * drops a loop of _mm_prefetch alone as dead code. A prefetch past the window's end (or of a
 * row no query sees) reads nothing: no fault, no value. */
#define SCORE_AHEAD 8 /* keys ahead whose rows direct_scores fetches (with the values of its own) */
static inline void fetch_line(const float *p) {
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}
static inline void fetch_rows(const float *p, size_t row, size_t h) {
    for (size_t c = 0; c < h; c += 16) fetch_line(p + c), fetch_line(p + row + c);
    fetch_line(p + h - 1), fetch_line(p + row + h - 1);
}

/* scores[i * stride + j] = qr[i] . key j for rows i < ROWS (a constant: one copy a count) and
 * keys j < bound, two keys a step; key j read at k + j * k_row only where any[j] (a key no
 * row sees reads as the zeros of zero: its score, 0, is masked out by softmax_row). Each
 * score is its row's sum over the 8-column chunks in order in 8 lanes, the lanes summed as
 * sums8 does, then the H % 8 tail's products added one by one: a fixed order per row. The keys
 * SCORE_AHEAD ahead and the values of the keys at hand (v: rows k_row apart, as k's) are
 * fetched as it goes. */
#define DIRECT_SCORES(name, ROWS)                                                                 \
    F16C static void name(const float *const *qr, const float *k, const float *v, size_t k_row,  \
                          const uint8_t *any, size_t bound, size_t h, const float *zero,         \
                          float *scores, size_t stride) {                                        \
        size_t h8 = h / 8 * 8;                                                                    \
        for (size_t j = 0; j < bound; j += 2) {                                                   \
            fetch_rows(k + (j + SCORE_AHEAD) * k_row, k_row, h);                                 \
            fetch_rows(v + j * k_row, k_row, h);                                                  \
            const float *k0 = any[j] ? k + j * k_row : zero;                                      \
            const float *k1 = j + 1 < bound && any[j + 1] ? k + (j + 1) * k_row : zero;           \
            __m256 acc[8];                                                                        \
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();                             \
            for (size_t c = 0; c < h8; c += 8) {                                                  \
                __m256 a = _mm256_loadu_ps(k0 + c), b = _mm256_loadu_ps(k1 + c);                  \
                _Pragma("GCC unroll 4") for (int i = 0; i < ROWS; i++) {                          \
                    __m256 x = _mm256_loadu_ps(qr[i] + c);                                        \
                    acc[2 * i] = _mm256_fmadd_ps(x, a, acc[2 * i]);                               \
                    acc[2 * i + 1] = _mm256_fmadd_ps(x, b, acc[2 * i + 1]);                       \
                }                                                                                 \
            }                                                                                     \
            float s[8];                                                                           \
            _mm256_storeu_ps(s, sums8(acc));                                                      \
            for (int i = 0; i < ROWS; i++) {                                                      \
                float t0 = s[2 * i], t1 = s[2 * i + 1];                                           \
                for (size_t c = h8; c < h; c++) {                                                 \
                    t0 += qr[i][c] * k0[c];                                                       \
                    t1 += qr[i][c] * k1[c];                                                       \
                }                                                                                 \
                scores[i * stride + j] = t0;                                                      \
                if (j + 1 < bound) scores[i * stride + j + 1] = t1;                               \
            }                                                                                     \
        }                                                                                         \
    }
DIRECT_SCORES(direct_scores_1, 1)
DIRECT_SCORES(direct_scores_2, 2)
DIRECT_SCORES(direct_scores_3, 3)
DIRECT_SCORES(direct_scores_4, 4)

/* A call's operands, for the parts the pool runs: items (sequence, KV head), bi * nkv + hk. */
typedef struct {
    const float *q, *k, *v;
    size_t nq, sq, h, nkv, n, group, rows;
    const size_t *kv_strides;
    const uint8_t *keep;
    size_t keep_heads;
    float scale, *out;
    atomic_int failed; /* a part without memory for its scratch */
} att_job;

/* Items [lo, hi) of an attention call: each KV head of each sequence, its group's query rows
 * in blocks of ATT_ROWS, with scratch of the part's own (the keys transposed, scores, keep
 * bytes); a part that cannot have it computes nothing and marks the call failed. */
F16C static void att_part(void *arg, size_t lo, size_t hi) {
    att_job *job = arg;
    const float *q = job->q, *k = job->k, *v = job->v;
    const size_t nq = job->nq, sq = job->sq, h = job->h, nkv = job->nkv, n = job->n;
    const size_t group = job->group, rows = job->rows, keep_heads = job->keep_heads;
    const size_t *kv_strides = job->kv_strides;
    const uint8_t *keep = job->keep;
    const float scale = job->scale;
    float *out = job->out;
    size_t n16 = (n + 15) / 16 * 16; /* keys padded to 16 */
    int direct = rows <= ATT_ROWS; /* a decode step: the keys read where they lie */
    size_t kt_size = direct ? h : h * n16; /* direct: one row of zeros (direct_scores) */
    float *kt = calloc(kt_size + ATT_ROWS * n16 + 1, sizeof(float));
    uint8_t *pad = malloc((ATT_ROWS + 1) * n16 + 1), *any = pad + ATT_ROWS * n16;
    if (!kt || !pad) {
        free(kt), free(pad);
        atomic_store(&job->failed, 1);
        return;
    }
    float *scores = kt + kt_size;
    for (size_t item = lo; item < hi; item++) {
        size_t bi = item / nkv, hk = item % nkv;
        const float *kb = k + bi * kv_strides[0] + hk * kv_strides[1];
        const float *vb = v + bi * kv_strides[0] + hk * kv_strides[1];
        if (!direct) transpose_keys(kb, kv_strides[2], n, h, kt, n16);
        for (size_t r0 = 0; r0 < rows; r0 += ATT_ROWS) {
            size_t count = rows - r0 < ATT_ROWS ? rows - r0 : ATT_ROWS, seen = 0;
            const float *qr[ATT_ROWS];
            const uint8_t *kr[ATT_ROWS];
            float *orow[ATT_ROWS];
            size_t last[ATT_ROWS];
            for (size_t i = 0; i < ATT_ROWS; i++) {
                size_t r = r0 + (i < count ? i : 0), hq = hk * group + r / sq, s = r % sq;
                size_t row = (bi * nq + hq) * sq + s;
                qr[i] = q + row * h;
                orow[i] = out + row * h;
                kr[i] = keep + ((bi * keep_heads + (keep_heads > 1 ? hq : 0)) * sq + s) * n;
                size_t l = n;
                while (l && !kr[i][l - 1]) l--;
                last[i] = l;
                size_t l16 = (l + 15) / 16 * 16;
                seen = l16 > seen ? l16 : seen;
                /* the row's keep bytes, 0 up to the block's bound */
                memcpy(pad + i * n16, kr[i], l);
                memset(pad + i * n16 + l, 0, n16 - l);
            }
            size_t bound = 0;
            for (size_t i = 0; i < count; i++) bound = last[i] > bound ? last[i] : bound;
            for (size_t j = 0; j < bound; j++) { /* keys some row of the block sees */
                uint8_t seen_by = 0;
                for (size_t i = 0; i < count; i++) seen_by |= pad[i * n16 + j];
                any[j] = seen_by;
            }
            if (direct) {
                static void (*const by_rows[ATT_ROWS])(
                    const float *const *, const float *, const float *, size_t,
                    const uint8_t *, size_t, size_t, const float *, float *, size_t) = {
                    direct_scores_1, direct_scores_2, direct_scores_3, direct_scores_4};
                by_rows[count - 1](qr, kb, vb, kv_strides[2], any, bound, h, kt, scores, n16);
                for (size_t i = 0; i < count; i++) /* past the last key: masked out */
                    memset(scores + i * n16 + bound, 0, (seen - bound) * sizeof(float));
            }
            for (size_t j = 0; !direct && j < seen; j += 16) { /* 4 rows, 16 keys a step */
                __m256 acc[ATT_ROWS][2];
                for (int i = 0; i < ATT_ROWS; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
                for (size_t c = 0; c < h; c++) {
                    __m256 k0 = _mm256_loadu_ps(kt + kt_at(j, c, h));
                    __m256 k1 = _mm256_loadu_ps(kt + kt_at(j, c, h) + 8);
                    _Pragma("GCC unroll 4") for (int i = 0; i < ATT_ROWS; i++) {
                        __m256 x = _mm256_set1_ps(qr[i][c]);
                        acc[i][0] = _mm256_fmadd_ps(x, k0, acc[i][0]);
                        acc[i][1] = _mm256_fmadd_ps(x, k1, acc[i][1]);
                    }
                }
                for (int i = 0; i < ATT_ROWS; i++) {
                    _mm256_storeu_ps(scores + i * n16 + j, acc[i][0]);
                    _mm256_storeu_ps(scores + i * n16 + j + 8, acc[i][1]);
                }
            }
            float total[ATT_ROWS];
            for (size_t i = 0; i < count; i++)
                total[i] = softmax_row(scores + i * n16, pad + i * n16, seen, scale);
            weigh_block(scores, n16, any, bound, vb, kv_strides[2], h, total, orow, count);
        }
    }
    free(kt), free(pad);
}

/* trt_kv_attention_float32: see above. kv_strides: k's and v's batch, head and row strides in
 * elements; round_half: out rounded to float16 values (a float16 network's attention output).
 * The (sequence, KV head) items split across up to threads threads (each row computed alike
 * whichever thread takes it: the same bits for any count), a part no fewer than ATT_WORK
 * multiply-adds. Returns 0, or -1 (out not all written) when scratch memory cannot be had. */
#define ATT_WORK 32768 /* a part's least work (query rows x keys x H): ~10 us here */
F16C int trt_kv_attention_float32(const float *q, size_t b, size_t nq, size_t sq, size_t h,
                                  const float *k, const float *v, size_t nkv, size_t n,
                                  const size_t *kv_strides, const uint8_t *keep, size_t keep_heads,
                                  float scale, float *out, int round_half, size_t threads) {
    size_t group = nq / nkv, rows = group * sq, work = rows * n * h;
    att_job job = {q, k, v, nq, sq, h, nkv, n, group, rows, kv_strides, keep, keep_heads,
                   scale, out, 0};
    size_t least = work ? (ATT_WORK + work - 1) / work : 1;
    parallel(att_part, &job, b * nkv, 1, least, threads);
    if (atomic_load(&job.failed)) return -1;
    if (round_half) trt_kv_round_float16(out, out, b * nq * sq * h);
    return 0;
}

/* Rotary position embedding of float32 rows, Hugging Face's form as the reference computes
 * it (ops.apply_rope), bit for bit: out = x * [c, c] + rotate_half(x) * [-s, s] on the leading
 * r elements of each row of x [B, N, S, H] (contiguous), the rest copied; c and s the rows
 * positions[b, s] of the tables cos, sin [P, r / 2]. Each product is rounded, then the sum
 * (no fused multiply-add: the barrier below keeps the compiler from fusing them).
 * interleaved: pairs (x[2i], x[2i + 1]) instead of (x[i], x[i + r / 2]). round_half: out
 * rounded to float16 values (a float16 network's RoPE output). */
#define UNFUSED(v) __asm__("" : "+x"(v))
F16C static void rope_row(const float *xr, const float *c, const float *sn, size_t h, size_t r,
                          int interleaved, float *o) {
    size_t half = r / 2, i = 0;
    if (!interleaved)
        for (; i + 8 <= half; i += 8) {
            __m256 x1 = _mm256_loadu_ps(xr + i), x2 = _mm256_loadu_ps(xr + half + i);
            __m256 ci = _mm256_loadu_ps(c + i), si = _mm256_loadu_ps(sn + i);
            __m256 a = _mm256_mul_ps(x1, ci), d = _mm256_mul_ps(x2, ci);
            __m256 e = _mm256_mul_ps(x2, si), f = _mm256_mul_ps(x1, si);
            UNFUSED(a);
            UNFUSED(d);
            UNFUSED(e);
            UNFUSED(f);
            _mm256_storeu_ps(o + i, _mm256_sub_ps(a, e));
            _mm256_storeu_ps(o + half + i, _mm256_add_ps(d, f));
        }
    for (; i < half; i++) {
        size_t one = interleaved ? 2 * i : i, two = interleaved ? 2 * i + 1 : i + half;
        volatile float a = xr[one] * c[i], d = xr[two] * c[i];
        volatile float e = xr[two] * sn[i], f = xr[one] * sn[i];
        o[one] = a - e;
        o[two] = d + f;
    }
    for (size_t j = r; j < h; j++) o[j] = xr[j];
}

F16C void trt_kv_rope_float32(const float *x, size_t b, size_t nh, size_t sq, size_t h, size_t r,
                              const float *cos, const float *sin, const int64_t *positions,
                              int interleaved, float *out, int round_half) {
    for (size_t bi = 0; bi < b; bi++)
        for (size_t n = 0; n < nh; n++)
            for (size_t s = 0; s < sq; s++) {
                size_t row = (bi * nh + n) * sq + s, at = positions[bi * sq + s] * (r / 2);
                rope_row(x + row * h, cos + at, sin + at, h, r, interleaved, out + row * h);
            }
    if (round_half) trt_kv_round_float16(out, out, b * nh * sq * h);
}

/* A decode step's heads as its attention block takes them (trt_kv/interpreter/attention_step.py:
 * RoPE, Q's scale and both cache updates, one call instead of five), one token a sequence: for
 * each sequence bi of b, q's nq heads rotated (rounded to float16 values where round_q), each
 * element times factor (one float32 product, rounded where round_scaled) into q_out
 * [b, nq, 1, h]; k's nkv heads rotated (round_k) and v's copied into row where[bi] of the
 * caches [b, nkv, s_max, h] (contiguous). q, k and v: each sequence's heads contiguous, the
 * sequences strides[0], strides[1] and strides[2] floats apart (rows of their own, or columns
 * of one product). Each element as trt_kv_rope_float32, a float32 multiply and
 * trt_kv_round_float16 give it: the bits of those steps one by one. The caller checks where
 * (within the caches) and rows (within the tables). */
typedef struct {
    size_t nq, nkv, h, r;
    int interleaved, round_q, round_k, round_scaled;
    float factor;
} decode_heads;

F16C void trt_kv_decode_heads(const decode_heads *d, const float *q, const float *k,
                              const float *v, const size_t *strides, size_t b, const float *cos,
                              const float *sin, const int64_t *rows, float *q_out,
                              float *k_cache, float *v_cache, size_t s_max,
                              const int64_t *where) {
    const size_t h = d->h, at = d->r / 2;
    const __m256 factor = _mm256_set1_ps(d->factor);
    for (size_t bi = 0; bi < b; bi++) {
        const float *c = cos + rows[bi] * at, *sn = sin + rows[bi] * at;
        for (size_t n = 0; n < d->nq; n++) {
            float *o = q_out + (bi * d->nq + n) * h;
            rope_row(q + bi * strides[0] + n * h, c, sn, h, d->r, d->interleaved, o);
            if (d->round_q) trt_kv_round_float16(o, o, h);
            size_t i = 0;
            for (; i + 8 <= h; i += 8)
                _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), factor));
            for (; i < h; i++) o[i] *= d->factor;
            if (d->round_scaled) trt_kv_round_float16(o, o, h);
        }
        for (size_t n = 0; n < d->nkv; n++) {
            size_t row = ((bi * d->nkv + n) * s_max + (size_t)where[bi]) * h;
            rope_row(k + bi * strides[1] + n * h, c, sn, h, d->r, d->interleaved, k_cache + row);
            if (d->round_k) trt_kv_round_float16(k_cache + row, k_cache + row, h);
            memcpy(v_cache + row, v + bi * strides[2] + n * h, h * sizeof(float));
        }
    }
}

/* Products against weights kept quantized (trt_kv/interpreter/blocks.py): out [rows, n] =
 * x [rows, k] @ w^T for w [n, k] held as its codes, block scales and block offsets, never
 * widened as a whole: w[r, c] = d[r, c / block] * code[r, c] + o[r, c / block]. codes: bits 4,
 * [n, k / 2] bytes, each 32 codes of a row as 16 bytes, code j + 8 in the low nibble of byte j
 * and code 16 + j + 8 in its high nibble (GGUF's Q4 order); bits 8, [n, k] int8. d and o:
 * [n, k / block] float16 bits (o NULL: none); block 16 or 32; k a multiple of 32.
 *
 * Few rows (a decode step, trt_kv_blocks_product): each weight row's codes are read once and
 * widened in registers, each element is d . (codes . x) per block, summed over the blocks in
 * eight (AVX2) or sixteen (AVX-512) lanes, then the lanes, plus o . (x summed per block) in a
 * fixed order: its bits do not depend on which other rows are computed with it, nor on the
 * threads. Many rows (a prefill chunk, trt_kv_blocks_panels): tiles of weight rows dequantized
 * (d * code + o, gguf's own float32 values) into a block and multiplied like a float32 weight
 * by the panel product above. Both split the weight rows (N) across threads, never K.
 */
/* Bytes of codes fetched ahead of the few-rows block product: its arithmetic per byte is high
 * enough that the prefetcher alone leaves it waiting on memory (2-core Intel Xeon VM, 30
 * matrices of [3072, 576] Q4_1 from DRAM, one row: ~435 -> ~300 us a product at 2048; 512
 * and 4096 slower). */
#define BLOCK_AHEAD 2048
/* -- the block products -------------------------------------------------------------------- */
/* A weight held in blocks, as the block products take it: its arrays and dims in one
 * argument, built once a weight by the caller (trt_kv/interpreter/native.py: blocks_call)
 * instead of passed field by field on every call. wide: AVX-512 (where the processor has it). */
typedef struct {
    const uint8_t *codes;
    const uint16_t *scales, *offsets;
    size_t n, k, block;
    int bits, wide;
} blocks_weight;

typedef struct {
    blocks_weight w; /* the weight, as the caller passed it */
    const float *x, *sums; /* sums [rows, k / block]: x summed per block (offsets only) */
    size_t rows;
    float *out;
    const float *packed; /* the panels of x (trt_kv_blocks_panels) */
    size_t panels;
} blocks_job;

/* 32 codes from p (bits 4: 16 bytes; 8: 32) as int8 in one 256-bit vector, in order. */
F16C static inline __attribute__((always_inline)) __m256i codes32(const uint8_t *p, int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)p);
    __m128i raw = _mm_loadu_si128((const __m128i *)p), low = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    __m256i both = _mm256_set_m128i(hi, lo);
    return _mm256_sub_epi8(both, _mm256_set1_epi8(8));
}

F16C static inline __attribute__((always_inline)) __m256 codes8(__m128i bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

/* The float16 fields of one weight row [count] widened into f. */
F16C static inline void row_fields(const uint16_t *h, size_t count, float *f) {
    size_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(f + i, load8_float16(h + i));
    for (; i < count; i++) f[i] = widen_one(h[i]);
}

/* The offsets o [count] of consecutive weight rows as the block products add them: the stored
 * ones (or 0) less 8 d for 4-bit codes, which block_row reads unsigned (code + 8); d [count]
 * the rows' scales. */
F16C static inline void rows_offsets(const blocks_job *j, size_t first, size_t count,
                                     const float *d, float *o) {
    const size_t nb = j->w.k / j->w.block;
    if (j->w.offsets) row_fields(j->w.offsets + first * nb, count, o);
    else memset(o, 0, count * sizeof(float));
    if (j->w.bits != 4) return;
    const __m256 eight = _mm256_set1_ps(8.0f);
    size_t b = 0;
    for (; b + 8 <= count; b += 8) /* 8 d is exact: one rounding, as o - 8 d */
        _mm256_storeu_ps(o + b, _mm256_fnmadd_ps(eight, _mm256_loadu_ps(d + b), _mm256_loadu_ps(o + b)));
    for (; b < count; b++) o[b] -= 8.0f * d[b];
}

/* o . sums over the blocks: eight lanes, then the lanes, then the tail (a fixed order). */
F16C static inline float offsets_dot(const float *o, const float *s, size_t count) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(o + i), _mm256_loadu_ps(s + i), acc);
    float t = lanes_sum(acc);
    for (; i < count; i++) t += o[i] * s[i];
    return t;
}

/* Eight 4-bit codes as float32, unsigned (code + 8: the 8 is in the row's offsets): the low
 * (high = 0) or high nibbles of 8 bytes. */
F16C static inline __attribute__((always_inline)) __m256 nibbles8(const uint8_t *p, int high) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    if (high) b = _mm256_srli_epi32(b, 4);
    return _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
}

/* AVX2: weight row r (its scales in d) against nx (<= 4) input rows from x: per block, the
 * codes (4 bits: unsigned) times x in eight lanes, times the block's scale, summed. */
F16C static inline __attribute__((always_inline)) void block_row(const blocks_job *j, size_t r,
                                                                 const float *d, const float *x,
                                                                 __m256 acc[8], const int nx) {
    const size_t k = j->w.k, bytes = j->w.bits == 4 ? 16 : 32;
    const uint8_t *p = j->w.codes + r * (k / 32) * bytes;
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    for (size_t g = 0; g < k / 32; g++, p += bytes) {
        __m256 w0, w1, w2, w3;
        if (bytes == 32 || !(g & 1)) _mm_prefetch((const char *)(p + BLOCK_AHEAD), _MM_HINT_T0);
        if (j->w.bits == 4) {
            w0 = nibbles8(p, 0), w1 = nibbles8(p + 8, 0), w2 = nibbles8(p, 1);
            w3 = nibbles8(p + 8, 1);
        } else {
            const __m128i *q = (const __m128i *)p;
            w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q)));
            w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))));
            w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16))));
            w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 24))));
        }
        const float *xg = x + g * 32;
        if (j->w.block == 32) {
            __m256 s = _mm256_set1_ps(d[g]);
            for (int i = 0; i < nx; i++) {
                const float *xi = xg + i * k;
                __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(xi));
                t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), t);
                t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xi + 16), t);
                t = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xi + 24), t);
                acc[i] = _mm256_fmadd_ps(s, t, acc[i]);
            }
        } else {
            __m256 s0 = _mm256_set1_ps(d[2 * g]), s1 = _mm256_set1_ps(d[2 * g + 1]);
            for (int i = 0; i < nx; i++) {
                const float *xi = xg + i * k;
                __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(xi));
                t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), t);
                __m256 u = _mm256_mul_ps(w2, _mm256_loadu_ps(xi + 16));
                u = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xi + 24), u);
                acc[i] = _mm256_fmadd_ps(s0, t, acc[i]);
                acc[i] = _mm256_fmadd_ps(s1, u, acc[i]);
            }
        }
    }
}

/* Sixteen 4-bit codes as float32, unsigned: the low or high nibbles of 16 bytes. */
WIDE static inline __attribute__((always_inline)) __m512 nibbles16(const uint8_t *p, int high) {
    /* the codes 0..15 as floats, picked by each lane's low 4 bits (vpermps reads no more) */
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_permutexvar_ps(high ? _mm512_srli_epi32(b, 4) : b, values);
}

/* AVX-512: as block_row, sixteen lanes (a 16-weight block one vector). */
/* AVX-512: the 32 codes of group g (at p) against nx input rows from x, into acc. */
WIDE static inline __attribute__((always_inline)) void group_wide(
    const blocks_job *j, const uint8_t *p, size_t g, const float *d, const float *x,
    __m512 acc[8], const int nx) {
    const size_t k = j->w.k;
    __m512 w0, w1;
    if (j->w.bits == 4) {
        w0 = nibbles16(p, 0), w1 = nibbles16(p, 1);
    } else {
        w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
        w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    }
    const float *xg = x + g * 32;
    if (j->w.block == 32) {
        __m512 s = _mm512_set1_ps(d[g]);
        for (int i = 0; i < nx; i++) {
            const float *xi = xg + i * k;
            __m512 t = _mm512_mul_ps(w0, _mm512_loadu_ps(xi));
            t = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), t);
            acc[i] = _mm512_fmadd_ps(s, t, acc[i]);
        }
    } else {
        __m512 s0 = _mm512_set1_ps(d[2 * g]), s1 = _mm512_set1_ps(d[2 * g + 1]);
        for (int i = 0; i < nx; i++) {
            const float *xi = xg + i * k;
            acc[i] = _mm512_fmadd_ps(s0, _mm512_mul_ps(w0, _mm512_loadu_ps(xi)), acc[i]);
            acc[i] = _mm512_fmadd_ps(s1, _mm512_mul_ps(w1, _mm512_loadu_ps(xi + 16)), acc[i]);
        }
    }
}

/* AVX-512: as block_row, sixteen lanes (a 16-weight block one vector), even and odd groups
 * summed apart (two chains of additions), then added. */
WIDE static inline __attribute__((always_inline)) void block_row_wide(
    const blocks_job *j, size_t r, const float *d, const float *x, __m512 acc[8], const int nx) {
    const size_t groups = j->w.k / 32, bytes = j->w.bits == 4 ? 16 : 32;
    const uint8_t *p = j->w.codes + r * groups * bytes;
    __m512 odd[8];
    for (int i = 0; i < nx; i++) acc[i] = odd[i] = _mm512_setzero_ps();
    size_t g = 0;
    for (; g + 2 <= groups; g += 2, p += 2 * bytes) {
        _mm_prefetch((const char *)(p + BLOCK_AHEAD), _MM_HINT_T0);
        if (bytes == 32) _mm_prefetch((const char *)(p + BLOCK_AHEAD + 32), _MM_HINT_T0);
        group_wide(j, p, g, d, x, acc, nx);
        group_wide(j, p + bytes, g + 1, d, x, odd, nx);
    }
    if (g < groups) group_wide(j, p, g, d, x, acc, nx);
    for (int i = 0; i < nx; i++) acc[i] = _mm512_add_ps(acc[i], odd[i]);
}

WIDE static inline float lanes_sum_wide(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return lanes_sum(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* Weight rows [lo, hi) of a decode product, four input rows at a time (AVX2 or AVX-512). */
#define BLOCK_ROWS(NAME, TARGET, VEC, ROW, SUM, T)                                              \
    TARGET static void NAME(void *arg, size_t lo, size_t hi) {                                 \
        const blocks_job *j = arg;                                                             \
        const size_t nb = j->w.k / j->w.block, n = j->w.n;                                     \
        const size_t cap = nb > 2048 ? nb : 2048, chunk = cap / nb;                            \
        float d[cap], o[cap]; /* the scales and offsets of up to chunk rows, widened */        \
        for (size_t c0 = lo; c0 < hi; c0 += chunk) {                                           \
            size_t c1 = c0 + chunk < hi ? c0 + chunk : hi;                                     \
            row_fields(j->w.scales + c0 * nb, (c1 - c0) * nb, d);                              \
            if (j->sums) rows_offsets(j, c0, (c1 - c0) * nb, d, o);                            \
            for (size_t r = c0; r < c1; r++) {                                                 \
                const float *dr = d + (r - c0) * nb, *orow = o + (r - c0) * nb;                \
                for (size_t m = 0; m < j->rows; m += T) {                                      \
                    VEC acc[8]; /* T used: the cases past T never run */                \
                    const float *x = j->x + m * j->w.k;                                        \
                    size_t nx = j->rows - m < T ? j->rows - m : T;                             \
                    switch (nx) {                                                              \
                    case 8: ROW(j, r, dr, x, acc, 8); break;                                   \
                    case 7: ROW(j, r, dr, x, acc, 7); break;                                   \
                    case 6: ROW(j, r, dr, x, acc, 6); break;                                   \
                    case 5: ROW(j, r, dr, x, acc, 5); break;                                   \
                    case 4: ROW(j, r, dr, x, acc, 4); break;                                   \
                    case 3: ROW(j, r, dr, x, acc, 3); break;                                   \
                    case 2: ROW(j, r, dr, x, acc, 2); break;                                   \
                    default: ROW(j, r, dr, x, acc, 1); break;                                  \
                    }                                                                          \
                    for (size_t i = 0; i < nx; i++) {                                          \
                        float s = SUM(acc[i]);                                                 \
                        if (j->sums) s += offsets_dot(orow, j->sums + (m + i) * nb, nb);       \
                        j->out[(m + i) * n + r] = s;                                           \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
BLOCK_ROWS(block_rows, F16C, __m256, block_row, lanes_sum, 4)
BLOCK_ROWS(block_rows_wide, WIDE, __m512, block_row_wide, lanes_sum_wide, 8)

/* x summed per block [rows, k / block], each sum in order (the offsets' factor). */
static float *block_sums(const float *x, size_t rows, size_t k, size_t block) {
    float *s = malloc((rows * (k / block) + 1) * sizeof(float));
    if (!s) return NULL;
    for (size_t i = 0; i < rows * (k / block); i++) {
        float t = 0.0f;
        for (size_t c = 0; c < block; c++) t += x[i * block + c];
        s[i] = t;
    }
    return s;
}

/* out [rows, n] = x [rows, k] @ w^T for w held in blocks (see above), on up to threads
 * threads, AVX-512 where wide (and the processor has it), rounded to float16 values where
 * round_half (a float16 network's product: no second call to round it); returns 0, or -1
 * (nothing written) without memory for the block sums. */
F16C int trt_kv_blocks_product(const blocks_weight *w, const float *x, size_t rows, float *out,
                               size_t threads, int round_half) {
    const size_t n = w->n, k = w->k;
    blocks_job j = {*w, x, NULL, rows, out, NULL, 0};
    float *sums = NULL;
    if ((w->offsets || w->bits == 4) && !(sums = block_sums(x, rows, k, w->block))) return -1;
    j.sums = sums;
    parallel(w->wide ? block_rows_wide : block_rows, &j, n, 16, part_rows(k / 4, 16), threads);
    free(sums);
    if (round_half) trt_kv_round_float16(out, out, rows * n);
    return 0;
}

/* Weight rows [lo, hi) of a prefill product: tiles of WIDTH rows dequantized into a block,
 * then multiplied against every panel as the panel product multiplies a float32 tile. */
#define BLOCK_PANELS(NAME, TARGET, KIND, WIDTH, STEP)                                          \
    TARGET static void NAME(void *arg, size_t lo, size_t hi) {                                 \
        const blocks_job *j = arg;                                                             \
        const size_t k = j->w.k, nb = k / j->w.block, bytes = j->w.bits == 4 ? 16 : 32;        \
        float *w = malloc(WIDTH * k * sizeof(float) + 2 * nb * sizeof(float) + 1);             \
        if (!w) return; /* the caller checked a block of this size could be had */             \
        float *d = w + WIDTH * k, *o = d + nb;                                                 \
        for (size_t r = lo; r < hi; r += WIDTH) {                                              \
            size_t nw = hi - r < WIDTH ? hi - r : WIDTH;                                       \
            for (size_t i = 0; i < nw; i++) {                                                  \
                row_fields(j->w.scales + (r + i) * nb, nb, d);                                 \
                if (j->w.offsets) row_fields(j->w.offsets + (r + i) * nb, nb, o);              \
                const uint8_t *p = j->w.codes + (r + i) * (k / 32) * bytes;                    \
                float *wr = w + i * k;                                                         \
                for (size_t g = 0; g < k / 32; g++, p += bytes) {                              \
                    __m256i c = codes32(p, j->w.bits);                                         \
                    __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1); \
                    __m256 v[4] = {codes8(c0), codes8(_mm_srli_si128(c0, 8)), codes8(c1),     \
                                   codes8(_mm_srli_si128(c1, 8))};                             \
                    for (size_t q = 0; q < 4; q++) {                                           \
                        size_t b = (g * 32 + q * 8) / j->w.block;                              \
                        __m256 off = j->w.offsets ? _mm256_set1_ps(o[b]) : _mm256_setzero_ps(); \
                        /* d * code is exact (11 x 8 significant bits): one rounding */         \
                        _mm256_storeu_ps(wr + g * 32 + q * 8,                                  \
                                         _mm256_fmadd_ps(v[q], _mm256_set1_ps(d[b]), off));    \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            for (size_t p = 0; p < j->panels; p += STEP) {                                     \
                size_t m = j->rows - p * PANEL < STEP * PANEL ? j->rows - p * PANEL           \
                                                              : STEP * PANEL;                  \
                tiles_##KIND(w, nw, k, j->packed + p * PANEL * k,                              \
                             j->out + p * PANEL * j->w.n + r, j->w.n, m);                      \
            }                                                                                  \
        }                                                                                      \
        free(w);                                                                               \
    }
BLOCK_PANELS(block_panels, F16C, panels, PANEL_W, 1)
BLOCK_PANELS(block_panels_wide, WIDE, panels_wide, WIDE_W, 2)

/* As trt_kv_blocks_product for many rows (a prefill chunk); -1: no memory for the panels. */
F16C int trt_kv_blocks_panels(const blocks_weight *w, const float *x, size_t rows, float *out,
                              size_t threads, int round_half) {
    const size_t n = w->n, k = w->k, block = w->block;
    const int wide = w->wide;
    size_t panels = (rows + PANEL - 1) / PANEL;
    float *packed = malloc(panels * PANEL * k * sizeof(float) + 1);
    void *probe = malloc(WIDE_W * k * sizeof(float) + 2 * (k / block) * sizeof(float) + 1);
    if (!packed || !probe) {
        free(packed), free(probe);
        return -1;
    }
    free(probe);
    pack_panels(x, rows, k, packed, panels);
    blocks_job j = {*w, x, NULL, rows, out, packed, panels};
    size_t unit = wide ? WIDE_W : PANEL_W;
    parallel(wide ? block_panels_wide : block_panels, &j, n, unit, part_rows(k, unit), threads);
    free(packed);
    if (round_half) trt_kv_round_float16(out, out, rows * n);
    return 0;
}


/* -- element-wise chains run as one call (trt_kv/interpreter/chains.py) ----------------------
 * Each keeps the network's arithmetic: every operation rounded to float32 as NumPy rounds it
 * (no fused multiply-add: CHAIN functions are compiled without contraction), each float16
 * boundary rounded where the network declares it, so the values are those of the layers run
 * one by one. */
#define CHAIN __attribute__((target("avx2,fma,f16c"), optimize("fp-contract=off")))

/* NumPy's pairwise sum of n float32 (its add.reduce over a contiguous axis), in its order:
 * under 8 one by one from -0; up to 128 eight running sums, combined in pairs, then the tail;
 * more: the halves (the first a multiple of 8) summed apart, then added. */
CHAIN static float pairwise_sum(const float *a, size_t n) {
    if (n < 8) {
        float res = -0.0f;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        __m256 acc = _mm256_loadu_ps(a); /* r[j], lane j */
        size_t i = 8;
        for (; i < n - (n % 8); i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(a + i));
        float r[8];
        _mm256_storeu_ps(r, acc);
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t half = n / 2;
    half -= half % 8;
    return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

/* out = a * b [n] (out may be a or b), rounded to float16 when round_half. */
CHAIN static void multiply(const float *a, const float *b, float *out, size_t n, int round_half) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) out[i] = a[i] * b[i];
    if (round_half) trt_kv_round_float16(out, out, n);
}

/* RMSNorm of the rows of x [rows, d] into out (may not be x), as the network's layers compute
 * it: s = x * x; mean = sum(s) / d (NumPy's pairwise sum, the quotient in float64 rounded
 * once, as np.mean); r = sqrt(mean + eps); y = x / r, rounded to float16 when round_normed;
 * times w [d] (NULL: none), rounded to float16 when round_out. scratch: d floats. */
CHAIN void trt_kv_rms_norm(const float *x, size_t rows, size_t d, float eps, const float *w,
                           int round_normed, int round_out, float *out, float *scratch) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *o = out + r * d;
        size_t i;
        multiply(xr, xr, scratch, d, 0);
        float mean = (float)((double)pairwise_sum(scratch, d) / (double)d);
        float rms = sqrtf(mean + eps);
        const __m256 by = _mm256_set1_ps(rms);
        for (i = 0; i + 8 <= d; i += 8)
            _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_loadu_ps(xr + i), by));
        for (; i < d; i++) o[i] = xr[i] / rms;
        if (round_normed) trt_kv_round_float16(o, o, d);
        if (w) multiply(o, w, o, d, round_out);
    }
}

/* A residual add and the RMSNorm of its sum: total = a + b [rows, d] (rounded to float16 when
 * round_sum), then trt_kv_rms_norm of total into out (the same arguments). */
CHAIN void trt_kv_add_rms_norm(const float *a, const float *b, size_t rows, size_t d,
                               int round_sum, float eps, const float *w, int round_normed,
                               int round_out, float *total, float *out, float *scratch) {
    size_t n = rows * d, i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(total + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) total[i] = a[i] + b[i];
    if (round_sum) trt_kv_round_float16(total, total, n);
    trt_kv_rms_norm(total, rows, d, eps, w, round_normed, round_out, out, scratch);
}

/* SwiGLU of gate and up [n] into out (may not be either): s = sigmoid(gate) (the helper's,
 * trt_kv_sigmoid_float32), a = gate * s, out = a * up, each rounded to float16 where its
 * flag (bit 0: s, bit 1: a, bit 2: out) says. */
CHAIN void trt_kv_swiglu(const float *gate, const float *up, size_t n, int rounded, float *out) {
    trt_kv_sigmoid_float32(gate, out, n);
    if (rounded & 1) trt_kv_round_float16(out, out, n);
    multiply(gate, out, out, n, rounded & 2);
    multiply(out, up, out, n, rounded & 4);
}

#else /* another processor or compiler: half.py keeps its NumPy recipes */

int trt_kv_native_ready(void) { return 0; }

void trt_kv_round_float16(const float *x, float *y, size_t n) {
    (void)x, (void)y, (void)n;
}

void trt_kv_widen_float16(const uint16_t *h, size_t rows, size_t stride, size_t length,
                          float *y) {
    (void)h, (void)rows, (void)stride, (void)length, (void)y;
}

void trt_kv_product_float16(const uint16_t *w, size_t n, size_t k, const float *x, size_t rows,
                            float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
}

void trt_kv_product_float32(const float *w, size_t n, size_t k, const float *x, size_t rows,
                            float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
}

int trt_kv_panels_float16(const uint16_t *w, size_t n, size_t k, const float *x, size_t rows,
                          float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
    return -1;
}

int trt_kv_panels_float32(const float *w, size_t n, size_t k, const float *x, size_t rows,
                          float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
    return -1;
}

int trt_kv_native_wide(void) { return 0; }

int trt_kv_panels_wide_float16(const uint16_t *w, size_t n, size_t k, const float *x,
                               size_t rows, float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
    return -1;
}

int trt_kv_panels_wide_float32(const float *w, size_t n, size_t k, const float *x, size_t rows,
                               float *out, size_t threads) {
    (void)w, (void)n, (void)k, (void)x, (void)rows, (void)out, (void)threads;
    return -1;
}

int trt_kv_attention_float32(const float *q, size_t b, size_t nq, size_t sq, size_t h,
                             const float *k, const float *v, size_t nkv, size_t n,
                             const size_t *kv_strides, const uint8_t *keep, size_t keep_heads,
                             float scale, float *out, int round_half, size_t threads) {
    (void)q, (void)b, (void)nq, (void)sq, (void)h, (void)k, (void)v, (void)nkv, (void)n;
    (void)kv_strides, (void)keep, (void)keep_heads, (void)scale, (void)out, (void)round_half;
    (void)threads;
    return -1;
}

void trt_kv_rope_float32(const float *x, size_t b, size_t nh, size_t sq, size_t h, size_t r,
                         const float *cos, const float *sin, const int64_t *positions,
                         int interleaved, float *out, int round_half) {
    (void)x, (void)b, (void)nh, (void)sq, (void)h, (void)r, (void)cos, (void)sin;
    (void)positions, (void)interleaved, (void)out, (void)round_half;
}

void trt_kv_sigmoid_float32(const float *x, float *y, size_t n) { (void)x, (void)y, (void)n; }

void trt_kv_decode_heads(const void *d, const float *q, const float *k, const float *v,
                         const size_t *strides, size_t b, const float *cos, const float *sin,
                         const int64_t *rows, float *q_out, float *k_cache, float *v_cache,
                         size_t s_max, const int64_t *where) {
    (void)d, (void)q, (void)k, (void)v, (void)strides, (void)b, (void)cos, (void)sin, (void)rows;
    (void)q_out, (void)k_cache, (void)v_cache, (void)s_max, (void)where;
}

int trt_kv_blocks_product(const void *w, const float *x, size_t rows, float *out, size_t threads,
                          int round_half) {
    (void)w, (void)x, (void)rows, (void)out, (void)threads, (void)round_half;
    return -1;
}

int trt_kv_blocks_panels(const void *w, const float *x, size_t rows, float *out, size_t threads,
                         int round_half) {
    return trt_kv_blocks_product(w, x, rows, out, threads, round_half);
}


void trt_kv_rms_norm(const float *x, size_t rows, size_t d, float eps, const float *w,
                     int round_normed, int round_out, float *out, float *scratch) {
    (void)x, (void)rows, (void)d, (void)eps, (void)w, (void)round_normed, (void)round_out;
    (void)out, (void)scratch;
}

void trt_kv_swiglu(const float *gate, const float *up, size_t n, int rounded, float *out) {
    (void)gate, (void)up, (void)n, (void)rounded, (void)out;
}

void trt_kv_add_rms_norm(const float *a, const float *b, size_t rows, size_t d, int round_sum,
                         float eps, const float *w, int round_normed, int round_out, float *total,
                         float *out, float *scratch) {
    (void)a, (void)b, (void)rows, (void)d, (void)round_sum, (void)eps, (void)w;
    (void)round_normed, (void)round_out, (void)total, (void)out, (void)scratch;
}

#endif
