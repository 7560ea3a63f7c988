#!/usr/bin/env bash
# On the GPU machine: unpack the bundle parts this call carried (.gpuhost/c*/), once,
# into $GMHOST_ROOT (default /opt/gmhost), set the environment the whole system needs
# there, then run "$@" (e.g. python3 -m bench.gpuhost.run --out $OUT).
# Parts carried by an earlier call stay unpacked while the machine stays warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${GMHOST_ROOT:-/opt/gmhost}
mkdir -p "$root"
for part in .gpuhost/c*/*.tar*; do
  [ -e "$part" ] || continue
  name=$(basename "$part")
  [ -e "$root/.unpacked-$name" ] && continue
  tar -xf "$part" -C "$root" && touch "$root/.unpacked-$name"
  echo "unpacked $name"
done
export PATH="$root/jre/bin:$root/pg/usr/lib/postgresql/15/bin:$root/site/bin:$PATH"
export PYTHONPATH="$root/site:$PWD:$PWD/client/src"
export GRISTMILL_EMBED_MODEL_DIR="$root/model/all-minilm-l6-v2"
export GMHOST_ROOT="$root" PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (the device tool's notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ $# -gt 0 ] && exec "$@"
