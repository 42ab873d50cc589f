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
cmake -S "$src/tests/packaging/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/install;$torch_prefix" >/dev/null
cmake --build "$work/build"
"$work/build/accel_consumer"
"$work/build/accel_consumer_separate"
