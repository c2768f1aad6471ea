// Host emulation test of kernels/matmul.hip and kernels/attention.hip (see README.md).
// Checks indexing, edge tiles, layouts, masking and the online softmax against naive double
// loops. Build and run: tools/kernel-emu/run.sh
#include "../../kernels/matmul.hip"
#include "../../kernels/attention.hip"

#include <cstdio>
#include <random>
#include <string>

using hipk::bf16;

static std::mt19937 rng(1234);
static int failures = 0;

template <typename T> static T to_t(float x);
template <> float to_t<float>(float x) { return x; }
template <> __half to_t<__half>(float x) { return __half{static_cast<_Float16>(x)}; }
template <> bf16 to_t<bf16>(float x) {  // RNE
  uint32_t u; std::memcpy(&u, &x, 4);
  bf16 b; b.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); return b;
}
static double to_d(float x) { return x; }
static double to_d(__half x) { return static_cast<double>(static_cast<float>(x.v)); }
static double to_d(bf16 x) { uint32_t u = static_cast<uint32_t>(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <typename T> static double eps_of();
template <> double eps_of<float>() { return 1e-5; }
template <> double eps_of<__half>() { return 2e-3; }
template <> double eps_of<bf16>() { return 1.6e-2; }
template <typename T> static const char* name_of();
template <> const char* name_of<float>() { return "f32"; }
template <> const char* name_of<__half>() { return "f16"; }
template <> const char* name_of<bf16>() { return "bf16"; }

template <typename T> static std::vector<T> rand_vec(size_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = to_t<T>(d(rng));
  return v;
}

/// Compares got against ref; the tolerance is rtol-style relative to the reference's magnitude
/// scale `mag` (a dot product of n terms of size ~1 is off by ~eps * sqrt(n) in f32).
template <typename T>
static bool check(const std::string& what, const std::vector<T>& got, const std::vector<double>& ref,
                  double tol) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = to_d(got[i]);
    const double r = ref[i];
    bool ok = (std::isinf(r) && g == r) || std::fabs(g - r) <= tol * (1.0 + std::fabs(r));
    if (!ok) {
      std::printf("FAIL %s at %zu: got %.8g expected %.8g\n", what.c_str(), i, g, r);
      ++failures;
      return false;
    }
  }
  return true;
}

// ------------------------------------------------------------------------------------------
// matmul
// ------------------------------------------------------------------------------------------
template <typename T>
static void test_matmul(void (*kern)(const T*, const T*, const T*, T*, int, int, int, int64_t,
                                     int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                     int64_t, float, float),
                        const char* kname, int bm, bool ta, bool tb, int M, int N, int K,
                        int batch, float alpha, float beta, int offset) {
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  const int64_t sa = int64_t(M) * K + offset, sb = int64_t(K) * N + offset, sc = int64_t(M) * N + offset;
  auto a = rand_vec<T>(sa * batch + offset), b = rand_vec<T>(sb * batch + offset);
  std::vector<T> c = beta != 0 ? rand_vec<T>(sc * batch + offset) : std::vector<T>(sc * batch + offset, to_t<T>(NAN));
  std::vector<T> out(sc * batch + offset, to_t<T>(12345.0f));
  emu_launch(kern, emu_dim3{unsigned((N + bm - 1) / bm), unsigned((M + bm - 1) / bm), unsigned(batch)}, 256,
             (const T*)a.data() + offset, (const T*)b.data() + offset, (const T*)c.data() + offset,
             out.data() + offset, M, N, K, lda, ldb, ldc, ldc, sa, sb, sc, sc, alpha, beta);
  std::vector<double> ref(out.size());
  std::vector<T> got(out.size());
  for (size_t i = 0; i < out.size(); ++i) { ref[i] = 12345.0; got[i] = out[i]; }
  for (int p = 0; p < batch; ++p)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = 0;
        for (int k = 0; k < K; ++k) {
          const double av = to_d(a[offset + p * sa + (ta ? int64_t(k) * lda + m : int64_t(m) * lda + k)]);
          const double bv = to_d(b[offset + p * sb + (tb ? int64_t(n) * ldb + k : int64_t(k) * ldb + n)]);
          s += av * bv;
        }
        double r = alpha * s;
        if (beta != 0) r += beta * to_d(c[offset + p * sc + int64_t(m) * ldc + n]);
        ref[offset + p * sc + int64_t(m) * ldc + n] = r;
      }
  if (offset) ref.resize(out.size());
  // padding between items (offset) must be untouched: ref holds 12345 there.
  char what[160];
  std::snprintf(what, sizeof what, "%s M=%d N=%d K=%d batch=%d beta=%g off=%d", kname, M, N, K, batch, beta, offset);
  const double tol = eps_of<T>() * 4 + 1e-6 * std::sqrt(double(K) + 1);
  if (check(what, got, ref, tol)) std::printf("ok   %s\n", what);
}

template <typename T, typename KF>
static void matmul_suite(KF nn, KF nt, KF tn, KF tt, const char* prefix, int bm) {
  struct Shape { int M, N, K, batch; };
  // The last two have interior blocks (whole, aligned tiles and K a multiple of the slice depth
  // for some tile/dtype; offset 0), which take the unchecked K loop, with odd and even slice
  // counts; offset 1 sends the same shapes through the bounds-checked loop.
  const Shape shapes[] = {{1, 1, 1, 1}, {7, 129, 64, 1}, {129, 7, 129, 2}, {64, 64, 1, 1}, {130, 65, 33, 1}, {5, 3, 0, 1},
                          {192, 136, 96, 2}, {128, 64, 80, 1}};
  KF ks[4] = {nn, nt, tn, tt};
  const char* ls[4] = {"nn", "nt", "tn", "tt"};
  for (int l = 0; l < 4; ++l)
    for (const auto& s : shapes) {
      std::string kname = std::string(prefix) + ls[l] + "_" + name_of<T>();
      test_matmul<T>(ks[l], kname.c_str(), bm, l >= 2, l % 2 == 1, s.M, s.N, s.K, s.batch, 1.25f, 0.0f, 0);
      test_matmul<T>(ks[l], kname.c_str(), bm, l >= 2, l % 2 == 1, s.M, s.N, s.K, s.batch, 0.5f, -0.75f, 1);
    }
}

// ------------------------------------------------------------------------------------------
// attention
// ------------------------------------------------------------------------------------------
struct AttnRef {
  std::vector<double> out, lse, dq, dk, dv;
};

static AttnRef attn_ref(const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout, int BH,
                        int Tq, int Tk, int D, double scale, bool causal) {
  AttnRef r;
  r.out.assign(size_t(BH) * Tq * D, 0);
  r.lse.assign(size_t(BH) * Tq, -INFINITY);
  r.dq.assign(size_t(BH) * Tq * D, 0);
  r.dk.assign(size_t(BH) * Tk * D, 0);
  r.dv.assign(size_t(BH) * Tk * D, 0);
  for (int h = 0; h < BH; ++h)
    for (int i = 0; i < Tq; ++i) {
      std::vector<double> s(Tk, -INFINITY), p(Tk, 0);
      double mx = -INFINITY;
      for (int j = 0; j < Tk; ++j) {
        if (causal && j > i + Tk - Tq) continue;
        double d = 0;
        for (int c = 0; c < D; ++c) d += q[(size_t(h) * Tq + i) * D + c] * k[(size_t(h) * Tk + j) * D + c];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;
      double l = 0;
      for (int j = 0; j < Tk; ++j) l += (p[j] = std::exp(s[j] - mx));
      r.lse[size_t(h) * Tq + i] = mx + std::log(l);
      for (int j = 0; j < Tk; ++j) p[j] /= l;
      for (int c = 0; c < D; ++c) {
        double o = 0;
        for (int j = 0; j < Tk; ++j) o += p[j] * v[(size_t(h) * Tk + j) * D + c];
        r.out[(size_t(h) * Tq + i) * D + c] = o;
      }
      double delta = 0;
      for (int c = 0; c < D; ++c) delta += dout[(size_t(h) * Tq + i) * D + c] * r.out[(size_t(h) * Tq + i) * D + c];
      for (int j = 0; j < Tk; ++j) {
        if (p[j] == 0) continue;
        double dp = 0;
        for (int c = 0; c < D; ++c) dp += dout[(size_t(h) * Tq + i) * D + c] * v[(size_t(h) * Tk + j) * D + c];
        const double ds = p[j] * (dp - delta);
        for (int c = 0; c < D; ++c) {
          r.dv[(size_t(h) * Tk + j) * D + c] += p[j] * dout[(size_t(h) * Tq + i) * D + c];
          r.dq[(size_t(h) * Tq + i) * D + c] += scale * ds * k[(size_t(h) * Tk + j) * D + c];
          r.dk[(size_t(h) * Tk + j) * D + c] += scale * ds * q[(size_t(h) * Tq + i) * D + c];
        }
      }
    }
  return r;
}

template <typename T>
static std::vector<double> widen(const std::vector<T>& x) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = to_d(x[i]);
  return r;
}

template <typename T, int DB>
static void test_attention(int BH, int Tq, int Tk, int D, bool causal) {
  const float scale = 1.0f / std::sqrt(float(D));
  auto q = rand_vec<T>(size_t(BH) * Tq * D, -2, 2), k = rand_vec<T>(size_t(BH) * Tk * D, -2, 2);
  auto v = rand_vec<T>(size_t(BH) * Tk * D), dout = rand_vec<T>(size_t(BH) * Tq * D);
  std::vector<T> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<float> lse(size_t(BH) * Tq), delta(size_t(BH) * Tq);
  using F = hipk_attn::FwdCfg<DB>;
  using B = hipk_attn::BwdCfg<DB>;
  using S = hipk_attn::Strides;
  using R = hipk_attn::RowStrides;
  void (*fwd)(const T*, S, const T*, S, const T*, S, T*, S, float*, R, int, int, int, float, int) = nullptr;
  void (*dkdv)(const T*, S, const T*, S, const T*, S, const T*, S, const float*, const float*, R, T*, S, T*, S, int, int, int, float, int) = nullptr;
  void (*dqk)(const T*, S, const T*, S, const T*, S, const T*, S, const float*, const float*, R, T*, S, int, int, int, float, int) = nullptr;
  void (*dot)(const T*, S, const T*, S, float*, R, int, int) = nullptr;
  // Packed [1, BH, T, D]: the batch of extent 1 gets stride 0; grid (tiles, heads, batch).
  const S qs{0, int64_t(Tq) * D, D}, ks{0, int64_t(Tk) * D, D};
  const R ls{0, Tq};
#define PICK(SUF, TT)                                                            \
  if constexpr (std::is_same_v<T, TT>) {                                         \
    dot = attention_bwd_dot_##SUF;                                               \
    if constexpr (DB == 32) { fwd = attention_fwd_d32_##SUF; dkdv = attention_bwd_dkdv_d32_##SUF; dqk = attention_bwd_dq_d32_##SUF; } \
    if constexpr (DB == 64) { fwd = attention_fwd_d64_##SUF; dkdv = attention_bwd_dkdv_d64_##SUF; dqk = attention_bwd_dq_d64_##SUF; } \
    if constexpr (DB == 96) { fwd = attention_fwd_d96_##SUF; dkdv = attention_bwd_dkdv_d96_##SUF; dqk = attention_bwd_dq_d96_##SUF; } \
    if constexpr (DB == 128) { fwd = attention_fwd_d128_##SUF; dkdv = attention_bwd_dkdv_d128_##SUF; dqk = attention_bwd_dq_d128_##SUF; } \
  }
  PICK(f32, float) PICK(f16, __half) PICK(bf16, bf16)
  const int causal_i = causal ? 1 : 0;
  emu_launch(fwd, emu_dim3{unsigned((Tq + F::ROWS - 1) / F::ROWS), unsigned(BH), 1}, 256,
             (const T*)q.data(), qs, (const T*)k.data(), ks, (const T*)v.data(), ks, out.data(), qs, lse.data(), ls, Tq, Tk, D, scale, causal_i);
  auto ref = attn_ref(widen(q), widen(k), widen(v), widen(dout), BH, Tq, Tk, D, scale, causal);
  char what[160];
  std::snprintf(what, sizeof what, "attention d%d %s BH=%d Tq=%d Tk=%d D=%d causal=%d", DB, name_of<T>(), BH, Tq, Tk, D, causal_i);
  const double tol = eps_of<T>() * 4 + 2e-5;
  bool ok = check(std::string(what) + " out", out, ref.out, tol) && check(std::string(what) + " lse", lse, ref.lse, 1e-5);
  // The backward consumes the device's own forward output (as a trainer would).
  emu_launch(dot, emu_dim3{unsigned((Tq + 15) / 16), unsigned(BH), 1}, 256, (const T*)out.data(), qs, (const T*)dout.data(), qs, delta.data(), ls, Tq, D);
  emu_launch(dkdv, emu_dim3{unsigned((Tk + B::ROWS - 1) / B::ROWS), unsigned(BH), 1}, 256,
             (const T*)q.data(), qs, (const T*)k.data(), ks, (const T*)v.data(), ks, (const T*)dout.data(), qs, (const float*)lse.data(), (const float*)delta.data(), ls, dk.data(), ks, dv.data(), ks, Tq, Tk, D, scale, causal_i);
  emu_launch(dqk, emu_dim3{unsigned((Tq + B::ROWS - 1) / B::ROWS), unsigned(BH), 1}, 256,
             (const T*)q.data(), qs, (const T*)k.data(), ks, (const T*)v.data(), ks, (const T*)dout.data(), qs, (const float*)lse.data(), (const float*)delta.data(), ls, dq.data(), qs, Tq, Tk, D, scale, causal_i);
  const double gtol = eps_of<T>() * 8 + 1e-4;
  ok = ok && check(std::string(what) + " dq", dq, ref.dq, gtol) && check(std::string(what) + " dk", dk, ref.dk, gtol) &&
       check(std::string(what) + " dv", dv, ref.dv, gtol);
  if (ok) std::printf("ok   %s\n", what);
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "matmul") {
    matmul_suite<float>(matmul_nn_f32, matmul_nt_f32, matmul_tn_f32, matmul_tt_f32, "matmul_", 128);
    matmul_suite<float>(matmul_small_nn_f32, matmul_small_nt_f32, matmul_small_tn_f32, matmul_small_tt_f32, "matmul_small_", 64);
    matmul_suite<__half>(matmul_nn_f16, matmul_nt_f16, matmul_tn_f16, matmul_tt_f16, "matmul_", 128);
    matmul_suite<__half>(matmul_small_nn_f16, matmul_small_nt_f16, matmul_small_tn_f16, matmul_small_tt_f16, "matmul_small_", 64);
    matmul_suite<bf16>(matmul_nn_bf16, matmul_nt_bf16, matmul_tn_bf16, matmul_tt_bf16, "matmul_", 128);
    matmul_suite<bf16>(matmul_small_nn_bf16, matmul_small_nt_bf16, matmul_small_tn_bf16, matmul_small_tt_bf16, "matmul_small_", 64);
  }
  if (only.empty() || only == "attention") {
    struct S { int Tq, Tk; };
    const S ts[] = {{1, 1}, {17, 17}, {17, 40}, {40, 17}, {70, 70}};
    for (const auto& t : ts)
      for (int causal = 0; causal < 2; ++causal) {
        test_attention<float, 32>(2, t.Tq, t.Tk, 16, causal);
        test_attention<float, 64>(2, t.Tq, t.Tk, 64, causal);
        test_attention<float, 96>(2, t.Tq, t.Tk, 80, causal);
        test_attention<float, 128>(1, t.Tq, t.Tk, 128, causal);
      }
    // Long enough for whole-visible (unmasked) key tiles under the causal mask, several query
    // blocks, and the lazy softmax rescale (scores spread over many tiles).
    test_attention<float, 64>(1, 300, 300, 64, true);
    test_attention<__half, 128>(1, 150, 200, 128, false);
    test_attention<__half, 64>(2, 33, 47, 64, true);
    test_attention<bf16, 128>(1, 33, 47, 100, true);
    test_attention<float, 32>(1, 5, 9, 7, false);  // D not a multiple of 4: scalar paths
  }
  if (only == "quick") {  // a few seconds: one edge case per kernel family
    test_matmul<float>(matmul_nn_f32, "matmul_nn_f32", 128, false, false, 130, 65, 33, 2, 1.25f, 0.0f, 0);
    test_matmul<__half>(matmul_small_tt_f16, "matmul_small_tt_f16", 64, true, true, 7, 129, 64, 1, 0.5f, -0.75f, 1);
    test_matmul<__half>(matmul_nt_f16, "matmul_nt_f16", 128, false, true, 128, 136, 48, 1, 1.25f, 0.0f, 0);
    test_matmul<bf16>(matmul_small_tn_bf16, "matmul_small_tn_bf16", 64, true, false, 128, 64, 80, 1, 0.5f, -0.75f, 0);
    test_attention<float, 64>(1, 17, 40, 64, true);
    test_attention<bf16, 128>(1, 40, 17, 100, true);
  }
  std::printf(failures ? "kernel-emu: %d FAILED\n" : "kernel-emu: all passed\n", failures);
  return failures ? 1 : 0;
}
