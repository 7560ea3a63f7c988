#!/usr/bin/env bash
# Build the Gristmill images on a machine without a Docker engine and without pulling any
# base image: the base comes from Debian's packages (docker/image/base.sh), buildah runs
# docker/Dockerfile itself (chroot isolation, no daemon), and the result is written as an
# OCI layout that skopeo can push anywhere:
#
#   docker/image/build.sh cpu|cuda [OUT]      (root; buildah, debootstrap, skopeo)
#   skopeo copy docker-archive:build/images/gristmill-cpu.tar docker://REGISTRY/gristmill:cpu
#
# Python packages come from PyPI (pinned with hashes), Debian packages from its mirror.
set -euo pipefail
VARIANT=${1:?usage: build.sh cpu|cuda [OUT]}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$REPO/build/images}
WORK=${GRISTMILL_IMAGE_WORK:-/var/tmp/gristmill-image}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct)}

"$REPO/docker/image/base.sh" "$WORK"
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
rm -rf "$OUT/gristmill-$VARIANT" "$OUT/gristmill-$VARIANT.tar"
# An OCI image layout directory (`umoci unpack` opens it; OCI has no HEALTHCHECK field,
# so this copy lacks it) and a Docker archive that keeps it (`docker load -i`, or
# `skopeo copy docker-archive:... docker://REGISTRY/...` to push it).
skopeo copy --quiet "containers-storage:localhost/gristmill:$VARIANT" \
    "oci:$OUT/gristmill-$VARIANT:latest"
skopeo copy --quiet "containers-storage:localhost/gristmill:$VARIANT" \
    "docker-archive:$OUT/gristmill-$VARIANT.tar:gristmill:$VARIANT"
echo "built localhost/gristmill:$VARIANT -> $OUT/gristmill-$VARIANT{,.tar}"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "localhost/gristmill:$VARIANT"
