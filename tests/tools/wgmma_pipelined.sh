#!/bin/bash
# Copyright TileMaxSim authors. Fails when ptxas serializes the wgmma instructions (its note C7520,
# "wgmma.mma_async instructions are serialized") of a warpgroup-MMA compressed kernel that is not
# in the known list: the kernel still scores correctly, so no other test sees it, but each wgmma
# then waits for the one before (a fifth slower). Compiles
# kernels/cuda/code_maxsim_wg.cu for sm_90a (~10 s).
# usage: wgmma_pipelined.sh NVCC SOURCE_DIR OBJECT_OUT
set -u
nvcc=$1 src=$2 out=$3
log=$("$nvcc" -arch=sm_90a -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -DTMS_WITH_CUDA=1 -DTMS_CUDA_SM90A=1 \
      -Xptxas -v -I"$src" -I"$src/include" -c "$src/kernels/cuda/code_maxsim_wg.cu" -o "$out" 2>&1) || {
    echo "$log"
    exit 1
}
# Every warpgroup-MMA instantiation (CodeTraits<sub, book, false, false, true>) must have been compiled.
n=$(grep -c "Compiling entry function '.*code_maxsim_kernel.*CodeTraitsILi[0-9]ELi[0-9]ELb0ELb0ELb1E" <<<"$log")
if [ "$n" -lt 7 ]; then
    echo "expected 7 warpgroup-MMA kernels, ptxas compiled $n"
    exit 1
fi
# Known: PQ-32 (decode class 4, paired codebook) since the fp16 fold (8bcb2e9); measured 206-210M
# docs/s so, and 205M with the item sum out of line, which un-serializes it (BENCHMARKS.md).
known="4,2"
bad=0
for s in $(grep -o "C7520.*CodeTraitsILi[0-9]ELi[0-9]" <<<"$log" | sed -E 's/.*CodeTraitsILi([0-9])ELi([0-9])/\1,\2/' | sort -u); do
    if [ "$s" != "$known" ]; then
        echo "ptxas serializes the wgmma instructions of the warpgroup-MMA kernel of decode class,codebook $s"
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "$n warpgroup-MMA kernels; serialized: only the known ones"
exit $bad
