/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel base types and compiler attributes for building kernel driver code in userspace.
 * Self-contained: the harness compiles with -nostdinc, so nothing from libc or the host's kernel headers
 * can leak in and silently change a layout.
 */
#ifndef SHIM_TYPES_H
#define SHIM_TYPES_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;

typedef u16 __le16;
typedef u32 __le32;
typedef u64 __le64;
typedef u16 __be16;
typedef u32 __be32;
typedef u64 __be64;
typedef u16 __u16;
typedef u32 __u32;
typedef u64 __u64;
typedef u8 __u8;

typedef __SIZE_TYPE__ size_t;
typedef long ssize_t;
typedef __UINTPTR_TYPE__ uintptr_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef u64 dma_addr_t;
typedef u64 phys_addr_t;
typedef unsigned int gfp_t;

typedef _Bool bool;
#define true 1
#define false 0
#define NULL ((void *)0)

#define __iomem
#define __force
#define __user
#define __rcu
#define __must_check __attribute__((__warn_unused_result__))
#define __packed __attribute__((__packed__))
#define __aligned(x) __attribute__((__aligned__(x)))
#define __maybe_unused __attribute__((__unused__))
#define __always_inline inline __attribute__((__always_inline__))
#define noinline __attribute__((__noinline__))
#define fallthrough __attribute__((__fallthrough__))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define offsetof(t, m) __builtin_offsetof(t, m)
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define BUILD_BUG_ON(cond) _Static_assert(!(cond), #cond)

#define GFP_KERNEL 0u
#define GFP_ATOMIC 1u

#endif
