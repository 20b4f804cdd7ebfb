"""Builds lowcomm's torch.distributed backend (the `lowcomm` package) against the torch in the
environment and the lowcomm core of this repository, offline:

    pip install --no-build-isolation ./plugins/torch

The core is configured and built with CMake into build/core (static, no tests) and linked into
the extension; OpenSSL's libcrypto and xxHash come from the system, UCX's libraries where the
core was built with UCX (its lowcomm.pc requires ucx), and the static CUDA runtime where it was
built with CUDA (lowcomm.pc's Libs.private). With LOWCOMM_CORE_BUILD=<a build directory of this
repository> the liblowcomm.a already built there is linked instead (scripts/test.sh uses its
Release build).

CUDA tensors (docs/torch.md, "CUDA tensors"): when the torch in the environment has CUDA
(torch.version.cuda) and a CUDA toolkit is found (CUDA_HOME), `lowcomm._C` is a CUDAExtension
compiled with LOWCOMM_WITH_CUDA: only .cc sources, so nvcc never runs; it gets CUDA's headers and
links c10_cuda, torch_cuda and cudart, and a core built here is built with CUDA too. Otherwise,
or with LOWCOMM_TORCH_CUDA=0, it is a CppExtension that refuses CUDA tensors (a core built with
CUDA still links: its device path then goes unused).
"""
import os
import subprocess
from pathlib import Path

from setuptools import setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PREBUILT = os.environ.get("LOWCOMM_CORE_BUILD")
CORE = Path(PREBUILT) if PREBUILT else HERE / "build" / "core"
WITH_CUDA = (os.environ.get("LOWCOMM_TORCH_CUDA", "1") != "0" and torch.version.cuda is not None
             and CUDA_HOME is not None)
# Unset with no GPU to query, torch's arch detection fails (pytorch#137261); 9.0: H100/H200.
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")


def build_core():
    if PREBUILT:
        lib = CORE / "lib" / "liblowcomm.a"
        if not lib.exists():
            raise RuntimeError(f"LOWCOMM_CORE_BUILD={PREBUILT}: no {lib}; build target lowcomm_static")
        return lib
    CORE.mkdir(parents=True, exist_ok=True)
    subprocess.check_call([
        "cmake", "-S", str(ROOT), "-B", str(CORE), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        f"-DLOWCOMM_CUDA={'ON' if WITH_CUDA else 'OFF'}", "-DLOWCOMM_BUILD_TESTS=OFF",
        "-DLOWCOMM_BUILD_BENCH=OFF",
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
        dirs, private = core_private_libs(pc)
        core_cuda = "cudart_static" in private or "cudart" in private
        if WITH_CUDA and not core_cuda:
            print(f"lowcomm: the core in {CORE} was built without CUDA: lowcomm._C takes CPU "
                  "tensors only")
        for ext in self.extensions:
            if not core_cuda:  # the device path needs the core's CUDA code
                ext.define_macros = [m for m in ext.define_macros if m[0] != "LOWCOMM_WITH_CUDA"]
            ext.extra_objects = [str(lib)]
            # The core's own (the static CUDA runtime, -ldl -lrt) first: before CUDAExtension's
            # cudart, so that the archive's CUDA code binds to the runtime it was built with.
            ext.libraries = private + [l for l in ext.libraries + ucx if l not in private]
            ext.library_dirs = ext.library_dirs + [d for d in dirs if d not in ext.library_dirs]
            if "cudart_static" in private:
                # Its symbols stay inside lowcomm._C (torch's libcudart.so serves torch).
                ext.extra_link_args = ext.extra_link_args + [
                    "-Wl,--exclude-libs,libcudart_static.a"]
        super().run()


def core_private_libs(pc):
    """The -L directories and -l libraries of lowcomm.pc's Libs.private that liblowcomm.a needs
    beyond the C++ runtime: the static CUDA runtime with -ldl -lrt (and pthread) in a CUDA
    build."""
    dirs, libs = [], []
    for line in pc.splitlines():
        if not line.startswith("Libs.private:"):
            continue
        for flag in line.split(":", 1)[1].split():
            if flag.startswith("-L"):
                dirs.append(flag[2:])
            elif flag.startswith("-l") and flag[2:] not in ("stdc++", "m"):
                libs.append(flag[2:])
    if "cudart_static" in libs and "pthread" not in libs:
        libs.append("pthread")
    return dirs, libs


# Two unity sources, one per kind of header the files need (c10d's, and pybind11's with
# torch/python.h): each .cc included once, so torch's headers are parsed twice instead of ten
# times; with -g0 (Python's CFLAGS ask for -g) the extension compiles in ~25 s on 2 cores
# instead of ~6 min (per torch, and scripts/test.sh builds it for two).
UNITS = {
    "backend_unit": ("backend", "coalesced", "compression", "work", "call_order_keys",
                     "tensor_util", "reconfigure", "device", "p2p", "callback_threads"),
    "bindings_unit": ("bindings", "codec_bindings", "elastic_bindings"),
}


CXX_FLAGS = ["-std=c++20", "-O2", "-g0", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]


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
        (CUDAExtension if WITH_CUDA else CppExtension)(
            "lowcomm._C",
            unity_sources(),
            include_dirs=[str(ROOT / "include"), str(CORE / "include")],
            libraries=["crypto", "xxhash"],
            define_macros=[("LOWCOMM_WITH_CUDA", "1")] if WITH_CUDA else [],
            # CUDAExtension takes a dict (per compiler); only .cc sources: "cxx" is all there is.
            extra_compile_args=({"cxx": CXX_FLAGS} if WITH_CUDA else CXX_FLAGS),
        )
    ],
    cmdclass={"build_ext": BuildWithCore},
    python_requires=">=3.10",
)
