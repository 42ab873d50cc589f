#pragma once
//! \file
//! `ACCEL_WITH_CUDA`: whether this build has the CUDA/NCCL specialisations (set by the CMake target or the Conan
//! package; 0 when unset). Every generic header that has a CUDA specialisation includes it itself when this is 1
//! (state/engine.hpp: NCCL; comm/rng.hpp: rng::cuda; pipeline/placement.hpp: place::async), so what a translation unit
//! gets never depends on which headers it includes or in which order.

#ifndef ACCEL_WITH_CUDA
#define ACCEL_WITH_CUDA 0
#endif
