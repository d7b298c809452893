/* SPDX-License-Identifier: Apache-2.0 */
/* The one ice/irdma interface constant the control path's structures use (DSCP map size). */
#ifndef SHIM_LINUX_NET_INTEL_IIDC_H
#define SHIM_LINUX_NET_INTEL_IIDC_H
#include <shim/kernel.h>
#define IIDC_MAX_USER_PRIORITY 8
#define IIDC_MAX_DSCP_MAPPING 64
#endif
