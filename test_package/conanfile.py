import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class AccelTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "VirtualRunEnv"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        # LibTorch comes from the torch wheel: point at its CMake config (scripts/lib.sh exports TORCH_PREFIX).
        torch_prefix = os.environ.get("TORCH_PREFIX")
        if torch_prefix:
            tc.cache_variables["Torch_DIR"] = os.path.join(torch_prefix, "Torch")
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "accel_test_package"), env="conanrun")
