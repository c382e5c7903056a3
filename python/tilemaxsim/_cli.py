"""The `tms` console command of an installed wheel: runs the engine's own `tms` binary, which the
wheel carries in tilemaxsim/bin (a program, not a Python reimplementation of it)."""
from __future__ import annotations

import os
import sys

from ._libs import cuda_library_dirs


def main() -> int:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tms")
    if not os.access(exe, os.X_OK):
        print(f"tms: {exe} is missing: this tilemaxsim was built without the command line "
              "(pip install ./python or a wheel from scripts/wheel.sh has it)", file=sys.stderr)
        return 127
    dirs = cuda_library_dirs()
    if dirs:  # the GPU wheel's cuBLAS from the NVIDIA wheel, found by the loader through this path
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [p for p in
                                                                 os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    os.execv(exe, ["tms"] + sys.argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
