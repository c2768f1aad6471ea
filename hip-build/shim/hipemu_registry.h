// hip-emu host shim: the entry point of a kernel source's host build (a shared object).
//
// hip-build (src/host.rs) compiles each kernel source as host C++ into one shared object: a
// generated translation unit that includes the kernel source and then this header, expands
// HIPEMU_ENTRY(id, function, symbol) for every `__global__` function the source defines (C++
// kernels under their mangled symbol, templates as instantiated) and ends with HIPEMU_MODULE(...). The parameter list is deduced from the kernel's C++
// type: no hand-maintained list of names or signatures.
//
// hip-emu dlopens the shared object and calls its one exported function, hipemu_module_init,
// with the executor's callbacks; it returns the module's table. The layouts here are read by
// hip-emu/src/exec/host.rs: keep them equal, and bump HIPEMU_ABI when they change.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <utility>

// 2: kernels of C++ linkage are registered too, under their mangled symbols.
#define HIPEMU_ABI 2u

/// One kernel (read by hip-emu/src/exec/host.rs).
struct hipemu_entry {
  const char* name;
  void (*trampoline)(void* const* args);
  size_t param_count;
  const size_t* param_sizes;  // param_count entries
  char* lds_begin;            // the kernel file's static __shared__ section (null: none)
  char* lds_end;
};

/// What the executor gives the module: the functions the shim's synchronising builtins call
/// (hip/hip_runtime.h declares them; hipemu_state.cpp forwards to these pointers).
struct hipemu_host_api {
  uint32_t abi;
  void (*barrier)(const char* file, unsigned line);
  uint64_t (*wave_op)(unsigned kind, uint64_t value, int src_lane, uint64_t fallback,
                      const char* file, unsigned line);
};

/// One `__device__` / `__constant__` variable of the source (read by hip-emu/src/exec/host.rs).
struct hipemu_global {
  const char* name;  // its symbol, as in the code object
  void* addr;
  size_t size;
};

struct hipemu_state_t;
struct hipemu_race_state;

/// What the module gives the executor.
struct hipemu_module {
  uint32_t abi;
  uint32_t race_instrumented;  // the kernels call the race check's __tsan_* callbacks
  const hipemu_entry* const* entries;
  size_t entry_count;
  hipemu_state_t* state;        // hipemu_state of this module (hip/hip_runtime.h)
  hipemu_race_state* race;      // hipemu_race of this module (hipemu_race.cpp)
  int (*race_alloc)(size_t cells);
  const char* source_root;      // stripped from the file names of race reports
  const hipemu_global* const* globals;
  size_t global_count;
};

extern "C" {
extern hipemu_race_state hipemu_race;
int hipemu_race_alloc(size_t cells);
/// Stores the callbacks (hipemu_state.cpp); returns 0 on an ABI mismatch.
int hipemu_set_host_api(const hipemu_host_api* api);
}

namespace hipemu {

template <typename... A> struct Sizes {
  // One extra element so that a kernel without parameters still has an array.
  static constexpr size_t value[sizeof...(A) + 1] = {sizeof(A)..., 0};
};

template <typename A> inline A read_arg(const void* p) {
  A a;
  memcpy(static_cast<void*>(&a), p, sizeof(A));
  return a;
}

template <typename... A, size_t... I>
inline void call_with(void (*f)(A...), void* const* args, std::index_sequence<I...>) {
  f(read_arg<A>(args[I])...);
}

/// Calls f with each argument copied (memcpy, so any alignment) from args[i].
template <typename... A> inline void invoke(void (*f)(A...), void* const* args) {
  call_with(f, args, std::index_sequence_for<A...>{});
}

template <typename... A> constexpr size_t count_of(void (*)(A...)) { return sizeof...(A); }
template <typename... A> constexpr const size_t* sizes_of(void (*)(A...)) {
  return Sizes<A...>::value;
}

}  // namespace hipemu

// The generated TU defines HIPEMU_LDS_BEGIN / HIPEMU_LDS_END (its section's linker bounds).
#ifndef HIPEMU_LDS_BEGIN
#define HIPEMU_LDS_BEGIN nullptr
#define HIPEMU_LDS_END nullptr
#endif

/// Entry ID: FN (a function, or a declaration bound to the kernel's symbol) under SYMBOL, the
/// name of the kernel in the code object.
#define HIPEMU_ENTRY(ID, FN, SYMBOL)                                                         \
  extern "C" void hipemu_trampoline_##ID(void* const* args) { ::hipemu::invoke(&FN, args); } \
  extern "C" const hipemu_entry hipemu_entry_##ID = {SYMBOL, &hipemu_trampoline_##ID,        \
                                                     ::hipemu::count_of(&FN),                \
                                                     ::hipemu::sizes_of(&FN),                \
                                                     HIPEMU_LDS_BEGIN, HIPEMU_LDS_END};

/// Variable ID: NAME (a C++ name) under SYMBOL.
#define HIPEMU_GLOBAL(ID, NAME, SYMBOL)                                                 \
  extern "C" const hipemu_global hipemu_global_##ID = {SYMBOL, (void*)&(NAME), sizeof(NAME)};

/// The module table and its exported entry point; ENTRIES is a null-terminated array of
/// `const hipemu_entry*` with COUNT entries before the null, GLOBALS one of `const
/// hipemu_global*` with GCOUNT.
#define HIPEMU_MODULE(ENTRIES, COUNT, RACE, ROOT, GLOBALS, GCOUNT)                          \
  extern "C" __attribute__((visibility("default"))) const hipemu_module* hipemu_module_init( \
      const hipemu_host_api* api) {                                                          \
    static const hipemu_module m = {HIPEMU_ABI,    RACE,         ENTRIES,            COUNT,  \
                                    &hipemu_state, &hipemu_race, &hipemu_race_alloc, ROOT,   \
                                    GLOBALS,       GCOUNT};                                  \
    return hipemu_set_host_api(api) ? &m : nullptr;                                          \
  }
