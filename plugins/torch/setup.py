"""Builds lowcomm's torch.distributed backend (the `lowcomm` package) against the torch in the
environment and the lowcomm core of this repository, offline:

    pip install --no-build-isolation ./plugins/torch

The core is configured and built with CMake into build/core (static, no tests, no CUDA) and
linked into the extension; OpenSSL's libcrypto and xxHash come from the system, and UCX's
libraries where the core was built with UCX (its lowcomm.pc requires ucx). With
LOWCOMM_CORE_BUILD=<a build directory of this repository> the liblowcomm.a already built there
is linked instead (scripts/test.sh uses its Release build; the extension calls no CUDA code, so
a CUDA-enabled archive links the same).
"""
import os
import subprocess
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PREBUILT = os.environ.get("LOWCOMM_CORE_BUILD")
CORE = Path(PREBUILT) if PREBUILT else HERE / "build" / "core"


def build_core():
    if PREBUILT:
        lib = CORE / "lib" / "liblowcomm.a"
        if not lib.exists():
            raise RuntimeError(f"LOWCOMM_CORE_BUILD={PREBUILT}: no {lib}; build target lowcomm_static")
        return lib
    CORE.mkdir(parents=True, exist_ok=True)
    subprocess.check_call([
        "cmake", "-S", str(ROOT), "-B", str(CORE), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DLOWCOMM_CUDA=OFF", "-DLOWCOMM_BUILD_TESTS=OFF", "-DLOWCOMM_BUILD_BENCH=OFF",
    ])
    subprocess.check_call(["cmake", "--build", str(CORE), "--target", "lowcomm_static",
                           "-j", str(os.cpu_count() or 2)])
    return CORE / "lib" / "liblowcomm.a"


class BuildWithCore(BuildExtension):
    def finalize_options(self):
        super().finalize_options()
        # pip builds in the source tree: an extension left in build/ by another torch would
        # count as up to date and be installed against the wrong torch's ABI.
        self.force = True

    def run(self):
        lib = build_core()
        # A core built with UCX (the transport inside a site) needs UCX's libraries too.
        pc = (CORE / "lowcomm.pc").read_text() if (CORE / "lowcomm.pc").exists() else ""
        ucx = [] if "ucx" not in pc else ["ucp", "uct", "ucs", "ucm"]
        for ext in self.extensions:
            ext.extra_objects = [str(lib)]
            ext.libraries = ext.libraries + [l for l in ucx if l not in ext.libraries]
        super().run()


# Two unity sources, one per kind of header the files need (c10d's, and pybind11's with
# torch/python.h): each .cc included once, so torch's headers are parsed twice instead of ten
# times; with -g0 (Python's CFLAGS ask for -g) the extension compiles in ~25 s on 2 cores
# instead of ~6 min (per torch, and scripts/test.sh builds it for two).
UNITS = {
    "backend_unit": ("backend", "coalesced", "compression", "work", "call_order_keys",
                     "tensor_util", "reconfigure"),
    "bindings_unit": ("bindings", "codec_bindings", "elastic_bindings"),
}


def unity_sources():
    out = HERE / "build" / "unity"
    out.mkdir(parents=True, exist_ok=True)
    sources = []
    for unit, names in UNITS.items():
        path = out / f"{unit}.cc"
        text = "".join(f'#include "{HERE / "csrc" / name}.cc"\n' for name in names)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        sources.append(str(path.relative_to(HERE)))
    listed = {n for names in UNITS.values() for n in names}
    missing = sorted(p.stem for p in (HERE / "csrc").glob("*.cc") if p.stem not in listed)
    if missing:
        raise RuntimeError(f"plugins/torch/setup.py: csrc files in no unit: {missing}")
    return sources


setup(
    name="lowcomm",
    version="0.1.0",
    description="lowcomm: compressed collectives over WAN links, as a torch.distributed backend",
    packages=["lowcomm"],
    ext_modules=[
        CppExtension(
            "lowcomm._C",
            unity_sources(),
            include_dirs=[str(ROOT / "include"), str(CORE / "include")],
            libraries=["crypto", "xxhash"],
            extra_compile_args=["-std=c++20", "-O2", "-g0", "-Wall", "-Wextra", "-Werror",
                                "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildWithCore},
    python_requires=">=3.10",
)
