/* SPDX-License-Identifier: Apache-2.0 */
#ifndef SHIM_LINUX_BITFIELD_H
#define SHIM_LINUX_BITFIELD_H
#include <shim/bits.h>
#endif
