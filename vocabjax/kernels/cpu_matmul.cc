// Weight-streaming skinny matmul for XLA:CPU: y[M, F] = x[M, D] . W[F, D]^T (* scale[F]).
//
// Decoding multiplies a few rows (M = batch x block tokens, 1..64) by large weight matrices
// stored [out, in]. That is memory bound: the floor is one pass over W. XLA:CPU runs M = 1 as a
// matvec at memory speed, but M = 2..16 as an Eigen GEMM that repacks W first (~1.7x the
// matvec's time for M = 4 on the Qwen2.5-1.5B MLPs), and bf16 weights as a converting GEMM that
// is no faster than f32 (and 10x slower at M = 1). This kernel reads each weight row once,
// converts it to f32 in registers (bf16: a 16-bit shift, int8: a convert), and multiplies it
// with every one of the M rows of x held in L1: exact f32 arithmetic on the stored weight
// values, at the memory speed of the stored dtype.
//
// GGUF's quantized blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) are a weight source like the
// dtypes: 16 values at a time are dequantized in registers with the f32 operations of `gguf`'s
// own dequantization (a product, then a subtraction or an addition where the type has a
// minimum, each rounded once), then multiplied exactly as f32 weights are. The result is the
// f32 kernel's on the dequantized matrix, bit for bit.
//
// Every output y[m, f] is the same sequence of f32 operations whatever M is and wherever row f
// falls in a thread's block (16 lane accumulators over d in order, then a fixed tree sum), so
// a token's result in a verified block equals its result in a one-token step bit for bit.
// The AVX-512 path, the AVX2 path (two 8-lane halves) and the portable fallback (explicit
// fma; built with -ffp-contract=off so the compiler fuses nothing on its own, which made the
// fallback's results depend on the register tile, i.e. on M, on AVX2 hosts) compute the same.
//
// Threads: rows of W are split in chunks pulled from a shared counter by the calling thread
// and by tasks scheduled on XLA's intra-op thread pool; if the pool runs nothing the caller
// does all chunks, so it never waits on a task that cannot run.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kRowsPerChunk = 64;

// one stored value as f32 (exact): f32, bf16 (its 16 high bits), int8
inline float to_f32(float w) { return w; }
inline float to_f32(uint16_t w) {
  uint32_t u = static_cast<uint32_t>(w) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline float to_f32(int8_t w) { return static_cast<float>(w); }

// ---- loading 16 weights as f32 ------------------------------------------------------------
#if defined(__AVX512F__)
using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload_x(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload_x_tail(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {
  // fixed pairwise order (not _mm512_reduce_add_ps, whose order is the compiler's choice)
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s8[8];
  for (int i = 0; i < 8; ++i) s8[i] = t[i] + t[i + 8];
  float s4[4];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
inline Vec wload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec wload_tail(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec wload(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec wload_tail(const uint16_t* p, __mmask16 k) {
  __m256i h = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec wload(const int8_t* p) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
inline Vec wload_tail(const int8_t* p, __mmask16 k) {
  __m128i b = _mm_maskz_loadu_epi8(k, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2: the 16 lanes as two 8-lane halves, the same fused multiply-adds and the same tree sum,
// so a row's result is the AVX-512 path's bit for bit. Tails go through a zeroed 16-wide copy.
struct Vec { __m256 lo, hi; };
using Mask = int;
inline Vec vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec vload_x(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec vfma(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline float vsum(Vec v) {
  alignas(32) float s8[8];
  _mm256_store_ps(s8, _mm256_add_ps(v.lo, v.hi));  // s8[i] = t[i] + t[i + 8]
  float s4[4];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
inline Vec wload(const float* p) { return vload_x(p); }
inline __m256 bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec wload(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline __m256 i8x8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
inline Vec wload(const int8_t* p) { return {i8x8(p), i8x8(p + 8)}; }
template <typename W>
inline Vec load_tail(const W* p, Mask n) {
  alignas(64) W t[16] = {};
  std::memcpy(t, p, static_cast<size_t>(n) * sizeof(W));
  return wload(static_cast<const W*>(t));
}
inline Vec vload_x_tail(const float* p, Mask n) { return load_tail(p, n); }
template <typename W> inline Vec wload_tail(const W* p, Mask n) { return load_tail(p, n); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
#else
// Portable fallback with the same arithmetic order (16 lanes, fused multiply-adds, same tree
// sum); the kernel is built with -ffp-contract=off, so nothing else gets fused.
struct Vec { float v[16]; };
inline Vec vzero() { Vec r; for (float& f : r.v) f = 0.f; return r; }
template <typename W>
inline Vec load16(const W* p, int n) {
  Vec r; for (int i = 0; i < 16; ++i) r.v[i] = i < n ? to_f32(p[i]) : 0.f; return r;
}
using Mask = int;
inline Vec vload_x(const float* p) { return load16(p, 16); }
inline Vec vload_x_tail(const float* p, Mask n) { return load16(p, n); }
template <typename W> inline Vec wload(const W* p) { return load16(p, 16); }
template <typename W> inline Vec wload_tail(const W* p, Mask n) { return load16(p, n); }
inline void vstore(float* p, Vec v) { std::memcpy(p, v.v, sizeof(v.v)); }
inline Vec vfma(Vec a, Vec b, Vec c) {
  for (int i = 0; i < 16; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c;
}
inline float vsum(Vec v) {
  float s8[8]; for (int i = 0; i < 8; ++i) s8[i] = v.v[i] + v.v[i + 8];
  float s4[4]; for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
#endif

#if defined(__AVX512F__)
using Mask = __mmask16;
inline Mask tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
#else
inline Mask tail_mask(int64_t n) { return static_cast<int>(n); }
#endif

// ---- weight sources: a row's 16 values at d as f32 ------------------------------------------
// Dense<W>: W[F, D] stored as float, bf16 (uint16_t) or int8. Blocked<T>: rows of GGUF blocks.
template <typename W>
struct Dense {
  const W* w;
  int64_t D;
  inline Vec load(int64_t r, int64_t d) const { return wload(w + r * D + d); }
  inline Vec load_tail(int64_t r, int64_t d, Mask k) const { return wload_tail(w + r * D + d, k); }
  inline const char* row(int64_t r) const { return reinterpret_cast<const char*>(w + r * D); }
};

enum class QT { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K };
template <QT T> struct QTraits;
template <> struct QTraits<QT::Q4_0> { static constexpr int64_t values = 32, bytes = 18; };
template <> struct QTraits<QT::Q4_1> { static constexpr int64_t values = 32, bytes = 20; };
template <> struct QTraits<QT::Q5_0> { static constexpr int64_t values = 32, bytes = 22; };
template <> struct QTraits<QT::Q5_1> { static constexpr int64_t values = 32, bytes = 24; };
template <> struct QTraits<QT::Q8_0> { static constexpr int64_t values = 32, bytes = 34; };
template <> struct QTraits<QT::Q4_K> { static constexpr int64_t values = 256, bytes = 144; };
template <> struct QTraits<QT::Q5_K> { static constexpr int64_t values = 256, bytes = 176; };
template <> struct QTraits<QT::Q6_K> { static constexpr int64_t values = 256, bytes = 210; };
// whether rows of `row_bytes` bytes hold D values in whole blocks of type T
template <QT T> constexpr bool whole_blocks(int64_t D, int64_t row_bytes) {
  return D % QTraits<T>::values == 0 && row_bytes == D / QTraits<T>::values * QTraits<T>::bytes;
}

inline float f16_to_f32(const uint8_t* p) {  // little-endian float16 -> f32 (exact)
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    uint32_t e = 113;
    while (!(man & 0x400u)) { man <<= 1; --e; }
    u = sign | (e << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

inline uint32_t u32_at(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// The K types' 6-bit scale and minimum of sub-block s from their 12 packed bytes.
inline void k_scale_min(const uint8_t* s12, int s, float* sc, float* mn) {
  if (s < 4) {
    *sc = static_cast<float>(s12[s] & 63);
    *mn = static_cast<float>(s12[s + 4] & 63);
  } else {
    *sc = static_cast<float>((s12[s + 4] & 0xF) | ((s12[s - 4] >> 6) << 4));
    *mn = static_cast<float>((s12[s + 4] >> 4) | ((s12[s] >> 6) << 4));
  }
}

// 32 values of a block row at d (a multiple of 32; for the K types one sub-block of 32), in
// the terms every type shares: integer codes q[l] for l in [0, 32) made of the low bits
// (byte lo[l % 16] >> (l < 16 ? lo_shift[0] : lo_shift[1]), 4 bits, lo advancing by lo_step
// bytes for the second half; Q8_0: int8 bytes), high bits (`hi`: hi[l] >> hi_shift & hi_mask,
// or bit l of the 32-bit word at `bits`), minus `offset`; value = q x a (x a2 for the second
// half of Q6_K), then - b (K types) or + b (Q4_1, Q5_1), each rounded as gguf rounds.
struct Group {
  const uint8_t* lo;
  int lo_shift[2];
  int lo_step;
  const uint8_t* hi;  // Q5_K, Q6_K
  int hi_shift, hi_mask;
  const uint8_t* bits;  // Q5_0, Q5_1
  int offset;
  float a[2], b;
  int b_sign;  // 0: no minimum, -1: q a - b, +1: q a + b
};

template <QT T>
inline Group group32(const uint8_t* row, int64_t d) {
  constexpr int64_t V = QTraits<T>::values, B = QTraits<T>::bytes;
  const uint8_t* p = row + (d / V) * B;
  const int o = static_cast<int>(d % V);
  Group g{};
  if constexpr (T == QT::Q8_0) {
    g.lo = p + 2; g.lo_step = 16;
    g.a[0] = g.a[1] = f16_to_f32(p);
  } else if constexpr (T == QT::Q4_0 || T == QT::Q4_1 || T == QT::Q5_0 || T == QT::Q5_1) {
    constexpr int qs = T == QT::Q4_0 ? 2 : T == QT::Q4_1 ? 4 : T == QT::Q5_0 ? 6 : 8;
    g.lo = p + qs; g.lo_shift[1] = 4;
    g.a[0] = g.a[1] = f16_to_f32(p);
    if constexpr (T == QT::Q5_0) g.bits = p + 2;
    if constexpr (T == QT::Q5_1) g.bits = p + 4;
    if constexpr (T == QT::Q4_0) g.offset = 8;
    if constexpr (T == QT::Q5_0) g.offset = 16;
    if constexpr (T == QT::Q4_1 || T == QT::Q5_1) { g.b = f16_to_f32(p + 2); g.b_sign = 1; }
  } else if constexpr (T == QT::Q4_K || T == QT::Q5_K) {
    const int s = o / 32, c = s / 2;
    g.lo = p + (T == QT::Q4_K ? 16 : 48) + 32 * c; g.lo_step = 16;
    g.lo_shift[0] = g.lo_shift[1] = (s & 1) * 4;
    if constexpr (T == QT::Q5_K) { g.hi = p + 16; g.hi_shift = s; g.hi_mask = 1; }
    float sc, mn;
    k_scale_min(p + 4, s, &sc, &mn);
    g.a[0] = g.a[1] = f16_to_f32(p) * sc;
    g.b = f16_to_f32(p + 2) * mn;
    g.b_sign = -1;
  } else {  // Q6_K: half h of 128 values, quarter i / 32 of it
    const int h = o / 128, i = o % 128;
    g.lo = p + 64 * h + i % 64; g.lo_step = 16;
    g.lo_shift[0] = g.lo_shift[1] = (i / 64) * 4;
    g.hi = p + 128 + 32 * h; g.hi_shift = 2 * (i / 32); g.hi_mask = 3;
    g.offset = 32;
    const float dd = f16_to_f32(p + 208);
    g.a[0] = dd * static_cast<float>(static_cast<int8_t>(p[192 + o / 16]));
    g.a[1] = dd * static_cast<float>(static_cast<int8_t>(p[192 + o / 16 + 1]));
  }
  return g;
}

// Value l in [0, 32) of a group, one at a time (the reference the vector paths equal).
template <QT T>
inline float group_value(const Group& g, int l) {
  const int half = l / 16;
  int q;
  if constexpr (T == QT::Q8_0) {
    q = static_cast<int8_t>(g.lo[l]);
  } else {
    q = (g.lo[l % 16 + half * g.lo_step] >> g.lo_shift[half]) & 15;
    if (g.hi) q |= ((g.hi[l] >> g.hi_shift) & g.hi_mask) << 4;
    if (g.bits) q |= ((u32_at(g.bits) >> l) & 1u) << 4;
    q -= g.offset;
  }
  const float v = static_cast<float>(q) * g.a[half];
  return g.b_sign < 0 ? v - g.b : g.b_sign > 0 ? v + g.b : v;
}

#if defined(__AVX512F__)
// AVX-512: the 4- and 5-bit types look their values up in a table of the 16 (32) values a
// code can take, computed with the same operations (so the same values); Q8_0 and Q6_K
// convert their codes and multiply.
inline __m512i bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m512 iota16(float from) {
  return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_ps(from));
}
template <QT T>
inline __m512 table16(const Group& g, float from) {  // values of codes from .. from + 15
  const __m512 v = _mm512_mul_ps(iota16(from - static_cast<float>(g.offset)),
                                 _mm512_set1_ps(g.a[0]));
  if (g.b_sign < 0) return _mm512_sub_ps(v, _mm512_set1_ps(g.b));
  if (g.b_sign > 0) return _mm512_add_ps(v, _mm512_set1_ps(g.b));
  return v;
}

template <QT T>
inline void dequant32(const Group& g, Vec& a, Vec& b) {
  if constexpr (T == QT::Q8_0) {
    const __m512 s = _mm512_set1_ps(g.a[0]);
    a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.lo)))), s);
    b = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.lo + 16)))), s);
  } else if constexpr (T == QT::Q6_K) {
    const __m512i m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    const __m512i off = _mm512_set1_epi32(32), ls = _mm512_set1_epi32(g.lo_shift[0]);
    const __m512i hs = _mm512_set1_epi32(g.hi_shift);
    for (int half = 0; half < 2; ++half) {
      __m512i q = _mm512_and_si512(_mm512_srlv_epi32(bytes16(g.lo + 16 * half), ls), m15);
      __m512i h = _mm512_and_si512(_mm512_srlv_epi32(bytes16(g.hi + 16 * half), hs), m3);
      q = _mm512_sub_epi32(_mm512_or_si512(q, _mm512_slli_epi32(h, 4)), off);
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(g.a[half]));
      (half ? b : a) = v;
    }
  } else if constexpr (T == QT::Q4_0 || T == QT::Q4_1 || T == QT::Q4_K) {
    const __m512 t = table16<T>(g, 0.f);  // the index's low 4 bits pick the lane
    __m512i ia = bytes16(g.lo), ib = bytes16(g.lo + g.lo_step);
    if (g.lo_shift[0]) ia = _mm512_srli_epi32(ia, 4);
    if (g.lo_shift[1]) ib = _mm512_srli_epi32(ib, 4);
    a = _mm512_permutexvar_ps(ia, t);
    b = _mm512_permutexvar_ps(ib, t);
  } else {  // Q5_0, Q5_1, Q5_K: 32 values, the fifth bit picks the table
    const __m512 t0 = table16<T>(g, 0.f), t1 = table16<T>(g, 16.f);
    const __m512i m15 = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    __m512i ia = bytes16(g.lo), ib = bytes16(g.lo + g.lo_step);
    ia = g.lo_shift[0] ? _mm512_srli_epi32(ia, 4) : _mm512_and_si512(ia, m15);
    ib = g.lo_shift[1] ? _mm512_srli_epi32(ib, 4) : _mm512_and_si512(ib, m15);
    __m512i ha, hb;
    if constexpr (T == QT::Q5_K) {
      const __m512i hs = _mm512_set1_epi32(g.hi_shift);
      ha = _mm512_and_si512(_mm512_srlv_epi32(bytes16(g.hi), hs), one);
      hb = _mm512_and_si512(_mm512_srlv_epi32(bytes16(g.hi + 16), hs), one);
    } else {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(u32_at(g.bits)));
      const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      ha = _mm512_and_si512(_mm512_srlv_epi32(w, lanes), one);
      hb = _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))),
                            one);
    }
    a = _mm512_permutex2var_ps(t0, _mm512_or_si512(ia, _mm512_slli_epi32(ha, 4)), t1);
    b = _mm512_permutex2var_ps(t0, _mm512_or_si512(ib, _mm512_slli_epi32(hb, 4)), t1);
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2: `group_value` eight lanes at a time, the same integer codes and the same float
// operations (the kernel is built with -ffp-contract=off), so the same values.
template <QT T>
inline __m256 group8(const Group& g, int c) {  // values l = 8c .. 8c + 7
  const int half = c / 2;
  __m256i q;
  if constexpr (T == QT::Q8_0) {
    q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g.lo + 8 * c)));
  } else {
    const uint8_t* lo = g.lo + (8 * c) % 16 + half * g.lo_step;
    q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo)));
    q = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_set1_epi32(g.lo_shift[half])),
                         _mm256_set1_epi32(15));
    if (g.hi) {
      __m256i h = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g.hi + 8 * c)));
      h = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_set1_epi32(g.hi_shift)),
                           _mm256_set1_epi32(g.hi_mask));
      q = _mm256_or_si256(q, _mm256_slli_epi32(h, 4));
    }
    if (g.bits) {
      const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32_at(g.bits))),
                                    _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * c)));
      q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
    }
    q = _mm256_sub_epi32(q, _mm256_set1_epi32(g.offset));
  }
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(g.a[half]));
  if (g.b_sign < 0) return _mm256_sub_ps(v, _mm256_set1_ps(g.b));
  if (g.b_sign > 0) return _mm256_add_ps(v, _mm256_set1_ps(g.b));
  return v;
}

template <QT T>
inline void dequant32(const Group& g, Vec& a, Vec& b) {
  a = {group8<T>(g, 0), group8<T>(g, 1)};
  b = {group8<T>(g, 2), group8<T>(g, 3)};
}
#else
template <QT T>
inline void dequant32(const Group& g, Vec& a, Vec& b) {
  alignas(64) float t[32];
  for (int l = 0; l < 32; ++l) t[l] = group_value<T>(g, l);
  a = vload_x(t);
  b = vload_x(t + 16);
}
#endif

template <typename W>
constexpr bool kPairs = false;  // whether a source loads 32 values at a time (`load2`)

template <QT T>
struct Blocked {
  const uint8_t* w;
  int64_t row_bytes;
  // 32 values at d (a multiple of 32): the block's scales decoded once for both halves
  inline void load2(int64_t r, int64_t d, Vec& a, Vec& b) const {
    dequant32<T>(group32<T>(w + r * row_bytes, d), a, b);
  }
  inline Vec load(int64_t r, int64_t d) const {  // 16 values (d a multiple of 16)
    Vec a, b;
    load2(r, d / 32 * 32, a, b);
    return d % 32 ? b : a;
  }
  // rows are whole blocks (D a multiple of 32): the masked tail never runs
  inline Vec load_tail(int64_t r, int64_t d, Mask) const { return load(r, d); }
  inline const char* row(int64_t r) const {
    return reinterpret_cast<const char*>(w + r * row_bytes);
  }
};
template <QT T>
constexpr bool kPairs<Blocked<T>> = true;

// One tile: rows [r, r + R) of W against rows [m, m + TM) of x.
template <int R, int TM, typename S>
inline void tile(const float* x, const S& w, const float* scale, float* y, int64_t D,
                 int64_t F, int64_t r, int64_t m, const char* pf = nullptr,
                 int64_t pf_per_step = 0, const char* pf_end = nullptr) {
  Vec acc[R][TM];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < TM; ++j) acc[i][j] = vzero();
  const int64_t full = D / 16 * 16;
  int64_t d0 = 0;
  if constexpr (kPairs<S>) {
    // 32 values a step (a block source decodes its scales once for both halves); the same
    // multiply-adds in the same order as two 16-value steps
    for (; d0 + 32 <= full; d0 += 32) {
#if defined(__AVX512F__)
      for (int64_t q = 0; q < 2 * pf_per_step && pf < pf_end; ++q, pf += 64)
        _mm_prefetch(pf, _MM_HINT_T1);
#endif
      Vec wa[R], wb[R];
      for (int i = 0; i < R; ++i) w.load2(r + i, d0, wa[i], wb[i]);
      for (int j = 0; j < TM; ++j) {
        Vec xa = vload_x(x + (m + j) * D + d0);
        for (int i = 0; i < R; ++i) acc[i][j] = vfma(wa[i], xa, acc[i][j]);
        Vec xb = vload_x(x + (m + j) * D + d0 + 16);
        for (int i = 0; i < R; ++i) acc[i][j] = vfma(wb[i], xb, acc[i][j]);
      }
    }
  }
  for (int64_t d = d0; d < full; d += 16) {
#if defined(__AVX512F__)
    for (int64_t q = 0; q < pf_per_step && pf < pf_end; ++q, pf += 64)
      _mm_prefetch(pf, _MM_HINT_T1);
#endif
    Vec wv[R];
    for (int i = 0; i < R; ++i) wv[i] = w.load(r + i, d);
    for (int j = 0; j < TM; ++j) {
      Vec xv = vload_x(x + (m + j) * D + d);
      for (int i = 0; i < R; ++i) acc[i][j] = vfma(wv[i], xv, acc[i][j]);
    }
  }
  if (full < D) {
    Mask k = tail_mask(D - full);
    Vec wv[R];
    for (int i = 0; i < R; ++i) wv[i] = w.load_tail(r + i, full, k);
    for (int j = 0; j < TM; ++j) {
      Vec xv = vload_x_tail(x + (m + j) * D + full, k);
      for (int i = 0; i < R; ++i) acc[i][j] = vfma(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    const float s = scale ? scale[r + i] : 1.f;
    for (int j = 0; j < TM; ++j) {
      float v = vsum(acc[i][j]);
      y[(m + j) * F + r + i] = scale ? v * s : v;
    }
  }
}

// Rows [r, r + R) of W against all M rows of x: tiles of TMAX rows of x, then the remainder.
template <int R, int N, typename S>
inline void remainder(int64_t rem, const float* x, const S& w, const float* scale, float* y,
                      int64_t D, int64_t F, int64_t r, int64_t m, const char* pf,
                      int64_t per_step, const char* pf_end) {
  if (rem == N) {
    tile<R, N>(x, w, scale, y, D, F, r, m, pf, per_step, pf_end);
  } else if constexpr (N > 1) {
    remainder<R, N - 1>(rem, x, w, scale, y, D, F, r, m, pf, per_step, pf_end);
  }
}

template <int R, int TMAX, typename S>
inline void rows(const float* x, const S& w, const float* scale, float* y, int64_t M,
                 int64_t D, int64_t F, int64_t r, int64_t r1) {
  int64_t m = 0;
  // Software prefetch (into L2) of the next group of R rows of W, spread evenly over this
  // group's passes: without it the passes over L1-resident data leave the memory idle and the
  // time is memory + compute instead of their max (f32, M = 4: 25 -> 22 ms, M = 9: 36 -> 31,
  // int8 M = 1: 8.6 -> 5.6 on 12 [8960, 1536] matrices; into L1 it slowed M = 1..4 down).
  // A tile prefetches on each of its D / 16 full steps (none in the masked tail).
  const int64_t pass_steps = D / 16;
  const char* pf = nullptr; const char* pf_end = nullptr; int64_t per_step = 0;
  if (r + 2 * R <= r1 && pass_steps > 0) {
    pf = w.row(r + R);
    pf_end = w.row(r + 2 * R);
    const int64_t lines = (pf_end - pf + 63) / 64;
    const int64_t steps = ((M + TMAX - 1) / TMAX) * pass_steps;
    per_step = (lines + steps - 1) / steps;
  }
  for (; m + TMAX <= M; m += TMAX) {
    tile<R, TMAX>(x, w, scale, y, D, F, r, m, pf, per_step, pf_end);
    if (pf) pf += per_step * 64 * pass_steps;
  }
  if (m < M) remainder<R, TMAX>(M - m, x, w, scale, y, D, F, r, m, pf, per_step, pf_end);
}

// Rows [r0, r1) of W. The register tile (R rows of W x TM rows of x: R * TM <= 27
// accumulators, R weight vectors and one x vector within the 32 vector registers) is picked
// by M: more rows of W in flight for a lone token.
template <int R, int TMAX, typename S>
void run_rows(const float* x, const S& w, const float* scale, float* y, int64_t M, int64_t D,
              int64_t F, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + R <= r1; r += R) rows<R, TMAX>(x, w, scale, y, M, D, F, r, r1);
  for (; r < r1; ++r) rows<1, TMAX>(x, w, scale, y, M, D, F, r, r1);
}

template <typename S>
void run_tiles(const float* x, const S& w, const float* scale, float* y, int64_t M, int64_t D,
               int64_t F, int64_t r0, int64_t r1) {
  // Measured on the 2-core AVX-512 VM (12 [8960, 1536] matrices out of cache, f32/bf16/int8):
  // 4 x 4 tiles for M <= 4, 3 x 9 (one pass) for M = 7..9, 4 x 6 otherwise beat 4 x 4
  // everywhere above M = 4 by 10-20% (e.g. f32 M = 9: 25 against 31 ms; M = 17: 42 against 52).
#if defined(__AVX512F__)
  if (M == 1) run_rows<8, 1>(x, w, scale, y, M, D, F, r0, r1);
  else if (M <= 4) run_rows<4, 4>(x, w, scale, y, M, D, F, r0, r1);
  else if (M >= 7 && M <= 9) run_rows<3, 9>(x, w, scale, y, M, D, F, r0, r1);
  else run_rows<4, 6>(x, w, scale, y, M, D, F, r0, r1);
#else
  // 16 vector registers and a Vec of two: the AVX-512 tiles spill. Measured on a 2-core AVX2
  // EPYC (same 12 matrices, f32 / bf16 ms): M = 4 as 1 x 4 29.6 / 19.1 (4 x 4: 30.8 / 30.8),
  // M = 9 as 2 x 3 42.9 / 34.3 (3 x 9: 57.5 / 54.2), M = 20 as 2 x 3 71.3 / 118 (4 x 6:
  // 105.7 / 183.7); M = 1 as 4 x 1 21.4 / 15.5 (8 x 1: 22.8 / 16.5).
  if (M == 1) run_rows<4, 1>(x, w, scale, y, M, D, F, r0, r1);
  else if (M <= 4) run_rows<1, 4>(x, w, scale, y, M, D, F, r0, r1);
  else run_rows<2, 3>(x, w, scale, y, M, D, F, r0, r1);
#endif
}

template <typename S>
void run_chunk(const float* x, const S& w, const float* scale, float* y, int64_t M, int64_t D,
               int64_t F, int64_t r0, int64_t r1) {
  run_tiles(x, w, scale, y, M, D, F, r0, r1);
}

// GGUF blocks decoded once per group of R rows of W into an f32 scratch (`Decoded`), for rows
// of x that take more than one pass of the register tile: decoding a block costs more than its
// multiply-adds, and `rows` would decode it again on every pass (kernels/results/block_rows/).
// The values are the in-register decode's and, D being whole blocks, the scratch's 16-value
// steps are the 32-value steps' halves in the same order: a row's result does not depend on M.
template <QT T>
struct Decoded {
  const Blocked<T>* blocks;
  const float* buf;  // [R, D]: rows [r0, r0 + R) of W, decoded
  int64_t D, r0;
  inline Vec load(int64_t r, int64_t d) const { return vload_x(buf + (r - r0) * D + d); }
  inline Vec load_tail(int64_t r, int64_t d, Mask k) const {
    return vload_x_tail(buf + (r - r0) * D + d, k);
  }
  inline const char* row(int64_t r) const { return blocks->row(r); }  // prefetch the blocks
};

template <QT T>
inline void decode_rows(const Blocked<T>& w, float* buf, int64_t D, int64_t r, int n) {
  for (int i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; d += 32) {
      Vec a, b;
      w.load2(r + i, d, a, b);
      vstore(buf + i * D + d, a);
      vstore(buf + i * D + d + 16, b);
    }
}

template <int R, int TMAX, QT T>
void run_rows_decoded(const float* x, const Blocked<T>& w, float* y, int64_t M, int64_t D,
                      int64_t F, int64_t r0, int64_t r1) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < R * D) scratch.resize(R * D);
  float* buf = scratch.data();
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    decode_rows(w, buf, D, r, R);
    rows<R, TMAX>(x, Decoded<T>{&w, buf, D, r}, nullptr, y, M, D, F, r, r1);
  }
  for (; r < r1; ++r) {
    decode_rows(w, buf, D, r, 1);
    rows<1, TMAX>(x, Decoded<T>{&w, buf, D, r}, nullptr, y, M, D, F, r, r1);
  }
}

template <QT T>
void run_chunk(const float* x, const Blocked<T>& w, const float* scale, float* y, int64_t M,
               int64_t D, int64_t F, int64_t r0, int64_t r1) {
  // the tiles `run_tiles` picks; one pass of them keeps the in-register decode
#if defined(__AVX512F__)
  if (M <= 9) return run_tiles(x, w, scale, y, M, D, F, r0, r1);
  run_rows_decoded<4, 6>(x, w, y, M, D, F, r0, r1);
#else
  if (M == 1) return run_tiles(x, w, scale, y, M, D, F, r0, r1);
  if (M <= 4) return run_rows_decoded<1, 4>(x, w, y, M, D, F, r0, r1);
  run_rows_decoded<2, 3>(x, w, y, M, D, F, r0, r1);
#endif
}

struct Work {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

template <typename S>
void parallel_rows(ffi::ThreadPool& pool, const float* x, const S& w, const float* scale,
                   float* y, int64_t M, int64_t D, int64_t F) {
  const int64_t chunks = (F + kRowsPerChunk - 1) / kRowsPerChunk;
  auto work = std::make_shared<Work>();
  auto drain = [=]() {
    for (;;) {
      int64_t c = work->next.fetch_add(1);
      if (c >= chunks) return;
      int64_t r0 = c * kRowsPerChunk, r1 = r0 + kRowsPerChunk < F ? r0 + kRowsPerChunk : F;
      run_chunk(x, w, scale, y, M, D, F, r0, r1);
      work->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = pool.num_threads() > 1 && chunks > 1 ? pool.num_threads() - 1 : 0;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(drain)(drain));
  drain();
  while (work->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}

// ---- bf16 GEMM for prompt blocks (AVX512-BF16) ---------------------------------------------
// y[M, F] = bf16(x)[M, D] . bf16(W)[F, D]^T (* scale[F]), f32 accumulation (vdpbf16ps). For
// long blocks (a prompt's prefill), which are compute bound: twice f32's multiply rate. x is
// rounded to bf16 (round to nearest even), so this is NOT the exact f32 arithmetic of the
// streaming kernel above; W's values are kept exactly when stored as bf16 or int8 (an int8
// value is a bf16 value) and rounded when stored as f32. Used where that rounding changes no
// output the library promises (a drafter's prefill; a bf16 model's prefill), see
// `cpu_matmul.gemm_bf16`.
//
// Layout: x is packed once per call into panels of 32 rows, pair-interleaved: element
// (m, 2p + e) at ((m / 32) * P + p) * 64 + (m % 32) * 2 + e, with P = ceil(D / 2), so one
// 64-byte load holds the pair p of 16 rows. Each task converts a block of W's rows to bf16
// (row major, zero-padded to 2P) and runs micro tiles of kFR rows of W x 32 rows of x: per
// pair p, two loads of x, kFR broadcasts of a W pair, 2 kFR dot-products into 2 kFR
// accumulators held in registers across the whole of D.
#if defined(__AVX512BF16__)
#define VJ_HAS_BF16_GEMM 1
constexpr int64_t kXPanel = 32;
constexpr int kFR = 12;
constexpr int64_t kWRowsPerTask = 48;

// 32 values of row r of a weight source from d (n <= 32 valid, the rest 0) -> 32 bf16 (16
// pairs) in one vector.
template <typename S>
inline __m512i w_to_bf16x32(const S& w, int64_t r, int64_t d, int64_t n) {
  Vec lo, hi;
  if (n >= 32) {
    if constexpr (kPairs<S>) {
      w.load2(r, d, lo, hi);
    } else {
      lo = w.load(r, d);
      hi = w.load(r, d + 16);
    }
  } else {
    lo = n >= 16 ? w.load(r, d) : w.load_tail(r, d, tail_mask(n));
    hi = n > 16 ? w.load_tail(r, d + 16, tail_mask(n - 16)) : vzero();
  }
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Panel b of x (rows [32 b, 32 b + 32), zero past M) into xp.
void pack_x_panel(const float* x, uint32_t* xp, int64_t M, int64_t D, int64_t b) {
  const int64_t P = (D + 1) / 2;
  uint32_t* out = xp + b * P * kXPanel;
  alignas(64) uint32_t t[16];
  for (int64_t l = 0; l < kXPanel; ++l) {
    const int64_t m = b * kXPanel + l;
    if (m >= M) {
      for (int64_t p = 0; p < P; ++p) out[p * kXPanel + l] = 0;
      continue;
    }
    const Dense<float> row{x + m * D, D};
    for (int64_t d = 0; d < D; d += 32) {
      _mm512_store_si512(t, w_to_bf16x32(row, 0, d, D - d));
      const int64_t np = (D - d + 1) / 2 < 16 ? (D - d + 1) / 2 : 16;
      for (int64_t k = 0; k < np; ++k) out[(d / 2 + k) * kXPanel + l] = t[k];
    }
  }
}

template <typename S>
void convert_w_rows(const S& w, uint16_t* wb, int64_t D, int64_t r0, int64_t r1) {
  const int64_t P2 = 2 * ((D + 1) / 2);
  for (int64_t r = r0; r < r1; ++r) {
    uint16_t* dst = wb + (r - r0) * P2;
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) _mm512_storeu_si512(dst + d, w_to_bf16x32(w, r, d, 32));
    if (d < D) {
      alignas(64) uint16_t t[32];
      _mm512_store_si512(t, w_to_bf16x32(w, r, d, D - d));
      for (int64_t k = 0; k < P2 - d; ++k) dst[d + k] = t[k];
    }
  }
}

template <int FR>
inline void gemm_tile(const uint16_t* wb, const uint32_t* xpanel, int64_t P, float* y,
                      const float* scale, int64_t M, int64_t F, int64_t f, int64_t m0) {
  __m512 acc[FR][2];
  for (int i = 0; i < FR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const uint32_t* wp[FR];
  for (int i = 0; i < FR; ++i) wp[i] = reinterpret_cast<const uint32_t*>(wb + i * 2 * P);
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xpanel + p * kXPanel);
    const __m512bh x1 = (__m512bh)_mm512_loadu_si512(xpanel + p * kXPanel + 16);
    for (int i = 0; i < FR; ++i) {
      const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(wp[i][p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], wv, x0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], wv, x1);
    }
  }
  alignas(64) float t[16];
  for (int i = 0; i < FR; ++i) {
    const float s = scale ? scale[f + i] : 1.f;
    for (int j = 0; j < 2; ++j) {
      _mm512_store_ps(t, acc[i][j]);
      for (int l = 0; l < 16; ++l) {
        const int64_t m = m0 + 16 * j + l;
        if (m < M) y[m * F + f + i] = scale ? t[l] * s : t[l];
      }
    }
  }
}

template <int FR>
inline void gemm_tile_rem(int fr, const uint16_t* wb, const uint32_t* xpanel, int64_t P,
                          float* y, const float* scale, int64_t M, int64_t F, int64_t f,
                          int64_t m0) {
  if (fr == FR) gemm_tile<FR>(wb, xpanel, P, y, scale, M, F, f, m0);
  else if constexpr (FR > 1) gemm_tile_rem<FR - 1>(fr, wb, xpanel, P, y, scale, M, F, f, m0);
}
#endif  // __AVX512BF16__

// Runs fn(i) for i in [0, n) on the calling thread and XLA's intra-op pool (see the top).
template <typename Fn>
void parallel_for(ffi::ThreadPool& pool, int64_t n, Fn fn) {
  auto work = std::make_shared<Work>();
  auto drain = [=]() {
    for (;;) {
      int64_t c = work->next.fetch_add(1);
      if (c >= n) return;
      fn(c);
      work->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = pool.num_threads() > 1 && n > 1 ? pool.num_threads() - 1 : 0;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(drain)(drain));
  drain();
  while (work->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

template <typename S>
ffi::Error gemm_bf16(ffi::ThreadPool& pool, const float* x, const S& w, const float* scale,
                     float* y, int64_t M, int64_t D, int64_t F) {
#if defined(VJ_HAS_BF16_GEMM)
  const int64_t P = (D + 1) / 2, panels = (M + kXPanel - 1) / kXPanel;
  std::unique_ptr<uint32_t[]> xp(new uint32_t[panels * P * kXPanel]);
  uint32_t* xpd = xp.get();
  parallel_for(pool, panels, [=](int64_t b) { pack_x_panel(x, xpd, M, D, b); });
  const int64_t tasks = (F + kWRowsPerTask - 1) / kWRowsPerTask;
  parallel_for(pool, tasks, [=](int64_t t) {
    const int64_t r0 = t * kWRowsPerTask, r1 = r0 + kWRowsPerTask < F ? r0 + kWRowsPerTask : F;
    std::unique_ptr<uint16_t[]> wb(new uint16_t[kWRowsPerTask * 2 * P]);
    convert_w_rows(w, wb.get(), D, r0, r1);
    for (int64_t b = 0; b < panels; ++b) {
      const uint32_t* panel = xpd + b * P * kXPanel;
      for (int64_t f = r0; f < r1; f += kFR) {
        const int fr = static_cast<int>(r1 - f < kFR ? r1 - f : kFR);
        gemm_tile_rem<kFR>(fr, wb.get() + (f - r0) * 2 * P, panel, P, y, scale, M, F, f,
                           b * kXPanel);
      }
    }
  });
  return ffi::Error::Success();
#else
  return ffi::Error::Internal("vocabjax bf16 GEMM: built without AVX512-BF16");
#endif
}

// y = x . W^T (* scale) by the streaming kernel (Gemm false) or the bf16 GEMM (Gemm true).
template <bool Gemm, typename S>
ffi::Error run(ffi::ThreadPool& pool, const float* x, const S& w, const float* scale, float* y,
               int64_t M, int64_t D, int64_t F) {
  if constexpr (Gemm) {
    return gemm_bf16(pool, x, w, scale, y, M, D, F);
  } else {
    parallel_rows(pool, x, w, scale, y, M, D, F);
    return ffi::Error::Success();
  }
}

template <bool Gemm, typename W, ffi::DataType DT>
ffi::Error matmul_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<DT> w,
                       ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("vocabjax matmul: expected x[M, D], w[F, D]");
  const Dense<W> src{reinterpret_cast<const W*>(w.untyped_data()), xd[1]};
  return run<Gemm>(pool, x.typed_data(), src, nullptr, y->typed_data(), xd[0], xd[1], wd[0]);
}

template <bool Gemm>
ffi::Error matmul_int8_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::S8> w, ffi::Buffer<ffi::F32> scale,
                            ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || scale.element_count() != wd[0])
    return ffi::Error::InvalidArgument(
        "vocabjax matmul: expected x[M, D], w[F, D] int8, scale[F]");
  const Dense<int8_t> src{w.typed_data(), xd[1]};
  return run<Gemm>(pool, x.typed_data(), src, scale.typed_data(), y->typed_data(), xd[0], xd[1],
                   wd[0]);
}

// w: [F, D / values * bytes] uint8, each row D values in blocks of type T.
template <bool Gemm, QT T>
ffi::Error matmul_blocks_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                              ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || !whole_blocks<T>(xd[1], wd[1]))
    return ffi::Error::InvalidArgument(
        "vocabjax matmul: expected x[M, D] with D whole blocks, w[F, D / values * bytes]");
  const Blocked<T> src{w.typed_data(), wd[1]};
  return run<Gemm>(pool, x.typed_data(), src, nullptr, y->typed_data(), xd[0], xd[1], wd[0]);
}


// ---- int8 activations: llama.cpp's arithmetic (opt-in, `blocks.BlockWeight.arith == "q8"`) --
// y[m, f] = sum over blocks of x's row m quantized to 8 bits per block (QK values: 256 for the
// K types, Q8_K's blocks; 32 for Q8_0 and Q4_0, Q8_0's) times the weight's codes, as integer
// dot products, scaled in f32: what llama.cpp computes on a CPU (ggml's vec_dot of a K or legacy
// type with Q8_K / Q8_0 activations), not the f32 arithmetic of the streaming kernel above, so
// NOT the dequantized model's logits. x's block: amax = max |x|, d = amax / 127, q =
// nearbyint(x * (127 / amax)) in [-127, 127] (amax 0: d 0, q 0; a non-finite amax gives a
// non-finite y). Integer sums are exact; every float operation is fixed per (row of W, row of x)
// and independent of M, the thread and the build (the AVX2 path and the portable one compute
// the same lanes with the same fused multiply-adds and the same tree sum), so a token's logits
// in a verified block equal its one-token logits bit for bit.
//
// Lanes: a group of 32 codes c[0..32) against 32 quantized x's gives 8 int32 lanes, lane k the
// sum over bytes 4k..4k+3 (what AVX2's maddubs + madd leave in lane k); a block accumulates
// its groups' lanes, each group's scaled by its integer sub-block scale (per 16 values for
// Q6_K), then acc[k] = fma(d_w * d_x, float(lane[k]), acc[k]); y = tree sum of acc less the
// K types' minimum term, fma-accumulated per block as dmin_w * d_x * sum_j m_j * sum(x's q in j).
// Codes are unsigned with an offset (Q4_0: q - 8, Q5_0: q - 16, Q6_K: q - 32, the offset's
// products subtracted lane by lane) or signed bytes (Q8_0, through the sign trick: |w| times
// x with w's sign). The 32-value types' lanes come from VNNI's u8 x s8 dot (`dpbusd`) where
// the build has it, else from maddubs + madd: the same integers.
enum class Q8Kind { K256, L32 };
// the types with an int8-activation kernel (blocks.Q8_TYPES; the VjQ8Matmul targets)
template <QT T> constexpr bool kHasQ8 = T == QT::Q4_0 || T == QT::Q5_0 || T == QT::Q8_0 ||
                                        T == QT::Q4_K || T == QT::Q6_K;
template <QT T> constexpr Q8Kind kQ8Kind = Q8Kind::L32;
template <> constexpr Q8Kind kQ8Kind<QT::Q4_K> = Q8Kind::K256;
template <> constexpr Q8Kind kQ8Kind<QT::Q6_K> = Q8Kind::K256;

// One block of QK values of x (a multiple of 16) in 16-lane vectors, where every value is
// finite: its max |x| (exact in any order), q = clamp(nearbyint(x * (127 / amax))) (the same
// rounded products, rounding and bounds as the scalar code); false (nothing written) where a
// value is not finite, which the scalar code handles.
#if defined(__AVX512F__)
inline bool quantize_block16(const float* xb, int64_t QK, int8_t* qb, float* db) {
  const __m512 sign = _mm512_set1_ps(-0.0f), big = _mm512_set1_ps(3.4028235e38f);
  __m512 amax = _mm512_setzero_ps();
  for (int64_t l = 0; l < QK; l += 16) {
    const __m512 a = _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + l));
    if (_mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ)) return false;  // inf or NaN
    amax = _mm512_max_ps(amax, a);
  }
  const float m = _mm512_reduce_max_ps(amax);
  const float id = m > 0.f ? 127.f / m : 0.f;
  *db = m / 127.f;
  const __m512 vid = _mm512_set1_ps(id), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  for (int64_t l = 0; l < QK; l += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + l), vid),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + l),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  return true;
}
#endif

// x [M, D] -> q [M, D] int8, d [M, D / QK] f32, sums [M, D / 32] int32 (each 32 q's sum)
void quantize_rows(const float* x, int64_t M, int64_t D, int64_t QK, int8_t* q, float* d,
                   int32_t* sums) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < D / QK; ++b) {
      const float* xb = x + m * D + b * QK;
#if defined(__AVX512F__)
      if (quantize_block16(xb, QK, q + m * D + b * QK, d + m * (D / QK) + b)) continue;
#endif
      float amax = 0.f;
      for (int64_t l = 0; l < QK; ++l) {
        const float a = std::fabs(xb[l]);
        amax = (a > amax || a != a) ? a : amax;
      }
      const float id = amax > 0.f && std::isfinite(amax) ? 127.f / amax : 0.f;
      d[m * (D / QK) + b] = amax / 127.f;
      int8_t* qb = q + m * D + b * QK;
      for (int64_t l = 0; l < QK; ++l) {
        float v = std::nearbyint(xb[l] * id);
        v = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
        qb[l] = static_cast<int8_t>(v == v ? v : 0.f);
      }
    }
  for (int64_t i = 0; i < M * D / 32; ++i) {
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += q[i * 32 + l];
    sums[i] = s;
  }
}

#if defined(__AVX2__)
using Lanes = __m256i;  // 8 int32
using Acc = __m256;     // 8 f32
inline Lanes lanes_zero() { return _mm256_setzero_si256(); }
inline Acc acc_zero() { return _mm256_setzero_ps(); }
// lanes += (per 16 values: sa, sb) x (c - off) . qx over 32 values; c unsigned codes
// acc + madd(p, s): int16 pairs times int16 scales summed into the int32 lanes (VNNI's dpwssd
// where the build has it: the same integers in one instruction)
inline Lanes madd_add(Lanes acc, __m256i p, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, p, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}
inline Lanes group_lanes(Lanes acc, __m256i c, const int8_t* qx, int off, int sa, int sb) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  __m256i p = _mm256_maddubs_epi16(c, xv);
  if (off) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(_mm256_set1_epi8(static_cast<char>(off)), xv));
  const __m256i s = _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(sa)),
                                      _mm_set1_epi16(static_cast<short>(sb)));
  return madd_add(acc, p, s);
}
// The 32-value types' lanes (scale 1: Q8_0, Q4_0, Q5_0) through VNNI's u8 x s8 dot where the
// build has it: lane k += the sum of its 4 byte products in one instruction, the integers
// maddubs + madd give (their int16 pair sums cannot saturate here: |code| <= 128, |x| <= 127).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VJ_DPBUSD 1
inline Lanes dpbusd(Lanes acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define VJ_DPBUSD 1
inline Lanes dpbusd(Lanes acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, u, s);
}
#endif
// lanes += w . qx over 32 values, w signed (Q8_0)
inline Lanes group_lanes_signed(Lanes acc, const int8_t* w, const int8_t* qx) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
#if defined(VJ_DPBUSD)
  return dpbusd(acc, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
#else
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
  return madd_add(acc, p, _mm256_set1_epi16(1));
#endif
}
// lanes += (c - off) . qx over 32 values, c unsigned codes, scale 1 (Q4_0, Q5_0)
inline Lanes group_lanes_unit(Lanes acc, __m256i c, const int8_t* qx, int off) {
#if defined(VJ_DPBUSD)
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  return _mm256_sub_epi32(dpbusd(acc, c, xv),
                          dpbusd(_mm256_setzero_si256(),
                                 _mm256_set1_epi8(static_cast<char>(off)), xv));
#else
  return group_lanes(acc, c, qx, off, 1, 1);
#endif
}
inline __m256i codes_lo4(const uint8_t* p) {  // 32 bytes' low nibbles
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                          _mm256_set1_epi8(15));
}
inline __m256i codes_hi4(const uint8_t* p) {  // 32 bytes' high nibbles
  return _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(p)), 4), _mm256_set1_epi8(15));
}
inline __m256i codes_q4_0(const uint8_t* qs) {  // 16 bytes: low nibbles then high nibbles
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_setr_m128i(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}
inline __m256i codes_q5_0(const uint8_t* p) {  // Q5_0: nibbles of qs (p + 4), bit l of qh (p)
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                         0x0101010101010101, 0x0000000000000000);
  __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(u32_at(p))), shuf);
  bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));  // byte l: 0xff where bit l is set
  return _mm256_or_si256(codes_q4_0(p + 4), _mm256_and_si256(bits, _mm256_set1_epi8(16)));
}
// Q6_K: 32 codes (6 bits) from 32 ql bytes (nibble `shift`) and 32 qh bytes (bits hshift..+1)
inline __m256i codes_q6(const uint8_t* ql, int shift, const uint8_t* qh, int hshift) {
  const __m256i lo = shift ? codes_hi4(ql) : codes_lo4(ql);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, hshift), _mm256_set1_epi8(3));
  return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // hi <= 3: no bits cross bytes
}
// Q4_K: a block's eight sub-block scales widened to int16 once (in both 128-bit halves); a
// group's scale vector is one byte shuffle of them, where a set1 per group cost a load, a move
// and a broadcast (with the vectorized `mins_dot`: the q8 kernel's Q4_K rows 15-30% faster).
using Scale = __m256i;
using Scales8 = __m256i;
inline Scales8 scales8(const uint8_t* sc) {
  return _mm256_broadcastsi128_si256(
      _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
}
struct ScaleCtl { alignas(32) uint8_t v[8][32]; };  // [i]: word i of its lane into every word
constexpr ScaleCtl make_scale_ctl() {
  ScaleCtl t{};
  for (int i = 0; i < 8; ++i)
    for (int k = 0; k < 32; ++k) t.v[i][k] = static_cast<uint8_t>(2 * i + (k & 1));
  return t;
}
constexpr ScaleCtl kScaleCtl = make_scale_ctl();
inline Scale scale_of(Scales8 s, int i) {
  return _mm256_shuffle_epi8(s, _mm256_load_si256(reinterpret_cast<const __m256i*>(
      kScaleCtl.v[i])));
}
// lanes += s x c . qx over 32 values (unsigned codes without an offset: group_lanes' off 0)
inline Lanes group_lanes_scaled(Lanes acc, __m256i c, const int8_t* qx, Scale s) {
  const __m256i p = _mm256_maddubs_epi16(
      c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx)));
  return madd_add(acc, p, s);
}
// sum over s < 8 of m[s] * sums[s] (exact in int32: m <= 63, |sums| <= 32 * 127)
inline int32_t mins_dot(const uint8_t* m, const int32_t* sums) {
  const __m256i p = _mm256_mullo_epi32(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  return _mm_cvtsi128_si32(h);
}
inline Acc acc_fma(float s, Lanes l, Acc acc) {
  return _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(l), acc);
}
inline float acc_sum(Acc a) {  // (l0+l4, l1+l5, l2+l6, l3+l7) -> (s0+s2, s1+s3) -> t0+t1
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#else
struct Lanes { int32_t v[8]; };
struct Acc { float v[8]; };
struct Codes { uint8_t v[32]; };
inline Lanes lanes_zero() { return Lanes{}; }
inline Acc acc_zero() { return Acc{}; }
inline Lanes group_lanes(Lanes acc, const Codes& c, const int8_t* qx, int off, int sa,
                         int sb) {
  for (int k = 0; k < 8; ++k) {
    int32_t s = 0;
    for (int t = 0; t < 4; ++t) s += (c.v[4 * k + t] - off) * qx[4 * k + t];
    acc.v[k] += (k < 4 ? sa : sb) * s;
  }
  return acc;
}
inline Lanes group_lanes_signed(Lanes acc, const int8_t* w, const int8_t* qx) {
  for (int k = 0; k < 8; ++k)
    for (int t = 0; t < 4; ++t) acc.v[k] += w[4 * k + t] * qx[4 * k + t];
  return acc;
}
inline Lanes group_lanes_unit(Lanes acc, const Codes& c, const int8_t* qx, int off) {
  return group_lanes(acc, c, qx, off, 1, 1);
}
inline Codes codes_lo4(const uint8_t* p) {
  Codes c; for (int l = 0; l < 32; ++l) c.v[l] = p[l] & 15; return c;
}
inline Codes codes_hi4(const uint8_t* p) {
  Codes c; for (int l = 0; l < 32; ++l) c.v[l] = p[l] >> 4; return c;
}
inline Codes codes_q4_0(const uint8_t* qs) {
  Codes c;
  for (int l = 0; l < 16; ++l) { c.v[l] = qs[l] & 15; c.v[l + 16] = qs[l] >> 4; }
  return c;
}
inline Codes codes_q5_0(const uint8_t* p) {
  Codes c = codes_q4_0(p + 4);
  const uint32_t h = u32_at(p);
  for (int l = 0; l < 32; ++l) c.v[l] = static_cast<uint8_t>(c.v[l] | (((h >> l) & 1u) << 4));
  return c;
}
inline Codes codes_q6(const uint8_t* ql, int shift, const uint8_t* qh, int hshift) {
  Codes c;
  for (int l = 0; l < 32; ++l)
    c.v[l] = static_cast<uint8_t>(((ql[l] >> shift) & 15) | (((qh[l] >> hshift) & 3) << 4));
  return c;
}
using Scale = int;
struct Scales8 { int v[8]; };
inline Scales8 scales8(const uint8_t* sc) {
  Scales8 s{};
  for (int i = 0; i < 8; ++i) s.v[i] = sc[i];
  return s;
}
inline Scale scale_of(const Scales8& s, int i) { return s.v[i]; }
inline Lanes group_lanes_scaled(Lanes acc, const Codes& c, const int8_t* qx, Scale s) {
  return group_lanes(acc, c, qx, 0, s, s);
}
inline int32_t mins_dot(const uint8_t* m, const int32_t* sums) {
  int32_t t = 0;
  for (int s = 0; s < 8; ++s) t += m[s] * sums[s];
  return t;
}
inline Acc acc_fma(float s, Lanes l, Acc acc) {
  for (int k = 0; k < 8; ++k) acc.v[k] = std::fma(s, static_cast<float>(l.v[k]), acc.v[k]);
  return acc;
}
inline float acc_sum(Acc a) {
  float s[4], t[2];
  for (int k = 0; k < 4; ++k) s[k] = a.v[k] + a.v[k + 4];
  t[0] = s[0] + s[2];
  t[1] = s[1] + s[3];
  return t[0] + t[1];
}
#endif

// The K types' eight 6-bit scales and minimums from their 12 packed bytes (`k_scale_min`'s
// values, all at once: ggml's unpacking).
inline void k_scales_mins(const uint8_t* s12, uint8_t* sc, uint8_t* mn) {
  uint32_t u[4];
  std::memcpy(u, s12, 12);
  const uint32_t m1 = 0x3f3f3f3fu, m2 = 0x0f0f0f0fu, m3 = 0x03030303u;
  u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
  const uint32_t a = u[1] & m1;
  u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
  u[2] = a;
  u[0] &= m1;
  std::memcpy(sc, u, 8);
  std::memcpy(mn, u + 2, 8);
}

// AVX-512BW: Q6_K rows two groups (64 values) per instruction, and Q4_K rows in full tiles of
// 8 rows of x (at fewer rows the per-group shuffles that build a 512-bit code vector cost
// more than the halved multiplies save: a Xeon issues two 512-bit integer multiplies a cycle,
// ports 0 and 5, where its shuffles issue too; kernels/results/q8_rows_harness/). Lanes 0-7 of a 512-bit
// accumulator take the first group's bytes 4k..4k+3 and lanes 8-15 the second's, each group's
// int16 products weighted by its scale (VNNI's dpwssd, else madd and add: the same integers);
// folding lane k + 8 into lane k gives exactly the 256-bit path's lane k (integer sums, in any
// order the same), so the floats that follow, and every output, are unchanged bit for bit.
// (`-DVJ_NO_Q8_512` builds the 256-bit rows alone on such a host: a timing comparison's switch,
// the same bits either way.)
#if defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(VJ_NO_Q8_512)
#define VJ_Q8_512 1
inline __m512i dot_words(__m512i acc, __m512i p, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, p, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
#endif
}
inline Lanes fold_lanes(Lanes l, __m512i w) {  // l + (w's lanes k and k + 8), k < 8
  return _mm256_add_epi32(l, _mm256_add_epi32(_mm512_castsi512_si256(w),
                                              _mm512_extracti64x4_epi64(w, 1)));
}
// word-index vectors: [pair][w] = the scale word of the pair's values 2w, 2w + 1
struct PairIdx { alignas(64) uint16_t v[4][32]; };
constexpr PairIdx make_q6k_idx() {  // Q6_K: a scale per 16 values (8 words)
  PairIdx t{};
  for (int p = 0; p < 4; ++p)
    for (int w = 0; w < 32; ++w) t.v[p][w] = static_cast<uint16_t>(4 * p + w / 8);
  return t;
}
constexpr PairIdx kQ6KIdx = make_q6k_idx();
inline __m512i pair_idx(const PairIdx& t, int p) {
  return _mm512_load_si512(reinterpret_cast<const void*>(t.v[p]));
}
constexpr PairIdx make_q4k_idx() {  // Q4_K: a scale per 32 values (sub-blocks 2p, 2p + 1)
  PairIdx t{};
  for (int p = 0; p < 4; ++p)
    for (int w = 0; w < 32; ++w) t.v[p][w] = static_cast<uint16_t>(2 * p + w / 16);
  return t;
}
constexpr PairIdx kQ4KIdx = make_q4k_idx();
#endif

// A tile of 8 rows of x (Q4_K, AVX-512VL builds; rows past x's last are zeros), laid out for
// the rows' per-block work done at once: d [block][row] (the rows' scales) and sums
// [block][t][row][2] (int16: each row's 32-value sums 2t, 2t + 1 of the block) for one
// vpdpwssd per pair of the minimums' term. Where a row's floats were one scalar product and
// fma each, the 8 lanes do the same operations (one rounding each): outputs are unchanged bit
// for bit. Every call of 2 rows or more takes its tiles (a verified block's 4 rows: Q4_K rows
// 26% faster on one thread, kernels/results/q8_rows_harness/), a lone row its own scalar floats.
#if defined(__AVX512VL__) && defined(__AVX2__)
#define VJ_Q8_TILE 1
#endif
struct Q8Tile {
  const float* d;
  const int16_t* sums;
};
// n <= 8 rows of x's quantized scales d [n, nb] and 32-value sums [n, nb * 8] (nb blocks of
// 256) into one tile's d [nb * 8] and sums [nb * 64] (zeroed by the caller for missing rows)
inline void fill_tile(const float* d, const int32_t* sums, int64_t n, int64_t nb, float* td,
                      int16_t* ts) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < n; ++j) {
      td[b * 8 + j] = d[j * nb + b];
      for (int64_t s = 0; s < 8; ++s)  // |a 32-value sum| <= 32 * 127: an int16
        ts[(b * 4 + s / 2) * 16 + j * 2 + s % 2] = static_cast<int16_t>(sums[j * nb * 8 + b * 8 + s]);
    }
}

// Weight bytes fetched ahead of the block being multiplied (software prefetch, every cache line
// of a block): streaming a matrix from memory, the hardware prefetchers alone left the q8
// rows at 12-14 GB/s where a plain read of the same bytes ran at 34 (a 151,936-row Q6_K head:
// 13.8 -> 7.8 ms a call on a 2-core Xeon; 1 KB and 4-8 KB ahead were slower than 2 KB).
constexpr int64_t kQ8Prefetch = 2048;

// Row `w` (D values in blocks of T) against TM rows of x, quantized (q, d per QK, 32-sums;
// row j at offsets j * D, j * D / QK, j * D / 32): each group's codes decoded once for the TM
// rows, each row's lanes and floats exactly those of a one-row call.
template <QT T, int TM>
inline void q8_rows(const uint8_t* w, const int8_t* q, const float* d, const int32_t* sums,
                    int64_t D, float* out, int64_t out_stride, const Q8Tile* tile = nullptr) {
  constexpr int64_t V = QTraits<T>::values, B = QTraits<T>::bytes;
  constexpr int64_t QK = kQ8Kind<T> == Q8Kind::K256 ? 256 : 32;
  Acc acc[TM];
  float macc[TM];
  for (int j = 0; j < TM; ++j) { acc[j] = acc_zero(); macc[j] = 0.f; }
#if defined(VJ_Q8_TILE)
  __m256 tmacc = _mm256_setzero_ps();
#endif
  for (int64_t b = 0; b < D / V; ++b) {
    const uint8_t* p = w + b * B;
    for (int64_t o = 0; o < B; o += 64) __builtin_prefetch(p + kQ8Prefetch + o, 0, 3);
    Lanes l[TM];
    for (int j = 0; j < TM; ++j) l[j] = lanes_zero();
    if constexpr (T == QT::Q4_K) {
      uint8_t sc[8], mn[8];
      k_scales_mins(p + 4, sc, mn);
#if defined(VJ_Q8_512)
      if constexpr (TM == 8) {  // a full tile: sub-blocks 2t, 2t + 1 (64 values) at once
        const __m512i s16 = _mm512_castsi256_si512(scales8(sc));
        const __m512i m4 = _mm512_set1_epi8(15);
        const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        __m512i a[TM];
        for (int j = 0; j < TM; ++j) a[j] = _mm512_setzero_si512();
        for (int t = 0; t < 4; ++t) {
          const __m512i v = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * t)));
          const __m512i c = _mm512_and_si512(_mm512_srlv_epi16(v, shift), m4);
          const __m512i sv = _mm512_permutexvar_epi16(pair_idx(kQ4KIdx, t), s16);
          for (int j = 0; j < TM; ++j)
            a[j] = dot_words(a[j], _mm512_maddubs_epi16(c, _mm512_loadu_si512(
                q + j * D + b * V + 64 * t)), sv);
        }
        for (int j = 0; j < TM; ++j) l[j] = fold_lanes(l[j], a[j]);
      } else
#endif
      {
        const Scales8 s8 = scales8(sc);
        for (int s = 0; s < 8; ++s) {
          const uint8_t* qs = p + 16 + 32 * (s / 2);
          const auto c = (s & 1) ? codes_hi4(qs) : codes_lo4(qs);
          const Scale sv = scale_of(s8, s);
          for (int j = 0; j < TM; ++j)
            l[j] = group_lanes_scaled(l[j], c, q + j * D + b * V + 32 * s, sv);
        }
      }
      const float dw = f16_to_f32(p), mw = f16_to_f32(p + 2);
#if defined(VJ_Q8_TILE)
      if (tile) {  // the tile's rows at once: the same integers and the same rounded floats
        int32_t pairs[4];  // (mn[2t], mn[2t + 1]) as int16 words
        for (int t = 0; t < 4; ++t)
          pairs[t] = static_cast<int32_t>(mn[2 * t]) | (static_cast<int32_t>(mn[2 * t + 1]) << 16);
        __m256i ms = _mm256_setzero_si256();
        for (int t = 0; t < 4; ++t)
          ms = madd_add(ms, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              tile->sums + (b * 4 + t) * 16)), _mm256_set1_epi32(pairs[t]));
        const __m256 dx = _mm256_loadu_ps(tile->d + b * 8);
        tmacc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(mw), dx),
                                _mm256_cvtepi32_ps(ms), tmacc);
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(dw), dx);
        for (int j = 0; j < TM; ++j)
          acc[j] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(s, _mm256_set1_epi32(j)),
                                   _mm256_cvtepi32_ps(l[j]), acc[j]);
        continue;
      }
#endif
      int32_t msum[TM];
      for (int j = 0; j < TM; ++j) msum[j] = mins_dot(mn, sums + j * (D / 32) + b * 8);
      for (int j = 0; j < TM; ++j) {
        const float dx = d[j * (D / QK) + b];
        acc[j] = acc_fma(dw * dx, l[j], acc[j]);
        macc[j] = std::fma(mw * dx, static_cast<float>(msum[j]), macc[j]);
      }
    } else if constexpr (T == QT::Q6_K) {
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
#if defined(VJ_Q8_512)
      {  // values 64 g .. 64 g + 63 (groups 2g, 2g + 1): nibbles g % 2 of ql[64 (g / 2)..],
         // bits 4 (g % 2) + {0, 2} of qh[128 + 32 (g / 2)..]
        const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))));
        const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
        const __m512i off = _mm512_set1_epi8(32);
        __m512i w[TM];
        for (int j = 0; j < TM; ++j) w[j] = _mm512_setzero_si512();
        for (int g = 0; g < 4; ++g) {
          const int h = g / 2, n = g % 2;
          const __m512i v = _mm512_loadu_si512(p + 64 * h);
          const __m512i lo = _mm512_and_si512(n ? _mm512_srli_epi16(v, 4) : v, m4);
          const __m512i qh = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h)));
          const __m512i hshift = _mm512_inserti64x4(
              _mm512_set1_epi16(static_cast<short>(4 * n)),
              _mm256_set1_epi16(static_cast<short>(4 * n + 2)), 1);
          const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qh, hshift), m2);
          const __m512i c = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
          const __m512i sv = _mm512_permutexvar_epi16(pair_idx(kQ6KIdx, g), s16);
          for (int j = 0; j < TM; ++j) {
            const __m512i xv = _mm512_loadu_si512(q + j * D + b * V + 64 * g);
            const __m512i pr = _mm512_sub_epi16(_mm512_maddubs_epi16(c, xv),
                                                _mm512_maddubs_epi16(off, xv));
            w[j] = dot_words(w[j], pr, sv);
          }
        }
        for (int j = 0; j < TM; ++j) l[j] = fold_lanes(l[j], w[j]);
      }
#else
      for (int g = 0; g < 8; ++g) {  // value o = 32 g: half h, quarter i / 32
        const int o = 32 * g, h = o / 128, i = o % 128;
        const auto c = codes_q6(p + 64 * h + i % 64, (i / 64) * 4, p + 128 + 32 * h,
                                2 * (i / 32));
        for (int j = 0; j < TM; ++j)
          l[j] = group_lanes(l[j], c, q + j * D + b * V + o, 32, sc[o / 16], sc[o / 16 + 1]);
      }
#endif
      const float dw = f16_to_f32(p + 208);
      for (int j = 0; j < TM; ++j) acc[j] = acc_fma(dw * d[j * (D / QK) + b], l[j], acc[j]);
    } else if constexpr (T == QT::Q8_0) {
      const int8_t* wq = reinterpret_cast<const int8_t*>(p + 2);
      const float dw = f16_to_f32(p);
      for (int j = 0; j < TM; ++j)
        acc[j] = acc_fma(dw * d[j * (D / QK) + b],
                         group_lanes_signed(l[j], wq, q + j * D + b * V), acc[j]);
    } else if constexpr (T == QT::Q5_0) {
      const auto c = codes_q5_0(p + 2);
      const float dw = f16_to_f32(p);
      for (int j = 0; j < TM; ++j)
        acc[j] = acc_fma(dw * d[j * (D / QK) + b],
                         group_lanes_unit(l[j], c, q + j * D + b * V, 16), acc[j]);
    } else {  // Q4_0
      const auto c = codes_q4_0(p + 2);
      const float dw = f16_to_f32(p);
      for (int j = 0; j < TM; ++j)
        acc[j] = acc_fma(dw * d[j * (D / QK) + b],
                         group_lanes_unit(l[j], c, q + j * D + b * V, 8), acc[j]);
    }
  }
#if defined(VJ_Q8_TILE)
  if (tile) {
    alignas(32) float m8[8];
    _mm256_store_ps(m8, tmacc);
    for (int j = 0; j < TM; ++j) macc[j] = m8[j];
  }
#endif
  for (int j = 0; j < TM; ++j) out[j * out_stride] = acc_sum(acc[j]) - macc[j];
}

// Rows of x a weight row's decoded codes serve at once: each needs two registers (its lanes
// and its accumulators), and AVX-512VL has 32 of them for 256-bit vectors, AVX2 16.
#if defined(__AVX512VL__)
constexpr int kQ8TM = 8;
#else
constexpr int kQ8TM = 4;
#endif
constexpr int64_t kQ8XBytes = 192 * 1024;  // quantized rows of x per pass (see matmul_q8_impl)

template <QT T, int TM>
inline void q8_rows_rem(int n, const uint8_t* w, const int8_t* q, const float* d,
                        const int32_t* sums, int64_t D, float* out, int64_t out_stride,
                        const Q8Tile* tile) {
  if (n == TM) q8_rows<T, TM>(w, q, d, sums, D, out, out_stride, tile);
  else if constexpr (TM > 1) q8_rows_rem<T, TM - 1>(n, w, q, d, sums, D, out, out_stride, tile);
}

// y [M, F] = x [M, D] . W^T in the int8-activation arithmetic; W's rows `row_bytes` apart.
template <QT T>
void q8_matmul(ffi::ThreadPool& pool, const float* xsrc, const uint8_t* wsrc, int64_t row_bytes,
               float* ysrc, int64_t M, int64_t D, int64_t F) {
  constexpr int64_t QK = kQ8Kind<T> == Q8Kind::K256 ? 256 : 32;
  std::vector<int8_t> q(M * D);
  std::vector<float> d(M * (D / QK));
  std::vector<int32_t> sums(M * (D / 32));
  // tiles of 8 rows of x laid out as Q8Tile reads them (Q4_K; the last one's missing rows 0)
  const int64_t tiles = T == QT::Q4_K && kQ8TM == 8 && M > 1 ? (M + 7) / 8 : 0, nb = D / QK;
  std::vector<float> tile_d(tiles * nb * 8);
  std::vector<int16_t> tile_sums(tiles * nb * 64);
  {  // x's rows quantized 8 at a time (a tile each) by the pool's threads
    const float* xp = xsrc;
    int8_t* q0 = q.data();
    float* d0 = d.data();
    int32_t* s0 = sums.data();
    float* td = tile_d.data();
    int16_t* ts = tile_sums.data();
    const int64_t parts = (M + 7) / 8;
    auto part = [=](int64_t c) {
      const int64_t m = 8 * c, n = M - m < 8 ? M - m : 8;
      quantize_rows(xp + m * D, n, D, QK, q0 + m * D, d0 + m * (D / QK), s0 + m * (D / 32));
      if (c < tiles)
        fill_tile(d0 + m * nb, s0 + m * (D / 32), n, nb, td + c * nb * 8, ts + c * nb * 64);
    };
    if (parts > 1) parallel_for(pool, parts, part);
    else part(0);
  }
  std::vector<Q8Tile> tile_of(tiles);
  for (int64_t t = 0; t < tiles; ++t)
    tile_of[t] = Q8Tile{tile_d.data() + t * nb * 8, tile_sums.data() + t * nb * 64};
  const Q8Tile* tp = tile_of.data();
  const uint8_t* wp = wsrc;
  float* yp = ysrc;
  const int8_t* qp = q.data();
  const float* dp = d.data();
  const int32_t* sp = sums.data();
  const int64_t chunks = (F + kRowsPerChunk - 1) / kRowsPerChunk;
  // rows of x one pass over a chunk's weight rows serves: their quantized values stay in L2
  // (a prefill's x of 709 rows is 1-6 MB; swept once per weight row, it came from memory)
  const int64_t MB = std::max<int64_t>(kQ8TM, kQ8XBytes / D / kQ8TM * kQ8TM);
  parallel_for(pool, chunks, [=](int64_t c) {
    const int64_t r0 = c * kRowsPerChunk, r1 = r0 + kRowsPerChunk < F ? r0 + kRowsPerChunk : F;
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t m1 = m0 + MB < M ? m0 + MB : M;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t m = m0; m < m1; m += kQ8TM)
          q8_rows_rem<T, kQ8TM>(static_cast<int>(m1 - m < kQ8TM ? m1 - m : kQ8TM),
                                wp + r * row_bytes, qp + m * D, dp + m * (D / QK),
                                sp + m * (D / 32), D, yp + m * F + r, F,
                                m / kQ8TM < tiles ? tp + m / kQ8TM : nullptr);
    }
  });
}

template <QT T>
ffi::Error matmul_q8_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                          ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || !whole_blocks<T>(xd[1], wd[1]))
    return ffi::Error::InvalidArgument(
        "vocabjax matmul: expected x[M, D] with D whole blocks, w[F, D / values * bytes]");
  q8_matmul<T>(pool, x.typed_data(), w.typed_data(), wd[1], y->typed_data(), xd[0], xd[1], wd[0]);
  return ffi::Error::Success();
}

// ---- one layer of several, picked at run time (the decoder's layer loop) --------------------
// A decoder whose layers run as one loop body (`models.llamalike`, the layer loop) passes each
// projection's weights of every layer (the remaining args: L buffers [F, row bytes] uint8, of
// block types `qtypes[l]`, the QT enum's order) and the layer as an operand: the kernel reads
// layer `layer`'s weights where they lie, with the same code as the one-weight targets above
// (the same bits), where XLA would copy a slice out of a stacked weight on every call.
template <typename Fn>
ffi::Error by_qtype(int64_t qt, Fn&& fn) {
  switch (qt) {
    case 0: return fn(std::integral_constant<QT, QT::Q4_0>{});
    case 1: return fn(std::integral_constant<QT, QT::Q4_1>{});
    case 2: return fn(std::integral_constant<QT, QT::Q5_0>{});
    case 3: return fn(std::integral_constant<QT, QT::Q5_1>{});
    case 4: return fn(std::integral_constant<QT, QT::Q8_0>{});
    case 5: return fn(std::integral_constant<QT, QT::Q4_K>{});
    case 6: return fn(std::integral_constant<QT, QT::Q5_K>{});
    case 7: return fn(std::integral_constant<QT, QT::Q6_K>{});
    default: return ffi::Error::InvalidArgument("vocabjax layer kernel: unknown block type");
  }
}

// Layer `layer` of the remaining args (checked against `qtypes`) as (bytes, row bytes, rows).
inline ffi::Error layer_weight(ffi::Buffer<ffi::S32>& layer, ffi::RemainingArgs& ws,
                               ffi::Span<const int64_t> qtypes, int64_t* l,
                               const uint8_t** w, int64_t* row_bytes, int64_t* rows) {
  if (layer.element_count() != 1 || ws.size() != qtypes.size() || ws.size() == 0)
    return ffi::Error::InvalidArgument(
        "vocabjax layer kernel: expected a scalar layer and one block type per weight");
  *l = layer.typed_data()[0];
  if (*l < 0 || *l >= static_cast<int64_t>(ws.size()))
    return ffi::Error::InvalidArgument("vocabjax layer kernel: layer out of range");
  auto got = ws.get<ffi::Buffer<ffi::U8>>(*l);
  if (!got.has_value()) return got.error();
  auto wd = got->dimensions();
  if (wd.size() != 2)
    return ffi::Error::InvalidArgument("vocabjax layer kernel: expected w[F, row bytes]");
  *w = got->typed_data();
  *row_bytes = wd[1];
  *rows = wd[0];
  return ffi::Error::Success();
}

// y = x . W[layer]^T; mode 0: the streaming kernel (exact f32), 1: the bf16 GEMM, 2: int8
// activations (`matmul_q8_impl`).
ffi::Error layer_matmul_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::S32> layer, ffi::RemainingArgs ws,
                             ffi::ResultBuffer<ffi::F32> y, ffi::Span<const int64_t> qtypes,
                             int64_t mode) {
  int64_t l, rb, F;
  const uint8_t* w;
  if (auto e = layer_weight(layer, ws, qtypes, &l, &w, &rb, &F); e.failure()) return e;
  auto xd = x.dimensions();
  if (xd.size() != 2 || y->element_count() != xd[0] * F)
    return ffi::Error::InvalidArgument("vocabjax layer matmul: expected x[M, D], y[M, F]");
  const int64_t M = xd[0], D = xd[1];
  return by_qtype(qtypes[l], [&](auto tag) -> ffi::Error {
    constexpr QT T = decltype(tag)::value;
    if (!whole_blocks<T>(D, rb))
      return ffi::Error::InvalidArgument(
          "vocabjax layer matmul: expected x[M, D] with D whole blocks, w[F, D / values * bytes]");
    if (mode == 2) {
      if constexpr (kHasQ8<T>) {
        q8_matmul<T>(pool, x.typed_data(), w, rb, y->typed_data(), M, D, F);
        return ffi::Error::Success();
      } else {
        return ffi::Error::InvalidArgument("vocabjax layer matmul: no int8-activation kernel "
                                           "for this block type");
      }
    }
    const Blocked<T> src{w, rb};
    if (mode == 1) return run<true>(pool, x.typed_data(), src, nullptr, y->typed_data(), M, D, F);
    return run<false>(pool, x.typed_data(), src, nullptr, y->typed_data(), M, D, F);
  });
}

// out [F, D] f32 = the values of W[layer] (the in-register decode's: `gguf`'s dequantization,
// what `blocks.dequantize` computes) plus min(|after|, 0), for XLA's dot in a prefill above
// MAX_ROWS rows. `after` (a scalar: the first value of the product's input) makes XLA run the
// call once that input exists, so each layer's widened matrices are not all live at once;
// adding min(|after|, 0) (0, or NaN for a NaN) gives `cpu_matmul.widened_after`'s values.
ffi::Error layer_dequantize_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::S32> layer,
                                 ffi::Buffer<ffi::F32> after, ffi::RemainingArgs ws,
                                 ffi::ResultBuffer<ffi::F32> out,
                                 ffi::Span<const int64_t> qtypes) {
  int64_t l, rb, F;
  const uint8_t* w;
  if (auto e = layer_weight(layer, ws, qtypes, &l, &w, &rb, &F); e.failure()) return e;
  auto od = out->dimensions();
  if (od.size() != 2 || od[0] != F)
    return ffi::Error::InvalidArgument("vocabjax layer dequantize: expected out[F, D]");
  const int64_t D = od[1];
  float* op = out->typed_data();
  if (after.element_count() != 1)
    return ffi::Error::InvalidArgument("vocabjax layer dequantize: expected a scalar after");
  const float a = after.typed_data()[0];
  const float zero = a != a ? a : 0.0f;  // min(|a|, 0) as XLA's minimum computes it
  return by_qtype(qtypes[l], [&](auto tag) -> ffi::Error {
    constexpr QT T = decltype(tag)::value;
    if (!whole_blocks<T>(D, rb))
      return ffi::Error::InvalidArgument(
          "vocabjax layer dequantize: expected out[F, D] with D whole blocks");
    const Blocked<T> src{w, rb};
    constexpr int64_t kChunk = 64;
    parallel_for(pool, (F + kChunk - 1) / kChunk, [=](int64_t c) {
      const int64_t r0 = c * kChunk, n = F - r0 < kChunk ? F - r0 : kChunk;
      decode_rows(src, op + r0 * D, D, r0, static_cast<int>(n));
      float* o = op + r0 * D;
      for (int64_t i = 0; i < n * D; ++i) o[i] = o[i] + zero;  // -0 -> +0, as widened_after
    });
    return ffi::Error::Success();
  });
}


// ---- attention over the cache (decoding steps) ---------------------------------------------
// out[b, t, n, g, :] = sum over visible s of softmax_s(q[b, t, n, g, :] . k[b, s, n, :] /
// divisor) v[b, s, n, :], s visible where mask[b, t, s]: the attention of a decoding step
// (T = 1) and of a verified block (T > 1) over the cache in its stored [B, S, N, hd] layout,
// layer `layer` of the stacked caches [L, B, S, N, hd] (read where it lies: XLA copied the
// slice k_all[i] out of the stack for every layer and step, a cost proportional to S).
// Each output row is the same sequence of f32 operations whatever T is: the dot of a query with
// a key in 16 lanes over hd in order and a fixed tree sum, the softmax's exponentials by one
// polynomial (`exp_poly`, the same code in vector lanes and scalar tails: built with
// -ffp-contract=off), its sum and the weighted sum of values in ascending s. XLA:CPU's einsums
// and fused softmax round a block of 3 or more queries differently from one query (in the
// last bits), so with them a verified token's logits were not its one-token step's; this
// kernel makes them equal. A row that sees no slot weighs every slot equally (what a softmax
// over scores all at the same floor gives). Keys and values f32 or bf16 (widened exactly).

// e^x by Cephes' expf polynomial (Cody-Waite reduction to |r| <= ln2 / 2): within 2 ulp of
// expf for x in [-87, 0]; x is clamped there (a softmax's exponents are <= 0).
inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 0.0f ? 0.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// a . b over n values: 16 lane sums over i in order, then a fixed tree
template <typename KT>
inline float dot_lanes(const float* a, const KT* b, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * to_f32(b[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += a[i + j] * to_f32(b[i + j]);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

#if defined(__AVX512F__)
// dot_lanes' and the value sums' operations in 16-lane vectors (hd a multiple of 16): the same
// products, sums and tree, each rounded once as in the scalar code
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline float tree16(__m512 a) {  // acc[j] += acc[j + w] for w = 8, 4, 2, 1
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(
      _mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
template <typename KT>
inline float dot16(const float* a, const KT* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16)
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), load16(b + i)));
  return tree16(acc);
}
// out_g[e0..e0+15] = sum in ascending i of p_g[i] * v_i[e0..e0+15] for CNT heads g
template <int CNT, typename KT>
inline void value_sums16(const float* const* p, const KT* const* rows, int64_t C, int64_t e0,
                         float* const* out) {
  __m512 a[CNT];
  for (int g = 0; g < CNT; ++g) a[g] = _mm512_setzero_ps();
  for (int64_t i = 0; i < C; ++i) {
    const __m512 v = load16(rows[i] + e0);
    for (int g = 0; g < CNT; ++g) a[g] = _mm512_add_ps(a[g], _mm512_mul_ps(_mm512_set1_ps(p[g][i]), v));
  }
  for (int g = 0; g < CNT; ++g) _mm512_storeu_ps(out[g] + e0, a[g]);
}
#endif

template <typename KT, ffi::DataType DT>
ffi::Error attention_impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<DT> k,
                          ffi::Buffer<DT> v, ffi::Buffer<ffi::PRED> mask,
                          ffi::Buffer<ffi::S32> layer_arg, ffi::ResultBuffer<ffi::F32> out,
                          float divisor) {
  if (layer_arg.element_count() != 1)
    return ffi::Error::InvalidArgument("vocabjax attention: expected a scalar layer");
  const int64_t layer = layer_arg.typed_data()[0];
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  bool same_kv = vd.size() == kd.size();
  for (size_t i = 0; same_kv && i < kd.size(); ++i) same_kv = vd[i] == kd[i];
  if (qd.size() != 5 || kd.size() != 5 || md.size() != 3 || !same_kv ||
      kd[1] != qd[0] || kd[3] != qd[2] || kd[4] != qd[4] || md[0] != qd[0] ||
      md[1] != qd[1] || md[2] != kd[2])
    return ffi::Error::InvalidArgument(
        "vocabjax attention: expected q[B, T, N, G, hd], k and v [L, B, S, N, hd], "
        "mask[B, T, S]");
  if (layer < 0 || layer >= kd[0])
    return ffi::Error::InvalidArgument("vocabjax attention: layer out of range");
  const int64_t B = qd[0], T = qd[1], N = qd[2], G = qd[3], hd = qd[4], S = kd[2];
  const float* qp = q.typed_data();
  // the layer's [B, S, N, hd] block of the stacked caches, read in place (no slice copy)
  const KT* kp = reinterpret_cast<const KT*>(k.untyped_data()) + layer * B * S * N * hd;
  const KT* vp = reinterpret_cast<const KT*>(v.untyped_data()) + layer * B * S * N * hd;
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  // a task per (row, token, KV head) and `per` of its G query heads, which share each key and
  // value row read: the most heads that still give every thread a task (a one-token step over
  // 2 KV heads on 2 threads: all 6 heads in each of 2 tasks). Each head's operations are the
  // same whatever `per` is.
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  int64_t per = 1;
  for (int64_t d = G; d >= 1; --d)
    if (G % d == 0 && B * T * N * (G / d) >= threads) { per = d; break; }
  auto body = [=](int64_t task) {
    const int64_t g0 = task % (G / per) * per, btn = task / (G / per);
    const int64_t n = btn % N, bt = btn / N, b = bt / T;
    const bool* mrow = mp + bt * S;
    thread_local std::vector<int32_t> seen;
    thread_local std::vector<float> scores, acc;
    seen.clear();
    for (int64_t s = 0; s < S; ++s)
      if (mrow[s]) seen.push_back(static_cast<int32_t>(s));
    const bool none = seen.empty();
    if (none)
      for (int64_t s = 0; s < S; ++s) seen.push_back(static_cast<int32_t>(s));
    const int64_t C = static_cast<int64_t>(seen.size());
    scores.resize(per * C);
    acc.resize(per * 16);
    const float* q0 = qp + ((bt * N + n) * G + g0) * hd;
    float* o0 = op + ((bt * N + n) * G + g0) * hd;
    thread_local std::vector<const KT*> vrows;
    vrows.resize(C);
    for (int64_t i = 0; i < C; ++i) vrows[i] = vp + ((b * S + seen[i]) * N + n) * hd;
    for (int64_t i = 0; i < C; ++i) {  // each key row read once for the task's heads
      const KT* krow = kp + ((b * S + seen[i]) * N + n) * hd;
      for (int64_t g = 0; g < per; ++g) {
        float dot;
#if defined(__AVX512F__)
        if (hd % 16 == 0) dot = dot16(q0 + g * hd, krow, hd);
        else
#endif
          dot = dot_lanes(q0 + g * hd, krow, hd);
        scores[g * C + i] = none ? 0.0f : dot / divisor;
      }
    }
    for (int64_t g = 0; g < per; ++g) {  // softmax weights, in ascending s
      float* sg = scores.data() + g * C;
      float top = -INFINITY;
      for (int64_t i = 0; i < C; ++i) top = sg[i] > top ? sg[i] : top;
      float total = 0.0f;
      for (int64_t i = 0; i < C; ++i) {
        sg[i] = exp_poly(sg[i] - top);
        total += sg[i];
      }
      for (int64_t i = 0; i < C; ++i) sg[i] = sg[i] / total;
    }
    // out[g, e] = sum in ascending s of p[g, s] * v[s, e]: 16 values of e at a time, each
    // value row's 16 read once for the task's heads
#if defined(__AVX512F__)
    if (hd % 16 == 0) {
      for (int64_t e0 = 0; e0 < hd; e0 += 16)
        for (int64_t g = 0; g < per; g += 4) {
          const float* ps[4];
          float* outs[4];
          const int cnt = per - g < 4 ? static_cast<int>(per - g) : 4;
          for (int h = 0; h < cnt; ++h) {
            ps[h] = scores.data() + (g + h) * C;
            outs[h] = o0 + (g + h) * hd;
          }
          const KT* const* rows = vrows.data();
          if (cnt == 4) value_sums16<4>(ps, rows, C, e0, outs);
          else if (cnt == 3) value_sums16<3>(ps, rows, C, e0, outs);
          else if (cnt == 2) value_sums16<2>(ps, rows, C, e0, outs);
          else value_sums16<1>(ps, rows, C, e0, outs);
        }
      return;
    }
#endif
    for (int64_t e0 = 0; e0 < hd; e0 += 16) {
      const int64_t w = hd - e0 < 16 ? hd - e0 : 16;
      float* a = acc.data();
      for (int64_t j = 0; j < per * 16; ++j) a[j] = 0.0f;
      for (int64_t i = 0; i < C; ++i) {
        const KT* vrow = vp + ((b * S + seen[i]) * N + n) * hd + e0;
        float vv[16] = {0};
        for (int64_t e = 0; e < w; ++e) vv[e] = to_f32(vrow[e]);
        for (int64_t g = 0; g < per; ++g) {
          const float pg = scores[g * C + i];
          float* ag = a + g * 16;
          for (int e = 0; e < 16; ++e) ag[e] += pg * vv[e];
        }
      }
      for (int64_t g = 0; g < per; ++g)
        for (int64_t e = 0; e < w; ++e) o0[g * hd + e0 + e] = a[g * 16 + e];
    }
  };
  parallel_for(pool, B * T * N * (G / per), body);
  return ffi::Error::Success();
}

}  // namespace

// x f32, w of element type WT (and, for int8, a per-row f32 scale), y f32.
#define VJ_BIND(WT) ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>() \
    .Arg<ffi::Buffer<WT>>()
#define VJ_RET .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulF32, (matmul_impl<false, float, ffi::F32>),
                              VJ_BIND(ffi::F32) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulBF16, (matmul_impl<false, uint16_t, ffi::BF16>),
                              VJ_BIND(ffi::BF16) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulInt8, matmul_int8_impl<false>,
                              VJ_BIND(ffi::S8).Arg<ffi::Buffer<ffi::F32>>() VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16F32, (matmul_impl<true, float, ffi::F32>),
                              VJ_BIND(ffi::F32) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16BF16, (matmul_impl<true, uint16_t, ffi::BF16>),
                              VJ_BIND(ffi::BF16) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Int8, matmul_int8_impl<true>,
                              VJ_BIND(ffi::S8).Arg<ffi::Buffer<ffi::F32>>() VJ_RET);

// GGUF blocks: w [F, row bytes] uint8 (see matmul_blocks_impl).
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ4_0, (matmul_blocks_impl<false, QT::Q4_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q4_0, (matmul_blocks_impl<true, QT::Q4_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ4_1, (matmul_blocks_impl<false, QT::Q4_1>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q4_1, (matmul_blocks_impl<true, QT::Q4_1>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ5_0, (matmul_blocks_impl<false, QT::Q5_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q5_0, (matmul_blocks_impl<true, QT::Q5_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ5_1, (matmul_blocks_impl<false, QT::Q5_1>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q5_1, (matmul_blocks_impl<true, QT::Q5_1>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ8_0, (matmul_blocks_impl<false, QT::Q8_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q8_0, (matmul_blocks_impl<true, QT::Q8_0>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ4_K, (matmul_blocks_impl<false, QT::Q4_K>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q4_K, (matmul_blocks_impl<true, QT::Q4_K>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ5_K, (matmul_blocks_impl<false, QT::Q5_K>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q5_K, (matmul_blocks_impl<true, QT::Q5_K>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjSkinnyMatmulQ6_K, (matmul_blocks_impl<false, QT::Q6_K>),
                              VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjGemmBF16Q6_K, (matmul_blocks_impl<true, QT::Q6_K>),
                              VJ_BIND(ffi::U8) VJ_RET);

// int8 activations (llama.cpp's arithmetic): w [F, row bytes] uint8 of the type's blocks.
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjQ8MatmulQ4_0, matmul_q8_impl<QT::Q4_0>, VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjQ8MatmulQ5_0, matmul_q8_impl<QT::Q5_0>, VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjQ8MatmulQ8_0, matmul_q8_impl<QT::Q8_0>, VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjQ8MatmulQ4_K, matmul_q8_impl<QT::Q4_K>, VJ_BIND(ffi::U8) VJ_RET);
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjQ8MatmulQ6_K, matmul_q8_impl<QT::Q6_K>, VJ_BIND(ffi::U8) VJ_RET);

// Attention over the cache (see attention_impl): q f32, k and v f32 or bf16, mask bool.
#define VJ_ATTN(DT) ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>() \
    .Arg<ffi::Buffer<DT>>().Arg<ffi::Buffer<DT>>().Arg<ffi::Buffer<ffi::PRED>>() \
    .Arg<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::F32>>().Attr<float>("divisor")
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjAttentionF32, (attention_impl<float, ffi::F32>),
                              VJ_ATTN(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjAttentionBF16, (attention_impl<uint16_t, ffi::BF16>),
                              VJ_ATTN(ffi::BF16));

// One layer's weights of several, the layer an operand (see layer_matmul_impl).
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjLayerMatmul, layer_matmul_impl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs().Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<ffi::Span<const int64_t>>("qtypes")
                                  .Attr<int64_t>("mode"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VjLayerDequantize, layer_dequantize_impl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs().Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<ffi::Span<const int64_t>>("qtypes"));

// Whether the bf16 GEMM targets compute (else they return an error): AVX512-BF16 at build time.
extern "C" int vj_has_bf16_gemm() {
#if defined(VJ_HAS_BF16_GEMM)
  return 1;
#else
  return 0;
#endif
}
