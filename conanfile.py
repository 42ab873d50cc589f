import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy
from conan.tools.layout import basic_layout


class AccelConan(ConanFile):
    name = "accel"
    version = "0.1.0"
    description = "Accelerate-style distributed training loops for LibTorch, configured at compile time"
    license = "Apache-2.0"
    topics = ("libtorch", "distributed", "data-loading", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False]}
    default_options = {"with_cuda": False}
    exports_sources = "include/*", "cmake/accelDependencies.cmake", "LICENSE"
    no_copy_source = True
    implements = ["auto_header_only"]

    def requirements(self):
        # LibTorch is not a Conan package: consumers find it with find_package(Torch) (its wheel carries the
        # CMake config), as test_package does.
        self.requires("range-v3/0.12.0")
        self.requires("boost/1.74.0", options={"header_only": True})
        self.requires("openssl/[>=3.0 <4]")  # HMAC of the rendezvous store's values
        self.requires("nlohmann_json/3.11.2")

    def validate(self):
        check_min_cppstd(self, "20")

    def layout(self):
        basic_layout(self)

    def package(self):
        # the headers and the bodies they include at their end in header-only mode (impl/*.ipp)
        for pattern in ("*.hpp", "*.ipp"):
            copy(self, pattern, os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        cmake_dir = os.path.join(self.package_folder, "lib", "cmake", "accel")
        copy(self, "accelDependencies.cmake", os.path.join(self.source_folder, "cmake"), cmake_dir)
        # The build module does on the consumer's side what the installed accelConfig.cmake does: find LibTorch
        # (its pip wheel needs link fixes), range-v3, Boost.Hana and nlohmann_json, and set ACCEL_WITH_CUDA from the option;
        # accelDependencies.cmake also defines the helpers accel_add_separate_library and
        # accel_target_precompile_headers, so a Conan consumer has them as an installed one does.
        # One module per value of with_cuda, chosen in package_info: the package of a header library is the same for
        # both (auto_header_only clears the options from its id), so the option must not be written into it.
        for name, value in (("accel-conan-cuda.cmake", "ON"), ("accel-conan-cpu.cmake", "OFF")):
            with open(os.path.join(cmake_dir, name), "w") as f:
                f.write("set(ACCEL_WITH_CUDA %s)\n" % value)
                f.write("include(${CMAKE_CURRENT_LIST_DIR}/accelDependencies.cmake)\n")
                f.write("accel_link_dependencies(accel::accel)\n")

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "accel")
        self.cpp_info.set_property("cmake_target_name", "accel::accel")
        # ACCEL_WITH_CUDA is defined by the build module, from the with_cuda option.
        module = "accel-conan-cuda.cmake" if self.options.with_cuda else "accel-conan-cpu.cmake"
        self.cpp_info.set_property("cmake_build_modules", [os.path.join("lib", "cmake", "accel", module)])
        self.cpp_info.builddirs = [os.path.join("lib", "cmake", "accel")]
