// SPDX-License-Identifier: Apache-2.0
/* printk-style formatting into the harness's log. */
#include <shim/kernel.h>

int vsnprintf(char *buf, size_t size, const char *fmt, __builtin_va_list ap);
int snprintf(char *buf, size_t size, const char *fmt, ...);

/* Kernel %p extensions (%pK, %pI4, %pM, ...) become plain %p: libc would print the suffix letters. */
static void shim_strip_pointer_ext(char *out, size_t n, const char *fmt)
{
	size_t o = 0;

	while (*fmt && o + 1 < n) {
		out[o++] = *fmt;
		if (fmt[0] == '%' && fmt[1] == 'p') {
			if (o + 1 < n)
				out[o++] = 'p';
			fmt += 2;
			while ((*fmt >= 'A' && *fmt <= 'Z') || (*fmt >= 'a' && *fmt <= 'z') || (*fmt >= '0' && *fmt <= '9'))
				fmt++;
			continue;
		}
		if (fmt[0] == '%' && fmt[1] == '%' && o + 1 < n) {
			out[o++] = '%';
			fmt += 2;
			continue;
		}
		fmt++;
	}
	out[o] = 0;
}

void shim_printk(int level, const char *fmt, ...)
{
	char f[512], msg[1024];
	__builtin_va_list ap;
	int len;

	if (!shim_log_enabled(level))
		return;
	shim_strip_pointer_ext(f, sizeof(f), fmt);
	__builtin_va_start(ap, fmt);
	len = vsnprintf(msg, sizeof(msg), f, ap);
	__builtin_va_end(ap);
	if (len < 0)
		return;
	if ((size_t)len >= sizeof(msg))
		len = sizeof(msg) - 1;
	while (len > 0 && msg[len - 1] == '\n')
		len--;
	shim_log(level, msg, (size_t)len);
}

void print_hex_dump_debug(const char *prefix_str, int prefix_type, int rowsize, int groupsize,
			  const void *buf, size_t len, bool ascii)
{
	const u8 *p = buf;
	char line[256];
	size_t off, i;
	int n;

	(void)prefix_type;
	(void)groupsize;
	(void)ascii;
	if (!shim_log_enabled(SHIM_LOG_DEBUG) || rowsize <= 0 || rowsize > 32)
		return;
	for (off = 0; off < len; off += rowsize) {
		n = snprintf(line, sizeof(line), "%s %08zx:", prefix_str, off);
		for (i = off; i < len && i < off + (size_t)rowsize && n > 0 && (size_t)n + 4 < sizeof(line); i++)
			n += snprintf(line + n, sizeof(line) - n, " %02x", p[i]);
		if (n > 0)
			shim_log(SHIM_LOG_DEBUG, line, (size_t)n);
	}
}
