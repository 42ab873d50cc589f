# Finds what accel's headers need and decides ACCEL_WITH_CUDA. Used by the project itself and, installed
# beside accelConfig.cmake, by every consumer, so both make the same decision on the same machine.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

if(NOT DEFINED ACCEL_WITH_CUDA)
  set(ACCEL_WITH_CUDA AUTO)
endif()

# ACCEL_CPU_ONLY: a CPU build with a CUDA LibTorch (the pip wheel), on a machine with or without a CUDA toolkit.
# LibTorch's CMake config looks for the toolkit and enables the CUDA language when it finds one (Caffe2's
# public/cuda.cmake), which a CPU build needs neither of, and warns ("pytorch is not compatible with
# `CMAKE_CUDA_ARCHITECTURES`"). That file returns at once when the target torch::cudart exists: defined here first,
# empty, LibTorch skips its CUDA search. Programs still link libtorch_cuda (libtorch.so needs it), which loads the
# CUDA runtime of its wheel by itself. And kineto is linked into libtorch_cpu, but TorchConfig.cmake still looks for
# a library of its own and warns "library kineto not found": the name `torch` stands in for it.
if(NOT DEFINED ACCEL_CPU_ONLY)
  set(ACCEL_CPU_ONLY OFF)
endif()
if(ACCEL_CPU_ONLY)
  if(ACCEL_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "accel: ACCEL_CPU_ONLY=ON and ACCEL_WITH_CUDA=ON contradict each other; drop one")
  endif()
  set(ACCEL_WITH_CUDA OFF)
  if(NOT TARGET torch::cudart AND NOT TARGET torch)
    add_library(torch::cudart INTERFACE IMPORTED)
  endif()
  if(NOT DEFINED kineto_LIBRARY)
    set(kineto_LIBRARY torch CACHE INTERNAL "kineto is inside libtorch_cpu (ACCEL_CPU_ONLY)")
  endif()
endif()

# LibTorch. The pinned torch wheel carries the C++ headers, the libraries and this CMake config; point
# CMAKE_PREFIX_PATH at `python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'`.
find_dependency(Torch 2)
find_dependency(range-v3)
find_dependency(Boost 1.74)   # Boost.Hana is header-only: Boost::headers is enough
find_dependency(OpenSSL 3)    # HMAC-SHA256 of the rendezvous store's values (state/rendezvous/store.hpp)
find_dependency(nlohmann_json 3)  # the JSON of safetensors headers and sharded-checkpoint indexes, the trackers' files

set(_accel_torch_cuda FALSE)
if(TARGET torch_cuda OR TARGET torch_cuda_library OR CAFFE2_USE_CUDA)
  set(_accel_torch_cuda TRUE)
endif()
if(ACCEL_WITH_CUDA STREQUAL "AUTO")
  set(_accel_cuda OFF)
  if(_accel_torch_cuda)
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      set(_accel_cuda ON)
    endif()
  endif()
else()
  set(_accel_cuda ${ACCEL_WITH_CUDA})
  if(_accel_cuda AND NOT _accel_torch_cuda)
    message(FATAL_ERROR "accel: ACCEL_WITH_CUDA=ON, but the LibTorch found at ${Torch_DIR} has no CUDA. "
                        "Install a CUDA build of torch or configure with -DACCEL_WITH_CUDA=OFF.")
  endif()
  if(_accel_cuda)
    find_package(CUDAToolkit REQUIRED)
  endif()
endif()
set(ACCEL_CUDA_ENABLED ${_accel_cuda})

# NCCL for the CUDA specialisations: the one LibTorch loads (the nvidia-nccl wheel) when there is one, its
# headers with it; else the toolkit's.
if(ACCEL_CUDA_ENABLED)
  get_filename_component(_accel_sp "${Torch_DIR}/../../../.." ABSOLUTE)
  find_path(ACCEL_NCCL_INCLUDE_DIR nccl.h HINTS "${_accel_sp}/nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
  find_path(ACCEL_NCCL_INCLUDE_DIR nccl.h)
  if(EXISTS "${_accel_sp}/nvidia/nccl/lib/libnccl.so.2")
    set(ACCEL_NCCL_LIBRARY "${_accel_sp}/nvidia/nccl/lib/libnccl.so.2" CACHE FILEPATH "NCCL library")
  endif()
  find_library(ACCEL_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NOT ACCEL_NCCL_INCLUDE_DIR OR NOT ACCEL_NCCL_LIBRARY)
    message(FATAL_ERROR "accel: ACCEL_WITH_CUDA is on but NCCL was not found (looked beside LibTorch and in the CUDA "
                        "toolkit); install NCCL or configure with -DACCEL_WITH_CUDA=OFF")
  endif()
  message(STATUS "accel: NCCL ${ACCEL_NCCL_LIBRARY}")
endif()

# A LibTorch from the pip wheel loads the CUDA libraries of the `nvidia-*` wheels beside it (its RUNPATH points
# there), which may be newer than the system toolkit. Link against those same files, never a second copy: the
# linker resolves libtorch_cuda's own dependencies there (-rpath-link) and our CUDA runtime is theirs.
get_filename_component(_accel_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
file(GLOB ACCEL_TORCH_CUDA_LIBDIRS LIST_DIRECTORIES true "${_accel_site_packages}/nvidia/*/lib")
file(GLOB _accel_wheel_cudart "${_accel_site_packages}/nvidia/*/lib/libcudart.so.[0-9]*")
if(_accel_wheel_cudart AND TARGET torch::cudart)
  list(GET _accel_wheel_cudart 0 _accel_cudart)
  set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES "${_accel_cudart}")
endif()
message(STATUS "accel: LibTorch ${Torch_VERSION} (CUDA build: ${_accel_torch_cuda}); ACCEL_WITH_CUDA=${ACCEL_CUDA_ENABLED}"
               "; ACCEL_CPU_ONLY=${ACCEL_CPU_ONLY}")

# Attaches the dependencies to `target`. In the project's own build they are wrapped in BUILD_INTERFACE, so
# the exported target carries no machine paths; the installed config attaches them again on the consumer's side.
function(accel_link_dependencies target)
  set(libs ${TORCH_LIBRARIES} range-v3::range-v3 Boost::headers OpenSSL::Crypto nlohmann_json::nlohmann_json)
  set(defs ACCEL_WITH_CUDA=0)
  set(opts "")
  if(ACCEL_TORCH_CUDA_LIBDIRS)
    list(FILTER libs EXCLUDE REGEX "/libnvrtc[.]so")   # the toolkit's copy; libtorch_cuda loads the wheel's
    foreach(dir IN LISTS ACCEL_TORCH_CUDA_LIBDIRS)
      list(APPEND opts "LINKER:-rpath-link,${dir}")
    endforeach()
  endif()
  if(ACCEL_CUDA_ENABLED)
    list(APPEND libs ${ACCEL_NCCL_LIBRARY})
    target_include_directories(${target} SYSTEM INTERFACE ${ACCEL_NCCL_INCLUDE_DIR})
    if(_accel_wheel_cudart)
      list(GET _accel_wheel_cudart 0 _cudart)
      list(APPEND libs "${_cudart}")
    else()
      list(APPEND libs CUDA::cudart)
    endif()
    set(defs ACCEL_WITH_CUDA=1)
  endif()
  if(ARGV1 STREQUAL "BUILD")
    list(TRANSFORM libs PREPEND "$<BUILD_INTERFACE:")
    list(TRANSFORM libs APPEND ">")
    list(TRANSFORM defs PREPEND "$<BUILD_INTERFACE:")
    list(TRANSFORM defs APPEND ">")
    list(TRANSFORM opts PREPEND "$<BUILD_INTERFACE:")
    list(TRANSFORM opts APPEND ">")
  endif()
  target_link_options(${target} INTERFACE ${opts})
  target_link_libraries(${target} INTERFACE ${libs})
  target_compile_definitions(${target} INTERFACE ${defs})
endfunction()

# accel_add_separate_library(<name>): a static library that compiles accel's non-template code once (it holds
# <accel/src.hpp>) and gives ACCEL_SEPARATE_COMPILATION to every target that links it, whose translation units then
# see only declarations of that code (include/accel/detail/linkage.hpp, Note [Separate compilation]). Link every
# target of one program that uses accel to the same such library; a program mixes no header-only code with it.
function(accel_add_separate_library name)
  set(_src "${CMAKE_CURRENT_BINARY_DIR}/${name}_src.cpp")
  file(CONFIGURE OUTPUT "${_src}" CONTENT "// accel's non-template code, compiled once for ${name}.\n#include <accel/src.hpp>\n")
  add_library(${name} STATIC "${_src}")
  target_link_libraries(${name} PUBLIC accel::accel)
  target_compile_definitions(${name} PUBLIC ACCEL_SEPARATE_COMPILATION)
  # <accel/src.hpp> must come first in its translation unit: never behind a precompiled header.
  set_source_files_properties("${_src}" TARGET_DIRECTORY ${name} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  set_target_properties(${name} PROPERTIES ACCEL_SEPARATE_LIBRARY ON)
endfunction()

# accel_target_precompile_headers(<target> [PRIVATE|PUBLIC|INTERFACE]): precompiles <torch/torch.h> and
# <accel/accel.hpp> once for <target> (target_precompile_headers; PRIVATE by default), so that an edit of one of its
# sources recompiles only that source's own code (benchmarks/README.md, "Edit-compile time"). The header is compiled
# with <target>'s own definitions and flags, so it is in the target's mode: header-only, or
# ACCEL_SEPARATE_COMPILATION when the target links a library of accel_add_separate_library (then define
# ACCEL_SEPARATE_COMPILATION through CMake as that library does, never by a #define in a source file, which would
# come after the precompiled header). A precompiled header is included before each source's first line: a source
# that must not have it takes the source property SKIP_PRECOMPILE_HEADERS. When the target compiles through ccache
# (CMAKE_CXX_COMPILER_LAUNCHER or the target's CXX_COMPILER_LAUNCHER), its launcher runs ccache with
# CCACHE_SLOPPINESS set to ccache's configured sloppiness plus pch_defines,time_macros,include_file_mtime,
# include_file_ctime, which ccache needs to cache compilations that use a precompiled header; other targets keep
# ccache's settings.
function(accel_target_precompile_headers target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "accel_target_precompile_headers: no target '${target}' (call it after add_executable/add_library)")
  endif()
  set(scope PRIVATE)
  if(ARGC GREATER 2 OR (ARGC EQUAL 2 AND NOT ARGV1 MATCHES "^(PRIVATE|PUBLIC|INTERFACE)$"))
    message(FATAL_ERROR "accel_target_precompile_headers(${ARGV}): expected a target and at most one of PRIVATE, "
                        "PUBLIC, INTERFACE")
  elseif(ARGC EQUAL 2)
    set(scope ${ARGV1})
  endif()
  get_target_property(_separate ${target} ACCEL_SEPARATE_LIBRARY)
  if(_separate)
    message(FATAL_ERROR "accel_target_precompile_headers(${target}): '${target}' is a library of "
                        "accel_add_separate_library, whose one source includes <accel/src.hpp> first; call it on the "
                        "targets that link '${target}' instead")
  endif()
  get_target_property(_done ${target} ACCEL_PRECOMPILED_HEADERS)
  if(_done)
    return()
  endif()
  set_target_properties(${target} PROPERTIES ACCEL_PRECOMPILED_HEADERS ON)
  target_precompile_headers(${target} ${scope} <torch/torch.h> <accel/accel.hpp>)
  if(scope STREQUAL "INTERFACE")
    return()  # the targets that link it compile the header, with their own launcher
  endif()
  get_target_property(_launcher ${target} CXX_COMPILER_LAUNCHER)
  if(NOT _launcher)
    return()
  endif()
  list(GET _launcher 0 _ccache)
  get_filename_component(_name "${_ccache}" NAME)
  if(NOT _name MATCHES "^ccache")
    return()
  endif()
  execute_process(COMMAND "${_ccache}" --get-config sloppiness OUTPUT_VARIABLE _sloppiness
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    set(_sloppiness "")
  endif()
  string(REPLACE "," ";" _sloppiness "${_sloppiness}")
  list(APPEND _sloppiness pch_defines time_macros include_file_mtime include_file_ctime)
  list(FILTER _sloppiness EXCLUDE REGEX "^ *$")
  list(REMOVE_DUPLICATES _sloppiness)
  list(JOIN _sloppiness "," _sloppiness)
  set_target_properties(${target} PROPERTIES
    CXX_COMPILER_LAUNCHER "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=${_sloppiness};${_launcher}")
endfunction()
