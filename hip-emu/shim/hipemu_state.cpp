// hip-emu host shim: the state the executor shares with the kernels (see hip/hip_runtime.h).
#include <hip/hip_runtime.h>

extern "C" {
hipemu_state_t hipemu_state = {};
}
