/* SPDX-License-Identifier: Apache-2.0 */
/* Kernel header name used by the irdma sources; the definitions are the shim's own. */
#ifndef SHIM_CRYPTO_HASH_H
#define SHIM_CRYPTO_HASH_H
#include <shim/kernel.h>
#endif
