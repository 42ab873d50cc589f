#pragma once
//! \file
//! Header-only (the default) or separate compilation: where accel's non-template code is compiled.
//!
//! Note [Separate compilation]
//! By default accel is header-only: every function is `inline` and every translation unit that includes a header
//! compiles what it uses. A program may instead define `ACCEL_SEPARATE_COMPILATION` for all of its translation
//! units (as Boost.Asio's `BOOST_ASIO_SEPARATE_COMPILATION`) and include `<accel/src.hpp>` in exactly one `.cpp`
//! of its own (CMake: `accel_add_separate_library(name)` makes a library that does both). Then the headers give
//! only declarations of the code that does not depend on the user's types: the engines (c10d's
//! `ProcessGroupGloo`, NCCL), the safetensors JSON, the trackers' writers, the CUDA copies, and the larger bodies
//! of accel's classes (the communicator's checks, the DDP reducer's hook, ZeRO, the checkpointer, the scaler).
//! They are compiled once, in that one file, and the other translation units no longer parse c10d's, NCCL's,
//! CUDA's or nlohmann-json's headers (benchmarks/README.md, "Separate compilation", has the figures). Templates
//! over the user's types (the `Accelerator`, the loaders, the wrappers) stay in the headers in both modes.
//! Behaviour is the same.
//!
//! In a header, such code is written
//!
//! \code
//! ACCEL_DECL int visible_gpus();          // declared in both modes
//! #if ACCEL_DEFINITIONS                    // header-only, or the one translation unit of <accel/src.hpp>
//! ACCEL_DECL int visible_gpus() { ... }
//! #endif
//! \endcode
//!
//! A member function of a class takes `ACCEL_DECL` on its declaration in the class too (header-only, it is then
//! inline from its first declaration, as a member defined in the class is: no virtual function becomes the key
//! function that would emit the class's vtable and every virtual function in each translation unit). A JSON
//! function template (Note [JSON at the call site]) is declared in the header, defined under `ACCEL_DEFINITIONS`,
//! and instantiated explicitly by `<accel/src.hpp>`. The mode is the whole program's: a translation unit compiled
//! header-only beside it breaks the one-definition rule, and a program without `<accel/src.hpp>` does not link
//! (accel's functions are undefined).

#if defined(ACCEL_SOURCE) && !defined(ACCEL_SEPARATE_COMPILATION)
#error "accel: <accel/src.hpp> compiles accel's code for ACCEL_SEPARATE_COMPILATION; define ACCEL_SEPARATE_COMPILATION for every translation unit of the program (CMake: accel_add_separate_library), or do not include <accel/src.hpp> (header-only)"
#endif

#if !defined(ACCEL_SEPARATE_COMPILATION)
#define ACCEL_DECL inline
#define ACCEL_DEFINITIONS 1
#elif defined(ACCEL_SOURCE)
#define ACCEL_DECL
#define ACCEL_DEFINITIONS 1
#else
#define ACCEL_DECL
#define ACCEL_DEFINITIONS 0
#endif
