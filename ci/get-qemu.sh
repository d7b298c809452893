#!/usr/bin/env bash
# Prints the path of a qemu-system-x86_64 with vfio-user-pci on stdout: the tested release (TESTED_VERSION)
# unless a newer one is asked for explicitly.
#
#   ci/get-qemu.sh [--version X.Y.Z|newest] [--print-candidates]
#
#   --version V          the QEMU release to use (env RDMA_EMU_QEMU_VERSION; default TESTED_VERSION below).
#                        "newest" takes the newest release >= MIN_VERSION that Debian's sources offer and that
#                        downloads: untested, and qemu-patches/ may not apply to it.
#   --print-candidates   print the Debian source versions that would be tried, newest first, and exit
#
# Order: one on PATH; one cached earlier (keyed by version and qemu-patches/ hash); otherwise build Debian's
# source package of that release.
source "$(dirname "$0")/lib.sh"

# The release every run, fact sheet and patch of this project was checked with (docs/guest.md).
TESTED_VERSION=10.2.2
MIN_VERSION=10.1
PATCH_DIR="$REPO_ROOT/qemu-patches"

WANT=${RDMA_EMU_QEMU_VERSION:-$TESTED_VERSION} PRINT_CANDIDATES=0
while [ $# -gt 0 ]; do
    case "$1" in
        --version) [ $# -ge 2 ] || die "--version needs X.Y.Z or newest"; WANT=$2; shift 2 ;;
        --print-candidates) PRINT_CANDIDATES=1; shift ;;
        -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done
[[ $WANT =~ ^([0-9]+\.[0-9]+\.[0-9]+|newest)$ ]] || die "QEMU version \"$WANT\": give X.Y.Z or newest"
if [ "$WANT" != "$TESTED_VERSION" ]; then
    log "QEMU $WANT asked for; the tested release is $TESTED_VERSION"
fi

# The upstream release of a Debian version (1:10.2.2+ds-1 -> 10.2.2).
upstream_of() { local up=${1#*:}; up=${up%%+*}; echo "${up%%-*}"; }

# Whether an upstream release is the one wanted.
wanted() { # upstream
    if [ "$WANT" = newest ]; then version_ge "$1" "$MIN_VERSION"; else [ "$1" = "$WANT" ]; fi
}

qemu_qualifies() { # binary
    local bin=$1 ver
    [ -x "$bin" ] || return 1
    ver=$("$bin" --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
    [ -n "$ver" ] && wanted "$ver" || return 1
    # Captured first: with pipefail, `grep -q` closing the pipe early would fail the check on SIGPIPE.
    local devices
    devices=$("$bin" -nodefaults -machine none -device help 2>/dev/null) || return 1
    grep -q '"vfio-user-pci"' <<<"$devices"
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

# Debian source versions of the wanted release, newest first.
candidates() {
    apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: //p' | sort -u \
        | while read -r v; do wanted "$(upstream_of "$v")" && echo "$v"; done | sort -rV
}

if [ "$PRINT_CANDIDATES" = 1 ]; then
    apt_add_source rdma-emu-src.list "deb-src $(debian_mirror) sid main
deb-src $(debian_mirror) experimental main"
    apt_update_once
    candidates
    exit 0
fi

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
mapfile -t CANDIDATES < <(candidates)
if [ ${#CANDIDATES[@]} -eq 0 ]; then
    listed=$(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: //p' | sort -u | tr '\n' ' ')
    [ "$WANT" = newest ] && die "apt-cache showsrc qemu lists no version >= $MIN_VERSION (listed: ${listed:-none})"
    die "QEMU $WANT is not in Debian's source lists (listed: ${listed:-none}); RDMA_EMU_QEMU_VERSION=X.Y.Z or newest picks another, untested"
fi
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
[ -n "$VERSION" ] || die "no qemu source of $WANT could be downloaded (tried: ${CANDIDATES[*]})"
UPSTREAM=$(upstream_of "$VERSION")
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
# Whether the venv's meson is at least 1.5 (QEMU's configure needs it).
meson_ok() {
    local v
    v=$("$VENV/bin/meson" --version 2>/dev/null) || return 1
    [[ $v =~ ^([0-9]+)\.([0-9]+) ]] || return 1
    (( BASH_REMATCH[1] > 1 || (BASH_REMATCH[1] == 1 && BASH_REMATCH[2] >= 5) ))
}
if ! meson_ok; then
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
