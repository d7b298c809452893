#!/usr/bin/env bash
# Prints the shared-library closure of ELF files inside an extracted root filesystem, one path per line,
# relative to the root and sorted: the program interpreter and every library reached through DT_NEEDED,
# transitively, resolved the way the guest's ld.so will resolve them (DT_RUNPATH/DT_RPATH, then the system
# search path; there is no ld.so.cache). A symlink is printed together with the path it points to, so copying
# the printed paths with `cp -a` reproduces the package layout.
#
#   ci/guest/elf-closure.sh ROOT FILE...      (each FILE relative to ROOT)
#
# A library no file under ROOT provides is an error naming it and who needs it. Libraries a program loads
# with dlopen (verbs providers, libgcc_s) are not DT_NEEDED: give them as FILEs.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,11s/^# \{0,1\}//p' "$0" >&2; exit 2; }
ROOT=$(cd "$1" && pwd)
shift
command -v readelf >/dev/null || { echo "elf-closure: readelf (binutils) is needed" >&2; exit 1; }

# Debian's x86-64 glibc: its ld.so --help lists these as the system search path.
SYSTEM_DIRS=(lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib usr/lib)

declare -A EMITTED=() SCANNED=()

# Normalises a path relative to ROOT (no symlinks followed).
rel_norm() { # path relative to ROOT
    local p
    p=$(realpath -m -s "/$1")
    echo "${p#/}"
}

# Emits PATH and, while it is a symlink, every link of the chain; sets FILE to the final file's path (no
# command substitution: EMITTED must be filled in this shell).
follow() { # relative path
    local p=$1 t n=0
    while :; do
        EMITTED[$p]=1
        [ -L "$ROOT/$p" ] || break
        t=$(readlink "$ROOT/$p")
        case "$t" in
            /*) p=$(rel_norm "$t") ;;
            *) p=$(rel_norm "$(dirname "$p")/$t") ;;
        esac
        n=$((n + 1))
        [ "$n" -le 16 ] || { echo "elf-closure: symlink loop at $1" >&2; exit 1; }
    done
    [ -f "$ROOT/$p" ] || { echo "elf-closure: $1 leads to $p, which is not a file under $ROOT" >&2; exit 1; }
    FILE=$p
}

scan() { # relative path of an ELF file (not a symlink)
    local f=$1 dyn interp needed dirs=() d so found
    [ -z "${SCANNED[$f]:-}" ] || return 0
    SCANNED[$f]=1
    if [ "$(head -c 4 "$ROOT/$f" | od -An -c | tr -d ' ')" != '177ELF' ]; then
        echo "elf-closure: $f is not an ELF file" >&2; exit 1
    fi
    interp=$(readelf -lW "$ROOT/$f" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]$/\1/p')
    if [ -n "$interp" ]; then
        [ -e "$ROOT$interp" ] || { echo "elf-closure: $f wants the interpreter $interp, which is not under $ROOT" >&2; exit 1; }
        follow "$(rel_norm "$interp")"
    fi
    dyn=$(readelf -dW "$ROOT/$f")
    # RUNPATH/RPATH entries, with $ORIGIN made relative to ROOT.
    while IFS= read -r d; do
        [ -n "$d" ] || continue
        d=${d//\$ORIGIN/\/$(dirname "$f")}
        d=${d//\$\{ORIGIN\}/\/$(dirname "$f")}
        dirs+=("$(rel_norm "$d")")
    done < <(printf '%s\n' "$dyn" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p' | tr ':' '\n')
    dirs+=("${SYSTEM_DIRS[@]}")
    needed=$(printf '%s\n' "$dyn" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]$/\1/p')
    for so in $needed; do
        found=""
        for d in "${dirs[@]}"; do
            if [ -e "$ROOT/$d/$so" ]; then found="$d/$so"; break; fi
        done
        if [ -z "$found" ]; then
            echo "elf-closure: $f needs $so, which no file under $ROOT provides (is its package pinned?)" >&2
            exit 1
        fi
        follow "$found"
        scan "$FILE"
    done
}

for f in "$@"; do
    f=$(rel_norm "$f")
    [ -e "$ROOT/$f" ] || { echo "elf-closure: $f is not under $ROOT" >&2; exit 1; }
    follow "$f"
    scan "$FILE"
done
printf '%s\n' "${!EMITTED[@]}" | LC_ALL=C sort
