/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The functions the harness's Rust side provides (testing/kernel-conformance/src/shim.rs). Everything the kernel
 * code does to the outside world (MMIO, DMA memory, time, logging) goes through these.
 */
#ifndef SHIM_RUNTIME_H
#define SHIM_RUNTIME_H

#include <shim/types.h>

/* MMIO: addr lies inside a BAR window the harness registered; anything else is a reported bug. */
u32 shim_mmio_read32(const volatile void *addr);
void shim_mmio_write32(const volatile void *addr, u32 val);
u64 shim_mmio_read64(const volatile void *addr);
void shim_mmio_write64(const volatile void *addr, u64 val);

/* Coherent DMA memory from the device's pool: CPU address returned, device address in *pa. */
void *shim_dma_alloc(void *ctx, size_t size, dma_addr_t *pa);
void shim_dma_free(void *ctx, size_t size, void *va, dma_addr_t pa);

/* Barriers are observation points: the harness snapshots queue memory there (store-order checks). */
void shim_dma_wmb(void);
void shim_dma_rmb(void);

void shim_udelay(unsigned long usecs);
void shim_cpu_relax(void);

/* level: 0 error, 1 warning, 2 info, 3 debug. */
bool shim_log_enabled(int level);
void shim_log(int level, const char *msg, size_t len);

/* A kernel WARN, or kernel code reaching a function outside the control path: recorded, and the test
 * that ran it fails. */
void shim_bug(const char *what, const char *file, int line);
/* A kernel BUG or a lock misuse that would deadlock: the process stops with the message. */
void shim_fatal(const char *what, const char *file, int line) __attribute__((__noreturn__));

/* General-purpose memory (kzalloc and friends), zeroed. */
void *shim_zalloc(size_t size);
void shim_free(void *p);

#endif
