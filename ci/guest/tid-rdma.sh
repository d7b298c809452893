# The kernel's own TID RDMA over the two emulated HFIs (rdma_emu.tid_rdma=1, ci/run-qemu.sh --tid-rdma): hfi1
# loaded with cap_mask TID_RDMA and OPFN, RDMA READ and WRITE of 256 KiB and more from perftest and
# verbs-check, and the evidence that the kernel's TID RDMA ran on our RcvArray and flow table. Sourced by /init
# after fabric.sh, whose helpers it uses (host_call, run_pair, kprobe_count_start, kprobe_count, ...);
# docs/kernel-tid-rdma.md maps each step to the kernel functions and what the device saw.

# shellcheck disable=SC2154 # t: set by init's begin
TID_JSON=/tmp/tid-rdma.json
# The four seed functions, counted by kprobe events (kprobe_profile). kern_reserve_flow is inlined: its
# evidence is the hfi1_tid_flow_alloc tracepoint and the flow-table writes the device model counts.
TID_KFUNCS="hfi1_setup_wqe hfi1_kern_exp_rcv_setup hfi1_kern_setup_hw_flow queue_qp_for_tid_wait"
# Tracepoints counted by hist triggers in a trace instance of our own: OPFN's negotiation (opfn.c) and the
# flow reservations (hfi1_kern_exp_rcv_setup's hfi1_tid_flow_alloc, tid_rdma.c).
# hfi1_msg_alloc_tids fires only where kern_alloc_tids finds too few RcvArray groups (tid_rdma.c:1293).
TID_EVENTS="hfi1_tid/hfi1_opfn_state_conn_request hfi1_tid/hfi1_opfn_state_conn_response \
hfi1_tid/hfi1_opfn_state_conn_reply hfi1_tid/hfi1_opfn_param hfi1_tid/hfi1_tid_flow_alloc \
hfi1_tid/hfi1_msg_alloc_tids"
# hfi1_kern_setup_hw_flow's return value (a kretprobe of our own): -EAGAIN when the context has no free flow
# (tid_rdma.c:813-817).
TID_FLOW_RET=rdmaemu/setup_hw_flow_ret
# Work requests by opcode after hfi1_setup_wqe (rdmavt's rvt_post_one_wr), and packets sent by opcode.
TID_WR_EVENT=rvt_tx/rvt_post_one_wr
TID_WIRE_EVENTS="hfi1_ibhdrs/sdma_output_ibhdr hfi1_ibhdrs/pio_output_ibhdr hfi1_ibhdrs/ack_output_ibhdr"
# The device model's counters (both HFIs summed; docs/hfi1-fabric.md "TID RDMA on the wire").
TID_DM_COUNTERS="wire_rx_kdeth_read_resp_bytes wire_rx_kdeth_write_data_bytes flows_programmed \
rcv_array_expected_programmed wire_rx_kdeth_expected wire_rx_kdeth_suppressed wire_rx_kdeth_eager \
wire_rx_kdeth_errors rx_seq_mismatch rx_gen_mismatch rx_tid_invalid_entry"
# HFI1_CAP_TID_RDMA and HFI1_CAP_OPFN (include/uapi/rdma/hfi/hfi1_user.h:98, 109).
TID_CAPS=$((0x20 | 0x10000))
# IB_WR_TID_RDMA_WRITE / _READ = IB_WR_RESERVED1 / 2 (include/rdma/tid_rdma_defs.h, ib_verbs.h: 0xf0, 0xf1);
# IB_WR_RDMA_WRITE 0, IB_WR_RDMA_READ 4.
TID_WR_TID_WRITE=240 TID_WR_TID_READ=241
# TID_OP(RESYNC) on the wire: IB_OPCODE_TID_RDMA 0xE0 + 6 (include/rdma/tid_rdma_defs.h:76-95).
TID_OP_RESYNC=230
TID_INST=$TRACING/instances/rdmaemu-tid
TID_BYTES=262144

# --- counting ------------------------------------------------------------------------------------------------
# A hist trigger's total hits ("Hits: N" of its hist file), 0 without one.
hist_total() { # system/event
    awk '/^ *Hits:/ { print $2; found = 1 } END { if (!found) print 0 }' "$TID_INST/events/$1/hist" 2>/dev/null
}
# "PREFIX.KEY=HITS ..." of hist triggers keyed on opcode, summed over the events given.
hist_by_opcode() { # prefix system/event...
    p=$1; shift
    for e in "$@"; do cat "$TID_INST/events/$e/hist" 2>/dev/null; done \
        | awk -v p="$p" '/^\{ opcode:/ { n[$3] += $6 } END { for (k in n) printf "%s.%s=%d ", p, k, n[k] }'
}

# One snapshot of every count the steps compare, and the kernel's RC counters (fabric.sh), as "NAME=VALUE ..."
# in TID_SNAP (not echoed: host_call must run in this shell, which keeps the request sequence).
TID_SNAP="" TID_SNAP_ERR=""
tid_snapshot() {
    s=""
    for f in $TID_KFUNCS; do s="$s k.$f=$(kprobe_count "$f")"; done
    # Calls that found no free flow: the hits of the return probe's non-zero keys.
    s="$s flows_busy=$(awk '/^\{ ret:/ && $3 != "0" { n += $6 } END { print n + 0 }' \
        "$TID_INST/events/$TID_FLOW_RET/hist" 2>/dev/null)"
    for e in $TID_EVENTS; do s="$s e.${e#*/}=$(hist_total "$e")"; done
    # shellcheck disable=SC2086 # event list
    s="$s $(hist_by_opcode wr $TID_WR_EVENT) $(hist_by_opcode wire $TID_WIRE_EVENTS) $(rc_counters)"
    # shellcheck disable=SC2086 # counter names
    if host_call counters names "$TID_DM_COUNTERS"; then
        set -- $HOST_REPLY
        for c in $TID_DM_COUNTERS; do s="$s d.$c=${1:-0}"; shift; done
    else
        TID_SNAP_ERR="the host gave no device counters: $HOST_REPLY"
    fi
    TID_SNAP=$s
}

# What moved between two snapshots, as a JSON object; a name missing from the first counts from 0 there (an
# opcode's first packets).
tid_moved() { # before after
    awk -v before="$1" -v after="$2" 'BEGIN {
        n = split(before, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); b[kv[1]] = kv[2] }
        n = split(after, f, " "); out = ""
        for (i = 1; i <= n; i++) {
            split(f[i], kv, "="); d = kv[2] - b[kv[1]]
            if (kv[1] != "" && d != 0) out = out (out ? "," : "") "\"" kv[1] "\":" sprintf("%.0f", d)
        }
        print "{" out "}" }'
}

# A value of a tid_moved object (0 when it did not move).
moved() { # json name
    printf '%s' "$1" | tr ',{}' '\n' | awk -F: -v k="\"$2\"" '$1 == k { print $2; found = 1 } END { if (!found) print 0 }'
}

# --- steps ---------------------------------------------------------------------------------------------------
# The driver took both bits; kprobes on the four functions and the hist triggers are armed.
step_tid_setup() {
    begin tid-setup
    err=""
    mask=$(cat /sys/module/hfi1/parameters/cap_mask 2>/dev/null)
    [ $((${mask:-0} & TID_CAPS)) = "$TID_CAPS" ] || err="hfi1's cap_mask is ${mask:-unreadable}: TID_RDMA (0x20) or OPFN (0x10000) missing;"
    grep -q '^tracefs ' /proc/mounts || mount -t tracefs tracefs "$TRACING" 2>/dev/null
    echo 0 >"$TRACING/tracing_on"
    for f in $TID_KFUNCS; do
        kprobe_count_start "$f" 2>/dev/null || err="$err no kprobe on $f;"
    done
    mkdir -p "$TID_INST" 2>/dev/null
    for e in $TID_EVENTS; do
        echo 'hist:keys=common_pid' >"$TID_INST/events/$e/trigger" 2>/dev/null || err="$err no hist trigger on $e;"
    done
    for e in $TID_WR_EVENT $TID_WIRE_EVENTS; do
        echo 'hist:keys=opcode' >"$TID_INST/events/$e/trigger" 2>/dev/null || err="$err no hist trigger on $e;"
    done
    { echo "r:$TID_FLOW_RET hfi1_kern_setup_hw_flow ret=\$retval:s32" >>"$TRACING/kprobe_events" &&
        echo 'hist:keys=ret' >"$TID_INST/events/$TID_FLOW_RET/trigger"; } 2>/dev/null ||
        err="$err no return probe on hfi1_kern_setup_hw_flow;"
    # The negotiated parameters themselves, in the instance's buffer (a few events per queue pair).
    echo 1 >"$TID_INST/events/hfi1_tid/hfi1_opfn_param/enable" 2>/dev/null
    echo 1 >"$TID_INST/tracing_on"
    tid_snapshot
    TID_BASE=$TID_SNAP
    [ -z "$TID_SNAP_ERR" ] || err="$err $TID_SNAP_ERR;"
    members="\"cap_mask\":$(json_str "$mask"),\"kfuncs\":$(json_str "$TID_KFUNCS")"
    if [ -z "$err" ]; then record tid-setup true "$t" "" "$members"
    else record tid-setup false "$t" "${err# }" "$members"; fi
}

# A step's deltas: the members of its record and the checks. Sets TID_MOVED.
tid_measure() { # before
    tid_snapshot
    TID_MOVED=$(tid_moved "$1" "$TID_SNAP")
}

# Checks shared by the traffic steps: what the kernel posted and what the device placed. Appends to err.
tid_expect() { # what(read|write)
    case "$1" in
        read) wr=$TID_WR_TID_READ bytes=d.wire_rx_kdeth_read_resp_bytes wire=229 ;;
        write) wr=$TID_WR_TID_WRITE bytes=d.wire_rx_kdeth_write_data_bytes wire=226 ;;
    esac
    [ "$(moved "$TID_MOVED" "wr.$wr")" -gt 0 ] || err="$err no TID RDMA $1 work request posted (IB_WR opcode $wr);"
    [ "$(moved "$TID_MOVED" "$bytes")" -gt 0 ] || err="$err the device placed no TID RDMA $1 data through TIDs;"
    [ "$(moved "$TID_MOVED" "wire.$wire")" -gt 0 ] || err="$err no TID RDMA $1 data packet (opcode $wire) sent;"
    [ "$(moved "$TID_MOVED" "k.hfi1_kern_exp_rcv_setup")" -gt 0 ] || err="$err hfi1_kern_exp_rcv_setup never ran;"
}

# perftest's READ or WRITE bandwidth at 256 KiB: it checks no data, the deltas show the path it took.
step_tid_perftest() { # step what tool args...
    name=$1 what=$2; shift 2
    begin "$name"; host_deadline "$name" "$KDRIVER_TIMEOUT"
    tid_snapshot; before=$TID_SNAP
    run_pair "$KDRIVER_TIMEOUT" "$@"
    tid_measure "$before"
    host_deadline_end "$name"
    err=""
    line=$(awk '$1 ~ /^[0-9]+$/ && NF >= 4 { l = $0 } END { print l }' /tmp/client.out)
    [ "$PAIR_RC" = 0 ] && [ -n "$line" ] || err="$*: $(timeout_msg "$PAIR_RC" "$KDRIVER_TIMEOUT"): $(pair_tail);"
    tid_expect "$what"
    # shellcheck disable=SC2086 # the result line's fields
    set -- $line
    members="\"result\":$(json_str "$line"),\"bw_avg_mb_s\":${4:-null},\"moved\":$TID_MOVED"
    if [ -z "$err" ]; then record "$name" true "$t" "" "$members"
    else record "$name" false "$t" "${err# }" "$members"; fi
}

# verbs-check: WRITE then READ, every byte and the guards compared. The first 4 KiB transfer lets OPFN
# negotiate (work requests posted before it completes use plain RDMA); the page-aligned transfers of 256 KiB
# and more then go by TID RDMA, the ones a byte off a page by plain RDMA (setup_tid_rdma_wqe's conditions).
TID_CHECK_SIZES=4096,262144,1M,4M
step_tid_verbs_check() { tid_check_step tid-verbs-check "" -s "$TID_CHECK_SIZES"; }

# A verbs-check step: NAME, extra result members (JSON, with a trailing comma, or empty), then verbs-check's
# own options. Every byte and the guards compared; TID READ and WRITE must both have run.
tid_check_step() {
    tc_name=$1 tc_extra=$2
    shift 2
    begin "$tc_name"; host_deadline "$tc_name" "$KDRIVER_TIMEOUT"
    tid_snapshot; before=$TID_SNAP
    run_to "$KDRIVER_TIMEOUT" verbs-check -a "$FABRIC_A" -b "$FABRIC_B" "$@" -t "$((KDRIVER_TIMEOUT - 10))"
    rc=$?
    tid_measure "$before"
    host_deadline_end "$tc_name"
    err=""
    summary=$(grep '"summary"' "$OUT" | tail -n 1)
    [ "$rc" = 0 ] && [ -n "$summary" ] || err="verbs-check $*: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
    tid_expect read
    tid_expect write
    members="$tc_extra\"summary\":${summary:-null},\"moved\":$TID_MOVED,\"output\":$(json_str "$(head -c 16384 "$OUT")")"
    if [ -z "$err" ]; then record "$tc_name" true "$t" "" "$members"
    else record "$tc_name" false "$t" "${err# }" "$members"; fi
}

# OPFN negotiated: request, response and reply on the queue pairs, and each side's parameters (hfi1_opfn_param:
# the peer's KDETH QP 0x80 << 16 | ctxt and a 256 KiB segment, tid_rdma_opfn_init).
step_tid_opfn() {
    begin tid-opfn
    err=""
    tid_measure "$TID_BASE"
    for e in $TID_EVENTS; do
        case "$e" in *opfn*) [ "$(moved "$TID_MOVED" "e.${e#*/}")" -gt 0 ] || err="$err no ${e#*/} event;" ;; esac
    done
    remote=$(grep -m 1 'remote' "$TID_INST/trace" 2>/dev/null | sed 's/^.*hfi1_opfn_param: //')
    case "$remote" in
        *"max length 262144"*) ;;
        *) err="$err no remote OPFN parameters with a 256 KiB segment: ${remote:-none};" ;;
    esac
    members="\"remote_params\":$(json_str "$remote"),\"moved\":$TID_MOVED"
    if [ -z "$err" ]; then record tid-opfn true "$t" "" "$members"
    else record tid-opfn false "$t" "${err# }" "$members"; fi
}

# More queue pairs with TID RDMA READs in flight than a receive context has flows (32, RXE_NUM_TID_FLOWS) or
# RcvArray groups (ci/run-qemu.sh gives the run a smaller partition: 32 groups a context, of which the eager
# buffers take some, and a 256 KiB segment needs two). A QP holds one flow while it has segments in flight, so
# hfi1_kern_setup_hw_flow finds none free and queues the QP (tid_rdma.c:813-817); a QP with a flow whose
# segment finds too few groups is queued as well (kern_alloc_tids, 1293, then 1537). Both queues go through
# queue_qp_for_tid_wait (564-580), and the QPs resume as flows and groups are released. perftest on 40 QPs with
# two READs in flight each keeps far more segments in flight than either; verbs-check on 40 pairs then compares
# every byte under the same load. Each TID QP allocates flow state for every send queue entry and responder slot
# (hfi1_qp_priv_init, order-2 pages): 40 QPs a side do not fit the 512 MiB guest next to opa-fm's sm (330 MiB),
# whose sweeps are done, so it is stopped first (the ports stay ACTIVE without it).
# The QPs' ACK timeout is 4.096 us * 2^18, about 1 s, rather than perftest's 2^14 (67 ms): 40 QPs a side on the
# guest's one TCG vCPU answer slower than that under load, and the retries that follow can run a QP out of
# them (seen with a build running beside the guest: "exit status 1", RcTimeOut 697).
# How many segments are in flight at once must not depend on how fast the host answers: on a fast host, or with
# the device model's --low-latency, too few were and neither queue ran. So every
# packet to hfi1_1 (perftest's client, which posts the READs) arrives TID_EXHAUST_DELAY_MS late while perftest
# runs (the cable's cable-delay fault, the same delay for each, so their order stays): a READ holds its flow and
# RcvArray groups on hfi1_1 until its response is in, at least that long, while perftest posts the other QPs'.
TID_EXHAUST_QPS=40 TID_EXHAUST_TIMEOUT=18 TID_EXHAUST_DELAY_MS=100
step_tid_exhaust() {
    begin tid-exhaust; host_deadline tid-exhaust "$KDRIVER_TIMEOUT"
    sm_stop 30
    err="" fired=""
    tid_snapshot; before=$TID_SNAP
    delay="cable-delay,ms=$TID_EXHAUST_DELAY_MS,count=forever"
    if host_call fault hfi hfi1-wfr1 spec "$delay"; then
        run_pair "$KDRIVER_TIMEOUT" ib_read_bw -q "$TID_EXHAUST_QPS" -s "$TID_BYTES" -n 10 -t 2 -u "$TID_EXHAUST_TIMEOUT"
        line=$(awk '$1 ~ /^[0-9]+$/ && NF >= 4 { l = $0 } END { print l }' /tmp/client.out)
        [ "$PAIR_RC" = 0 ] && [ -n "$line" ] || err="ib_read_bw -q $TID_EXHAUST_QPS -u $TID_EXHAUST_TIMEOUT: $(timeout_msg "$PAIR_RC" "$KDRIVER_TIMEOUT"): $(pair_tail);"
    else
        err="arming hfi1-wfr1:$delay: $HOST_REPLY;" line=""
    fi
    if host_call fault-clear; then fired=$HOST_REPLY; else err="$err clearing the delay: $HOST_REPLY;"; fi
    [ "${fired:-0}" -gt 0 ] 2>/dev/null || err="$err the delay held no packet;"
    tid_measure "$before"
    host_deadline_end tid-exhaust
    tid_expect read
    [ "$(moved "$TID_MOVED" k.queue_qp_for_tid_wait)" -gt 0 ] || err="$err queue_qp_for_tid_wait never ran;"
    [ "$(moved "$TID_MOVED" e.hfi1_msg_alloc_tids)" -gt 0 ] || err="$err no segment ran out of RcvArray groups;"
    members="\"qps\":$TID_EXHAUST_QPS,\"delay\":$(json_str "hfi1-wfr1:$delay"),\"delayed\":${fired:-null},\"flows_busy\":$(moved "$TID_MOVED" flows_busy),\
\"rcvarray_groups_short\":$(moved "$TID_MOVED" e.hfi1_msg_alloc_tids),\"result\":$(json_str "$line"),\"moved\":$TID_MOVED"
    if [ -z "$err" ]; then record tid-exhaust true "$t" "" "$members"
    else record tid-exhaust false "$t" "${err# }" "$members"; fi

    tid_check_step tid-exhaust-check "\"pairs\":$TID_EXHAUST_QPS," -q "$TID_EXHAUST_QPS" -s 4096,262144 \
        -u "$TID_EXHAUST_TIMEOUT"
}

# The cable loses, reorders or corrupts packets of TID flows while verbs-check moves data with every byte
# compared: READ responses arrive at hfi1_0 (hfi1-wfr), WRITE data at hfi1_1 (hfi1-wfr1). A lost or corrupted
# expected packet leaves its flow behind, the next one makes a FLOW_SEQ_ERR entry, and the kernel restarts the
# READ from the flow's next PSN or NAKs the WRITE (hfi1_handle_kdeth_eflags, tid_rdma.c:2746-2811, 2956-3029).
TID_FAULT_SIZES=4096,262144,1M
step_tid_fault() { # step wire-opcode-that-must-be-sent|"" device spec [device spec]...
    name=$1 must=$2
    shift 2
    begin "$name"; host_deadline "$name" "$KDRIVER_TIMEOUT"
    err="" fired="" armed="" n=0
    tid_snapshot; before=$TID_SNAP
    while [ $# -ge 2 ]; do
        host_call fault hfi "$1" spec "$2" || err="$err arming $1:$2: $HOST_REPLY;"
        armed="$armed${armed:+ }$1:$2" n=$((n + 1))
        shift 2
    done
    if [ -z "$err" ]; then
        run_to "$KDRIVER_TIMEOUT" verbs-check -a "$FABRIC_A" -b "$FABRIC_B" -s "$TID_FAULT_SIZES" -t "$((KDRIVER_TIMEOUT - 10))"
        rc=$?
        summary=$(grep '"summary"' "$OUT" | tail -n 1)
        [ "$rc" = 0 ] && [ -n "$summary" ] || err="verbs-check: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
    fi
    if host_call fault-clear; then fired=$HOST_REPLY; else err="$err clearing the faults: $HOST_REPLY;"; fi
    [ "${fired:-0}" -ge "$n" ] 2>/dev/null || err="$err the faults fired ${fired:-?} times, fewer than the $n armed;"
    tid_measure "$before"
    [ -z "$must" ] || [ "$(moved "$TID_MOVED" "wire.$must")" -gt 0 ] || err="$err no packet of opcode $must sent;"
    host_deadline_end "$name"
    members="\"fault\":$(json_str "$armed"),\"fired\":${fired:-null},\"summary\":${summary:-null},\"moved\":$TID_MOVED"
    if [ -z "$err" ]; then record "$name" true "$t" "" "$members"
    else record "$name" false "$t" "${err# }" "$members"; fi
}


# --- the run -------------------------------------------------------------------------------------------------
run_tid_rdma() {
    step_tid_setup
    # perftest posts up to its send queue depth at once, and only work requests posted after OPFN finished go by
    # TID RDMA: whether its WRITE warm-up gets OPFN done before the measured WRITEs are posted is a race, so
    # both run at a depth of 4, which leaves most of the 40 to TID RDMA.
    step_tid_perftest tid-read-bw read ib_read_bw -s "$TID_BYTES" -n 40 -t 4
    step_tid_perftest tid-write-bw write ib_write_bw -s "$TID_BYTES" -n 40 -t 4
    step_tid_verbs_check
    step_tid_opfn
    step_tid_fault tid-fault-read-drop "" hfi1-wfr "cable-drop,prob=0.02,seed=7,count=3"
    step_tid_fault tid-fault-read-reorder "" hfi1-wfr "cable-reorder,prob=0.02,seed=5,count=3"
    # Only WRITE DATA packets (0xE2), whose loss the flow's next packet reveals (a sequence error, NAK, resend):
    # a corrupted WRITE DATA LAST (0xE3) of a first segment is never recovered, the kernel's RESYNC defect
    # (docs/kernel-findings.md, 3), and which packet 2 % of them hits depends on the arrival order.
    step_tid_fault tid-fault-write-corrupt "" hfi1-wfr1 "cable-corrupt,opcode=0xe2,prob=0.02,seed=11,count=3,byte=200"
    # A WRITE DATA packet (0xE2) in the middle of the 1 MiB WRITE's second segment is lost (the 256 KiB WRITE
    # sends 63, the first segment 64), and so is the NAK the responder sends for it: the step's second and third
    # TID ACKs (0xE7) to hfi1_0 are lost, after the 256 KiB WRITE's, and the NAK is one of them whether or not the
    # first segment's ACK went out before it (a lost ACK is made good by a later one). The requester never hears
    # of the loss, its TID retry timer fires and it sends RESYNC (0xE6, hfi1_tid_retry_timeout,
    # tid_rdma.c:4798-4841); the responder moves the flow to the next generation and ACKs from the PSN it had
    # (hfi1_rc_rcv_tid_rdma_resync, 4869-4977; make_tid_rdma_ack, 5186-5320), and the requester sends the rest
    # again. Where the kernel's own RESYNC does not recover (a lost last packet of a request, or a loss in its
    # first segment): docs/kernel-tid-rdma.md.
    step_tid_fault tid-fault-write-resync "$TID_OP_RESYNC" \
        hfi1-wfr1 "cable-drop,opcode=0xe2,nth=158" hfi1-wfr "cable-drop,opcode=0xe7,nth=2,count=2"
    step_tid_exhaust
    # The result's kernel_functions and tid_rdma: everything since tid-setup.
    tid_measure "$TID_BASE"
    kf=""
    for f in $TID_KFUNCS; do kf="$kf${kf:+,}\"$f\":$(moved "$TID_MOVED" "k.$f")"; done
    echo "$kf" >"$KFUNC_JSON"
    echo "{\"read_bytes\":$(moved "$TID_MOVED" d.wire_rx_kdeth_read_resp_bytes),\
\"write_bytes\":$(moved "$TID_MOVED" d.wire_rx_kdeth_write_data_bytes),\
\"flows_programmed\":$(moved "$TID_MOVED" d.flows_programmed),\
\"rcvarray_entries_programmed\":$(moved "$TID_MOVED" d.rcv_array_expected_programmed),\
\"moved\":$TID_MOVED}" >"$TID_JSON"
}
