// Copyright TileMaxSim authors. CPU dispatch for hot loops: GCC builds an AVX2+FMA clone
// (x86-64-v3) next to the baseline one and picks at load time (ifunc), so one binary runs
// everywhere and uses the wide units where they exist. Put it on plain functions, not on
// functions holding `#pragma omp parallel` (the outlined parallel bodies do not inherit it).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define TMS_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TMS_TARGET_CLONES
#endif
