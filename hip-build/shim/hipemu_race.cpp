// hip-emu race check: the ThreadSanitizer instrumentation callbacks, implemented here as an LDS
// shadow-memory checker (no TSan runtime is linked).
//
// Kernels compiled with -fsanitize=thread (hip-build's host build with HIPK_EMU_RACE_CHECK=1,
// and hip-emu's own test kernels always) call __tsan_readN/__tsan_writeN before every memory access. Accesses
// outside LDS (the hipemu_lds section of static __shared__ variables and the dynamic LDS buffer)
// return at once. For LDS, one shadow cell per byte records the last writer and the last
// reader(s) with the synchronisation epoch they accessed it in: the block's barrier epoch (bumped
// by the executor at every completed __syncthreads and at every new block) and the wave epoch of
// the accessing wave (bumped at every completed wave operation, where a wave's lanes converge).
// Two accesses of the same byte by different threads race when at least one writes and no
// barrier (different waves) or no barrier and no wave operation (same wave) lies between them.
// The first race of a block is recorded with both program counters; the executor reports it as
// ExecError::Race with file:line of both accesses (DWARF line tables, -g1).
//
// This file is compiled without instrumentation.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

extern "C" {

/// The overrun check (hipemu_asan.cpp): every access is checked against hip-emu's shadow too.
void hipemu_asan_check(uintptr_t addr, size_t size, int write, const void* pc);

/// One shadow cell: who touched an LDS byte last, in which epochs. 0 epochs = never.
struct hipemu_race_cell {
  uint32_t w_epoch, w_wave_epoch;
  uint32_t r_epoch, r_wave_epoch;
  uint16_t w_tid, r_tid;
  uint8_t r_multi_wave;  // readers of more than one wave in r_epoch
  uint8_t r_multi_lane;  // more than one reader (lane) of r_tid's wave in r_wave_epoch
  uint8_t pad[2];
  const void* w_pc;
  const void* r_pc;
};

/// The first race found in the current block.
struct hipemu_race_found {
  uint32_t found;
  uint32_t first_tid, second_tid;
  uint32_t first_write, second_write;
  uintptr_t addr;
  const void* first_pc;
  const void* second_pc;
};

/// State shared with hip-emu/src/exec/race.rs (keep the layouts equal).
struct hipemu_race_state {
  uint32_t enabled;
  uint32_t tid;    // linear id of the running thread
  uint32_t epoch;  // barrier epoch of the block
  uint32_t wave_epoch[16];
  uintptr_t static_lo, static_hi;    // hipemu_lds section
  uintptr_t dynamic_lo, dynamic_hi;  // dynamic LDS buffer
  hipemu_race_cell* shadow;          // (static_hi - static_lo) + (dynamic_hi - dynamic_lo) cells
  size_t shadow_cells;
  hipemu_race_found found;
};

hipemu_race_state hipemu_race = {};

/// Maps the shadow for `cells` LDS bytes (zero pages on demand). Returns 0 on success.
int hipemu_race_alloc(size_t cells) {
  void* p = mmap(nullptr, cells * sizeof(hipemu_race_cell), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -1;
  hipemu_race.shadow = static_cast<hipemu_race_cell*>(p);
  hipemu_race.shadow_cells = cells;
  return 0;
}

}  // extern "C"

namespace {

inline hipemu_race_cell* cell_of(uintptr_t a) {
  hipemu_race_state& s = hipemu_race;
  if (a >= s.static_lo && a < s.static_hi) return s.shadow + (a - s.static_lo);
  if (a >= s.dynamic_lo && a < s.dynamic_hi) {
    return s.shadow + (s.static_hi - s.static_lo) + (a - s.dynamic_lo);
  }
  return nullptr;
}

inline void record(uintptr_t addr, uint32_t first_tid, const void* first_pc, bool first_write,
                   const void* pc, bool write) {
  hipemu_race_found& f = hipemu_race.found;
  if (f.found) return;
  f.found = 1;
  f.addr = addr;
  f.first_tid = first_tid;
  f.first_pc = first_pc;
  f.first_write = first_write;
  f.second_tid = hipemu_race.tid;
  f.second_pc = pc;
  f.second_write = write;
}

/// True when an access by `other` (of wave other/64, at wave epoch `other_wave_epoch`) in the
/// current barrier epoch is not ordered before the running thread's access.
inline bool unordered(uint32_t other, uint32_t other_wave_epoch) {
  const hipemu_race_state& s = hipemu_race;
  if (other == s.tid) return false;
  const uint32_t w = s.tid / 64;
  if (other / 64 != w) return true;
  return other_wave_epoch == s.wave_epoch[w];
}

__attribute__((noinline)) void check(uintptr_t addr, size_t size, bool write, const void* pc) {
  hipemu_race_state& s = hipemu_race;
  if (!s.enabled || s.shadow == nullptr) return;
  const uint32_t me = s.tid;
  const uint32_t wave = me / 64;
  const uint32_t wep = s.wave_epoch[wave < 16 ? wave : 15];
  for (size_t i = 0; i < size; ++i) {
    hipemu_race_cell* c = cell_of(addr + i);
    if (c == nullptr) continue;
    // A write of this epoch by another thread, not ordered before us.
    if (c->w_epoch == s.epoch && unordered(c->w_tid, c->w_wave_epoch)) {
      record(addr + i, c->w_tid, c->w_pc, true, pc, write);
    }
    if (write) {
      if (c->r_epoch == s.epoch) {
        const bool other_wave_reader = c->r_multi_wave || c->r_tid / 64 != wave;
        const bool same_wave_reader = c->r_wave_epoch == wep && (c->r_multi_lane || c->r_tid != me);
        if (other_wave_reader || same_wave_reader) record(addr + i, c->r_tid, c->r_pc, false, pc, true);
      }
      c->w_epoch = s.epoch;
      c->w_wave_epoch = wep;
      c->w_tid = static_cast<uint16_t>(me);
      c->w_pc = pc;
    } else if (c->r_epoch != s.epoch) {
      c->r_epoch = s.epoch;
      c->r_wave_epoch = wep;
      c->r_tid = static_cast<uint16_t>(me);
      c->r_multi_wave = 0;
      c->r_multi_lane = 0;
      c->r_pc = pc;
    } else {
      // r_multi_lane describes the last reader's wave: reset when the wave or its epoch changes.
      if (c->r_tid / 64 != wave) {
        c->r_multi_wave = 1;
        c->r_multi_lane = 0;
      } else if (c->r_wave_epoch == wep) {
        if (c->r_tid != me) c->r_multi_lane = 1;
      } else {
        c->r_multi_lane = 0;
      }
      c->r_wave_epoch = wep;
      c->r_tid = static_cast<uint16_t>(me);
      c->r_pc = pc;
    }
  }
}

inline bool maybe_lds(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const hipemu_race_state& s = hipemu_race;
  return (a >= s.static_lo && a < s.static_hi) || (a >= s.dynamic_lo && a < s.dynamic_hi);
}

}  // namespace

#define HIPEMU_TSAN_ACCESS(NAME, SIZE, WRITE)                                            \
  extern "C" void NAME(void* p) {                                                        \
    hipemu_asan_check(reinterpret_cast<uintptr_t>(p), SIZE, WRITE, __builtin_return_address(0)); \
    if (maybe_lds(p)) check(reinterpret_cast<uintptr_t>(p), SIZE, WRITE, __builtin_return_address(0)); \
  }
HIPEMU_TSAN_ACCESS(__tsan_read1, 1, false)
HIPEMU_TSAN_ACCESS(__tsan_read2, 2, false)
HIPEMU_TSAN_ACCESS(__tsan_read4, 4, false)
HIPEMU_TSAN_ACCESS(__tsan_read8, 8, false)
HIPEMU_TSAN_ACCESS(__tsan_read16, 16, false)
HIPEMU_TSAN_ACCESS(__tsan_write1, 1, true)
HIPEMU_TSAN_ACCESS(__tsan_write2, 2, true)
HIPEMU_TSAN_ACCESS(__tsan_write4, 4, true)
HIPEMU_TSAN_ACCESS(__tsan_write8, 8, true)
HIPEMU_TSAN_ACCESS(__tsan_write16, 16, true)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_read2, 2, false)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_read4, 4, false)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_read8, 8, false)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_read16, 16, false)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_write2, 2, true)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_write4, 4, true)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_write8, 8, true)
HIPEMU_TSAN_ACCESS(__tsan_unaligned_write16, 16, true)
HIPEMU_TSAN_ACCESS(__tsan_volatile_read1, 1, false)
HIPEMU_TSAN_ACCESS(__tsan_volatile_read2, 2, false)
HIPEMU_TSAN_ACCESS(__tsan_volatile_read4, 4, false)
HIPEMU_TSAN_ACCESS(__tsan_volatile_read8, 8, false)
HIPEMU_TSAN_ACCESS(__tsan_volatile_read16, 16, false)
HIPEMU_TSAN_ACCESS(__tsan_volatile_write1, 1, true)
HIPEMU_TSAN_ACCESS(__tsan_volatile_write2, 2, true)
HIPEMU_TSAN_ACCESS(__tsan_volatile_write4, 4, true)
HIPEMU_TSAN_ACCESS(__tsan_volatile_write8, 8, true)
HIPEMU_TSAN_ACCESS(__tsan_volatile_write16, 16, true)
#undef HIPEMU_TSAN_ACCESS

extern "C" {

void __tsan_read_range(void* p, size_t n) {
  hipemu_asan_check(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0));
  if (maybe_lds(p)) check(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0));
}
void __tsan_write_range(void* p, size_t n) {
  hipemu_asan_check(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0));
  if (maybe_lds(p)) check(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0));
}
void* __tsan_memcpy(void* dst, const void* src, size_t n) {
  const void* pc = __builtin_return_address(0);
  hipemu_asan_check(reinterpret_cast<uintptr_t>(src), n, false, pc);
  hipemu_asan_check(reinterpret_cast<uintptr_t>(dst), n, true, pc);
  if (maybe_lds(src)) check(reinterpret_cast<uintptr_t>(src), n, false, pc);
  if (maybe_lds(dst)) check(reinterpret_cast<uintptr_t>(dst), n, true, pc);
  return memcpy(dst, src, n);
}
void* __tsan_memmove(void* dst, const void* src, size_t n) {
  const void* pc = __builtin_return_address(0);
  hipemu_asan_check(reinterpret_cast<uintptr_t>(src), n, false, pc);
  hipemu_asan_check(reinterpret_cast<uintptr_t>(dst), n, true, pc);
  if (maybe_lds(src)) check(reinterpret_cast<uintptr_t>(src), n, false, pc);
  if (maybe_lds(dst)) check(reinterpret_cast<uintptr_t>(dst), n, true, pc);
  return memmove(dst, src, n);
}
void* __tsan_memset(void* dst, int c, size_t n) {
  hipemu_asan_check(reinterpret_cast<uintptr_t>(dst), n, true, __builtin_return_address(0));
  if (maybe_lds(dst)) check(reinterpret_cast<uintptr_t>(dst), n, true, __builtin_return_address(0));
  return memset(dst, c, n);
}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_init() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_ignore_thread_begin() {}
void __tsan_ignore_thread_end() {}

}  // extern "C"
