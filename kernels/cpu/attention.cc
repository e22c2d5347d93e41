// CPU causal flash attention with grouped key/value heads.
//
// Legend: B batch, T sequence, H query heads, Hkv key/value heads, R = H / Hkv query heads per
// key/value head, D head size, C3 = (H + 2·Hkv)·D the packed qkv row, CO = H·D the output row.
// Queries and keys are cut into tiles of kTile rows; a query tile i and a key tile j meet only
// when j ≤ i (causality), and only the diagonal pair needs a mask.
//
// Packed rows (doc_starts): query t sees keys [s(t), t], s(t) the start of t's document. s is
// non-decreasing in t, so a query tile's first query has the smallest s: key tiles wholly
// before it are skipped (forward: the loop starts there; backward: the query-tile loop stops
// at the first tile whose first query's document starts after the key tile), and a tile pair
// needs a mask only on the diagonal or where a key precedes some query's document. A query
// whose document has no key in a tile gets a fully masked score column there; the online
// softmax then measures from 0 instead of −inf, so exp(−inf − (−inf)) never makes a NaN.
//
// Forward, one task per (b, h, query tile): scores are computed key-major, Sᵀ = K · (scale·Q)ᵀ,
// so the online softmax's per-query max and sum run down the columns with whole vectors of
// queries, and the queries are transposed once per task rather than the keys once per pair.
//
// Backward, one task per (b, key/value head): the task owns dk, dv of its head and dq of its R
// query heads, so every gradient row is accumulated by one thread in one fixed order (key tile,
// then query head, then query tile) and the result is bitwise the same for any thread count.
// Probabilities are recomputed from the saved log-sum-exp: P = exp(scale·Q·Kᵀ − lse),
// Di = rowsum(dO ∘ O), dS = scale · P ∘ (dO·Vᵀ − Di); dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K.
//
// qkv, out, dout and dqkv may each be f32, bf16 or f16 (lse stays f32). Every operand is
// copied into an f32 tile before use anyway, so 16-bit storage is converted in that copy and
// the tile math is the f32 path's; outputs are rounded once when stored. dQ sums over key
// tiles: a 16-bit dqkv's dQ is summed in a per-thread f32 buffer in the f32 path's order and
// rounded once at the end of the task.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/param_copy.h"

namespace zt::cpu {
namespace {

using tiles::ALayout;
using tiles::CInit;
using tiles::kLanes;
using tiles::TileMatMul;
using tiles::Vec;

// 64 queries × 64 keys: a score tile (16 KiB) and the operands it is built from stay in L1/L2,
// and 64 is four 16-float vectors for the micro-kernel's widest block.
constexpr int kTile = 64;
constexpr int kMaxD = kAttentionMaxHeadDim;

int RoundUpToLanes(int x) { return (x + kLanes - 1) / kLanes * kLanes; }

struct Geometry {
  Geometry(const AttentionDims& d, const Tensor& doc_starts)
      : B(d.batch),
        T(d.seq),
        H(d.n_head),
        Hkv(d.n_kv_head),
        R(d.n_head / d.n_kv_head),
        D(d.head_dim),
        C3(static_cast<int64_t>(d.n_head + 2 * d.n_kv_head) * d.head_dim),
        CO(static_cast<int64_t>(d.n_head) * d.head_dim),
        n_tiles(static_cast<int>((d.seq + kTile - 1) / kTile)),
        scale(1.0f / std::sqrt(static_cast<float>(d.head_dim))),
        starts(doc_starts.empty() ? nullptr : doc_starts.data<int32_t>()),
        S(doc_starts.empty() ? 0 : doc_starts.dim(1)) {}

  int64_t B, T;
  int H, Hkv, R, D;
  int64_t C3, CO;
  int n_tiles;
  float scale;
  const int32_t* starts;  // (B, S) document starts, or null: one document per row
  int64_t S;

  // doc[r] = the start of the document of query i0 + r of row b, for r < n.
  void DocStarts(int64_t b, int64_t i0, int n, int64_t* doc) const {
    if (starts == nullptr) {
      std::fill(doc, doc + n, 0);
      return;
    }
    const int32_t* row = starts + b * S;
    int64_t d = 0;
    for (int r = 0; r < n; ++r) {
      while (d + 1 < S && row[d + 1] <= i0 + r) ++d;
      doc[r] = row[d];
    }
  }

  int TileRows(int tile) const {
    return static_cast<int>(std::min<int64_t>(kTile, T - static_cast<int64_t>(tile) * kTile));
  }
  // Offsets of row t of batch b.
  int64_t QkvRow(int64_t b, int64_t t) const { return (b * T + t) * C3; }
  int64_t OutRow(int64_t b, int64_t t) const { return (b * T + t) * CO; }
  int64_t QCol(int h) const { return static_cast<int64_t>(h) * D; }
  int64_t KCol(int g) const { return static_cast<int64_t>(H + g) * D; }
  int64_t VCol(int g) const { return static_cast<int64_t>(H + Hkv + g) * D; }
};

// dst (D, kTile) = transpose of rows [0, rows) of the matrix at element `offset` of a buffer
// stored as S (row stride ld), times mul; columns [rows, width) are zero so the micro-kernel
// can run whole vectors.
template <DType S>
void PackTransposedAs(const void* src, int64_t offset, int64_t ld, int rows, int width, int d,
                      float mul, float* dst) {
  for (int c = 0; c < d; ++c) {
    float* out = dst + c * kTile;
    for (int r = 0; r < rows; ++r) out[r] = LoadAs<S>(src, offset + r * ld + c) * mul;
    for (int r = rows; r < width; ++r) out[r] = 0.0f;
  }
}

void PackTransposed(const Tensor& src, int64_t offset, int64_t ld, int rows, int width, int d,
                    float mul, float* dst) {
  switch (src.dtype()) {
    case DType::kBF16:
      return PackTransposedAs<DType::kBF16>(src.raw(), offset, ld, rows, width, d, mul, dst);
    case DType::kF16:
      return PackTransposedAs<DType::kF16>(src.raw(), offset, ld, rows, width, d, mul, dst);
    default:
      return PackTransposedAs<DType::kF32>(src.raw(), offset, ld, rows, width, d, mul, dst);
  }
}

// dst (rows, d) contiguous = rows [0, rows) of the matrix at element `offset` of src (row
// stride ld), as f32. Tiles are copied out of the packed rows before use: consecutive rows of
// one head sit C3 elements apart, a stride that maps a whole tile onto a few L1 sets, so
// reading them in place thrashes the cache.
void CopyRows(const Tensor& src, int64_t offset, int64_t ld, int rows, int d, float* dst) {
  if (src.dtype() == DType::kF32) {
    const float* s = src.data<float>() + offset;
    for (int r = 0; r < rows; ++r) std::copy(s + r * ld, s + r * ld + d, dst + r * d);
    return;
  }
  for (int r = 0; r < rows; ++r) LoadRow(src.raw(), src.dtype(), offset + r * ld, d, dst + r * d);
}

// Elements [offset, offset + d) of src as f32: src's own memory when it is f32, else
// converted into buf.
const float* ReadRowInto(const Tensor& src, int64_t offset, int d, float* buf) {
  if (src.dtype() == DType::kF32) return src.data<float>() + offset;
  LoadRow(src.raw(), src.dtype(), offset, d, buf);
  return buf;
}

// Elements [offset, offset + d) of dst = src · mul, each rounded once to dst's dtype.
void StoreScaledRow(const float* src, float mul, int d, const Tensor& dst, int64_t offset) {
  if (dst.dtype() == DType::kBF16) {
    uint16_t* out = dst.data<uint16_t>() + offset;
    for (int i = 0; i < d; ++i) out[i] = ToBf16(src[i] * mul);
  } else if (dst.dtype() == DType::kF16) {
    uint16_t* out = dst.data<uint16_t>() + offset;
    for (int i = 0; i < d; ++i) out[i] = ToHalf(src[i] * mul);
  } else {
    float* out = dst.data<float>() + offset;
    for (int i = 0; i < d; ++i) out[i] = src[i] * mul;
  }
}

void ForwardTask(const Geometry& g, const AttentionForwardArgs& args, int64_t b, int h, int it) {
  alignas(64) float qt[kMaxD * kTile];  // (D, kTile): scale·Q of this tile, transposed
  alignas(64) float o[kTile * kMaxD];   // (nq, D): unnormalized output
  alignas(64) float s[kTile * kTile];   // (nk, kTile): scores, then probabilities, key-major
  alignas(64) float m[kTile];           // running max per query
  alignas(64) float l[kTile];           // running sum of exp(score − m) per query
  alignas(64) float corr[kTile];        // exp(m_old − m_new) of this key tile
  alignas(64) float k[kTile * kMaxD];   // (nk, D): this key tile
  alignas(64) float v[kTile * kMaxD];   // (nk, D): its values
  int64_t doc[kTile];                   // start of each query's document

  const int64_t i0 = static_cast<int64_t>(it) * kTile;
  const int nq = g.TileRows(it);
  const int nq_pad = RoundUpToLanes(nq);
  const int kv = h / g.R;
  const Tensor& qkv = args.qkv;  // (B, T, C3)
  const int64_t k_base = g.QkvRow(b, 0) + g.KCol(kv);
  const int64_t v_base = g.QkvRow(b, 0) + g.VCol(kv);

  PackTransposed(qkv, g.QkvRow(b, i0) + g.QCol(h), g.C3, nq, nq_pad, g.D, g.scale, qt);
  std::fill(m, m + kTile, -std::numeric_limits<float>::infinity());
  std::fill(l, l + kTile, 0.0f);
  g.DocStarts(b, i0, nq, doc);
  const int jt_first = static_cast<int>(doc[0] / kTile);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  for (int jt = jt_first; jt <= it; ++jt) {
    const int64_t j0 = static_cast<int64_t>(jt) * kTile;
    const int nk = g.TileRows(jt);
    CopyRows(qkv, k_base + j0 * g.C3, g.C3, nk, g.D, k);
    CopyRows(qkv, v_base + j0 * g.C3, g.C3, nk, g.D, v);
    // Sᵀ (nk, nq_pad) = K (nk, D) · (scale·Q)ᵀ (D, nq_pad)
    TileMatMul({.m = nk,
                .n = nq_pad,
                .k = g.D,
                .a = k,
                .lda = g.D,
                .b = qt,
                .ldb = kTile,
                .c = s,
                .ldc = kTile});
    if (jt == it) {
      // Same tile for keys and queries: key j sees queries i ≥ j only.
      for (int j = 1; j < nk; ++j) {
        std::fill(s + j * kTile, s + j * kTile + std::min(j, nq_pad), neg_inf);
      }
    }
    if (j0 < doc[nq - 1]) {
      // Keys before a query's document.
      for (int j = 0; j < nk; ++j) {
        for (int i = 0; i < nq; ++i) {
          if (j0 + j < doc[i]) s[j * kTile + i] = neg_inf;
        }
      }
    }
    // Online softmax, 16 queries per vector, walking down the keys.
    for (int c = 0; c < nq_pad; c += kLanes) {
      const Vec m_old = tiles::Load(m + c);
      Vec m_new = m_old;
      for (int j = 0; j < nk; ++j) m_new = tiles::Max(m_new, tiles::Load(s + j * kTile + c));
      // A query that has seen no key yet measures from 0 (its p and correction are then 0).
      const Vec m_ref = m_new == tiles::Splat(neg_inf) ? Vec{} : m_new;
      const Vec cr = tiles::Exp(m_old - m_ref);
      Vec sum{};
      for (int j = 0; j < nk; ++j) {
        const Vec p = tiles::Exp(tiles::Load(s + j * kTile + c) - m_ref);
        tiles::Store(s + j * kTile + c, p);
        sum += p;
      }
      tiles::Store(l + c, tiles::Load(l + c) * cr + sum);
      tiles::Store(m + c, m_new);
      tiles::Store(corr + c, cr);
    }
    if (jt > jt_first) {
      for (int i = 0; i < nq; ++i) {
        float* row = o + i * g.D;
        const float cr = corr[i];
        for (int d = 0; d < g.D; ++d) row[d] *= cr;
      }
    }
    // O (nq, D) += P (nq, nk) · V (nk, D), P read from the key-major tile. In a packed row,
    // each run of queries of one document multiplies only the keys of that document up to its
    // last query: a masked probability is 0, but 0 · (another document's NaN) would still be
    // NaN, and no document may see another's values.
    const CInit init = jt == jt_first ? CInit::kOverwrite : CInit::kAccumulate;
    for (int ia = 0; ia < nq;) {
      int ib = ia + 1;
      if (g.starts != nullptr) {
        while (ib < nq && doc[ib] == doc[ia]) ++ib;
      } else {
        ib = nq;
      }
      const int kb = static_cast<int>(std::max<int64_t>(doc[ia] - j0, 0));
      const int ke = static_cast<int>(std::min<int64_t>(nk, i0 + ib - j0));
      if (ke > kb) {
        TileMatMul({.m = ib - ia,
                    .n = g.D,
                    .k = ke - kb,
                    .a = s + kb * kTile + ia,
                    .lda = kTile,
                    .a_layout = ALayout::kTransposed,
                    .b = v + kb * g.D,
                    .ldb = g.D,
                    .c = o + ia * g.D,
                    .ldc = g.D,
                    .c_init = init});
      } else if (init == CInit::kOverwrite) {
        std::fill(o + ia * g.D, o + ib * g.D, 0.0f);
      }
      ia = ib;
    }
  }

  const int64_t out_tile = g.OutRow(b, i0) + g.QCol(h);
  float* lse_row = args.lse.data<float>() + (b * g.H + h) * g.T + i0;
  for (int i = 0; i < nq; ++i) {
    StoreScaledRow(o + i * g.D, 1.0f / l[i], g.D, args.out, out_tile + i * g.CO);
    lse_row[i] = m[i] + std::log(l[i]);
  }
}

void BackwardTask(const Geometry& g, const AttentionBackwardArgs& args, int64_t b, int kv) {
  alignas(64) float k[kTile * kMaxD];    // (nk, D): this key tile
  alignas(64) float kt[kMaxD * kTile];   // (D, kTile): K of this key tile, transposed
  alignas(64) float vt[kMaxD * kTile];   // (D, kTile): V of this key tile, transposed
  alignas(64) float dk[kTile * kMaxD];   // (nk, D)
  alignas(64) float dv[kTile * kMaxD];   // (nk, D)
  alignas(64) float p[kTile * kTile];    // (nq, kTile): probabilities
  alignas(64) float ds[kTile * kTile];   // (nq, kTile): dP, then dS
  alignas(64) float q[kTile * kMaxD];    // (nq, D): this query tile
  alignas(64) float d_o[kTile * kMaxD];  // (nq, D): its output gradient
  alignas(64) float dq[kTile * kMaxD];   // (nq, D): this pair's share of dQ
  alignas(64) float di[kTile];           // rowsum(dO ∘ O)
  alignas(64) float o_row[kMaxD];        // one row of a 16-bit O, as f32
  int64_t doc[kTile];                    // start of each query's document
  int key_lo[kTile], key_hi[kTile];      // the keys [lo, hi) of this tile query i sees

  const Tensor& qkv = args.qkv;    // (B, T, C3)
  const Tensor& out = args.out;    // (B, T, CO)
  const Tensor& dout = args.dout;  // (B, T, CO)
  const Tensor& dqkv = args.dqkv;  // (B, T, C3)
  const float* lse = args.lse.data<float>();
  const int h_first = kv * g.R;
  const int64_t rd = static_cast<int64_t>(g.R) * g.D;

  // Where dQ of this task's R heads is summed: in place in an f32 dqkv (row stride C3), else
  // in an f32 (T, R·D) buffer rounded into dqkv once at the end.
  const bool f32_dq = dqkv.dtype() == DType::kF32;
  float* dq_sum =
      f32_dq ? dqkv.data<float>() + g.QkvRow(b, 0) + g.QCol(h_first) : ScratchRow(0, g.T * rd);
  const int64_t dq_ld = f32_dq ? g.C3 : rd;
  for (int64_t t = 0; t < g.T; ++t) std::memset(dq_sum + t * dq_ld, 0, sizeof(float) * rd);
  for (int jt = 0; jt < g.n_tiles; ++jt) {
    const int64_t j0 = static_cast<int64_t>(jt) * kTile;
    const int nk = g.TileRows(jt);
    const int nk_pad = RoundUpToLanes(nk);
    CopyRows(qkv, g.QkvRow(b, j0) + g.KCol(kv), g.C3, nk, g.D, k);
    PackTransposedAs<DType::kF32>(k, 0, g.D, nk, nk_pad, g.D, 1.0f, kt);
    PackTransposed(qkv, g.QkvRow(b, j0) + g.VCol(kv), g.C3, nk, nk_pad, g.D, 1.0f, vt);
    std::fill(dk, dk + nk * g.D, 0.0f);
    std::fill(dv, dv + nk * g.D, 0.0f);

    for (int h = h_first; h < h_first + g.R; ++h) {
      const float* lse_row = lse + (b * g.H + h) * g.T;
      for (int it = jt; it < g.n_tiles; ++it) {
        const int64_t i0 = static_cast<int64_t>(it) * kTile;
        const int nq = g.TileRows(it);
        g.DocStarts(b, i0, nq, doc);
        // No query of this tile, nor of any later one, sees this key tile.
        if (doc[0] >= j0 + nk) break;
        const int64_t o_tile = g.OutRow(b, i0) + g.QCol(h);
        float* dq_rows = dq_sum + i0 * dq_ld + static_cast<int64_t>(h - h_first) * g.D;
        CopyRows(qkv, g.QkvRow(b, i0) + g.QCol(h), g.C3, nq, g.D, q);
        CopyRows(dout, o_tile, g.CO, nq, g.D, d_o);

        // S (nq, nk_pad) = Q · Kᵀ, unscaled.
        TileMatMul({.m = nq,
                    .n = nk_pad,
                    .k = g.D,
                    .a = q,
                    .lda = g.D,
                    .b = kt,
                    .ldb = kTile,
                    .c = p,
                    .ldc = kTile});
        for (int i = 0; i < nq; ++i) {
          const float* a = d_o + i * g.D;
          const float* c = ReadRowInto(out, o_tile + i * g.CO, g.D, o_row);
          float acc = 0.0f;
          for (int d = 0; d < g.D; ++d) acc += a[d] * c[d];
          di[i] = acc;
          float* row = p + i * kTile;
          const Vec l_i = tiles::Splat(lse_row[i0 + i]);
          for (int c0 = 0; c0 < nk_pad; c0 += kLanes) {
            tiles::Store(row + c0, tiles::Exp(tiles::Load(row + c0) * g.scale - l_i));
          }
          // Padding columns, on the diagonal tile the keys after query i, and keys before its
          // document get probability 0.
          const int visible = jt == it ? std::min(i + 1, nk) : nk;
          std::fill(row + visible, row + nk_pad, 0.0f);
          const int hidden = static_cast<int>(std::clamp<int64_t>(doc[i] - j0, 0, nk));
          std::fill(row, row + hidden, 0.0f);
          key_lo[i] = hidden;
          key_hi[i] = visible;
        }
        // dV (nk, D) += Pᵀ · dO
        TileMatMul({.m = nk,
                    .n = g.D,
                    .k = nq,
                    .a = p,
                    .lda = kTile,
                    .a_layout = ALayout::kTransposed,
                    .b = d_o,
                    .ldb = g.D,
                    .c = dv,
                    .ldc = g.D,
                    .c_init = CInit::kAccumulate});
        // dP (nq, nk_pad) = dO · Vᵀ
        TileMatMul({.m = nq,
                    .n = nk_pad,
                    .k = g.D,
                    .a = d_o,
                    .lda = g.D,
                    .b = vt,
                    .ldb = kTile,
                    .c = ds,
                    .ldc = kTile});
        for (int i = 0; i < nq; ++i) {
          float* ds_row = ds + i * kTile;
          const float* p_row = p + i * kTile;
          const Vec di_i = tiles::Splat(di[i]);
          for (int c0 = 0; c0 < nk_pad; c0 += kLanes) {
            const Vec dsv = tiles::Load(p_row + c0) * (tiles::Load(ds_row + c0) - di_i) * g.scale;
            tiles::Store(ds_row + c0, dsv);
          }
          // dS is 0 wherever P is; set it so rather than through 0 · dP, which is NaN when
          // another document's values are.
          std::fill(ds_row, ds_row + key_lo[i], 0.0f);
          std::fill(ds_row + key_hi[i], ds_row + nk_pad, 0.0f);
        }
        // dK (nk, D) += dSᵀ · Q
        TileMatMul({.m = nk,
                    .n = g.D,
                    .k = nq,
                    .a = ds,
                    .lda = kTile,
                    .a_layout = ALayout::kTransposed,
                    .b = q,
                    .ldb = g.D,
                    .c = dk,
                    .ldc = g.D,
                    .c_init = CInit::kAccumulate});
        // dQ (nq, D) += dS · K, summed here and added to the rows once. Each run of queries
        // of one document multiplies only its own document's keys (see the forward's P · V).
        for (int ia = 0; ia < nq;) {
          int ib = ia + 1;
          if (g.starts != nullptr) {
            while (ib < nq && doc[ib] == doc[ia]) ++ib;
          } else {
            ib = nq;
          }
          const int kb = key_lo[ia];
          const int ke = static_cast<int>(std::min<int64_t>(nk, i0 + ib - j0));
          if (ke > kb) {
            TileMatMul({.m = ib - ia,
                        .n = g.D,
                        .k = ke - kb,
                        .a = ds + ia * kTile + kb,
                        .lda = kTile,
                        .b = k + kb * g.D,
                        .ldb = g.D,
                        .c = dq + ia * g.D,
                        .ldc = g.D});
          } else {
            std::fill(dq + ia * g.D, dq + ib * g.D, 0.0f);
          }
          ia = ib;
        }
        for (int i = 0; i < nq; ++i) {
          float* dst = dq_rows + i * dq_ld;
          const float* src = dq + i * g.D;
          for (int d = 0; d < g.D; ++d) dst[d] += src[d];
        }
      }
    }
    for (int j = 0; j < nk; ++j) {
      StoreRow(dk + j * g.D, g.D, dqkv.raw(), dqkv.dtype(), g.QkvRow(b, j0 + j) + g.KCol(kv));
      StoreRow(dv + j * g.D, g.D, dqkv.raw(), dqkv.dtype(), g.QkvRow(b, j0 + j) + g.VCol(kv));
    }
  }
  if (f32_dq) return;
  for (int64_t t = 0; t < g.T; ++t) {
    StoreRow(dq_sum + t * rd, rd, dqkv.raw(), dqkv.dtype(), g.QkvRow(b, t) + g.QCol(h_first));
  }
}

}  // namespace

void AttentionForward(const DeviceContext& ctx, const AttentionDims& dims,
                      const AttentionForwardArgs& args) {
  const Geometry g(dims, args.doc_starts);
  const int64_t heads = g.B * g.H;
  const int64_t tasks = heads * g.n_tiles;
  // A query tile's cost grows with its index (it meets it + 1 key tiles): hand out the last
  // tiles first so the cheap ones fill in at the end.
#pragma omp parallel for num_threads(ctx.num_threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int it = g.n_tiles - 1 - static_cast<int>(task / heads);
    const int64_t bh = task % heads;
    ForwardTask(g, args, bh / g.H, static_cast<int>(bh % g.H), it);
  }
}

void AttentionBackward(const DeviceContext& ctx, const AttentionDims& dims,
                       const AttentionBackwardArgs& args) {
  const Geometry g(dims, args.doc_starts);
  const int64_t tasks = g.B * g.Hkv;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    BackwardTask(g, args, task / g.Hkv, static_cast<int>(task % g.Hkv));
  }
}

}  // namespace zt::cpu
