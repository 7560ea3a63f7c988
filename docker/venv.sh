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
    /opt/gristmill/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
        /opt/gristmill/lib >/dev/null
    ;;
*)
    echo "usage: venv.sh deps REQUIREMENTS | project WHEEL_DIR" >&2
    exit 2
    ;;
esac
