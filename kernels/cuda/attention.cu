// CUDA causal flash attention with grouped key/value heads (FlashAttention-2's schedule), the
// twin of kernels/cpu/attention.cc with the same contract: qkv packed [q heads | k heads |
// v heads], query head h reads key/value head h / R, scores scaled by 1/sqrt(D), the forward
// saves the output and the per-row log-sum-exp, the backward recomputes the probabilities.
//
// Legend: B batch, T sequence, H query heads, Hkv key/value heads, R = H / Hkv, D head size,
// C3 = (H + 2·Hkv)·D the packed qkv row, CO = H·D the output row. Tiles of kTile = 64 queries
// and 64 keys; a query tile i and a key tile j meet only when j ≤ i, and only the diagonal
// pair needs a mask. Memory is linear in T: no kernel holds more than one 64 × 64 score tile.
//
// Plain f32 CUDA-core arithmetic on tiles in shared memory (no tensor cores yet): every
// operand is widened to f32 when its tile is loaded, whatever its storage dtype, and every
// output is rounded once when stored. A block has 256 threads; four consecutive threads share
// one tile row: each computes 16 of the row's 64 scores (columns sub, sub + 4, ...) and owns
// D/4 of its output columns (sub, sub + 4, ...), and the row's max and sum are combined with
// two warp shuffles. Shared-memory rows are padded to D + 1 floats so the eight rows a warp
// reads at once fall in different banks.
//
// Forward: one block per (query tile, h, b); K/V tiles stream through shared memory with an
// online softmax (running max m and sum l in f32), and the output is divided by l at the end.
//
// Backward, race-free and deterministic with no atomics, in three kernels:
//   1. Di = rowsum(dO ∘ O) for every query row, into ctx.workspace ((B, H, T) f32);
//   2. dQ: one block per (query tile, h, b) walks the key tiles j ≤ i in order, recomputing
//      P = exp(scale·Q·Kᵀ − lse) and dS = scale · P ∘ (dO·Vᵀ − Di), and sums dQ = dS·K;
//   3. dK, dV: one block per (key tile, kv head, b) walks the R query heads of its group and
//      the query tiles i ≥ j in order, recomputing P and dS, and sums dV = Pᵀ·dO, dK = dSᵀ·Q.
// Each gradient row is summed by one thread in a fixed order, as on the CPU; the price is
// computing S and dP twice (kernels 2 and 3) instead of an f32 dQ accumulated with atomics.
//
// Packed rows (doc_starts, kernels/packing.h), as on the CPU: query t sees keys [s(t), t],
// s(t) its document's start. The forward and dQ grids start at the key tile of their first
// query's document; the dK/dV grid stops at the first query tile whose first query's document
// starts after its keys. A row multiplies only the keys of its own document into O and dQ
// (a masked probability is 0, but 0 · another document's NaN would not be), so nothing of
// another document reaches an output.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

constexpr int kTile = 64;
constexpr int kRowThreads = 4;                 // threads sharing one tile row
constexpr int kThreads = kTile * kRowThreads;  // 256
constexpr int kCols = kTile / kRowThreads;     // score columns per thread
constexpr int kScoreLd = kTile + 1;            // padded row of a score tile in smem

struct Geometry {
  int64_t T;
  int H, Hkv, R, D;
  int64_t C3, CO;
  int n_tiles;
  float scale;
  const int32_t* starts;  // (B, S) document starts, or null: one document per row
  int64_t S;

  // The start of the document of token t of row b: the last start ≤ t (binary search).
  __device__ int64_t DocStart(int64_t b, int64_t t) const {
    if (starts == nullptr) return 0;
    const int32_t* row = starts + b * S;
    int64_t lo = 0, hi = S - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (row[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return row[lo];
  }

  __device__ int Rows(int tile) const {
    const int64_t left = T - static_cast<int64_t>(tile) * kTile;
    return left < kTile ? static_cast<int>(left) : kTile;
  }
  __device__ int64_t QkvRow(int64_t b, int64_t t) const { return (b * T + t) * C3; }
  __device__ int64_t OutRow(int64_t b, int64_t t) const { return (b * T + t) * CO; }
  __device__ int64_t Stat(int64_t b, int h, int64_t t) const { return (b * H + h) * T + t; }
  __device__ int64_t QCol(int h) const { return static_cast<int64_t>(h) * D; }
  __device__ int64_t KCol(int kv) const { return static_cast<int64_t>(H + kv) * D; }
  __device__ int64_t VCol(int kv) const { return static_cast<int64_t>(H + Hkv + kv) * D; }
};

// dst (kTile, D + 1) = rows [0, rows) of the (rows, D) matrix at element `offset` of src
// (row stride `stride`) as f32, times mul; rows [rows, kTile) are zero so padded rows give
// finite scores. Called by the whole block; the caller synchronizes.
template <int kD>
__device__ void LoadTile(FloatPtr src, int64_t offset, int64_t stride, int rows, float mul,
                         float* dst) {
  for (int e = threadIdx.x; e < kTile * kD; e += blockDim.x) {
    const int r = e / kD, d = e % kD;
    dst[r * (kD + 1) + d] = r < rows ? src.Load(offset + r * stride + d) * mul : 0.0f;
  }
}

// What a block of the forward or dQ grid (n_tiles, H, B) owns: query tile `it` of head h in
// batch b, the last tiles first (they meet the most key tiles); and this thread's row r of it
// and its place `sub` among the row's threads.
struct QueryTileBlock {
  int it, h, kv, nq, r, sub;
  int64_t b, i0;

  __device__ explicit QueryTileBlock(const Geometry& g)
      : it(g.n_tiles - 1 - static_cast<int>(blockIdx.x)),
        h(blockIdx.y),
        kv(h / g.R),
        nq(g.Rows(it)),
        r(threadIdx.x / kRowThreads),
        sub(threadIdx.x % kRowThreads),
        b(blockIdx.z),
        i0(static_cast<int64_t>(it) * kTile) {}
};

// sk, sv (kTile, D + 1) = the keys and values of key tile jt of kv head kv in batch b.
template <int kD>
__device__ void LoadKeyValueTile(FloatPtr qkv, const Geometry& g, int64_t b, int kv, int jt,
                                 float* sk, float* sv) {
  const int64_t row = g.QkvRow(b, static_cast<int64_t>(jt) * kTile);
  LoadTile<kD>(qkv, row + g.KCol(kv), g.C3, g.Rows(jt), 1.0f, sk);
  LoadTile<kD>(qkv, row + g.VCol(kv), g.C3, g.Rows(jt), 1.0f, sv);
}

// The max and the sum over the kRowThreads consecutive lanes that share a row.
__device__ __forceinline__ float RowMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float RowSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// acc[c] = Σ_d a[d] · tile[sub + c·kRowThreads][d], d in increasing order: this thread's
// kCols columns of one row of a · tileᵀ (a score row), a[d] loaded once for all of them.
template <int kD>
__device__ __forceinline__ void RowTimesTileT(const float* a, const float* tile, int sub,
                                              float (&acc)[kCols]) {
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < kD; ++d) {
    const float x = a[d];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] += x * tile[(sub + c * kRowThreads) * (kD + 1) + d];
  }
}

// acc[k] += Σ_{begin ≤ j < n} w[j] · tile[j][sub + k·kRowThreads], j in increasing order:
// this thread's output columns of one row of w · tile, w[j] loaded once for all of them.
template <int kD>
__device__ __forceinline__ void AccumulateRowTimesTile(const float* w, const float* tile, int n,
                                                       int sub, float (&acc)[kD / kRowThreads],
                                                       int begin = 0) {
  for (int j = begin; j < n; ++j) {
    const float x = w[j];
#pragma unroll
    for (int k = 0; k < kD / kRowThreads; ++k) {
      acc[k] += x * tile[j * (kD + 1) + sub + k * kRowThreads];
    }
  }
}

template <int kD>
constexpr int ForwardSmemFloats() {
  return 3 * kTile * (kD + 1) + kTile * kScoreLd;
}

// The keys [begin, end) of key tile jt that query row r of query tile it multiplies into its
// output: all nk of them unpacked (masked ones have weight 0); in a packed row only those of
// its own document up to itself.
struct KeyRange {
  int begin, end;
};
__device__ __forceinline__ KeyRange RowKeys(const Geometry& g, int64_t doc, int jt, int it, int r,
                                            int nk) {
  if (g.starts == nullptr) return {0, nk};
  const int64_t j0 = static_cast<int64_t>(jt) * kTile;
  const int64_t begin = doc - j0 < 0 ? 0 : (doc - j0 > nk ? nk : doc - j0);
  return {static_cast<int>(begin), jt == it ? min(r + 1, nk) : nk};
}

// Grid (n_tiles, H, B); the last query tiles (the most key tiles) are handed out first.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(FloatPtr qkv, FloatPtr out, float* lse, Geometry g) {
  constexpr int kLd = kD + 1;
  constexpr int kOut = kD / kRowThreads;
  extern __shared__ float smem[];
  float* sq = smem;              // (kTile, kLd) scale·Q
  float* sk = sq + kTile * kLd;  // (kTile, kLd) this key tile
  float* sv = sk + kTile * kLd;  // (kTile, kLd) its values
  float* sp = sv + kTile * kLd;  // (kTile, kScoreLd) probabilities

  const QueryTileBlock q(g);
  const int it = q.it, h = q.h, kv = q.kv, nq = q.nq, r = q.r, sub = q.sub;
  const int64_t b = q.b, i0 = q.i0;

  // The CPU scales Q before the product too (Sᵀ = K · (scale·Q)ᵀ).
  LoadTile<kD>(qkv, g.QkvRow(b, i0) + g.QCol(h), g.C3, nq, g.scale, sq);
  float m = -INFINITY, l = 0.0f;
  float o[kOut];
#pragma unroll
  for (int k = 0; k < kOut; ++k) o[k] = 0.0f;
  const int64_t doc = g.DocStart(b, i0 + (r < nq ? r : 0));
  const int jt_first = static_cast<int>(g.DocStart(b, i0) / kTile);

  for (int jt = jt_first; jt <= it; ++jt) {
    const int nk = g.Rows(jt);
    __syncthreads();  // the previous tile's sk, sv, sp are no longer read
    LoadKeyValueTile<kD>(qkv, g, b, kv, jt, sk, sv);
    __syncthreads();

    float s[kCols];
    RowTimesTileT<kD>(sq + r * kLd, sk, sub, s);
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int j = sub + c * kRowThreads;
      // Same tile for keys and queries on the diagonal: query r sees keys j ≤ r; and none
      // before its document.
      const bool visible =
          j < nk && (jt < it || j <= r) && static_cast<int64_t>(jt) * kTile + j >= doc;
      if (!visible) s[c] = -INFINITY;
      tile_max = fmaxf(tile_max, s[c]);
    }
    const float m_new = fmaxf(m, RowMax(tile_max));
    // A row that has seen no key yet (a packed row's query whose document starts after this
    // key tile) measures from 0: p = 0 instead of exp(−inf + inf) = NaN.
    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = expf(m - m_ref);  // 0 on the first tile (m = −inf)
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float p = expf(s[c] - m_ref);
      sp[r * kScoreLd + sub + c * kRowThreads] = p;
      sum += p;
    }
    l = l * corr + RowSum(sum);
    m = m_new;
    __syncthreads();  // sp's row r is read by all four of its threads

    // O (row r, my columns) = corr · O + P (row r) · V
#pragma unroll
    for (int k = 0; k < kOut; ++k) o[k] *= corr;
    const KeyRange keys = RowKeys(g, doc, jt, it, r, nk);
    AccumulateRowTimesTile<kD>(sp + r * kScoreLd, sv, keys.end, sub, o, keys.begin);
  }

  if (r >= nq) return;
  const float inv = 1.0f / l;
  const int64_t row = g.OutRow(b, i0 + r) + g.QCol(h);
#pragma unroll
  for (int k = 0; k < kOut; ++k) out.Store(row + sub + k * kRowThreads, o[k] * inv);
  if (sub == 0) lse[g.Stat(b, h, i0 + r)] = m + logf(l);
}

// Di[b, h, t] = Σ_d dO[b, t, h, d] · O[b, t, h, d]: one warp per (b, t, h), whose D elements
// are contiguous in out and dout at ((b·T + t)·H + h)·D.
__global__ void RowDotKernel(FloatPtr out, FloatPtr dout, float* di, int64_t rows, int64_t T, int H,
                             int D) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; w < rows;
       w += warps) {
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += dout.Load(w * D + d) * out.Load(w * D + d);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
      const int64_t bt = w / H;
      const int h = static_cast<int>(w % H);
      di[(bt / T * H + h) * T + bt % T] = acc;
    }
  }
}

template <int kD>
constexpr int DqSmemFloats() {
  return 4 * kTile * (kD + 1) + kTile * kScoreLd;
}

// dQ of one query tile of one head. Grid (n_tiles, H, B), last query tiles first.
template <int kD>
__global__ void __launch_bounds__(kThreads) DqKernel(FloatPtr qkv, FloatPtr dout, const float* lse,
                                                     const float* di, FloatPtr dqkv, Geometry g) {
  constexpr int kLd = kD + 1;
  constexpr int kOut = kD / kRowThreads;
  extern __shared__ float smem[];
  float* sq = smem;               // (kTile, kLd) Q, unscaled
  float* sdo = sq + kTile * kLd;  // (kTile, kLd) dO
  float* sk = sdo + kTile * kLd;  // (kTile, kLd) this key tile
  float* sv = sk + kTile * kLd;   // (kTile, kLd) its values
  float* sds = sv + kTile * kLd;  // (kTile, kScoreLd) dS

  const QueryTileBlock q(g);
  const int it = q.it, h = q.h, kv = q.kv, nq = q.nq, r = q.r, sub = q.sub;
  const int64_t b = q.b, i0 = q.i0;
  const bool row_valid = r < nq;

  LoadTile<kD>(qkv, g.QkvRow(b, i0) + g.QCol(h), g.C3, nq, 1.0f, sq);
  LoadTile<kD>(dout, g.OutRow(b, i0) + g.QCol(h), g.CO, nq, 1.0f, sdo);
  const float lse_r = row_valid ? lse[g.Stat(b, h, i0 + r)] : 0.0f;
  const float di_r = row_valid ? di[g.Stat(b, h, i0 + r)] : 0.0f;
  float dq[kOut];
#pragma unroll
  for (int k = 0; k < kOut; ++k) dq[k] = 0.0f;
  const int64_t doc = g.DocStart(b, i0 + (row_valid ? r : 0));
  const int jt_first = static_cast<int>(g.DocStart(b, i0) / kTile);

  for (int jt = jt_first; jt <= it; ++jt) {
    const int nk = g.Rows(jt);
    __syncthreads();  // the previous tile's sk, sv, sds are no longer read
    LoadKeyValueTile<kD>(qkv, g, b, kv, jt, sk, sv);
    __syncthreads();
    float s[kCols], dp[kCols];
    RowTimesTileT<kD>(sq + r * kLd, sk, sub, s);    // Q·Kᵀ, unscaled
    RowTimesTileT<kD>(sdo + r * kLd, sv, sub, dp);  // dO·Vᵀ
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int j = sub + c * kRowThreads;
      const bool visible =
          row_valid && j < nk && (jt < it || j <= r) && static_cast<int64_t>(jt) * kTile + j >= doc;
      float ds = 0.0f;
      if (visible) {
        const float p = expf(s[c] * g.scale - lse_r);
        ds = p * (dp[c] - di_r) * g.scale;
      }
      sds[r * kScoreLd + j] = ds;
    }
    __syncthreads();
    // dQ (row r, my columns) += dS (row r) · K
    const KeyRange keys = RowKeys(g, doc, jt, it, r, nk);
    AccumulateRowTimesTile<kD>(sds + r * kScoreLd, sk, keys.end, sub, dq, keys.begin);
  }

  if (!row_valid) return;
  const int64_t row = g.QkvRow(b, i0 + r) + g.QCol(h);
#pragma unroll
  for (int k = 0; k < kOut; ++k) dqkv.Store(row + sub + k * kRowThreads, dq[k]);
}

template <int kD>
constexpr int DkvSmemFloats() {
  return 4 * kTile * (kD + 1) + 2 * kTile * kScoreLd + 2 * kTile;
}

// dK, dV of one key tile of one kv head. Grid (n_tiles, Hkv, B). Here the four threads of a
// row share a key row j; their 16 columns are queries.
template <int kD>
__global__ void __launch_bounds__(kThreads) DkvKernel(FloatPtr qkv, FloatPtr dout, const float* lse,
                                                      const float* di, FloatPtr dqkv, Geometry g) {
  constexpr int kLd = kD + 1;
  constexpr int kOut = kD / kRowThreads;
  extern __shared__ float smem[];
  float* sk = smem;                      // (kTile, kLd) this key tile
  float* sv = sk + kTile * kLd;          // (kTile, kLd) its values
  float* sq = sv + kTile * kLd;          // (kTile, kLd) a query tile, unscaled
  float* sdo = sq + kTile * kLd;         // (kTile, kLd) its dO
  float* sp = sdo + kTile * kLd;         // (kTile, kScoreLd) Pᵀ: key-major
  float* sds = sp + kTile * kScoreLd;    // (kTile, kScoreLd) dSᵀ
  float* slse = sds + kTile * kScoreLd;  // (kTile) lse of the query tile's rows
  float* sdi = slse + kTile;             // (kTile) their Di
  __shared__ int64_t sdoc[kTile];        // their documents' starts

  const int jt = blockIdx.x;
  const int kv = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t j0 = static_cast<int64_t>(jt) * kTile;
  const int nk = g.Rows(jt);
  const int j = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;

  LoadKeyValueTile<kD>(qkv, g, b, kv, jt, sk, sv);
  float dk[kOut], dv[kOut];
#pragma unroll
  for (int k = 0; k < kOut; ++k) dk[k] = dv[k] = 0.0f;

  for (int h = kv * g.R; h < (kv + 1) * g.R; ++h) {
    for (int it = jt; it < g.n_tiles; ++it) {
      const int64_t i0 = static_cast<int64_t>(it) * kTile;
      const int nq = g.Rows(it);
      // No query of this tile, nor of any later one, sees this key tile (the same answer in
      // every thread, so the block leaves the loop together).
      if (g.DocStart(b, i0) >= j0 + nk) break;
      __syncthreads();  // the previous query tile is no longer read (and sk, sv are loaded)
      LoadTile<kD>(qkv, g.QkvRow(b, i0) + g.QCol(h), g.C3, nq, 1.0f, sq);
      LoadTile<kD>(dout, g.OutRow(b, i0) + g.QCol(h), g.CO, nq, 1.0f, sdo);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        slse[i] = i < nq ? lse[g.Stat(b, h, i0 + i)] : 0.0f;
        sdi[i] = i < nq ? di[g.Stat(b, h, i0 + i)] : 0.0f;
        sdoc[i] = g.DocStart(b, i0 + (i < nq ? i : 0));
      }
      __syncthreads();
      float s[kCols], dp[kCols];
      RowTimesTileT<kD>(sk + j * kLd, sq, sub, s);    // K·Qᵀ, unscaled
      RowTimesTileT<kD>(sv + j * kLd, sdo, sub, dp);  // V·dOᵀ
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int i = sub + c * kRowThreads;
        // Query i0 + i sees key j0 + j when it is not earlier; on the diagonal, i ≥ j.
        const bool visible = j < nk && i < nq && (it > jt || i >= j) && j0 + j >= sdoc[i];
        float p = 0.0f, ds = 0.0f;
        if (visible) {
          p = expf(s[c] * g.scale - slse[i]);
          ds = p * (dp[c] - sdi[i]) * g.scale;
        }
        sp[j * kScoreLd + i] = p;
        sds[j * kScoreLd + i] = ds;
      }
      __syncthreads();
      // dV (row j, my columns) += Pᵀ (row j) · dO;  dK (row j, my columns) += dSᵀ (row j) · Q
      AccumulateRowTimesTile<kD>(sp + j * kScoreLd, sdo, nq, sub, dv);
      AccumulateRowTimesTile<kD>(sds + j * kScoreLd, sq, nq, sub, dk);
    }
  }

  if (j >= nk) return;
  const int64_t row = g.QkvRow(b, j0 + j);
  const int64_t k_col = g.KCol(kv), v_col = g.VCol(kv);
#pragma unroll
  for (int k = 0; k < kOut; ++k) {
    dqkv.Store(row + k_col + sub + k * kRowThreads, dk[k]);
    dqkv.Store(row + v_col + sub + k * kRowThreads, dv[k]);
  }
}

Geometry MakeGeometry(const cpu::AttentionDims& d) {
  return Geometry{
      .T = d.seq,
      .H = d.n_head,
      .Hkv = d.n_kv_head,
      .R = d.n_head / d.n_kv_head,
      .D = d.head_dim,
      .C3 = static_cast<int64_t>(d.n_head + 2 * d.n_kv_head) * d.head_dim,
      .CO = static_cast<int64_t>(d.n_head) * d.head_dim,
      .n_tiles = static_cast<int>((d.seq + kTile - 1) / kTile),
      .scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim)),
      .starts = nullptr,
      .S = 0,
  };
}

// The grid's y and z are heads and batch: refused past CUDA's 65535 rather than launched wrong.
absl::Status CheckDims(const char* op, const cpu::AttentionDims& d) {
  if (d.head_dim != 64 && d.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": qkv has head size D = ", d.head_dim,
                     "; the CUDA kernel supports D = 64 and D = 128"));
  }
  if (d.batch > 65535 || d.n_head > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": B = ", d.batch, " and n_head = ", d.n_head, " must each be at most 65535 on CUDA"));
  }
  if ((d.seq + kTile - 1) / kTile > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": T = ", d.seq, " is too long"));
  }
  return absl::OkStatus();
}

// Launches kernel<<<grid, kThreads, floats · 4 bytes>>> after raising its dynamic shared
// memory limit (every configuration here is above the default 48 KiB; H100 allows 227 KiB).
template <typename Kernel, typename... Args>
absl::Status Launch(const char* op, Kernel kernel, dim3 grid, int floats, cudaStream_t stream,
                    Args... args) {
  const int bytes = floats * static_cast<int>(sizeof(float));
  ZT_CUDA_RETURN_IF_ERROR(
      op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(args...);
  return LaunchStatus(op);
}

template <int kD>
absl::Status Forward(const DeviceContext& ctx, const Geometry& g, int64_t batch,
                     const AttentionForwardArgs& args) {
  const dim3 grid(g.n_tiles, g.H, static_cast<unsigned>(batch));
  return Launch("AttentionForward", ForwardKernel<kD>, grid, ForwardSmemFloats<kD>(), StreamOf(ctx),
                AsFloatPtr(args.qkv), AsFloatPtr(args.out), args.lse.data<float>(), g);
}

template <int kD>
absl::Status Backward(const DeviceContext& ctx, const Geometry& g, int64_t batch,
                      const AttentionBackwardArgs& args) {
  constexpr const char* kOp = "AttentionBackward";
  float* di = static_cast<float*>(ctx.workspace.data);  // (B, H, T)
  const int64_t rows = batch * g.T * g.H;
  constexpr int kDotThreads = 256;
  RowDotKernel<<<GridFor(rows * 32, kDotThreads), kDotThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(args.out), AsFloatPtr(args.dout), di, rows, g.T, g.H, kD);
  if (absl::Status s = LaunchStatus(kOp); !s.ok()) return s;
  const FloatPtr qkv = AsFloatPtr(args.qkv), dout = AsFloatPtr(args.dout);
  const FloatPtr dqkv = AsFloatPtr(args.dqkv);
  const float* lse = args.lse.data<float>();
  if (absl::Status s = Launch(kOp, DqKernel<kD>, dim3(g.n_tiles, g.H, static_cast<unsigned>(batch)),
                              DqSmemFloats<kD>(), StreamOf(ctx), qkv, dout, lse,
                              static_cast<const float*>(di), dqkv, g);
      !s.ok()) {
    return s;
  }
  return Launch(kOp, DkvKernel<kD>, dim3(g.n_tiles, g.Hkv, static_cast<unsigned>(batch)),
                DkvSmemFloats<kD>(), StreamOf(ctx), qkv, dout, lse, static_cast<const float*>(di),
                dqkv, g);
}

}  // namespace

absl::Status AttentionForward(const DeviceContext& ctx, const cpu::AttentionDims& dims,
                              const AttentionForwardArgs& args) {
  if (absl::Status s = CheckDims("AttentionForward", dims); !s.ok()) return s;
  if (dims.batch == 0 || dims.seq == 0) return absl::OkStatus();
  Geometry g = MakeGeometry(dims);
  if (!args.doc_starts.empty()) {
    g.starts = args.doc_starts.data<int32_t>();
    g.S = args.doc_starts.dim(1);
  }
  return dims.head_dim == 64 ? Forward<64>(ctx, g, dims.batch, args)
                             : Forward<128>(ctx, g, dims.batch, args);
}

absl::Status AttentionBackward(const DeviceContext& ctx, const cpu::AttentionDims& dims,
                               const AttentionBackwardArgs& args) {
  if (absl::Status s = CheckDims("AttentionBackward", dims); !s.ok()) return s;
  if (dims.batch == 0 || dims.seq == 0) return absl::OkStatus();
  Geometry g = MakeGeometry(dims);
  if (!args.doc_starts.empty()) {
    g.starts = args.doc_starts.data<int32_t>();
    g.S = args.doc_starts.dim(1);
  }
  return dims.head_dim == 64 ? Backward<64>(ctx, g, dims.batch, args)
                             : Backward<128>(ctx, g, dims.batch, args);
}

}  // namespace zt::cuda
