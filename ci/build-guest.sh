#!/usr/bin/env bash
# Builds the test guest: Debian's bookworm-backports kernel plus a busybox initramfs holding the vfio modules,
# the stock hfi1 driver with its dependencies (for modprobe), ci/guest/init and (optionally) a static udriver
# and the hfi1-user test program. The kernel is only unpacked, never installed on the host.
#
#   ci/build-guest.sh [--udriver PATH] [--hfi1-user PATH] [--out DIR] [--refresh]
#
# Prints on stdout, one per line: KERNEL=<vmlinuz> INITRD=<initramfs.cpio.gz> KVER=<kernel release>.
# The kernel and busybox are cached under $CACHE_DIR/guest; only the cpio is rebuilt when its inputs change.
# Without --out, each distinct cpio lives in $CACHE_DIR/guest/out/<inputs hash>/ (the newest few are kept), so
# concurrent runs with different udrivers never overwrite each other's initramfs.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }

UDRIVER=""
HFI1_USER=""
OUT_DIR=""
REFRESH=0
while [ $# -gt 0 ]; do
    case "$1" in
        --udriver) [ $# -ge 2 ] || usage; UDRIVER=$2; shift 2 ;;
        --hfi1-user) [ $# -ge 2 ] || usage; HFI1_USER=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; OUT_DIR=$2; shift 2 ;;
        --refresh) REFRESH=1; shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done

# The modules the init loads at boot; their dependencies come from modules.dep.
GUEST_MODULES=(irqbypass vfio vfio_iommu_type1 vfio-pci-core vfio-pci)
# Kernel drivers the init loads later with modprobe (from /lib/modules/<release>, with a modules.dep).
KDRIVER_MODULES=(hfi1)
GUEST_DIR="$CACHE_DIR/guest"
INIT_SRC="$REPO_ROOT/ci/guest/init"
mkdir -p "$GUEST_DIR"
if [ -n "$OUT_DIR" ]; then mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd); fi

# One build at a time per cache: parallel runs share the kernel download and the cpio.
exec 9>"$GUEST_DIR/.lock"
flock -w 1800 9 || die "another ci/build-guest.sh held $GUEST_DIR/.lock for 30 minutes"

if [ -n "$UDRIVER" ]; then
    [ -f "$UDRIVER" ] && [ -x "$UDRIVER" ] || die "--udriver $UDRIVER is not an executable file"
    UDRIVER=$(cd "$(dirname "$UDRIVER")" && pwd)/$(basename "$UDRIVER")
fi
if [ -n "$HFI1_USER" ]; then
    [ -f "$HFI1_USER" ] && [ -x "$HFI1_USER" ] || die "--hfi1-user $HFI1_USER is not an executable file"
    HFI1_USER=$(cd "$(dirname "$HFI1_USER")" && pwd)/$(basename "$HFI1_USER")
fi
[ -f "$INIT_SRC" ] || die "missing $INIT_SRC"

# --- kernel -----------------------------------------------------------------------------------------------
# $GUEST_DIR/kernel-<package version>/: vmlinuz, release, modules/ (decompressed .ko), load-order,
# kdriver/<relative path> (decompressed .ko of $KDRIVER_MODULES and their dependencies), kdriver.rel, .complete
newest_cached_kernel() {
    local d
    for d in $(ls -d "$GUEST_DIR"/kernel-* 2>/dev/null | sort -rV); do
        # A cache entry from before the kernel drivers were added is not complete for this script.
        [ -e "$d/.complete" ] && [ -s "$d/kdriver.rel" ] && [ -e "$d/kdriver/modules.builtin" ] && { echo "$d"; return 0; }
    done
    return 1
}

# Prints the module names (as in modules.dep, relative paths) needed for the given modules, dependencies first.
# Depth-first walk over modules.dep; builtin modules are skipped, an unknown one is an error.
resolve_modules() { # moddir module...
    local dep=$1/modules.dep builtin=$1/modules.builtin
    shift
    awk -v wanted="$*" -v builtin_file="$builtin" '
        function norm(p,   b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.(xz|zst|gz))?$/, "", b); gsub(/-/, "_", b); return b }
        function visit(name,   i, n, parts) {
            if (name in done) return
            if (!(name in path)) { missing = missing " " name; return }
            done[name] = 1
            n = split(deps[name], parts, " ")
            for (i = 1; i <= n; i++) if (parts[i] != "") visit(norm(parts[i]))
            print path[name]
        }
        BEGIN {
            while ((getline line < builtin_file) > 0) isbuiltin[norm(line)] = 1
        }
        {
            file = $1; sub(/:$/, "", file)
            name = norm(file); path[name] = file
            d = ""; for (i = 2; i <= NF; i++) d = d " " $i
            deps[name] = d
        }
        END {
            n = split(wanted, w, " ")
            for (i = 1; i <= n; i++) {
                m = w[i]; gsub(/-/, "_", m)
                if (m in isbuiltin) continue
                visit(m)
            }
            if (missing != "") { print "missing modules:" missing > "/dev/stderr"; exit 1 }
        }' "$dep"
}

decompress_ko() { # src dst
    case "$1" in
        *.ko.xz) command -v xz >/dev/null || apt_install xz-utils; xz -dc "$1" >"$2" ;;
        *.ko.zst) command -v zstd >/dev/null || apt_install zstd; zstd -qdc "$1" >"$2" ;;
        *.ko.gz) gzip -dc "$1" >"$2" ;;
        *.ko) cp "$1" "$2" ;;
        *) die "unexpected module file $1" ;;
    esac
}

fetch_kernel() {
    local dep pkg pkg_ver dir
    dep=$(guest_kernel_package)
    pkg=${dep%%=*}; pkg_ver=${dep#*=}
    dir="$GUEST_DIR/kernel-$pkg_ver"
    if [ -e "$dir/.complete" ] && [ -s "$dir/kdriver.rel" ] && [ -e "$dir/kdriver/modules.builtin" ]; then
        echo "$dir"; return 0
    fi

    log "guest kernel $pkg $pkg_ver: downloading (about 100 MB)"
    local tmp="$GUEST_DIR/tmp-kernel"
    rm -rf "$tmp" "$dir"
    local deb
    deb=$(apt_fetch "$dep" "$tmp/deb")
    log "extracting $(basename "$deb")"
    dpkg-deb -x "$deb" "$tmp/root"
    local moddir kver
    moddir=$(ls -d "$tmp"/root/lib/modules/*/ "$tmp"/root/usr/lib/modules/*/ 2>/dev/null | head -n1)
    [ -n "$moddir" ] || die "$pkg has no /lib/modules/<release>"
    moddir=${moddir%/}
    kver=$(basename "$moddir")
    # The package leaves modules.dep to depmod at installation: generate it in the extracted tree.
    if [ ! -e "$moddir/modules.dep" ]; then
        local depmod
        depmod=$(PATH="$PATH:/usr/sbin:/sbin" command -v depmod || true)
        [ -n "$depmod" ] || { apt_install kmod; depmod=$(PATH="$PATH:/usr/sbin:/sbin" command -v depmod); }
        [ "${moddir#"$tmp/root/usr/"}" = "$moddir" ] || { mkdir -p "$tmp/root/lib"; ln -sfn ../usr/lib/modules "$tmp/root/lib/modules"; }
        "$depmod" -b "$tmp/root" "$kver" >&2 || die "depmod failed for $kver"
    fi
    [ -e "$moddir/modules.dep" ] || die "no modules.dep for $kver"
    local vmlinuz="$tmp/root/boot/vmlinuz-$kver"
    [ -e "$vmlinuz" ] || die "$pkg has no /boot/vmlinuz-$kver"

    mkdir -p "$dir.part/modules"
    cp "$vmlinuz" "$dir.part/vmlinuz"
    echo "$kver" >"$dir.part/release"
    echo "$pkg $pkg_ver" >"$dir.part/package"
    local rel out
    resolve_modules "$moddir" "${GUEST_MODULES[@]}" >"$dir.part/modules.rel" \
        || die "module resolution failed for ${GUEST_MODULES[*]}"
    : >"$dir.part/load-order"
    while read -r rel; do
        out=$(basename "$rel"); out=${out%.xz}; out=${out%.zst}; out=${out%.gz}
        decompress_ko "$moddir/$rel" "$dir.part/modules/$out"
        echo "$out" >>"$dir.part/load-order"
    done <"$dir.part/modules.rel"
    log "kernel $kver: modules $(tr '\n' ' ' <"$dir.part/load-order")"
    # The kernel drivers keep their tree layout: the guest's modprobe finds them through modules.dep.
    resolve_modules "$moddir" "${KDRIVER_MODULES[@]}" >"$dir.part/kdriver.rel.tmp" \
        || die "module resolution failed for ${KDRIVER_MODULES[*]}"
    : >"$dir.part/kdriver.rel"
    while read -r rel; do
        out=${rel%.xz}; out=${out%.zst}; out=${out%.gz}
        mkdir -p "$dir.part/kdriver/$(dirname "$out")"
        decompress_ko "$moddir/$rel" "$dir.part/kdriver/$out"
        echo "$out" >>"$dir.part/kdriver.rel"
    done <"$dir.part/kdriver.rel.tmp"
    rm -f "$dir.part/kdriver.rel.tmp"
    # depmod and modprobe in the guest want these next to modules.dep.
    cp "$moddir/modules.builtin" "$moddir/modules.builtin.modinfo" "$dir.part/kdriver/"
    cp "$dir.part/kdriver.rel" "$dir.part/kdriver/modules.order"
    log "kernel $kver: kernel drivers $(sed 's|.*/||' "$dir.part/kdriver.rel" | tr '\n' ' ')"
    touch "$dir.part/.complete"
    mv "$dir.part" "$dir"
    rm -rf "$tmp"
    echo "$dir"
}

# --- busybox ----------------------------------------------------------------------------------------------
fetch_busybox() {
    local dir
    if [ "$REFRESH" = 0 ]; then
        dir=$(ls -d "$GUEST_DIR"/busybox-*/ 2>/dev/null | sort -rV | head -n1)
        dir=${dir%/}
        if [ -n "$dir" ] && [ -x "$dir/busybox" ]; then echo "$dir"; return 0; fi
    fi
    apt_update_once
    local ver
    ver=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')
    [ -n "$ver" ] && [ "$ver" != "(none)" ] || die "no busybox-static package available"
    dir="$GUEST_DIR/busybox-${ver//:/_}"
    if [ -x "$dir/busybox" ]; then echo "$dir"; return 0; fi
    log "downloading busybox-static $ver"
    local tmp="$GUEST_DIR/tmp-busybox" deb
    rm -rf "$tmp"
    deb=$(apt_fetch "busybox-static=$ver" "$tmp/deb")
    dpkg-deb -x "$deb" "$tmp/root"
    [ -x "$tmp/root/bin/busybox" ] || die "busybox-static has no /bin/busybox"
    mkdir -p "$dir.part"
    cp "$tmp/root/bin/busybox" "$dir.part/busybox"
    echo "$ver" >"$dir.part/version"
    rm -rf "$dir" && mv "$dir.part" "$dir"
    rm -rf "$tmp"
    echo "$dir"
}

# --- cpio -------------------------------------------------------------------------------------------------
CPIO=()
pick_cpio() { # busybox
    if ! command -v cpio >/dev/null; then
        apt_install cpio || true
    fi
    if command -v cpio >/dev/null; then CPIO=(cpio --quiet -o -H newc -R 0:0); else CPIO=("$1" cpio -o -H newc -R 0:0); fi
}

udriver_is_static() { # path
    if command -v readelf >/dev/null; then
        ! readelf -lW "$1" 2>/dev/null | grep -q 'Requesting program interpreter'
    else
        ! grep -qa '/lib64/ld-linux' "$1"
    fi
}

if [ "$REFRESH" = 0 ] && KDIR=$(newest_cached_kernel); then
    :
else
    KDIR=$(fetch_kernel)
fi
BBDIR=$(fetch_busybox)
KVER=$(cat "$KDIR/release")

if [ -n "$UDRIVER" ]; then
    udriver_is_static "$UDRIVER" || die "$UDRIVER is dynamically linked; build it with -C target-feature=+crt-static"
    UDRIVER_SUM=$(sha256sum "$UDRIVER" | cut -c1-64)
else
    UDRIVER_SUM=none
    log "no --udriver given: the guest will boot and report that udriver is missing"
fi
if [ -n "$HFI1_USER" ]; then
    udriver_is_static "$HFI1_USER" || die "$HFI1_USER is dynamically linked; build it with -C target-feature=+crt-static"
    HFI1_USER_SUM=$(sha256sum "$HFI1_USER" | cut -c1-64)
else
    HFI1_USER_SUM=none
fi

# Everything the cpio depends on; identical inputs mean the existing cpio is reused.
INPUTS=$({
    echo "format 2"
    echo "kernel $(cat "$KDIR/package")"
    echo "busybox $(cat "$BBDIR/version")"
    echo "init $(sha256sum <"$INIT_SRC" | cut -c1-64)"
    echo "udriver $UDRIVER_SUM"
    echo "hfi1-user $HFI1_USER_SUM"
    (cd "$KDIR/modules" && xargs sha256sum <"$KDIR/load-order")
    (cd "$KDIR/kdriver" && xargs sha256sum <"$KDIR/kdriver.rel")
})
if [ -z "$OUT_DIR" ]; then
    OUT_DIR="$GUEST_DIR/out/$(printf '%s\n' "$INPUTS" | sha256sum | cut -c1-16)"
    mkdir -p "$OUT_DIR"
    touch "$OUT_DIR"
    # Keep the 4 most recently used initramfs variants.
    ls -dt "$GUEST_DIR"/out/*/ 2>/dev/null | tail -n +5 | xargs -r rm -rf
    VMLINUZ="$KDIR/vmlinuz"
else
    VMLINUZ="$OUT_DIR/vmlinuz"
    if ! cmp -s "$KDIR/vmlinuz" "$VMLINUZ" 2>/dev/null; then
        cp "$KDIR/vmlinuz" "$VMLINUZ.tmp" && mv "$VMLINUZ.tmp" "$VMLINUZ"
    fi
fi
INITRD="$OUT_DIR/initramfs.cpio.gz"
if [ -e "$INITRD" ] && [ -e "$OUT_DIR/inputs" ] && [ "$(cat "$OUT_DIR/inputs")" = "$INPUTS" ]; then
    log "guest up to date: $INITRD"
else
    log "assembling the initramfs (kernel $KVER, udriver: ${UDRIVER:-none})"
    pick_cpio "$BBDIR/busybox"
    STAGE=$(mktemp -d "$OUT_DIR/stage.XXXXXX")
    trap 'rm -rf "$STAGE"' EXIT
    mkdir -p "$STAGE"/{bin,dev,proc,sys,tmp,etc,root,lib/modules}
    cp "$BBDIR/busybox" "$STAGE/bin/busybox"
    for applet in $("$BBDIR/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$STAGE/bin/$applet"
    done
    cp "$KDIR"/modules/*.ko "$STAGE/lib/modules/"
    cp "$KDIR/load-order" "$STAGE/lib/modules/load-order"
    while read -r rel; do
        mkdir -p "$STAGE/lib/modules/$KVER/$(dirname "$rel")"
        cp "$KDIR/kdriver/$rel" "$STAGE/lib/modules/$KVER/$rel"
    done <"$KDIR/kdriver.rel"
    cp "$KDIR"/kdriver/modules.{builtin,builtin.modinfo,order} "$STAGE/lib/modules/$KVER/"
    depmod=$(PATH="$PATH:/usr/sbin:/sbin" command -v depmod || true)
    [ -n "$depmod" ] || { apt_install kmod; depmod=$(PATH="$PATH:/usr/sbin:/sbin" command -v depmod); }
    "$depmod" -b "$STAGE" "$KVER" || die "depmod failed for the guest's kernel drivers"
    install -m 0755 "$INIT_SRC" "$STAGE/init"
    [ -n "$UDRIVER" ] && install -m 0755 "$UDRIVER" "$STAGE/bin/udriver"
    [ -n "$HFI1_USER" ] && install -m 0755 "$HFI1_USER" "$STAGE/bin/hfi1-user"
    cat >"$STAGE/etc/rdma-emu-guest" <<EOF
kernel=$(cat "$KDIR/package")
busybox=$(cat "$BBDIR/version")
udriver_sha256=$UDRIVER_SUM
hfi1_user_sha256=$HFI1_USER_SUM
EOF
    (cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | "${CPIO[@]}") | gzip -6n >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    printf '%s\n' "$INPUTS" >"$OUT_DIR/inputs"
    log "wrote $INITRD ($(du -h "$INITRD" | cut -f1))"
fi
echo "KERNEL=$VMLINUZ"
echo "INITRD=$INITRD"
echo "KVER=$KVER"
