#!/usr/bin/env bash
# Builds the guest kernel's hfi1.ko out of tree for fuzzing: the driver's source from Debian's linux-source
# (ci/kernel-source.sh, the guest kernel's exact version) against the guest kernel's own linux-headers and
# linux-kbuild packages (unpacked under the cache, nothing installed), with -fsanitize-coverage=trace-pc and the
# coverage hook kernel-cov/hfi1_cov.c compiled in (docs/kernel-coverage.md). The module keeps the stock
# module's vermagic and symbol CRCs, so the stock kernel loads it (unsigned: it only taints the kernel).
# The stock signed module stays the guest's default; this one reaches a guest only through the overlay below.
#
#   ci/build-hfi1-module.sh [--no-coverage] [--plant] [--patch FILE]... [--guest | --base-initrd FILE]
#
#   --no-coverage     build without trace-pc and without the hook (e.g. a patched module for a kernel-fix run)
#   --plant           TEST ONLY: a WARN on a received payload starting with "RDMAEMU-PLANT-40" (the fuzz
#                     smoke's oracle check); never in the default build
#   --patch FILE      a patch against the kernel tree (-p1, a/drivers/infiniband/hw/hfi1/...), repeatable
#   --base-initrd F   also write an initramfs: F followed by the overlay (the later hfi1.ko wins)
#   --guest           the same with ci/build-guest.sh's initramfs (its defaults) as F
#
# Prints on stdout, one per line: KO=<hfi1.ko with debug info, for symbolising> OVERLAY=<cpio.gz holding the
# stripped module at the stock module's path> KVER=<release>, and with --guest/--base-initrd KERNEL= and
# INITRD= for ci/run-qemu.sh --kernel/--initrd. The build is cached under $CACHE_DIR/hfi1-module/<key>/, the key
# being the kernel version, the hook's source, this script, the options and the patches' contents.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,22s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }

COVERAGE=1
PLANT=0
PATCHES=()
BASE_INITRD=""
GUEST=0
while [ $# -gt 0 ]; do
    case "$1" in
        --coverage) COVERAGE=1; shift ;;
        --no-coverage) COVERAGE=0; shift ;;
        --plant) PLANT=1; shift ;;
        --patch) [ $# -ge 2 ] || usage; [ -f "$2" ] || die "--patch $2 is not a file"
            PATCHES+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
        --base-initrd) [ $# -ge 2 ] || usage; [ -f "$2" ] || die "--base-initrd $2 is not a file"; BASE_INITRD=$2; shift 2 ;;
        --guest) GUEST=1; shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ "$GUEST" = 0 ] || [ -z "$BASE_INITRD" ] || die "--guest and --base-initrd exclude each other"

HOOK_DIR="$REPO_ROOT/kernel-cov"
OUT_ROOT="$CACHE_DIR/hfi1-module"
HDR_ROOT="$CACHE_DIR/kernel-headers"
mkdir -p "$OUT_ROOT" "$HDR_ROOT"

# --- the guest kernel and its source ----------------------------------------------------------------------
KSRC=$(bash "$REPO_ROOT/ci/kernel-source.sh") || die "ci/kernel-source.sh failed"
read -r _ PKG_VER <"$(dirname "$KSRC")/version"
KDIR=""
for d in $(ls -d "$CACHE_DIR"/guest/kernel-* 2>/dev/null | sort -rV); do
    if [ -e "$d/.complete" ] && [ "$(cut -d' ' -f2 "$d/package")" = "$PKG_VER" ]; then KDIR=$d; break; fi
done
[ -n "$KDIR" ] || { bash "$REPO_ROOT/ci/build-guest.sh" >/dev/null || die "ci/build-guest.sh failed"; KDIR="$CACHE_DIR/guest/kernel-$PKG_VER"; }
[ -e "$KDIR/release" ] || die "no cached guest kernel $PKG_VER under $CACHE_DIR/guest"
KVER=$(cat "$KDIR/release")
STOCK_REL=$(grep '/hfi1/hfi1\.ko$' "$KDIR/kdriver.rel") || die "the guest has no stock hfi1.ko ($KDIR/kdriver.rel)"

# --- headers: linux-headers-<release>, its -common, linux-kbuild-<series>, all of the kernel's version -----
exec 9>"$HDR_ROOT/.lock"
flock -w 1800 9 || die "another ci/build-hfi1-module.sh held $HDR_ROOT/.lock for 30 minutes"
HDR_DIR="$HDR_ROOT/${PKG_VER//[:~]/_}"
ABI=${KVER%-amd64}                       # 6.12.95+deb12
HDR_TREE="$HDR_DIR/root/usr/src/linux-headers-$KVER"
if [ ! -e "$HDR_DIR/.complete" ]; then
    ensure_backports
    rm -rf "$HDR_DIR" "$HDR_DIR.part"
    mkdir -p "$HDR_DIR.part"
    for p in "linux-headers-$KVER" "linux-headers-$ABI-common" "linux-kbuild-$ABI"; do
        log "downloading $p=$PKG_VER"
        deb=$(apt_fetch "$p=$PKG_VER" "$HDR_DIR.part/deb")
        dpkg-deb -x "$deb" "$HDR_DIR.part/root"
    done
    rm -rf "$HDR_DIR.part/deb"
    # Its Makefile includes the -common tree by its installed, absolute path: point it at the unpacked one.
    mk="$HDR_DIR.part/root/usr/src/linux-headers-$KVER/Makefile"
    grep -q "^include /usr/src/linux-headers-$ABI-common/Makefile$" "$mk" || die "unexpected $mk: $(cat "$mk")"
    printf 'include %s/usr/src/linux-headers-%s-common/Makefile\n' "$HDR_DIR/root" "$ABI" >"$mk"
    touch "$HDR_DIR.part/.complete"
    mv "$HDR_DIR.part" "$HDR_DIR"
fi
exec 9>&-
[ -e "$HDR_TREE/Module.symvers" ] || die "no Module.symvers in $HDR_TREE"
# The compiler the kernel was built with (CONFIG_CC_VERSION_TEXT names gcc-12).
CC_BIN=x86_64-linux-gnu-gcc-12
command -v "$CC_BIN" >/dev/null || apt_install gcc-12
command -v patch >/dev/null || apt_install patch

# --- cache key -------------------------------------------------------------------------------------------
KEY=$({
    echo "format 1"
    echo "kernel $PKG_VER $KVER"
    echo "coverage $COVERAGE plant $PLANT"
    sha256sum <"$0"
    (cd "$HOOK_DIR" && sha256sum hfi1_cov.c hfi1_cov.h)
    for p in "${PATCHES[@]}"; do sha256sum <"$p"; done
    "$CC_BIN" --version | head -n1
} | sha256sum | cut -c1-16)
OUT="$OUT_ROOT/$KEY"
exec 9>"$OUT_ROOT/.lock"
flock -w 3600 9 || die "another ci/build-hfi1-module.sh held $OUT_ROOT/.lock for an hour"
if [ ! -e "$OUT/.complete" ]; then
    rm -rf "$OUT" "$OUT.part"
    mkdir -p "$OUT.part/src/drivers/infiniband/hw"
    SRC="$OUT.part/src/drivers/infiniband/hw/hfi1"
    # The driver's files are taken from the source tree now; none of them lives in the repo.
    cp -a "$KSRC/drivers/infiniband/hw/hfi1" "$SRC"
    for p in "${PATCHES[@]}"; do
        log "applying $(basename "$p")"
        patch -d "$OUT.part/src" -p1 --no-backup-if-mismatch <"$p" >&2 || die "patch $p does not apply"
    done
    cp "$HOOK_DIR/hfi1_cov.c" "$HOOK_DIR/hfi1_cov.h" "$SRC/"
    if [ "$PLANT" = 1 ]; then
        # Test-only: call hfi1_cov_plant() first thing in hfi1_ib_rcv (verbs.c), the 9B receive entry.
        awk '
            /^void hfi1_ib_rcv\(struct hfi1_packet \*packet\)$/ { print "void hfi1_cov_plant(struct hfi1_packet *packet); /* rdma-emu --plant */"; infn = 1 }
            infn && /^\thfi1_handle_packet\(packet, / { print "\thfi1_cov_plant(packet); /* rdma-emu --plant: test-only */"; infn = 0; n++ }
            { print }
            END { if (n != 1) exit 1 }' "$SRC/verbs.c" >"$SRC/verbs.c.new" || die "--plant: hfi1_ib_rcv not found in verbs.c"
        mv "$SRC/verbs.c.new" "$SRC/verbs.c"
    fi
    {
        echo "# Generated by ci/build-hfi1-module.sh: the driver's own Makefile plus the rdma-emu coverage hook."
        echo "include $SRC/Makefile"
        echo "hfi1-y += hfi1_cov.o"
        if [ "$COVERAGE" = 1 ]; then
            echo "ccflags-y += -fsanitize-coverage=trace-pc"
            # A block that only calls the hook and returns would otherwise jump to it (a sibling call), and the
            # hook would record its caller's return address: every recorded address must be a call site.
            echo "ccflags-y += -fno-optimize-sibling-calls"
            echo "CFLAGS_hfi1_cov.o += -DHFI1_COV_TRACE_PC"
            echo "CFLAGS_REMOVE_hfi1_cov.o += -fsanitize-coverage=trace-pc"
        fi
        [ "$PLANT" = 1 ] && echo "CFLAGS_hfi1_cov.o += -DHFI1_COV_PLANT"
        true
    } >"$SRC/Kbuild"
    log "building hfi1.ko (coverage $COVERAGE, plant $PLANT, ${#PATCHES[@]} patches) against $HDR_TREE"
    # No pahole here: the module gets no BTF (only BPF's type info needs it).
    nice -n 19 make -C "$HDR_TREE" M="$SRC" CC="$CC_BIN" CONFIG_DEBUG_INFO_BTF_MODULES= -j"$(nproc)" modules >&2 \
        || die "the hfi1 build failed"
    ko="$SRC/hfi1.ko"
    [ -f "$ko" ] || die "the build left no $ko"
    stock_magic=$(modinfo -F vermagic "$KDIR/kdriver/$STOCK_REL" 2>/dev/null || /sbin/modinfo -F vermagic "$KDIR/kdriver/$STOCK_REL")
    ours_magic=$(modinfo -F vermagic "$ko" 2>/dev/null || /sbin/modinfo -F vermagic "$ko")
    [ "$stock_magic" = "$ours_magic" ] || die "vermagic '$ours_magic' is not the stock module's '$stock_magic'"
    cp "$ko" "$OUT.part/hfi1.ko"
    # The guest gets the module without debug info (the stock one has none either); the text is unchanged.
    mkdir -p "$OUT.part/overlay/lib/modules/$KVER/$(dirname "$STOCK_REL")"
    strip --strip-debug -o "$OUT.part/overlay/lib/modules/$KVER/$STOCK_REL" "$ko"
    (cd "$OUT.part/overlay" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) \
        | gzip -6n >"$OUT.part/overlay.cpio.gz"
    rm -rf "$OUT.part/overlay"
    if [ "$COVERAGE" = 1 ]; then
        sites=$(objdump -r "$ko" | grep -c '__sanitizer_cov_trace_pc-0x0*4$' || true)
        echo "$sites" >"$OUT.part/call-sites"
        log "hfi1.ko: $sites trace-pc call sites"
    fi
    { echo "kernel $PKG_VER $KVER"; echo "coverage $COVERAGE"; echo "plant $PLANT"
      for p in "${PATCHES[@]}"; do echo "patch $(basename "$p")"; done; } >"$OUT.part/build-info"
    rm -rf "$OUT.part/src"
    touch "$OUT.part/.complete"
    mv "$OUT.part" "$OUT"
    # Keep the 6 most recently used builds.
    ls -dt "$OUT_ROOT"/*/ 2>/dev/null | tail -n +7 | xargs -r rm -rf
fi
touch "$OUT"
exec 9>&-
echo "KO=$OUT/hfi1.ko"
echo "OVERLAY=$OUT/overlay.cpio.gz"
echo "KVER=$KVER"

if [ "$GUEST" = 1 ]; then
    guest=$(bash "$REPO_ROOT/ci/build-guest.sh") || die "ci/build-guest.sh failed"
    BASE_INITRD=$(sed -n 's/^INITRD=//p' <<<"$guest")
    KERNEL=$(sed -n 's/^KERNEL=//p' <<<"$guest")
else
    KERNEL="$KDIR/vmlinuz"
fi
if [ -n "$BASE_INITRD" ]; then
    # Concatenated archives: the kernel unpacks both in order, so the overlay's hfi1.ko replaces the stock one
    # at the same path and modules.dep stays valid.
    sum=$(cat "$BASE_INITRD" "$OUT/overlay.cpio.gz" | sha256sum | cut -c1-16)
    INITRD="$OUT/initramfs-$sum.cpio.gz"
    if [ ! -e "$INITRD" ]; then
        cat "$BASE_INITRD" "$OUT/overlay.cpio.gz" >"$INITRD.tmp" && mv "$INITRD.tmp" "$INITRD"
        ls -t "$OUT"/initramfs-*.cpio.gz | tail -n +3 | xargs -r rm -f
    fi
    echo "KERNEL=$KERNEL"
    echo "INITRD=$INITRD"
fi
