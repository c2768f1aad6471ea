// hip-emu host shim: the state the executor shares with the kernels (see hip/hip_runtime.h)
// and the executor's callbacks, received by hipemu_module_init (hipemu_registry.h). Linked into
// every host build; compiled without the race instrumentation.
#include <hip/hip_runtime.h>

#include "hipemu_registry.h"

namespace {
hipemu_host_api host_api = {};
}

extern "C" {
hipemu_state_t hipemu_state = {};

int hipemu_set_host_api(const hipemu_host_api* api) {
  if (api == nullptr || api->abi != HIPEMU_ABI) return 0;
  host_api = *api;
  return 1;
}

void hipemu_barrier(const char* file, unsigned line) { host_api.barrier(file, line); }

uint64_t hipemu_wave_op(unsigned kind, uint64_t value, int src_lane, uint64_t fallback,
                        const char* file, unsigned line) {
  return host_api.wave_op(kind, value, src_lane, fallback, file, line);
}
}
