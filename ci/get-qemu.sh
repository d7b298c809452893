#!/usr/bin/env bash
# Prints the path of a qemu-system-x86_64 (>= 10.1, with vfio-user-pci) on stdout.
# Order: one on PATH; one cached earlier (keyed by version and qemu-patches/ hash);
# otherwise build Debian's source package of the newest version >= 10.1 that downloads.
source "$(dirname "$0")/lib.sh"

MIN_VERSION=10.1
PATCH_DIR="$REPO_ROOT/qemu-patches"

qemu_qualifies() { # binary
    local bin=$1 ver
    [ -x "$bin" ] || return 1
    ver=$("$bin" --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
    [ -n "$ver" ] && version_ge "$ver" "$MIN_VERSION" || return 1
    "$bin" -nodefaults -machine none -device help 2>/dev/null | grep -q '"vfio-user-pci"'
}

install_firmware() {
    # Without linuxboot_dma.bin a -kernel boot hangs silently.
    apt_install seabios qemu-system-data ipxe-qemu
    [ -e /usr/share/qemu/linuxboot_dma.bin ] || [ -e /usr/share/seabios/linuxboot_dma.bin ] \
        || die "linuxboot_dma.bin is missing after installing the firmware packages"
}

patch_hash() {
    if compgen -G "$PATCH_DIR/*.patch" >/dev/null; then
        cat "$PATCH_DIR"/*.patch | sha256sum | cut -c1-12
    else
        echo nopatch
    fi
}

# 1. A qualifying QEMU on PATH, unless the project carries patches it must have.
if [ "$(patch_hash)" = nopatch ] && bin=$(command -v qemu-system-x86_64) && qemu_qualifies "$bin"; then
    install_firmware
    log "using $bin from PATH"
    echo "$bin"; exit 0
fi

# 2. A cached build for any qualifying version with the same patches.
PHASH=$(patch_hash)
for dir in $(ls -d "$CACHE_DIR"/qemu/*-"$PHASH" 2>/dev/null | sort -rV); do
    if qemu_qualifies "$dir/qemu-system-x86_64"; then
        install_firmware
        log "using cached $dir/qemu-system-x86_64"
        echo "$dir/qemu-system-x86_64"; exit 0
    fi
done

# 3. Build from Debian's source package.
log "no QEMU >= $MIN_VERSION with vfio-user-pci found: building one from Debian's source package"
MIRROR=$(debian_mirror)
apt_add_source rdma-emu-src.list "deb-src $MIRROR sid main
deb-src $MIRROR experimental main"
apt_install dpkg-dev ninja-build pkg-config libglib2.0-dev libpixman-1-dev zlib1g-dev flex bison \
    python3-venv gcc make patch xz-utils
install_firmware
apt_update_once

SRC_ROOT="$CACHE_DIR/qemu-src"
mkdir -p "$SRC_ROOT"
cd "$SRC_ROOT"
mapfile -t CANDIDATES < <(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: //p' | sort -u \
    | while read -r v; do up=${v#*:}; up=${up%%+*}; up=${up%%-*}; version_ge "$up" "$MIN_VERSION" && echo "$v"; done \
    | sort -rV)
[ ${#CANDIDATES[@]} -gt 0 ] || die "apt-cache showsrc qemu lists no version >= $MIN_VERSION"
VERSION=""
for v in "${CANDIDATES[@]}"; do
    d=${v//:/_}  # meson refuses a source path with a colon (the epoch)
    if compgen -G "$SRC_ROOT/$d/*.dsc" >/dev/null; then
        VERSION=$v; break
    fi
    log "trying apt-get source --download-only qemu=$v"
    rm -rf "$SRC_ROOT/$d" && mkdir -p "$SRC_ROOT/$d"
    if (cd "$SRC_ROOT/$d" && timeout 900 apt-get source --download-only -qq "qemu=$v" >&2); then
        VERSION=$v; break
    fi
    rm -rf "$SRC_ROOT/$d"
    log "qemu=$v did not download; trying an older one"
done
[ -n "$VERSION" ] || die "no qemu source >= $MIN_VERSION could be downloaded (tried: ${CANDIDATES[*]})"
UPSTREAM=${VERSION#*:}; UPSTREAM=${UPSTREAM%%+*}; UPSTREAM=${UPSTREAM%%-*}
# One source tree per set of patches, unpacked from the downloaded package (Debian's own patches applied).
SRC="$SRC_ROOT/${VERSION//:/_}/src-$PHASH"
if [ ! -e "$SRC/.rdma-emu-patched" ]; then
    rm -rf "$SRC"
    log "unpacking qemu $VERSION"
    (cd "$SRC_ROOT/${VERSION//:/_}" && dpkg-source -x --no-check ./*.dsc "$SRC" >&2)
    for p in "$PATCH_DIR"/*.patch; do
        [ -e "$p" ] || continue
        log "applying $(basename "$p")"
        patch -d "$SRC" -p1 --forward < "$p" >&2
    done
    touch "$SRC/.rdma-emu-patched"
fi
log "building QEMU $VERSION in $SRC"

VENV="$CACHE_DIR/venv"
if ! "$VENV/bin/python3" -c 'import mesonbuild, sys; from mesonbuild import coredata as c; v=tuple(map(int,c.version.split(".")[:2])); sys.exit(v < (1,5))' 2>/dev/null; then
    log "installing meson >= 1.5 into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q 'meson>=1.5' >&2
fi

cd "$SRC"
mkdir -p build && cd build
if [ ! -e build.ninja ]; then
    ../configure --python="$VENV/bin/python3" --target-list=x86_64-softmmu --without-default-features \
        --enable-kvm --disable-download --disable-install-blobs \
        --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu >&2
fi
log "ninja qemu-system-x86_64 (about 5 minutes on 2 cores)"
PATH="$VENV/bin:$PATH" ninja qemu-system-x86_64 >&2

OUT="$CACHE_DIR/qemu/$UPSTREAM-$PHASH"
mkdir -p "$OUT"
cp qemu-system-x86_64 "$OUT/qemu-system-x86_64.tmp" && mv "$OUT/qemu-system-x86_64.tmp" "$OUT/qemu-system-x86_64"
qemu_qualifies "$OUT/qemu-system-x86_64" || die "the built QEMU does not offer vfio-user-pci"
log "cached $OUT/qemu-system-x86_64"
echo "$OUT/qemu-system-x86_64"
