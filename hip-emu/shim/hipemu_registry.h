// hip-emu host shim: registry entries of the kernels compiled for the host.
//
// build.rs generates, per kernel file, a translation unit that includes the kernel source and
// then this header, and expands HIPEMU_ENTRY(name) for every `extern "C" __global__` function it
// found in the preprocessed source. The parameter list is deduced from the kernel's C++ type:
// no hand-maintained list of names or signatures.
#pragma once

#include <stddef.h>
#include <string.h>

#include <utility>

/// One registered kernel (read by hip-emu/src/exec/registry.rs; keep the layouts equal).
struct hipemu_entry {
  const char* name;
  void (*trampoline)(void* const* args);
  size_t param_count;
  const size_t* param_sizes;  // param_count entries
  char* lds_begin;            // the kernel file's static __shared__ section (null: none)
  char* lds_end;
};

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

// The generated TU defines HIPEMU_LDS_BEGIN / HIPEMU_LDS_END (its section's linker bounds);
// the registry TU itself has no kernels.
#ifndef HIPEMU_LDS_BEGIN
#define HIPEMU_LDS_BEGIN nullptr
#define HIPEMU_LDS_END nullptr
#endif

#define HIPEMU_ENTRY(NAME)                                                               \
  extern "C" void hipemu_trampoline_##NAME(void* const* args) {                          \
    ::hipemu::invoke(&NAME, args);                                                       \
  }                                                                                      \
  extern "C" const hipemu_entry hipemu_entry_##NAME = {#NAME, &hipemu_trampoline_##NAME, \
                                                       ::hipemu::count_of(&NAME),        \
                                                       ::hipemu::sizes_of(&NAME),        \
                                                       HIPEMU_LDS_BEGIN, HIPEMU_LDS_END};
