# The guest side of the wire-side kernel fuzzer (the fuzz-wire scenario, rdma_emu.fuzz_wire=1): after the
# fabric's bring-up, qp-keeper keeps RC, UC and UD QPs of hfi1_0 in RTS against a virtual peer at hfi1_1's LID,
# and every state it reports goes to the host as a `fuzz-target` console request (guest-run writes it to
# fuzz-target.json and prints it as a FUZZ-TARGET line for the fuzzer). Then the guest holds: the host ends the
# run, or rdma_emu.fuzz_secs does. Sourced by /init after fabric.sh, whose helpers it uses (port_lid, host_call,
# record, step_fabric_dmesg). docs/guest.md describes the row.

# shellcheck disable=SC2154 # t: set by init's begin
FUZZ_FIFO=/tmp/qp-keeper.fifo # the keeper's stdout: not the console, where host_call reads the host's answers
FUZZ_ERR=/tmp/qp-keeper.err
FUZZ_START_TIMEOUT=120 # the keeper's set-up and first report
KEEPER_PID="" FUZZ_TIMER_PID=""

# The keeper's report with what the fabric knows and the keeper does not: the KDETH QP prefix (a BTH DestQP
# whose top byte is this is a KDETH packet, not a verbs QP) and the peer HFI.
fuzz_line() { # report kdeth peer-lid
    echo "${1%\}},\"kdeth_qp\":${2:-null},\"peer_device\":$(json_str "$FABRIC_B"),\"peer_device_lid\":$3}"
}

run_fuzz_wire() {
    begin fuzz-keeper; host_deadline fuzz-keeper "$FUZZ_START_TIMEOUT"
    lb=$(port_lid "$FABRIC_B")
    # Older drivers had a kdeth_qp module parameter; 6.12's programs the constant RVT_KDETH_QP_PREFIX, 0x80
    # (include/rdma/rdmavt_qp.h:35), into RCV_BTH_QP (chip.c init_kdeth_qp).
    kdeth=$(cat /sys/module/hfi1/parameters/kdeth_qp 2>/dev/null)
    is_uint "$kdeth" || kdeth=128
    rm -f "$FUZZ_FIFO"
    if ! mkfifo "$FUZZ_FIFO"; then
        host_deadline_end fuzz-keeper
        record fuzz-keeper false "$t" "mkfifo $FUZZ_FIFO failed"
        return 0
    fi
    set -f
    # shellcheck disable=SC2086 # rdma_emu.keeper_args is meant to split
    qp-keeper --device "$FABRIC_A" --peer-lid "$lb" $KEEPER_ARGS >"$FUZZ_FIFO" 2>"$FUZZ_ERR" &
    KEEPER_PID=$!
    set +f
    exec 3<"$FUZZ_FIFO"
    forwarded=0 refused=0 first="" why=""
    while IFS= read -r report <&3; do
        report=$(fuzz_line "$report" "$kdeth" "$lb")
        if host_call fuzz-target target "$report"; then
            forwarded=$((forwarded + 1))
            [ -n "$first" ] && continue
            first=$report
            host_deadline_end fuzz-keeper
            record fuzz-keeper true "$t" "" "\"target\":$first,\"keeper_args\":$(json_str "$KEEPER_ARGS")"
            # From here the guest holds: the init's watchdog covered the set-up only, and the fuzz time (or
            # the host, which stops QEMU) ends the run.
            kill "$WATCHDOG_PID" 2>/dev/null
            if [ "${FUZZ_SECS:-0}" -gt 0 ]; then
                (sleep "$FUZZ_SECS"; kill "$KEEPER_PID" 2>/dev/null) &
                FUZZ_TIMER_PID=$!
            fi
            say "fuzz-wire: holding ($([ "${FUZZ_SECS:-0}" -gt 0 ] && echo "for $FUZZ_SECS s" || echo "until the host ends the run"))"
            begin fuzz-hold
        else
            refused=$((refused + 1))
            why=$HOST_REPLY
            say "fuzz-wire: the host refused a report: $HOST_REPLY"
            if [ -z "$first" ]; then
                kill "$KEEPER_PID" 2>/dev/null
                break
            fi
        fi
    done
    exec 3<&-
    wait "$KEEPER_PID"
    rc=$?
    [ -n "$FUZZ_TIMER_PID" ] && kill "$FUZZ_TIMER_PID" 2>/dev/null
    rm -f "$FUZZ_FIFO"
    errtail=$(tail -c 2048 "$FUZZ_ERR" 2>/dev/null)
    members="\"keeper_rc\":$rc,\"reports\":$forwarded,\"refused\":$refused,\"keeper_stderr\":$(json_str "$errtail")"
    if [ -z "$first" ]; then
        host_deadline_end fuzz-keeper
        if [ -n "$why" ]; then why="the host refused its first report: $why"
        else why="qp-keeper ended (status $rc) before its first report: $(tail -n 3 "$FUZZ_ERR" 2>/dev/null)"; fi
        record fuzz-keeper false "$t" "$why" "$members"
        return 0
    fi
    # The hold ended without the host: the fuzz time ran out (the keeper ends with 0 on its SIGTERM), or the
    # keeper gave up.
    if [ "$rc" = 0 ]; then record fuzz-hold true "$t" "" "$members"
    else record fuzz-hold false "$t" "qp-keeper exited with status $rc: $(tail -n 3 "$FUZZ_ERR" 2>/dev/null)" "$members"; fi
}
