#!/usr/bin/env bash
# Checks `ci/run-qemu.sh --shell` as a user meets it, twice:
#   1. commands piped into stdin (sent once the guest's shell is ready; the end of input ends the session);
#   2. typed at a terminal: a pseudo-terminal, so QEMU owns a real tty (raw mode, Ctrl-C to the guest).
# Each boots the guest: run it under the heavy-job lock (flock /tmp/rdma-emu-heavy.lock ci/guest/test-shell.sh).
#
#   ci/guest/test-shell.sh [ci/run-qemu.sh options, e.g. --hfi1-wfr for one HFI instead of the fabric]
source "$(dirname "$0")/../lib.sh"
command -v setsid >/dev/null || apt_install util-linux
guest_run_bin

TMP=$(mktemp -d /tmp/rdma-emu-shell-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
check() { # name: the condition is the rest of the arguments
    local name=$1; shift
    if "$@"; then printf '  ok   %s\n' "$name"; else printf '  FAIL %s\n' "$name"; FAILS=$((FAILS + 1)); fi
}
has() { grep -qE -- "$2" "$1"; }

log "piped, hfi1 in an identity IOMMU domain: ibv_devinfo, opainfo, the domain, a command's status, then the end of input"
set +e
printf 'ibv_devinfo -d hfi1_0\nopainfo\nls /dev/infiniband\necho "domain=$(cat /sys/class/infiniband/hfi1_0/device/iommu_group/type)"\nfalse; echo "status=$?"\n' |
    bash "$REPO_ROOT/ci/run-qemu.sh" --shell --hfi1-dma identity --timeout 600 --logs "$TMP/piped" --keep-logs "$@" \
        >"$TMP/piped.out" 2>"$TMP/piped.err"
rc=$?
set -e
check "run-qemu.sh --shell exits 0 when the guest powers off" [ "$rc" = 0 ]
check "the banner lists hfi1_0" has "$TMP/piped.out" '^  hfi1_0: node GUID [0-9a-f:]{19}, port 1 '
check "ibv_devinfo finds hfi1_0 through the hfi1 provider" has "$TMP/piped.out" $'^hca_id:\thfi1_0$'
check "ibv_devinfo shows its port" has "$TMP/piped.out" 'state:[[:space:]]+PORT_(DOWN|INIT|ARMED|ACTIVE) \([1-4]\)$'
# opainfo names a port by its GUID until it is ACTIVE, then by its GID (subnet prefix and GUID).
OI_PORT='(PortGUID:0x[0-9a-f]{16}|PortGID:0x[0-9a-f]{16}:[0-9a-f]{16})'
check "opainfo lists hfi1_0:1 with its port GUID" has "$TMP/piped.out" "^hfi1_0:1 +$OI_PORT\$"
check "the device nodes of ib_uverbs and ib_umad" has "$TMP/piped.out" 'issm0.*umad0.*uverbs0'
check "commands run in order, with their status" has "$TMP/piped.out" '^status=1$'
# The kernel's name for an identity domain (Documentation/ABI/testing/sysfs-kernel-iommu_groups).
check "--hfi1-dma identity: hfi1_0's IOMMU group has an identity domain" has "$TMP/piped.out" '^domain=identity$'
check "the end of input ends the session" has "$TMP/piped.out" 'shell exited: powering off'
check "the device model is stopped" has "$TMP/piped.err" 'guest powered off; device model running until stopped'
# Without --hfi1-wfr the shell serves the fabric: two HFIs, and opa-fm's sm on hfi1_0.
if [[ " $* " != *" --hfi1-wfr "* ]]; then
    check "the fabric's two HFIs" has "$TMP/piped.out" '^  hfi1_1: node GUID [0-9a-f:]{19}, port 1 '
    check "opa-fm's sm runs on hfi1_0" has "$TMP/piped.out" '^opa-fm: sm running on hfi1_0 '
    check "opainfo lists both ports" has "$TMP/piped.out" "^hfi1_1:1 +$OI_PORT\$"
    # The prompt waits for the sm: both ports are ACTIVE (IB_PORT_ACTIVE 4, the kernel's "4: ACTIVE") by then.
    check "both ports ACTIVE at the prompt" has "$TMP/piped.out" 'rdma-emu: \[[0-9.]+\] opa-fm: both ports ACTIVE$'
    check "the banner shows hfi1_0 ACTIVE" has "$TMP/piped.out" '^  hfi1_0: node GUID [0-9a-f:]{19}, port 1 4: ACTIVE '
    check "the banner shows hfi1_1 ACTIVE" has "$TMP/piped.out" '^  hfi1_1: node GUID [0-9a-f:]{19}, port 1 4: ACTIVE '
fi

log "terminal: a prompt, a command, Ctrl-C to a running command, Ctrl-D"
set +e
# The dialog of guest-run pty-drive (testing/guest-run/src/pty.rs): run-qemu.sh on a pseudo-terminal that is its
# controlling terminal, typed at as a user would.
cat >"$TMP/tty.dialog" <<'DIALOG'
expect 600 the shell is ready :: shell ready
expect 60 a prompt :: rdma-emu:/# 
send ibv_devinfo -d hfi1_0\r
expect 120 ibv_devinfo answers :: hca_id:\thfi1_0 ... rdma-emu:/# 
# Ctrl-C must reach the guest's foreground job, not end QEMU (the console is signal=off; cttyhack gave the shell a
# controlling terminal). The sleep must have started first: a Ctrl-C before it would only clear the line.
send sleep 300; echo after-sleep\r
wait 10 :: sleep 300; echo after-sleep
pause 1
send \x03
expect 30 Ctrl-C stops the guest's command and the shell prompts again :: rdma-emu:/# 
absent the interrupted command line did not go on :: \nafter-sleep
send echo alive-$((6*7))\r
expect 30 the shell still runs commands :: alive-42 ... rdma-emu:/# 
# Ctrl-D at the prompt (the piped run ends with `exit`).
send \x04
expect 120 Ctrl-D at the prompt powers the guest off :: guest powered off
DIALOG
# run-qemu.sh must end by itself (it stops QEMU and the device model): the terminal then reads EOF. If it does
# not, it is stopped (SIGTERM stops QEMU and the device model too).
"$GUEST_RUN" pty-drive --dialog "$TMP/tty.dialog" --transcript "$TMP/tty.out" --end-secs 60 -- \
    bash "$REPO_ROOT/ci/run-qemu.sh" --shell --timeout 600 --logs "$TMP/tty" --keep-logs "$@"
rc=$?
set -e
check "terminal session" [ "$rc" = 0 ]

if [ "$FAILS" -ne 0 ]; then
    log "transcripts: $TMP/piped.out, $TMP/tty.out (logs $TMP/piped, $TMP/tty)"
    trap - EXIT
    die "$FAILS shell check(s) failed"
fi
log "all shell checks passed"
