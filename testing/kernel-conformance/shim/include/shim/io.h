/* SPDX-License-Identifier: Apache-2.0 */
/* MMIO accessors and DMA barriers. MMIO never dereferences: the address names a BAR offset. */
#ifndef SHIM_IO_H
#define SHIM_IO_H

#include <shim/types.h>
#include <shim/runtime.h>

static inline u32 readl(const volatile void __iomem *addr) { return shim_mmio_read32(addr); }
static inline void writel(u32 val, volatile void __iomem *addr) { shim_mmio_write32(addr, val); }
static inline u64 readq(const volatile void __iomem *addr) { return shim_mmio_read64(addr); }
static inline void writeq(u64 val, volatile void __iomem *addr) { shim_mmio_write64(addr, val); }

/*
 * x86-64: the CPU keeps stores in order and loads in order, so the kernel's dma_wmb()/dma_rmb() are
 * compiler barriers. The call into the harness is one too (an opaque function), and is where the harness
 * looks at queue memory.
 */
#define barrier() __asm__ __volatile__("" ::: "memory")
#define dma_wmb() do { barrier(); shim_dma_wmb(); barrier(); } while (0)
#define dma_rmb() do { barrier(); shim_dma_rmb(); barrier(); } while (0)
#define wmb() __asm__ __volatile__("sfence" ::: "memory")
#define rmb() __asm__ __volatile__("lfence" ::: "memory")
#define mb() __asm__ __volatile__("mfence" ::: "memory")
#define smp_mb() mb()
#define smp_wmb() barrier()
#define smp_rmb() barrier()

#define cpu_to_le16(x) ((__le16)(u16)(x))
#define cpu_to_le32(x) ((__le32)(u32)(x))
#define cpu_to_le64(x) ((__le64)(u64)(x))
#define le16_to_cpu(x) ((u16)(__le16)(x))
#define le32_to_cpu(x) ((u32)(__le32)(x))
#define le64_to_cpu(x) ((u64)(__le64)(x))
#define cpu_to_be16(x) ((__be16)__builtin_bswap16(x))
#define cpu_to_be32(x) ((__be32)__builtin_bswap32(x))
#define be16_to_cpu(x) ((u16)__builtin_bswap16(x))
#define be32_to_cpu(x) ((u32)__builtin_bswap32(x))
#define htons(x) cpu_to_be16(x)
#define htonl(x) cpu_to_be32(x)
#define ntohs(x) be16_to_cpu(x)
#define ntohl(x) be32_to_cpu(x)

#endif
