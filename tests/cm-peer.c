/* SPDX-License-Identifier: MIT */
/*
 * cm-peer - one side of an rdma_cm exchange whose buffers lie in an odpd
 * segment (odpd_alloc) and are registered through libodpd's librdmacm
 * mirror (odpd_reg_msgs / odpd_reg_read / odpd_reg_write: client-PD mode),
 * for tests/test-cm.c. It uses the default connection ($ODPD_SOCKET).
 *
 *   cm-peer client ADDR PORT      rdma_client's exchange (librdmacm/examples/
 *                                 rdma_client.c), against rdma_server
 *   cm-peer server ADDR PORT      rdma_server's exchange, against rdma_client
 *   cm-peer target ADDR PORT LEN  owns LEN bytes (a multiple of 4096): odpd_reg_write
 *                                 and odpd_reg_read MRs over them, sends their
 *                                 address and rkeys in a message
 *   cm-peer initiator ADDR PORT   RDMA WRITE and READ through the target's MRs
 *   cm-peer drive ADDR            an rdma_cm id bound to ADDR's device with a PD of
 *                                 its own; registers on commands from stdin
 *
 * It reports on stdout, one line per event ("WORD key=value ..."), and
 * waits for a "go" line on stdin where the test looks at the kernel's MR
 * table; EOF on stdin ends it (exit 3). Diagnostics go to stderr. Exit 0:
 * the exchange passed; otherwise the number of the step that failed, after a
 * "fail step=... errno=... msg=..." line. alarm(120): a verb that never
 * completes ends the peer with SIGALRM instead of hanging the test.
 *
 * Bytes: a sender sends pattern(16, seed 7); a receiver's buffer is filled
 * with 0xa5 before its receive is posted and reported in hex afterwards
 * (rdma_server and rdma_client send 16 zero bytes).
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "odpd.h"

#define MSG_LEN 16

static const char *prog = "cm-peer";

static void report(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static const char *ename(int e)
{
	const char *n = strerrorname_np(e);

	return n ? n : "E?";
}

/* Report a failed step and exit with @code. */
static _Noreturn void die(int code, const char *step, int err, const char *msg)
{
	report("fail step=%s errno=%s msg=%s", step, ename(err), msg ? msg : strerror(err));
	fprintf(stderr, "%s[%d]: %s: %s%s%s\n", prog, (int)getpid(), step, strerror(err),
		msg ? ": " : "", msg ? msg : "");
	exit(code);
}

/* Wait for "go" from the test. */
static void wait_go(void)
{
	char line[64];

	if (!fgets(line, sizeof(line), stdin))
		exit(3);
	if (strcmp(line, "go\n") != 0)
		die(4, "wait_go", EPROTO, "expected go");
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 29 + i * 13 + (i >> 9) + 1);
}

static size_t pattern_mismatch(const uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(seed * 29 + i * 13 + (i >> 9) + 1))
			return i;
	return n;
}

static void hex(char *out, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

static uint8_t *segment(size_t len, size_t *ret_len)
{
	struct odpd_conn *c = odpd_default_conn();
	struct odpd_segment *s = c ? odpd_alloc(c, len, 0) : NULL;

	if (!s)
		die(5, c ? "odpd_alloc" : "odpd_default_conn", errno, odpd_errmsg());
	if (ret_len)
		*ret_len = odpd_segment_length(s);
	return odpd_segment_addr(s);
}

/* One mirror MR, reported as the test parses it. */
static struct ibv_mr *reg(const char *name, struct ibv_mr *(*fn)(struct rdma_cm_id *, void *, size_t),
			  const char *fn_name, struct rdma_cm_id *id, void *addr, size_t len)
{
	struct ibv_mr *mr = fn(id, addr, len);

	if (!mr)
		die(6, fn_name, errno, odpd_errmsg());
	report("mr name=%s want_addr=%p want_length=%zu addr=%p length=%zu lkey=%" PRIu32
	       " rkey=%" PRIu32 " pd=%d ctx=%d", name, addr, len, mr->addr, mr->length, mr->lkey,
	       mr->rkey, mr->pd == id->pd, mr->context == id->verbs);
	return mr;
}

static void dereg(struct ibv_mr *mr)
{
	if (odpd_dereg_mr(mr) < 0)
		die(7, "odpd_dereg_mr", errno, odpd_errmsg());
}

/* Wait for one completion on the send or the receive CQ; require success. */
static void comp(struct rdma_cm_id *id, bool send, const char *step, struct ibv_wc *wc)
{
	int r;

	do
		r = send ? rdma_get_send_comp(id, wc) : rdma_get_recv_comp(id, wc);
	while (r == 0);
	if (r < 0)
		die(8, step, errno, NULL);
	if (wc->status != IBV_WC_SUCCESS)
		die(9, step, EIO, ibv_wc_status_str(wc->status));
}

static struct rdma_addrinfo *addrinfo(const char *addr, const char *port, bool passive)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	int r;

	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	r = rdma_getaddrinfo(addr, port, &hints, &res);
	if (r)
		die(10, "rdma_getaddrinfo", r == EAI_SYSTEM ? errno : EINVAL, gai_strerror(r));
	return res;
}

/* No inline data: every send reads its bytes through an MR's lkey. */
static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = { .sq_sig_all = 1 };

	a.cap.max_send_wr = a.cap.max_recv_wr = 2;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	return a;
}

static struct rdma_cm_id *listen_on(const char *addr, const char *port, struct rdma_addrinfo **res)
{
	struct ibv_qp_init_attr a = qp_attr();
	struct rdma_cm_id *listen_id;

	*res = addrinfo(addr, port, true);
	if (rdma_create_ep(&listen_id, *res, NULL, &a))
		die(11, "rdma_create_ep (passive)", errno, NULL);
	if (rdma_listen(listen_id, 0))
		die(12, "rdma_listen", errno, NULL);
	report("listening port=%s", port);
	return listen_id;
}

static struct rdma_cm_id *accept_one(struct rdma_cm_id *listen_id)
{
	struct rdma_cm_id *id;

	if (rdma_get_request(listen_id, &id))
		die(13, "rdma_get_request", errno, NULL);
	if (!id->qp || !id->pd)
		die(13, "rdma_get_request", EINVAL, "no QP or PD on the new id");
	return id;
}

static struct rdma_cm_id *active_ep(const char *addr, const char *port, struct rdma_addrinfo **res)
{
	struct ibv_qp_init_attr a = qp_attr();
	struct rdma_cm_id *id;

	*res = addrinfo(addr, port, false);
	if (rdma_create_ep(&id, *res, NULL, &a))
		die(14, "rdma_create_ep", errno, NULL);
	return id;
}

/* ---------------------------------------------------------------- rdma_client's exchange */

static int run_client(const char *addr, const char *port)
{
	struct rdma_addrinfo *res;
	struct rdma_cm_id *id = active_ep(addr, port, &res);
	uint8_t *base = segment(1 << 16, NULL);
	/* not page aligned, as rdma_client's static buffers */
	uint8_t *recv_msg = base + 100, *send_msg = base + 4096 + 200;
	struct ibv_mr *mr, *send_mr, *ref;
	char h[2 * MSG_LEN + 1];
	struct ibv_wc wc;

	/* what rdma_reg_msgs(3) gives for the same buffer, for comparison */
	ref = rdma_reg_msgs(id, recv_msg, MSG_LEN);
	if (!ref)
		die(15, "rdma_reg_msgs", errno, NULL);
	report("ref addr=%p length=%zu", ref->addr, ref->length);
	if (rdma_dereg_mr(ref))
		die(15, "rdma_dereg_mr", errno, NULL);

	mr = reg("recv", odpd_reg_msgs, "odpd_reg_msgs", id, recv_msg, MSG_LEN);
	send_mr = reg("send", odpd_reg_msgs, "odpd_reg_msgs", id, send_msg, MSG_LEN);
	report("registered");
	wait_go();

	memset(recv_msg, 0xa5, MSG_LEN);
	pattern(send_msg, MSG_LEN, 7);
	if (rdma_post_recv(id, NULL, recv_msg, MSG_LEN, mr))
		die(16, "rdma_post_recv", errno, NULL);
	if (rdma_connect(id, NULL))
		die(17, "rdma_connect", errno, NULL);
	if (rdma_post_send(id, NULL, send_msg, MSG_LEN, send_mr, 0))
		die(18, "rdma_post_send", errno, NULL);
	comp(id, true, "send completion", &wc);
	comp(id, false, "recv completion", &wc);
	hex(h, recv_msg, MSG_LEN);
	report("exchanged byte_len=%u recv=%s", wc.byte_len, h);
	rdma_disconnect(id);
	dereg(send_mr);
	dereg(mr);
	report("deregistered");
	wait_go();
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	return 0;
}

/* ---------------------------------------------------------------- rdma_server's exchange */

static int run_server(const char *addr, const char *port)
{
	struct rdma_addrinfo *res;
	struct rdma_cm_id *listen_id = listen_on(addr, port, &res), *id;
	uint8_t *base = segment(1 << 16, NULL);
	uint8_t *recv_msg = base + 300, *send_msg = base + 8192 + 40;
	struct ibv_mr *mr, *send_mr;
	char h[2 * MSG_LEN + 1];
	struct ibv_wc wc;

	id = accept_one(listen_id);
	mr = reg("recv", odpd_reg_msgs, "odpd_reg_msgs", id, recv_msg, MSG_LEN);
	send_mr = reg("send", odpd_reg_msgs, "odpd_reg_msgs", id, send_msg, MSG_LEN);
	memset(recv_msg, 0xa5, MSG_LEN);
	pattern(send_msg, MSG_LEN, 7);
	if (rdma_post_recv(id, NULL, recv_msg, MSG_LEN, mr))
		die(16, "rdma_post_recv", errno, NULL);
	if (rdma_accept(id, NULL))
		die(17, "rdma_accept", errno, NULL);
	comp(id, false, "recv completion", &wc);
	hex(h, recv_msg, MSG_LEN);
	report("received byte_len=%u recv=%s", wc.byte_len, h);
	if (rdma_post_send(id, NULL, send_msg, MSG_LEN, send_mr, 0))
		die(18, "rdma_post_send", errno, NULL);
	comp(id, true, "send completion", &wc);
	/* as rdma_server: a synchronous id's rdma_disconnect returns once the
	 * peer disconnected too, so it comes before any wait for the test */
	rdma_disconnect(id);
	report("exchanged");
	wait_go();
	dereg(send_mr);
	dereg(mr);
	report("deregistered");
	wait_go();
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return 0;
}

/* ---------------------------------------------------------------- RDMA WRITE / READ */

/* The target's message: where its buffer is and the two rkeys. */
struct rw_msg {
	uint64_t addr;
	uint32_t length;
	uint32_t write_rkey;         /* odpd_reg_write */
	uint32_t read_rkey;          /* odpd_reg_read */
	uint32_t pad;
};

/*
 * The first half of the buffer starts zeroed and the initiator writes
 * pattern seed 1 there; the second half holds pattern seed 2 for it to read;
 * its attempt to write the second half through the read-only MR must fail.
 */
static int run_target(const char *addr, const char *port, size_t len)
{
	struct rdma_addrinfo *res;
	struct rdma_cm_id *listen_id, *id;
	uint8_t *buf, *msgbuf;
	struct ibv_mr *wmr, *rmr, *mmr;
	struct rw_msg m;
	struct ibv_wc wc;
	size_t first, second;

	if (len == 0 || len % 8192 || len > UINT32_MAX)
		die(2, "length", EINVAL, "LEN: a multiple of 8192");
	listen_id = listen_on(addr, port, &res);
	buf = segment(len + 4096, NULL);
	msgbuf = buf + len;
	memset(buf, 0, len / 2);
	pattern(buf + len / 2, len / 2, 2);
	id = accept_one(listen_id);
	wmr = reg("write", odpd_reg_write, "odpd_reg_write", id, buf, len);
	rmr = reg("read", odpd_reg_read, "odpd_reg_read", id, buf, len);
	mmr = reg("msg", odpd_reg_msgs, "odpd_reg_msgs", id, msgbuf, sizeof(m));
	m = (struct rw_msg){ .addr = htole64((uintptr_t)buf), .length = htole32((uint32_t)len),
			     .write_rkey = htole32(wmr->rkey), .read_rkey = htole32(rmr->rkey) };
	memcpy(msgbuf, &m, sizeof(m));
	if (rdma_accept(id, NULL))
		die(17, "rdma_accept", errno, NULL);
	if (rdma_post_send(id, NULL, msgbuf, sizeof(m), mmr, 0))
		die(18, "rdma_post_send", errno, NULL);
	comp(id, true, "send completion", &wc);
	report("sent addr=%p length=%zu write_rkey=%" PRIu32 " read_rkey=%" PRIu32, buf, len,
	       wmr->rkey, rmr->rkey);
	wait_go();                    /* the initiator has written, read and been refused */
	/* the initiator waits in rdma_disconnect: the bytes no longer change */
	first = pattern_mismatch(buf, len / 2, 1);
	second = pattern_mismatch(buf + len / 2, len / 2, 2);
	report("checked first=%s second=%s first_bad=%zu second_bad=%zu",
	       first == len / 2 ? "ok" : "bad", second == len / 2 ? "ok" : "bad", first, second);
	rdma_disconnect(id);
	dereg(mmr);
	dereg(rmr);
	dereg(wmr);
	report("deregistered");
	wait_go();
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return 0;
}

static int run_initiator(const char *addr, const char *port)
{
	struct rdma_addrinfo *res;
	struct rdma_cm_id *id = active_ep(addr, port, &res);
	size_t seglen, len, bad;
	uint8_t *seg = segment(1 << 20, &seglen), *msgbuf = seg, *data = seg + 4096;
	uint8_t *src, *dst;
	struct ibv_mr *mmr, *dmr;
	struct rw_msg m;
	struct ibv_wc wc;
	uint64_t raddr;
	int r;

	mmr = reg("msg", odpd_reg_msgs, "odpd_reg_msgs", id, msgbuf, sizeof(m));
	dmr = reg("data", odpd_reg_msgs, "odpd_reg_msgs", id, data, seglen - 4096);
	if (rdma_post_recv(id, NULL, msgbuf, sizeof(m), mmr))
		die(16, "rdma_post_recv", errno, NULL);
	if (rdma_connect(id, NULL))
		die(17, "rdma_connect", errno, NULL);
	comp(id, false, "recv completion", &wc);
	if (wc.byte_len != sizeof(m))
		die(19, "message", EPROTO, "short message");
	memcpy(&m, msgbuf, sizeof(m));
	raddr = le64toh(m.addr);
	len = le32toh(m.length);
	report("got addr=%#" PRIx64 " length=%zu write_rkey=%" PRIu32 " read_rkey=%" PRIu32, raddr, len,
	       le32toh(m.write_rkey), le32toh(m.read_rkey));
	if (len == 0 || len % 8192 || 2 * len > seglen - 4096)
		die(19, "message", EPROTO, "bad length");
	src = data;
	dst = data + len;

	pattern(src, len / 2, 1);
	if (rdma_post_write(id, NULL, src, len / 2, dmr, 0, raddr, le32toh(m.write_rkey)))
		die(20, "rdma_post_write", errno, NULL);
	comp(id, true, "RDMA WRITE completion", &wc);
	memset(dst, 0xa5, len);
	if (rdma_post_read(id, NULL, dst, len, dmr, 0, raddr, le32toh(m.read_rkey)))
		die(21, "rdma_post_read", errno, NULL);
	comp(id, true, "RDMA READ completion", &wc);
	bad = pattern_mismatch(dst, len / 2, 1);
	if (bad == len / 2)
		bad = len / 2 + pattern_mismatch(dst + len / 2, len / 2, 2);
	report("rw write=ok read=%s bad=%zu", bad == len ? "ok" : "bad", bad);

	/* a WRITE through the read-only MR's rkey: the responder refuses it */
	pattern(src, 4096, 3);
	if (rdma_post_write(id, NULL, src, 4096, dmr, 0, raddr + len / 2, le32toh(m.read_rkey)))
		die(22, "rdma_post_write", errno, NULL);
	do
		r = rdma_get_send_comp(id, &wc);
	while (r == 0);
	if (r < 0)
		die(8, "rdma_get_send_comp", errno, NULL);
	report("denied status=%s", ibv_wc_status_str(wc.status));
	/* returns when the target disconnects too, after it checked its bytes */
	rdma_disconnect(id);
	dereg(dmr);
	dereg(mmr);
	report("deregistered");
	wait_go();
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	return 0;
}

/* ---------------------------------------------------------------- drive */

/*
 * Commands, one a line: "msgs|read|write OFFSET LENGTH" (in the segment)
 * answers "ok mr=N ..." (as reg() reports) or "err errno=NAME msg=...";
 * "dereg N" answers "ok" or "err ..."; "quit" ends.
 */
static int run_drive(const char *addr)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct ibv_mr *mrs[64] = { 0 };
	struct rdma_cm_id *id;
	size_t seglen;
	uint8_t *seg;
	char line[128];
	int rc = 0;

	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1)
		die(2, "address", EINVAL, addr);
	/* a synchronous id; resolving the address binds it to the device */
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
		die(23, "rdma_create_id", errno, NULL);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000) || !id->verbs)
		die(24, "rdma_resolve_addr", errno, NULL);
	id->pd = ibv_alloc_pd(id->verbs);
	if (!id->pd)
		die(25, "ibv_alloc_pd", errno, NULL);
	seg = segment(1 << 20, &seglen);
	report("ready base=%p length=%zu device=%s pd_handle=%" PRIu32, seg, seglen,
	       ibv_get_device_name(id->verbs->device), id->pd->handle);
	while (fgets(line, sizeof(line), stdin)) {
		struct ibv_mr *(*fn)(struct rdma_cm_id *, void *, size_t) = NULL;
		char cmd[16];
		size_t off, len;
		unsigned n;

		if (sscanf(line, "%15s %zu %zu", cmd, &off, &len) == 3) {
			fn = !strcmp(cmd, "msgs") ? odpd_reg_msgs : !strcmp(cmd, "read") ? odpd_reg_read :
			     !strcmp(cmd, "write") ? odpd_reg_write : NULL;
			for (n = 0; n < 64 && mrs[n]; n++)
				;
			if (!fn || n == 64 || off > seglen) {
				report("err errno=EINVAL msg=bad command");
				continue;
			}
			errno = 0;
			mrs[n] = fn(id, seg + off, len);
			if (!mrs[n]) {
				report("err errno=%s msg=%s", ename(errno), odpd_errmsg());
				continue;
			}
			report("ok mr=%u want_addr=%p want_length=%zu addr=%p length=%zu lkey=%" PRIu32
			       " rkey=%" PRIu32 " pd=%d ctx=%d", n, seg + off, len, mrs[n]->addr,
			       mrs[n]->length, mrs[n]->lkey, mrs[n]->rkey, mrs[n]->pd == id->pd,
			       mrs[n]->context == id->verbs);
		} else if (sscanf(line, "dereg %u", &n) == 1 && n < 64 && mrs[n]) {
			if (odpd_dereg_mr(mrs[n]) < 0) {
				report("err errno=%s msg=%s", ename(errno), odpd_errmsg());
				continue;
			}
			mrs[n] = NULL;
			report("ok");
		} else if (!strcmp(line, "quit\n")) {
			break;
		} else {
			report("err errno=EINVAL msg=bad command");
		}
	}
	for (unsigned n = 0; n < 64; n++)
		if (mrs[n] && odpd_dereg_mr(mrs[n]) < 0)
			rc = 26;
	if (ibv_dealloc_pd(id->pd)) {
		fprintf(stderr, "%s: ibv_dealloc_pd: %s\n", prog, strerror(errno));
		rc = 27;
	}
	id->pd = NULL;
	rdma_destroy_id(id);
	return rc;
}

int main(int argc, char **argv)
{
	alarm(120);
	if (argc == 4 && !strcmp(argv[1], "client"))
		return run_client(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "server"))
		return run_server(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "target"))
		return run_target(argv[2], argv[3], strtoul(argv[4], NULL, 0));
	if (argc == 4 && !strcmp(argv[1], "initiator"))
		return run_initiator(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "drive"))
		return run_drive(argv[2]);
	fprintf(stderr, "usage: %s client|server ADDR PORT | target ADDR PORT LEN | "
		"initiator ADDR PORT | drive ADDR\n", prog);
	return 2;
}
