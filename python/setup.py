"""pip route to the attnops Python package, from Debian packages only (no PyPI):

    python3 -m venv --system-site-packages .venv          # numpy (and torch) from apt
    .venv/bin/pip install --no-build-isolation ./python    # builds with CMake, as cmake_example does

The extension is the CMake target _attnops (python/CMakeLists.txt) built from the repository root
in setuptools' build directory, for the interpreter running pip; extra CMake flags come from
ATTNOPS_CMAKE_ARGS (e.g. -DCMAKE_CXX_COMPILER_LAUNCHER=ccache). Needs cmake, ninja, a C++20
compiler and the packages of scripts/dev.sh."""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(attnops VERSION ([0-9.]+)", f.read()).group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DPython_EXECUTABLE=" + sys.executable,
            "-DATTNOPS_BUILD_PYTHON=ON",
            "-DATTNOPS_BUILD_TESTS=OFF",
            "-DATTNOPS_BUILD_BENCH=OFF",
            "-DATTNOPS_BUILD_CLI=OFF",
            "-DATTNOPS_BUILD_EXAMPLES=OFF",
        ] + shlex.split(os.environ.get("ATTNOPS_CMAKE_ARGS", ""))
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir] + generator + args)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_attnops", "-j", str(os.cpu_count() or 1)])
        built = os.path.join(build_dir, "python", "attnops")
        os.makedirs(package_dir, exist_ok=True)
        for name in os.listdir(built):
            if name.startswith("_attnops") and name.endswith(".so"):
                shutil.copy2(os.path.join(built, name), os.path.join(package_dir, name))


setup(
    name="attnops",
    version=project_version(),
    description="Attention operators with backend dispatch (numpy, PyTorch via DLPack)",
    packages=["attnops"],
    package_dir={"attnops": "attnops"},
    package_data={"attnops": ["py.typed", "_attnops.pyi"]},
    ext_modules=[CMakeExtension("attnops._attnops")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    install_requires=["numpy"],
    zip_safe=False,
)
