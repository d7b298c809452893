#!/usr/bin/env bash
# Builds the test guest: Debian's bookworm-backports kernel plus a busybox initramfs holding the vfio modules,
# the stock hfi1 driver with its dependencies and the verbs/MAD modules (for modprobe), the fabric userland
# (glibc, rdma-core with the hfi1 provider, opa-fm's sm, opa-basic-tools, perftest; Debian packages pinned in
# ci/guest/packages.lock), ci/guest/init with its perftest step (ci/guest/perf.sh), (optionally) a static
# udriver and the hfi1-user test program, and the emulated chip's 8051 firmware in /lib/firmware (--firmware,
# by default what ci/build.sh writes to target/rdma-emu/hfi_dc8051.bin, when it is there).
# Nothing is installed on the host: the packages are only unpacked.
#
#   ci/build-guest.sh [--udriver PATH] [--hfi1-user PATH] [--firmware FILE] [--out DIR] [--refresh]
#   ci/build-guest.sh --refresh-pins
#
# Prints on stdout, one per line: KERNEL=<vmlinuz> INITRD=<initramfs.cpio.gz> KVER=<kernel release> and
# INITRD_PSM2=<the initramfs with the psm2 layer appended>.
# The kernel, busybox and the unpacked userland are cached under $CACHE_DIR/guest; only the cpio is rebuilt
# when its inputs change. Without --out, each distinct cpio lives in $CACHE_DIR/guest/out/<inputs hash>/ (the
# newest few are kept), so concurrent runs with different udrivers never overwrite each other's initramfs.
# --refresh-pins rewrites ci/guest/packages.lock to the newest versions bookworm (with -updates and -security)
# offers now, prints what changed and exits.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }

UDRIVER=""
HFI1_USER=""
FIRMWARE="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu/hfi_dc8051.bin"
FIRMWARE_SET=0
OUT_DIR=""
REFRESH=0
REFRESH_PINS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --udriver) [ $# -ge 2 ] || usage; UDRIVER=$2; shift 2 ;;
        --hfi1-user) [ $# -ge 2 ] || usage; HFI1_USER=$2; shift 2 ;;
        --firmware) [ $# -ge 2 ] || usage; FIRMWARE=$2; FIRMWARE_SET=1; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; OUT_DIR=$2; shift 2 ;;
        --refresh) REFRESH=1; shift ;;
        --refresh-pins) REFRESH_PINS=1; shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done

# The modules the init loads at boot; their dependencies come from modules.dep.
GUEST_MODULES=(irqbypass vfio vfio_iommu_type1 vfio-pci-core vfio-pci)
# Kernel drivers the init loads later with modprobe (from /lib/modules/<release>, with a modules.dep): the stock
# hfi1 driver, the verbs and MAD character devices the userland opens (/dev/infiniband/uverbsN, umadN, issmN),
# and SoftRoCE over a veth pair (the verbs baseline of the benchmarks) with the crypto API's crc32 for its ICRC
# (nothing in the guest loads that one on demand).
KDRIVER_MODULES=(hfi1 ib_uverbs ib_umad rdma_rxe veth crc32_generic)
GUEST_DIR="$CACHE_DIR/guest"
INIT_SRC="$REPO_ROOT/ci/guest/init"
PERF_SRC="$REPO_ROOT/ci/guest/perf.sh" # the init's perftest step, sourced from /lib/rdma-emu/perf.sh
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
[ -f "$INIT_SRC" ] && [ -f "$PERF_SRC" ] || die "missing $INIT_SRC or $PERF_SRC"
if [ -f "$FIRMWARE" ]; then
    FIRMWARE_SUM=$(sha256sum "$FIRMWARE" | cut -c1-64)
elif [ "$FIRMWARE_SET" = 1 ]; then
    die "--firmware $FIRMWARE is not a file"
else
    log "no $FIRMWARE: the guest has no 8051 firmware (a chip with --hfi1-wfr-icode rtl-simulation will not probe)"
    FIRMWARE="" FIRMWARE_SUM=none
fi

# --- kernel -----------------------------------------------------------------------------------------------
# $GUEST_DIR/kernel-<package version>/: vmlinuz, release, modules/ (decompressed .ko), load-order,
# kdriver/<relative path> (decompressed .ko of $KDRIVER_MODULES and their dependencies), kdriver.rel, .complete
# kdriver.wanted lists the modules an entry was resolved for: an entry made for fewer drivers than
# $KDRIVER_MODULES (by an older script) is not complete for this one.
kernel_complete() { # dir
    local m
    [ -e "$1/.complete" ] && [ -s "$1/kdriver.rel" ] && [ -e "$1/kdriver/modules.builtin" ] && [ -s "$1/kdriver.wanted" ] \
        || return 1
    for m in "${KDRIVER_MODULES[@]}"; do grep -qxF "$m" "$1/kdriver.wanted" || return 1; done
}

newest_cached_kernel() {
    local d
    for d in $(ls -d "$GUEST_DIR"/kernel-* 2>/dev/null | sort -rV); do
        kernel_complete "$d" && { echo "$d"; return 0; }
    done
    return 1
}

# PKG=VERSION of the newest cached kernel, complete or not: an entry that lacks drivers is extracted again
# from the same package version, so the guest kernel (and ci/kernel-source.sh's source) stays the same.
newest_cached_kernel_package() {
    local d pkg ver
    for d in $(ls -d "$GUEST_DIR"/kernel-* 2>/dev/null | sort -rV); do
        [ -s "$d/package" ] && read -r pkg ver <"$d/package" && { echo "$pkg=$ver"; return 0; }
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

fetch_kernel() { # [PKG=VERSION: this one if apt still offers it; default the newest in bookworm-backports]
    local dep="${1:-}" pkg pkg_ver dir
    if [ -n "$dep" ]; then
        ensure_backports
        if ! apt_offers "${dep%%=*}" "${dep#*=}"; then
            log "the cached kernel $dep is no longer offered by apt: taking the newest"
            dep=""
        fi
    fi
    [ -n "$dep" ] || dep=$(guest_kernel_package)
    pkg=${dep%%=*}; pkg_ver=${dep#*=}
    dir="$GUEST_DIR/kernel-$pkg_ver"
    if kernel_complete "$dir"; then
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
    printf '%s\n' "${KDRIVER_MODULES[@]}" >"$dir.part/kdriver.wanted"
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

# --- userland (ci/guest/packages.lock) ---------------------------------------------------------------------
LOCK="$REPO_ROOT/ci/guest/packages.lock"
# Programs the initramfs gets, as packaged; the libraries they need follow from ci/guest/elf-closure.sh.
USERLAND_PROGRAMS=(
    usr/lib/opa-fm/runtime/sm                                        # opa-fm: the subnet manager
    usr/lib/opa-fm/bin/fm_cmd                                        # opa-fm: queries a running sm (opafmcmd)
    usr/sbin/opainfo usr/sbin/opasmaquery usr/sbin/opasaquery usr/sbin/opaportinfo  # opa-basic-tools
    usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ibv_asyncwatch   # ibverbs-utils
    usr/bin/ibv_rc_pingpong usr/bin/ibv_uc_pingpong usr/bin/ibv_ud_pingpong usr/bin/ibv_srq_pingpong usr/bin/ibv_xsrq_pingpong
    usr/bin/ib_send_bw usr/bin/ib_send_lat usr/bin/ib_write_bw usr/bin/ib_write_lat  # perftest
    usr/bin/ib_read_bw usr/bin/ib_read_lat usr/bin/ib_atomic_bw usr/bin/ib_atomic_lat
    usr/bin/rdma                                                     # iproute2
)
# Loaded with dlopen, so in nobody's DT_NEEDED; their own libraries are followed all the same.
USERLAND_DLOPEN=(
    usr/lib/x86_64-linux-gnu/libibverbs/libhfi1verbs-rdmav34.so      # libibverbs' provider for hfi1_N
    usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so            # and for SoftRoCE (rxeN)
    lib/x86_64-linux-gnu/libgcc_s.so.1                               # glibc's pthread_cancel/_exit, backtrace
)
# Other packaged files, copied as they are (symlinks stay symlinks).
USERLAND_FILES=(
    etc/libibverbs.d/hfi1verbs.driver etc/libibverbs.d/rxe.driver    # which provider serves which device
    usr/sbin/opafmcmd usr/sbin/opapmaquery usr/sbin/opaportconfig    # -> fm_cmd, opasmaquery, opaportinfo
)
# Directories opa-fm's sm writes to: its control socket and state, its core dumps (CoreDumpDir), its log.
USERLAND_DIRS=(var/run var/lib/opa-fm var/crash/opafm var/log etc/opa-fm root)

# The psm2 layer: the OPA userspace stack (PSM2, libfabric, Open MPI) and mpi-check, a second cpio appended to
# the initramfs (the kernel unpacks both) for the runs that use it, so the others boot the smaller one.
PSM2_PROGRAMS=(usr/bin/orterun usr/bin/orted usr/bin/ompi_info usr/bin/fi_info usr/bin/fi_pingpong)
# Loaded with dlopen: every component Open MPI and PMIx ship, and libfabric's libpsm_infinipath.so.1 (the name
# Debian's alternatives give libpsm-infinipath1's library; the layer makes the link).
PSM2_COMPONENT_DIRS=(usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 usr/lib/x86_64-linux-gnu/pmix2/lib/pmix)
PSM2_INFINIPATH=usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1
PSM2_INFINIPATH_TARGET=/usr/lib/libpsm1/libpsm_infinipath.so.1.16
# Open MPI's help texts and default MCA parameters.
PSM2_DATA_DIRS=(usr/share/openmpi etc/openmpi)

# The pins, "package=version" per line, comments and blank lines dropped.
read_pins() {
    [ -f "$LOCK" ] || die "missing $LOCK"
    sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$LOCK" | while IFS= read -r line; do
        [[ $line =~ ^[a-z0-9][a-z0-9.+-]+=[A-Za-z0-9.+:~-]+$ ]] || die "$LOCK: '$line' is not package=version"
        echo "$line"
    done
}

# The newest version of PKG in bookworm, bookworm-updates or bookworm-security (not backports), by apt's lists.
bookworm_version() { # pkg
    local v best=""
    while read -r v; do
        if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
    done < <(apt-cache madison "$1" | awk -F'|' '$3 ~ / bookworm(-updates|-security)?\/[a-z-]+ [a-z0-9]+ Packages/ {
        gsub(/ /, "", $2); print $2 }')
    echo "$best"
}

# Whether apt's lists offer exactly this version (apt-cache show PKG=VER succeeds, silently, when they do not).
apt_offers() { # pkg version
    apt-cache madison "$1" | awk -F'|' -v v="$2" '$3 ~ / Packages$/ { gsub(/ /, "", $2); if ($2 == v) found = 1 }
        END { exit !found }'
}

refresh_pins() {
    rm -f "$APT_UPDATED_STAMP"
    apt_update_once
    local pins tmp pin pkg old new changed=0
    pins=$(read_pins) || exit 1
    tmp=$(mktemp "$LOCK.XXXXXX")
    cp "$LOCK" "$tmp"
    for pin in $pins; do
        pkg=${pin%%=*} old=${pin#*=}
        new=$(bookworm_version "$pkg")
        [ -n "$new" ] || { rm -f "$tmp"; die "apt offers no $pkg in bookworm (apt-cache madison $pkg)"; }
        [ "$new" = "$old" ] && continue
        # Only the version of that pin's line changes; comments and order stay.
        PKG=$pkg NEW=$new awk '{ split($0, kv, "="); if (kv[1] == ENVIRON["PKG"] && $0 !~ /^#/) print ENVIRON["PKG"] "=" ENVIRON["NEW"]; else print }' \
            "$tmp" >"$tmp.new" && mv "$tmp.new" "$tmp"
        log "$pkg: $old -> $new"
        changed=$((changed + 1))
    done
    mv "$tmp" "$LOCK"
    log "$changed pin(s) changed in $LOCK (git diff ci/guest/packages.lock)"
}

# $GUEST_DIR/userland-<hash of the pins>/: root/ (every pinned package unpacked, without docs, manuals and
# locales), pins, .complete. Prints the directory.
fetch_userland() {
    local pins key dir
    pins=$(read_pins) || exit 1
    key=$(printf '%s\n' "$pins" | sha256sum | cut -c1-16)
    dir="$GUEST_DIR/userland-$key"
    if [ -e "$dir/.complete" ]; then touch "$dir"; echo "$dir"; return 0; fi

    log "guest userland: checking and downloading $(printf '%s\n' "$pins" | wc -l) pinned packages"
    apt_update_once
    local pin missing=() retried=0
    while :; do
        missing=()
        for pin in $pins; do
            apt_offers "${pin%%=*}" "${pin#*=}" || missing+=("$pin")
        done
        [ ${#missing[@]} -eq 0 ] || [ "$retried" = 1 ] || { rm -f "$APT_UPDATED_STAMP"; apt_update_once; retried=1; continue; }
        break
    done
    if [ ${#missing[@]} -ne 0 ]; then
        for pin in "${missing[@]}"; do
            log "not downloadable: $pin (apt offers: $(apt-cache madison "${pin%%=*}" | awk -F'|' '/Packages/ { gsub(/ /, "", $2); printf "%s ", $2 }'))"
        done
        die "ci/guest/packages.lock pins ${#missing[@]} version(s) the apt sources no longer offer (${missing[*]}): \
Debian keeps only the newest version of a package per suite. Refresh the pins with 'ci/build-guest.sh --refresh-pins', \
check the diff of ci/guest/packages.lock and boot the guest (ci/e2e.sh)"
    fi
    local tmp="$GUEST_DIR/tmp-userland" deb pkg ver
    rm -rf "$tmp" "$dir.part"
    mkdir -p "$tmp/deb" "$dir.part/root"
    # shellcheck disable=SC2086 # one word per pin
    (cd "$tmp/deb" && timeout 1800 apt-get download -q "${APT_DL_OPTS[@]}" $pins >&2) \
        || die "apt-get download of the pinned packages failed"
    for pin in $pins; do
        pkg=${pin%%=*} ver=${pin#*=}
        # apt names the file package_version-without-epoch_arch.deb, with ':' escaped as %3a.
        deb=$(ls "$tmp/deb/${pkg}_"*.deb 2>/dev/null | head -n1)
        [ -n "$deb" ] || die "apt-get download left no .deb for $pin"
        [ "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" = "$pkg $ver" ] \
            || die "$deb is $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version), not $pkg $ver"
        dpkg-deb -x "$deb" "$dir.part/root"
    done
    rm -rf "$dir.part"/root/usr/share/{doc,man,info,locale,lintian,bug}
    printf '%s\n' "$pins" >"$dir.part/pins"
    touch "$dir.part/.complete"
    rm -rf "$dir"
    mv "$dir.part" "$dir"
    rm -rf "$tmp"
    # Keep the 3 most recently used userlands (worktrees may pin different versions).
    ls -dt "$GUEST_DIR"/userland-*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
    log "guest userland unpacked in $dir ($(du -sh "$dir/root" | cut -f1))"
    echo "$dir"
}

# Copies the userland into the stage: the programs, their library closure, the other files, opa-fm's edited
# configuration (checked with opa-fm's own config_check), the directories the sm writes to and
# ci/guest/rootfs/ (hosts, nsswitch.conf, passwd, group, profile).
stage_userland() { # userland-dir stage
    local root=$1/root stage=$2 p closure
    command -v readelf >/dev/null || apt_install binutils
    closure=$(bash "$REPO_ROOT/ci/guest/elf-closure.sh" "$root" "${USERLAND_PROGRAMS[@]}" "${USERLAND_DLOPEN[@]}") \
        || die "the userland's library closure is incomplete (see above): pin the missing library's package in $LOCK"
    for p in $closure "${USERLAND_FILES[@]}"; do
        [ -e "$root/$p" ] || [ -L "$root/$p" ] || die "$p is in no pinned package"
        mkdir -p "$stage/$(dirname "$p")"
        cp -a "$root/$p" "$stage/$p"
    done
    for p in "${USERLAND_FILES[@]}"; do
        [ -e "$stage/$p" ] || die "$p is a symlink to something the initramfs does not get"
    done
    for p in "${USERLAND_DIRS[@]}"; do mkdir -p "$stage/$p"; done
    cp -a "$REPO_ROOT/ci/guest/rootfs/." "$stage/"
    "$GUEST_RUN" opafm-config "$root/etc/opa-fm/opafm.xml" "$stage/etc/opa-fm/opafm.xml" \
        || die "editing opa-fm's opafm.xml failed"
    # opa-fm's config_check, run on the host with the guest's own loader and libraries, must accept it and start
    # fm0's SM.
    local check
    check=$("$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" \
        "$root/usr/lib/opa-fm/bin/config_check" -v -c "$stage/etc/opa-fm/opafm.xml" 2>&1) \
        || die "opa-fm's config_check rejects the edited opafm.xml: $check"
    grep -q 'FM instance 0 (fm0) will be started' <<<"$check" && grep -q 'SM will be started' <<<"$check" \
        || die "with the edited opafm.xml, config_check does not start fm0's SM: $check"
    # Everything an ELF file in the initramfs needs must be in it (a self-check of the closure).
    local elves
    elves=$(cd "$stage" && find usr lib lib64 -type f 2>/dev/null | while read -r p; do
        [ "$(head -c 4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ] && [ "${p#lib/modules/}" = "$p" ] && echo "$p"; done)
    # shellcheck disable=SC2086 # one word per path
    bash "$REPO_ROOT/ci/guest/elf-closure.sh" "$stage" $elves >/dev/null || die "the staged userland misses a library"
}

# Stages the psm2 layer: what the base initramfs does not already have of the stack's closure.
stage_psm2_layer() { # userland-dir base-stage layer-stage
    local root=$1/root base=$2 stage=$3 p closure comps=()
    [ -e "$root/$PSM2_INFINIPATH_TARGET" ] || die "libpsm-infinipath1's $PSM2_INFINIPATH_TARGET is not in the userland"
    ln -sfn "$PSM2_INFINIPATH_TARGET" "$root/$PSM2_INFINIPATH"
    for p in "${PSM2_COMPONENT_DIRS[@]}"; do
        [ -d "$root/$p" ] || die "$p is in no pinned package"
        mapfile -t -O "${#comps[@]}" comps < <(cd "$root" && find "$p" -name '*.so' | LC_ALL=C sort)
    done
    closure=$(bash "$REPO_ROOT/ci/guest/elf-closure.sh" "$root" "${PSM2_PROGRAMS[@]}" "${comps[@]}" "$PSM2_INFINIPATH") \
        || die "the psm2 layer's library closure is incomplete (see above): pin the missing library's package in $LOCK"
    for p in $closure "${PSM2_DATA_DIRS[@]}"; do
        [ -e "$base/$p" ] && [ ! -d "$base/$p" ] && continue
        [ -e "$root/$p" ] || [ -L "$root/$p" ] || die "$p is in no pinned package"
        mkdir -p "$stage/$(dirname "$p")"
        cp -a "$root/$p" "$stage/$p"
    done
    install -D -m 0755 "$MPI_CHECK" "$stage/usr/bin/mpi-check"
    install -D -m 0644 "$REPO_ROOT/ci/guest/psm2.sh" "$stage/lib/rdma-emu/psm2.sh"
    # Everything the base and the layer together hold must be closed under DT_NEEDED.
    local merged elves
    merged=$(mktemp -d "$OUT_DIR/merged.XXXXXX")
    cp -a "$base/." "$merged/" && cp -a "$stage/." "$merged/"
    elves=$(cd "$stage" && find usr -type f | while read -r p; do
        [ "$(head -c 4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$p"; done)
    # shellcheck disable=SC2086 # one word per path
    bash "$REPO_ROOT/ci/guest/elf-closure.sh" "$merged" $elves >/dev/null || die "the psm2 layer misses a library"
    rm -rf "$merged"
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

if [ "$REFRESH_PINS" = 1 ]; then
    refresh_pins
    exit 0
fi
if [ "$REFRESH" = 0 ] && KDIR=$(newest_cached_kernel); then
    :
elif [ "$REFRESH" = 0 ] && cached=$(newest_cached_kernel_package); then
    log "the cached kernel ($cached) lacks some of ${KDRIVER_MODULES[*]}: extracting it again"
    KDIR=$(fetch_kernel "$cached")
else
    KDIR=$(fetch_kernel)
fi
BBDIR=$(fetch_busybox)
UDIR=$(fetch_userland)
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

# The guest's C test programs (testing/NAME/NAME.c), built here with the host's compiler against Debian's -dev
# package of the library they test, the version the guest's runtime package is pinned at, and linked dynamically
# against the guest's copy. Cached by the source's and the pins' hash. Prints the binary's path.
build_guest_c() { # name dev-package guest-pin compiler [libraries...]
    local name=$1 dev=$2 pin=$3 cc=$4 src sum out
    shift 4
    src="$REPO_ROOT/testing/$name/$name.c"
    sum=$(cat "$src" "$UDIR/pins" | sha256sum | cut -c1-16)
    out="$GUEST_DIR/$name-$sum"
    if [ ! -x "$out" ]; then
        apt_install gcc libc6-dev "$dev"
        local have want
        have=$(dpkg-query -W -f='${Version}' "$dev")
        want=$(sed -n "s/^$pin=//p" "$UDIR/pins")
        [ "$have" = "$want" ] || log "warning: the host's $dev is $have, the guest's $pin $want"
        log "building $name"
        "$cc" -O2 -Wall -Wextra -Werror -o "$out.tmp" "$src" "$@" >&2 || die "$name did not build"
        mv "$out.tmp" "$out"
    fi
    echo "$out"
}
# verbs-check: RDMA WRITE and READ between the fabric's two HFIs, against bookworm's rdma-core.
VERBS_CHECK=$(build_guest_c verbs-check libibverbs-dev libibverbs1 gcc -libverbs)
# qp-keeper: the fuzz-wire row's live RC, UC and UD QPs on hfi1_0 (ci/guest/fuzz.sh).
QP_KEEPER=$(build_guest_c qp-keeper libibverbs-dev libibverbs1 gcc -libverbs)
# The scenario table's guest-side settings (testing/guest-run/src/scenario.rs), which the init reads for
# rdma_emu.scenario=NAME.
guest_run_bin
SCENARIOS_ENV=$("$GUEST_RUN" scenario --guest-env) || die "guest-run scenario --guest-env failed"

# mpi-check: the psm2 layer's MPI ping-pong, with the host's mpicc against bookworm's Open MPI.
MPI_CHECK=$(build_guest_c mpi-check libopenmpi-dev libopenmpi3 mpicc)

# Everything the cpio depends on; identical inputs mean the existing cpio is reused.
INPUTS=$({
    echo "format 3"
    echo "kernel $(cat "$KDIR/package")"
    echo "busybox $(cat "$BBDIR/version")"
    echo "init $(sha256sum <"$INIT_SRC" | cut -c1-64)"
    echo "perf $(sha256sum <"$PERF_SRC" | cut -c1-64)"
    echo "userland $(sha256sum <"$UDIR/pins" | cut -c1-64)"
    echo "userland-files $(printf '%s\n' "${USERLAND_PROGRAMS[@]}" "${USERLAND_DLOPEN[@]}" "${USERLAND_FILES[@]}" \
        "${USERLAND_DIRS[@]}" | sha256sum | cut -c1-64)"
    (cd "$REPO_ROOT/ci/guest" && find rootfs elf-closure.sh -type f | LC_ALL=C sort | xargs sha256sum)
    echo "opafm-config $(sha256sum <"$REPO_ROOT/testing/guest-run/src/opafm.rs" | cut -c1-64)"
    echo "udriver $UDRIVER_SUM"
    echo "hfi1-user $HFI1_USER_SUM"
    echo "firmware $FIRMWARE_SUM"
    echo "verbs-check $(sha256sum <"$VERBS_CHECK" | cut -c1-64)"
    echo "qp-keeper $(sha256sum <"$QP_KEEPER" | cut -c1-64)"
    echo "mpi-check $(sha256sum <"$MPI_CHECK" | cut -c1-64)"
    echo "psm2-layer $(printf '%s\n' "${PSM2_PROGRAMS[@]}" "${PSM2_COMPONENT_DIRS[@]}" "$PSM2_INFINIPATH" \
        "$PSM2_INFINIPATH_TARGET" "${PSM2_DATA_DIRS[@]}" | sha256sum | cut -c1-64)"
    echo "scenarios $(printf '%s\n' "$SCENARIOS_ENV" | sha256sum | cut -c1-64)"
    (cd "$REPO_ROOT/ci/guest" && sha256sum fabric.sh tid-rdma.sh psm2.sh fuzz.sh)
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
INITRD_PSM2="$OUT_DIR/initramfs-psm2.cpio.gz"
if [ -e "$INITRD" ] && [ -e "$INITRD_PSM2" ] && [ -e "$OUT_DIR/inputs" ] && [ "$(cat "$OUT_DIR/inputs")" = "$INPUTS" ]; then
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
    stage_userland "$UDIR" "$STAGE"
    install -m 0755 "$INIT_SRC" "$STAGE/init"
    install -D -m 0644 "$PERF_SRC" "$STAGE/lib/rdma-emu/perf.sh"
    [ -n "$UDRIVER" ] && install -m 0755 "$UDRIVER" "$STAGE/bin/udriver"
    [ -n "$HFI1_USER" ] && install -m 0755 "$HFI1_USER" "$STAGE/bin/hfi1-user"
    [ -n "$FIRMWARE" ] && install -D -m 0644 "$FIRMWARE" "$STAGE/lib/firmware/hfi_dc8051.bin"
    install -D -m 0755 "$VERBS_CHECK" "$STAGE/usr/bin/verbs-check"
    install -D -m 0755 "$QP_KEEPER" "$STAGE/usr/bin/qp-keeper"
    # Steps the init sources (functions only).
    install -D -m 0644 "$REPO_ROOT/ci/guest/fabric.sh" "$STAGE/lib/rdma-emu/fabric.sh"
    install -D -m 0644 "$REPO_ROOT/ci/guest/tid-rdma.sh" "$STAGE/lib/rdma-emu/tid-rdma.sh"
    install -D -m 0644 "$REPO_ROOT/ci/guest/fuzz.sh" "$STAGE/lib/rdma-emu/fuzz.sh"
    printf '%s\n' "$SCENARIOS_ENV" >"$STAGE/lib/rdma-emu/scenarios.sh"
    cat >"$STAGE/etc/rdma-emu-guest" <<EOF
kernel=$(cat "$KDIR/package")
busybox=$(cat "$BBDIR/version")
userland=$(grep -E '^(libc6|libibverbs1|opa-fm|opa-basic-tools|perftest)=' "$UDIR/pins" | tr '\n' ' ' | sed 's/ $//')
udriver_sha256=$UDRIVER_SUM
hfi1_user_sha256=$HFI1_USER_SUM
EOF
    (cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | "${CPIO[@]}") | gzip -6n >"$INITRD.tmp"
    LAYER=$(mktemp -d "$OUT_DIR/psm2.XXXXXX")
    trap 'rm -rf "$STAGE" "$LAYER"' EXIT
    stage_psm2_layer "$UDIR" "$STAGE" "$LAYER"
    { cat "$INITRD.tmp"; (cd "$LAYER" && find . -mindepth 1 | LC_ALL=C sort | "${CPIO[@]}") | gzip -6n; } >"$INITRD_PSM2.tmp"
    mv "$INITRD.tmp" "$INITRD"
    mv "$INITRD_PSM2.tmp" "$INITRD_PSM2"
    printf '%s\n' "$INPUTS" >"$OUT_DIR/inputs"
    log "wrote $INITRD ($(du -h "$INITRD" | cut -f1)) and $INITRD_PSM2 ($(du -h "$INITRD_PSM2" | cut -f1))"
fi
echo "KERNEL=$VMLINUZ"
echo "INITRD=$INITRD"
echo "INITRD_PSM2=$INITRD_PSM2"
echo "KVER=$KVER"
