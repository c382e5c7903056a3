#!/usr/bin/env python3
"""Flash-MaxSim 0.3.0 (PyPI `flash-maxsim`) on the cases of `tms bench kernels`, same JSON
row schema, impl "flash-maxsim-0.3.0". Needs torch + triton + flash-maxsim on a CUDA machine.
Data: random fp16/bf16/fp32 tensors on the device, rotated over copies totalling >= 4x L2;
times are medians of 15 CUDA-event samples after warm-up (and --cooldown seconds of idle
before each, as `tms bench kernels --cooldown`). Ragged: one launch per query (the
package has no per-query candidate lists), over the gathered candidates of that query.

    python3 tools/experiments/flash_maxsim_bench.py --json out.json [--ceiling GBPS] [--filter SUBSTR] [--cooldown S]
"""
import argparse
import json
import math
import time

import torch
import flash_maxsim
from flash_maxsim import flash_maxsim as fm_dense
from flash_maxsim import flash_maxsim_packed

IMPL = "flash-maxsim-" + flash_maxsim.__version__
NQ = 32
COOLDOWN_S = 0.0  # idle seconds before each timing (--cooldown)


def cases():
    out = []
    for nd in (32, 128, 256):
        for b in (1000, 10000, 100000, 500000):
            out.append(dict(name=f"exact_d128_nq32_nd{nd}_b{b}_fp16", dim=128, nd=nd, b=b, dtype=torch.float16))
    out.append(dict(name="exact_d768_nq32_nd128_b20000_fp16", dim=768, nd=128, b=20000, dtype=torch.float16))
    out.append(dict(name="exact_d128_nq32_ndvar32-256_b100000_fp16", dim=128, nd=0, b=100000, dtype=torch.float16))
    out.append(dict(name="ragged_d128_nq32_nd128_q256_c4096_n1000000_fp16", dim=128, nd=128, b=1000000,
                    dtype=torch.float16, nq=256, ncand=4096))
    out.append(dict(name="exact_d128_nq32_nd128_b100000_bf16", dim=128, nd=128, b=100000, dtype=torch.bfloat16))
    out.append(dict(name="exact_d128_nq32_nd128_b100000_fp32", dim=128, nd=128, b=100000, dtype=torch.float32))
    return out


def median_time(fn, per_sample, samples=15, warmup_s=0.25):
    # Warm-up: at least two calls and warmup_s seconds (an idle GPU ramps its clocks up),
    # the same as `tms bench kernels`; after COOLDOWN_S seconds of idle.
    torch.cuda.synchronize()
    if COOLDOWN_S > 0:
        time.sleep(COOLDOWN_S)
    t0, i = time.perf_counter(), 0
    while True:
        fn(i)
        i += 1
        if i < 2:
            continue
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= warmup_s:
            break
    ts, call = [], 0
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_sample):
            fn(call)
            call += 1
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / per_sample)
    ts.sort()
    return ts[len(ts) // 2]


def run(c, ceiling, l2):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1234)
    esz = torch.tensor([], dtype=c["dtype"]).element_size()
    if c["nd"]:
        lens = torch.full((c["b"],), c["nd"], dtype=torch.int64)
    else:
        lens = torch.randint(32, 257, (c["b"],), generator=torch.Generator().manual_seed(1234))
    n_tok = int(lens.sum())
    corpus = n_tok * c["dim"] * esz
    copies = max(1, min(256, math.ceil(4 * l2 / corpus)))
    docs = [torch.randn(n_tok, c["dim"], device=dev, dtype=c["dtype"], generator=g).mul_(0.1) for _ in range(copies)]
    cu = torch.zeros(c["b"] + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    cu = cu.to(dev)
    per_sample = max(1, min(200, math.ceil(1e9 / corpus)))
    if "ncand" in c:
        nq, ncand = c["nq"], c["ncand"]
        qs = torch.randn(nq, NQ, c["dim"], device=dev, dtype=c["dtype"], generator=g) * 0.1
        D3 = docs[0].view(c["b"], c["nd"], c["dim"])
        cands = torch.randint(0, c["b"], (nq, ncand), device=dev, generator=g)
        bytes_read = nq * ncand * c["nd"] * c["dim"] * esz

        def fn(i):
            for q in range(nq):
                fm_dense(qs[q], D3[cands[q]])  # gather + one launch per query
        t = median_time(fn, 1, samples=5)
        return dict(case=c["name"], impl=IMPL, docs_per_s=nq * ncand / t, gbps=bytes_read / t * 1e-9,
                    frac_ceiling=bytes_read / t * 1e-9 / ceiling if ceiling else None)
    Q = torch.randn(NQ, c["dim"], device=dev, dtype=c["dtype"], generator=g) * 0.1
    max_ld = int(lens.max())
    if c["nd"]:
        views = [d.view(c["b"], c["nd"], c["dim"]) for d in docs]
        fn = lambda i: fm_dense(Q, views[i % copies])
    else:
        fn = lambda i: flash_maxsim_packed(Q, docs[i % copies], cu, max_ld)
    t = median_time(fn, per_sample)
    return dict(case=c["name"], impl=IMPL, docs_per_s=c["b"] / t, gbps=corpus / t * 1e-9,
                frac_ceiling=corpus / t * 1e-9 / ceiling if ceiling else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--ceiling", type=float, default=0.0, help="read ceiling GB/s from tms bench kernels")
    ap.add_argument("--filter", default="")
    ap.add_argument("--cooldown", type=float, default=0.0,
                    help="idle seconds before each timing, so that no row runs under the power cap that the "
                         "rows before it built up (as tms bench kernels --cooldown)")
    a = ap.parse_args()
    global COOLDOWN_S
    COOLDOWN_S = max(0.0, a.cooldown)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for c in cases():
        if a.filter and a.filter not in c["name"]:
            continue
        try:
            r = run(c, a.ceiling, l2)
        except Exception as e:  # report and go on (e.g. out of memory)
            r = dict(case=c["name"], impl=IMPL, error=str(e)[:200])
        print(json.dumps(r), flush=True)
        rows.append(r)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "impl": IMPL, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
