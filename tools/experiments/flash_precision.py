#!/usr/bin/env python3
"""Accuracy of Flash-MaxSim 0.3.0 (PyPI `flash-maxsim`) against an fp64 reference, beside a naive
implementation in the inputs' own precision (torch matmul with TF32 off, max, sum): the precision rule
(error <= 2x the naive one), which `tms`'s CUDA tests check for our kernel
(tests/kernels/maxsim_cuda_test.cu). One JSON line per dtype:
{"dtype", "naive_max_err", "flash_max_err", "ratio"}.

    python3 tools/experiments/flash_precision.py [--docs 2000] [--nd 128]
"""
import argparse
import json

import torch
from flash_maxsim import flash_maxsim as fm_dense


def maxsim(q, d3):
    """[Nq, dim] x [B, Nd, dim] -> [B] in the tensors' dtype (fp32 accumulation for 16-bit)."""
    s = torch.einsum("qk,bnk->bqn", q.float() if q.dtype != torch.float64 else q,
                     d3.float() if d3.dtype != torch.float64 else d3)
    return s.amax(dim=2).sum(dim=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--nd", type=int, default=128)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(7)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q = torch.nn.functional.normalize(torch.randn(32, 128, device="cuda", generator=g), dim=1).to(dtype)
        d = torch.nn.functional.normalize(torch.randn(a.docs * a.nd, 128, device="cuda", generator=g), dim=1)
        d3 = d.to(dtype).view(a.docs, a.nd, 128)
        ref = maxsim(q.double(), d3.double())
        naive = maxsim(q, d3).double()
        flash = fm_dense(q, d3).double().view(-1)
        ne, fe = (naive - ref).abs().max().item(), (flash - ref).abs().max().item()
        print(json.dumps({"dtype": str(dtype).replace("torch.", ""), "naive_max_err": ne, "flash_max_err": fe,
                          "ratio": fe / ne if ne > 0 else None}), flush=True)


if __name__ == "__main__":
    main()
