// Host emulation test of kernels/layernorm.hip and kernels/adamw.hip (see README.md in this
// directory for the shim: one std::thread per GPU thread, shuffles through per-wave buffers).
// Compares against double-precision loops: layernorm forward/backward in both row modes, vector
// and scalar (misaligned) layouts, cached and streamed rows, the wide backward (4096 < C <= 8192),
// C from 1 to 20000; fused AdamW over
// every option and dtype with tensors crossing chunk boundaries and a found_inf step; the
// non-finite check and the L2 norm. Not the device compiler and not the hardware.
// Build and run: tools/kernel-emu/run_layernorm_adamw.sh
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
// Extras the shim lacks.
inline double __shfl_xor(double v, int mask, int width = warpSize) {
  int64_t b; std::memcpy(&b, &v, 8);
  int lo = static_cast<int>(b & 0xffffffff), hi = static_cast<int>(b >> 32);
  auto src = [&](int lane) { return (lane & ~(width - 1)) | ((lane ^ mask) & (width - 1)); };
  uint32_t l2 = static_cast<uint32_t>(emu_exchange(lo, src)), h2 = static_cast<uint32_t>(emu_exchange(hi, src));
  int64_t r = (static_cast<int64_t>(h2) << 32) | l2; double d; std::memcpy(&d, &r, 8); return d;
}
inline int __any(int p) {
  const int t = emu_tid_linear(), wave = t / warpSize;
  int any = 0;
  for (int k = 0; k < warpSize; ++k) any |= emu_exchange(p, [&](int) { return k; });
  (void)wave;
  return any != 0;
}
using std::isfinite;
using std::isnan;
using std::sqrt;
#include "layernorm.hip"
#include "adamw.hip"

using hipk::bf16;
static std::mt19937 rng(42);
static int failures = 0;

template <typename T> T to_t(double x);
template <> float to_t<float>(double x) { return float(x); }
template <> __half to_t<__half>(double x) { return __half{static_cast<_Float16>(float(x))}; }
template <> bf16 to_t<bf16>(double x) { float f = float(x); uint32_t u; std::memcpy(&u, &f, 4); bf16 b; b.bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); return b; }
static double to_d(float x) { return x; }
static double to_d(__half x) { return double(float(x.v)); }
static double to_d(bf16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <typename T> double tol_of();
template <> double tol_of<float>() { return 2e-5; }
template <> double tol_of<__half>() { return 2e-3; }
template <> double tol_of<bf16>() { return 1.6e-2; }
template <typename T> const char* name_of();
template <> const char* name_of<float>() { return "f32"; }
template <> const char* name_of<__half>() { return "f16"; }
template <> const char* name_of<bf16>() { return "bf16"; }

template <typename T> std::vector<T> rand_vec(size_t n, double s = 1.0) {
  std::normal_distribution<double> d(0, s); std::vector<T> v(n); for (auto& x : v) x = to_t<T>(d(rng)); return v;
}
template <typename T> bool check(const std::string& what, const T* got, const std::vector<double>& ref, double tol) {
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = to_d(got[i]), r = ref[i];
    if (!(std::fabs(g - r) <= tol * (1.0 + std::fabs(r)))) {
      std::printf("FAIL %s at %zu: got %.8g expected %.8g\n", what.c_str(), i, g, r); ++failures; return false;
    }
  }
  return true;
}

struct Plan { bool wave; int block; int grid; long groups; };
static Plan plan(long rows, long C, long cached, int per_cu) {
  const int wave = 64, cus = 2;
  if (C <= wave * cached) { int block = 256, per = block / wave; long need = (rows + per - 1) / per; int grid = int(std::max(1L, std::min(need, long(cus * per_cu)))); return {true, block, grid, long(grid) * per}; }
  long threads = ((C + cached - 1) / cached + wave - 1) / wave * wave; int block = int(std::min(1024L, std::max(64L, threads)));
  int grid = int(std::max(1L, std::min(rows, long(cus * std::max(1, per_cu * 256 / block)))));
  return {false, block, grid, grid};
}

template <typename T>
using WideBwd = void (*)(const T*, const T*, const T*, const float*, const float*, T*, float*, int64_t, int);

template <typename T>
static void test_layernorm(void (*fwd)(const T*, const T*, const T*, T*, float*, float*, int64_t, int, float, int),
                           void (*bwd)(const T*, const T*, const T*, const float*, const float*, T*, float*, int64_t, int, int),
                           void (*dwdb)(const float*, int64_t, int, T*, T*), long rows, int C, int offset, int force,
                           WideBwd<T> wide = nullptr) {
  const float eps = 1e-5f;
  auto xs = rand_vec<T>(rows * C + offset), w = rand_vec<T>(C + offset), b = rand_vec<T>(C + offset), dys = rand_vec<T>(rows * C + offset);
  const T *x = xs.data() + offset, *wp = w.data() + offset, *bp = b.data() + offset, *dy = dys.data() + offset;
  std::vector<T> ys(rows * C + offset); T* y = ys.data() + offset;
  std::vector<float> mean(rows), rstd(rows);
  Plan p = plan(rows, C, 16, 32);
  if (force == 1) p = {false, 128, 2, 2};
  if (force == 2) p = {true, 128, 1, 2};
  emu_launch(fwd, emu_dim3{unsigned(p.grid)}, p.block, x, wp, bp, y, mean.data(), rstd.data(), int64_t(rows), C, eps, int(p.wave));
  std::vector<double> ry(rows * C), rm(rows), rr(rows);
  for (long r = 0; r < rows; ++r) {
    double m = 0, v = 0; for (int j = 0; j < C; ++j) m += to_d(x[r * C + j]); m /= C;
    for (int j = 0; j < C; ++j) { double d = to_d(x[r * C + j]) - m; v += d * d; } v /= C;
    double rs = 1.0 / std::sqrt(v + eps); rm[r] = m; rr[r] = rs;
    for (int j = 0; j < C; ++j) ry[r * C + j] = (to_d(x[r * C + j]) - m) * rs * to_d(wp[j]) + to_d(bp[j]);
  }
  std::string tag = std::string(name_of<T>()) + " rows " + std::to_string(rows) + " C " + std::to_string(C) + " off " + std::to_string(offset) + " force " + std::to_string(force) + (p.wave ? " wave" : " block");
  check("fwd y " + tag, y, ry, tol_of<T>() * 4);
  check("fwd mean " + tag, mean.data(), rm, 1e-5);
  check("fwd rstd " + tag, rstd.data(), rr, 1e-4);
  // backward from the device's saved stats
  Plan q = plan(rows, C, 4, 4);
  if (force == 1) q = {false, 128, 2, 2};
  if (force == 2) q = {true, 128, 1, 2};
  std::vector<float> partial(size_t(q.groups) * 2 * C + 4, NAN);
  float* part = partial.data();
  if (offset) part += 1;  // misaligned partial -> scalar path
  std::vector<T> dxs(rows * C + offset); T* dx = dxs.data() + offset;
  std::vector<T> dw(C), db(C);
  // The wide backward (src/ops/layernorm.rs: 4096 < C <= 8192, C % 4 == 0, aligned tensors).
  const bool use_wide = wide != nullptr && force == 0 && offset == 0 && C % 4 == 0 && C > 4 * 1024 && C <= 8 * 1024;
  if (use_wide) {
    const int block = ((C + 7) / 8 + 63) / 64 * 64;
    const int grid = int(std::max(1L, std::min(rows, long(2 * std::max(1, 4 * 256 / block)))));
    q = {false, block, grid, grid};
    emu_launch(wide, emu_dim3{unsigned(q.grid)}, q.block, x, wp, dy, (const float*)mean.data(), (const float*)rstd.data(), dx, part, int64_t(rows), C);
  } else {
    emu_launch(bwd, emu_dim3{unsigned(q.grid)}, q.block, x, wp, dy, (const float*)mean.data(), (const float*)rstd.data(), dx, part, int64_t(rows), C, int(q.wave));
  }
  emu_launch(dwdb, emu_dim3{unsigned((C + 255) / 256)}, 256, (const float*)part, int64_t(q.groups), C, dw.data(), db.data());
  std::vector<double> rdx(rows * C), rdw(C, 0), rdb(C, 0);
  for (long r = 0; r < rows; ++r) {
    double m = mean[r], rs = rstd[r], s1 = 0, s2 = 0;
    for (int j = 0; j < C; ++j) { double xh = (to_d(x[r * C + j]) - m) * rs, g = to_d(dy[r * C + j]) * to_d(wp[j]); s1 += g; s2 += g * xh; rdw[j] += to_d(dy[r * C + j]) * xh; rdb[j] += to_d(dy[r * C + j]); }
    for (int j = 0; j < C; ++j) { double xh = (to_d(x[r * C + j]) - m) * rs, g = to_d(dy[r * C + j]) * to_d(wp[j]); rdx[r * C + j] = rs * (g - s1 / C - xh * s2 / C); }
  }
  tag += use_wide ? " bwd-wide" : q.wave ? " bwd-wave" : " bwd-block";
  check("bwd dx " + tag, dx, rdx, tol_of<T>() * 8);
  check("bwd dw " + tag, dw.data(), rdw, tol_of<T>() * 8);
  check("bwd db " + tag, db.data(), rdb, tol_of<T>() * 8);
}

/// torch.maximum: NaN when either operand is NaN.
static double torch_maximum(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

struct Desc { void* param; const void* grad; float *m, *v, *vmax, *master; int64_t numel, first_chunk; };

template <typename T>
static void test_adamw(void (*k)(const AdamwTable, int, int64_t, int64_t, float, float, float, float, float, float, float, float, int, int, const float*, const float*),
                       bool amsgrad, bool maximize, bool master, bool scaled, float found) {
  const long chunk = 1000;  // small chunks to cross tensor boundaries
  std::vector<long> lens = {1, 255, 1003, 4097};
  double lr = 1e-2, b1 = 0.9, b2 = 0.999, epsv = 1e-8, wd = 0.1; long t = 7;
  struct H { std::vector<T> p, g; std::vector<float> m, v, vmax, master; };
  std::vector<H> hs(lens.size());
  std::vector<AdamwTensor> table;
  long first = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    long n = lens[i]; H& h = hs[i];
    h.p = rand_vec<T>(n); h.g = rand_vec<T>(n, 1e-2); h.m = rand_vec<float>(n, 1e-3);
    for (long e = 0; e < n; ++e) { double a = std::normal_distribution<double>(0, 1e-2)(rng); h.v.push_back(float(a * a)); h.vmax.push_back(float(a * a * 1.5)); h.master.push_back(float(to_d(h.p[e]))); }
    table.push_back(AdamwTensor{h.p.data(), h.g.data(), h.m.data(), h.v.data(), amsgrad ? h.vmax.data() : nullptr, master ? h.master.data() : nullptr, n, first});
    first += (n + chunk - 1) / chunk;
  }
  std::vector<H> before = hs;
  AdamwTable by_value{};  // passed by value in the kernel arguments, as the launcher does
  std::copy(table.begin(), table.end(), by_value.rows);
  float scale = 256.0f;
  float sc[5] = {float(b1), float(1 - b1), float(b2), float(1 - b2), float(epsv)};
  emu_launch(k, emu_dim3{3}, 256, by_value, int(table.size()), int64_t(first), int64_t(chunk), sc[0], sc[1], sc[2], sc[3], sc[4],
             float(1 - lr * wd), float(lr / (1 - std::pow(b1, t))), float(std::sqrt(1 - std::pow(b2, t))), int(maximize), int(amsgrad),
             scaled ? (const float*)&scale : nullptr, (const float*)&found);
  std::string tag = std::string("adamw ") + name_of<T>() + (amsgrad ? " ams" : "") + (maximize ? " max" : "") + (master ? " master" : "") + (scaled ? " scaled" : "") + (found != 0 ? " found_inf" : "");
  for (size_t i = 0; i < lens.size(); ++i) {
    H& h = hs[i]; const H& b = before[i]; long n = lens[i];
    std::vector<double> rp(n), rm(n), rv(n), rvm(n), rmaster(n);
    for (long e = 0; e < n; ++e) {
      double g = to_d(b.g[e]) / (scaled ? scale : 1.0); if (maximize) g = -g;
      double p = (master ? double(b.master[e]) : to_d(b.p[e])) * (1 - lr * wd);
      double m = b1 * b.m[e] + (1 - b1) * g, v = b2 * b.v[e] + (1 - b2) * g * g;
      double vu = amsgrad ? torch_maximum(double(b.vmax[e]), v) : v;
      p -= lr / (1 - std::pow(b1, t)) * m / (std::sqrt(vu) / std::sqrt(1 - std::pow(b2, t)) + epsv);
      if (found != 0) { rp[e] = to_d(b.p[e]); rm[e] = b.m[e]; rv[e] = b.v[e]; rvm[e] = b.vmax[e]; rmaster[e] = b.master[e]; }
      else { rp[e] = p; rm[e] = m; rv[e] = v; rvm[e] = amsgrad ? vu : b.vmax[e]; rmaster[e] = master ? p : b.master[e]; }
    }
    std::string tg = tag + " tensor " + std::to_string(i);
    check(tg + " param", h.p.data(), rp, tol_of<T>());
    check(tg + " m", h.m.data(), rm, 1e-6);
    check(tg + " v", h.v.data(), rv, 1e-6);
    check(tg + " vmax", h.vmax.data(), rvm, 1e-6);
    check(tg + " master", h.master.data(), rmaster, 1e-6);
  }
}

/// amsgrad with a NaN already in max_exp_avg_sq (element 0) or in exp_avg_sq (element 1): both
/// must stay NaN in v̂ and reach the parameter, as torch.maximum does; element 2 is finite.
template <typename T>
static void test_adamw_amsgrad_nan(void (*k)(const AdamwTable, int, int64_t, int64_t, float, float, float, float, float, float, float, float, int, int, const float*, const float*)) {
  std::vector<T> p(3, to_t<T>(1.0)), g(3, to_t<T>(0.1));
  std::vector<float> m(3, 0.0f), v = {0.25f, NAN, 0.25f}, vmax = {NAN, 0.5f, 0.5f};
  AdamwTable t{};  // by value, as the launcher passes it
  t.rows[0] = AdamwTensor{p.data(), g.data(), m.data(), v.data(), vmax.data(), nullptr, 3, 0};
  const float found = 0;
  emu_launch(k, emu_dim3{1}, 256, t, 1, int64_t(1), int64_t(1000), 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f,
             0.99999f, 0.01f, 0.04f, 0, 1, (const float*)nullptr, &found);
  const bool ok = std::isnan(vmax[0]) && std::isnan(to_d(p[0])) && std::isnan(vmax[1]) && std::isnan(to_d(p[1])) &&
                  vmax[2] == 0.5f && std::isfinite(to_d(p[2]));
  if (!ok) {
    std::printf("FAIL adamw %s amsgrad NaN: vmax = %g %g %g, param = %g %g %g\n", name_of<T>(), vmax[0], vmax[1], vmax[2],
                to_d(p[0]), to_d(p[1]), to_d(p[2]));
    ++failures;
  }
}

template <typename T>
static void test_helpers(void (*nf)(const RefTable, int, int64_t, int64_t, float*), void (*l2)(const RefTable, int, int64_t, int64_t, float*)) {
  const long chunk = 700;
  std::vector<long> lens = {3, 1500, 64};
  std::vector<std::vector<T>> ts; std::vector<TensorRef> table; long first = 0; double ss = 0;
  for (long n : lens) { ts.push_back(rand_vec<T>(n)); for (auto& x : ts.back()) ss += to_d(x) * to_d(x); }
  for (size_t i = 0; i < lens.size(); ++i) { table.push_back(TensorRef{ts[i].data(), lens[i], first, 0}); first += (lens[i] + chunk - 1) / chunk; }
  RefTable by_value{};  // passed by value in the kernel arguments, as the launcher does
  std::copy(table.begin(), table.end(), by_value.rows);
  float flag = 0;
  emu_launch(nf, emu_dim3{2}, 256, by_value, int(table.size()), int64_t(first), int64_t(chunk), &flag);
  if (flag != 0) { std::printf("FAIL nonfinite %s: flagged finite data\n", name_of<T>()); ++failures; }
  std::vector<float> partials(first, NAN);
  emu_launch(l2, emu_dim3{2}, 256, by_value, int(table.size()), int64_t(first), int64_t(chunk), partials.data());
  float norm = -1;
  emu_launch(multi_l2norm_finalize_f32, emu_dim3{1}, 256, (const float*)partials.data(), int64_t(first), &norm);
  check(std::string("l2norm ") + name_of<T>(), &norm, std::vector<double>{std::sqrt(ss)}, 1e-5);
  ts[1][1499] = to_t<T>(INFINITY);
  emu_launch(nf, emu_dim3{2}, 256, by_value, int(table.size()), int64_t(first), int64_t(chunk), &flag);
  if (flag != 1) { std::printf("FAIL nonfinite %s: missed inf\n", name_of<T>()); ++failures; }
}

/// f32 -> bf16 rounding of common.h on edge values (ties to even, overflow, NaN, signed zero).
static void test_bf16_rounding() {
  const struct { uint32_t in; uint16_t out; } cases[] = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82}, {0x3f808001u, 0x3f81},
      {0x7f7fffffu, 0x7f80}, {0xff7fffffu, 0xff80}, {0x7f800000u, 0x7f80}, {0x80000000u, 0x8000},
      {0x00000001u, 0x0000}, {0x7f800001u, 0x7fc0}, {0xffc00000u, 0xffc0}, {0x7fbfffffu, 0x7fff}};
  for (const auto& c : cases) {
    const uint16_t got = hipk::f32_to_bf16(__uint_as_float(c.in)).bits;
    if (got != c.out) { std::printf("FAIL bf16 rounding of %08x: got %04x expected %04x\n", c.in, got, c.out); ++failures; }
  }
}

int main(int argc, char** argv) {
  test_bf16_rounding();
  bool quick = argc > 1 && std::string(argv[1]) == "quick";
  for (int C : {1, 3, 4, 64, 100, 256, 257, 1024, 1025, 2000, 4096, 4100}) {
    for (long rows : {1L, 5L}) {
      test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, rows, C, 0, 0);
      if (!quick) {
        test_layernorm<__half>(layernorm_fwd_f16, layernorm_bwd_f16, layernorm_bwd_dwdb_f16, rows, C, 0, 0);
        test_layernorm<bf16>(layernorm_fwd_bf16, layernorm_bwd_bf16, layernorm_bwd_dwdb_bf16, rows, C, 1, 0);
      }
    }
    std::printf("layernorm C=%d done (%d failures)\n", C, failures); std::fflush(stdout);
  }
  // Rows longer than the one-slot backward: the wide backward (C % 4 == 0) on f32, f16, bf16,
  // with a misaligned f32 view (falls back to the streamed backward) and C % 4 != 0.
  for (int C : {4100, 6000, 8192}) {
    for (long rows : {1L, 3L, 7L}) {
      test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, rows, C, 0, 0, layernorm_bwd_wide_f32);
      if (!quick || rows == 3) {
        test_layernorm<__half>(layernorm_fwd_f16, layernorm_bwd_f16, layernorm_bwd_dwdb_f16, rows, C, 0, 0, layernorm_bwd_wide_f16);
        test_layernorm<bf16>(layernorm_fwd_bf16, layernorm_bwd_bf16, layernorm_bwd_dwdb_bf16, rows, C, 0, 0, layernorm_bwd_wide_bf16);
      }
    }
    test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, 3, C, 1, 0, layernorm_bwd_wide_f32);
    std::printf("layernorm wide C=%d done (%d failures)\n", C, failures); std::fflush(stdout);
  }
  test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, 3, 8190, 0, 0, layernorm_bwd_wide_f32);
  for (int force : {1, 2}) for (int C : {3, 64, 700, 5000}) test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, 5, C, force == 1 ? 1 : 0, force);
  test_layernorm<__half>(layernorm_fwd_f16, layernorm_bwd_f16, layernorm_bwd_dwdb_f16, 3, 20000, 0, 0);
  std::printf("layernorm forced modes done (%d failures)\n", failures);
  for (bool ams : {false, true}) for (bool mx : {false, true}) for (bool master : {false, true}) for (bool sc : {false, true}) {
    test_adamw<float>(adamw_f32, ams, mx, master, sc, 0);
    test_adamw<__half>(adamw_f16, ams, mx, master, sc, 0);
    test_adamw<bf16>(adamw_bf16, ams, mx, master, sc, 0);
  }
  test_adamw<bf16>(adamw_bf16, true, false, true, true, 1.0f);
  test_adamw_amsgrad_nan<float>(adamw_f32);
  test_adamw_amsgrad_nan<__half>(adamw_f16);
  test_adamw_amsgrad_nan<bf16>(adamw_bf16);
  std::printf("adamw done (%d failures)\n", failures);
  test_helpers<float>(multi_nonfinite_f32, multi_l2norm_f32);
  test_helpers<__half>(multi_nonfinite_f16, multi_l2norm_f16);
  test_helpers<bf16>(multi_nonfinite_bf16, multi_l2norm_bf16);
  std::printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
