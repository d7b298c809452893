# perftest over the emulated fabric against SoftRoCE, in the guest (busybox sh). Sourced by ci/guest/init, whose
# helpers it uses (begin, record, json_str, now, say, host_deadline, host_deadline_end, wait_for, alive) and
# fabric.sh's (listening); fabric.sh's run calls step_fabric_perf last with rdma_emu.fabric_perf=1
# (ci/run-qemu.sh --fabric-perf). docs/bench.md, case
# guest-verbs, says what is measured and why.
#
# step_fabric_perf assumes hfi1_0 and hfi1_1 ACTIVE (opa-fm's sm running) and lo up. It measures, with the same
# perftest commands on both transports:
#   hfi1: server on hfi1_1, client on hfi1_0, across the device model's cable;
#   rxe:  SoftRoCE, rxe1 on veth rxb <- rxe0 on veth rxa, the two ends of one veth pair in this namespace.
# and records one step, fabric-perf, with every figure and the ratio hfi1 / rxe at every size. Everything it sets
# up (servers, rxe links, the veth pair, the routing rules) is taken down again, whatever happened.
# shellcheck shell=sh disable=SC2154 # t comes from the init's begin

PERF_SIZES=${PERF_SIZES:-"1024 4096 16384 65536 262144 1048576 4194304"}
PERF_BW_TOOLS=${PERF_BW_TOOLS:-"ib_send_bw ib_write_bw ib_read_bw"}
PERF_LAT_TOOL=${PERF_LAT_TOOL:-ib_send_lat}
PERF_LAT_SIZE=${PERF_LAT_SIZE:-8}
PERF_LAT_ITERS=${PERF_LAT_ITERS:-200}
# Iterations per bandwidth run: PERF_BYTES worth of messages, within [PERF_MIN_ITERS, PERF_MAX_ITERS]. Under TCG
# the guest moves tens of MB/s: keep the runs short.
PERF_BYTES=${PERF_BYTES:-16777216}
PERF_MIN_ITERS=${PERF_MIN_ITERS:-8}
PERF_MAX_ITERS=${PERF_MAX_ITERS:-200}
PERF_RUN_TIMEOUT=${PERF_RUN_TIMEOUT:-90} # each perftest process
PERF_BUDGET=${PERF_BUDGET:-900}          # no run starts after this many seconds of the step
PERF_PORT=${PERF_PORT:-18700}            # perftest's TCP port: a new one per run, no TIME_WAIT in the way
PERF_DIR=/tmp/perf
PERF_JSON=/tmp/fabric-perf.json # the result's "fabric_perf" member (the init's emit_result)

# SoftRoCE's veth pair and addresses. Both ends are in this namespace, where each address is local: the kernel
# would deliver rxe0's packets to rxe1's address over lo, where no rxe device listens (rxe_udp_encap_recv finds
# the device by the receiving netdev). Rules ahead of the local table send rxeN's own flows (from its address to
# the other's, output lookups: iif lo) out of its veth end; arriving packets still meet the local table.
PERF_VETH_A=rxa PERF_VETH_B=rxb
PERF_IP_A=10.77.0.1 PERF_IP_B=10.77.0.2
PERF_TABLE_A=177 PERF_TABLE_B=178

# The device model's bytes placed through TIDs (both HFIs): READ responses and WRITE data (docs/hfi1-fabric.md).
PERF_TID_COUNTERS="wire_rx_kdeth_read_resp_bytes wire_rx_kdeth_write_data_bytes"

# Iterations for a bandwidth run of $1 bytes.
perf_iters() {
    n=$((PERF_BYTES / $1))
    [ "$n" -ge "$PERF_MIN_ITERS" ] || n=$PERF_MIN_ITERS
    [ "$n" -le "$PERF_MAX_ITERS" ] || n=$PERF_MAX_ITERS
    echo "$n"
}

# perftest's result row for SIZE in a bandwidth report: "iterations peak average msgrate" (MB/sec are MiB/s:
# perftest divides by 0x100000), nothing if there is none. The row follows the " #bytes ... BW average[MB/sec]"
# header; a report in Gb/sec (--report_gbits) gives nothing.
perf_parse_bw() { # file size
    awk -v size="$2" '
        /#bytes/ && /BW average\[MB\/sec\]/ { hdr = 1; next }
        hdr && $1 == size && NF >= 5 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ && $4 ~ /^[0-9.]+$/ && $5 ~ /^[0-9.]+$/ {
            print $2, $3, $4, $5; exit
        }' "$1" 2>/dev/null
}

# perftest's result row for SIZE in a latency report: "iterations t_min t_max t_typical t_avg t_stdev p99 p99.9"
# in microseconds, nothing if there is none.
perf_parse_lat() { # file size
    awk -v size="$2" '
        /#bytes/ && /t_typical/ { hdr = 1; next }
        hdr && $1 == size && NF >= 9 && $2 ~ /^[0-9]+$/ {
            for (i = 3; i <= 9; i++) if ($i !~ /^[0-9.]+$/) next
            print $2, $3, $4, $5, $6, $7, $8, $9; exit
        }' "$1" 2>/dev/null
}

# The last lines of a run's outputs, for an error message.
perf_tails() {
    echo "client: $(tail -n 6 "$PERF_DIR/client.out" 2>/dev/null | tr '\n' ' ') server: $(tail -n 6 "$PERF_DIR/server.out" 2>/dev/null | tr '\n' ' ')"
}

PERF_SERVER=""
perf_stop_server() {
    [ -n "$PERF_SERVER" ] || return 0
    if alive "$PERF_SERVER"; then
        kill -TERM "$PERF_SERVER" 2>/dev/null
        # shellcheck disable=SC2016 # evaluated by wait_for
        wait_for 5 '! alive $PERF_SERVER' || kill -KILL "$PERF_SERVER" 2>/dev/null
    fi
    wait "$PERF_SERVER" 2>/dev/null
    PERF_SERVER=""
}

# One perftest run: the server on SERVER-DEV in the background, the client on CLIENT-DEV connecting to it over
# 127.0.0.1. Both outputs land in $PERF_DIR/{server,client}.out. Sets PERF_WHY when it fails.
perf_run() { # tool server-dev client-dev args...
    tool=$1 sdev=$2 cdev=$3
    shift 3
    PERF_PORT=$((PERF_PORT + 1))
    PERF_WHY=""
    # busybox timeout execs the program in its own process: $! is perftest itself.
    timeout -k 2 "$PERF_RUN_TIMEOUT" "$tool" -d "$sdev" -p "$PERF_PORT" "$@" >"$PERF_DIR/server.out" 2>&1 &
    PERF_SERVER=$!
    # shellcheck disable=SC2016 # evaluated by wait_for
    if ! wait_for 30 'listening $PERF_PORT || ! alive $PERF_SERVER'; then
        PERF_WHY="the server did not listen on port $PERF_PORT within 30 s"
    elif ! alive "$PERF_SERVER"; then
        wait "$PERF_SERVER"
        PERF_WHY="the server exited ($?) before a client came"
    else
        timeout -k 2 "$PERF_RUN_TIMEOUT" "$tool" -d "$cdev" -p "$PERF_PORT" "$@" 127.0.0.1 >"$PERF_DIR/client.out" 2>&1
        rc=$?
        [ "$rc" = 0 ] || PERF_WHY="the client: $(timeout_msg "$rc" "$PERF_RUN_TIMEOUT")"
        # The server reports once the client is done; give it a moment.
        # shellcheck disable=SC2016 # evaluated by wait_for
        wait_for 20 '! alive $PERF_SERVER'
        if alive "$PERF_SERVER"; then
            PERF_WHY="${PERF_WHY:+$PERF_WHY; }the server did not finish after its client"
        else
            wait "$PERF_SERVER"
            rc=$?
            [ "$rc" = 0 ] || PERF_WHY="${PERF_WHY:+$PERF_WHY; }the server: $(timeout_msg "$rc" "$PERF_RUN_TIMEOUT")"
        fi
    fi
    perf_stop_server
    [ -z "$PERF_WHY" ]
}

# The index of rxe device $1's RoCE v2 GID for IPv4 address $2 (::ffff:a.b.c.d), once the GID cache has it.
perf_gid_index() { # rxe-dev ipv4
    gid=$(echo "$2" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
    ports=/sys/class/infiniband/$1/ports/1
    for g in "$ports"/gids/*; do
        [ "$(cat "$g" 2>/dev/null)" = "$gid" ] || continue
        n=${g##*/}
        [ "$(cat "$ports/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] && { echo "$n"; return 0; }
    done
    return 1
}

# SoftRoCE over a veth pair: rxe0 on rxa (10.77.0.1), rxe1 on rxb (10.77.0.2). Sets PERF_RXE_WHY on failure;
# perf_rxe_down undoes whatever part was done.
perf_rxe_up() {
    PERF_RXE_WHY=""
    # rdma_rxe computes its ICRC with the crypto API's "crc32", a module here; nothing would load it on demand.
    for m in crc32_generic veth rdma_rxe; do
        [ -d "/sys/module/$m" ] && continue
        modprobe "$m" >"$PERF_DIR/setup.out" 2>&1 || { PERF_RXE_WHY="modprobe $m: $(tail -n 3 "$PERF_DIR/setup.out")"; return 1; }
    done
    # busybox ip cannot name a veth peer: the kernel calls it vethN, found by rxa's iflink and renamed.
    ip link add "$PERF_VETH_A" type veth >"$PERF_DIR/setup.out" 2>&1 \
        || { PERF_RXE_WHY="ip link add $PERF_VETH_A type veth: $(cat "$PERF_DIR/setup.out")"; return 1; }
    peer=""
    read -r peer_idx <"/sys/class/net/$PERF_VETH_A/iflink"
    for d in /sys/class/net/*; do
        read -r idx <"$d/ifindex" 2>/dev/null
        [ "$idx" = "$peer_idx" ] && [ "${d##*/}" != "$PERF_VETH_A" ] && peer=${d##*/}
    done
    [ -n "$peer" ] || { PERF_RXE_WHY="no peer of $PERF_VETH_A (iflink $peer_idx)"; return 1; }
    # Jumbo frames: rxe takes the largest IB MTU its netdev carries (4096), as hfi1's ports have.
    for cmd in "link set $peer name $PERF_VETH_B" \
        "link set $PERF_VETH_A mtu 9000" "link set $PERF_VETH_B mtu 9000" \
        "addr add $PERF_IP_A/24 dev $PERF_VETH_A" "addr add $PERF_IP_B/24 dev $PERF_VETH_B" \
        "link set $PERF_VETH_A up" "link set $PERF_VETH_B up" \
        "route add $PERF_IP_B dev $PERF_VETH_A table $PERF_TABLE_A" \
        "route add $PERF_IP_A dev $PERF_VETH_B table $PERF_TABLE_B" \
        "rule add from $PERF_IP_A to $PERF_IP_B iif lo table $PERF_TABLE_A pref 77" \
        "rule add from $PERF_IP_B to $PERF_IP_A iif lo table $PERF_TABLE_B pref 78" \
        "rule add table local pref 100" "rule del pref 0 table local"; do
        # shellcheck disable=SC2086 # the command is meant to split
        ip $cmd >"$PERF_DIR/setup.out" 2>&1 || { PERF_RXE_WHY="ip $cmd: $(cat "$PERF_DIR/setup.out")"; return 1; }
    done
    # Each end receives packets from the other's (local) address.
    for d in "$PERF_VETH_A" "$PERF_VETH_B"; do
        echo 1 >"/proc/sys/net/ipv4/conf/$d/accept_local"
        echo 0 >"/proc/sys/net/ipv4/conf/$d/rp_filter"
    done
    for pair in "rxe0 $PERF_VETH_A" "rxe1 $PERF_VETH_B"; do
        rdma link add "${pair% *}" type rxe netdev "${pair#* }" >"$PERF_DIR/setup.out" 2>&1 \
            || { PERF_RXE_WHY="rdma link add ${pair% *} type rxe netdev ${pair#* }: $(cat "$PERF_DIR/setup.out") $(dmesg | grep rxe | tail -n 2)"; return 1; }
    done
    # shellcheck disable=SC2016 # evaluated by wait_for
    wait_for 10 'grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state' \
        || { PERF_RXE_WHY="rxe ports not ACTIVE: $(cat /sys/class/infiniband/rxe*/ports/1/state | tr '\n' ' ')"; return 1; }
    # shellcheck disable=SC2016 # evaluated by wait_for
    wait_for 10 'PERF_GID_A=$(perf_gid_index rxe0 $PERF_IP_A) && PERF_GID_B=$(perf_gid_index rxe1 $PERF_IP_B)' \
        || { PERF_RXE_WHY="no RoCE v2 GID for $PERF_IP_A on rxe0 or $PERF_IP_B on rxe1"; return 1; }
    # perftest takes one GID index for both ends; both devices were made alike.
    [ "$PERF_GID_A" = "$PERF_GID_B" ] || { PERF_RXE_WHY="rxe0's GID index $PERF_GID_A is not rxe1's $PERF_GID_B"; return 1; }
}

perf_rxe_down() {
    for d in rxe0 rxe1; do
        [ -e "/sys/class/infiniband/$d" ] && rdma link delete "$d" >/dev/null 2>&1
    done
    ip rule add table local pref 0 >/dev/null 2>&1 # already there unless perf_rxe_up moved it
    for p in 100 78 77; do ip rule del pref "$p" >/dev/null 2>&1; done
    # Deleting one end of a veth pair deletes both, and their routes.
    ip link del "$PERF_VETH_A" >/dev/null 2>&1
    ip link del "$PERF_VETH_B" >/dev/null 2>&1
}

# The port's active MTU in bytes, as ibv_devinfo shows it.
perf_mtu() { # dev
    ibv_devinfo -d "$1" 2>/dev/null | awk '$1 == "active_mtu:" { print $2; exit }'
}

# What the device model saw during one hfi1 run (the host's "accesses" before and after it: trapped CSR reads and
# writes of both HFIs, packets on the cable), as "reads writes packets"; nothing if the host did not answer.
perf_accesses_delta() { # before after
    echo "$1 $2" | awk 'NF == 6 { print $4 - $1, $5 - $2, $6 - $3 }'
}

# Measures one transport; results go to $PERF_DIR/<transport>.bw ("tool bytes iterations peak average msgrate")
# and <transport>.lat ("tool bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9"); for hfi1 also
# hfi1.acc ("tool bytes iterations reads writes packets" of each bandwidth run). Adds to PERF_ERR.
perf_transport() { # name server-dev client-dev extra-args...
    name=$1 sdev=$2 cdev=$3
    shift 3
    : >"$PERF_DIR/$name.bw"
    : >"$PERF_DIR/$name.lat"
    : >"$PERF_DIR/$name.acc"
    for tool in $PERF_BW_TOOLS; do
        for size in $PERF_SIZES; do
            now
            if [ "${NOW%.*}" -ge "$PERF_DEADLINE" ]; then
                PERF_ERR="$PERF_ERR $name: step budget of $PERF_BUDGET s spent before $tool $size B;"
                return 1
            fi
            iters=$(perf_iters "$size")
            say "fabric-perf: $name $tool -s $size -n $iters"
            a0="" t0=""
            [ "$name" = rxe ] || { host_call accesses && a0=$HOST_REPLY; }
            # shellcheck disable=SC2086 # the counter names
            [ "$name" = rxe ] || { host_call counters names "$PERF_TID_COUNTERS" && t0=$HOST_REPLY; }
            if perf_run "$tool" "$sdev" "$cdev" -F -s "$size" -n "$iters" "$@" \
                && row=$(perf_parse_bw "$PERF_DIR/client.out" "$size") && [ -n "$row" ]; then
                echo "$tool $size $row" >>"$PERF_DIR/$name.bw"
                if [ -n "$a0" ] && host_call accesses; then
                    d=$(perf_accesses_delta "$a0" "$HOST_REPLY")
                    [ -n "$d" ] && echo "$tool $size $iters $d" >>"$PERF_DIR/$name.acc"
                fi
                # shellcheck disable=SC2086 # the counter names
                if [ -n "$t0" ] && host_call counters names "$PERF_TID_COUNTERS"; then
                    echo "$t0 $HOST_REPLY" | awk -v k="$tool $size" 'NF == 4 { print k, ($3 - $1) + ($4 - $2) }' \
                        >>"$PERF_DIR/$name.tid"
                fi
            else
                PERF_ERR="$PERF_ERR $name $tool $size B: ${PERF_WHY:-no result row for $size B}: $(perf_tails);"
                break # the larger sizes would fail the same way
            fi
        done
    done
    [ -n "$PERF_LAT_TOOL" ] || return 0
    say "fabric-perf: $name $PERF_LAT_TOOL -s $PERF_LAT_SIZE -n $PERF_LAT_ITERS"
    if perf_run "$PERF_LAT_TOOL" "$sdev" "$cdev" -F -s "$PERF_LAT_SIZE" -n "$PERF_LAT_ITERS" "$@" \
        && row=$(perf_parse_lat "$PERF_DIR/client.out" "$PERF_LAT_SIZE") && [ -n "$row" ]; then
        echo "$PERF_LAT_TOOL $PERF_LAT_SIZE $row" >>"$PERF_DIR/$name.lat"
    else
        PERF_ERR="$PERF_ERR $name $PERF_LAT_TOOL $PERF_LAT_SIZE B: ${PERF_WHY:-no result row}: $(perf_tails);"
    fi
}

# JSON rows joining both transports' results by tool and size, with the ratio hfi1 / rxe (bandwidth: average
# MiB/s; latency: typical µs); null where a transport has no figure.
perf_json_rows() { # kind(bw|lat)
    awk -v kind="$1" '
        function num(v) { return v == "" ? "null" : v }
        function obj(f,   n) {
            if (f == "") return "null"
            n = split(f, a, " ")
            if (kind == "bw")
                return sprintf("{\"iters\":%s,\"peak_mib_s\":%s,\"mib_s\":%s,\"mpps\":%s}", a[1], a[2], a[3], a[4])
            return sprintf("{\"iters\":%s,\"min_us\":%s,\"max_us\":%s,\"typical_us\":%s,\"avg_us\":%s,\"stdev_us\":%s,\"p99_us\":%s,\"p99_9_us\":%s}",
                a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8])
        }
        {
            key = $1 " " $2; rest = $3; for (i = 4; i <= NF; i++) rest = rest " " $i
            if (!(key in seen)) { seen[key] = 1; order[++n] = key }
            if (FILENAME ~ /hfi1\./) h[key] = rest; else r[key] = rest
        }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, t, " ")
                split(h[k], hv, " "); split(r[k], rv, " ")
                # bandwidth: the average (3rd figure); latency: the typical time (4th)
                col = kind == "bw" ? 3 : 4
                ratio = "null"
                if (h[k] != "" && r[k] != "" && rv[col] + 0 > 0) ratio = sprintf("%.4f", hv[col] / rv[col])
                printf "%s{\"tool\":\"%s\",\"bytes\":%s,\"hfi1\":%s,\"rxe\":%s,\"ratio\":%s}", (i > 1 ? "," : ""),
                    t[1], t[2], obj(h[k]), obj(r[k]), ratio
            }
        }' "$PERF_DIR/hfi1.$1" "$PERF_DIR/rxe.$1"
}

# The device model's side of each hfi1 bandwidth run (hfi1.acc) as JSON objects.
perf_json_accesses() {
    awk '{ printf "%s{\"tool\":\"%s\",\"bytes\":%s,\"iters\":%s,\"reads\":%s,\"writes\":%s,\"packets\":%s}", (NR > 1 ? "," : ""), $1, $2, $3, $4, $5, $6 }' \
        "$PERF_DIR/hfi1.acc" 2>/dev/null
}

step_fabric_perf() {
    begin fabric-perf
    PERF_ERR=""
    rm -rf "$PERF_DIR" "$PERF_JSON"
    mkdir -p "$PERF_DIR"
    : >"$PERF_DIR/hfi1.bw"; : >"$PERF_DIR/hfi1.lat"; : >"$PERF_DIR/rxe.bw"; : >"$PERF_DIR/rxe.lat"
    now
    PERF_DEADLINE=$((${NOW%.*} + PERF_BUDGET))
    host_deadline fabric-perf $((PERF_BUDGET + 2 * PERF_RUN_TIMEOUT + 60))
    for d in hfi1_0 hfi1_1; do
        grep -q ACTIVE "/sys/class/infiniband/$d/ports/1/state" 2>/dev/null \
            || PERF_ERR="$PERF_ERR $d's port is not ACTIVE ($(cat "/sys/class/infiniband/$d/ports/1/state" 2>/dev/null));"
    done
    hfi1_mtu=$(perf_mtu hfi1_0)
    [ -n "$PERF_ERR" ] || perf_transport hfi1 hfi1_1 hfi1_0
    rxe_mtu="" PERF_GID_A="" PERF_GID_B=""
    if perf_rxe_up; then
        rxe_mtu=$(perf_mtu rxe0)
        perf_transport rxe rxe1 rxe0 -x "$PERF_GID_A"
    else
        PERF_ERR="$PERF_ERR SoftRoCE setup: $PERF_RXE_WHY;"
    fi
    perf_stop_server
    perf_rxe_down
    host_deadline_end fabric-perf
    echo "{\"sizes\":[$(echo "$PERF_SIZES" | sed 's/  */,/g')],\"tools\":{\"bw\":$(json_str "$PERF_BW_TOOLS"),\"lat\":$(json_str "$PERF_LAT_TOOL")},\
\"units\":{\"bw\":\"MiB/s (perftest's MB/sec)\",\"lat\":\"us\",\"ratio\":\"hfi1 / rxe: average bandwidth, typical latency\"},\
\"hfi1\":{\"server\":\"hfi1_1\",\"client\":\"hfi1_0\",\"active_mtu\":$(json_str "$hfi1_mtu")},\
\"rxe\":{\"server\":\"rxe1\",\"client\":\"rxe0\",\"netdevs\":$(json_str "$PERF_VETH_B <- $PERF_VETH_A (veth)"),\
\"gid_index\":$(json_str "$PERF_GID_A"),\"active_mtu\":$(json_str "$rxe_mtu")},\
\"bw\":[$(perf_json_rows bw)],\"lat\":[$(perf_json_rows lat)],\"hfi1_accesses\":[$(perf_json_accesses)]}" >"$PERF_JSON"
    # The figures are the result's fabric_perf; the step says how many rows each transport gave.
    members=""
    for f in hfi1.bw rxe.bw hfi1.lat rxe.lat; do
        n=$(wc -l <"$PERF_DIR/$f")
        members="$members${members:+,}\"${f%.*}_${f#*.}_rows\":$n"
    done
    if [ -z "$PERF_ERR" ]; then record fabric-perf true "$t" "" "$members"
    else record fabric-perf false "$t" "${PERF_ERR# }" "$members"; fi
}

# --- TID RDMA against plain RDMA and SoftRoCE (ci/run-qemu.sh --tid-rdma --fabric-perf) -----------------------
# The same perftest READ and WRITE runs three times in one boot: on hfi1 with TID RDMA (the run's cap_mask has
# OPFN, so each new RC QP negotiates it), on hfi1 without (OPFN cleared at run time: a writable bit,
# HFI1_CAP_WRITABLE_MASK in common.h, checked by hfi1_caps_set, driver.c:69-106; a QP then never asks, opfn.c:298),
# and on SoftRoCE. Only work requests posted after a QP's OPFN finished go by TID RDMA, and perftest posts its
# send queue's depth at once, so every run uses a depth of 4 (as the tid-read-bw step does); each hfi1 run records
# the bytes the device placed through TIDs, so the share that went by TID RDMA is measured, not assumed.
TID_PERF_SIZES=${TID_PERF_SIZES:-"262144 1048576 4194304"}
TID_PERF_TOOLS=${TID_PERF_TOOLS:-"ib_write_bw ib_read_bw"}
TID_PERF_DEPTH=4
# Bytes per run: 64 MiB, so that the depth's first work requests, posted before OPFN finished, are a small part
# (at 4 MiB, 4 of 16).
TID_PERF_BYTES=${TID_PERF_BYTES:-67108864}
HFI1_CAP_OPFN=$((1 << 16))

# Sets or clears OPFN in hfi1's cap_mask; false if the driver did not take it. The mask reads back with the
# kernel bits mirrored into the user half (hfi1_caps_get), so only the OPFN bit is compared.
perf_opfn() { # 0|1
    m=$(($(cat /sys/module/hfi1/parameters/cap_mask 2>/dev/null) + 0))
    if [ "$1" = 1 ]; then m=$((m | HFI1_CAP_OPFN)); else m=$((m & ~HFI1_CAP_OPFN)); fi
    printf '0x%x\n' "$m" >/sys/module/hfi1/parameters/cap_mask 2>/dev/null
    [ $(($(cat /sys/module/hfi1/parameters/cap_mask 2>/dev/null) & HFI1_CAP_OPFN)) = $(($1 * HFI1_CAP_OPFN)) ]
}

# JSON rows joining the three variants by tool and size: each one's figures, the ratios of average bandwidth,
# and the share of each hfi1 run's bytes the device placed through TIDs.
perf_tid_json_rows() {
    awk '
        function obj(f,   a) {
            if (f == "") return "null"
            split(f, a, " ")
            return sprintf("{\"iters\":%s,\"peak_mib_s\":%s,\"mib_s\":%s,\"mpps\":%s}", a[1], a[2], a[3], a[4])
        }
        function avg(f,   a) { if (f == "") return 0; split(f, a, " "); return a[3] + 0 }
        function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.4f", x / y) : "null" }
        FILENAME ~ /\.tid$/ { split(FILENAME, p, "/"); n2 = p[length(p)]; sub(/\.tid$/, "", n2)
            if (n2 == "tid") tb[$1 " " $2] = $3; else pb[$1 " " $2] = $3; next }
        {
            key = $1 " " $2; rest = $3; for (i = 4; i <= NF; i++) rest = rest " " $i
            if (!(key in seen)) { seen[key] = 1; order[++n] = key }
            if (FILENAME ~ /\/tid\.bw$/) T[key] = rest; else if (FILENAME ~ /\/plain\.bw$/) P[key] = rest; else R[key] = rest
        }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, t, " ")
                ts = "null"; if ((k in tb) && (k in T)) { split(T[k], a, " "); if (t[2] * a[1] > 0) ts = sprintf("%.3f", tb[k] / (t[2] * a[1])) }
                ps = "null"; if ((k in pb) && (k in P)) { split(P[k], a, " "); if (t[2] * a[1] > 0) ps = sprintf("%.3f", pb[k] / (t[2] * a[1])) }
                printf "%s{\"tool\":\"%s\",\"bytes\":%s,\"tid\":%s,\"plain\":%s,\"rxe\":%s,", (i > 1 ? "," : ""),
                    t[1], t[2], obj(T[k]), obj(P[k]), obj(R[k])
                printf "\"tid_over_plain\":%s,\"tid_over_rxe\":%s,\"plain_over_rxe\":%s,\"tid_share\":{\"tid\":%s,\"plain\":%s}}",
                    ratio(avg(T[k]), avg(P[k])), ratio(avg(T[k]), avg(R[k])), ratio(avg(P[k]), avg(R[k])), ts, ps
            }
        }' "$PERF_DIR/tid.tid" "$PERF_DIR/plain.tid" "$PERF_DIR/tid.bw" "$PERF_DIR/plain.bw" "$PERF_DIR/rxe.bw"
}

step_tid_perf() {
    begin tid-perf
    PERF_ERR=""
    rm -rf "$PERF_DIR" "$PERF_JSON"
    mkdir -p "$PERF_DIR"
    for f in tid plain rxe; do : >"$PERF_DIR/$f.bw"; : >"$PERF_DIR/$f.tid"; done
    now
    PERF_DEADLINE=$((${NOW%.*} + PERF_BUDGET))
    host_deadline tid-perf $((PERF_BUDGET + 2 * PERF_RUN_TIMEOUT + 60))
    mask=$(cat /sys/module/hfi1/parameters/cap_mask 2>/dev/null)
    # The tools and sizes of this step; no latency run.
    saved="$PERF_SIZES|$PERF_BW_TOOLS|$PERF_LAT_TOOL|$PERF_BYTES"
    PERF_SIZES=$TID_PERF_SIZES PERF_BW_TOOLS=$TID_PERF_TOOLS PERF_LAT_TOOL="" PERF_BYTES=$TID_PERF_BYTES
    if [ $((${mask:-0} & HFI1_CAP_OPFN)) = 0 ]; then
        PERF_ERR="$PERF_ERR hfi1's cap_mask ${mask:-unreadable} has no OPFN: not a --tid-rdma boot;"
    else
        perf_transport tid hfi1_1 hfi1_0 -t "$TID_PERF_DEPTH"
        if perf_opfn 0; then
            perf_transport plain hfi1_1 hfi1_0 -t "$TID_PERF_DEPTH"
        else
            PERF_ERR="$PERF_ERR hfi1 did not take a cap_mask without OPFN;"
        fi
        perf_opfn 1 || PERF_ERR="$PERF_ERR hfi1 did not take OPFN back;"
    fi
    PERF_GID_A="" PERF_GID_B=""
    if perf_rxe_up; then
        perf_transport rxe rxe1 rxe0 -x "$PERF_GID_A" -t "$TID_PERF_DEPTH"
    else
        PERF_ERR="$PERF_ERR SoftRoCE setup: $PERF_RXE_WHY;"
    fi
    perf_stop_server
    perf_rxe_down
    PERF_SIZES=${saved%%|*} saved=${saved#*|} PERF_BW_TOOLS=${saved%%|*} saved=${saved#*|}
    PERF_LAT_TOOL=${saved%%|*} PERF_BYTES=${saved#*|}
    host_deadline_end tid-perf
    echo "{\"kind\":\"tid\",\"sizes\":[$(echo "$TID_PERF_SIZES" | sed 's/  */,/g')],\"tools\":$(json_str "$TID_PERF_TOOLS"),\
\"depth\":$TID_PERF_DEPTH,\"cap_mask\":$(json_str "$mask"),\"units\":{\"bw\":\"MiB/s (perftest's MB/sec)\",\
\"tid_share\":\"bytes the device placed through TIDs / bytes moved\"},\
\"bw\":[$(perf_tid_json_rows)]}" >"$PERF_JSON"
    members=""
    for f in tid plain rxe; do members="$members${members:+,}\"${f}_bw_rows\":$(wc -l <"$PERF_DIR/$f.bw")"; done
    if [ -z "$PERF_ERR" ]; then record tid-perf true "$t" "" "$members"
    else record tid-perf false "$t" "${PERF_ERR# }" "$members"; fi
}
