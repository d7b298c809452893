# Shared helpers for the ci/ scripts. Source it; do not run it.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything that must outlive a clone (QEMU build, guest kernel) lives here.
CACHE_DIR=${RDMA_EMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-emu}
mkdir -p "$CACHE_DIR"

log() { printf '\033[1m[%s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '\033[31m[%s] error: %s\033[0m\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

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

# version_ge A B: true if version A >= B (dpkg ordering).
version_ge() { dpkg --compare-versions "$1" ge "$2"; }
