#!/usr/bin/env bash
# install.exports: liblowcomm.so exports the public API and nothing else.
#   tests/install/exports.sh <liblowcomm.so> <public header>...
# Every defined dynamic symbol must be a C function the headers declare (lowcomm*) or,
# demangled, a LOWCOMM_API class or function of namespace lowcomm:: -- no std:: template
# instantiations, no OpenSSL, xxHash or CUDA runtime symbols, no internal helpers (namespaces
# lowcomm::transport, lowcomm::collectives, ...). And every C function the headers declare, and
# the core of the C++ API, must be there.
set -euo pipefail
lib=$1
shift
headers=("$@")
[ -f "$lib" ] || { echo "exports: no library at $lib" >&2; exit 1; }
for h in "${headers[@]}"; do
  [ -f "$h" ] || { echo "exports: no header at $h" >&2; exit 1; }
done

# "<type> <name>" per defined dynamic symbol, the version suffix (@...) dropped.
mapfile -t syms < <(nm -D --defined-only "$lib" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $2, $3 }')
[ ${#syms[@]} -gt 0 ] || { echo "exports: $lib exports nothing" >&2; exit 1; }

# What the headers mark LOWCOMM_API: "class C" (a marked class), "func f" (a namespace-level
# function or a C function), "member C::m" (a marked member of an unmarked class).
mapfile -t marked < <(awk '
  /^(class|struct) .*\{/ { cls = $0; sub(/[ \t]*\{.*/, "", cls); sub(/.*[ \t]/, "", cls) }
  /^\};/ { cls = "" }
  /LOWCOMM_API/ {
    if ($0 ~ /^(class|struct) LOWCOMM_API /) {
      n = $0; sub(/^(class|struct) LOWCOMM_API /, "", n); sub(/[^A-Za-z0-9_].*/, "", n)
      print "class " n; next
    }
    if (!match($0, /[A-Za-z_][A-Za-z0-9_]*\(/)) next
    n = substr($0, RSTART, RLENGTH - 1)
    if ($0 ~ /^[ \t]/ && cls != "") print "member " cls "::" n; else print "func " n
  }' "${headers[@]}" | sort -u)
allowed=()  # regular expressions over demangled names
c_api=()
for m in "${marked[@]}"; do
  kind=${m%% *}
  name=${m#* }
  case $kind in
    class) allowed+=("^lowcomm::$name::" "^(typeinfo|typeinfo name|vtable|VTT) for lowcomm::$name\$") ;;
    member) allowed+=("^lowcomm::$name(\\[abi:cxx11\\])?\\(") ;;
    func)
      if [[ $name =~ ^lowcomm[A-Z] ]]; then
        c_api+=("$name")
      else
        allowed+=("^lowcomm::$name(\\[abi:cxx11\\])?\\(")
      fi
      ;;
  esac
done
# Every C function named in the headers, marked or not: a missing mark fails below.
mapfile -t c_named < <(cat "${headers[@]}" | grep -oE '\blowcomm[A-Z][A-Za-z0-9_]*\(' | tr -d '(' | sort -u)
c_api+=("${c_named[@]}")
[ ${#c_named[@]} -ge 20 ] || { echo "exports: only ${#c_named[@]} C functions in the headers" >&2; exit 1; }

fail=0
declare -A exported  # raw name -> type
declare -A demangled_of
names=()
for s in "${syms[@]}"; do
  exported[${s#* }]=${s%% *}
  names+=("${s#* }")
done
mapfile -t demangled < <(printf '%s\n' "${names[@]}" | c++filt)

unexpected=()
for i in "${!names[@]}"; do
  raw=${names[$i]}
  dem=${demangled[$i]}
  demangled_of[$raw]=$dem
  ok=0
  for c in "${c_api[@]}"; do [ "$raw" = "$c" ] && ok=1 && break; done
  for re in "${allowed[@]}"; do [[ $dem =~ $re ]] && ok=1 && break; done
  [ $ok = 1 ] && continue
  case $dem in
    std::* | "typeinfo for std::"* | "vtable for std::"* | "guard variable for std::"*)
      why="std:: instantiation" ;;
    XXH*) why="xxHash" ;;
    EVP_* | HMAC* | CRYPTO_* | OPENSSL_* | RAND_*) why="OpenSSL" ;;
    cuda* | __cuda* | cu[A-Z]*) why="CUDA runtime" ;;
    lowcomm::*) why="internal" ;;
    *) why="not the public API" ;;
  esac
  unexpected+=("${exported[$raw]} $dem  ($why)")
done
if [ ${#unexpected[@]} -gt 0 ]; then
  echo "exports: ${#unexpected[@]} of ${#names[@]} exported symbols are not lowcomm's API:" >&2
  printf '  %s\n' "${unexpected[@]}" | head -40 >&2
  [ ${#unexpected[@]} -le 40 ] || echo "  ..." >&2
  fail=1
fi

# Every C function the headers declare, as a text symbol.
for f in "${c_named[@]}"; do
  if [ "${exported[$f]:-}" != T ]; then
    echo "exports: C function $f (declared in the headers) is not exported" >&2
    fail=1
  fi
done

# The C++ API: one symbol from each public header and class (demangled prefixes).
cxx_api=(
  "lowcomm::status_code_name("
  "lowcomm::Status::to_string"
  "lowcomm::parse_codec_spec("
  "lowcomm::encode("
  "lowcomm::decode("
  "lowcomm::encoded_size("
  "lowcomm::create_unique_id("
  "lowcomm::UniqueId::to_string"
  "lowcomm::Communicator::init("
  "lowcomm::Communicator::all_reduce("
  "lowcomm::Communicator::~Communicator()"
  "lowcomm::Work::wait() const"
  "lowcomm::version()"
)
for h in "${headers[@]}"; do
  [[ $h == */codec_cuda.h ]] && cxx_api+=("lowcomm::cuda_device_available(" "lowcomm::encode_cuda(")
done
for want in "${cxx_api[@]}"; do
  found=0
  for raw in "${names[@]}"; do
    if [[ ${demangled_of[$raw]} == "$want"* ]]; then found=1; break; fi
  done
  if [ $found = 0 ]; then
    echo "exports: C++ symbol $want... is not exported" >&2
    fail=1
  fi
done

if [ $fail = 0 ]; then
  echo "exports: ${#names[@]} symbols, all lowcomm's API; ${#c_named[@]} C functions and" \
    "${#cxx_api[@]} C++ entry points present (${#marked[@]} marks in the headers)"
fi
exit $fail
