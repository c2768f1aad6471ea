// hip-emu host shim: the state the executor shares with the kernels (see hip/hip_runtime.h).
#include <hip/hip_runtime.h>

extern "C" {

hipemu_state_t hipemu_state = {};

// Bounds of the `hipemu_lds` section that holds every static __shared__ variable (defined by
// the linker; weak so that a build without any __shared__ variable still links).
extern char __start_hipemu_lds[] __attribute__((weak, visibility("hidden")));
extern char __stop_hipemu_lds[] __attribute__((weak, visibility("hidden")));

// Keeps the section (and so its start/stop symbols) present even without __shared__ variables.
__attribute__((section("hipemu_lds"), used, aligned(16))) static char hipemu_lds_anchor[16];

void hipemu_static_lds(char** begin, char** end) {
  *begin = __start_hipemu_lds;
  *end = __stop_hipemu_lds;
}
}
