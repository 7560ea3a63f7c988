#!/usr/bin/env bash
# The base image, made here from Debian's own packages instead of pulled from a registry:
# a minbase Debian bookworm rootfs (debootstrap), imported into buildah's local storage as
# localhost/gristmill-base:bookworm. docker/Dockerfile builds on it with
# --build-arg BASE=localhost/gristmill-base:bookworm (docker/image/build.sh).
#
#   docker/image/base.sh [WORKDIR]      (root; needs debootstrap and buildah)
set -euo pipefail
WORK=${1:-/var/tmp/gristmill-image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
BASE_IMAGE=localhost/gristmill-base:$SUITE
ROOTFS=$WORK/base-rootfs

if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "base image $BASE_IMAGE already there"
    exit 0
fi
mkdir -p "$WORK"
if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
    rm -rf "$ROOTFS"
    # minbase: essential packages and apt only (what debian:*-slim holds).
    debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR"
fi
cat > "$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
# What the slim images drop: docs, man pages, locales other than C, apt caches.
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
DPKG
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/var/log/*
# Reproducible: every file gets the same time stamp (SOURCE_DATE_EPOCH, default: the
# release date of the suite's Release file is not at hand, so the commit time is used).
EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$(dirname "$0")" log -1 --format=%ct)}
find "$ROOTFS" -xdev -newermt "@$EPOCH" -exec touch --no-dereference --date="@$EPOCH" {} +

ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$(buildah mount "$ctr")
cp -a "$ROOTFS"/. "$mnt"/
buildah umount "$ctr" >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
buildah commit --rm --timestamp "$EPOCH" "$ctr" "$BASE_IMAGE"
trap - EXIT
echo "base image $BASE_IMAGE ready"
