# The fabric run of the test guest (rdma_emu.fabric=1): two chip-personality HFIs on one cable, brought up by
# the stock hfi1 driver and opa-fm, then verbs traffic between them, the kernel under cable faults and, on
# request, a link bounce. Sourced by /init (busybox sh) for its functions; uses init's helpers (begin, record,
# json_str, run_to, wait_for, host_call, host_deadline, sm_start, ...). docs/hfi1-fabric.md describes what is checked.

FABRIC_A=hfi1_0 FABRIC_B=hfi1_1
FABRIC_T0=""                    # uptime when modprobe hfi1 started
FABRIC_KLOG_MARK=0              # kernel log lines before the fabric run
FABRIC_JSON=/tmp/fabric.json    # the result's "fabric" member: ports and the SM's discovery line
KFUNC_JSON=/tmp/kernel-functions.json
TRACING=/sys/kernel/tracing

# --- talking to the host ------------------------------------------------------------------------------------
# Through init's host_call (ci/run-qemu.sh answers on the console's input). The fabric run's requests:
#   fault hfi DEVICE spec SPEC   arm a fault on a device (docs/observe.md, fault specs)
#   fault-clear                  disarm every fault of both HFIs; replies "FIRED" (how often they fired in total)
#   accesses                     "READS WRITES PACKETS": trapped CSR accesses of both HFIs, packets the cable carried
#   counters names "NAME..."     the device model's counters of those names, each summed over both HFIs (tid-rdma.sh)

# --- the ports ----------------------------------------------------------------------------------------------
# A GUID as 0x and 16 hex digits, from sysfs's 0011:7501:0100:0001 or the driver's 11750101000001.
guid_norm() {
    g=$(printf '%s' "$1" | tr -d ':' | tr 'A-F' 'a-f')
    g=${g#0x}
    while [ ${#g} -lt 16 ]; do g="0$g"; done
    echo "0x$g"
}

node_guid() { guid_norm "$(cat "/sys/class/infiniband/$1/node_guid" 2>/dev/null)"; }
port_lid() { v=$(cat "/sys/class/infiniband/$1/ports/1/lid" 2>/dev/null); echo "$((v))"; }

# What the driver said of its neighbour when the link came up ("Neighbor Guid %llx, Type %d, Port Num %d",
# intr.c handle_linkup_change): "GUID TYPE PORT", the last time it said so.
neighbor_of() { # ib-device
    dmesg | sed -n "s/.* $1: Neighbor Guid \([0-9a-fA-F]*\), Type \([0-9]*\), Port Num \([0-9]*\).*/\1 \2 \3/p" | tail -n 1
}

# One port as the result records it.
port_json() { # ib-device
    d=/sys/class/infiniband/$1/ports/1
    set -- "$1" $(neighbor_of "$1")
    nguid=null
    [ -n "$2" ] && nguid=$(json_str "$(guid_norm "$2")")
    echo "{\"device\":$(json_str "$1"),\"node_guid\":$(json_str "$(node_guid "$1")"),\
\"phys_state\":$(json_str "$(cat "$d/phys_state" 2>/dev/null)"),\"state\":$(json_str "$(cat "$d/state" 2>/dev/null)"),\
\"lid\":$(port_lid "$1"),\"neighbor_guid\":$nguid,\"neighbor_type\":${3:-null},\"neighbor_port\":${4:-null}}"
}

both_in_state() { # state-number phys-number(or -)
    for dev in $FABRIC_A $FABRIC_B; do
        [ "$(state_num "/sys/class/infiniband/$dev/ports/1/state")" = "$1" ] || return 1
        [ "$2" = - ] || [ "$(state_num "/sys/class/infiniband/$dev/ports/1/phys_state")" = "$2" ] || return 1
    done
}

since_t0() { now; awk -v a="$FABRIC_T0" -v b="$NOW" 'BEGIN { printf "%.3f", b - a }'; }

# --- bring-up -----------------------------------------------------------------------------------------------
# modprobe hfi1 binds both functions and registers hfi1_0 and hfi1_1.
step_fabric_modprobe() {
    begin fabric-modprobe; host_deadline fabric-modprobe "$KDRIVER_TIMEOUT"
    FABRIC_KLOG_MARK=$(dmesg | wc -l)
    err=""
    for m in $IB_USER_MODULES; do
        [ -d "/sys/module/$m" ] || run_to "$KDRIVER_TIMEOUT" modprobe "$m" || err="$err modprobe $m: $(out_tail);"
    done
    dma_err=$(hfi1_dma_prepare)
    [ -z "$dma_err" ] || err="$err hfi1_dma=$HFI1_DMA: $dma_err"
    now; FABRIC_T0=$NOW
    set -f
    # shellcheck disable=SC2086 # the parameters are meant to split
    run_to "$KDRIVER_TIMEOUT" modprobe hfi1 $HFI1_PARAMS
    rc=$?
    set +f
    [ "$rc" = 0 ] || err="$err modprobe hfi1 $HFI1_PARAMS: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
    wait_for 10 '[ -e /sys/class/infiniband/$FABRIC_A ] && [ -e /sys/class/infiniband/$FABRIC_B ]' \
        || err="$err not both of $FABRIC_A and $FABRIC_B registered: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ');"
    bound=""
    for a in $FABRIC_ADDRS; do
        drv=-
        [ -e "/sys/bus/pci/devices/$a/driver" ] && drv=$(basename "$(readlink "/sys/bus/pci/devices/$a/driver")")
        [ "$drv" = hfi1 ] || err="$err $a is bound to $drv, not hfi1;"
        bound="$bound${bound:+,}$(json_str "$a")"
    done
    probe_s=$(since_t0)
    host_deadline_end fabric-modprobe
    members="\"probe_s\":$probe_s,\"functions\":[$bound],\"params\":$(json_str "$HFI1_PARAMS"),\"iommu_domains\":$(json_str "$(hfi1_dma_domains)")"
    if [ -z "$err" ]; then record fabric-modprobe true "$t" "" "$members"
    else record fabric-modprobe false "$t" "${err# }" "$members"; return 1; fi
}

# Both ports train to LinkUp and logical INIT, each seeing the other as its neighbour (an HFI, port 1).
step_fabric_init() {
    begin fabric-init; host_deadline fabric-init 60
    err=""
    wait_for 30 'both_in_state 2 5' || err="not both ports INIT/LinkUp within 30 s;"
    init_s=$(since_t0)
    for pair in "$FABRIC_A $FABRIC_B" "$FABRIC_B $FABRIC_A"; do
        set -- $pair
        set -- "$1" "$2" $(neighbor_of "$1")
        if [ -z "$3" ]; then err="$err $1 logged no neighbour;"; continue; fi
        [ "$(guid_norm "$3")" = "$(node_guid "$2")" ] || err="$err $1's neighbour is $(guid_norm "$3"), not $2's $(node_guid "$2");"
        [ "$4" = 0 ] || err="$err $1's neighbour is of type $4, not an HFI (0);"
        [ "$5" = 1 ] || err="$err $1's neighbour port is $5, not 1;"
    done
    host_deadline_end fabric-init
    members="\"init_s\":$init_s,\"ports\":[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    if [ -z "$err" ]; then record fabric-init true "$t" "" "$members"
    else record fabric-init false "$t" "${err# }" "$members"; return 1; fi
}

# The discovery line of the sm's last finished sweep.
sm_discovery() { grep "DISCOVERY CYCLE \(END\|FAIL\)" "$OPAFM_LOG" 2>/dev/null | tail -n 1; }

# opa-fm's sm on hfi1_0 sweeps the fabric (2 HFIs), assigns the LIDs and takes both ports to ACTIVE. It keeps
# running for the steps after.
step_fabric_sm() {
    begin fabric-sm; host_deadline fabric-sm 120
    err="" smline=""
    now; t_sm=$NOW
    if sm_start "$FABRIC_A"; then
        wait_for 60 'sm_discovery | grep -q . || ! alive $SM_PID'
        smline=$(sm_discovery)
        case "$smline" in
            *"DISCOVERY CYCLE END."*" 2 HFIs,"*) ;;
            "") err="$err sm finished no sweep within 60 s: $(tail -n 3 /var/log/opafm.out);" ;;
            *) err="$err sm: $smline;" ;;
        esac
        wait_for 60 'both_in_state 4 5' || err="$err not both ports ACTIVE within 60 s;"
        alive "$SM_PID" || err="$err sm exited: $(tail -n 3 /var/log/opafm.out);"
    else
        err="cannot point opafm.xml at $FABRIC_A's port GUID"
    fi
    active_s=$(since_t0)
    now; sm_to_active_s=$(awk -v a="$t_sm" -v b="$NOW" 'BEGIN { printf "%.3f", b - a }')
    la=$(port_lid $FABRIC_A) lb=$(port_lid $FABRIC_B)
    { [ "$la" -gt 0 ] && [ "$lb" -gt 0 ] && [ "$la" != "$lb" ]; } || err="$err LIDs $la and $lb are not two distinct LIDs;"
    sweep_s=$(echo "$smline" | sed -n 's/.*, \([0-9.]*\) sec sweep.*/\1/p')
    retries=$(echo "$smline" | sed -n 's/.* \([0-9]*\) retries.*/\1/p')
    host_deadline_end fabric-sm
    ports="[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    echo "{\"ports\":$ports,\"sm_discovery\":$(json_str "$smline")}" >"$FABRIC_JSON"
    members="\"active_s\":$active_s,\"sm_to_active_s\":$sm_to_active_s,\"sweep_s\":${sweep_s:-null},\
\"sweep_retries\":${retries:-null},\"sm_line\":$(json_str "$smline"),\"ports\":$ports"
    if [ -z "$err" ]; then record fabric-sm true "$t" "" "$members"
    else record fabric-sm false "$t" "${err# }" "$members"; return 1; fi
}

# opasmaquery reads NodeInfo across the cable: by LID from each side and by directed route from hfi1_0. The
# NodeGUIDs must be the ones the device model configured (rdma_emu.fabric_guids) and the kernel reports. The
# SMPs of the step are counted, and the host's CSR access totals before and after (with an idle window of the
# same length before them for the background) give the trapped accesses per SMP.
FABRIC_SMPS=20
step_fabric_smp() {
    begin fabric-smp; host_deadline fabric-smp 120
    err=""
    want_a=${FABRIC_GUIDS%%,*} want_b=${FABRIC_GUIDS#*,}
    [ "$(node_guid $FABRIC_A)" = "$want_a" ] || err="$err $FABRIC_A's node GUID is $(node_guid $FABRIC_A), the device model's $want_a;"
    [ "$(node_guid $FABRIC_B)" = "$want_b" ] || err="$err $FABRIC_B's node GUID is $(node_guid $FABRIC_B), the device model's $want_b;"
    la=$(port_lid $FABRIC_A) lb=$(port_lid $FABRIC_B)
    got=""
    # HFI, address (a LID, or a directed route: out of port 1), the NodeGUID expected there.
    for q in "1 -l:$lb $want_b" "2 -l:$la $want_a" "1 1 $want_b"; do
        set -- $q
        hfi=$1 args=$(echo "$2" | tr : ' ') want=$3
        # shellcheck disable=SC2086 # $args splits
        run_to 30 opasmaquery -h "$hfi" -o nodeinfo $args
        rc=$?
        g=$(sed -n 's/^NodeGuid: \(0x[0-9a-fA-F]*\).*/\1/p' "$OUT" | head -n 1)
        got="$got${got:+,}{\"hfi\":$hfi,\"address\":$(json_str "$args"),\"node_guid\":$(json_str "$g")}"
        if [ "$rc" != 0 ]; then err="$err opasmaquery -h $hfi -o nodeinfo $args: $(timeout_msg "$rc" 30): $(out_tail);"
        elif [ "$(guid_norm "$g")" != "$want" ]; then err="$err opasmaquery -h $hfi $args: NodeGuid ${g:-none}, expected $want;"; fi
    done
    # Trapped accesses per SMP: an idle window, then FABRIC_SMPS queries by LID, each a round trip.
    per_smp=null
    if host_call accesses; then
        a0=$HOST_REPLY; now; i0=$NOW
        sleep 3
        host_call accesses && a1=$HOST_REPLY
        now; s0=$NOW; n=0
        while [ "$n" -lt "$FABRIC_SMPS" ]; do
            run_to 30 opasmaquery -o nodeinfo -l "$lb" || { err="$err opasmaquery $n failed: $(out_tail);"; break; }
            n=$((n + 1))
        done
        now; s1=$NOW
        if host_call accesses && [ -n "$a1" ]; then
            per_smp=$(echo "$a0 $a1 $HOST_REPLY" | awk -v idle="$(awk -v a="$i0" -v b="$s0" 'BEGIN { print b - a }')" \
                -v busy="$(awk -v a="$s0" -v b="$s1" 'BEGIN { print b - a }')" -v n="$n" '{
                    bg = (($4 + $5) - ($1 + $2)) / idle; acc = ($7 + $8) - ($4 + $5) - bg * busy
                    printf "{\"smps\":%d,\"accesses\":%d,\"background_per_s\":%.1f,\"per_smp\":%.1f,\"packets\":%d}", n, ($7 + $8) - ($4 + $5), bg, acc / n, $9 - $6 }')
        fi
    fi
    [ "$per_smp" != null ] || err="$err the host gave no access totals: $HOST_REPLY;"
    host_deadline_end fabric-smp
    members="\"queries\":[$got],\"accesses\":$per_smp"
    if [ -z "$err" ]; then record fabric-smp true "$t" "" "$members"
    else record fabric-smp false "$t" "${err# }" "$members"; fi
}

# --- verbs traffic (hfi1_0 serves, hfi1_1 connects over 127.0.0.1) ----------------------------------------
# Whether something listens on TCP port $1 (the tools exchange their QP numbers over TCP).
PROC_NET_TCP="/proc/net/tcp /proc/net/tcp6"
listening() { # port
    hex=$(printf '%04X' "$1")
    # shellcheck disable=SC2086 # two files
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }' $PROC_NET_TCP 2>/dev/null
}

# Runs "$2 ..." as the server on hfi1_0 and "$2 ... 127.0.0.1" as the client on hfi1_1 (the same arguments $3),
# with a timeout of $1 seconds. Sets PAIR_RC (client's status, or the server's if the client passed), and
# leaves their outputs in /tmp/server.out and /tmp/client.out.
PAIR_PORT=18515
run_pair() { # secs tool args
    secs=$1 tool=$2; shift 2
    # shellcheck disable=SC2086 # the arguments are meant to split
    timeout -k 2 "$secs" "$tool" -d $FABRIC_A "$@" >/tmp/server.out 2>&1 &
    spid=$!
    # shellcheck disable=SC2016 # evaluated by wait_for
    if wait_for 20 'listening $PAIR_PORT || ! alive $spid'; then :; fi
    # shellcheck disable=SC2086
    timeout -k 2 "$secs" "$tool" -d $FABRIC_B "$@" 127.0.0.1 >/tmp/client.out 2>&1
    PAIR_RC=$?
    wait "$spid"
    src=$?
    [ "$PAIR_RC" = 0 ] && PAIR_RC=$src
    # The port is free again before the next pair starts.
    # shellcheck disable=SC2016
    wait_for 10 '! listening $PAIR_PORT'
}

pair_tail() { echo "server: $(tail -n 3 /tmp/server.out | tr '\n' ' ') client: $(tail -n 3 /tmp/client.out | tr '\n' ' ')"; }

# The port counters of the kernel's RC protocol that a lost, late or corrupt packet moves (the driver's
# software port counters, chip.c C_SW_IBP_*): "NAME=VALUE ...", both ports.
RC_COUNTERS="RcResend RcTimeOut RcSeqNak SeqNak RcDupRew PktDrop OtherNak"
rc_counters() {
    for dev in $FABRIC_A $FABRIC_B; do
        for c in $RC_COUNTERS; do
            v=$(cat "/sys/class/infiniband/$dev/ports/1/hw_counters/$c" 2>/dev/null) || continue
            printf '%s.%s=%s ' "$dev" "$c" "$v"
        done
    done
}

# The counters that moved between two rc_counters snapshots, as JSON members (a counter missing from either
# snapshot is left out).
counters_moved() { # before after
    awk -v before="$1" -v after="$2" 'BEGIN {
        n = split(before, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); b[kv[1]] = kv[2] }
        n = split(after, f, " "); out = ""
        for (i = 1; i <= n; i++) {
            split(f[i], kv, "=")
            if ((kv[1] in b) && kv[2] != b[kv[1]]) out = out (out ? "," : "") "\"" kv[1] "\":" sprintf("%.0f", kv[2] - b[kv[1]])
        }
        print "{" out "}" }'
}

# ibv_*_pingpong with -c checks every byte of every message it receives.
step_verbs_pingpong() { # step tool args...
    name=$1; shift
    begin "$name"; host_deadline "$name" "$KDRIVER_TIMEOUT"
    run_pair "$KDRIVER_TIMEOUT" "$@" -c
    host_deadline_end "$name"
    rate=$(sed -n 's/.* bytes in .* seconds = \(.*\)$/\1/p' /tmp/client.out | head -n 1)
    members="\"command\":$(json_str "$*"),\"rate\":$(json_str "$rate"),\"client\":$(json_str "$(tail -c 1024 /tmp/client.out)")"
    if [ "$PAIR_RC" = 0 ] && grep -q "iters in" /tmp/client.out; then record "$name" true "$t" "" "$members"
    else record "$name" false "$t" "$*: $(timeout_msg "$PAIR_RC" "$KDRIVER_TIMEOUT"): $(pair_tail)" "$members"; fi
}

# perftest: bandwidth only (it checks no data). The client's result line is "bytes iterations peak avg rate".
step_verbs_perftest() { # step tool args...
    name=$1; shift
    begin "$name"; host_deadline "$name" "$KDRIVER_TIMEOUT"
    run_pair "$KDRIVER_TIMEOUT" "$@"
    host_deadline_end "$name"
    line=$(awk '$1 ~ /^[0-9]+$/ && NF >= 4 { l = $0 } END { print l }' /tmp/client.out)
    set -- $line
    members="\"result\":$(json_str "$line"),\"bytes\":${1:-null},\"iterations\":${2:-null},\"bw_avg_mb_s\":${4:-null}"
    if [ "$PAIR_RC" = 0 ] && [ -n "$line" ]; then record "$name" true "$t" "" "$members"
    else record "$name" false "$t" "$name: $(timeout_msg "$PAIR_RC" "$KDRIVER_TIMEOUT"): $(pair_tail)" "$members"; fi
}

# verbs-check (testing/verbs-check): RDMA WRITE then READ between the two ends, every byte and the guards
# compared, sizes from 1 byte to 4 MiB, aligned and not.
VERBS_CHECK_SIZES=1,3,64,4095,4096,4097,65536,65537,1M,4M
step_verbs_check() {
    begin verbs-check; host_deadline verbs-check "$KDRIVER_TIMEOUT"
    run_to "$KDRIVER_TIMEOUT" verbs-check -a $FABRIC_A -b $FABRIC_B -s "$VERBS_CHECK_SIZES" -t "$((KDRIVER_TIMEOUT - 10))"
    rc=$?
    host_deadline_end verbs-check
    summary=$(grep '"summary"' "$OUT" | tail -n 1)
    members="\"rc\":$rc,\"summary\":${summary:-null},\"output\":$(json_str "$(head -c 65536 "$OUT")")"
    if [ "$rc" = 0 ] && [ -n "$summary" ]; then record verbs-check true "$t" "" "$members"
    else record verbs-check false "$t" "verbs-check: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail)" "$members"; fi
}

# Counts calls of a kernel function with a kprobe event (ftrace's kprobe_profile keeps the hits; nothing is
# written to the trace buffer).
kprobe_count_start() { # function
    grep -q '^tracefs ' /proc/mounts || mount -t tracefs tracefs "$TRACING" 2>/dev/null
    echo 0 >"$TRACING/tracing_on"
    echo "p:rdmaemu/$1 $1" >>"$TRACING/kprobe_events" && echo 1 >"$TRACING/events/rdmaemu/$1/enable"
}
# kprobe_profile: "  EVENT  HITS  MISSES", the event by its name without the group (trace_kprobe.c).
kprobe_count() { # function
    awk -v e="$1" '$1 == e { print $2 }' "$TRACING/kprobe_profile" 2>/dev/null
}

# --- the kernel under cable faults ---------------------------------------------------------------------------
# Arms a fault on one end of the cable, runs RC traffic with every byte checked, and requires the fault to have
# fired, the transfer to complete and the kernel's RC counters to show how it recovered.
step_fault_rc() { # step device spec tool args...
    name=$1 fdev=$2 spec=$3; shift 3
    begin "$name"; host_deadline "$name" "$KDRIVER_TIMEOUT"
    err="" fired=""
    before=$(rc_counters)
    if host_call fault hfi "$fdev" spec "$spec"; then
        run_pair "$KDRIVER_TIMEOUT" "$@" -c
        [ "$PAIR_RC" = 0 ] && grep -q "iters in" /tmp/client.out || err="$*: $(timeout_msg "$PAIR_RC" "$KDRIVER_TIMEOUT"): $(pair_tail);"
    else
        err="arming $fdev:$spec: $HOST_REPLY;"
    fi
    if host_call fault-clear; then fired=$HOST_REPLY; else err="$err clearing the faults: $HOST_REPLY;"; fi
    [ "${fired:-0}" -gt 0 ] 2>/dev/null || err="$err the fault never fired;"
    after=$(rc_counters)
    moved=$(counters_moved "$before" "$after")
    # The kernel's RC protocol noticed (a NAK, a resend, a timeout): the path it took is in the counters.
    [ "$moved" != "{}" ] || err="$err no RC counter moved: the fault went unnoticed;"
    host_deadline_end "$name"
    members="\"fault\":$(json_str "$fdev:$spec"),\"fired\":${fired:-null},\"command\":$(json_str "$*"),\"rc_counters_moved\":$moved,\
\"rc_counters_before\":$(json_str "$before"),\"rc_counters_after\":$(json_str "$after")"
    if [ -z "$err" ]; then record "$name" true "$t" "" "$members"
    else record "$name" false "$t" "${err# }" "$members"; fi
}

# The sm sweeps again (restarted) while the cable drops an SMP: it retries, and the fabric stays ACTIVE.
step_fault_sm() {
    begin fault-sm-drop; host_deadline fault-sm-drop 120
    err="" fired="" smline=""
    sm_stop 30
    if host_call fault hfi hfi1-wfr1 spec "cable-drop,nth=3"; then
        if sm_start "$FABRIC_A"; then
            wait_for 90 'sm_discovery | grep -q . || ! alive $SM_PID'
            smline=$(sm_discovery)
            case "$smline" in
                *"DISCOVERY CYCLE END."*" 2 HFIs,"*) ;;
                *) err="$err sm: ${smline:-no sweep finished within 90 s};" ;;
            esac
            retries=$(echo "$smline" | sed -n 's/.* \([0-9]*\) retries.*/\1/p')
            [ "${retries:-0}" -gt 0 ] || err="$err the sweep reports no retry;"
        else
            err="$err cannot start the sm;"
        fi
    else
        err="$err arming the fault: $HOST_REPLY;"
    fi
    if host_call fault-clear; then fired=$HOST_REPLY; else err="$err clearing the faults: $HOST_REPLY;"; fi
    [ "${fired:-0}" -gt 0 ] 2>/dev/null || err="$err the fault never fired;"
    both_in_state 4 5 || err="$err not both ports ACTIVE after the sweep;"
    host_deadline_end fault-sm-drop
    members="\"fault\":\"hfi1-wfr1:cable-drop,nth=3\",\"fired\":${fired:-null},\"sm_line\":$(json_str "$smline")"
    if [ -z "$err" ]; then record fault-sm-drop true "$t" "" "$members"
    else record fault-sm-drop false "$t" "${err# }" "$members"; fi
}

# --- the link ------------------------------------------------------------------------------------------------
# The SM bounces hfi1_1's link (opaportconfig: a Set(PortInfo) that takes the port offline and back); the
# link must train again and the SM take both ports back to ACTIVE.
step_fabric_bounce() {
    begin fabric-link-bounce; host_deadline fabric-link-bounce "$KDRIVER_TIMEOUT"
    err=""
    run_to "$KDRIVER_TIMEOUT" opaportconfig -l "$(port_lid $FABRIC_B)" bounce
    rc=$?
    [ "$rc" = 0 ] || err="opaportconfig bounce: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
    wait_for 60 'both_in_state 4 5' || err="$err not both ports ACTIVE again within 60 s;"
    host_deadline_end fabric-link-bounce
    members="\"ports\":[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    if [ -z "$err" ]; then record fabric-link-bounce true "$t" "" "$members"
    else record fabric-link-bounce false "$t" "${err# }" "$members"; fi
}

# The neighbour goes away with the link up: hfi1_1's function leaves the driver (its remove takes the port
# offline, init.c shutdown_device), so hfi1_0 loses the link and runs its link-down and freeze handling
# (handle_link_down, handle_linkup_change, sdma_freeze). The function comes back, both ports return to ACTIVE,
# and every byte of a WRITE and READ crosses again: hfi1_0's engines came out of the freeze.
step_fabric_peer_loss() {
    begin fabric-peer-loss; host_deadline fabric-peer-loss "$KDRIVER_TIMEOUT"
    err="" a_down=null
    addr=$(basename "$(readlink -f "/sys/class/infiniband/$FABRIC_B/device")")
    run_to "$KDRIVER_TIMEOUT" sh -c "echo $addr >/sys/bus/pci/drivers/hfi1/unbind"
    rc=$?
    if [ "$rc" != 0 ]; then
        err="unbind $addr: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
    else
        # shellcheck disable=SC2016 # evaluated by wait_for
        wait_for 30 '[ "$(state_num /sys/class/infiniband/$FABRIC_A/ports/1/phys_state)" = 2 ]' \
            || err="$FABRIC_A not polling within 30 s of losing its neighbour;"
        a_down=$(port_json $FABRIC_A)
        run_to "$KDRIVER_TIMEOUT" sh -c "echo $addr >/sys/bus/pci/drivers/hfi1/bind"
        rc=$?
        [ "$rc" = 0 ] || err="$err bind $addr: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
        # shellcheck disable=SC2016
        wait_for 60 '[ -e /sys/class/infiniband/$FABRIC_B ] && both_in_state 4 5' \
            || err="$err not both ports ACTIVE again within 60 s;"
        if [ -z "$err" ]; then
            run_to "$KDRIVER_TIMEOUT" verbs-check -a $FABRIC_A -b $FABRIC_B -s 1,65537,1048576 -t "$((KDRIVER_TIMEOUT - 10))"
            rc=$?
            [ "$rc" = 0 ] || err="verbs-check after the rebind: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
        fi
    fi
    host_deadline_end fabric-peer-loss
    members="\"address\":$(json_str "$addr"),\"a_after_loss\":$a_down,\"ports\":[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    if [ -z "$err" ]; then record fabric-peer-loss true "$t" "" "$members"
    else record fabric-peer-loss false "$t" "${err# }" "$members"; fi
}

# hfi1 sets up each port's trap timer (verbs.c:1554) and arms it with every trap it sends to the SM (mad.c:175),
# but nothing deletes it: unloading the module while one is pending oopses when it fires (docs/hfi1-fabric.md).
# The timer tracepoints of an ftrace instance, filtered to the timer's function, tell when none is pending.
TRAPS=$TRACING/instances/rdma-emu-traps
trap_timer_watch() {
    addr=$(awk '$3 == "hfi1_handle_trap_timer" { print $1; exit }' /proc/kallsyms)
    [ -n "$addr" ] && mkdir -p "$TRAPS" || return 1
    for ev in timer_start timer_expire_entry; do
        echo "function == 0x$addr" >"$TRAPS/events/timer/$ev/filter" || return 1
        echo 1 >"$TRAPS/events/timer/$ev/enable" || return 1
    done
    echo 1 >"$TRAPS/tracing_on"
}
# True while a trap timer is armed and has not fired: the last event of some timer is a start.
trap_timer_pending() {
    awk '/timer_start:|timer_expire_entry:/ {
            for (i = 1; i <= NF; i++) if ($i ~ /^timer=/) last[$i] = ($0 ~ /timer_start:/)
         }
         END { for (t in last) if (last[t]) exit 0; exit 1 }' "$TRAPS/trace"
}

# rmmod with both links up: each HFI's remove takes its up port offline through the 8051 (shutdown_device,
# hfi1_quiet_serdes, goto_offline: the path that deadlocks on the functional simulator) and the module goes.
# No trap timer may be pending then (above), and an ACTIVE port's unrepressed trap keeps its timer armed for
# ever. The SM holds a verbs context (the module is in use while it runs), and stopping it makes its port send
# a capability-change trap nobody will repress (mad.c hfi1_cap_mask_chg). So: with the SM running, let the
# traps be repressed and their timers run out; stop the SM; bounce the link, which brings both ports back to
# LinkUp and logical INIT with no SM to make them ACTIVE, where the timer drops the trap (send_trap, o14-3.2.1);
# wait for no timer pending; rmmod.
step_fabric_rmmod() {
    begin fabric-rmmod; host_deadline fabric-rmmod "$KDRIVER_TIMEOUT"
    err="" before="[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    if [ "$TRAP_WATCH" != 1 ]; then
        err="no trap-timer watch (ftrace timer events);"
    else
        # shellcheck disable=SC2016 # evaluated by wait_for
        wait_for 60 '! trap_timer_pending' || err="a trap timer still pending after 60 s with the SM running;"
    fi
    sm_stop 30
    if [ -z "$err" ]; then
        run_to "$KDRIVER_TIMEOUT" opaportconfig -l "$(port_lid $FABRIC_B)" bounce
        rc=$?
        [ "$rc" = 0 ] || err="opaportconfig bounce: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
        wait_for 60 'both_in_state 2 5' || err="$err not both ports LinkUp and INIT within 60 s of the bounce;"
        # shellcheck disable=SC2016
        wait_for 60 '! trap_timer_pending' || err="$err a trap timer still pending 60 s after the bounce;"
    fi
    up="[$(port_json $FABRIC_A),$(port_json $FABRIC_B)]"
    if [ -z "$err" ]; then
        run_to "$KDRIVER_TIMEOUT" rmmod hfi1
        rc=$?
        [ "$rc" = 0 ] || err="rmmod hfi1: $(timeout_msg "$rc" "$KDRIVER_TIMEOUT"): $(out_tail);"
        [ ! -e /sys/module/hfi1 ] || err="$err hfi1 still loaded;"
    fi
    host_deadline_end fabric-rmmod
    members="\"ports_active\":$before,\"ports_at_rmmod\":$up,\"sm_exit\":$(json_str "$SM_RC")"
    if [ -z "$err" ]; then record fabric-rmmod true "$t" "" "$members"
    else record fabric-rmmod false "$t" "${err# }" "$members"; fi
}

step_fabric_dmesg() {
    begin fabric-dmesg
    bad=$(dmesg | tail -n +"$((FABRIC_KLOG_MARK + 1))" | grep -E "$KLOG_BAD" | head -n 20)
    hfi=$(dmesg | tail -n +"$((FABRIC_KLOG_MARK + 1))" | grep -E 'hfi1' | tail -n 80)
    if [ -z "$bad" ]; then record fabric-dmesg true "$t" "" "\"hfi1_log\":$(json_str "$hfi")"
    else record fabric-dmesg false "$t" "kernel log: $bad" "\"hfi1_log\":$(json_str "$hfi")"; fi
}

# --- the run -------------------------------------------------------------------------------------------------
run_fabric() { # id
    stty -echo 2>/dev/null # the host's answers come in on the console; no need to see them twice
    begin find-fabric
    FABRIC_ADDRS=""
    vid=$(echo "${1%%:*}" | tr A-F a-f); did=$(echo "${1##*:}" | tr A-F a-f)
    for d in /sys/bus/pci/devices/*; do
        [ -e "$d/vendor" ] || continue
        read -r v <"$d/vendor"; read -r dv <"$d/device"
        [ "$v" = "0x$vid" ] && [ "$dv" = "0x$did" ] && FABRIC_ADDRS="$FABRIC_ADDRS${FABRIC_ADDRS:+ }${d##*/}"
    done
    i=0
    for a in $FABRIC_ADDRS; do
        n=hfi1-wfr; [ "$i" = 0 ] || n=hfi1-wfr$i
        echo "$(json_str "$n"):{\"id\":$(json_str "$1"),\"address\":$(json_str "$a"),\"driver\":\"hfi1\"}" >>"$DEVICES"
        i=$((i + 1))
    done
    if [ "$i" != 2 ]; then
        record find-fabric false "$t" "found $i PCI functions $1, not the fabric's two" "\"addresses\":$(json_str "$FABRIC_ADDRS")"
        return 0
    fi
    record find-fabric true "$t" "" "\"addresses\":$(json_str "$FABRIC_ADDRS")"
    ip link set lo up 2>/dev/null
    if ! { step_fabric_modprobe && step_fabric_init && step_fabric_sm; }; then
        step_fabric_dmesg
        return 0
    fi
    # The bounce alone: the run is about the link (ci/e2e.sh's fabric-bounce scenario).
    if [ "$P_fabric_bounce" = 1 ]; then
        step_fabric_bounce
        step_fabric_dmesg
        return 0
    fi
    # The OPA userspace stack: its steps instead of the plain verbs and fault steps (ci/guest/psm2.sh, which the
    # initramfs's psm2 layer brings).
    if [ "$P_psm2" = 1 ]; then
        if command -v run_psm2 >/dev/null; then run_psm2
        else begin psm2-setup; record psm2-setup false "$t" "the initramfs has no /lib/rdma-emu/psm2.sh (its psm2 layer)"; fi
        step_fabric_dmesg
        return 0
    fi
    # The wire-side fuzzer's target: live QPs reported to the host, then the guest holds (ci/guest/fuzz.sh).
    if [ "$P_fuzz_wire" = 1 ]; then
        if command -v run_fuzz_wire >/dev/null; then run_fuzz_wire
        else begin fuzz-keeper; record fuzz-keeper false "$t" "the initramfs has no /lib/rdma-emu/fuzz.sh"; fi
        step_fabric_dmesg
        return 0
    fi
    # The kernel's own TID RDMA: its steps instead of the plain verbs and fault steps (ci/guest/tid-rdma.sh).
    if [ "$P_tid_rdma" = 1 ]; then
        if command -v run_tid_rdma >/dev/null; then run_tid_rdma
        else begin tid-setup; record tid-setup false "$t" "the initramfs has no /lib/rdma-emu/tid-rdma.sh"; fi
        # TID RDMA READ and WRITE against plain RDMA and SoftRoCE (ci/run-qemu.sh --tid-rdma --fabric-perf).
        if [ "$P_fabric_perf" = 1 ]; then
            if command -v step_tid_perf >/dev/null; then step_tid_perf
            else begin tid-perf; record tid-perf false "$t" "the initramfs has no /lib/rdma-emu/perf.sh"; fi
        fi
        step_fabric_dmesg
        return 0
    fi
    {
        step_fabric_smp
        kprobe_count_start hfi1_setup_wqe 2>/dev/null
        step_verbs_pingpong verbs-rc-pio ibv_rc_pingpong -s 64 -n 200
        step_verbs_pingpong verbs-rc-sdma ibv_rc_pingpong -s 65536 -m 4096 -n 40
        step_verbs_pingpong verbs-rc-sdma-odd ibv_rc_pingpong -s 1000003 -m 4096 -n 4
        step_verbs_pingpong verbs-ud ibv_ud_pingpong -s 1024 -n 200
        step_verbs_perftest verbs-send-bw ib_send_bw -s 65536 -n 50
        step_verbs_perftest verbs-write-bw ib_write_bw -s 65536 -n 50
        step_verbs_perftest verbs-read-bw ib_read_bw -s 65536 -n 50
        step_verbs_check
        calls=$(kprobe_count hfi1_setup_wqe)
        echo "\"hfi1_setup_wqe\":${calls:-null}" >"$KFUNC_JSON"
        # The kernel survives the wire: each fault under RC traffic with every byte checked.
        step_fault_rc fault-rc-drop hfi1-wfr "cable-drop,nth=20" ibv_rc_pingpong -s 65536 -m 4096 -n 20
        step_fault_rc fault-rc-reorder hfi1-wfr1 "cable-reorder,nth=12,count=3" ibv_rc_pingpong -s 65536 -m 4096 -n 20
        step_fault_rc fault-rc-corrupt hfi1-wfr "cable-corrupt,nth=25,byte=200" ibv_rc_pingpong -s 65536 -m 4096 -n 20
        step_fault_rc fault-rc-delay hfi1-wfr1 "cable-delay,nth=10,ms=300" ibv_rc_pingpong -s 65536 -m 4096 -n 20
        step_fault_rc fault-rc-seeded hfi1-wfr "cable-drop,prob=0.02,seed=7,count=forever" ibv_rc_pingpong -s 65536 -m 4096 -n 40
        step_fault_sm
        if [ "$P_fabric_perf" = 1 ]; then
            if command -v step_fabric_perf >/dev/null; then step_fabric_perf
            else begin fabric-perf; record fabric-perf false "$t" "the initramfs has no /lib/rdma-emu/perf.sh"; fi
        fi
        # The link going down once up: on the functional simulator's icode the stock driver deadlocks there
        # (docs/hfi1-fabric.md), so these run on the RTL-simulation chip only.
        if [ "$P_hfi1_icode" = rtl-simulation ]; then
            TRAP_WATCH=0
            trap_timer_watch && TRAP_WATCH=1
            step_fabric_bounce
            step_fabric_peer_loss
            step_fabric_rmmod
        fi
    }
    step_fabric_dmesg
}
