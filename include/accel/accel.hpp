#pragma once
//! \file
//! Umbrella header: everything generic in accel. The CUDA specialisations live in `accel/cuda/` and are
//! included here only when ACCEL_WITH_CUDA is set.

#include <accel/accelerator.hpp>
#include <accel/config.hpp>
#include <accel/policy/batches.hpp>
#include <accel/policy/dist.hpp>
#include <accel/policy/loading.hpp>
#include <accel/policy/place.hpp>
#include <accel/policy/rng.hpp>
#include <accel/policy/slots.hpp>
#include <accel/policy/tail.hpp>
