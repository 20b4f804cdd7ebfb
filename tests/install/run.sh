#!/usr/bin/env bash
# install.consumers: install this build tree into a temporary prefix and use it the ways a user
# would, each program run and checked (consumer.c, cmake_consumer/main.cc):
#   1. the installed files: headers, liblowcomm.so* (SONAME), liblowcomm.a, the CMake package,
#      lowcomm.pc, no programs, and no path back into the build or source tree;
#   2. cc consumer.c $(pkg-config --cflags --libs lowcomm)            -> liblowcomm.so
#   3. cc consumer.c liblowcomm.a + pkg-config --static's dependencies -> no liblowcomm.so
#   4. a CMake project: find_package(lowcomm CONFIG REQUIRED), one program linking
#      lowcomm::lowcomm and one lowcomm::lowcomm_static.
#
#   tests/install/run.sh <build dir>
# Environment (CTest sets them from the build): CC, CXX, CMAKE (the cmake binary), and
# LOWCOMM_CONSUMER_FLAGS (the build's sanitizer flags, which its programs must also carry).
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
CMAKE=${CMAKE:-cmake}
read -r -a flags <<<"${LOWCOMM_CONSUMER_FLAGS:-}"
export LOWCOMM_TIMEOUT_S=${LOWCOMM_TIMEOUT_S:-60}  # a lost rank fails the run, not hangs it

work=$(mktemp -d "${TMPDIR:-/tmp}/lowcomm-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() {
  echo "install.consumers: $*" >&2
  exit 1
}
step() { echo "== $*"; }

# Runs a consumer program with a deadline.
run() {
  local exe=$1
  step "run $(basename "$exe")"
  timeout 180 "$exe" || fail "$(basename "$exe") failed (exit $?)"
}

# The program loads liblowcomm.so.<major> from the prefix, or (static) none at all.
check_links() {
  local exe=$1 kind=$2
  local needed
  needed=$(readelf -d "$exe" | grep NEEDED || true)
  if [ "$kind" = shared ]; then
    grep -q "\[liblowcomm.so.$major\]" <<<"$needed" || fail "$exe does not need liblowcomm.so.$major"
    local loaded
    loaded=$(ldd "$exe")
    grep -qF "liblowcomm.so.$major => $prefix/lib/" <<<"$loaded" ||
      fail "$exe does not load the installed liblowcomm.so: $(grep lowcomm <<<"$loaded")"
  else
    if grep -q liblowcomm <<<"$needed"; then fail "$exe (static) needs $needed"; fi
  fi
}

step "cmake --install $build --prefix $prefix"
"$CMAKE" --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install failed"; }

# ---- 1. the installed files ----
version_h=$prefix/include/lowcomm/version.h
[ -f "$version_h" ] || fail "no include/lowcomm/version.h"
major=$(awk '$2 == "LOWCOMM_MAJOR" { print $3 }' "$version_h")
minor=$(awk '$2 == "LOWCOMM_MINOR" { print $3 }' "$version_h")
patch=$(awk '$2 == "LOWCOMM_PATCH" { print $3 }' "$version_h")
version=$major.$minor.$patch
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "version.h gives version '$version'"
for f in include/lowcomm/{lowcomm,communicator,codec,status,export,version}.h \
  lib/liblowcomm.so "lib/liblowcomm.so.$major" "lib/liblowcomm.so.$version" lib/liblowcomm.a \
  lib/cmake/lowcomm/{lowcommConfig,lowcommConfigVersion,lowcommTargets}.cmake \
  lib/pkgconfig/lowcomm.pc; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
soname=$(readelf -d "$prefix/lib/liblowcomm.so.$version" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "liblowcomm.so.$major" ] || fail "SONAME '$soname', want liblowcomm.so.$major"
[ ! -e "$prefix/bin" ] || fail "programs were installed: $(ls "$prefix/bin")"
if grep -rlF -e "$build" -e "$source_dir" "$prefix/lib/cmake" "$prefix/lib/pkgconfig" \
  "$prefix/include"; then
  fail "installed files name the build or source tree (above)"
fi
echo "installed lowcomm $version: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

# ---- 2. and 3. pkg-config ----
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion lowcomm)" = "$version" ] ||
  fail "pkg-config --modversion lowcomm: $(pkg-config --modversion lowcomm)"
read -r -a pc_cflags <<<"$(pkg-config --cflags lowcomm)"
read -r -a pc_libs <<<"$(pkg-config --libs lowcomm)"
read -r -a pc_static <<<"$(pkg-config --static --libs lowcomm)"
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

step "$CC consumer.c \$(pkg-config --cflags --libs lowcomm): ${pc_cflags[*]} ${pc_libs[*]}"
"$CC" "${cflags[@]}" "${flags[@]}" "$here/consumer.c" -o "$work/c_shared" "${pc_cflags[@]}" \
  "${pc_libs[@]}" -Wl,-rpath,"$prefix/lib"
check_links "$work/c_shared" shared
run "$work/c_shared"

# The archive itself in place of -llowcomm (which would pick the .so), then exactly what
# pkg-config --static lists: a missing private dependency fails the link.
static_libs=()
for w in "${pc_static[@]}"; do
  if [ "$w" = -llowcomm ]; then static_libs+=("$prefix/lib/liblowcomm.a"); else static_libs+=("$w"); fi
done
step "$CC consumer.c liblowcomm.a \$(pkg-config --static --libs lowcomm): ${pc_static[*]}"
"$CC" "${cflags[@]}" "${flags[@]}" "$here/consumer.c" -o "$work/c_static" "${pc_cflags[@]}" \
  "${static_libs[@]}"
check_links "$work/c_static" static
run "$work/c_static"

# ---- 4. find_package(lowcomm CONFIG) ----
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
step "cmake consumer project with find_package(lowcomm CONFIG REQUIRED)"
"$CMAKE" -S "$here/cmake_consumer" -B "$work/cmake" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CXX_FLAGS="${flags[*]}" \
  -DCMAKE_EXE_LINKER_FLAGS="${flags[*]}" >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; fail "configuring the CMake consumer failed"; }
grep 'lowcomm .* from' "$work/cmake.log"
grep -q "^lowcomm_DIR:PATH=$prefix/lib/cmake/lowcomm$" "$work/cmake/CMakeCache.txt" ||
  fail "find_package found $(grep '^lowcomm_DIR' "$work/cmake/CMakeCache.txt")"
"$CMAKE" --build "$work/cmake" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "building the CMake consumer failed"; }
check_links "$work/cmake/consumer_shared" shared
check_links "$work/cmake/consumer_static" static
run "$work/cmake/consumer_shared"
run "$work/cmake/consumer_static"

echo "install.consumers: lowcomm $version installs and links: pkg-config (shared, static)," \
  "find_package (lowcomm::lowcomm, lowcomm::lowcomm_static)"
