#!/usr/bin/env bash
# Builds nvdash's container image (deploy/image/Containerfile) with buildah, from Debian's packages alone: no
# registry is needed. Steps, each skipped when its result is already there:
#   1. the wheel: pip wheel --no-deps (its build runs npm to build the JupyterLab extension);
#   2. the base: debootstrap --variant=minbase of Debian (python3, python3-venv, ca-certificates), upgraded from
#      SUITE-updates and SUITE-security, trimmed of docs, man pages, locales and apt's caches, kept as a tarball in
#      the cache folder (--rebuild-base makes it again: do so for new security fixes);
#   3. the base image nvdash-base:SUITE, imported from that tarball (buildah from scratch + add + commit);
#   4. nvdash's dependencies as wheels for the base's Python and glibc, fetched with this machine's pip (its index,
#      proxy and certificates), so the build itself runs without network;
#   5. the image nvdash:VERSION (and nvdash:latest), built FROM that base; prints its size and the build time.
# Run as root (buildah's vfs storage and chroot isolation work in a container without systemd).
set -euo pipefail
trap 'echo "build-image.sh: line $LINENO failed: $BASH_COMMAND" >&2' ERR

usage() {
  cat <<'EOF'
Usage: scripts/build-image.sh [options]
Builds the container image nvdash:VERSION from deploy/image/Containerfile on a Debian base made with debootstrap.

Options:
  --install        install what is missing (buildah, debootstrap) with apt-get first (as root); neither runc
                   nor crun is needed: buildah runs the build's steps with chroot isolation
  --suite NAME     Debian release of the base (default: bookworm)
  --mirror URL     Debian mirror for debootstrap (default: http://deb.debian.org/debian)
  --security-mirror URL
                   where SUITE-security comes from (default: the mirror with -security appended, e.g.
                   http://deb.debian.org/debian-security); none: the release alone, no updates (e.g. sid)
  --cache DIR      where the base tarball is kept (default: $XDG_CACHE_HOME/nvdash-image, else ~/.cache/nvdash-image)
  --rebuild-base   make the base again (debootstrap) even when it is cached
  --wheel FILE     use this nvdash wheel instead of building one
  --tag NAME       image name (default: nvdash); tagged NAME:VERSION and NAME:latest
  -h, --help       show this help

Environment: STORAGE_DRIVER (default vfs) and BUILDAH_ISOLATION (default chroot) are passed to buildah;
PYTHON (default python3) builds the wheel.
EOF
}

die() {
  echo "build-image.sh: $*" >&2
  exit 1
}

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SECURITY_MIRROR=""
CACHE=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/nvdash-image
REBUILD_BASE=0
INSTALL=0
WHEEL=""
NAME=nvdash
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --install) INSTALL=1 ;;
    --rebuild-base) REBUILD_BASE=1 ;;
    --suite | --mirror | --security-mirror | --cache | --wheel | --tag)
      if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value"; fi
      case "$1" in
        --suite) SUITE=$2 ;;
        --mirror) MIRROR=$2 ;;
        --security-mirror) SECURITY_MIRROR=$2 ;;
        --cache) CACHE=$2 ;;
        --wheel) WHEEL=$2 ;;
        --tag) NAME=$2 ;;
      esac
      shift ;;
    *) die "unknown option: $1 (see --help)" ;;
  esac
  shift
done

SECURITY_MIRROR=${SECURITY_MIRROR:-${MIRROR%/}-security}
case "$SUITE" in *[!a-z0-9-]* | "") die "--suite: not a Debian release name: $SUITE" ;; esac

cd "$(dirname "$0")/.."
ROOT=$PWD
CONTAINERFILE=$ROOT/deploy/image/Containerfile
PYTHON=${PYTHON:-python3}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
START=$SECONDS

if [ "$INSTALL" = 1 ]; then
  [ "$(id -u)" = 0 ] || die "--install needs root (apt-get install)"
  missing=()
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]} (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

need() { # need COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 || die "$1 not found: apt-get install $2 (or run this script as root with --install)"
}
need buildah buildah
[ -n "$WHEEL" ] || need "$PYTHON" python3
[ -f "$CONTAINERFILE" ] || die "no Containerfile at $CONTAINERFILE"
if [ "$(id -u)" != 0 ] && [ ! -s "$CACHE/base-$SUITE.tar" ]; then
  die "making the base with debootstrap needs root (or a cached $CACHE/base-$SUITE.tar)"
fi

# 1. The wheel.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nvdash-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [ -n "$WHEEL" ]; then
  [ -f "$WHEEL" ] || die "--wheel: no such file: $WHEEL"
  case "$(basename "$WHEEL")" in nvdash-*.whl) ;; *) die "--wheel: not an nvdash wheel: $WHEEL" ;; esac
  cp "$WHEEL" "$WORK/"
else
  need npm npm
  echo "== building the nvdash wheel (the JupyterLab extension with npm)"
  t=$SECONDS
  "$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK" "$ROOT" >"$WORK/wheel.log" 2>&1 ||
    { tail -20 "$WORK/wheel.log" >&2; die "the wheel did not build (pip wheel --no-deps .): see the lines above"; }
  echo "   $(basename "$WORK"/nvdash-*.whl) in $((SECONDS - t)) s"
fi
WHEEL_FILE=$(basename "$(ls "$WORK"/nvdash-*.whl)")
VERSION=${WHEEL_FILE#nvdash-}
VERSION=${VERSION%%-*}

# 2. The base root filesystem, as a tarball in the cache.
BASE_TAR=$CACHE/base-$SUITE.tar
BASE_IMAGE=localhost/nvdash-base:$SUITE
if [ "$REBUILD_BASE" = 1 ]; then
  rm -f "$BASE_TAR"
  buildah rmi "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if [ ! -s "$BASE_TAR" ]; then
  need debootstrap debootstrap
  mkdir -p "$CACHE"
  rootfs=$CACHE/rootfs-$SUITE.partial
  rm -rf "$rootfs"
  echo "== making the base: debootstrap --variant=minbase $SUITE from $MIRROR (a few minutes)"
  t=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$rootfs" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap of $SUITE from $MIRROR failed: see the lines above"; }
  # Debian's stable updates and security fixes, which debootstrap (the release's packages alone) leaves out.
  if [ "$SECURITY_MIRROR" != none ]; then
    {
      echo "deb $MIRROR $SUITE main"
      echo "deb $MIRROR $SUITE-updates main"
      echo "deb $SECURITY_MIRROR $SUITE-security main"
    } >"$rootfs/etc/apt/sources.list"
    { chroot "$rootfs" apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get upgrade -y -qq -o Dpkg::Options::=--force-confold; } \
      >"$WORK/upgrade.log" 2>&1 ||
      { tail -20 "$WORK/upgrade.log" >&2; die "apt-get upgrade of the base failed (no $SUITE-security at $SECURITY_MIRROR? \
give --security-mirror none): see the lines above"; }
    echo "   upgraded: $(grep -c '^Unpacking ' "$WORK/upgrade.log" || true) packages from $SUITE-updates and $SUITE-security"
  fi
  # What Debian's slim images leave out: documentation (but the copyright files), man pages, locales, apt's caches.
  find "$rootfs/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,info,locale}/* "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$BASE_TAR.partial" .
  mv "$BASE_TAR.partial" "$BASE_TAR"
  rm -rf "$rootfs"
  buildah rmi "$BASE_IMAGE" >/dev/null 2>&1 || true
  echo "   $BASE_TAR ($(du -m "$BASE_TAR" | cut -f1) MiB) in $((SECONDS - t)) s"
fi

if [ -n "$(find "$BASE_TAR" -mtime +7)" ]; then
  echo "   note: the base is $(( ($(date +%s) - $(stat -c %Y "$BASE_TAR")) / 86400 )) days old: --rebuild-base brings Debian's latest security fixes"
fi

# 3. The base image, imported from the tarball when it is not in buildah's storage yet.
if ! buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "== importing $BASE_IMAGE"
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$BASE_TAR" / >/dev/null
  buildah config --os linux --arch "$(buildah info --format '{{.host.arch}}')" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash \
    --label "org.opencontainers.image.description=Debian $SUITE minbase with python3, made by debootstrap" "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
fi

# 4. nvdash's dependencies, as wheels for the base's Python, fetched here by pip (with this machine's pip settings:
# index, proxy, certificates), so that the build itself needs no network.
ARCH=$(buildah info --format '{{.host.arch}}')
case "$ARCH" in
  amd64) PLATFORM=x86_64 ;;
  arm64) PLATFORM=aarch64 ;;
  *) PLATFORM=$ARCH ;;
esac
PY=$(tar -tf "$BASE_TAR" --wildcards './usr/bin/python3.*' 2>/dev/null | grep -Eo 'python3\.[0-9]+$' | sort -u) || true
PY=${PY%%$'\n'*}
[ -n "$PY" ] || die "no python3 in the base $BASE_TAR: make it again with --rebuild-base"
PY=${PY#python}
GLIBC=$(tar -xOf "$BASE_TAR" ./var/lib/dpkg/status | awk '/^Package: libc6$/ { p = 1 } p && /^Version:/ { print $2; p = 0 }') ||
  true
GLIBC=$(echo "$GLIBC" | grep -Eo '^[0-9]+\.[0-9]+' | tr . _) || true
[ -n "$GLIBC" ] || die "no libc6 in the base $BASE_TAR: make it again with --rebuild-base"
mkdir "$WORK/context"
cp "$WORK/$WHEEL_FILE" "$WORK/context/"
echo "== fetching nvdash's dependencies for Python $PY on $PLATFORM"
t=$SECONDS
"$PYTHON" -m pip download --quiet --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform "manylinux_${GLIBC}_$PLATFORM" --platform "manylinux2014_$PLATFORM" \
  -d "$WORK/context" "$WORK/context/${WHEEL_FILE}[kubernetes]" >"$WORK/download.log" 2>&1 ||
  { tail -20 "$WORK/download.log" >&2; die "pip download of nvdash's dependencies failed: see the lines above"; }
echo "   $(find "$WORK/context" -name '*.whl' | wc -l) wheels, $(du -sm "$WORK/context" | cut -f1) MiB in $((SECONDS - t)) s"

# 5. The image.
echo "== building $NAME:$VERSION from $BASE_IMAGE"
t=$SECONDS
cp "$CONTAINERFILE" "$WORK/Containerfile"
# (buildah images lists an image once per tag: the first line is the one wanted; no `head`, whose early exit
# would fail the pipeline under pipefail.)
OLD_ID=$(buildah images --quiet --no-trunc "localhost/$NAME:$VERSION" 2>/dev/null) || true
OLD_ID=${OLD_ID%%$'\n'*}
buildah build --quiet --pull=never --network none --build-arg "BASE=$BASE_IMAGE" --build-arg "VERSION=$VERSION" \
  --build-arg "PIP_OPTIONS=--no-index --find-links /tmp/wheels" \
  -f "$WORK/Containerfile" -t "$NAME:$VERSION" -t "$NAME:latest" "$WORK/context" >"$WORK/build.log" 2>&1 ||
  { tail -20 "$WORK/build.log" >&2; die "buildah build failed: see the lines above"; }
NEW_ID=$(buildah images --quiet --no-trunc "localhost/$NAME:$VERSION")
NEW_ID=${NEW_ID%%$'\n'*}
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
  # The image this one replaces, now untagged: removed, unless something else still uses it.
  buildah rmi "$OLD_ID" >/dev/null 2>&1 || true
fi
SIZE=$(buildah images --format '{{.Size}}' "localhost/$NAME:$VERSION")
SIZE=${SIZE%%$'\n'*}
echo "== $NAME:$VERSION built: $SIZE, image step $((SECONDS - t)) s, all $((SECONDS - START)) s"
