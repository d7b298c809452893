/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Everything the irdma and hfi1 sources expect from <linux/...> headers, in one place. The kernel-named
 * headers under linux/, rdma/ and crypto/ include this (or a part of it).
 */
#ifndef SHIM_KERNEL_H
#define SHIM_KERNEL_H

#include <shim/types.h>
#include <shim/bits.h>
#include <shim/list.h>
#include <shim/atomic.h>
#include <shim/lock.h>
#include <shim/io.h>
#include <shim/print.h>
#include <shim/mem.h>

#define ETH_ALEN 6

#define EPERM 1
#define ENOENT 2
#define EIO 5
#define ENXIO 6
#define E2BIG 7
#define EAGAIN 11
#define ENOMEM 12
#define EFAULT 14
#define EBUSY 16
#define EEXIST 17
#define ENODEV 19
#define EINVAL 22
#define ENOSPC 28
#define ERANGE 34
#define ENOSYS 38
#define ENODATA 61
#define EPROTO 71
#define EBADMSG 74
#define EOVERFLOW 75
#define EOPNOTSUPP 95
#define ETIMEDOUT 110
#define EALREADY 114
#define EINPROGRESS 115

/* Only a member of a structure the control path never arms (struct irdma_vsi_pestat). */
struct timer_list {
	void (*function)(struct timer_list *t);
	unsigned long expires;
};

/* Opaque to the control path: it only passes pointers around. */
struct ib_device;
struct shash_desc;
struct pci_dev;

struct ib_sge {
	u64 addr;
	u32 length;
	u32 lkey;
};

#endif
