/* SPDX-License-Identifier: Apache-2.0 */
/* printk and friends, routed to the harness's log (tracing). */
#ifndef SHIM_PRINT_H
#define SHIM_PRINT_H

#include <shim/types.h>
#include <shim/runtime.h>

#define SHIM_LOG_ERR 0
#define SHIM_LOG_WARN 1
#define SHIM_LOG_INFO 2
#define SHIM_LOG_DEBUG 3

/* Formats like printk: kernel %p extensions (%pK, %pI4, ...) print as plain pointers. */
void shim_printk(int level, const char *fmt, ...) __attribute__((__format__(__printf__, 2, 3)));

#define pr_err(fmt, ...) shim_printk(SHIM_LOG_ERR, fmt, ##__VA_ARGS__)
#define pr_warn(fmt, ...) shim_printk(SHIM_LOG_WARN, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...) shim_printk(SHIM_LOG_INFO, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...) shim_printk(SHIM_LOG_DEBUG, fmt, ##__VA_ARGS__)

/* The device argument is not evaluated: it names the ib_device, which the harness does not have. */
#define ibdev_err(ibdev, fmt, ...) ((void)sizeof(ibdev), pr_err(fmt, ##__VA_ARGS__))
#define ibdev_warn(ibdev, fmt, ...) ((void)sizeof(ibdev), pr_warn(fmt, ##__VA_ARGS__))
#define ibdev_info(ibdev, fmt, ...) ((void)sizeof(ibdev), pr_info(fmt, ##__VA_ARGS__))
#define ibdev_dbg(ibdev, fmt, ...) ((void)sizeof(ibdev), pr_debug(fmt, ##__VA_ARGS__))
#define ibdev_err_ratelimited ibdev_err
#define ibdev_warn_ratelimited ibdev_warn
#define dev_err(dev, fmt, ...) ((void)(dev), pr_err(fmt, ##__VA_ARGS__))
#define dev_warn(dev, fmt, ...) ((void)(dev), pr_warn(fmt, ##__VA_ARGS__))
#define dev_info(dev, fmt, ...) ((void)(dev), pr_info(fmt, ##__VA_ARGS__))
#define dev_dbg(dev, fmt, ...) ((void)(dev), pr_debug(fmt, ##__VA_ARGS__))

enum { DUMP_PREFIX_NONE, DUMP_PREFIX_ADDRESS, DUMP_PREFIX_OFFSET };
void print_hex_dump_debug(const char *prefix_str, int prefix_type, int rowsize, int groupsize,
			  const void *buf, size_t len, bool ascii);

#define WARN_ON(cond) ({ bool _c = !!(cond); if (unlikely(_c)) shim_bug("WARN_ON(" #cond ")", __FILE__, __LINE__); _c; })
#define WARN_ON_ONCE(cond) WARN_ON(cond)
#define BUG_ON(cond) do { if (unlikely(cond)) shim_fatal("BUG_ON(" #cond ")", __FILE__, __LINE__); } while (0)

#endif
