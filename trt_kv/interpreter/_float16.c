/* float16 <-> float32 conversions with the processor's own instructions (x86-64 F16C).
 *
 * NumPy converts float16 one element at a time in C (~2-3 ns an element); these convert
 * eight at a time (~0.2 ns). Results are NumPy's bits exactly: finite values and infinities
 * are IEEE round-to-nearest-even either way; NaN, where the instructions and NumPy differ
 * (the instructions set the quiet bit, NumPy keeps the payload as it is), is redone in
 * NumPy's way by the scalar code below.
 *
 * Loaded with ctypes by trt_kv/interpreter/half_compiled.py (no Python API here); built by
 * setup.py as an optional extension: without a C compiler, or on another processor, half.py
 * keeps its NumPy recipes. trt_kv_float16_ready() says whether this processor can run the
 * rest: 0 if not, else the version of these functions' signatures; trt_kv_float16_source()
 * gives the sha256 of this file as it was built. half_compiled.py loads a build only when
 * both are its own (a build left from an older checkout is passed over).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef TRT_KV_FLOAT16_SOURCE
#define TRT_KV_FLOAT16_SOURCE "" /* built by hand, not by setup.py: no hash to compare */
#endif

const char *trt_kv_float16_source(void) { return TRT_KV_FLOAT16_SOURCE; }

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

#define F16C __attribute__((target("avx,f16c")))

#define SIGNATURES 2 /* change with any signature in this file */

int trt_kv_float16_ready(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c") ? SIGNATURES : 0;
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

#else /* another processor or compiler: half.py keeps its NumPy recipes */

int trt_kv_float16_ready(void) { return 0; }

void trt_kv_round_float16(const float *x, float *y, size_t n) {
    (void)x, (void)y, (void)n;
}

void trt_kv_widen_float16(const uint16_t *h, size_t rows, size_t stride, size_t length,
                          float *y) {
    (void)h, (void)rows, (void)stride, (void)length, (void)y;
}

#endif
