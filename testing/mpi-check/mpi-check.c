/*
 * mpi-check: a two-rank MPI ping-pong with every byte checked, for Open MPI over PSM2 on the two emulated HFIs.
 *
 * Rank 0 sends each message to rank 1, which checks it byte by byte and sends it back with every byte
 * transformed; rank 0 checks the echo. The pattern depends on the size, the placement and the iteration, so a
 * message delivered to the wrong buffer, a stale buffer or a packet placed at the wrong offset fails the check.
 * The buffers carry guard bytes on both sides, checked too. Sizes default to ones that cross every PSM2
 * threshold (tiny <= 8 B, PIO eager, SDMA eager up to 64000 B, then the TID rendezvous in 128 KiB windows), each
 * sent page-aligned and at offset 1 (PSM2's unaligned head and tail bytes).
 *
 * Rank 0 prints one JSON line per size and placement and a summary line; the exit status is 0 only if every
 * message compared equal on both ranks.
 *
 *   mpi-check [-s SIZES] [-i ITERS] [-b]
 *     -s  comma-separated sizes in bytes, K and M suffixes allowed
 *     -i  round trips per size and placement (default 3)
 *     -b  benchmark: also time ITERS round trips per size, and print latency (half a round trip) and bandwidth
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#define PAGE 4096UL
#define GUARD 64
#define GUARD_BYTE 0xa5
#define MAX_SIZES 64
#define TAG 17

static const char *const DEFAULT_SIZES =
	"1,8,9,4096,16384,16385,34000,34001,64000,64001,131072,131075,1048579,4194304";

/* The byte at index i of a message of `size` bytes, at placement `offset`, in round trip `iter`; `echo`: as rank 1
 * sends it back. */
static uint8_t pattern(size_t i, size_t size, size_t offset, int iter, int echo)
{
	uint64_t x = (uint64_t)i * 2654435761u + size * 40503u + offset * 977u + (uint64_t)iter * 131u;

	x ^= x >> 13;
	return (uint8_t)(echo ? ~(x ^ (x >> 8)) : (x ^ (x >> 8)));
}

static size_t parse_size(const char *s, int *ok)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (end == s) {
		*ok = 0;
		return 0;
	}
	if (*end == 'K' || *end == 'k')
		v <<= 10, end++;
	else if (*end == 'M' || *end == 'm')
		v <<= 20, end++;
	if (*end != '\0' && *end != ',')
		*ok = 0;
	return (size_t)v;
}

static int parse_sizes(const char *arg, size_t *sizes)
{
	int n = 0, ok = 1;
	const char *p = arg;

	while (*p && n < MAX_SIZES) {
		sizes[n] = parse_size(p, &ok);
		if (!ok || sizes[n] == 0)
			return -1;
		n++;
		p = strchr(p, ',');
		if (!p)
			break;
		p++;
	}
	return n;
}

static void fill(uint8_t *buf, size_t size, size_t offset, int iter, int echo)
{
	for (size_t i = 0; i < size; i++)
		buf[offset + GUARD + i] = pattern(i, size, offset, iter, echo);
}

/* The first wrong byte (a guard or data byte) as an index from the start of `buf`, or -1. */
static long check(const uint8_t *buf, size_t size, size_t offset, int iter, int echo)
{
	const size_t start = offset + GUARD;

	for (size_t i = 0; i < start; i++)
		if (buf[i] != GUARD_BYTE)
			return (long)i;
	for (size_t i = 0; i < size; i++)
		if (buf[start + i] != pattern(i, size, offset, iter, echo))
			return (long)(start + i);
	for (size_t i = 0; i < GUARD; i++)
		if (buf[start + size + i] != GUARD_BYTE)
			return (long)(start + size + i);
	return -1;
}

int main(int argc, char **argv)
{
	size_t sizes[MAX_SIZES], max = 0;
	int nsizes, iters = 3, bench = 0, opt, rank, nranks, failed = 0, transfers = 0;
	uint64_t compared = 0;
	const char *sizes_arg = DEFAULT_SIZES;
	char host[256] = "";

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	while ((opt = getopt(argc, argv, "s:i:b")) != -1) {
		switch (opt) {
		case 's':
			sizes_arg = optarg;
			break;
		case 'i':
			iters = atoi(optarg);
			break;
		case 'b':
			bench = 1;
			break;
		default:
			if (rank == 0)
				fprintf(stderr, "usage: mpi-check [-s SIZES] [-i ITERS] [-b]\n");
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	nsizes = parse_sizes(sizes_arg, sizes);
	if (nsizes <= 0 || iters < 1 || nranks != 2) {
		if (rank == 0)
			printf("{\"error\":\"need 2 ranks (have %d), sizes > 0 and -i >= 1\"}\n", nranks);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (int s = 0; s < nsizes; s++)
		max = sizes[s] > max ? sizes[s] : max;
	gethostname(host, sizeof(host) - 1);

	/* Room for offset 1 and the guards on both sides, page-aligned so that offset 0 is. */
	size_t len = max + 2 * GUARD + PAGE;
	uint8_t *alloc = NULL;
	if (posix_memalign((void **)&alloc, PAGE, len + PAGE)) {
		printf("{\"error\":\"posix_memalign: %s\"}\n", strerror(ENOMEM));
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	/* The data starts at PAGE + offset: the leading guard sits in the page before. */
	uint8_t *buf = alloc + PAGE - GUARD;

	for (int s = 0; s < nsizes; s++) {
		for (size_t offset = 0; offset <= 1; offset++) {
			size_t size = sizes[s];
			long bad = -1;
			int where = -1;
			double t0 = MPI_Wtime(), rtt_us;

			for (int it = 0; it < iters && bad < 0; it++) {
				memset(alloc, GUARD_BYTE, len + PAGE);
				if (rank == 0) {
					fill(buf, size, offset, it, 0);
					MPI_Send(buf + offset + GUARD, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
					memset(alloc, GUARD_BYTE, len + PAGE);
					MPI_Recv(buf + offset + GUARD, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					bad = check(buf, size, offset, it, 1);
					if (bad >= 0)
						where = 0;
				} else {
					MPI_Recv(buf + offset + GUARD, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					bad = check(buf, size, offset, it, 0);
					if (bad >= 0)
						where = 1;
					/* Echo it back transformed, so rank 0 checks a message rank 1 wrote. */
					fill(buf, size, offset, it, 1);
					MPI_Send(buf + offset + GUARD, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
				}
				/* Both ranks agree on the outcome before the next round trip. */
				long mine = bad;
				int whom = where;
				MPI_Allreduce(&mine, &bad, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
				MPI_Allreduce(&whom, &where, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
				if (bad == -1)
					compared += 2 * (uint64_t)size;
			}
			rtt_us = (MPI_Wtime() - t0) * 1e6 / iters;
			transfers++;
			if (bad != -1)
				failed++;
			if (rank == 0) {
				if (bad == -1)
					printf("{\"size\":%zu,\"offset\":%zu,\"ok\":true,\"rtt_us\":%.1f}\n", size, offset,
					       rtt_us);
				else
					printf("{\"size\":%zu,\"offset\":%zu,\"ok\":false,\"error\":\"rank %d: byte %ld of the "
					       "buffer wrong (data from %zu)\"}\n",
					       size, offset, where, bad, offset + GUARD);
				fflush(stdout);
			}
		}
		if (bench) {
			double t0;

			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
			for (int it = 0; it < iters; it++) {
				if (rank == 0) {
					MPI_Send(buf + GUARD, (int)sizes[s], MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
					MPI_Recv(buf + GUARD, (int)sizes[s], MPI_BYTE, 1, TAG, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
				} else {
					MPI_Recv(buf + GUARD, (int)sizes[s], MPI_BYTE, 0, TAG, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					MPI_Send(buf + GUARD, (int)sizes[s], MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
				}
			}
			double half_us = (MPI_Wtime() - t0) * 1e6 / iters / 2;
			if (rank == 0) {
				printf("{\"bench\":true,\"size\":%zu,\"iters\":%d,\"latency_us\":%.2f,\"mb_s\":%.2f}\n",
				       sizes[s], iters, half_us, sizes[s] / half_us);
				fflush(stdout);
			}
		}
	}
	if (rank == 0)
		printf("{\"summary\":true,\"transfers\":%d,\"failed\":%d,\"bytes_checked\":%" PRIu64
		       ",\"ranks\":%d,\"host\":\"%s\"}\n",
		       transfers, failed, compared, nranks, host);
	free(alloc);
	MPI_Finalize();
	return failed ? 1 : 0;
}
