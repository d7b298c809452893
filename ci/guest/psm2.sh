# The OPA userspace stack over the two emulated HFIs (the psm2 scenario): libpsm2 opens user contexts on
# /dev/hfi1_0 and /dev/hfi1_1, sends by PIO into the chip's mapped send buffers and by user SDMA, programs TIDs
# with HFI1_IOCTL_TID_UPDATE and writes the TID flow table itself over MMIO. libfabric's psm2 provider
# (fi_info, fi_pingpong) and Open MPI's psm2 MTL (mpi-check) run on it, every byte checked, and the device
# model's counters show that the bytes crossed the cable through the user contexts. Sourced by /init after
# fabric.sh, whose helpers it uses (host_call, counters_moved); the psm2 layer of the initramfs brings the
# programs (ci/build-guest.sh). docs/psm2.md describes the steps.

# shellcheck disable=SC2154 # t: set by init's begin
PSM2_JSON=/tmp/psm2.json
# Shared memory ruled out: every byte crosses the cable. One context per process, no receive thread.
PSM2_ENV="PSM2_DEVICES=self,hfi PSM2_SHAREDCONTEXTS=0 PSM2_RCVTHREAD=0"
# The device model's counters (both HFIs summed): what the user contexts made the chip do.
PSM2_DM_COUNTERS="pio_user_launches sdma_user_bytes rcv_array_user_programmed tidflow_user_writes \
wire_rx_kdeth_user_expected wire_rx_kdeth_expected wire_rx_kdeth_eager wire_rx_kdeth_suppressed"
# fi_pingpong's sizes: PIO eager, SDMA eager and the TID rendezvous (psm2-on-hfi1 reference, thresholds).
PSM2_FI_SIZES="64 16384 65536 1048576"
# mpi-check's: psm2-on-hfi1 reference §5, every threshold crossed (mpi-check's default).
PSM2_MPI_ITERS=2
PSM2_MPI_PORT_SCRIPT=/tmp/psm2-unit.sh

# "NAME=VALUE ..." of the device model's PSM2 counters, in PSM2_SNAP (host_call must run in this shell).
PSM2_SNAP="" PSM2_SNAP_ERR=""
psm2_snapshot() {
    if host_call counters names "$PSM2_DM_COUNTERS"; then
        s=""
        # shellcheck disable=SC2086 # one value a word, in the order asked
        set -- $HOST_REPLY
        for c in $PSM2_DM_COUNTERS; do s="$s d.$c=${1:-0}"; shift; done
        PSM2_SNAP=$s PSM2_SNAP_ERR=""
    else
        PSM2_SNAP="" PSM2_SNAP_ERR="the host gave no device counters: $HOST_REPLY"
    fi
}
psm2_moved() { counters_moved "$1" "$2"; } # before after
# How far counter $1 moved between two snapshots (0 if it is in neither).
psm2_delta() { # name before after
    awk -v k="d.$1" -v before="$2" -v after="$3" 'BEGIN {
        n = split(before, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); if (kv[1] == k) b = kv[2] }
        n = split(after, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); if (kv[1] == k) a = kv[2] }
        printf "%.0f", a - b }'
}

# The environment every step runs in: the IPC Open MPI and PSM2 need, and a node name ORTE accepts.
step_psm2_setup() {
    begin psm2-setup
    err=""
    mkdir -p /dev/shm && { grep -q ' /dev/shm ' /proc/mounts || mount -t tmpfs tmpfs /dev/shm; } || err="$err mount /dev/shm;"
    ip link set lo up 2>/dev/null
    hostname rdma-emu
    for d in /dev/hfi1_0 /dev/hfi1_1; do [ -c "$d" ] || err="$err no $d;"; done
    nctxts=$(cat /sys/class/infiniband/hfi1_0/nctxts 2>/dev/null)
    [ "${nctxts:-0}" -ge 2 ] || err="$err hfi1_0 has ${nctxts:-no} user contexts (PSM2 needs 2: num_user_contexts);"
    grep -qw avx2 /proc/cpuinfo || err="$err the CPU has no AVX2 (Debian's libpsm2 is built with -mavx2);"
    printf '#!/bin/sh\nexport HFI_UNIT=$OMPI_COMM_WORLD_RANK\nexec "$@"\n' >"$PSM2_MPI_PORT_SCRIPT"
    members="\"nctxts\":${nctxts:-null},\"env\":$(json_str "$PSM2_ENV")"
    if [ -z "$err" ]; then record psm2-setup true "$t" "" "$members"; return 0; fi
    record psm2-setup false "$t" "${err# }" "$members"
    return 1
}

# fi_info -p psm2 lists an RDM endpoint on each HFI.
step_psm2_fi_info() {
    begin psm2-fi-info; host_deadline psm2-fi-info "$KDRIVER_TIMEOUT"
    # shellcheck disable=SC2086 # the environment is meant to split
    run_to "$KDRIVER_TIMEOUT" env $PSM2_ENV fi_info -p psm2 -t FI_EP_RDM
    rc=$?
    host_deadline_end psm2-fi-info
    domains=$(awk '$1 == "domain:" { print $2 }' "$OUT" | sort -u | tr '\n' ' ')
    members="\"domains\":$(json_str "${domains% }")"
    missing=""
    for d in $FABRIC_A $FABRIC_B; do
        case " $domains" in *" $d "*) ;; *) missing="$missing $d" ;; esac
    done
    if [ "$rc" = 0 ] && [ -z "$missing" ]; then record psm2-fi-info true "$t" "" "$members"; return 0; fi
    record psm2-fi-info false "$t" "fi_info -p psm2: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"), no RDM endpoint on$missing: $(tail -c 512 "$OUT")" "$members"
}

# fi_pingpong -p psm2 -e rdm with its data check (-c), server on hfi1_0, client on hfi1_1, each size in turn.
step_psm2_fi_pingpong() {
    begin psm2-fi-pingpong; host_deadline psm2-fi-pingpong "$KDRIVER_TIMEOUT"
    psm2_snapshot; before=$PSM2_SNAP
    err="" rows=""
    for size in $PSM2_FI_SIZES; do
        # shellcheck disable=SC2086 # the environment is meant to split
        HFI_UNIT=0 timeout -k 2 "$KDRIVER_TIMEOUT" env $PSM2_ENV fi_pingpong -p psm2 -e rdm -c -I 10 -S "$size" \
            >/tmp/server.out 2>&1 &
        spid=$!
        # The server listens on fi_pingpong's control port (util/pingpong.c, 47592).
        # shellcheck disable=SC2016 # evaluated by wait_for
        wait_for 30 'listening 47592 || ! alive $spid'
        # shellcheck disable=SC2086
        HFI_UNIT=1 timeout -k 2 "$KDRIVER_TIMEOUT" env $PSM2_ENV fi_pingpong -p psm2 -e rdm -c -I 10 -S "$size" \
            127.0.0.1 >/tmp/client.out 2>&1
        crc=$?
        wait "$spid"; src=$?
        # The result line: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec.
        line=$(awk '$2 ~ /^[0-9]+$/ && $3 ~ /^=/ { l = $0 } END { print l }' /tmp/client.out)
        rows="$rows${rows:+,}{\"size\":$size,\"client_rc\":$crc,\"server_rc\":$src,\"result\":$(json_str "$line")}"
        [ "$crc" = 0 ] && [ "$src" = 0 ] && [ -n "$line" ] || err="$err size $size: client $(timeout_msg "$crc" "$KDRIVER_TIMEOUT"), server $(timeout_msg "$src" "$KDRIVER_TIMEOUT"): $(pair_tail);"
        # shellcheck disable=SC2016
        wait_for 10 '! listening 47592'
    done
    psm2_snapshot
    host_deadline_end psm2-fi-pingpong
    members="\"runs\":[$rows],\"moved\":$(psm2_moved "$before" "$PSM2_SNAP")"
    if [ -z "$err" ]; then record psm2-fi-pingpong true "$t" "" "$members"
    else record psm2-fi-pingpong false "$t" "fi_pingpong -p psm2:$err" "$members"; fi
}

# mpi-check over Open MPI's psm2 MTL: rank 0 on hfi1_0, rank 1 on hfi1_1.
step_psm2_mpi() {
    begin psm2-mpi; host_deadline psm2-mpi "$KDRIVER_TIMEOUT"
    psm2_snapshot; before=$PSM2_SNAP
    xs=""
    for kv in $PSM2_ENV; do xs="$xs -x $kv"; done
    # orterun forwards its stdin to rank 0: here that would be the console, where the host's answers arrive.
    # shellcheck disable=SC2086 # the options are meant to split
    run_to "$KDRIVER_TIMEOUT" orterun --allow-run-as-root --mca plm_rsh_agent /bin/false --oversubscribe \
        --bind-to none -np 2 --mca pml cm --mca mtl psm2 $xs sh "$PSM2_MPI_PORT_SCRIPT" mpi-check -i "$PSM2_MPI_ITERS" </dev/null
    rc=$?
    psm2_snapshot
    host_deadline_end psm2-mpi
    summary=$(grep '"summary"' "$OUT" | tail -n 1)
    moved=$(psm2_moved "$before" "$PSM2_SNAP")
    [ -n "$PSM2_SNAP_ERR" ] && moved="{\"error\":$(json_str "$PSM2_SNAP_ERR")}"
    members="\"rc\":$rc,\"summary\":${summary:-null},\"moved\":$moved,\"output\":$(json_str "$(grep '^{' "$OUT" | head -c 16384)")"
    # The result's psm2 member (guest-run's Psm2Counts check): what the MPI job's bytes made the chip do.
    checked=$(echo "$summary" | sed -n 's/.*"bytes_checked":\([0-9]*\).*/\1/p')
    after=$PSM2_SNAP
    echo "{\"bytes_checked\":${checked:-0},\"pio_user_launches\":$(psm2_delta pio_user_launches "$before" "$after"),\
\"user_sdma_bytes\":$(psm2_delta sdma_user_bytes "$before" "$after"),\
\"tid_entries_programmed\":$(psm2_delta rcv_array_user_programmed "$before" "$after"),\
\"tidflow_user_writes\":$(psm2_delta tidflow_user_writes "$before" "$after"),\
\"expected_packets_placed\":$(psm2_delta wire_rx_kdeth_user_expected "$before" "$after"),\
\"mpi\":${summary:-null},\"moved\":$moved}" >"$PSM2_JSON"
    if [ "$rc" = 0 ] && [ -n "$summary" ]; then record psm2-mpi true "$t" "" "$members"
    else record psm2-mpi false "$t" "orterun mpi-check: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail)" "$members"; fi
}

run_psm2() {
    step_psm2_setup || return 0
    step_psm2_fi_info
    step_psm2_fi_pingpong
    step_psm2_mpi
}
