// SPDX-License-Identifier: GPL-2.0
/*
 * Coverage hook of the rdma-emu fuzz build of hfi1.ko (ci/build-hfi1-module.sh). The rest of the module is
 * compiled with -fsanitize-coverage=trace-pc, so every basic block calls __sanitizer_cov_trace_pc(); this
 * file is built without it. Each call records its call site (the return address minus the module's
 * MOD_TEXT base) into QEMU's ivshmem-plain BAR2, laid out as in hfi1_cov.h:
 *  - an AFL-style edge map (hash of the previous and the current call site, per CPU);
 *  - a first-hit bitmap and a log of the call sites in first-hit order, bounded by the region.
 * The host reads the shared file directly and resets it between execs; nothing here traps to QEMU.
 *
 * Until the region is attached the hook does nothing. It attaches lazily, at the first call made from a
 * preemptible task (the module's init), because hfi1 already owns module_init. The hook itself is safe in any
 * context: no locks, no allocation, atomics only on the first-hit path. The mapping is not released at
 * rmmod (hfi1 owns module_exit too): each load of this test build leaves one 2 MiB mapping behind.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/io.h>
#include <linux/percpu.h>
#include <linux/atomic.h>
#include <linux/bitops.h>
#include <linux/preempt.h>
#include <asm/smap.h>
#include "hfi1_cov.h"

#ifdef HFI1_COV_PLANT
#include "hfi.h"
#endif

#ifdef HFI1_COV_TRACE_PC
#define IVSHMEM_VENDOR 0x1af4 /* Red Hat, Inc. (QEMU's ivshmem-plain) */
#define IVSHMEM_DEVICE 0x1110
#define IVSHMEM_SHM_BAR 2

enum { COV_UNATTACHED, COV_ATTACHING, COV_ATTACHED, COV_ABSENT };

static atomic_t cov_state = ATOMIC_INIT(COV_UNATTACHED);
static u8 *cov_region;		/* set (release) once the header is written */
static unsigned long cov_text_base;
static unsigned long cov_text_size;
static DEFINE_PER_CPU(u32, cov_prev);

#define FIELD64(r, off) ((u64 *)((r) + (off)))
#define FIELD32(r, off) ((u32 *)((r) + (off)))

static noinline void cov_attach(void)
{
	struct pci_dev *pdev;
	resource_size_t start, len;
	u8 *r;
	int ret;

	/* Only from a preemptible task: pci_get_device and memremap may sleep. */
	if (!in_task() || !preemptible())
		return;
	if (atomic_cmpxchg(&cov_state, COV_UNATTACHED, COV_ATTACHING) != COV_UNATTACHED)
		return;
	pdev = pci_get_device(IVSHMEM_VENDOR, IVSHMEM_DEVICE, NULL);
	if (!pdev) {
		pr_info("hfi1_cov: no ivshmem-plain device (%04x:%04x): coverage off\n",
			IVSHMEM_VENDOR, IVSHMEM_DEVICE);
		goto absent;
	}
	start = pci_resource_start(pdev, IVSHMEM_SHM_BAR);
	len = pci_resource_len(pdev, IVSHMEM_SHM_BAR);
	if (len < HFI1_COV_REGION_SIZE) {
		pr_warn("hfi1_cov: %s BAR2 is %llu bytes, needs %u: coverage off\n", pci_name(pdev),
			(unsigned long long)len, HFI1_COV_REGION_SIZE);
		goto put;
	}
	ret = pci_enable_device_mem(pdev);
	if (ret) {
		pr_warn("hfi1_cov: enabling %s failed (%d): coverage off\n", pci_name(pdev), ret);
		goto put;
	}
	/* BAR2 is QEMU's RAM backend: a cacheable mapping reaches it with plain loads and stores. */
	r = memremap(start, HFI1_COV_REGION_SIZE, MEMREMAP_WB);
	if (!r) {
		pr_warn("hfi1_cov: mapping %s BAR2 failed: coverage off\n", pci_name(pdev));
		pci_disable_device(pdev);
		goto put;
	}
	cov_text_base = (unsigned long)THIS_MODULE->mem[MOD_TEXT].base;
	cov_text_size = THIS_MODULE->mem[MOD_TEXT].size;
	if (cov_text_size > HFI1_COV_SEEN_BYTES * 8UL) /* call sites past the bitmap are not recorded */
		cov_text_size = HFI1_COV_SEEN_BYTES * 8UL;
	/* A fresh region: whatever a previous load of the module left there is stale. */
	memset(r + HFI1_COV_MAP_OFFSET, 0, HFI1_COV_REGION_SIZE - HFI1_COV_MAP_OFFSET);
	*FIELD32(r, HFI1_COV_OFF_MAGIC) = HFI1_COV_MAGIC;
	*FIELD32(r, HFI1_COV_OFF_VERSION) = HFI1_COV_VERSION;
	*FIELD32(r, HFI1_COV_OFF_MAP_SIZE) = HFI1_COV_MAP_SIZE;
	*FIELD32(r, HFI1_COV_OFF_SEEN_BITS) = HFI1_COV_SEEN_BYTES * 8;
	*FIELD32(r, HFI1_COV_OFF_PCS_CAPACITY) = HFI1_COV_PCS_CAPACITY;
	*FIELD64(r, HFI1_COV_OFF_TEXT_BASE) = cov_text_base;
	*FIELD64(r, HFI1_COV_OFF_TEXT_SIZE) = cov_text_size;
	*FIELD64(r, HFI1_COV_OFF_PC_COUNT) = 0;
	*FIELD64(r, HFI1_COV_OFF_HITS) = 0;
	smp_store_release(FIELD32(r, HFI1_COV_OFF_STATE), HFI1_COV_STATE_ATTACHED);
	smp_store_release(&cov_region, r);
	atomic_set(&cov_state, COV_ATTACHED);
	pr_info("hfi1_cov: coverage into %s BAR2 (%u KiB), text %lu bytes\n", pci_name(pdev),
		HFI1_COV_REGION_SIZE >> 10, cov_text_size);
	return; /* the device reference stays with the mapping */
put:
	pci_dev_put(pdev);
absent:
	atomic_set(&cov_state, COV_ABSENT);
}

void __sanitizer_cov_trace_pc(void); /* called by the compiler, declared by nobody */

void notrace __sanitizer_cov_trace_pc(void)
{
	unsigned long off = _RET_IP_;
	u8 *r = smp_load_acquire(&cov_region);
	u32 cur, prev;
	u64 idx;

	if (unlikely(!r)) {
		if (atomic_read(&cov_state) == COV_UNATTACHED) {
			/*
			 * objtool counts this hook as callable with user access open (EFLAGS.AC):
			 * close it around the calls, as arch code does.
			 */
			unsigned long flags = smap_save();

			cov_attach();
			smap_restore(flags);
		}
		return;
	}
	off -= cov_text_base;
	if (off >= cov_text_size) /* init text, freed after load */
		return;
	cur = ((u32)off * 0x9e3779b1u) >> 16; /* 16 bits: the map's index width */
	prev = raw_cpu_read(cov_prev);
	r[HFI1_COV_MAP_OFFSET + ((cur ^ prev) & (HFI1_COV_MAP_SIZE - 1))]++;
	raw_cpu_write(cov_prev, cur >> 1);
	(*FIELD64(r, HFI1_COV_OFF_HITS))++;

	if (likely(test_bit(off, (unsigned long *)(r + HFI1_COV_SEEN_OFFSET))) ||
	    test_and_set_bit(off, (unsigned long *)(r + HFI1_COV_SEEN_OFFSET)))
		return;
	idx = atomic64_inc_return((atomic64_t *)FIELD64(r, HFI1_COV_OFF_PC_COUNT)) - 1;
	if (idx < HFI1_COV_PCS_CAPACITY)
		WRITE_ONCE(*FIELD32(r, HFI1_COV_PCS_OFFSET + 4 * idx), (u32)off);
}
#endif /* HFI1_COV_TRACE_PC */

#ifdef HFI1_COV_PLANT
/*
 * TEST-ONLY planted defect (ci/build-hfi1-module.sh --plant, never in the default build): a WARN when a
 * received packet's payload starts with the magic below, so the fuzz smoke can check that its oracle
 * (panic_on_warn) reports a finding. ci/build-hfi1-module.sh inserts the call at the top of hfi1_ib_rcv.
 */
static const char hfi1_cov_plant_magic[] = "RDMAEMU-PLANT-40";

void hfi1_cov_plant(struct hfi1_packet *packet); /* the call in verbs.c declares its own */

void hfi1_cov_plant(struct hfi1_packet *packet)
{
	const size_t n = sizeof(hfi1_cov_plant_magic) - 1;

	if (packet->payload && packet->tlen >= packet->hlen + n &&
	    !memcmp(packet->payload, hfi1_cov_plant_magic, n))
		WARN(1, "hfi1_cov: planted defect hit (test-only build)\n");
}
#endif
