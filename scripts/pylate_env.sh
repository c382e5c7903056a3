#!/usr/bin/env bash
# The virtual environment in which the PyLate adapter is tested against PyLate itself
# (tests/python/test_pylate.py, ctest pytest_pylate): pylate from PyPI with what it pulls (torch,
# transformers, sentence-transformers, fast-plaid for PyLate's PLAID index), in build/pylate-venv.
# Installs only when missing: about 5 GB and two minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pylate-venv
if ! "$venv/bin/python" -c "import pylate, fast_plaid, pytest" 2>/dev/null; then
  echo "pylate_env: installing pylate 1.6.0 and pytest into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "pylate==1.6.0" pytest
fi
