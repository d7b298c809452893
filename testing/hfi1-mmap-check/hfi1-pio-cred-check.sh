#!/bin/sh
# hfi1-pio-cred-check [/dev/hfi1_N]: runs hfi1-mmap-check on one device with kernel probes on the two calls
# that decide what the PIO_CRED mmap maps, and checks the call hfi1_file_mmap makes against the DMA API's
# contract. Needs root, tracefs, BTF (fprobe events with struct fields) and a single-node guest (it reads
# dd->cr_base[0]; the send context's node must be 0).
#
# The context's credit-return slot is sc->hw_free, inside the coherent block dd->cr_base[sc->node] (va, dma)
# that init_credit_return allocated (pio.c:2079). Its page is P = hw_free & PAGE_MASK, at byte offset
# OFF = P - va in the block. dma_mmap_coherent(dev, vma, cpu, dma, size) maps page vma->vm_pgoff of the
# allocation that starts at cpu/dma: dma_direct_mmap maps from dma (kernel/dma/direct.c:546), iommu_dma_mmap
# maps pages[vm_pgoff] of the vm_area that contains cpu (drivers/iommu/dma-iommu.c:1686-1689). So the call maps
# P only if dma + pgoff*PAGE = block dma + OFF, and (translated domain) cpu is the start of its vm_area with
# cpu + pgoff*PAGE = P (the domain type in sysfs says which path).
# Exit 0: the call selects the slot's page. Exit 1: it does not (names why). Exit 2: setup failed.
set -u
DEV=${1:-/dev/hfi1_0}
T=/sys/kernel/tracing
PAGE=4096
[ -e $T/dynamic_events ] || mount -t tracefs none $T 2>/dev/null
[ -e $T/dynamic_events ] || { echo "no tracefs"; exit 2; }
echo 1 >/proc/sys/kernel/kptr_restrict # real addresses in /proc/vmallocinfo
cleanup() {
    echo 0 >$T/tracing_on
    for e in hfi1chk/sc hfi1chk/mm; do
        [ -d $T/events/$e ] && echo 0 >$T/events/$e/enable
        echo "-:$e" >>$T/dynamic_events 2>/dev/null
    done
    echo 0 >$T/events/hfi1_dbg/hfi1_PROC/enable
    echo 1 >$T/tracing_on
}
trap cleanup EXIT
echo 'f:hfi1chk/sc sc_enable hwfree=sc->hw_free node=sc->node crva=sc->dd->cr_base->va crdma=sc->dd->cr_base->dma' \
    >>$T/dynamic_events || { echo "fprobe on sc_enable refused"; tail -3 $T/error_log; exit 2; }
echo 'f:hfi1chk/mm dma_mmap_attrs cpu=cpu_addr dma=dma_addr size=size pgoff=vma->vm_pgoff' \
    >>$T/dynamic_events || { echo "fprobe on dma_mmap_attrs refused"; tail -3 $T/error_log; exit 2; }
echo >$T/trace
for e in hfi1chk/sc hfi1chk/mm hfi1_dbg/hfi1_PROC; do echo 1 >$T/events/$e/enable; done
hfi1-mmap-check "$DEV"
echo "hfi1-mmap-check exit $?"
for e in hfi1chk/sc hfi1chk/mm hfi1_dbg/hfi1_PROC; do echo 0 >$T/events/$e/enable; done

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; } # one key=value of a probe line
tr=$(grep -v '^#' $T/trace)
sc=$(printf '%s\n' "$tr" | grep ' sc: ' | tail -n1)
# The dma_mmap_attrs call right after hfi1's mmap_cdbg line for type 3 (PIO_CRED).
mm=$(printf '%s\n' "$tr" | sed -n '/(mmap_cdbg) [0-9]*:[0-9]* type:3 /{n;p;}' | grep ' mm: ' | tail -n1)
[ -n "$sc" ] && [ -n "$mm" ] || { echo "no sc_enable or PIO_CRED dma_mmap_attrs event"; printf '%s\n' "$tr" | tail; exit 2; }
hwfree=$(echo "$sc" | field hwfree); node=$(echo "$sc" | field node)
crva=$(echo "$sc" | field crva); crdma=$(echo "$sc" | field crdma)
cpu=$(echo "$mm" | field cpu); dma=$(echo "$mm" | field dma); size=$(echo "$mm" | field size)
pgoff=$(echo "$mm" | field pgoff)
[ "$node" = 0 ] || { echo "send context on node $node: this check reads cr_base[0] only"; exit 2; }
page=$(( hwfree & ~(PAGE - 1) ))
off=$(( page - crva ))
printf 'send context: hw_free 0x%x in cr_base va 0x%x dma 0x%x -> slot page 0x%x (block offset 0x%x)\n' \
    $hwfree $crva $crdma $page $off
printf 'PIO_CRED mmap: dma_mmap_coherent(cpu 0x%x, dma 0x%x, size 0x%x) with vm_pgoff %d\n' $cpu $dma $size $pgoff
# Which dma_mmap_attrs path the device takes (kernel/dma/mapping.c:555-560): dma-direct without a translating
# domain, iommu_dma_mmap with one.
unit=${DEV##*/}
domain=$(cat /sys/class/infiniband/"$unit"/device/iommu_group/type 2>/dev/null || echo none)
case "$domain" in DMA|DMA-FQ) iommu=1 ;; *) iommu=0 ;; esac
echo "$unit IOMMU domain: $domain ($( [ $iommu = 1 ] && echo iommu_dma_mmap || echo dma_direct_mmap))"
bad=0
if [ $(( dma + pgoff * PAGE )) -ne $(( crdma + off )) ]; then
    printf 'WRONG (direct DMA path): dma + vm_pgoff*PAGE = 0x%x, the slot page is at 0x%x\n' \
        $(( dma + pgoff * PAGE )) $(( crdma + off ))
    bad=1
fi
# iommu_dma_mmap: the vm_area that holds cpu, if cpu is a vmap'd (dma-iommu remap) address.
area=""
[ $iommu = 1 ] && while read -r range _ rest; do
    case "$rest" in *dma-coherent*) ;; *) continue ;; esac
    s=${range%-*}; e=${range#*-}
    if [ $(( cpu >= s )) = 1 ] && [ $(( cpu < e )) = 1 ]; then area=$s; break; fi
done </proc/vmallocinfo
if [ -n "$area" ]; then
    printf 'cpu is in the dma-coherent vm_area starting at 0x%x: iommu_dma_mmap maps that area'"'"'s page %d\n' \
        $area $pgoff
    if [ $(( cpu != area )) = 1 ]; then
        printf 'WRONG (IOMMU path): cpu is 0x%x into its vm_area, not its start; page %d of the area at 0x%x gets mapped\n' \
            $(( cpu - area )) $pgoff $area
        bad=1
    fi
    if [ $(( area + pgoff * PAGE )) -ne $page ]; then
        printf 'WRONG (IOMMU path): maps 0x%x, the slot page is 0x%x (%s)\n' $(( area + pgoff * PAGE )) $page \
            "$( [ $(( area == crva )) = 1 ] && echo 'right block, wrong page' || echo 'another allocation')"
        bad=1
    fi
elif [ $iommu = 1 ] && [ $(( cpu + pgoff * PAGE )) -ne $page ]; then
    printf 'WRONG: cpu + vm_pgoff*PAGE = 0x%x is in no dma-coherent vm_area and is not the slot page 0x%x\n' \
        $(( cpu + pgoff * PAGE )) $page
    bad=1
fi
[ $bad = 0 ] && echo "OK: the PIO_CRED mmap selects the page of this context's credit-return slot" ||
    echo "FAIL: the PIO_CRED mmap does not map this context's credit-return slot"
exit $bad
