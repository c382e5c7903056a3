"""Where the GPU wheel (tilemaxsim-cu13) finds cuBLAS: the NVIDIA wheel `nvidia-cublas`
(site-packages/nvidia/cu13/lib), else the system's loader path (ld.so.cache, LD_LIBRARY_PATH,
/usr/local/cuda). The CPU wheel links no CUDA library and needs none of this."""
from __future__ import annotations

import ctypes
import glob
import os
import sys

CUBLAS = ("libcublasLt.so.13", "libcublas.so.13")  # Lt first: libcublas needs it


def cuda_library_dirs() -> list[str]:
    """Directories of installed NVIDIA wheels that hold cuBLAS 13 (empty when none is installed)."""
    out = []
    for root in sys.path:
        for d in glob.glob(os.path.join(root or ".", "nvidia", "cu13", "lib")) + \
                 glob.glob(os.path.join(root or ".", "nvidia", "cublas", "lib")):
            if os.path.exists(os.path.join(d, CUBLAS[1])) and d not in out:
                out.append(os.path.abspath(d))
    return out


def preload_cuda_libraries(needed: bool) -> None:
    """Loads cuBLAS before the engine module so that its dependency resolves to the NVIDIA wheel's
    copy or, without one, to the system's. `needed`: the engine module links cuBLAS (GPU wheel)."""
    if not needed:
        return
    candidates = [os.path.join(d, n) for d in cuda_library_dirs() for n in CUBLAS]
    for d in ("/usr/local/cuda/lib64", os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64")):
        candidates += [os.path.join(d, n) for n in CUBLAS]
    loaded = set()
    for path in candidates + list(CUBLAS):  # bare names: the loader's own search, last
        name = os.path.basename(path)
        if name in loaded or (os.sep in path and not os.path.exists(path)):
            continue
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded.add(name)
        except OSError:
            pass
    if len(loaded) < len(CUBLAS):
        raise ImportError("tilemaxsim-cu13 needs cuBLAS 13: pip install 'nvidia-cublas>=13,<14' "
                          "(or CUDA 13 in /usr/local/cuda); the CPU package is `pip install tilemaxsim`")
