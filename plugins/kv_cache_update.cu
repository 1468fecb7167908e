// trt_kv KV-cache update kernels: the LINEAR update of TensorRT's IKVCacheUpdateLayer, for
// TensorRT versions without that layer (< 10.15), launched by trt_kv's IPluginV3.
//
//   padded: cache[b, n, w[b] + s, h] = update[b, n, s, h]          update [B, N, S, H]
//   packed: cache[b, n, w[b] + s, h] = update[L[b] + s, n, h]      update [T, N, H],
//           s in [0, L[b+1] - L[b]), L = update_lengths [B + 1] (cumulative, L[0] = 0)
//
// cache is [B, N, S_max, H] and is written IN PLACE: only the updated windows are touched, so a
// decode step costs O(update), not O(cache). A write at w[b] + s >= S_max, or any write of a
// sequence with w[b] < 0, is skipped (TensorRT's layer skips out-of-bounds writes too). No value
// of write_indices or update_lengths can make a store leave the cache (bounds are checked
// without integer overflow), since TensorRT may run the plugin on unspecified data while building.
//
// Values are moved as raw bits (unsigned 16/32-bit words, no float loads, no arithmetic), so
// the copy is bit-exact for float32, float16 and bfloat16, NaN payloads included.
//
// Entry points (extern "C", so cuModuleGetFunction finds them by these exact names):
//   trt_kv_cache_update_padded_<dt>_<wi>(cache, update, write_indices, B, N, S_max, H, S)
//   trt_kv_cache_update_packed_<dt>_<wi>_<li>(cache, update, write_indices, update_lengths,
//                                               B, N, S_max, H, T)
//   <dt> in {f32, f16, bf16} (cache/update dtype), <wi>/<li> in {i32, i64} (write_indices /
//   update_lengths dtype). Pointer arguments are device pointers in the plugin's input order;
//   the sizes are int32.
//
// Launch geometry: 1-D. One thread per update element (n = B*N*S*H padded, T*N*H packed),
// h fastest, so consecutive threads read and write consecutive addresses. block = (256, 1, 1),
// grid = (min(ceil(n / 256), 65535), 1, 1), no dynamic shared memory; the kernels loop with a
// grid stride, so any grid >= 1 is correct. Launch nothing when n == 0.
//
// Compiles with nvcc (-arch sm_80 / sm_86 / sm_89 / sm_90, -ptx or -cubin) and with NVRTC:
// it includes no header. With -DTRT_KV_HOST_EMULATION a host C++ compiler (g++ -x c++) builds
// the same element functions plus host loops (trt_kv_host_*) that the CPU tests run.

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TRT_KV_HD __host__ __device__ __forceinline__
#else
#define TRT_KV_HD inline
#endif

namespace trt_kv {

typedef long long i64;

// Copy element e of a padded update [B, N, S, H]; returns nothing, skips out-of-bounds writes.
template <typename Word, typename Index>
TRT_KV_HD void padded_element(i64 e, Word* cache, const Word* update, const Index* write_indices,
                              int N, int S_max, int H, int S) {
    const i64 h = e % H;
    const i64 row = e / H;  // (b * N + n) * S + s
    const i64 s = row % S;
    const i64 bn = row / S;  // b * N + n
    const i64 start = (i64)write_indices[bn / N];
    if (start < 0 || start >= S_max - s) return;  // start + s >= S_max, without overflow
    cache[(bn * S_max + start + s) * H + h] = update[e];
}

// Sequence b whose packed tokens hold t: L[b] <= t < L[b+1]; -1 when t lies in no sequence.
template <typename Length>
TRT_KV_HD int sequence_of(i64 t, const Length* lengths, int B) {
    int lo = 0, hi = B;  // find the last b in [0, B) with L[b] <= t
    if (B <= 0 || (i64)lengths[0] > t) return -1;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if ((i64)lengths[mid] <= t) lo = mid; else hi = mid;
    }
    return t < (i64)lengths[lo + 1] ? lo : -1;
}

// Copy element e of a packed update [T, N, H] into its sequence's window.
template <typename Word, typename Index, typename Length>
TRT_KV_HD void packed_element(i64 e, Word* cache, const Word* update, const Index* write_indices,
                              const Length* lengths, int B, int N, int S_max, int H) {
    const i64 h = e % H;
    const i64 n = (e / H) % N;
    const i64 t = e / ((i64)H * N);
    const int b = sequence_of(t, lengths, B);
    if (b < 0 || (i64)lengths[b] < 0) return;  // no sequence, or a malformed (negative) offset
    const i64 s = t - (i64)lengths[b];          // 0 <= s <= t
    const i64 start = (i64)write_indices[b];
    if (start < 0 || start >= S_max - s) return;  // start + s >= S_max, without overflow
    cache[(((i64)b * N + n) * S_max + start + s) * H + h] = update[e];
}

}  // namespace trt_kv

typedef unsigned int trt_kv_b32;     // float32
typedef unsigned short trt_kv_b16;   // float16, bfloat16
typedef int trt_kv_i32;
typedef long long trt_kv_i64;
#define TRT_KV_WORD_f32 trt_kv_b32
#define TRT_KV_WORD_f16 trt_kv_b16
#define TRT_KV_WORD_bf16 trt_kv_b16

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#define TRT_KV_PADDED(DT, WI)                                                                   \
    extern "C" __global__ void trt_kv_cache_update_padded_##DT##_##WI(                         \
        TRT_KV_WORD_##DT* cache, const TRT_KV_WORD_##DT* update, const trt_kv_##WI* w, int B,  \
        int N, int S_max, int H, int S) {                                                       \
        const long long n = (long long)B * N * S * H;                                           \
        for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;             \
             e += (long long)gridDim.x * blockDim.x)                                            \
            trt_kv::padded_element(e, cache, update, w, N, S_max, H, S);                       \
    }

#define TRT_KV_PACKED(DT, WI, LI)                                                               \
    extern "C" __global__ void trt_kv_cache_update_packed_##DT##_##WI##_##LI(                  \
        TRT_KV_WORD_##DT* cache, const TRT_KV_WORD_##DT* update, const trt_kv_##WI* w,         \
        const trt_kv_##LI* lengths, int B, int N, int S_max, int H, int T) {                    \
        const long long n = (long long)T * N * H;                                               \
        for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;             \
             e += (long long)gridDim.x * blockDim.x)                                            \
            trt_kv::packed_element(e, cache, update, w, lengths, B, N, S_max, H);              \
    }

#elif defined(TRT_KV_HOST_EMULATION)

// The same element functions, looped on the host over e = 0 .. n-1 (a grid of one thread that
// strides over everything). Only for the CPU tests; not part of the plugin.
#define TRT_KV_PADDED(DT, WI)                                                                   \
    extern "C" void trt_kv_host_padded_##DT##_##WI(                                            \
        TRT_KV_WORD_##DT* cache, const TRT_KV_WORD_##DT* update, const trt_kv_##WI* w, int B,  \
        int N, int S_max, int H, int S) {                                                       \
        const long long n = (long long)B * N * S * H;                                           \
        for (long long e = 0; e < n; ++e)                                                       \
            trt_kv::padded_element(e, cache, update, w, N, S_max, H, S);                       \
    }

#define TRT_KV_PACKED(DT, WI, LI)                                                               \
    extern "C" void trt_kv_host_packed_##DT##_##WI##_##LI(                                     \
        TRT_KV_WORD_##DT* cache, const TRT_KV_WORD_##DT* update, const trt_kv_##WI* w,         \
        const trt_kv_##LI* lengths, int B, int N, int S_max, int H, int T) {                    \
        const long long n = (long long)T * N * H;                                               \
        for (long long e = 0; e < n; ++e)                                                       \
            trt_kv::packed_element(e, cache, update, w, lengths, B, N, S_max, H);              \
    }

#else
#define TRT_KV_PADDED(DT, WI)
#define TRT_KV_PACKED(DT, WI, LI)
#endif

#define TRT_KV_ALL_INDEX_TYPES(DT)                                                              \
    TRT_KV_PADDED(DT, i32)                                                                      \
    TRT_KV_PADDED(DT, i64)                                                                      \
    TRT_KV_PACKED(DT, i32, i32)                                                                 \
    TRT_KV_PACKED(DT, i32, i64)                                                                 \
    TRT_KV_PACKED(DT, i64, i32)                                                                 \
    TRT_KV_PACKED(DT, i64, i64)

TRT_KV_ALL_INDEX_TYPES(f32)
TRT_KV_ALL_INDEX_TYPES(f16)
TRT_KV_ALL_INDEX_TYPES(bf16)
