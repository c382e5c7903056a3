#!/usr/bin/env bash
# The main job: install, build, then synthesize a small ColBERT-like corpus, index it, batch-search
# it (GPU when present, else CPU) and print MRR@10 / nDCG@10 / Recall and the time taken.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
exec build/tools/tms demo
