#!/usr/bin/env bash
# Installs a wheel from scripts/wheel.sh into a fresh virtual environment and runs, from it only,
# `tms --version`, `tms demo`, examples/quickstart.py and the Python tests
# (tests/python/test_python.py), inside a mount namespace in which the system's copies of every
# library the wheel bundles are hidden: what passes here does not lean on a library of this
# machine that a user's machine may lack.
#   scripts/wheel_test.sh build/wheels/tilemaxsim-*.whl
# (the GPU wheel's dependency nvidia-cublas comes from PyPI, or from PIP_FIND_LINKS=DIR offline).
set -euo pipefail
cd "$(dirname "$0")/.."
whl=$(cd "$(dirname "${1:?usage: $0 WHEEL}")" && pwd)/$(basename "$1")
[[ -f $whl ]] || { echo "wheel_test.sh: $1: no such wheel" >&2; exit 2; }
env=$(mktemp -d /tmp/tms-wheel-test.XXXXXX)
trap 'rm -rf "$env"' EXIT
python3 -m venv "$env/venv"
t0=$(date +%s%N)
"$env/venv/bin/pip" install -q "$whl"
t1=$(date +%s%N)
"$env/venv/bin/pip" install -q pytest  # the tests' runner (numpy came with the wheel)

# The system's files of the bundled libraries (auditwheel's libfoo-1234abcd.so.N.M is libfoo.so.N.M).
hide=()
for lib in $(python3 -c "import sys, zipfile; [print(n.rsplit('/', 1)[1]) for n in zipfile.ZipFile(sys.argv[1]).namelist() if '.libs/' in n]" "$whl"); do
  file=$(echo "$lib" | sed -E 's/-[0-9a-f]{8}\././')
  while read -r p; do hide+=("$p"); done < <(find /usr/lib/x86_64-linux-gnu -name "$file" -type f 2>/dev/null)
done
# The GPU wheel's cuBLAS must come from the nvidia-cublas wheel it depends on, not the toolkit here.
if [[ $(basename "$whl") == tilemaxsim_cu13-* ]]; then
  while read -r p; do hide+=("$p"); done < <(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu -name 'libcublas*.so*' -type f 2>/dev/null)
fi
echo "wheel_test.sh: installed in $(( (t1 - t0) / 1000000 )) ms; hiding ${#hide[@]} system libraries: $(printf '%s ' "${hide[@]##*/}")"

cat > "$env/run.sh" <<RUN
set -euo pipefail
for p in ${hide[*]}; do mount --bind /dev/null "\$p"; done
export PATH=$env/venv/bin:/usr/bin:/bin PYTHONPATH= LD_LIBRARY_PATH=
cd "$env"
python -c "import tilemaxsim, sys; print('wheel_test.sh: import tilemaxsim', tilemaxsim.__version__, 'from', tilemaxsim.__file__)"
tms --version
s=\$(date +%s%N)
python - <<'PY'
import numpy as np, tempfile, tilemaxsim
rng = np.random.default_rng(0)
docs = [rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(8, 40, 200)]
d = tempfile.mkdtemp()
tilemaxsim.build_index(d + "/idx", docs, range(200), n_centroids=64, progress=False)
ids, scores = tilemaxsim.Searcher(d + "/idx").search(docs[7][None, :8], k=3)
assert ids[0][0] == "7", ids
PY
echo "wheel_test.sh: import, first index and first search in \$(( (\$(date +%s%N) - s) / 1000000 )) ms"
mkdir demo && (cd demo && tms demo) | tail -4
python $PWD/examples/quickstart.py | tail -1
TMS_BIN=$env/venv/bin/tms python -m pytest -q -p no:cacheprovider $PWD/tests/python/test_python.py
RUN
# root may make a mount namespace; anyone else maps themselves to root in a user namespace first.
if [[ $(id -u) -eq 0 ]]; then unshare -m bash "$env/run.sh"; else unshare -r -m bash "$env/run.sh"; fi
echo "wheel_test.sh: $whl passed"
