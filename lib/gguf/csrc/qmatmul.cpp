// y = x · Wᵀ with W stored in GGUF blocks, read as they lie in the file (lib/gguf/qmatmul.py builds and loads this).
//
// Each weight is decoded to float32 exactly as the dequantizer writes it (lib/gguf/qformats.py: d·q + m for Q4_1, one
// rounding per operation, no fused multiply-add), in registers, and multiplied with float32 activations: the
// result is x · dequantize(W)ᵀ up to the order of the float32 sum. Activations are never quantized.
//
// Work split: output rows over threads (OpenMP: the same libgomp torch has loaded, so torch.set_num_threads
// applies); each weight row is decoded once for up to 8 rows of x (decode, a verify step, a batch), which is
// what makes 2-8 rows cost about one.
//
// Built with -march=native: AVX-512 or AVX2 (+F16C, FMA) when this CPU has them, plain C++ otherwise. The
// portable loops below are the kernel; the AVX-512 path does the same arithmetic 16 lanes at a time.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

enum QType : int { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2, Q4_K = 3, Q6_K = 4, Q5_0 = 5, Q5_1 = 6, Q5_K = 7, F32 = 8, Q4_1F = 9 };
// F32 is not a GGUF block type: plain float32 weights, read as "blocks" of 16 (lib.modeling.fast's fp32 decode step uses
// the same loops and the same whole-step call as the quantized model, with nothing to decode).
// Q4_1F is not one either: Q4_1 blocks with d and m widened to float32 (24 bytes: d, m, the same 16 bytes of
// nibbles; lib.gguf.qmatmul.repack_q4_1). The same weights; the kernel broadcasts d and m straight from memory
// instead of converting and shuffling them (port-5 work that bounds the Q4_1 loop on Intel cores).
constexpr int kMaxRows = 8;  // rows of x per pass over a weight row
// Software prefetch, bytes ahead of the block being read (0: off; set by qmatmul_set_prefetch, chosen by measuring
// in lib.quantization.quant_linear). The quantized loops below spend several cycles decoding each block, and on some machines
// (an Intel Xeon VM, measured) the hardware prefetcher then runs too little ahead: the loop waits on memory at half
// the bandwidth a plain read gets. Asking for the block 4 KB ahead (a few rows of a matrix) keeps the stream
// going. A thread's rows are consecutive (static schedule), so the blocks ahead are the ones it reads next.
int64_t g_prefetch = 0;
inline void prefetch_ahead(const uint8_t* b, int64_t ahead) { __builtin_prefetch(b + ahead, 0, 3); }

// Below this many weights a call runs on one thread: waking the others costs more than it saves (torch's own
// grain size is 32768 elements), and far more on a busy machine, where a woken thread may wait for a core.
constexpr int64_t kMinParallelWeights = 1 << 16;

inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
    } else if (man == 0) {
        bits = sign;  // zero
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; ++e; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

// --- one block -> float32 weights, as lib/gguf/qformats.py's dequantizers compute them ---------------------------

inline void decode_q8_0(const uint8_t* b, float* w) {  // 34 bytes: d f16, 32 x int8
    const float d = half_to_float(b);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int i = 0; i < 32; ++i) w[i] = d * (float)q[i];
}

inline void decode_f32(const uint8_t* b, float* w) { std::memcpy(w, b, 16 * sizeof(float)); }  // 64 bytes

inline void decode_q4_0(const uint8_t* b, float* w) {  // 18 bytes: d f16, 16 bytes of nibbles
    const float d = half_to_float(b);
    const uint8_t* qs = b + 2;
    for (int i = 0; i < 16; ++i) {
        w[i] = d * ((float)(qs[i] & 0x0F) - 8.0f);
        w[i + 16] = d * ((float)(qs[i] >> 4) - 8.0f);
    }
}

inline void decode_q4_1(const uint8_t* b, float* w) {  // 20 bytes: d f16, m f16, 16 bytes of nibbles
    const float d = half_to_float(b), m = half_to_float(b + 2);
    const uint8_t* qs = b + 4;
    for (int i = 0; i < 16; ++i) {
        w[i] = d * (float)(qs[i] & 0x0F) + m;
        w[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

inline void decode_q4_1f(const uint8_t* b, float* w) {  // 24 bytes: d f32, m f32, 16 bytes of nibbles
    float d, m;
    std::memcpy(&d, b, 4);
    std::memcpy(&m, b + 4, 4);
    const uint8_t* qs = b + 8;
    for (int i = 0; i < 16; ++i) {
        w[i] = d * (float)(qs[i] & 0x0F) + m;
        w[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

inline void decode_q5_0(const uint8_t* b, float* w) {  // 22 bytes: d f16, qh u32 (bit i: bit 4 of q[i]), nibbles
    const float d = half_to_float(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const uint8_t* qs = b + 6;
    for (int i = 0; i < 16; ++i) {
        w[i] = d * ((float)((qs[i] & 0x0F) | (((qh >> i) & 1) << 4)) - 16.0f);
        w[i + 16] = d * ((float)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16.0f);
    }
}

inline void decode_q5_1(const uint8_t* b, float* w) {  // 24 bytes: d f16, m f16, qh u32, nibbles
    const float d = half_to_float(b), m = half_to_float(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const uint8_t* qs = b + 8;
    for (int i = 0; i < 16; ++i) {
        w[i] = d * (float)((qs[i] & 0x0F) | (((qh >> i) & 1) << 4)) + m;
        w[i + 16] = d * (float)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) + m;
    }
}

// Q4_K and Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12 bytes (lib/gguf/qformats.py, _unpack_k_scales)
inline void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 0x3F;
        *mn = s[j + 4] & 0x3F;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

__attribute__((noinline)) void decode_q4_k(const uint8_t* b, float* w) {  // 144 bytes -> 256 weights
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j) {
        int sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        const float step = d * (float)sc, offset = dmin * (float)mn;
        const uint8_t* q = qs + 32 * (j / 2);  // sub-blocks 2i and 2i+1 share 32 bytes: low, high nibbles
        const int shift = (j & 1) ? 4 : 0;
        for (int i = 0; i < 32; ++i) w[32 * j + i] = step * (float)((q[i] >> shift) & 0x0F) - offset;
    }
}

__attribute__((noinline)) void decode_q5_k(const uint8_t* b, float* w) {  // 176 bytes: as Q4_K + 32 B of 5th bits
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; ++j) {
        int sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        const float step = d * (float)sc, offset = dmin * (float)mn;
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = (j & 1) ? 4 : 0;
        for (int i = 0; i < 32; ++i)
            w[32 * j + i] = step * (float)(((q[i] >> shift) & 0x0F) | (((qh[i] >> j) & 1) << 4)) - offset;
    }
}

__attribute__((noinline)) void decode_q6_k(const uint8_t* b, float* w) {  // 210 bytes: ql[128], qh[64], int8 scales[16], d f16
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_to_float(b + 208);
    for (int half = 0; half < 2; ++half) {  // weights 128·half + 32·quarter + i
        for (int quarter = 0; quarter < 4; ++quarter) {
            const uint8_t* lo = ql + 64 * half + 32 * (quarter & 1);  // quarters 2, 3: the high nibbles
            const uint8_t* hi = qh + 32 * half;
            const int lo_shift = 4 * (quarter >> 1), hi_shift = 2 * quarter;
            float* out = w + 128 * half + 32 * quarter;
            for (int h = 0; h < 2; ++h) {  // 16 weights per scale
                const float step = d * (float)sc[8 * half + 2 * quarter + h];
                for (int i = 16 * h; i < 16 * h + 16; ++i) {
                    const int q = ((lo[i] >> lo_shift) & 0x0F) | (((hi[i] >> hi_shift) & 0x03) << 4);
                    out[i] = step * (float)(q - 32);
                }
            }
        }
    }
}

struct Format {
    int block, bytes;
    void (*decode)(const uint8_t*, float*);
};

inline bool format_of(int qtype, Format* f) {
    switch (qtype) {
        case Q8_0: *f = {32, 34, decode_q8_0}; return true;
        case Q4_0: *f = {32, 18, decode_q4_0}; return true;
        case Q4_1: *f = {32, 20, decode_q4_1}; return true;
        case Q4_K: *f = {256, 144, decode_q4_k}; return true;
        case Q6_K: *f = {256, 210, decode_q6_k}; return true;
        case Q5_0: *f = {32, 22, decode_q5_0}; return true;
        case Q5_1: *f = {32, 24, decode_q5_1}; return true;
        case Q5_K: *f = {256, 176, decode_q5_k}; return true;
        case F32: *f = {16, 64, decode_f32}; return true;
        case Q4_1F: *f = {32, 24, decode_q4_1f}; return true;
        default: return false;
    }
}

// --- dot products of one weight row with `rows` rows of x --------------------------------------------------

// Portable: decode a block into a small buffer (it stays in L1), multiply-add it into per-row accumulators.
// The decoder is a template argument, so it is inlined and the compiler vectorizes both loops.
template <int R, int BLOCK, int BYTES, void (*DECODE)(const uint8_t*, float*)>
void row_dots_generic(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    alignas(64) float w[BLOCK];
    alignas(64) float acc[R][16] = {};
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        DECODE(wrow + blk * BYTES, w);
        const int64_t base = blk * BLOCK;
        for (int r = 0; r < R; ++r) {
            const float* xr = x + r * ldx + base;
            for (int i = 0; i < BLOCK; i += 16)
                for (int l = 0; l < 16; ++l) acc[r][l] += w[i + l] * xr[i + l];
        }
    }
    for (int r = 0; r < R; ++r) {
        float s = 0.0f;
        for (int l = 0; l < 16; ++l) s += acc[r][l];
        y[r * ldy] = s;
    }
}

#if defined(__AVX512F__)
// The hot types, 16 lanes at a time. Q4_1: a block has only 16 distinct weights, d·j + m for j = 0..15, so the
// kernel computes those 16 (one lane each: d·j is exact in float32 — 11 bits of d times 4 of j — so one fused
// multiply-add rounds exactly as the decoder's multiply-then-add) and looks each weight up by its nibble
// (vpermps reads the low 4 bits of each index). Then one FMA per 16 weights per row of x.
// Independent accumulators: an FMA waits ~4 cycles for the previous one into the same register, so one row of x
// (a decode step) keeps NB blocks x 2 halves of chains in flight; with more rows, the rows are the chains.
template <int R>
constexpr int chains_per_row() { return R == 1 ? 4 : 2; }

template <int R, bool WIDE = false>  // WIDE: the Q4_1F layout (float32 d, m)
void row_dots_q4_1_avx512(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int C = chains_per_row<R>(), NB = C / 2;  // NB blocks per step, each half of a block its own chain
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int64_t ahead = g_prefetch;  // 0: the block itself, already being read (off)
    int64_t blk = 0;
    auto one_block = [&](int64_t i, int c) {
        const uint8_t* b = wrow + i * (WIDE ? 24 : 20);
        prefetch_ahead(b, ahead);
        __m512 d, m;
        if constexpr (WIDE) {
            d = _mm512_broadcastss_ps(_mm_load_ss(reinterpret_cast<const float*>(b)));  // broadcast loads
            m = _mm512_broadcastss_ps(_mm_load_ss(reinterpret_cast<const float*>(b + 4)));
        } else {
            int32_t dm_bits;
            std::memcpy(&dm_bits, b, 4);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // d, m
            d = _mm512_broadcastss_ps(dm);
            m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
        }
        const __m512 table = _mm512_fmadd_ps(d, iota, m);  // the block's 16 possible weights
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (WIDE ? 8 : 4))));
        const __m512 w0 = _mm512_permutexvar_ps(q, table);                         // low nibbles: weights 0-15
        const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);  // high nibbles: 16-31
        for (int r = 0; r < R; ++r) {
            const float* xr = x + r * ldx + i * 32;
            acc[r][c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r][c]);
            acc[r][c + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r][c + 1]);
        }
    };
    for (; blk + NB <= nblocks; blk += NB)
        for (int u = 0; u < NB; ++u) one_block(blk + u, 2 * u);
    for (; blk < nblocks; ++blk) one_block(blk, 0);
    for (int r = 0; r < R; ++r) {
        __m512 sum = acc[r][0];
        for (int c = 1; c < C; ++c) sum = _mm512_add_ps(sum, acc[r][c]);
        y[r * ldy] = _mm512_reduce_add_ps(sum);
    }
}

template <int R>
void row_dots_q8_0_avx512(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int C = chains_per_row<R>(), NB = C / 2;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t ahead = g_prefetch;
    int64_t blk = 0;
    auto one_block = [&](int64_t i, int c) {
        const uint8_t* b = wrow + i * 34;
        prefetch_ahead(b, ahead);
        const __m512 d = _mm512_set1_ps(half_to_float(b));
        const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
        const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)));
        const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0));
        const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1));
        for (int r = 0; r < R; ++r) {
            const float* xr = x + r * ldx + i * 32;
            acc[r][c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r][c]);
            acc[r][c + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r][c + 1]);
        }
    };
    for (; blk + NB <= nblocks; blk += NB)
        for (int u = 0; u < NB; ++u) one_block(blk + u, 2 * u);
    for (; blk < nblocks; ++blk) one_block(blk, 0);
    for (int r = 0; r < R; ++r) {
        __m512 sum = acc[r][0];
        for (int c = 1; c < C; ++c) sum = _mm512_add_ps(sum, acc[r][c]);
        y[r * ldy] = _mm512_reduce_add_ps(sum);
    }
}

// Plain float32 weights (lib.modeling.fast's decode step): nothing to decode, so the loop is a stream of loads and FMAs,
// and what it costs is the memory read. Chains: 4 per row for one row of x, fewer as rows add their own.
template <int R>
void row_dots_f32_avx512(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int C = R == 1 ? 4 : (R == 2 ? 2 : 1);
    const float* w = reinterpret_cast<const float*>(wrow);
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    int64_t blk = 0;
    for (; blk + C <= nblocks; blk += C)
        for (int c = 0; c < C; ++c) {
            const __m512 wv = _mm512_loadu_ps(w + (blk + c) * 16);
            for (int r = 0; r < R; ++r)
                acc[r][c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + (blk + c) * 16), acc[r][c]);
        }
    for (; blk < nblocks; ++blk) {
        const __m512 wv = _mm512_loadu_ps(w + blk * 16);
        for (int r = 0; r < R; ++r) acc[r][0] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + blk * 16), acc[r][0]);
    }
    for (int r = 0; r < R; ++r) {
        __m512 sum = acc[r][0];
        for (int c = 1; c < C; ++c) sum = _mm512_add_ps(sum, acc[r][c]);
        y[r * ldy] = _mm512_reduce_add_ps(sum);
    }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The same two types 8 lanes at a time (AVX2 CPUs): weights decoded as the decoder does (Q4_1: d·q is exact,
// so one FMA d·q + m rounds as multiply-then-add), one FMA per 8 weights per row of x.
inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <int R, bool WIDE = false>  // WIDE: the Q4_1F layout (float32 d, m)
void row_dots_q4_1_avx2(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    __m256 acc[R], acc_hi[R];  // two chains per row (low and high nibbles): an FMA waits for the one before
    for (int r = 0; r < R; ++r) acc[r] = acc_hi[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    const int64_t ahead = g_prefetch;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const uint8_t* b = wrow + blk * (WIDE ? 24 : 20);
        prefetch_ahead(b, ahead);
        float dm[2];
        if constexpr (WIDE) {
            std::memcpy(dm, b, 8);
        } else {
            dm[0] = half_to_float(b);
            dm[1] = half_to_float(b + 2);
        }
        const __m256 d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
        const uint8_t* qs = b + (WIDE ? 8 : 4);
        for (int half = 0; half < 2; ++half) {  // nibble bytes 0-7, then 8-15
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * half)));
            const __m256 w_lo = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(q, low4)), m);
            const __m256 w_hi = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), m);
            for (int r = 0; r < R; ++r) {
                const float* xr = x + r * ldx + blk * 32 + 8 * half;
                acc[r] = _mm256_fmadd_ps(w_lo, _mm256_loadu_ps(xr), acc[r]);
                acc_hi[r] = _mm256_fmadd_ps(w_hi, _mm256_loadu_ps(xr + 16), acc_hi[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) y[r * ldy] = hsum256(_mm256_add_ps(acc[r], acc_hi[r]));
}

template <int R>
void row_dots_q8_0_avx2(const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    __m256 acc[R][2];  // two chains per row: an FMA waits for the one before into the same register
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int64_t ahead = g_prefetch;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const uint8_t* b = wrow + blk * 34;
        prefetch_ahead(b, ahead);
        const __m256 d = _mm256_set1_ps(half_to_float(b));
        for (int part = 0; part < 4; ++part) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * part)));
            const __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
            for (int r = 0; r < R; ++r)
                acc[r][part & 1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * ldx + blk * 32 + 8 * part), acc[r][part & 1]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * ldy] = hsum256(_mm256_add_ps(acc[r][0], acc[r][1]));
}
#endif

template <int R>
void row_dots(int qtype, const uint8_t* wrow, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
    switch (qtype) {
#if defined(__AVX512F__)
        case Q4_1: return row_dots_q4_1_avx512<R>(wrow, nblocks, x, ldx, y, ldy);
        case Q4_1F: return row_dots_q4_1_avx512<R, true>(wrow, nblocks, x, ldx, y, ldy);
        case Q8_0: return row_dots_q8_0_avx512<R>(wrow, nblocks, x, ldx, y, ldy);
        case F32: return row_dots_f32_avx512<R>(wrow, nblocks, x, ldx, y, ldy);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        case Q4_1: return row_dots_q4_1_avx2<R>(wrow, nblocks, x, ldx, y, ldy);
        case Q4_1F: return row_dots_q4_1_avx2<R, true>(wrow, nblocks, x, ldx, y, ldy);
        case Q8_0: return row_dots_q8_0_avx2<R>(wrow, nblocks, x, ldx, y, ldy);
        case F32: return row_dots_generic<R, 16, 64, decode_f32>(wrow, nblocks, x, ldx, y, ldy);
#else
        case Q4_1: return row_dots_generic<R, 32, 20, decode_q4_1>(wrow, nblocks, x, ldx, y, ldy);
        case Q4_1F: return row_dots_generic<R, 32, 24, decode_q4_1f>(wrow, nblocks, x, ldx, y, ldy);
        case Q8_0: return row_dots_generic<R, 32, 34, decode_q8_0>(wrow, nblocks, x, ldx, y, ldy);
        case F32: return row_dots_generic<R, 16, 64, decode_f32>(wrow, nblocks, x, ldx, y, ldy);
#endif
        case Q4_0: return row_dots_generic<R, 32, 18, decode_q4_0>(wrow, nblocks, x, ldx, y, ldy);
        case Q4_K: return row_dots_generic<R, 256, 144, decode_q4_k>(wrow, nblocks, x, ldx, y, ldy);
        case Q6_K: return row_dots_generic<R, 256, 210, decode_q6_k>(wrow, nblocks, x, ldx, y, ldy);
        case Q5_0: return row_dots_generic<R, 32, 22, decode_q5_0>(wrow, nblocks, x, ldx, y, ldy);
        case Q5_1: return row_dots_generic<R, 32, 24, decode_q5_1>(wrow, nblocks, x, ldx, y, ldy);
        case Q5_K: return row_dots_generic<R, 256, 176, decode_q5_k>(wrow, nblocks, x, ldx, y, ldy);
    }
}

using RowDots = void (*)(int, const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);
constexpr RowDots kRowDots[kMaxRows + 1] = {nullptr, row_dots<1>, row_dots<2>, row_dots<3>, row_dots<4>,
                                            row_dots<5>, row_dots<6>, row_dots<7>, row_dots<8>};

}  // namespace

extern "C" {

// Which instruction set the kernel was built for (printed by the benchmark).
const char* qmatmul_isa() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return "avx2";
#else
    return "generic";
#endif
}

// The software prefetch distance of the quantized loops in bytes (0: off); returns the one before.
int64_t qmatmul_set_prefetch(int64_t bytes) {
    const int64_t before = g_prefetch;
    g_prefetch = bytes < 0 ? 0 : bytes;
    return before;
}

// y[m, n] = sum_k x[m, k] · W[n, k]; x float32 [m, k] (rows ldx apart), w the n rows of GGUF blocks
// (k / block blocks each, contiguous), y float32 [m, n] (rows ldy apart). Returns 0, or -1 for an unknown type.
int qmatmul_f32_ld(int qtype, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, int64_t ldx,
                   float* y, int64_t ldy, int threads) {
    Format f;
    if (!format_of(qtype, &f)) return -1;
    const int64_t nblocks = k / f.block, row_bytes = nblocks * f.bytes;
#pragma omp parallel for schedule(static) num_threads(threads) if (n * k >= kMinParallelWeights)
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
            const int64_t rows = m - r0 < kMaxRows ? m - r0 : kMaxRows;
            kRowDots[rows](qtype, w + j * row_bytes, nblocks, x + r0 * ldx, ldx, y + r0 * ldy + j, ldy);
        }
    }
    return 0;
}

int qmatmul_f32(int qtype, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, int64_t ldx,
                float* y, int threads) {
    return qmatmul_f32_ld(qtype, w, n, k, x, m, ldx, y, n, threads);
}

// out[n, k] = the weights, decoded (for many rows of x at once, where a float32 matmul wins).
int dequantize_f32(int qtype, const uint8_t* w, int64_t n, int64_t k, float* out, int threads) {
    Format f;
    if (!format_of(qtype, &f)) return -1;
    const int64_t nblocks = k / f.block, row_bytes = nblocks * f.bytes;
#pragma omp parallel for schedule(static) num_threads(threads) if (n * k >= kMinParallelWeights)
    for (int64_t j = 0; j < n; ++j)
        for (int64_t blk = 0; blk < nblocks; ++blk) f.decode(w + j * row_bytes + blk * f.bytes, out + j * k + blk * f.block);
    return 0;
}

}  // extern "C"

// --- one decode step of a llama model on GGUF blocks: every layer in one call ---------------------------------
//
// lib.modeling.fast.FastLlama (kernel "cpp") and lib.quantization.quant_linear.GGUFFastLlama call `decode_steps` for a step of a few
// rows (batch rows >= 1, one or a few new positions each) on
// lib.modeling.kv_cache's preallocated cache: the same computation as lib.modeling.fast.FastLlama._layer_step, layer after layer,
// without returning to Python between operations (which, at SmolLM2's size, cost as much as the matmuls).
// Float32 throughout; the results equal the Python step's up to the order of float32 sums.

struct QWeight {  // one matmul weight: up to 3 parts stacked along the output (Q, K, V may differ in type)
    int32_t nparts;
    int32_t qtype[3];
    int64_t rows[3];
    const uint8_t* blocks[3];
};

struct DecodeLayer {
    const float* attn_norm;
    const float* mlp_norm;
    QWeight wqkv, wo, w_gate_up, w_down;
};

struct DecodeDims {
    int64_t d_model, n_heads, n_kv_heads, head_dim, d_ff, max_len;
    float eps;
};

namespace {

int weight_matmul(const QWeight& w, int64_t k, const float* x, int64_t m, float* y, int64_t ldy, int threads) {
    int64_t col = 0;
    for (int p = 0; p < w.nparts; ++p) {
        if (qmatmul_f32_ld(w.qtype[p], w.blocks[p], w.rows[p], k, x, m, k, y + col, ldy, threads) != 0) return -1;
        col += w.rows[p];
    }
    return 0;
}

// out = x / sqrt(mean(x²) + eps) · w  (lib.modeling.fast's _rms: normalise, then scale)
void rms_norm(const float* x, const float* w, int64_t d, float eps, float* out) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float r = 1.0f / std::sqrt(ss / (float)d + eps);
    for (int64_t i = 0; i < d; ++i) out[i] = (x[i] * r) * w[i];
}

// RoPE, "rotate half" (lib.modeling.llama.apply_rope): pairs (i, i + d/2) turned by the position's angles
void rope(float* v, const float* cos, const float* sin, int64_t d) {
    const int64_t h = d / 2;
    for (int64_t i = 0; i < h; ++i) {
        const float a = v[i], b = v[i + h];
        v[i] = a * cos[i] + (-b) * sin[i];
        v[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

}  // namespace

extern "C" {

// x [batch, d_model] (the embedded tokens) becomes the last layer's output, in place. pos: the position of the
// new token (the cache's length before the step); k_caches[l], v_caches[l]: layer l's buffers [batch,
// n_kv_heads, max_len, head_dim], written at pos. cos, sin: the RoPE row of pos [head_dim]. Returns 0, or -1.
// `tokens` new positions per sequence (pos .. pos + tokens - 1: a verify step of week 18 when > 1); x holds
// batch · tokens rows, sequence by sequence; cos and sin the rows for those positions ([tokens, head_dim]).
int decode_steps(const DecodeLayer* layers, int n_layers, const DecodeDims* dims, float* x, int64_t batch,
                 int64_t tokens, int64_t pos, const float* cos, const float* sin, float* const* k_caches,
                 float* const* v_caches, int threads) {
    const int64_t D = dims->d_model, H = dims->n_heads, Hkv = dims->n_kv_heads, hd = dims->head_dim;
    const int64_t F = dims->d_ff, L = dims->max_len, S = pos + tokens, g = H / Hkv, nqkv = (H + 2 * Hkv) * hd;
    if (pos < 0 || tokens < 1 || pos + tokens > L || H % Hkv) return -1;
    const int64_t batch_rows = batch;
    batch = batch_rows * tokens;  // rows of x from here on
    std::vector<float> xn(batch * D), qkv(batch * nqkv), att(batch * H * hd), tmp(batch * D);
    std::vector<float> gu(batch * 2 * F), act(batch * F);
    const float scale = 1.0f / std::sqrt((float)hd);
    for (int l = 0; l < n_layers; ++l) {
        const DecodeLayer& lw = layers[l];
        float *kc = k_caches[l], *vc = v_caches[l];
        for (int64_t r = 0; r < batch; ++r) rms_norm(x + r * D, lw.attn_norm, D, dims->eps, xn.data() + r * D);
        if (weight_matmul(lw.wqkv, D, xn.data(), batch, qkv.data(), nqkv, threads)) return -1;
        for (int64_t ri = 0; ri < batch; ++ri) {  // RoPE on q and k; k and v into the cache at pos + t
            const int64_t r = ri / tokens, t = ri % tokens;
            float* q = qkv.data() + ri * nqkv;
            for (int64_t h = 0; h < H + Hkv; ++h) rope(q + h * hd, cos + t * hd, sin + t * hd, hd);
            for (int64_t h = 0; h < Hkv; ++h) {
                const int64_t at = ((r * Hkv + h) * L + pos + t) * hd;
                std::memcpy(kc + at, q + (H + h) * hd, hd * sizeof(float));
                std::memcpy(vc + at, q + (H + Hkv + h) * hd, hd * sizeof(float));
            }
        }
        // attention of each new query over positions 0..pos + t (the causal mask: a query never reads a later
        // position, though all of them are in the cache now); GQA: query head h reads KV head h / g
#pragma omp parallel num_threads(threads) if (batch * H * S * hd >= kMinParallelWeights)
        {
            std::vector<float> p(S);
#pragma omp for schedule(static)
            for (int64_t rh = 0; rh < batch * H; ++rh) {
                const int64_t ri = rh / H, h = rh % H, r = ri / tokens, St = pos + ri % tokens + 1;  // this query's positions
                const float* q = qkv.data() + ri * nqkv + h * hd;
                const float* K = kc + (r * Hkv + h / g) * L * hd;
                const float* V = vc + (r * Hkv + h / g) * L * hd;
                float mx = -INFINITY;
                for (int64_t s = 0; s < St; ++s) {
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t i = 0; i < hd; ++i) dot += q[i] * K[s * hd + i];
                    p[s] = dot * scale;
                    mx = p[s] > mx ? p[s] : mx;
                }
                float sum = 0.0f;
                for (int64_t s = 0; s < St; ++s) {
                    p[s] = std::exp(p[s] - mx);
                    sum += p[s];
                }
                float* o = att.data() + ri * H * hd + h * hd;
                for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
                for (int64_t s = 0; s < St; ++s) {
                    const float w = p[s] / sum;
#pragma omp simd
                    for (int64_t i = 0; i < hd; ++i) o[i] += w * V[s * hd + i];
                }
            }
        }
        if (weight_matmul(lw.wo, H * hd, att.data(), batch, tmp.data(), D, threads)) return -1;
        for (int64_t i = 0; i < batch * D; ++i) x[i] += tmp[i];
        for (int64_t r = 0; r < batch; ++r) rms_norm(x + r * D, lw.mlp_norm, D, dims->eps, xn.data() + r * D);
        if (weight_matmul(lw.w_gate_up, D, xn.data(), batch, gu.data(), 2 * F, threads)) return -1;
        for (int64_t r = 0; r < batch; ++r) {  // silu(gate) · up
            const float *gate = gu.data() + r * 2 * F, *up = gate + F;
            for (int64_t i = 0; i < F; ++i) act[r * F + i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        }
        if (weight_matmul(lw.w_down, F, act.data(), batch, tmp.data(), D, threads)) return -1;
        for (int64_t i = 0; i < batch * D; ++i) x[i] += tmp[i];
    }
    return 0;
}

}  // extern "C"
