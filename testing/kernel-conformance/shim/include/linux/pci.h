/* SPDX-License-Identifier: Apache-2.0 */
/* Kernel header name used by the irdma sources; the definitions are the shim's own. */
#ifndef SHIM_LINUX_PCI_H
#define SHIM_LINUX_PCI_H
#include <shim/kernel.h>
#endif
