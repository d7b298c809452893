#!/usr/bin/env bash
# Checks the guest init's parsing and JSON helpers on the host, under the same busybox sh the guest runs.
# The boot itself is covered by ci/run-qemu.sh; this covers what must hold whatever the guest is given.
source "$(dirname "$0")/../lib.sh"

BUSYBOX=$(ls -d "$CACHE_DIR"/guest/busybox-*/busybox 2>/dev/null | sort -rV | head -n1 || true)
if [ -z "$BUSYBOX" ]; then
    bash "$REPO_ROOT/ci/build-guest.sh" >/dev/null
    BUSYBOX=$(ls -d "$CACHE_DIR"/guest/busybox-*/busybox | sort -rV | head -n1)
fi
INIT="$REPO_ROOT/ci/guest/init"
guest_run_bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
check() { # name expected actual
    if [ "$2" == "$3" ]; then
        printf '  ok   %s\n' "$1"
    else
        printf '  FAIL %s\n       expected: %q\n       actual:   %q\n' "$1" "$2" "$3"
        FAILS=$((FAILS + 1))
    fi
}

# Runs a snippet under busybox sh with the init's functions loaded (snippets are single-quoted on purpose).
# shellcheck disable=SC2016
bb() { RDMA_EMU_INIT_FUNCTIONS_ONLY=1 CMDLINE="$TMP/cmdline" SCENARIOS="$TMP/scenarios.sh" "$BUSYBOX" sh -c ". '$INIT'; $1"; }
# The guest's scenario file, as ci/build-guest.sh packs it.
"$GUEST_RUN" scenario --guest-env >"$TMP/scenarios.sh"

echo "json_str: any text becomes one valid JSON string"
# input (printf format) | the string JSON must decode to (as Python's repr() shows it)
while IFS='|' read -r input expected; do
    # shellcheck disable=SC2059 # the case is a printf format on purpose
    printf "$input" >"$TMP/in"
    got=$(bb 'json_str "$(cat '"$TMP/in"')"' | "$GUEST_RUN" json-repr 2>&1)
    check "json_str $input" "$expected" "$got"
done <<'CASES'
plain text|'plain text'
a "quoted" word|'a "quoted" word'
back\\slash|'back\\slash'
tab\there|'tab\there'
two\nlines|'two\nlines'
trailing newline\n|'trailing newline'
ctl\001\033[0m chars|'ctl[0m chars'
cr\r\n|'cr'
utf8 \303\251|'utf8 é'
|''
CASES

echo "host_call: a JSON request line, then the host's answer to its sequence number (testing/guest-run/src/console.rs)"
printf '%s\n' 'RDMA-EMU-ACK 9 {"ok":true,"reply":"stale"}' 'RDMA-EMU-ACK 1 {"ok":true,"reply":"1 2 3"}' \
    'RDMA-EMU-ACK 2 {"ok":false,"reply":"no \"x\" at a\\b"}' 'RDMA-EMU-ACK 3 {"ok":true,"reply":""}' >"$TMP/acks"
# shellcheck disable=SC2016
got=$(bb 'host_call accesses; echo "$? $HOST_REPLY"; host_call fault hfi hfi1-wfr1 spec "cable-drop,nth=3"
    echo "$? $HOST_REPLY"; host_deadline kdriver-modprobe 120; echo "$? $HOST_REPLY"; HOST_WAIT=2
    host_call counters names "a b"; echo "$? $HOST_REPLY"' <"$TMP/acks" | tr '\n' '|')
check "host_call: requests, answers by sequence number, a reply unescaped, no answer" \
'RDMA-EMU {"seq":1,"req":"accesses"}|0 1 2 3|RDMA-EMU {"seq":2,"req":"fault","hfi":"hfi1-wfr1","spec":"cable-drop,nth=3"}|1 no "x" at a\b|RDMA-EMU {"seq":3,"req":"deadline","step":"kdriver-modprobe","secs":120}|0 |RDMA-EMU {"seq":4,"req":"counters","names":"a b"}|1 the host did not answer {"seq":4,"req":"counters","names":"a b"} within 2 s|' "$got"
# shellcheck disable=SC2016
got=$(bb 'HOST_ANSWERS=0; host_deadline s 5; echo "$? $HOST_REPLY"' </dev/null)
check "host_call without a host on the console (the user's shell) sends nothing" "1 no host on the console" "$got"

echo "read_params: rdma_emu.* parameters from the kernel command line"
# command line | hfi1,irdma,args,timeout,watchdog,hold as read
while IFS='|' read -r cmdline expected; do
    printf '%s\n' "$cmdline" >"$TMP/cmdline"
    got=$(bb 'read_params; echo "$P_hfi1,$P_irdma,$P_args,$P_timeout,$P_watchdog,$P_hold"')
    check "read_params $cmdline" "$expected" "$got"
done <<'CASES'
console=ttyS0 panic=-1 quiet|,,,,,
console=ttyS0 rdma_emu.hfi1=1b36:2222 quiet|1b36:2222,,,,,
rdma_emu.args="--flows 4 --verbose" rdma_emu.timeout=5|,,--flows 4 --verbose,5,,
rdma_emu.hfi1=none rdma_emu.irdma=1b36:1101 rdma_emu.hfi1=1b36:1100|1b36:1100,1b36:1101,,,,
xrdma_emu.hfi1=1 rdma_emu.unknown=3 rdma_emu.watchdog=30|,,,,30,
rdma_emu.irdma= rdma_emu.args=plain|,,plain,,,
quiet rdma_emu.hold=1|,,,,,1
CASES

echo "read_params: rdma_emu.scenario=NAME sets its row's parameters where it stands (testing/guest-run/src/scenario.rs)"
# command line | hfi1_wfr,fabric,tid_rdma,shell,watchdog,hfi1 as read | the error (up to " in FILE")
while IFS='|' read -r cmdline expected err; do
    printf '%s\n' "$cmdline" >"$TMP/cmdline"
    # shellcheck disable=SC2016
    got=$(bb 'read_params; echo "$P_hfi1_wfr,$P_fabric,$P_tid_rdma,$P_shell,$P_watchdog,$P_hfi1|${SCENARIO_ERR%% in *}"')
    check "read_params $cmdline" "$expected|$err" "$got"
done <<'CASES'
rdma_emu.scenario=tid-rdma|8086:24f0,1,1,,,|
rdma_emu.scenario=demo rdma_emu.hfi1=1b36:2222|,,,,,1b36:2222|
rdma_emu.scenario=shell rdma_emu.watchdog=30|8086:24f0,,,1,30,|
rdma_emu.watchdog=30 rdma_emu.scenario=shell|8086:24f0,,,1,900,|
rdma_emu.hfi1=1b36:1100 rdma_emu.scenario=no-devices|,,,,,none|
rdma_emu.scenario=nonesuch|,,,,,|no scenario nonesuch
CASES

echo "present: a function is found by vendor:device in sysfs"
mkdir -p "$TMP/pci/0000:00:03.0" "$TMP/pci/0000:01:00.0"
printf '0x1b36\n' >"$TMP/pci/0000:00:03.0/vendor"; printf '0x1100\n' >"$TMP/pci/0000:00:03.0/device"
printf '0x8086\n' >"$TMP/pci/0000:01:00.0/vendor"; printf '0x1592\n' >"$TMP/pci/0000:01:00.0/device"
while IFS='|' read -r id expected; do
    check "present $id" "$expected" "$(PCI_DEVICES="$TMP/pci" bb "present $id; echo \$?")"
done <<'CASES'
1b36:1100|0
1B36:1100|0
8086:1592|0
1b36:1101|1
CASES

echo "is_uint and timeout_msg"
while IFS='|' read -r snippet expected; do
    check "$snippet" "$expected" "$(bb "$snippet")"
done <<'CASES'
is_uint 120; echo $?|0
is_uint 12x; echo $?|1
is_uint ''; echo $?|1
is_uint -1; echo $?|1
timeout_msg 143 30|timed out after 30 s
timeout_msg 137 30|timed out after 30 s
timeout_msg 3 30|exit status 3
CASES

echo "opainfo_disagrees: opainfo's text agrees with sysfs (samples from opa-basic-tools 10.10.3.0.11 in the guest)"
G=0x0011750101000001
OI_DOWN='hfi1_0:1                           PortGUID:0x0011750101000001
   PhysicalState: Polling       
   LinkSpeed      En: 25Gb         Sup: 25Gb        '
OI_INIT='hfi1_0:1                           PortGUID:0x0011750101000001
   PortState:     Init (LinkUp)
   LinkSpeed      Act: 25Gb         En: 25Gb        '
OI_ACTIVE='hfi1_0:1                           PortGID:0xfe80000000000000:0011750101000001
   PortState:     Active
   LinkSpeed      Act: 25Gb         En: 25Gb        '
# sample | device | port GUID | sysfs state | sysfs phys_state | what disagrees
while IFS='|' read -r sample dev guid state phys expected; do
    eval "text=\$$sample"
    got=$(T="$text" bb "opainfo_disagrees \"\$T\" '$dev' '$guid' '$state' '$phys'")
    check "opainfo_disagrees $sample $dev $state / $phys" "$expected" "$got"
done <<CASES
OI_DOWN|hfi1_0|$G|1: DOWN|2: Polling|
OI_INIT|hfi1_0|$G|2: INIT|5: LinkUp|
OI_ACTIVE|hfi1_0|$G|4: ACTIVE|5: LinkUp|
OI_DOWN|hfi1_0|$G|1: DOWN|3: Disabled|opainfo's PhysicalState for hfi1_0 is not the kernel's (Disabled);
OI_INIT|hfi1_0|$G|4: ACTIVE|5: LinkUp|opainfo's PortState for hfi1_0 is not the kernel's (ACTIVE);
OI_ACTIVE|hfi1_0|$G|2: INIT|5: LinkUp|opainfo's PortState for hfi1_0 is not the kernel's (INIT);
OI_INIT|hfi1_0|0x0011750101000002|2: INIT|5: LinkUp|opainfo does not show hfi1_0:1's port GUID 0x0011750101000002;
OI_ACTIVE|hfi1_1|$G|4: ACTIVE|5: LinkUp|opainfo does not show hfi1_1:1's port GUID $G;
CASES

# The fabric run's helpers (ci/guest/fabric.sh), loaded after the init as the guest does.
FABRIC="$REPO_ROOT/ci/guest/fabric.sh"
# shellcheck disable=SC2016
bbf() { RDMA_EMU_INIT_FUNCTIONS_ONLY=1 CMDLINE="$TMP/cmdline" "$BUSYBOX" sh -c ". '$INIT'; . '$FABRIC'; $1"; }

echo "guid_norm: sysfs's and the driver's GUID spellings become one"
while IFS='|' read -r input expected; do
    check "guid_norm $input" "$expected" "$(bbf "guid_norm '$input'")"
done <<'CASES'
0011:7501:0100:0002|0x0011750101000002
11750101000001|0x0011750101000001
0x0011750101000001|0x0011750101000001
00117501010000AB|0x00117501010000ab
CASES

echo "neighbor_of: the neighbour the driver logged last (intr.c handle_linkup_change's message)"
cat >"$TMP/dmesg" <<'LOG'
[   10.248535] hfi1 0000:00:04.0: hfi1_1: Neighbor Guid 11750101000001, Type 0, Port Num 1
[   10.252263] hfi1 0000:00:03.0: hfi1_0: Neighbor Guid 11750101000002, Type 0, Port Num 1
[   50.252263] hfi1 0000:00:03.0: hfi1_0: Neighbor Guid 11750101000009, Type 1, Port Num 7
LOG
while IFS='|' read -r dev expected; do
    check "neighbor_of $dev" "$expected" "$(bbf "dmesg() { cat '$TMP/dmesg'; }; neighbor_of $dev")"
done <<'CASES'
hfi1_1|11750101000001 0 1
hfi1_0|11750101000009 1 7
hfi1_2|
CASES

echo "counters_moved: the RC counters that moved between two snapshots"
while IFS='|' read -r before after expected; do
    check "counters_moved $before -> $after" "$expected" "$(bbf "counters_moved '$before' '$after'")"
done <<'CASES'
hfi1_0.RcResend=0 hfi1_1.SeqNak=2|hfi1_0.RcResend=0 hfi1_1.SeqNak=2|{}
hfi1_0.RcResend=0 hfi1_1.SeqNak=2|hfi1_0.RcResend=4 hfi1_1.SeqNak=2|{"hfi1_0.RcResend":4}
hfi1_0.RcResend=4294967296|hfi1_0.RcResend=4294967298|{"hfi1_0.RcResend":2}
hfi1_0.SeqNak=1|hfi1_0.RcResend=7 hfi1_0.SeqNak=3|{"hfi1_0.SeqNak":2}
CASES

echo "kprobe_count: hits from kprobe_profile (trace_kprobe.c: the event's name, hits, misses)"
mkdir -p "$TMP/tracing"
printf '  %-44s %15lu %15lu\n' hfi1_setup_wqe 1234 0 other 5 0 >"$TMP/tracing/kprobe_profile"
check "kprobe_count hfi1_setup_wqe" 1234 "$(bbf "TRACING='$TMP/tracing'; kprobe_count hfi1_setup_wqe")"
check "kprobe_count absent" "" "$(bbf "TRACING='$TMP/tracing'; kprobe_count hfi1_sdma_send")"

echo "listening: a LISTEN socket (state 0A) on a TCP port in /proc/net/tcp"
printf '  sl  local_address rem_address   st\n   0: 00000000:4853 00000000:0000 0A\n   1: 0100007F:4854 0100007F:9C40 01\n' >"$TMP/tcp"
while IFS='|' read -r port expected; do
    check "listening $port" "$expected" "$(bbf "PROC_NET_TCP='$TMP/tcp'; listening $port; echo \$?")"
done <<'CASES'
18515|0
18516|1
18517|1
CASES

# The verbs benchmark's helpers (ci/guest/perf.sh), loaded after fabric.sh as the guest does.
PERF="$REPO_ROOT/ci/guest/perf.sh"
# shellcheck disable=SC2016
bbp() { RDMA_EMU_INIT_FUNCTIONS_ONLY=1 CMDLINE="$TMP/cmdline" "$BUSYBOX" sh -c ". '$INIT'; . '$FABRIC'; . '$PERF'; $1"; }

echo "perf_iters: PERF_BYTES worth of messages, within [PERF_MIN_ITERS, PERF_MAX_ITERS] (16 MiB, 8, 200)"
while IFS='|' read -r size expected; do
    check "perf_iters $size" "$expected" "$(bbp "perf_iters $size")"
done <<'CASES'
1024|200
65536|200
262144|64
1048576|16
4194304|8
CASES

# perftest's report lines, made with its own format strings (perftest 4.5-0.17, src/perftest_parameters.h:
# RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT, RESULT_FMT_LAT_DUR, REPORT_FMT, REPORT_FMT_LAT, REPORT_EXT_CPU_UTIL;
# PRIu64 is lu), under its RESULT_LINE rules and after the parameter block a client prints first.
P_LINE='---------------------------------------------------------------------------------------'
P_FMT=' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]'
P_FMT_G=' #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]'
P_FMT_LAT=' #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] '
P_FMT_LAT_DUR=' #bytes        #iterations       t_avg[usec]    tps average'
bw_report() { # header rows ("size iters peak avg rate", ';'-separated)
    printf '%s\n                    Send BW Test\n Dual-port       : OFF\t\tDevice         : hfi1_0\n' "$P_LINE"
    printf ' Mtu             : 4096[B]\n local address: LID 0x01 QPN 0x0012 PSN 0x5a0e1c\n%s\n%s\n' "$P_LINE" "$1"
    echo "$2" | tr ';' '\n' | while read -r sz it pk av rt; do
        if [ -n "$sz" ]; then
            printf ' %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf\n' "$sz" "$it" "$pk" "$av" "$rt"
        fi
    done
    printf '%s\n' "$P_LINE"
}
bw_report "$P_FMT" "1048576 16 5.12 4.87 0.000005" >"$TMP/bw-one"
bw_report "$P_FMT" "1024 200 3.01 2.75 0.002817;65536 200 44.10 40.02 0.000640;1048576 16 80.55 79.12 0.000079" >"$TMP/bw-all"
bw_report "$P_FMT_G" "1048576 16 0.04 0.04 0.000005" >"$TMP/bw-gbits"
bw_report "$P_FMT" "" >"$TMP/bw-server"
printf ' 1048576    16               5.12               4.87   \t\t   0.000005\n' >"$TMP/bw-noheader"
{ bw_report "$P_FMT" "" | head -n -1; printf ' %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf\t    %-3.2f\n' \
    4194304 8 12.50 11.25 0.000003 51.00; } >"$TMP/bw-cpu"
echo "perf_parse_bw: the row of one size in a bandwidth report, as \"iterations peak average msgrate\" (MiB/s)"
while IFS='|' read -r file size expected; do
    check "perf_parse_bw $file $size" "$expected" "$(bbp "perf_parse_bw '$TMP/$file' $size")"
done <<'CASES'
bw-one|1048576|16 5.12 4.87 0.000005
bw-one|4194304|
bw-all|65536|200 44.10 40.02 0.000640
bw-all|1024|200 3.01 2.75 0.002817
bw-gbits|1048576|
bw-server|1048576|
bw-noheader|1048576|
bw-cpu|4194304|8 12.50 11.25 0.000003
missing-file|1024|
CASES

lat_report() { # header size iters min max typical avg stdev p99 p999
    printf '%s\n                    Send Latency Test\n%s\n%s\n' "$P_LINE" "$P_LINE" "$1"
    shift
    printf ' %-7lu %lu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n' "$@"
    printf '%s\n' "$P_LINE"
}
lat_report "$P_FMT_LAT" 8 200 21.34 310.97 24.12 27.80 20.01 130.55 310.97 >"$TMP/lat-one"
{ printf '%s\n%s\n' "$P_LINE" "$P_FMT_LAT_DUR"; printf ' %-7lu       %lu            %-7.2f        %-7.2f\n' 8 5000 25.10 39800.12; } >"$TMP/lat-dur"
echo "perf_parse_lat: the row of one size in a latency report, \"iterations min max typical avg stdev p99 p99.9\" (us)"
while IFS='|' read -r file size expected; do
    check "perf_parse_lat $file $size" "$expected" "$(bbp "perf_parse_lat '$TMP/$file' $size")"
done <<'CASES'
lat-one|8|200 21.34 310.97 24.12 27.80 20.01 130.55 310.97
lat-one|64|
lat-dur|8|
bw-one|1048576|
CASES

echo "perf_accesses_delta: the host's access totals (\"READS WRITES PACKETS\", init host_call) before and after"
while IFS='|' read -r before after expected; do
    check "perf_accesses_delta '$before' '$after'" "$expected" "$(bbp "perf_accesses_delta '$before' '$after'")"
done <<'CASES'
10 20 30|15 27 130|5 7 100
4294967296 0 7|4294967306 3 7|10 3 0
|1 2 3|
1 2 3|the host did not answer|
CASES

echo "perf_json_rows: both transports' rows joined by tool and size, ratio hfi1 / rxe"
mkdir -p "$TMP/perf"
printf 'ib_send_bw 1024 200 3.01 2.75 0.002817\nib_send_bw 1048576 16 80.55 79.12 0.000079\nib_write_bw 1024 200 4.00 3.00 0.003\n' >"$TMP/perf/hfi1.bw"
printf 'ib_send_bw 1024 200 6.02 5.50 0.005634\nib_send_bw 1048576 16 40.00 39.56 0.000040\n' >"$TMP/perf/rxe.bw"
printf 'ib_send_lat 8 200 21.34 310.97 24.12 27.80 20.01 130.55 310.97\n' >"$TMP/perf/hfi1.lat"
: >"$TMP/perf/rxe.lat"
# kind | tool, bytes, hfi1's and rxe's figure compared (average MiB/s, typical us) and the ratio, per row
while IFS='|' read -r kind expected; do
    col=mib_s; [ "$kind" = bw ] || col=typical_us
    got=$(bbp "PERF_DIR='$TMP/perf'; echo \"[\$(perf_json_rows $kind)]\"" \
        | "$GUEST_RUN" json-rows tool bytes "hfi1.$col" "rxe.$col" ratio 2>&1)
    check "perf_json_rows $kind" "$expected" "$got"
done <<'CASES'
bw|ib_send_bw 1024 2.75 5.5 0.5;ib_send_bw 1048576 79.12 39.56 2.0;ib_write_bw 1024 3.0 None None
lat|ib_send_lat 8 24.12 None None
CASES

echo "perf_tid_json_rows: TID, plain and SoftRoCE rows joined, their ratios and each hfi1 run's share through TIDs"
mkdir -p "$TMP/tidperf"
# tool bytes iterations peak average msgrate; TID bytes per run (tool bytes count)
printf 'ib_write_bw 1048576 64 50.0 40.00 0.00004\nib_read_bw 1048576 64 30.0 30.00 0.00003\n' >"$TMP/tidperf/tid.bw"
printf 'ib_write_bw 1048576 64 60.0 50.00 0.00005\n' >"$TMP/tidperf/plain.bw"
printf 'ib_write_bw 1048576 64 90.0 80.00 0.00008\nib_read_bw 1048576 64 70.0 60.00 0.00006\n' >"$TMP/tidperf/rxe.bw"
printf 'ib_write_bw 1048576 50331648\nib_read_bw 1048576 67108864\n' >"$TMP/tidperf/tid.tid"
printf 'ib_write_bw 1048576 0\n' >"$TMP/tidperf/plain.tid"
got=$(bbp "PERF_DIR='$TMP/tidperf'; echo \"[\$(perf_tid_json_rows)]\"" | "$GUEST_RUN" json-rows tool bytes \
    tid.mib_s plain.mib_s rxe.mib_s tid_over_plain tid_over_rxe plain_over_rxe tid_share.tid tid_share.plain 2>&1)
# 48 MiB of 64 through TIDs: 0.75; 64 of 64: 1.0; the plain run none.
check perf_tid_json_rows "ib_write_bw 1048576 40.0 50.0 80.0 0.8 0.5 0.625 0.75 0.0;ib_read_bw 1048576 30.0 None 60.0 None 0.5 None 1.0 None" "$got"

echo "hfi1_dma_prepare: identity domains for the unbound hfi1 functions' IOMMU groups, or translated ones checked"
# A fake sysfs: the kernel's group types are DMA, DMA-FQ, identity (Documentation/ABI/testing/sysfs-kernel-iommu_groups).
fake_fn() { # address vendor device type [driver]
    mkdir -p "$TMP/pci/$1/iommu_group"
    echo "$2" >"$TMP/pci/$1/vendor"; echo "$3" >"$TMP/pci/$1/device"; echo "$4" >"$TMP/pci/$1/iommu_group/type"
    [ -z "${5:-}" ] || { mkdir -p "$TMP/drivers/$5"; ln -s "$TMP/drivers/$5" "$TMP/pci/$1/driver"; }
}
# bb with the fake tree; prints what hfi1_dma_prepare said, then the domains it leaves.
dma() { # mode
    bb "PCI_DEVICES='$TMP/pci'; HFI1_WFR_ID=8086:24f0; HFI1_DMA=$1; hfi1_dma_prepare; echo \"=\$(hfi1_dma_domains)\""
}
# mode | functions (address,vendor,device,type[,driver] separated by spaces) | what it says, then =domains
while IFS='|' read -r mode fns expected; do
    rm -rf "$TMP/pci" "$TMP/drivers"; mkdir -p "$TMP/pci"
    for f in $fns; do IFS=, read -r -a a <<<"$f"; fake_fn "${a[@]}"; done
    got=$(dma "$mode" | tr '\n' ' ')
    check "hfi1_dma_prepare $mode: $fns" "$expected" "${got% }"
done <<'CASES'
translated|00:03.0,0x8086,0x24f0,DMA 00:04.0,0x8086,0x24f0,DMA|=00:03.0:DMA 00:04.0:DMA
translated|00:03.0,0x8086,0x24f0,DMA-FQ 00:05.0,0x1b36,0x1100,identity|=00:03.0:DMA-FQ
translated|00:03.0,0x8086,0x24f0,identity|00:03.0 has IOMMU domain type 'identity', not a translated DMA domain; =00:03.0:identity
identity|00:03.0,0x8086,0x24f0,DMA 00:04.0,0x8086,0x24f0,DMA-FQ|=00:03.0:identity 00:04.0:identity
identity|00:03.0,0x8086,0x24f0,identity 00:05.0,0x1b36,0x1100,DMA|=00:03.0:identity
identity|00:03.0,0x8086,0x24f0,DMA,hfi1 00:04.0,0x8086,0x24f0,DMA|00:03.0 is bound to hfi1: its IOMMU domain cannot change; =00:03.0:DMA 00:04.0:identity
passthrough|00:03.0,0x8086,0x24f0,DMA|rdma_emu.hfi1_dma must be translated or identity; =00:03.0:DMA
CASES
# A group the kernel will not change: the write fails (here: type is a directory), and the function is named.
rm -rf "$TMP/pci"; mkdir -p "$TMP/pci/00:03.0/iommu_group/type"
echo 0x8086 >"$TMP/pci/00:03.0/vendor"; echo 0x24f0 >"$TMP/pci/00:03.0/device"
got=$(dma identity)
check "hfi1_dma_prepare identity: a group the kernel refuses" "00:03.0: the kernel refused an identity domain" "${got%% for its*}"

echo "fuzz_line: the keeper's report gains the KDETH QP prefix and the peer HFI, and stays one JSON object"
FUZZ="$REPO_ROOT/ci/guest/fuzz.sh"
# shellcheck disable=SC2016
bbz() { RDMA_EMU_INIT_FUNCTIONS_ONLY=1 CMDLINE="$TMP/cmdline" "$BUSYBOX" sh -c ". '$INIT'; . '$FABRIC'; . '$FUZZ'; $1"; }
# report | kdeth | peer LID | the members added, as json-rows shows them
while IFS='|' read -r report kdeth lid expected; do
    got=$(bbz "echo \"[\$(fuzz_line '$report' '$kdeth' '$lid')]\"" | "$GUEST_RUN" json-rows generation kdeth_qp peer_device peer_device_lid 2>&1)
    check "fuzz_line $report $kdeth $lid" "$expected" "$got"
done <<'CASES'
{"generation":1,"qps":[]}|128|2|1 128 hfi1_1 2
{"generation":7,"qps":[{"type":"rc"}]}||5|7 None hfi1_1 5
CASES

if [ "$FAILS" -ne 0 ]; then die "$FAILS init helper check(s) failed"; fi
log "all init helper checks passed"
