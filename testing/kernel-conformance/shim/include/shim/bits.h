/* SPDX-License-Identifier: Apache-2.0 */
/* BIT/GENMASK and FIELD_PREP/FIELD_GET with the kernel's semantics for constant masks. */
#ifndef SHIM_BITS_H
#define SHIM_BITS_H

#include <shim/types.h>

#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
#define GENMASK(h, l) ((~0UL << (l)) & (~0UL >> (63 - (h))))
#define GENMASK_ULL(h, l) ((~0ULL << (l)) & (~0ULL >> (63 - (h))))

/* The kernel rejects a non-constant or empty mask at compile time; so do we. */
#define __shim_mask_check(mask) \
	_Static_assert(__builtin_constant_p(mask) && (mask) != 0, "FIELD_* needs a constant non-zero mask")
#define __shim_shift(mask) __builtin_ctzll((u64)(mask))

/* Like the kernel's: the value is shifted into place and masked, typed as the mask. */
#define FIELD_PREP(mask, val)                                                    \
	({                                                                       \
		__shim_mask_check(mask);                                         \
		((__typeof__(mask))(val) << __shim_shift(mask)) & (mask);        \
	})
#define FIELD_GET(mask, reg)                                                     \
	({                                                                       \
		__shim_mask_check(mask);                                         \
		(__typeof__(mask))(((reg) & (mask)) >> __shim_shift(mask));     \
	})
#define FIELD_MAX(mask) ((mask) >> __shim_shift(mask))

#define upper_32_bits(n) ((u32)(((n) >> 16) >> 16))
#define lower_32_bits(n) ((u32)((n) & 0xffffffff))

#define ALIGN(x, a) (((x) + ((__typeof__(x))(a) - 1)) & ~((__typeof__(x))(a) - 1))
#define IS_ALIGNED(x, a) (((x) & ((__typeof__(x))(a) - 1)) == 0)
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define round_up(x, y) ((((x) - 1) | ((__typeof__(x))((y) - 1))) + 1)

#define min(a, b) ({ __typeof__(a) _a = (a); __typeof__(b) _b = (b); _a < _b ? _a : _b; })
#define max(a, b) ({ __typeof__(a) _a = (a); __typeof__(b) _b = (b); _a > _b ? _a : _b; })
#define min_t(t, a, b) ({ t _a = (a); t _b = (b); _a < _b ? _a : _b; })
#define max_t(t, a, b) ({ t _a = (a); t _b = (b); _a > _b ? _a : _b; })

static inline bool is_power_of_2(unsigned long n)
{
	return n != 0 && (n & (n - 1)) == 0;
}

static inline unsigned long roundup_pow_of_two(unsigned long n)
{
	return n <= 1 ? 1 : 1UL << (64 - __builtin_clzl(n - 1));
}

static inline int ilog2_u64(u64 n)
{
	return 63 - __builtin_clzll(n);
}
#define ilog2(n) ilog2_u64(n)
#define order_base_2(n) ((n) > 1 ? ilog2((n) - 1) + 1 : 0)

#endif
