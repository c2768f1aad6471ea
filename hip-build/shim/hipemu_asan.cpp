// hip-emu overrun check: the AddressSanitizer instrumentation callbacks, implemented here
// against a shadow that hip-emu maintains (no ASan runtime is linked).
//
// hip-build's host build compiles the kernels with -fsanitize=address (recoverable reports, a
// dynamic shadow, no stack or global instrumentation) and links this file instead of ASan's
// runtime. Before every load and store the kernel reads the shadow byte of its 8-byte granule,
// at (address >> 3) + __asan_shadow_memory_dynamic_address: 0 means the granule is addressable,
// k in 1..7 its first k bytes, a negative value none. hip-emu maps the shadow (zero pages on
// demand) and sets the offset when it loads the module; it poisons the slack around every device
// allocation and every byte a caching allocator marks as belonging to no live block
// (hip-emu/src/runtime/shadow.rs). An access that reaches poisoned bytes calls a report function
// below, which records the first bad access of the launch (address, size, read or write, the
// program counter); the executor fails the launch with it, naming the allocation and the source
// line. Race-check builds (-fsanitize=thread) call hipemu_asan_check from their own callbacks
// (hipemu_race.cpp), so the check holds in both kinds of build.
//
// This file is compiled without instrumentation.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {

/// The first bad access of the current launch (read by hip-emu/src/runtime/shadow.rs: keep the
/// layouts equal).
struct hipemu_asan_state {
  uint32_t version;  // 1
  uint32_t found;
  uintptr_t addr;
  uint64_t size;
  uint32_t write;
  uint32_t pad;
  const void* pc;
};

__attribute__((visibility("default"))) hipemu_asan_state hipemu_asan = {1, 0, 0, 0, 0, 0, nullptr};

/// Set by hip-emu when it loads the module, before any kernel runs; 0: no shadow (no check).
__attribute__((visibility("default"))) uintptr_t __asan_shadow_memory_dynamic_address = 0;

}  // extern "C"

namespace {

/// The first poisoned byte of [a, a + size), or 0.
inline uintptr_t first_bad(uintptr_t a, size_t size) {
  const uintptr_t off = __asan_shadow_memory_dynamic_address;
  if (off == 0 || size == 0) return 0;
  const uintptr_t end = a + size;
  for (uintptr_t g = a & ~uintptr_t{7}; g < end; g += 8) {
    const int8_t s = *reinterpret_cast<const int8_t*>((g >> 3) + off);
    if (s == 0) continue;
    const uintptr_t lo = g > a ? g : a;
    // Bytes g .. g + s - 1 are addressable (none when s < 0).
    const uintptr_t ok_end = s < 0 ? g : g + static_cast<uintptr_t>(s);
    const uintptr_t bad = lo > ok_end ? lo : ok_end;
    if (bad < end && bad < g + 8) return bad;
  }
  return 0;
}

void record(uintptr_t addr, size_t size, bool write, const void* pc) {
  uint32_t expected = 0;
  if (!__atomic_compare_exchange_n(&hipemu_asan.found, &expected, 2u, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    return;
  }
  hipemu_asan.addr = addr;
  hipemu_asan.size = size;
  hipemu_asan.write = write ? 1u : 0u;
  hipemu_asan.pc = pc;
  __atomic_store_n(&hipemu_asan.found, 1u, __ATOMIC_RELEASE);
}

inline void check_range(const void* p, size_t n, bool write, const void* pc) {
  const uintptr_t bad = first_bad(reinterpret_cast<uintptr_t>(p), n);
  if (bad != 0) record(bad, n, write, pc);
}

}  // namespace

extern "C" {

/// For the race-check build's callbacks: records the access when it reaches poisoned bytes.
__attribute__((visibility("hidden"))) void hipemu_asan_check(uintptr_t addr, size_t size,
                                                             int write, const void* pc) {
  const uintptr_t bad = first_bad(addr, size);
  if (bad != 0) record(bad, size, write != 0, pc);
}

// The instrumentation has checked the shadow already: these only record.
#define HIPEMU_ASAN_REPORT(KIND, SIZE, WRITE)                               \
  void __asan_report_##KIND##SIZE##_noabort(uintptr_t addr) {               \
    record(addr, SIZE, WRITE, __builtin_return_address(0));                 \
  }
HIPEMU_ASAN_REPORT(load, 1, false)
HIPEMU_ASAN_REPORT(load, 2, false)
HIPEMU_ASAN_REPORT(load, 4, false)
HIPEMU_ASAN_REPORT(load, 8, false)
HIPEMU_ASAN_REPORT(load, 16, false)
HIPEMU_ASAN_REPORT(store, 1, true)
HIPEMU_ASAN_REPORT(store, 2, true)
HIPEMU_ASAN_REPORT(store, 4, true)
HIPEMU_ASAN_REPORT(store, 8, true)
HIPEMU_ASAN_REPORT(store, 16, true)
#undef HIPEMU_ASAN_REPORT

// Accesses of other sizes: the shadow is not checked yet.
void __asan_report_load_n_noabort(uintptr_t addr, size_t size) {
  check_range(reinterpret_cast<const void*>(addr), size, false, __builtin_return_address(0));
}
void __asan_report_store_n_noabort(uintptr_t addr, size_t size) {
  check_range(reinterpret_cast<const void*>(addr), size, true, __builtin_return_address(0));
}
void __asan_loadN_noabort(uintptr_t addr, size_t size) {
  check_range(reinterpret_cast<const void*>(addr), size, false, __builtin_return_address(0));
}
void __asan_storeN_noabort(uintptr_t addr, size_t size) {
  check_range(reinterpret_cast<const void*>(addr), size, true, __builtin_return_address(0));
}

void* __asan_memcpy(void* dst, const void* src, size_t n) {
  const void* pc = __builtin_return_address(0);
  check_range(src, n, false, pc);
  check_range(dst, n, true, pc);
  return memcpy(dst, src, n);
}
void* __asan_memmove(void* dst, const void* src, size_t n) {
  const void* pc = __builtin_return_address(0);
  check_range(src, n, false, pc);
  check_range(dst, n, true, pc);
  return memmove(dst, src, n);
}
void* __asan_memset(void* dst, int c, size_t n) {
  check_range(dst, n, true, __builtin_return_address(0));
  return memset(dst, c, n);
}

// Outlined checks (a function with more accesses than the inline threshold).
#define HIPEMU_ASAN_CHECK(KIND, SIZE, WRITE)                                          \
  void __asan_##KIND##SIZE##_noabort(uintptr_t addr) {                                 \
    check_range(reinterpret_cast<const void*>(addr), SIZE, WRITE, __builtin_return_address(0)); \
  }
HIPEMU_ASAN_CHECK(load, 1, false)
HIPEMU_ASAN_CHECK(load, 2, false)
HIPEMU_ASAN_CHECK(load, 4, false)
HIPEMU_ASAN_CHECK(load, 8, false)
HIPEMU_ASAN_CHECK(load, 16, false)
HIPEMU_ASAN_CHECK(store, 1, true)
HIPEMU_ASAN_CHECK(store, 2, true)
HIPEMU_ASAN_CHECK(store, 4, true)
HIPEMU_ASAN_CHECK(store, 8, true)
HIPEMU_ASAN_CHECK(store, 16, true)
#undef HIPEMU_ASAN_CHECK

void __asan_handle_no_return() {}
void __asan_init() {}
void __asan_version_mismatch_check_v8() {}

}  // extern "C"
