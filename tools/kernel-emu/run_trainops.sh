#!/bin/sh
# Builds and runs the host emulation of the training-step kernels (encoder, gelu, crossentropy,
# bias, clip): tools/kernel-emu/run_trainops.sh [quick]. Needs clang++ >= 15 and the HIP shim.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
CXX=${CXX:-clang++-15}
command -v "$CXX" >/dev/null || CXX=/usr/lib/llvm-15/bin/clang++
"$CXX" -std=c++20 -O1 -pthread -Wno-pass-failed -I"$here/shim" -I"$here/../../kernels" \
  "$here/emu_trainops.cpp" -o "${TMPDIR:-/tmp}/hipk-kernel-emu-trainops"
exec "${TMPDIR:-/tmp}/hipk-kernel-emu-trainops" "$@"
