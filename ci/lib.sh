# Shared helpers for the ci/ scripts. Source it; do not run it.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything that must outlive a clone (QEMU build, guest kernel) lives here.
CACHE_DIR=${RDMA_EMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-emu}
mkdir -p "$CACHE_DIR"

log() { printf '\033[1m[%s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '\033[31m[%s] error: %s\033[0m\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# The host binaries of a run, in one cargo invocation: callers that build them agree on one feature set, so
# none rebuilds what another built.
build_host_bins() {
    (cd "$REPO_ROOT" && cargo build --release -p device-model -p hfi1-kernel-check -p guest-run --bin device-model \
        --bin hfi1-user-host --bin hfi1-dc8051-image --bin guest-run >&2)
}

# Sets and exports GUEST_RUN, the host side of a guest run (testing/guest-run: the scenario table, the verdict,
# the control-socket requests), building it unless a caller already did.
guest_run_bin() {
    if [ -n "${GUEST_RUN:-}" ] && [ -x "$GUEST_RUN" ]; then return 0; fi
    build_host_bins || die "cargo build --release -p guest-run failed"
    GUEST_RUN=${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/guest-run
    [ -x "$GUEST_RUN" ] || die "no $GUEST_RUN after the build"
    export GUEST_RUN
}

# Runs ci/build.sh and puts its five paths in the array BINS (device-model, static udriver, static hfi1-user,
# hfi1-user-host, the 8051 firmware file); sets GUEST_RUN too. `mapfile < <(...)` would drop the build's exit
# status; this stops the script instead.
build_bins() {
    local out
    out=$(bash "$REPO_ROOT/ci/build.sh") || die "ci/build.sh failed (exit $?): see the cargo output above"
    mapfile -t BINS <<<"$out"
    [ ${#BINS[@]} -eq 5 ] || die "ci/build.sh printed ${#BINS[@]} paths, expected 5"
    GUEST_RUN=$(dirname "${BINS[0]}")/guest-run
    export GUEST_RUN
    guest_run_bin
}

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

# The Debian mirror this machine already uses, so no host is hard-coded here.
debian_mirror() {
    local uri
    uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
    [ -n "$uri" ] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
    [ -n "$uri" ] || die "cannot find the Debian mirror in /etc/apt"
    echo "$uri"
}

APT_UPDATED_STAMP=/tmp/.rdma-emu-apt-updated
apt_update_once() {
    if [ ! -e "$APT_UPDATED_STAMP" ]; then
        log "apt-get update"
        $SUDO apt-get update -qq >&2
        touch "$APT_UPDATED_STAMP"
    fi
}

# Adds an apt source file once; forces a fresh `apt-get update`.
apt_add_source() { # name content
    local f="/etc/apt/sources.list.d/$1"
    if [ ! -e "$f" ] || [ "$(cat "$f")" != "$2" ]; then
        printf '%s\n' "$2" | $SUDO tee "$f" >/dev/null
        rm -f "$APT_UPDATED_STAMP"
    fi
}

# Installs the Debian packages that are missing, and nothing else.
apt_install() {
    local missing=()
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    apt_update_once
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# Debian's tshark, for the cable-capture test. wireshark-common asks (debconf, priority high) whether users
# other than root may capture; the answer is preseeded to its default, no, so the installation never waits.
ensure_tshark() {
    command -v tshark >/dev/null && return 0
    echo 'wireshark-common wireshark-common/install-setuid boolean false' | $SUDO debconf-set-selections
    apt_install tshark
    command -v tshark >/dev/null || die "tshark is not installed after apt-get install tshark"
}

# --- Debian packages from bookworm-backports (the guest kernel and its source) ----------------------------
# apt-get download as root into a directory the _apt user cannot enter warns; downloading as root is what we want.
APT_DL_OPTS=()
[ "$(id -u)" = 0 ] && APT_DL_OPTS=(-o APT::Sandbox::User=root)

ensure_backports() {
    if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        log "adding bookworm-backports ($(debian_mirror))"
        apt_add_source rdma-emu-backports.list "deb $(debian_mirror) bookworm-backports main"
    fi
    apt_update_once
}

# Downloads one package (exact version when given) into $2 and prints the .deb path.
apt_fetch() { # pkg[=version] dir
    local dir=$2
    mkdir -p "$dir"
    rm -f "$dir"/*.deb
    (cd "$dir" && timeout 1800 apt-get download -q "${APT_DL_OPTS[@]}" "$1" >&2) || die "apt-get download $1 failed"
    ls "$dir"/*.deb
}

# Prints PKG=VERSION of the guest kernel image: the one real package that bookworm-backports'
# linux-image-amd64 metapackage depends on, e.g. linux-image-6.12.95+deb12-amd64=6.12.95-1~bpo12+1.
guest_kernel_package() {
    ensure_backports
    local meta_ver dep
    meta_ver=$(apt-cache madison linux-image-amd64 | awk -F'|' '$3 ~ /bookworm-backports/ {gsub(/ /, "", $2); print $2}' \
        | sort -rV | head -n1)
    [ -n "$meta_ver" ] || die "bookworm-backports offers no linux-image-amd64 (apt-cache madison linux-image-amd64)"
    # The metapackage depends on exactly one real image package, e.g. linux-image-6.12.95+deb12-amd64 (= VER).
    dep=$(apt-cache show "linux-image-amd64=$meta_ver" | sed -n 's/^Depends: //p' | head -n1 | tr ',' '\n' \
        | sed -n 's/^ *\(linux-image-[0-9][^ ]*\) *(= *\([^)]*\)).*/\1=\2/p' | head -n1)
    [ -n "$dep" ] || die "cannot resolve linux-image-amd64=$meta_ver to a kernel package"
    log "linux-image-amd64 $meta_ver -> ${dep%%=*} ${dep#*=}"
    echo "$dep"
}

# version_ge A B: true if version A >= B (dpkg ordering).
version_ge() { dpkg --compare-versions "$1" ge "$2"; }

# accel_for QEMU KERNEL INITRD: prints "kvm" if KVM really runs this guest, else "tcg". /dev/kvm can exist and
# still fail (nested KVM stops with "KVM internal error" once the kernel enters long mode), so the probe boots
# the guest itself without devices and waits for its init; the verdict is cached per host kernel, CPU and QEMU.
accel_for() {
    local qemu=$1 kernel=$2 initrd=$3
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || { echo tcg; return 0; }
    local key file
    key=$({ uname -r; grep -m1 '^model name' /proc/cpuinfo; "$qemu" --version | head -n1; sha256sum <"$kernel"; } \
        | sha256sum | cut -c1-16)
    file="$CACHE_DIR/kvm-probe/$key"
    if [ -s "$file" ]; then cat "$file"; return 0; fi
    log "probing whether KVM works (cached afterwards)"
    local out verdict=tcg pid
    out=$(mktemp -d)
    timeout -k 2 30 "$qemu" -accel kvm -cpu host -machine q35 -m 256M -nodefaults -no-reboot -display none \
        -serial "file:$out/serial" -kernel "$kernel" -initrd "$initrd" \
        -append 'console=ttyS0 panic=-1 quiet rdma_emu.hfi1=none rdma_emu.irdma=none' </dev/null >/dev/null 2>"$out/err" &
    pid=$!
    for _ in $(seq 1 300); do
        grep -q 'RDMA-EMU-INIT' "$out/serial" 2>/dev/null && { verdict=kvm; break; }
        grep -qE 'KVM internal error|emulation failure|failed to initialize kvm|Could not access KVM' "$out/err" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$out"
    mkdir -p "$CACHE_DIR/kvm-probe"
    echo "$verdict" >"$file"
    log "KVM probe: $verdict"
    echo "$verdict"
}
