#!/bin/sh
# Builds and runs the host emulation of the matmul and attention kernels (see README.md).
# Needs clang++ >= 15 (C++20 <barrier>, _Float16 on x86) and kernels/common.h.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
CXX=${CXX:-clang++-15}
command -v "$CXX" >/dev/null || CXX=/usr/lib/llvm-15/bin/clang++
"$CXX" -std=c++20 -O1 -pthread -Wno-pass-failed -I"$here/shim" -I"$here/../../kernels" ${EMU_EXTRA_FLAGS:-} \
  "$here/emu_test.cpp" -o "${TMPDIR:-/tmp}/hipk-kernel-emu"
exec "${TMPDIR:-/tmp}/hipk-kernel-emu" "$@"
