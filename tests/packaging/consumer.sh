#!/usr/bin/env bash
# Installs accel from the build tree into a fresh prefix, runs the installed tools, then builds and runs a consumer
# project that uses find_package(accel CONFIG REQUIRED) + target_link_libraries(app accel::accel).
#   consumer.sh SOURCE_DIR BUILD_DIR TORCH_PREFIX
set -euo pipefail
src=$1 build=$2 torch_prefix=$3
work="$build/packaging/consumer"
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/install" >/dev/null
test -f "$work/install/include/accel/accel.hpp"
test -f "$work/install/lib/cmake/accel/accelConfig.cmake"
# The installed tools start on their own (their RPATH finds LibTorch).
"$work/install/bin/accel-plan" --samples 10 --batch-size 3 --processes 2 | grep -q "process 1: 2 batches"
"$work/install/bin/accel-launch" --help >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/tests/packaging/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/install;$torch_prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/build"
"$work/build/accel_consumer"
"$work/build/accel_consumer_separate"
# accel_target_precompile_headers: the header was precompiled for each target and the programs run; through ccache,
# only those targets' compilations carry the sloppiness that precompiled headers need.
for t in accel_consumer_pch accel_consumer_separate_pch; do
  test -f "$work/build/CMakeFiles/$t.dir/cmake_pch.hxx.gch"
  grep -q "accel/accel.hpp" "$work/build/CMakeFiles/$t.dir/cmake_pch.hxx"
done
"$work/build/accel_consumer_pch"
"$work/build/accel_consumer_separate_pch"
if [ ${#launcher[@]} -gt 0 ]; then
  compile_rule() { grep -A3 -E "^rule CXX_COMPILER__$1_[^_]+$" "$work/build/CMakeFiles/rules.ninja" | grep "command ="; }
  compile_rule accel_consumer_pch | grep -q "CCACHE_SLOPPINESS=[^ ]*pch_defines[^ ]* ccache"
  compile_rule accel_consumer_separate_pch | grep -q "CCACHE_SLOPPINESS=[^ ]*pch_defines[^ ]* ccache"
  if compile_rule accel_consumer | grep -q CCACHE_SLOPPINESS; then
    echo "accel_target_precompile_headers changed the launcher of a target it was not called on" >&2
    exit 1
  fi
fi
# CPU only (README, "CPU only"): the same package with -DACCEL_CPU_ONLY=ON configures without LibTorch's CUDA search
# and its warnings (the machine may have a CUDA toolkit), and the header-only program builds and runs.
cmake -S "$src/tests/packaging/consumer" -B "$work/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_CPU_ONLY=ON \
      -DCMAKE_PREFIX_PATH="$work/install;$torch_prefix" >"$work/configure-cpu.log" 2>&1
if grep -E "CMake Warning|CUDA_ARCHITECTURES|kineto|PyTorch: CUDA" "$work/configure-cpu.log"; then
  echo "ACCEL_CPU_ONLY=ON: LibTorch's CUDA search or a warning at configure time (above)" >&2
  exit 1
fi
grep -q "ACCEL_WITH_CUDA=OFF; ACCEL_CPU_ONLY=ON" "$work/configure-cpu.log"
cmake --build "$work/build-cpu" --target accel_consumer
out=$("$work/build-cpu/accel_consumer")
echo "$out"
grep -q "ACCEL_WITH_CUDA=0" <<<"$out"
