// Host emulation test of the training-step kernels: kernels/encoder.hip, gelu.hip,
// crossentropy.hip, bias.hip and clip.hip (see README.md in this directory for the shim: one
// std::thread per GPU thread, shuffles through per-wave buffers). Compares against double loops
// that restate the CPU reference (src/cpu/{encoder,gelu,residual,crossentropy,bias,clip}.rs) on
// odd sizes, misaligned views (scalar path) and aligned ones (vector path), every dtype; checks
// the device error flag for bad token ids / targets and bit-identical results of the
// deterministic backward kernels under different grids. Not the device compiler and not the
// hardware. Build and run: tools/kernel-emu/run_trainops.sh [quick]
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <atomic>
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
inline unsigned atomicMin(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {}
  return old;
}
using std::isfinite;
#include "encoder.hip"
#include "gelu.hip"
#include "crossentropy.hip"
#include "bias.hip"
#include "clip.hip"

using hipk::bf16;
static std::mt19937 rng(7);
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
/// |got − ref| ≤ tol·(scale + |ref|) for every element; NaN only where ref is NaN.
template <typename T> bool check(const std::string& what, const T* got, const std::vector<double>& ref, double tol, double scale = 1.0) {
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = to_d(got[i]), r = ref[i];
    bool ok = std::isnan(r) ? std::isnan(g) : std::isinf(r) ? g == r : std::fabs(g - r) <= tol * (scale + std::fabs(r));
    if (!ok) { std::printf("FAIL %s at %zu: got %.9g expected %.9g\n", what.c_str(), i, g, r); ++failures; return false; }
  }
  return true;
}
template <typename T> bool same_bits(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) != 0) { std::printf("FAIL %s: not bit-identical\n", what.c_str()); ++failures; return false; }
  return true;
}
static std::string tag_of(const char* op, const char* dt, std::initializer_list<long> dims) {
  std::string s = std::string(op) + " " + dt; for (long d : dims) s += " " + std::to_string(d); return s;
}

// ---------------------------------------------------------------- gelu, residual add
static double gelu_d(double x) { double u = 0.7978845608028654 * (x + 0.044715 * x * x * x); return 0.5 * x * (1 + std::tanh(u)); }
static double gelu_grad_d(double x) {
  double k = 0.7978845608028654, th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
}

template <typename T>
static void test_elementwise(void (*fwd)(const T*, T*, int64_t), void (*bwd)(const T*, const T*, T*, int64_t),
                             void (*add)(const T*, const T*, T*, int64_t), long n, int off, int grid) {
  auto xs = rand_vec<T>(n + off, 3.0), gs = rand_vec<T>(n + off), bs = rand_vec<T>(n + off);
  const T *x = xs.data() + off, *g = gs.data() + off, *b = bs.data() + off;
  std::vector<T> os(n + off); T* o = os.data() + off;
  std::string tag = tag_of("", name_of<T>(), {n, off, grid});
  std::vector<double> r(n);
  emu_launch(fwd, emu_dim3{unsigned(grid)}, 256, x, o, int64_t(n));
  for (long i = 0; i < n; ++i) r[i] = gelu_d(to_d(x[i]));
  check("gelu_fwd" + tag, o, r, tol_of<T>());
  emu_launch(bwd, emu_dim3{unsigned(grid)}, 256, x, g, o, int64_t(n));
  for (long i = 0; i < n; ++i) r[i] = to_d(g[i]) * gelu_grad_d(to_d(x[i]));
  check("gelu_bwd" + tag, o, r, tol_of<T>());
  emu_launch(add, emu_dim3{unsigned(grid)}, 256, x, b, o, int64_t(n));
  for (long i = 0; i < n; ++i) r[i] = to_d(x[i]) + to_d(b[i]);
  check("residual_add" + tag, o, r, tol_of<T>());
  // In place: out aliases a.
  std::vector<T> a2(xs);
  emu_launch(add, emu_dim3{unsigned(grid)}, 256, (const T*)(a2.data() + off), b, a2.data() + off, int64_t(n));
  check("residual_add in place" + tag, a2.data() + off, r, tol_of<T>());
}

// ---------------------------------------------------------------- bias gradient
template <typename T>
static void test_bias(void (*part)(const T*, float*, int64_t, int, int64_t), void (*fin)(const float*, int64_t, int, T*, int),
                      long rows, int cols, long groups, bool accumulate, int off) {
  auto ds = rand_vec<T>(rows * cols + off), dbs = rand_vec<T>(cols);
  const T* d = ds.data() + off;
  std::vector<T> db(dbs);
  long rpg = (rows + groups - 1) / groups;
  constexpr int N = hipk::VecWidth<T>::value;
  std::vector<float> partial(groups * cols, NAN);
  emu_launch(part, emu_dim3{unsigned((cols + 64 * N - 1) / (64 * N)), unsigned(groups)}, 64, d, partial.data(), int64_t(rows), cols, int64_t(rpg));
  emu_launch(fin, emu_dim3{unsigned((cols + 63) / 64)}, 64, (const float*)partial.data(), int64_t(groups), cols, db.data(), int(accumulate));
  std::vector<double> r(cols);
  for (int j = 0; j < cols; ++j) { double s = 0; for (long i = 0; i < rows; ++i) s += to_d(d[i * cols + j]); r[j] = (accumulate ? to_d(dbs[j]) : 0.0) + s; }
  check("bias_bwd" + tag_of("", name_of<T>(), {rows, cols, groups, accumulate, off}), db.data(), r, tol_of<T>() * 4);
}

/// The bias epilogue on a given GEMM output: out = out + bias (then GELU), pre_gelu saved.
template <typename T>
static void test_bias_add(void (*k)(T*, const T*, T*, int64_t, int, int), long rows, int cols, bool gelu, bool save, int off) {
  auto os = rand_vec<T>(rows * cols + off), bs = rand_vec<T>(cols + off);
  T* o = os.data() + off; const T* b = bs.data() + off;
  std::vector<double> x(rows * cols), ro(rows * cols);
  for (long i = 0; i < rows * cols; ++i) { x[i] = to_d(o[i]) + to_d(b[i % cols]); ro[i] = gelu ? gelu_d(x[i]) : x[i]; }
  std::vector<T> pre(rows * cols + off);
  emu_launch(k, emu_dim3{2}, 64, o, b, save ? pre.data() + off : (T*)nullptr, int64_t(rows), cols, int(gelu));
  std::string tag = tag_of("", name_of<T>(), {rows, cols, gelu, save, off});
  check("bias_add out" + tag, o, ro, tol_of<T>());
  if (save) check("bias_add pre_gelu" + tag, pre.data() + off, x, tol_of<T>());
}

// ---------------------------------------------------------------- encoder
template <typename T>
static void test_encoder(void (*fwd)(const int*, const T*, const T*, T*, int64_t, int, int, int, unsigned*),
                         void (*dwte_k)(const T*, const int*, const int*, const int*, T*, int),
                         void (*dwpe_k)(const T*, T*, int64_t, int, int), long B, int Tn, int C, int V, int P, int off, bool bad) {
  const long rows = B * Tn;
  std::vector<int> tokens(rows);
  std::uniform_int_distribution<int> u(0, V - 1);
  for (auto& t : tokens) t = u(rng);
  if (rows > 3) { tokens[1] = tokens[0]; tokens[rows - 1] = tokens[0]; }  // repeats
  long bad_row = -1;
  if (bad) { bad_row = rows / 2; tokens[bad_row] = (bad_row % 2) ? V : -1; tokens[rows - 1 > bad_row ? rows - 1 : bad_row] = V + 7; }
  auto wtes = rand_vec<T>(V * C + off), wpes = rand_vec<T>(P * C + off);
  const T *wte = wtes.data() + off, *wpe = wpes.data() + off;
  std::vector<T> outs(rows * C + off); T* out = outs.data() + off;
  unsigned err = 0xffffffffu;
  std::string tag = tag_of("", name_of<T>(), {B, Tn, C, V, off, bad});
  emu_launch(fwd, emu_dim3{3}, 128, (const int*)tokens.data(), wte, wpe, out, int64_t(rows), Tn, C, V, &err);
  std::vector<double> r(rows * C);
  for (long i = 0; i < rows; ++i) for (int c = 0; c < C; ++c) {
    int t = tokens[i];
    r[i * C + c] = (t >= 0 && t < V) ? to_d(wte[t * C + c]) + to_d(wpe[(i % Tn) * C + c]) : NAN;
  }
  check("encoder_fwd" + tag, out, r, tol_of<T>());
  if (err != (bad ? unsigned(bad_row) : 0xffffffffu)) { std::printf("FAIL encoder_fwd%s: error flag %u expected %ld\n", tag.c_str(), err, bad ? bad_row : -1L); ++failures; }
  // Backward: links, then dwte and dwpe (accumulating into random initial values).
  auto douts = rand_vec<T>(rows * C + off);
  const T* dout = douts.data() + off;
  std::vector<int> next(rows, 99), first(rows, 99);
  unsigned err2 = 0xffffffffu;
  emu_launch(encoder_links_i32, emu_dim3{unsigned((rows + 127) / 128)}, 128, (const int*)tokens.data(), int64_t(rows), V, next.data(), first.data(), &err2);
  if (err2 != err) { std::printf("FAIL encoder_links%s: error flag %u expected %u\n", tag.c_str(), err2, err); ++failures; }
  auto dwte0 = rand_vec<T>(V * C), dwpe0 = rand_vec<T>(P * C);
  std::vector<T> dwte(dwte0), dwpe(dwpe0);
  constexpr int N = hipk::VecWidth<T>::value;
  emu_launch(dwte_k, emu_dim3{unsigned(rows), unsigned((C + 64 * N - 1) / (64 * N))}, 64, dout, (const int*)tokens.data(), (const int*)next.data(), (const int*)first.data(), dwte.data(), C);
  emu_launch(dwpe_k, emu_dim3{2}, 64, dout, dwpe.data(), int64_t(B), Tn, C);
  std::vector<double> rw(V * C), rp(P * C);
  for (long k = 0; k < V * C; ++k) rw[k] = 0;
  for (long i = 0; i < rows; ++i) { int t = tokens[i]; if (t < 0 || t >= V) continue; for (int c = 0; c < C; ++c) rw[t * C + c] += to_d(dout[i * C + c]); }
  for (long k = 0; k < V * C; ++k) rw[k] += to_d(dwte0[k]);
  for (long k = 0; k < P * C; ++k) rp[k] = to_d(dwpe0[k]);
  for (long i = 0; i < rows; ++i) for (int c = 0; c < C; ++c) rp[(i % Tn) * C + c] += to_d(dout[i * C + c]);
  check("encoder_bwd dwte" + tag, dwte.data(), rw, tol_of<T>() * 4);
  check("encoder_bwd dwpe" + tag, dwpe.data(), rp, tol_of<T>() * 4);
  // Bit-identical under another block size and grid.
  std::vector<T> dwte2(dwte0), dwpe2(dwpe0);
  emu_launch(dwte_k, emu_dim3{unsigned(rows), unsigned((C + 32 * N - 1) / (32 * N))}, 32, dout, (const int*)tokens.data(), (const int*)next.data(), (const int*)first.data(), dwte2.data(), C);
  emu_launch(dwpe_k, emu_dim3{1}, 192, dout, dwpe2.data(), int64_t(B), Tn, C);
  same_bits("encoder_bwd dwte regrid" + tag, dwte, dwte2);
  same_bits("encoder_bwd dwpe regrid" + tag, dwpe, dwpe2);
}

// ---------------------------------------------------------------- cross-entropy
template <typename T>
static void test_crossentropy(void (*k)(T*, const int*, float*, const float*, int64_t, int, int, float, int, unsigned*),
                              long rows, int V, int Vp, double scale, bool grad, int pattern, int grid) {
  auto logits0 = rand_vec<T>(rows * Vp, scale);
  for (auto& x : logits0) x = to_t<T>(std::max(-1e4, std::min(1e4, to_d(x))));
  if (rows > 2 && V > 3 && scale < 100) { logits0[Vp + 2] = to_t<T>(1e4); logits0[2 * Vp] = to_t<T>(-1e4); }
  std::vector<int> targets(rows);
  std::uniform_int_distribution<int> u(0, V - 1);
  for (auto& t : targets) t = u(rng);
  long bad_row = -1;
  if (pattern >= 1) for (long i = 1; i < rows; i += 3) targets[i] = -100;
  if (pattern == 2) for (auto& t : targets) t = -100;
  if (pattern == 3 && rows > 2) { bad_row = 2; targets[2] = V; }
  float count = -1, mean = -1;
  emu_launch(crossentropy_count_i32, emu_dim3{1}, 128, (const int*)targets.data(), int64_t(rows), &count);
  std::vector<T> logits(logits0);
  std::vector<float> losses(rows, -7.0f);
  unsigned err = 0xffffffffu;
  const float dloss = 0.75f;
  emu_launch(k, emu_dim3{unsigned(grid)}, 128, logits.data(), (const int*)targets.data(), losses.data(), (const float*)&count, int64_t(rows), V, Vp, dloss, int(grad), &err);
  emu_launch(crossentropy_mean_f32, emu_dim3{1}, 128, (const float*)losses.data(), (const float*)&count, int64_t(rows), &mean);
  long n = 0; for (int t : targets) n += t != -100;
  std::vector<double> rl(rows), rd(rows * Vp);
  double total = 0;
  for (long i = 0; i < rows; ++i) {
    const int t = targets[i];
    const bool ign = t == -100, bad = !ign && (t < 0 || t >= V);
    if (ign || bad) { rl[i] = bad ? NAN : 0.0; for (int j = 0; j < Vp; ++j) rd[i * Vp + j] = grad ? (bad ? NAN : 0.0) : to_d(logits0[i * Vp + j]); continue; }
    double mx = -INFINITY; for (int j = 0; j < V; ++j) mx = std::max(mx, to_d(logits0[i * Vp + j]));
    double s = 0; for (int j = 0; j < V; ++j) s += std::exp(to_d(logits0[i * Vp + j]) - mx);
    double lse = mx + std::log(s);
    rl[i] = lse - to_d(logits0[i * Vp + t]); total += rl[i];
    for (int j = 0; j < Vp; ++j) {
      double x = to_d(logits0[i * Vp + j]);
      rd[i * Vp + j] = !grad ? x : j < V ? (std::exp(x - lse) - (j == t)) * dloss / double(n) : 0.0;
    }
  }
  std::string tag = tag_of("", name_of<T>(), {rows, V, Vp, long(scale), grad, pattern, grid});
  if (count != float(n)) { std::printf("FAIL crossentropy_count%s: %g expected %ld\n", tag.c_str(), count, n); ++failures; }
  // lse sums V exponentials in f32: relative error up to ~u·log(V) per level; loss magnitudes up to 2e4.
  check("crossentropy losses" + tag, losses.data(), rl, 2e-5 * (1 + std::log2(double(V))));
  check("crossentropy dlogits" + tag, logits.data(), rd, tol_of<T>() * 2, grad && n ? dloss / double(n) : 1.0);
  std::vector<double> rm{n && bad_row < 0 ? total / double(n) : NAN};
  check("crossentropy mean" + tag, &mean, rm, 1e-5);
  if (err != (pattern == 3 ? unsigned(bad_row) : 0xffffffffu)) { std::printf("FAIL crossentropy%s: error flag %u\n", tag.c_str(), err); ++failures; }
}

// ---------------------------------------------------------------- clip
static void test_clip() {
  struct C { float norm; bool has_scale; float scale; float max_norm; };
  const C cases[] = {{7.25f, false, 1, 1.0f}, {0.5f, false, 1, 1.0f}, {65536.0f * 3.5f, true, 65536.0f, 2.0f},
                     {NAN, false, 1, 1.0f}, {INFINITY, true, 1024.0f, 1.0f}};
  for (const C& c : cases) {
    float gs = -1;
    emu_launch(clip_grad_scale_f32, emu_dim3{1}, 64, (const float*)&c.norm, c.has_scale ? (const float*)&c.scale : (const float*)nullptr, c.max_norm, &gs);
    const double s = c.has_scale ? c.scale : 1.0;
    double coef = double(c.max_norm) / (double(c.norm) / s + 1e-6);
    if (!std::isnan(coef)) coef = std::min(1.0, coef);
    std::vector<double> r{s / coef};
    check("clip norm " + std::to_string(c.norm), &gs, r, 1e-6, 0.0);
  }
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  test_clip();
  for (long n : {1L, 7L, 1031L}) for (int off : {0, 1}) {
    test_elementwise<float>(gelu_fwd_f32, gelu_bwd_f32, residual_add_f32, n, off, 2);
    test_elementwise<__half>(gelu_fwd_f16, gelu_bwd_f16, residual_add_f16, n, off, 1);
    test_elementwise<bf16>(gelu_fwd_bf16, gelu_bwd_bf16, residual_add_bf16, n, off, 3);
  }
  std::printf("gelu / residual_add done (%d failures)\n", failures); std::fflush(stdout);
  for (auto [rows, cols, groups, acc, off] : {std::tuple{37L, 19, 3L, false, 0}, {9L, 130, 2L, true, 0}, {1L, 5, 1L, false, 1}, {20L, 64, 4L, true, 1}}) {
    test_bias<float>(bias_bwd_partial_f32, bias_bwd_final_f32, rows, cols, groups, acc, off);
    test_bias<__half>(bias_bwd_partial_f16, bias_bwd_final_f16, rows, cols, groups, acc, off);
    test_bias<bf16>(bias_bwd_partial_bf16, bias_bwd_final_bf16, rows, cols, groups, acc, off);
  }
  for (auto [rows, cols, gelu, save, off] : {std::tuple{5L, 13, false, false, 0}, {7L, 16, true, true, 0}, {3L, 9, true, false, 1}, {2L, 64, true, true, 1}}) {
    test_bias_add<float>(bias_add_f32, rows, cols, gelu, save, off);
    test_bias_add<__half>(bias_add_f16, rows, cols, gelu, save, off);
    test_bias_add<bf16>(bias_add_bf16, rows, cols, gelu, save, off);
  }
  std::printf("bias done (%d failures)\n", failures); std::fflush(stdout);
  // (B, T, C, V, P, off, bad): rows > the links block (128) to cross tiles; odd C; misaligned.
  for (auto [B, Tn, C, V, P, off, bad] : {std::tuple{2L, 5, 7, 11, 9, 0, false}, {3L, 4, 33, 6, 4, 1, false}, {1L, 1, 16, 3, 2, 0, false},
                                           {3L, 100, 24, 40, 100, 0, false}, {2L, 5, 8, 11, 6, 0, true}}) {
    test_encoder<float>(encoder_fwd_f32, encoder_bwd_dwte_f32, encoder_bwd_dwpe_f32, B, Tn, C, V, P, off, bad);
    if (quick && B == 3 && Tn == 100) continue;
    test_encoder<__half>(encoder_fwd_f16, encoder_bwd_dwte_f16, encoder_bwd_dwpe_f16, B, Tn, C, V, P, off, bad);
    test_encoder<bf16>(encoder_fwd_bf16, encoder_bwd_dwte_bf16, encoder_bwd_dwpe_bf16, B, Tn, C, V, P, off, bad);
  }
  std::printf("encoder done (%d failures)\n", failures); std::fflush(stdout);
  // (rows, V, Vp, scale, grad, pattern, grid): pattern 0 plain, 1 some ignored, 2 all ignored, 3 a bad target.
  for (auto [rows, V, Vp, scale, grad, pattern, grid] : {std::tuple{7L, 37, 37, 2.0, true, 1, 3}, {5L, 50, 64, 2.0, true, 0, 2}, {4L, 33, 33, 1e4, true, 0, 4},
                                                         {3L, 17, 20, 1.0, true, 2, 1}, {5L, 29, 29, 1.0, false, 1, 2}, {1L, 1, 1, 1.0, true, 0, 1},
                                                         {4L, 9, 12, 1.0, true, 3, 2}, {2L, 3001, 3008, 3.0, true, 0, 2}}) {
    test_crossentropy<float>(crossentropy_f32, rows, V, Vp, scale, grad, pattern, grid);
    if (quick && V > 1000) continue;
    test_crossentropy<__half>(crossentropy_f16, rows, V, Vp, scale, grad, pattern, grid);
    test_crossentropy<bf16>(crossentropy_bf16, rows, V, Vp, scale, grad, pattern, grid);
  }
  std::printf("crossentropy done (%d failures)\n", failures);
  std::printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
