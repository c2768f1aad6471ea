// Host emulation test of kernels/layernorm.hip and kernels/adamw.hip (see README.md in this
// directory for the shim: one std::thread per GPU thread, shuffles through per-wave buffers).
// Compares against double-precision loops: layernorm forward/backward in both row modes, vector
// and scalar (misaligned) layouts, cached and streamed rows, C from 1 to 20000; fused AdamW over
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
static void test_layernorm(void (*fwd)(const T*, const T*, const T*, T*, float*, float*, int64_t, int, float, int),
                           void (*bwd)(const T*, const T*, const T*, const float*, const float*, T*, float*, int64_t, int, int),
                           void (*dwdb)(const float*, int64_t, int, T*, T*), long rows, int C, int offset, int force) {
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
  emu_launch(bwd, emu_dim3{unsigned(q.grid)}, q.block, x, wp, dy, (const float*)mean.data(), (const float*)rstd.data(), dx, part, int64_t(rows), C, int(q.wave));
  emu_launch(dwdb, emu_dim3{unsigned((C + 255) / 256)}, 256, (const float*)part, int64_t(q.groups), C, dw.data(), db.data());
  std::vector<double> rdx(rows * C), rdw(C, 0), rdb(C, 0);
  for (long r = 0; r < rows; ++r) {
    double m = mean[r], rs = rstd[r], s1 = 0, s2 = 0;
    for (int j = 0; j < C; ++j) { double xh = (to_d(x[r * C + j]) - m) * rs, g = to_d(dy[r * C + j]) * to_d(wp[j]); s1 += g; s2 += g * xh; rdw[j] += to_d(dy[r * C + j]) * xh; rdb[j] += to_d(dy[r * C + j]); }
    for (int j = 0; j < C; ++j) { double xh = (to_d(x[r * C + j]) - m) * rs, g = to_d(dy[r * C + j]) * to_d(wp[j]); rdx[r * C + j] = rs * (g - s1 / C - xh * s2 / C); }
  }
  tag += q.wave ? " bwd-wave" : " bwd-block";
  check("bwd dx " + tag, dx, rdx, tol_of<T>() * 8);
  check("bwd dw " + tag, dw.data(), rdw, tol_of<T>() * 8);
  check("bwd db " + tag, db.data(), rdb, tol_of<T>() * 8);
}

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
      double vu = amsgrad ? std::max(double(b.vmax[e]), v) : v;
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
  for (int force : {1, 2}) for (int C : {3, 64, 700, 5000}) test_layernorm<float>(layernorm_fwd_f32, layernorm_bwd_f32, layernorm_bwd_dwdb_f32, 5, C, force == 1 ? 1 : 0, force);
  test_layernorm<__half>(layernorm_fwd_f16, layernorm_bwd_f16, layernorm_bwd_dwdb_f16, 3, 20000, 0, 0);
  std::printf("layernorm forced modes done (%d failures)\n", failures);
  for (bool ams : {false, true}) for (bool mx : {false, true}) for (bool master : {false, true}) for (bool sc : {false, true}) {
    test_adamw<float>(adamw_f32, ams, mx, master, sc, 0);
    test_adamw<__half>(adamw_f16, ams, mx, master, sc, 0);
    test_adamw<bf16>(adamw_bf16, ams, mx, master, sc, 0);
  }
  test_adamw<bf16>(adamw_bf16, true, false, true, true, 1.0f);
  std::printf("adamw done (%d failures)\n", failures);
  test_helpers<float>(multi_nonfinite_f32, multi_l2norm_f32);
  test_helpers<__half>(multi_nonfinite_f16, multi_l2norm_f16);
  test_helpers<bf16>(multi_nonfinite_bf16, multi_l2norm_bf16);
  std::printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
