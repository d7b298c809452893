/*
 * qp-keeper: keeps RC, UC and UD queue pairs of one verbs device in RTS against a virtual peer, so that packets
 * injected from the cable's far end (the wire-side kernel fuzzer) find live QPs past the receive path's QPN
 * lookup. It recreates a QP that falls into the error state, and prints the whole current state as one JSON line
 * on stdout each time it changes. It ends only on SIGTERM/SIGINT (status 0) or an error it cannot recover from
 * (a message on stderr, status 1 for bad usage or a failed set-up, 3 for a fatal device event).
 *
 *   qp-keeper --peer-lid LID [--device DEV] [--qps N] [--peer-qpn BASE] [--qkey QKEY] [--recv-depth N]
 *             [--max-recreate-per-s N] [--self-test-err SECS]
 *     --peer-lid            the virtual peer's LID: the destination of the RC and UC QPs (the other end of the
 *                           cable, hfi1_1's LID on the guest's fabric)
 *     --device              the verbs device (default hfi1_0); port 1
 *     --qps                 QPs of each type RC, UC and UD (default 2, at most 16)
 *     --peer-qpn            the virtual peer's QPN of the first QP of each type; QP i of a type uses BASE + i
 *                           (default 0x800)
 *     --qkey                the UD QPs' Q_Key (default 0x11111111)
 *     --recv-depth          receive WQEs kept posted on every QP (default 32, at most 256)
 *     --max-recreate-per-s  QPs recreated in one second at most; the rest wait for the next second (default 10)
 *     --self-test-err SECS  SECS seconds after the first report, move the first RC QP to ERR with
 *                           ibv_modify_qp, once: it must come back under a new QPN (a test of the recovery)
 *
 * The report: {"generation":K,"device":"hfi1_0","port":1,"lid":L,"sm_lid":S,"peer_lid":P,"mtu":BYTES,
 * "pkeys":[...],"qkey":Q,"sl":0,"qps":[{"type":"rc","qpn":N,"psn":P,"peer_qpn":N,"peer_psn":P},...],
 * "mr":{"addr":A,"len":65536,"rkey":R,"lkey":K},"recreated":COUNT,...}. testing/qp-keeper/README.md has every
 * field.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PORT 1
#define MR_LEN 65536UL
/* Receive buffers: RECV_SLOTS slices of RECV_SLICE bytes in the MR's lower half, shared by every QP's WQEs (the
 * data that lands there is the fuzzer's, and nobody reads it). A slice holds a 4096-byte MTU and a UD GRH. */
#define RECV_SLICE 8192UL
#define RECV_SLOTS 4
#define MAX_PER_TYPE 16
#define MAX_DEPTH 256
#define NTYPES 3
#define MAX_PKEYS 64
/* The RC QPs' local ACK timeout (4.096 us * 2^17, about 0.5 s), retries and RNR retries (7: without limit). */
#define RC_TIMEOUT 17
#define RC_RETRY 7
#define RC_RNR_RETRY 7
#define RC_MIN_RNR_TIMER 12
/* The PSNs each QP starts at: what it expects to receive, and what its own sends would carry. */
#define RQ_PSN_BASE 0x1000
#define SQ_PSN_BASE 0x2000
#define REPORT_MAX 32768

enum qp_kind { RC, UC, UD };
static const char *const kind_name[NTYPES] = { "rc", "uc", "ud" };
static const enum ibv_qp_type kind_type[NTYPES] = { IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD };

struct slot {
	enum qp_kind kind;
	int index; /* within its type */
	struct ibv_qp *qp;
	int broken; /* fell into ERR (or an event or completion said so): to be recreated */
	uint32_t peer_qpn, rq_psn, sq_psn;
};

struct keeper {
	const char *device;
	uint16_t peer_lid;
	int per_type, depth, max_recreate, self_test_err;
	uint32_t peer_qpn_base, qkey;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *chan;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	uint16_t pkeys[MAX_PKEYS];
	int npkeys;
	uint16_t pkey0; /* the entry at index 0: the QPs' P_Key */
	struct slot slots[NTYPES * MAX_PER_TYPE];
	int nslots;
	uint64_t generation, recreated, recreate_failures, throttled, async_events, error_completions;
	time_t window; /* the second the recreation budget counts in */
	int window_used;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int fail(const char *what, int err)
{
	fprintf(stderr, "qp-keeper: %s: %s\n", what, strerror(err ? err : EIO));
	return 1;
}

static int mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256: return 256;
	case IBV_MTU_512: return 512;
	case IBV_MTU_1024: return 1024;
	case IBV_MTU_2048: return 2048;
	case IBV_MTU_4096: return 4096;
	default: return 0;
	}
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? errno : 0;
}

/* The port's attributes and its non-zero P_Keys (ibv_query_pkey gives them in network byte order). */
static int query_port(struct keeper *k)
{
	if (ibv_query_port(k->ctx, PORT, &k->port))
		return errno;
	k->npkeys = 0;
	for (int i = 0; i < k->port.pkey_tbl_len && i < MAX_PKEYS; i++) {
		__be16 pk;

		if (ibv_query_pkey(k->ctx, PORT, i, &pk))
			return errno;
		if (i == 0)
			k->pkey0 = ntohs(pk);
		if (ntohs(pk))
			k->pkeys[k->npkeys++] = ntohs(pk);
	}
	return 0;
}

static int post_recv(struct keeper *k, struct slot *s, int i)
{
	uint64_t at = ((uint64_t)(s - k->slots) * k->depth + i) % RECV_SLOTS * RECV_SLICE;
	struct ibv_sge sge = { .addr = (uintptr_t)(k->buf + at), .length = RECV_SLICE, .lkey = k->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(s->qp, &wr, &bad);
}

/* A new QP for the slot, RESET to INIT to RTR to RTS against the virtual peer, its receive queue full. */
static int create_qp(struct keeper *k, struct slot *s)
{
	struct ibv_qp_init_attr init = {
		.send_cq = k->cq, .recv_cq = k->cq, .qp_type = kind_type[s->kind],
		.cap = { .max_send_wr = 1, .max_recv_wr = k->depth, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a;
	int rd_atomic = k->dev.max_qp_rd_atom < 16 ? k->dev.max_qp_rd_atom : 16;
	int mask, err;

	if (rd_atomic < 1)
		rd_atomic = 1;
	s->qp = ibv_create_qp(k->pd, &init);
	if (!s->qp)
		return errno ? errno : ENOMEM;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT;
	mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (s->kind == UD) {
		a.qkey = k->qkey;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		if (s->kind == RC)
			a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	if (ibv_modify_qp(s->qp, &a, mask))
		goto bad;
	for (int i = 0; i < k->depth; i++)
		if (post_recv(k, s, i))
			goto bad;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	mask = IBV_QP_STATE;
	if (s->kind != UD) {
		a.path_mtu = k->port.active_mtu;
		a.dest_qp_num = s->peer_qpn;
		a.rq_psn = s->rq_psn;
		a.ah_attr.dlid = k->peer_lid;
		a.ah_attr.sl = 0;
		a.ah_attr.port_num = PORT;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (s->kind == RC) {
			a.max_dest_rd_atomic = rd_atomic;
			a.min_rnr_timer = RC_MIN_RNR_TIMER;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	if (ibv_modify_qp(s->qp, &a, mask))
		goto bad;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = s->sq_psn;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (s->kind == RC) {
		a.timeout = RC_TIMEOUT;
		a.retry_cnt = RC_RETRY;
		a.rnr_retry = RC_RNR_RETRY;
		a.max_rd_atomic = rd_atomic;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	if (ibv_modify_qp(s->qp, &a, mask))
		goto bad;
	s->broken = 0;
	return 0;
bad:
	err = errno ? errno : EIO;
	ibv_destroy_qp(s->qp);
	s->qp = NULL;
	return err;
}

static struct slot *slot_of_qpn(struct keeper *k, uint32_t qpn)
{
	for (int i = 0; i < k->nslots; i++)
		if (k->slots[i].qp && k->slots[i].qp->qp_num == qpn)
			return &k->slots[i];
	return NULL;
}

/* Appends to the report buffer; the buffer is sized for MAX_PER_TYPE QPs of each type, so nothing is cut. */
static void put(char *buf, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put(char *buf, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*len >= REPORT_MAX)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *len, REPORT_MAX - *len, fmt, ap);
	va_end(ap);
	if (n > 0)
		*len += (size_t)n;
}

/* The whole current state as one JSON line. The PSNs are the QPs' live ones (ibv_query_qp: the next PSN each
 * expects to receive, and the next it would send), which move as the fuzzer's packets are accepted. */
static void report(struct keeper *k)
{
	static char buf[REPORT_MAX];
	size_t len = 0;
	int first = 1;

	query_port(k);
	put(buf, &len, "{\"generation\":%" PRIu64 ",\"device\":\"%s\",\"port\":%d,\"lid\":%u,\"sm_lid\":%u,"
	    "\"peer_lid\":%u,\"mtu\":%d,\"pkeys\":[", ++k->generation, k->device, PORT, k->port.lid, k->port.sm_lid,
	    k->peer_lid, mtu_bytes(k->port.active_mtu));
	for (int i = 0; i < k->npkeys; i++)
		put(buf, &len, "%s%u", i ? "," : "", k->pkeys[i]);
	put(buf, &len, "],\"pkey\":%u,\"qkey\":%" PRIu32 ",\"sl\":0,\"qps\":[", k->pkey0, k->qkey);
	for (int i = 0; i < k->nslots; i++) {
		struct slot *s = &k->slots[i];
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		uint32_t rq = s->rq_psn, sq = s->sq_psn;

		if (!s->qp)
			continue;
		if (!ibv_query_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN, &ia)) {
			rq = a.rq_psn;
			sq = a.sq_psn;
		}
		put(buf, &len, "%s{\"type\":\"%s\",\"qpn\":%u,\"psn\":%u,\"peer_qpn\":%u,\"peer_psn\":%u,\"sq_psn\":%u}",
		    first ? "" : ",", kind_name[s->kind], s->qp->qp_num, rq, s->peer_qpn, rq, sq);
		first = 0;
	}
	put(buf, &len, "],\"mr\":{\"addr\":%" PRIu64 ",\"len\":%lu,\"rkey\":%u,\"lkey\":%u},\"recreated\":%" PRIu64
	    ",\"recreate_failures\":%" PRIu64 ",\"throttled\":%" PRIu64 ",\"async_events\":%" PRIu64
	    ",\"error_completions\":%" PRIu64 ",\"port_state\":%d,\"recv_depth\":%d}\n",
	    (uint64_t)(uintptr_t)k->buf, MR_LEN, k->mr->rkey, k->mr->lkey, k->recreated, k->recreate_failures,
	    k->throttled, k->async_events, k->error_completions, k->port.state, k->depth);
	fwrite(buf, 1, len, stdout);
	fflush(stdout);
}

/* Recreates the broken QPs, at most max_recreate in one second; the rest wait (a hostile stream of packets
 * that breaks QPs as fast as they come back must not make this spin). Returns how many came back. */
static int recreate(struct keeper *k)
{
	time_t now = time(NULL);
	int done = 0;

	if (now != k->window) {
		k->window = now;
		k->window_used = 0;
	}
	for (int i = 0; i < k->nslots; i++) {
		struct slot *s = &k->slots[i];
		int err;

		if (!s->broken)
			continue;
		if (k->window_used >= k->max_recreate) {
			k->throttled++;
			break;
		}
		k->window_used++;
		if (s->qp && ibv_destroy_qp(s->qp))
			fprintf(stderr, "qp-keeper: destroying %s QP %u: %s\n", kind_name[s->kind], s->qp->qp_num,
				strerror(errno));
		s->qp = NULL;
		err = create_qp(k, s);
		if (err) {
			k->recreate_failures++;
			fprintf(stderr, "qp-keeper: recreating %s QP %d: %s\n", kind_name[s->kind], s->index, strerror(err));
			continue;
		}
		k->recreated++;
		done++;
	}
	return done;
}

/* Marks every QP the kernel has in ERR (or SQE: the send queue stopped) as broken. */
static void sweep_states(struct keeper *k)
{
	for (int i = 0; i < k->nslots; i++) {
		struct slot *s = &k->slots[i];
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;

		if (!s->qp) {
			s->broken = 1;
			continue;
		}
		if (!ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia) && (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_SQE))
			s->broken = 1;
	}
}

/* Drains the CQ: a successful receive gets its WQE back, anything else breaks the QP it came from (a flushed
 * WQE means the QP is in ERR; an error status moved it there). */
static int drain_cq(struct keeper *k)
{
	struct ibv_wc wc[32];
	int n;

	while ((n = ibv_poll_cq(k->cq, 32, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			struct slot *s = slot_of_qpn(k, wc[i].qp_num);

			if (!s || s->broken)
				continue; /* a QP destroyed since, or already due for recreation */
			if (wc[i].status == IBV_WC_SUCCESS && (wc[i].opcode & IBV_WC_RECV)) {
				if (post_recv(k, s, (int)wc[i].wr_id))
					s->broken = 1;
				continue;
			}
			if (wc[i].status != IBV_WC_SUCCESS) {
				k->error_completions++;
				s->broken = 1;
			}
		}
	}
	return n < 0 ? EIO : 0;
}

/* One async event. Returns -1 for a fatal device event, 1 if the report changed, 0 otherwise. */
static int handle_async(struct keeper *k, struct ibv_async_event *ev)
{
	struct slot *s;

	k->async_events++;
	switch (ev->event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
		s = slot_of_qpn(k, ev->element.qp->qp_num);
		if (s)
			s->broken = 1;
		return 0;
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_CQ_ERR:
		return -1;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
		return 1;
	default:
		return 0;
	}
}

static int setup(struct keeper *k)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	int err;

	if (!list)
		return fail("ibv_get_device_list", errno);
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), k->device))
			k->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!k->ctx)
		return fail(k->device, ENODEV);
	if (ibv_query_device(k->ctx, &k->dev))
		return fail("ibv_query_device", errno);
	if ((err = query_port(k)))
		return fail("ibv_query_port", err);
	if (!mtu_bytes(k->port.active_mtu))
		return fail("the port's active MTU", EINVAL);
	if (posix_memalign((void **)&k->buf, 4096, MR_LEN))
		return fail("the MR's buffer", ENOMEM);
	memset(k->buf, 0, MR_LEN);
	if (!(k->pd = ibv_alloc_pd(k->ctx)))
		return fail("ibv_alloc_pd", errno);
	k->mr = ibv_reg_mr(k->pd, k->buf, MR_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (!k->mr)
		return fail("ibv_reg_mr", errno);
	if (!(k->chan = ibv_create_comp_channel(k->ctx)))
		return fail("ibv_create_comp_channel", errno);
	/* Every WQE of every QP completes at most once, and a recreated QP's WQEs may join its predecessor's flushed
	 * ones before they are polled: room for twice all of them. */
	k->cq = ibv_create_cq(k->ctx, 2 * k->nslots * k->depth + 16, NULL, k->chan, 0);
	if (!k->cq)
		return fail("ibv_create_cq", errno);
	if (ibv_req_notify_cq(k->cq, 0))
		return fail("ibv_req_notify_cq", errno);
	if ((err = set_nonblock(k->chan->fd)) || (err = set_nonblock(k->ctx->async_fd)))
		return fail("O_NONBLOCK on the event fds", err);
	for (int i = 0; i < k->nslots; i++) {
		struct slot *s = &k->slots[i];
		char what[64];

		if ((err = create_qp(k, s))) {
			snprintf(what, sizeof(what), "creating %s QP %d", kind_name[s->kind], s->index);
			return fail(what, err);
		}
	}
	return 0;
}

static unsigned long opt_num(const char *name, const char *v, unsigned long max)
{
	char *end;
	unsigned long n = strtoul(v, &end, 0);

	if (!*v || *end || n > max) {
		fprintf(stderr, "qp-keeper: bad --%s %s (at most %lu)\n", name, v, max);
		exit(1);
	}
	return n;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "device", required_argument, 0, 'd' }, { "peer-lid", required_argument, 0, 'l' },
		{ "qps", required_argument, 0, 'n' }, { "peer-qpn", required_argument, 0, 'p' },
		{ "qkey", required_argument, 0, 'q' }, { "recv-depth", required_argument, 0, 'r' },
		{ "max-recreate-per-s", required_argument, 0, 'm' }, { "self-test-err", required_argument, 0, 'e' },
		{ 0, 0, 0, 0 },
	};
	static struct keeper k = { .device = "hfi1_0", .per_type = 2, .depth = 32, .max_recreate = 10,
				   .self_test_err = -1, .peer_qpn_base = 0x800, .qkey = 0x11111111 };
	struct sigaction sa = { .sa_handler = on_signal };
	int opt, have_lid = 0, rc = 0;
	struct timespec t_first = { 0 };

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'd': k.device = optarg; break;
		case 'l': k.peer_lid = opt_num("peer-lid", optarg, 0xffff); have_lid = 1; break;
		case 'n': k.per_type = opt_num("qps", optarg, MAX_PER_TYPE); break;
		case 'p': k.peer_qpn_base = opt_num("peer-qpn", optarg, 0xffffff - MAX_PER_TYPE); break;
		case 'q': k.qkey = opt_num("qkey", optarg, 0xffffffff); break;
		case 'r': k.depth = opt_num("recv-depth", optarg, MAX_DEPTH); break;
		case 'm': k.max_recreate = opt_num("max-recreate-per-s", optarg, 1000); break;
		case 'e': k.self_test_err = opt_num("self-test-err", optarg, 86400); break;
		default:
			fprintf(stderr, "usage: qp-keeper --peer-lid LID [--device DEV] [--qps N] [--peer-qpn BASE] "
				"[--qkey QKEY] [--recv-depth N] [--max-recreate-per-s N] [--self-test-err SECS]\n");
			return 1;
		}
	}
	if (!have_lid || !k.peer_lid || k.per_type < 1 || k.depth < 1 || k.max_recreate < 1) {
		fprintf(stderr, "qp-keeper: --peer-lid (non-zero) is required; --qps, --recv-depth and "
			"--max-recreate-per-s must be at least 1\n");
		return 1;
	}
	for (int t = 0; t < NTYPES; t++)
		for (int i = 0; i < k.per_type; i++) {
			struct slot *s = &k.slots[k.nslots++];

			s->kind = t;
			s->index = i;
			s->peer_qpn = k.peer_qpn_base + i;
			s->rq_psn = RQ_PSN_BASE + t * MAX_PER_TYPE + i;
			s->sq_psn = SQ_PSN_BASE + t * MAX_PER_TYPE + i;
		}
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (setup(&k))
		return 1;
	report(&k);
	clock_gettime(CLOCK_MONOTONIC, &t_first);

	while (!stop) {
		struct pollfd fds[2] = { { .fd = k.chan->fd, .events = POLLIN }, { .fd = k.ctx->async_fd, .events = POLLIN } };
		int changed = 0, n;

		/* A second at most: the state sweep, the next second's recreation budget and the self-test need no
		 * finer clock. */
		n = poll(fds, 2, 1000);
		if (n < 0 && errno != EINTR) {
			rc = fail("poll", errno);
			break;
		}
		if (n > 0 && (fds[1].revents & POLLIN)) {
			struct ibv_async_event ev;

			while (!ibv_get_async_event(k.ctx, &ev)) {
				int r = handle_async(&k, &ev);

				if (r < 0)
					fprintf(stderr, "qp-keeper: fatal async event: %s\n", ibv_event_type_str(ev.event_type));
				ibv_ack_async_event(&ev);
				if (r < 0) {
					rc = 3;
					goto out;
				}
				changed |= r;
			}
		}
		if (n > 0 && (fds[0].revents & POLLIN)) {
			struct ibv_cq *cq;
			void *cq_ctx;

			while (!ibv_get_cq_event(k.chan, &cq, &cq_ctx))
				ibv_ack_cq_events(cq, 1);
			if (ibv_req_notify_cq(k.cq, 0)) {
				rc = fail("ibv_req_notify_cq", errno);
				break;
			}
		}
		/* Also after a timeout: a completion that raced the notification request is not left behind. */
		if (drain_cq(&k)) {
			rc = fail("ibv_poll_cq", EIO);
			break;
		}
		if (k.self_test_err >= 0) {
			struct timespec t;

			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t_first.tv_sec >= k.self_test_err && k.slots[0].qp) {
				struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

				fprintf(stderr, "qp-keeper: self-test: RC QP %u to ERR\n", k.slots[0].qp->qp_num);
				if (ibv_modify_qp(k.slots[0].qp, &a, IBV_QP_STATE))
					fprintf(stderr, "qp-keeper: self-test: ibv_modify_qp: %s\n", strerror(errno));
				k.self_test_err = -1;
			}
		}
		sweep_states(&k);
		if (recreate(&k))
			changed = 1;
		if (changed)
			report(&k);
	}
out:
	for (int i = 0; i < k.nslots; i++)
		if (k.slots[i].qp)
			ibv_destroy_qp(k.slots[i].qp);
	ibv_destroy_cq(k.cq);
	ibv_destroy_comp_channel(k.chan);
	ibv_dereg_mr(k.mr);
	ibv_dealloc_pd(k.pd);
	ibv_close_device(k.ctx);
	free(k.buf);
	return rc;
}
