/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Layout of the coverage region the trace-pc hfi1.ko writes into: BAR2 of QEMU's ivshmem-plain device
 * (1af4:1110), which the host maps from the memory-backend-file. This header is the one definition of the
 * layout; the host reader (testing/kernel-cov) parses the HFI1_COV_* defines below in a unit test and
 * asserts its own constants against them. Every field is little-endian; offsets are from the region start.
 */
#ifndef HFI1_COV_H
#define HFI1_COV_H

#define HFI1_COV_MAGIC 0x564f4348u /* "HCOV" */
#define HFI1_COV_VERSION 1u

/* Header fields (byte offsets). The guest writes all but GENERATION when it attaches, STATE last. */
#define HFI1_COV_OFF_MAGIC 0x00        /* u32 */
#define HFI1_COV_OFF_VERSION 0x04      /* u32 */
#define HFI1_COV_OFF_STATE 0x08        /* u32: HFI1_COV_STATE_* */
#define HFI1_COV_OFF_MAP_SIZE 0x0c     /* u32: bytes of the edge map */
#define HFI1_COV_OFF_SEEN_BITS 0x10    /* u32: bits of the first-hit bitmap (one per text byte) */
#define HFI1_COV_OFF_PCS_CAPACITY 0x14 /* u32: entries of the PC log */
#define HFI1_COV_OFF_TEXT_BASE 0x18    /* u64: runtime address of the module's MOD_TEXT */
#define HFI1_COV_OFF_TEXT_SIZE 0x20    /* u64: its size in bytes */
#define HFI1_COV_OFF_PC_COUNT 0x28     /* u64: first hits so far; entries past the capacity are dropped */
#define HFI1_COV_OFF_GENERATION 0x30   /* u64: host-owned, bumped at every reset */
#define HFI1_COV_OFF_HITS 0x38         /* u64: call-site hits recorded, approximate (not atomic) */

#define HFI1_COV_STATE_ATTACHED 1u

/* Areas. */
#define HFI1_COV_HEADER_SIZE 0x1000
#define HFI1_COV_MAP_OFFSET 0x1000 /* u8 per edge: AFL-style hit counts */
#define HFI1_COV_MAP_SIZE 0x10000
#define HFI1_COV_SEEN_OFFSET 0x11000 /* bit per MOD_TEXT byte offset, set at a call site's first hit */
#define HFI1_COV_SEEN_BYTES 0x80000  /* covers 4 MiB of module text */
#define HFI1_COV_PCS_OFFSET 0x91000  /* u32 per first hit: the return address minus the text base */
#define HFI1_COV_REGION_SIZE 0x200000 /* the ivshmem-plain backend's size (a power of two) */
#define HFI1_COV_PCS_CAPACITY ((HFI1_COV_REGION_SIZE - HFI1_COV_PCS_OFFSET) / 4)

#endif
