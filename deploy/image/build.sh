#!/usr/bin/env bash
# Build the Gristmill images on a machine without a Docker engine and without pulling any
# base image: the base comes from Debian's packages (deploy/image/base.sh), buildah runs
# docker/Dockerfile itself (chroot isolation, no daemon), and the result is written as an
# OCI layout that skopeo can push anywhere:
#
#   deploy/image/build.sh cpu|cuda [OUT]      (root; buildah, debootstrap, skopeo)
#   skopeo copy oci:build/images/gristmill-cpu:latest docker://REGISTRY/gristmill:cpu
#
# Python packages come from PyPI (pinned with hashes), Debian packages from its mirror.
set -euo pipefail
VARIANT=${1:?usage: build.sh cpu|cuda [OUT]}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$REPO/build/images}
WORK=${GRISTMILL_IMAGE_WORK:-/var/tmp/gristmill-image}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct)}

"$REPO/deploy/image/base.sh" "$WORK"
# Behind a TLS-inspecting proxy pip needs that proxy's CA: PIP_CERT names it here, and the
# build stages see it (read-only, never copied into an image).
ca_args=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    ca_args=(--volume "$PIP_CERT:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
fi
# buildah 1.28 has no --source-date-epoch: --timestamp sets every layer's and the config's
# creation time, so rebuilding the same commit gives the same image config.
buildah bud --isolation chroot --layers \
    --format docker \
    --timestamp "$SOURCE_DATE_EPOCH" \
    --build-arg BASE=localhost/gristmill-base:bookworm "${ca_args[@]}" \
    --target "$VARIANT" \
    -f "$REPO/docker/Dockerfile" \
    -t "localhost/gristmill:$VARIANT" \
    "$REPO"
mkdir -p "$OUT"
rm -rf "$OUT/gristmill-$VARIANT"
# An OCI image layout directory (what registries take; `umoci unpack` opens it too).
skopeo copy --quiet "containers-storage:localhost/gristmill:$VARIANT" \
    "oci:$OUT/gristmill-$VARIANT:latest"
echo "built localhost/gristmill:$VARIANT -> $OUT/gristmill-$VARIANT"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "localhost/gristmill:$VARIANT"
