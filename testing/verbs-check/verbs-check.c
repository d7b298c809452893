/*
 * verbs-check: RDMA WRITE and RDMA READ between RC queue pairs, one end of each pair on each of two verbs
 * devices (the two ends of the emulated Omni-Path cable: hfi1_0 and hfi1_1), every byte compared.
 *
 * One process opens both devices and connects the queue pairs itself (no out-of-band exchange). For each size
 * and each placement (page-aligned, or starting and ending off a page boundary) it fills each pair's source in
 * A with a pattern, RDMA WRITEs them into B's buffers on all pairs at once, RDMA READs them back into second
 * buffers of A on all pairs at once, and compares each source with both copies, and the guard bytes around
 * them with their fill. It prints one JSON line per transfer and a summary line, and exits 0 only if every
 * transfer completed and compared equal.
 *
 *   verbs-check [-a DEV] [-b DEV] [-m MTU] [-q PAIRS] [-s SIZES] [-t SECS] [-u TIMEOUT]
 *     -a, -b  the two devices (default hfi1_0, hfi1_1)
 *     -m      path MTU in bytes: 256, 512, 1024, 2048 or 4096 (default 4096)
 *     -q      queue pairs, each with its own buffers, all transferring at once (default 1, at most 64)
 *     -s      comma-separated sizes in bytes, K and M suffixes allowed (default 1,63,4095,4096,65537,262144,1M,4M)
 *     -t      seconds each round of work requests may take (default 60)
 *     -u      the queue pairs' local ACK timeout, 4.096 us * 2^TIMEOUT, 1..31 (default 14, as perftest's -u)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PAGE 4096UL
#define GUARD 64
#define MAX_SIZES 64
#define MAX_PAIRS 64

struct end {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[MAX_PAIRS];
	struct ibv_mr *mr;
	/* Pair i's [2 * i * len, (2 * i + 1) * len): source (A) or target (B); the next len: read-back (A). */
	uint8_t *buf;
	size_t len;
	int pairs;
	uint16_t lid;
};

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int die(const char *what, int err)
{
	printf("{\"error\":\"%s: %s\"}\n", what, strerror(err));
	return 2;
}

static int parse_sizes(const char *s, size_t *out, int max)
{
	int n = 0;

	while (*s && n < max) {
		char *end;
		unsigned long long v = strtoull(s, &end, 10);

		if (end == s)
			return -1;
		if (*end == 'K' || *end == 'k') {
			v <<= 10;
			end++;
		} else if (*end == 'M' || *end == 'm') {
			v <<= 20;
			end++;
		}
		if (v == 0)
			return -1;
		out[n++] = v;
		if (*end == ',')
			end++;
		else if (*end)
			return -1;
		s = end;
	}
	return n;
}

static enum ibv_mtu mtu_enum(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return 0;
	}
}

static int open_end(struct end *e, size_t len, int pairs)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_port_attr port;
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	if (!list)
		return errno ? errno : ENODEV;
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), e->name))
			e->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!e->ctx)
		return ENODEV;
	if (ibv_query_port(e->ctx, 1, &port))
		return errno;
	if (port.state != IBV_PORT_ACTIVE)
		return ENETDOWN;
	e->lid = port.lid;
	e->len = len;
	e->pairs = pairs;
	if (posix_memalign((void **)&e->buf, PAGE, 2 * len * pairs))
		return ENOMEM;
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = e->pd ? ibv_create_cq(e->ctx, 2 * pairs + 16, NULL, NULL, 0) : NULL;
	if (!e->cq)
		return errno ? errno : ENOMEM;
	e->mr = ibv_reg_mr(e->pd, e->buf, 2 * len * pairs,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!e->mr)
		return errno ? errno : ENOMEM;
	init.send_cq = e->cq;
	init.recv_cq = e->cq;
	for (int i = 0; i < pairs; i++)
		if (!(e->qp[i] = ibv_create_qp(e->pd, &init)))
			return errno ? errno : ENOMEM;
	return 0;
}

/* Pair i's queue pair: INIT, RTR toward `peer`'s, RTS. */
static int connect_qp(struct end *e, struct end *peer, int i, enum ibv_mtu mtu, int timeout)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};

	if (ibv_modify_qp(e->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = peer->qp[i]->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = peer->lid;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(e->qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return errno;
	return 0;
}

/*
 * One RDMA operation from A on every pair at once (pair i: `local[i]` to or from `remote[i]`, `len` bytes) and
 * their completions, within `secs`. ok[i] tells which completed with success.
 */
static int rdma(struct end *a, struct end *b, enum ibv_wr_opcode op, uint8_t **local, uint8_t **remote,
		size_t len, int secs, int *ok, const char **why)
{
	double deadline = now_us() + secs * 1e6;
	int done = 0;

	for (int i = 0; i < a->pairs; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)local[i], .length = len, .lkey = a->mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)remote[i], .rkey = b->mr->rkey },
		}, *bad;

		ok[i] = 0;
		if (ibv_post_send(a->qp[i], &wr, &bad)) {
			*why = "ibv_post_send failed";
			return -1;
		}
	}
	while (done < a->pairs) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(a->cq, 1, &wc);

		if (n < 0) {
			*why = "ibv_poll_cq failed";
			return -1;
		}
		if (n == 0) {
			if (now_us() > deadline) {
				*why = "no completion in time";
				return -1;
			}
			usleep(100);
			continue;
		}
		done++;
		if (wc.wr_id < (uint64_t)a->pairs && wc.status == IBV_WC_SUCCESS)
			ok[wc.wr_id] = 1;
		else if (!*why)
			*why = ibv_wc_status_str(wc.status);
	}
	return *why ? -1 : 0;
}

/* Pattern byte `i` of transfer `t`: no two transfers, and no two neighbouring bytes, alike. */
static uint8_t pattern(unsigned t, size_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(t + 1) * 0xBF58476D1CE4E5B9ULL;

	return (uint8_t)(x ^ x >> 29 ^ x >> 47);
}

int main(int argc, char **argv)
{
	struct end a = { .name = "hfi1_0" }, b = { .name = "hfi1_1" };
	size_t sizes[MAX_SIZES], max = 0;
	int nsizes, mtu = 4096, secs = 60, pairs = 1, timeout = 14, opt, err, failed = 0, transfers = 0, stop = 0;
	const char *size_list = "1,63,4095,4096,65537,262144,1M,4M";
	uint64_t bytes = 0;

	while ((opt = getopt(argc, argv, "a:b:m:q:s:t:u:")) != -1) {
		switch (opt) {
		case 'a': a.name = optarg; break;
		case 'b': b.name = optarg; break;
		case 'm': mtu = atoi(optarg); break;
		case 'q': pairs = atoi(optarg); break;
		case 's': size_list = optarg; break;
		case 't': secs = atoi(optarg); break;
		case 'u': timeout = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: verbs-check [-a DEV] [-b DEV] [-m MTU] [-q PAIRS] [-s SIZES] [-t SECS] [-u TIMEOUT]\n");
			return 2;
		}
	}
	nsizes = parse_sizes(size_list, sizes, MAX_SIZES);
	if (nsizes <= 0 || !mtu_enum(mtu) || secs <= 0 || pairs < 1 || pairs > MAX_PAIRS || timeout < 1 || timeout > 31) {
		fprintf(stderr, "verbs-check: bad -s, -m, -q, -t or -u\n");
		return 2;
	}
	for (int i = 0; i < nsizes; i++)
		max = sizes[i] > max ? sizes[i] : max;
	/* Room for the largest transfer off a page boundary, with guards either side. */
	max = (max + 2 * PAGE + PAGE - 1) & ~(PAGE - 1);
	if ((err = open_end(&a, max, pairs)))
		return die(a.name, err);
	if ((err = open_end(&b, max, pairs)))
		return die(b.name, err);
	for (int i = 0; i < pairs; i++)
		if ((err = connect_qp(&a, &b, i, mtu_enum(mtu), timeout)) || (err = connect_qp(&b, &a, i, mtu_enum(mtu), timeout)))
			return die("connecting the queue pairs", err);

	for (int s = 0; s < nsizes && !stop; s++) {
		/* Offsets into the buffers: page-aligned, then 1 byte past a page (ending off one too). */
		for (size_t off = 0; off <= 1 && !stop; off++) {
			size_t len = sizes[s], at = PAGE + off;
			uint8_t *src[MAX_PAIRS], *back[MAX_PAIRS], *dst[MAX_PAIRS];
			int wrote[MAX_PAIRS], read[MAX_PAIRS];
			double t0, t1, t2 = 0;
			const char *why = NULL;
			unsigned t = transfers;

			for (int i = 0; i < pairs; i++) {
				src[i] = a.buf + 2 * max * i + at;
				back[i] = a.buf + 2 * max * i + max + at;
				dst[i] = b.buf + 2 * max * i + at;
				for (size_t j = 0; j < len; j++)
					src[i][j] = pattern(t + i, j);
				memset(dst[i] - GUARD, 0xA5, len + 2 * GUARD);
				memset(back[i] - GUARD, 0x5A, len + 2 * GUARD);
				wrote[i] = read[i] = 0;
			}
			transfers += pairs;
			t0 = now_us();
			rdma(&a, &b, IBV_WR_RDMA_WRITE, src, dst, len, secs, wrote, &why);
			t1 = now_us();
			if (!why) {
				rdma(&a, &b, IBV_WR_RDMA_READ, back, dst, len, secs, read, &why);
				t2 = now_us();
			}
			/* A failed round leaves work requests whose completions would confuse the next: stop there. */
			stop = why != NULL;
			for (int i = 0; i < pairs; i++) {
				const char *bad_why = NULL;
				size_t bad = len;

				if (!wrote[i] || !read[i])
					bad_why = why ? why : "not completed";
				for (size_t j = 0; j < len && !bad_why && bad == len; j++)
					if (dst[i][j] != src[i][j] || back[i][j] != src[i][j])
						bad = j;
				for (int g = 1; g <= GUARD && !bad_why; g++)
					if (dst[i][-g] != 0xA5 || dst[i][len + g - 1] != 0xA5 ||
					    back[i][-g] != 0x5A || back[i][len + g - 1] != 0x5A)
						bad_why = "a guard byte changed";
				if (!bad_why && bad != len)
					bad_why = "data differs";
				if (!bad_why) {
					bytes += 2 * len;
					printf("{\"size\":%zu,\"offset\":%zu,\"pair\":%d,\"ok\":true,\"write_us\":%.0f,"
					       "\"read_us\":%.0f}\n", len, off, i, t1 - t0, t2 - t1);
					continue;
				}
				failed++;
				printf("{\"size\":%zu,\"offset\":%zu,\"pair\":%d,\"ok\":false,\"error\":\"%s\","
				       "\"first_bad_byte\":%zd}\n", len, off, i, bad_why,
				       bad == len ? (ssize_t)-1 : (ssize_t)bad);
			}
		}
	}
	printf("{\"summary\":true,\"transfers\":%d,\"failed\":%d,\"bytes_compared\":%" PRIu64
	       ",\"mtu\":%d,\"pairs\":%d,\"a\":\"%s\",\"b\":\"%s\"}\n", transfers, failed, bytes, mtu, pairs, a.name,
	       b.name);
	return failed ? 1 : 0;
}
