#!/usr/bin/env bash
# Build a relocatable Open MPI runtime (the Debian 12 openmpi 4.1.4 installed here,
# i.e. exactly the libmpi.so.40 that `tms` links against) for a machine without MPI.
#
#   tools/experiments/mpi_bundle.sh OUTDIR   ->  OUTDIR/ompi.tar.xz  + OUTDIR/mpi_env.sh
#
# On the target:  mkdir -p D && tar -xJf OUTDIR/ompi.tar.xz -C D && source D/mpi_env.sh
# The tree mirrors the Debian layout under D (D/usr/..., D/etc/openmpi); mpi_env.sh
# points OPAL_PREFIX / OPAL_SYSCONFDIR / PMIX_PREFIX / LD_LIBRARY_PATH / PATH at it.
# Files are copied from the installed packages (dpkg -L), so no network is needed.
# UCX / libfabric / PSM / verbs / OpenSHMEM / Fortran / Java pieces are dropped:
# libmpi.so.40 does not link them, they are only optional MCA plugins.
set -euo pipefail

OUT=$(mkdir -p "${1:?usage: $0 OUTDIR}" && cd "$1" && pwd)
STAGE=$OUT/stage
ML=usr/lib/x86_64-linux-gnu
rm -rf "$STAGE" && mkdir -p "$STAGE"   # idempotent: rebuilt from scratch every time

# Core runtime packages + the libraries they (not the optional plugins) need.
PKGS="openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2 libudev1"
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || { echo "missing package $p" >&2; exit 1; }; done
# Copy the installed files (keeping symlinks), minus docs/man/lintian.
dpkg -L $PKGS | grep -Ev '^/\.?$|/share/(doc|man|lintian)/' | sed 's|^/||' | sort -u \
  | tar -C / -cf - --no-recursion -T - | tar -C "$STAGE" -xf -
# merged /usr: some packages list /lib/... ; fold them into usr/lib
if [ -d "$STAGE/lib" ]; then cp -a "$STAGE/lib/." "$STAGE/usr/lib/" && rm -rf "${STAGE:?}/lib"; fi

cd "$STAGE"
# Drop optional transports (UCX/OFI/PSM/verbs/netlink), OpenSHMEM, Fortran, Java,
# compiler wrappers and debug/profiling helpers.
rm -f $ML/openmpi/lib/openmpi3/mca_*{ucx,ofi,openib,psm,verbs}*.so \
      $ML/openmpi/lib/openmpi3/mca_reachable_netlink.so \
      $ML/openmpi/lib/openmpi3/mca_{atomic,memheap,scoll,spml,sshmem}_*.so \
      $ML/libmca_common_{ucx,ofi,verbs}.so* $ML/liboshmem.so* $ML/libmpi_java.so* \
      $ML/libmpi_mpifh*.so* $ML/libmpi_use*.so* \
      usr/bin/{aggregate_profile,profile2mat,mpijavac*,opal*,orte-server,ompi-server,oshmem_info} \
      usr/bin/{mpi,osh,shmem,ortecc}*
rm -rf usr/share/openmpi/*wrapper-data* usr/share/openmpi/mpijava* usr/share/pmix/*wrapper*
# Debian's mpirun/mpiexec go through /etc/alternatives: make them local relative links.
for l in mpirun mpiexec; do ln -sfn orterun usr/bin/$l; done
# libudev is normally present on the target; keep ours aside and only use it as a fallback.
mkdir -p fallback && mv $ML/libudev.so* fallback/
mkdir -p $ML/hwloc   # empty hwloc plugin dir (HWLOC_PLUGINS_PATH) so no system plugins are mixed in

# Sanity check: every ELF must resolve using only the bundle + glibc/libz/libstdc++.
export LD_LIBRARY_PATH=$STAGE/$ML:$STAGE/$ML/pmix2/lib:$STAGE/fallback
bad=$(find . -type f \( -name '*.so*' -o -path './usr/bin/*' \) | while read -r f; do
  ldd "$f" 2>/dev/null | awk '/=>/ {print $1, $3}' | while read -r n p; do
    case "$p" in "$STAGE"/*) continue;; esac
    case "$n" in libc.*|libm.*|libdl.*|libpthread.*|librt.*|libz.*|libstdc++.*|libgcc_s.*) ;;
                 *) echo "$f: $n => $p";; esac
  done
done)
[ -z "$bad" ] || { echo "unbundled dependencies:"; echo "$bad"; exit 1; } >&2

# The environment file (sourced on the target; D = its own directory).
cat > mpi_env.sh <<'ENV'
# source me:  source D/mpi_env.sh   (D = where ompi.tar.xz was unpacked)
D=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
[ -x "$D/usr/bin/orterun" ] || { echo "mpi_env.sh: $D/usr/bin/orterun missing (unpack ompi.tar.xz here)" >&2; return 1; }
ML=$D/usr/lib/x86_64-linux-gnu
export PATH=$D/usr/bin:$PATH
export LD_LIBRARY_PATH=$ML:$ML/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# libudev only from the bundle when the target has none
ldconfig -p 2>/dev/null | grep 'libudev\.so\.1 ' >/dev/null || LD_LIBRARY_PATH+=:$D/fallback
export OPAL_PREFIX=$D/usr OPAL_SYSCONFDIR=$D/etc/openmpi   # Open MPI install dirs
# PMIx install dirs: mpirun's PMIx server ignores PMIX_PREFIX alone, so set each dir
P=$ML/pmix2
export PMIX_PREFIX=$P PMIX_EXEC_PREFIX=$P PMIX_LIBDIR=$P/lib PMIX_PKGLIBDIR=$P/lib/pmix \
       PMIX_DATAROOTDIR=$P/share PMIX_DATADIR=$P/share PMIX_SYSCONFDIR=$P/share PMIX_PKGDATADIR=$P/share/pmix
export PMIX_MCA_mca_base_component_path=$P/lib/pmix
export HWLOC_PLUGINS_PATH=$ML/hwloc
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Single-node defaults (override by exporting before sourcing): local launch without
# ssh/rsh (plm isolated), ob1 over shared memory + self (no UCX/OFI), no CPU binding
# (ranks run multi-threaded host code), no CMA single-copy (process_vm_readv is often
# blocked in containers); that disables osc/rdma over vader, so allow osc/pt2pt for RMA.
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_osc=${OMPI_MCA_osc:-sm,rdma,pt2pt}
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
unset ML P
ENV
cp mpi_env.sh "$OUT/mpi_env.sh"

tar -C "$STAGE" -cf - . | xz -9e -T1 > "$OUT/ompi.tar.xz.tmp" && mv "$OUT/ompi.tar.xz.tmp" "$OUT/ompi.tar.xz"
cd "$OUT" && rm -rf "$STAGE"
ls -l "$OUT/ompi.tar.xz" "$OUT/mpi_env.sh"
