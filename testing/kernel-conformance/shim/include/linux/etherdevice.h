/* SPDX-License-Identifier: Apache-2.0 */
#ifndef SHIM_LINUX_ETHERDEVICE_H
#define SHIM_LINUX_ETHERDEVICE_H
#include <shim/kernel.h>

/* addr[0] is the most significant byte of the result, as in the kernel. */
static inline u64 ether_addr_to_u64(const u8 *addr)
{
	u64 u = 0;
	int i;

	for (i = 0; i < ETH_ALEN; i++)
		u = u << 8 | addr[i];
	return u;
}

static inline void ether_addr_copy(u8 *dst, const u8 *src)
{
	memcpy(dst, src, ETH_ALEN);
}
#endif
