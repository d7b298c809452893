// SPDX-License-Identifier: Apache-2.0
/*
 * hfi1-mmap-check: opens one hfi1 user context the way libpsm2 does (ASSIGN_CTXT, CTXT_INFO, USER_INFO),
 * mmaps each region the driver hands out, reports how each got mapped, then reads one dword per page of the
 * readable ones, as libpsm2's hfi_touch_mmap does after each mmap.
 *
 *   hfi1-mmap-check [--touch] [/dev/hfi1_0]
 *
 * Per region: the VMA's kind from /proc/self/smaps VmFlags (pf: VM_PFNMAP, remap_pfn_range; mm: VM_MIXEDMAP,
 * vm_insert_page/vm_map_pages) and, for pages /proc/self/pagemap can see (root; the page walk skips VM_PFNMAP
 * VMAs, so those show 0 present), the page frame. A frame at or above the CPU's physical address width is a
 * PTE the MMU rejects with a reserved-bit fault ("Corrupted page table"); such a region is not read unless
 * --touch. A bad frame in a VM_PFNMAP VMA cannot be seen from here: reading it oopses and the kernel kills
 * this process (exit 137 from the shell).
 *
 * Exit 0: every region mapped and every readable one was read. Exit 1: a visible frame is beyond the physical
 * address width. Exit 2: setup or an mmap failed (printed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/hfi/hfi1_user.h>

struct region {
	const char *name;
	uint64_t token;
	size_t len;
	int prot;
	int readable; /* safe to read: not write-only PIO space */
};

static unsigned phys_bits(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	unsigned bits = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "address sizes : %u bits physical", &bits) == 1)
			break;
	fclose(f);
	return bits;
}

/* The VmFlags line of the VMA that starts at va, from /proc/self/smaps. */
static void vma_flags(uintptr_t va, char *out, size_t n)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0;

	snprintf(out, n, "?");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end;

		if (sscanf(line, "%lx-%lx ", &start, &end) == 2) {
			in = start == va;
		} else if (in && !strncmp(line, "VmFlags:", 8)) {
			line[strcspn(line, "\n")] = 0;
			snprintf(out, n, "%s", line + 9);
			break;
		}
	}
	fclose(f);
}

/* The pagemap entry of one virtual page: bit 63 present, bits 0-54 the frame (root only). */
static int page_frame(int pm, uintptr_t va, uint64_t *pfn)
{
	uint64_t e;

	if (pread(pm, &e, sizeof(e), (off_t)(va / 4096) * sizeof(e)) != sizeof(e))
		return -1;
	if (!(e >> 63 & 1))
		return 0;
	*pfn = e & ((1ULL << 55) - 1);
	return 1;
}

int main(int argc, char **argv)
{
	const char *dev = "/dev/hfi1_0";
	int touch = 0, bad = 0;
	long pg = sysconf(_SC_PAGESIZE);

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--touch"))
			touch = 1;
		else
			dev = argv[i];
	}
	unsigned pbits = phys_bits();
	if (!pbits) {
		fprintf(stderr, "no 'address sizes' in /proc/cpuinfo\n");
		return 2;
	}
	int fd = open(dev, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "open %s: %s\n", dev, strerror(errno));
		return 2;
	}
	struct hfi1_user_info ui = {
		.userversion = HFI1_USER_SWMAJOR << HFI1_SWMAJOR_SHIFT | HFI1_USER_SWMINOR,
	};
	memcpy(ui.uuid, "hfi1-mmap-check!", sizeof(ui.uuid));
	if (ioctl(fd, HFI1_IOCTL_ASSIGN_CTXT, &ui)) {
		fprintf(stderr, "HFI1_IOCTL_ASSIGN_CTXT: %s\n", strerror(errno));
		return 2;
	}
	struct hfi1_ctxt_info ci = { 0 };
	struct hfi1_base_info bi = { 0 };
	if (ioctl(fd, HFI1_IOCTL_CTXT_INFO, &ci) || ioctl(fd, HFI1_IOCTL_USER_INFO, &bi)) {
		fprintf(stderr, "HFI1_IOCTL_CTXT_INFO/USER_INFO: %s\n", strerror(errno));
		return 2;
	}
	printf("%s: ctxt %u subctxt %u send_ctxt %u credits %u rcvhdrq %ux%uB egr %ux%uB sdma ring %u "
	       "runtime_flags 0x%" PRIx64 " phys_bits %u\n",
	       dev, ci.ctxt, ci.subctxt, ci.send_ctxt, ci.credits, ci.rcvhdrq_cnt, ci.rcvhdrq_entsize,
	       ci.egrtids, ci.rcvegr_size, ci.sdma_ring_size, (uint64_t)ci.runtime_flags, pbits);

#define PALIGN(x) (((size_t)(x) + pg - 1) & ~((size_t)pg - 1))
	struct region regions[] = {
		{ "PIO_BUFS", bi.pio_bufbase, PALIGN(ci.credits * 64), PROT_WRITE, 0 },
		{ "PIO_BUFS_SOP", bi.pio_bufbase_sop, PALIGN(ci.credits * 64), PROT_WRITE, 0 },
		{ "PIO_CRED", bi.sc_credits_addr, pg, PROT_READ, 1 },
		{ "RCV_HDRQ", bi.rcvhdr_bufbase, PALIGN(ci.rcvhdrq_cnt * ci.rcvhdrq_entsize), PROT_READ, 1 },
		{ "RCV_EGRBUF", bi.rcvegr_bufbase, (size_t)ci.egrtids * ci.rcvegr_size, PROT_READ, 1 },
		{ "UREGS", bi.user_regbase, pg, PROT_READ | PROT_WRITE, 1 },
		{ "EVENTS", bi.events_bufbase, pg, PROT_READ, 1 },
		{ "STATUS", bi.status_bufbase, pg, PROT_READ, 1 },
		{ "RTAIL", bi.rcvhdrtail_base, pg, PROT_READ, 1 },
		{ "SDMA_COMP", bi.sdma_comp_bufbase,
		  PALIGN(sizeof(struct hfi1_sdma_comp_entry) * ci.sdma_ring_size), PROT_READ, 1 },
	};
	int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pm < 0) {
		fprintf(stderr, "open /proc/self/pagemap: %s\n", strerror(errno));
		return 2;
	}
	for (size_t r = 0; r < sizeof(regions) / sizeof(regions[0]); r++) {
		struct region *g = &regions[r];

		if (!g->token || (!strcmp(g->name, "RTAIL") && !(ci.runtime_flags & HFI1_CAP_DMA_RTAIL)))
			continue;
		uint64_t off = g->token & ~((uint64_t)pg - 1);
		char *p = mmap(NULL, g->len, g->prot, MAP_SHARED, fd, (off_t)off);
		if (p == MAP_FAILED) {
			printf("%-12s token 0x%016" PRIx64 " len 0x%zx: mmap failed: %s\n", g->name, g->token,
			       g->len, strerror(errno));
			bad |= 2;
			continue;
		}
		size_t pages = g->len / pg, present = 0, beyond = 0;
		uint64_t first = 0;
		for (size_t i = 0; i < pages; i++) {
			uint64_t pfn;
			if (page_frame(pm, (uintptr_t)p + i * pg, &pfn) != 1)
				continue;
			if (!present++)
				first = pfn;
			if (pbits < 64 && pfn >= (1ULL << (pbits - 12)))
				beyond++;
		}
		char vmf[512];

		vma_flags((uintptr_t)p, vmf, sizeof(vmf));
		printf("%-12s token 0x%016" PRIx64 " len 0x%-7zx at %p: %zu/%zu pages in pagemap, first frame 0x%" PRIx64
		       "%s; VmFlags %s\n", g->name, g->token, g->len, (void *)p, present, pages, first,
		       beyond ? " BEYOND THE PHYSICAL ADDRESS WIDTH" : "", vmf);
		fflush(stdout); /* the read below may get this process killed */
		if (beyond)
			bad |= 1;
		if (g->readable && (!beyond || touch)) {
			volatile uint32_t sink = 0;
			for (size_t i = 0; i < pages; i++)
				sink += *(volatile uint32_t *)(p + i * pg);
			(void)sink;
		}
	}
	if (bad & 1)
		printf("FAIL: a region maps a frame the MMU rejects (reserved physical-address bits)\n");
	else if (!bad)
		printf("OK: every region mapped, every readable one read\n");
	return bad & 1 ? 1 : bad ? 2 : 0;
}
