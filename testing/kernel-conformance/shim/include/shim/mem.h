/* SPDX-License-Identifier: Apache-2.0 */
/* String functions, kernel heap and coherent DMA memory. */
#ifndef SHIM_MEM_H
#define SHIM_MEM_H

#include <shim/types.h>
#include <shim/runtime.h>

/* libc's, linked into the harness. */
void *memset(void *s, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

static inline void *kzalloc(size_t size, gfp_t gfp) { (void)gfp; return shim_zalloc(size); }
static inline void *kcalloc(size_t n, size_t size, gfp_t gfp)
{
	size_t total;

	(void)gfp;
	if (__builtin_mul_overflow(n, size, &total))
		return NULL;
	return shim_zalloc(total);
}
#define kmalloc kzalloc
static inline void kfree(const void *p) { shim_free((void *)p); }

/* The device side of struct irdma_hw: ctx is the harness's per-device DMA context. */
struct device {
	void *shim_ctx;
};

static inline void *dma_alloc_coherent(struct device *dev, size_t size, dma_addr_t *handle, gfp_t gfp)
{
	(void)gfp;
	return shim_dma_alloc(dev->shim_ctx, size, handle);
}

static inline void dma_free_coherent(struct device *dev, size_t size, void *va, dma_addr_t pa)
{
	shim_dma_free(dev->shim_ctx, size, va, pa);
}

#define udelay(us) shim_udelay(us)
#define mdelay(ms) shim_udelay((unsigned long)(ms) * 1000)
#define usleep_range(lo, hi) shim_udelay(lo)
#define msleep(ms) mdelay(ms)
#define cpu_relax() shim_cpu_relax()

#define SZ_4K 0x00001000
#define SZ_2M 0x00200000
#define SZ_1G 0x40000000

#endif
