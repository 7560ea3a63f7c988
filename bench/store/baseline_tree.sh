#!/bin/sh
# A copy of a git revision (default: main) with this branch's store benchmarks and sim's
# vector mode laid over it, so the same benchmark measures the code before this branch's
# store changes. Usage: bench/store/baseline_tree.sh DEST [REV]
set -eu
dest=$1
rev=${2:-main}
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dest"
mkdir -p "$dest"
git -C "$here" archive "$rev" | tar -x -C "$dest"
mkdir -p "$dest/bench/store" "$dest/docker/kafka"
cp "$here"/bench/store/*.py "$dest/bench/store/"
cp "$here/core/models/sim.py" "$dest/core/models/sim.py"
cp "$here/workers/models/sim.py" "$dest/workers/models/sim.py"
ln -sfn "$here/docker/kafka/libs" "$dest/docker/kafka/libs"
# sim's vector mode setting and its use in the catalog.
python3 - "$dest" <<'PY'
import sys
d = sys.argv[1]
p = f"{d}/core/config.py"
s = open(p).read()
if "sim_vector_dim" not in s:
    s = s.replace(
        "    sim_max_batch: int = Field(100, ge=1)\n",
        "    sim_max_batch: int = Field(100, ge=1)\n"
        "    sim_vector_dim: int = Field(0, ge=0, le=65_536)\n",
    )
    open(p, "w").write(s)
p = f"{d}/core/models/catalog.py"
s = open(p).read()
if "vector_dim" not in s:
    s = s.replace(
        "            batch_ms=settings.sim_batch_ms,\n",
        "            batch_ms=settings.sim_batch_ms,\n"
        "            vector_dim=settings.sim_vector_dim,\n",
    )
    open(p, "w").write(s)
PY
echo "$dest"
