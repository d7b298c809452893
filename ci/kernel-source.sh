#!/usr/bin/env bash
# Fetches the Linux source the kernel-conformance harness compiles: Debian's linux-source-<series> at
# exactly the guest kernel's package version, and caches the driver directories it needs outside the repo.
#
#   ci/kernel-source.sh [--print-version]
#
# The version is the guest kernel's: the one ci/build-guest.sh cached (its recorded package version), else
# the one it would fetch (bookworm-backports' linux-image-amd64). Prints, on stdout, the extracted tree's
# path (export it as RDMA_EMU_KERNEL_SRC; testing/kernel-conformance/build.rs also finds it at the default cache
# path, $CACHE_DIR/kernel-source/current). Next to the tree, `version` records "linux-source-X VERSION".
# KERNEL_SOURCE_DEB=FILE uses an already downloaded .deb, if its package and version are the right ones.
source "$(dirname "$0")/lib.sh"

PRINT_VERSION=0
case "${1:-}" in
    --print-version) PRINT_VERSION=1 ;;
    "") ;;
    -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
    *) die "unknown argument $1" ;;
esac

SRC_CACHE="$CACHE_DIR/kernel-source"
mkdir -p "$SRC_CACHE"
# What the harness compiles (irdma) and reads for the hfi1 comparison (hfi1).
WANTED=(drivers/infiniband/hw/irdma drivers/infiniband/hw/hfi1)

exec 9>"$SRC_CACHE/.lock"
flock -w 1800 9 || die "another ci/kernel-source.sh held $SRC_CACHE/.lock for 30 minutes"

# The guest kernel's image package and version.
image_pkg="" image_ver=""
for d in $(ls -d "$CACHE_DIR"/guest/kernel-* 2>/dev/null | sort -rV); do
    if [ -e "$d/.complete" ] && [ -s "$d/package" ]; then
        read -r image_pkg image_ver <"$d/package"
        break
    fi
done
if [ -z "$image_ver" ]; then
    dep=$(guest_kernel_package)
    image_pkg=${dep%%=*} image_ver=${dep#*=}
fi
# linux-image-6.12.95+deb12-amd64 -> series 6.12 -> source package linux-source-6.12.
series=$(printf '%s\n' "$image_pkg" | sed -n 's/^linux-image-\([0-9]*\.[0-9]*\)\..*/\1/p')
[ -n "$series" ] || die "cannot tell the kernel series from the guest kernel package '$image_pkg'"
src_pkg="linux-source-$series"
[ "$PRINT_VERSION" = 1 ] && { echo "$src_pkg $image_ver"; exit 0; }

dir="$SRC_CACHE/${image_ver//[:~]/_}"
tree="$dir/$src_pkg"
if [ ! -e "$dir/.complete" ]; then
    log "kernel source: $src_pkg $image_ver (the guest kernel $image_pkg)"
    tmp="$SRC_CACHE/tmp"
    rm -rf "$tmp" "$dir"
    mkdir -p "$tmp"
    if [ -n "${KERNEL_SOURCE_DEB:-}" ]; then
        deb=$KERNEL_SOURCE_DEB
        got="$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"
        [ "$got" = "$src_pkg $image_ver" ] || die "KERNEL_SOURCE_DEB is $got, not $src_pkg $image_ver"
    else
        ensure_backports
        apt-cache madison "$src_pkg" | awk -F'|' '{gsub(/ /, "", $2); print $2}' | grep -qxF "$image_ver" ||
            die "no $src_pkg=$image_ver in the apt sources (apt-cache madison $src_pkg); the harness needs \
the source of exactly the guest kernel"
        log "downloading $src_pkg=$image_ver (about 150 MB)"
        deb=$(apt_fetch "$src_pkg=$image_ver" "$tmp/deb")
    fi
    dpkg-deb -x "$deb" "$tmp/root"
    tarball=$(ls "$tmp"/root/usr/src/linux-source-*.tar.* 2>/dev/null | head -n1)
    [ -n "$tarball" ] || die "$src_pkg has no /usr/src/linux-source-*.tar.*"
    command -v xz >/dev/null || apt_install xz-utils
    top=$(basename "$tarball"); top=${top%%.tar.*}
    log "extracting ${WANTED[*]} from $(basename "$tarball")"
    mkdir -p "$dir.part"
    tar -C "$dir.part" -xf "$tarball" "${WANTED[@]/#/$top/}" || die "extracting from $tarball failed"
    [ -e "$dir.part/$top/drivers/infiniband/hw/irdma/ctrl.c" ] || die "$tarball has no irdma ctrl.c"
    [ "$top" = "$src_pkg" ] || mv "$dir.part/$top" "$dir.part/$src_pkg"
    echo "$src_pkg $image_ver" >"$dir.part/version"
    touch "$dir.part/.complete"
    mv "$dir.part" "$dir"
    rm -rf "$tmp"
fi
ln -sfn "$tree" "$SRC_CACHE/current.tmp" && mv -T "$SRC_CACHE/current.tmp" "$SRC_CACHE/current"
log "kernel source $(cat "$dir/version"): $tree"
echo "$tree"
