#!/bin/sh
# Builds and runs the host emulation of the layernorm and AdamW kernels (~1 minute on 2 cores).
# Needs clang++ >= 15 and the HIP shim in tools/kernel-emu/shim.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
CXX=${CXX:-clang++-15}
command -v "$CXX" >/dev/null || CXX=/usr/lib/llvm-15/bin/clang++
"$CXX" -std=c++20 -O1 -pthread -Wno-pass-failed -I"$here/shim" -I"$here/../../kernels" \
  "$here/emu_layernorm_adamw.cpp" -o "${TMPDIR:-/tmp}/hipk-kernel-emu-ln-adamw"
exec "${TMPDIR:-/tmp}/hipk-kernel-emu-ln-adamw" "$@"
