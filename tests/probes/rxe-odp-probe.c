// rxe-odp-probe: measure Soft-RoCE (rdma_rxe) ODP behaviour on the running kernel.
//
// One process, one device: a loopback RC QP pair connected by the port's IPv4-mapped
// RoCE v2 GID, memfd-backed buffers (a pinned local MR as source / sink, ODP MRs with
// iova = addr as RDMA targets). Prints one line per check:
//     CHECK name: PASS|FAIL|SKIP detail
// plus INFO lines. Exit status 0 when no check failed, 1 otherwise, 2 on a setup error.
//
// Usage: rxe-odp-probe [--dev NAME] [--dangerous STEP[,STEP...]]
//   --dev NAME        device (default $ODPD_VM_RXE, else the first device)
//   --dangerous STEP  run ONLY the named steps, which have crashed kernels; run each in its
//                     own VM boot (tests/vm/rxe-vm exits 125 on an oops):
//       iova-write     RDMA WRITE into an ODP MR whose iova != addr (iova below addr; the MR
//                      is one memfd mapped twice: addr one view, iova the other)
//       iova-read      RDMA READ from an ODP MR whose iova != addr
//       iova-advise    ibv_advise_mr on an ODP MR whose iova != addr (sge.addr = iova, = addr)
//       iova-write-above, iova-read-above, iova-advise-above: the same with iova above addr
//       iova-write-shift, iova-read-shift, iova-advise-shift: one view, iova = addr + 1 MiB
//       advise-pinned  ibv_advise_mr on a pinned (non-ODP) MR: each advice with FLUSH, then
//                      without
//       advise-pinned-async  the same without FLUSH only
// Without --dangerous it runs the safe checks: odp_caps, ODP data placement at the port's
// active MTU and at IBV_MTU_1024 (pinned MRs as control), ibv_advise_mr on an ODP MR, the
// registration of an ODP MR with iova != addr, and per-MR ODP statistics (rdma(8) tool).
//
// In the test VM: tests/vm/rxe-vm [--profile stock|testbed] -- build/tests/probes/rxe-odp-probe
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define PAGE 4096u
#define SLOT_PAGES 8u                  // each data check gets its own 8-page slot
#define SLOT (SLOT_PAGES * PAGE)
#define NSLOTS 96u
#define LBUF_SIZE (64u * 1024)
#define BG 0xee                         // background of target slots
#define SINK 0xdd                       // local sink before an RDMA READ
#define SHIFT (1u << 20)                // iova - addr of the -shift steps

static int failures;

__attribute__((format(printf, 3, 4)))
static void check(const char *name, const char *result, const char *fmt, ...)
{
	va_list ap;
	if (!strcmp(result, "FAIL"))
		failures++;
	printf("CHECK %s: %s ", name, result);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *errname(int e)
{
	switch (e) {
	case 0: return "0";
	case EINVAL: return "EINVAL";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EFAULT: return "EFAULT";
	case ENOENT: return "ENOENT";
	case EPERM: return "EPERM";
	case ENOMEM: return "ENOMEM";
	case EACCES: return "EACCES";
	case ENOSYS: return "ENOSYS";
	default: return strerror(e);
	}
}

// ------------------------------------------------------------------ memory
// A memfd of len bytes mapped `views` times (MAP_SHARED); returns the first view.
static char *memfd_views(const char *name, size_t len, int views, char **second)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len)) {
		perror("memfd");
		exit(2);
	}
	char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	char *b = views > 1 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
	if (a == MAP_FAILED || b == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	close(fd);
	if (second)
		*second = b;
	return a;
}

// Pattern: 32-bit little-endian words, unique within one tag, so any chunk of it can be
// found again with memmem (and no run of it equals the BG or SINK background).
static void fill_pattern(char *p, size_t len, uint32_t tag)
{
	for (size_t i = 0; i + 4 <= len; i += 4) {
		uint32_t w = 0x80000000u | (tag & 0x7ffu) << 20 | (uint32_t)(i / 4 & 0xfffffu);
		memcpy(p + i, &w, 4);
	}
}

// "p1+1000": page index and in-page offset of a slot offset
static const char *where(char *buf, size_t n, long off)
{
	if (off < 0)
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "p%ld+%ld", off / (long)PAGE, off % (long)PAGE);
	return buf;
}

// For each chunk (chunk bytes, the path MTU) of want[0..len), where in hay[0..haylen) it is
// found: "c0@p1+0 c1@- ..." appended to out.
static void locate_chunks(char *out, size_t outsz, const char *hay, size_t haylen,
			  const char *want, size_t len, size_t chunk)
{
	size_t used = strlen(out);
	for (size_t c = 0; c * chunk < len && used + 32 < outsz; c++) {
		size_t n = len - c * chunk < chunk ? len - c * chunk : chunk;
		const char *f = memmem(hay, haylen, want + c * chunk, n);
		char w[32];
		used += (size_t)snprintf(out + used, outsz - used, " c%zu@%s", c,
					 where(w, sizeof w, f ? (long)(f - hay) : -1));
	}
}

// ------------------------------------------------------------------ device, QPs
struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t port;
	int gidx;
	union ibv_gid gid;
	enum ibv_mtu active_mtu;
	char *lbuf;            // local source / sink (memfd, pinned MR)
	struct ibv_mr *lmr;
};

struct pair {
	struct dev *d;
	enum ibv_mtu mtu;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;  // a posts, b is the responder
	bool broken;
};

static int mtu_bytes(enum ibv_mtu m)
{
	return 256 << ((int)m - 1);
}

static int qp_connect(struct pair *P, struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = P->d->port,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (r)
		return r;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = P->mtu;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = P->d->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)P->d->gidx;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = P->d->port;
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void pair_close(struct pair *P)
{
	if (P->a)
		ibv_destroy_qp(P->a);
	if (P->b)
		ibv_destroy_qp(P->b);
	if (P->cq)
		ibv_destroy_cq(P->cq);
	P->a = P->b = NULL;
	P->cq = NULL;
}

static int pair_open(struct pair *P)
{
	struct ibv_qp_init_attr qi = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	int r;
	P->cq = ibv_create_cq(P->d->ctx, 16, NULL, NULL, 0);
	if (!P->cq)
		return errno;
	qi.send_cq = qi.recv_cq = P->cq;
	P->a = ibv_create_qp(P->d->pd, &qi);
	P->b = ibv_create_qp(P->d->pd, &qi);
	if (!P->a || !P->b)
		return errno;
	if ((r = qp_connect(P, P->a, P->b->qp_num)) || (r = qp_connect(P, P->b, P->a->qp_num)))
		return r;
	P->broken = false;
	return 0;
}

// One signalled RDMA op from the local buffer (offset loff) to raddr/rkey.
// 0, a positive ibv_wc_status, or a negative errno. A failed op leaves the pair broken;
// the next op rebuilds it.
static int rdma_op(struct pair *P, enum ibv_wr_opcode op, size_t loff, size_t len,
		   uint64_t raddr, uint32_t rkey)
{
	if (P->broken) {
		pair_close(P);
		int r = pair_open(P);
		if (r) {
			fprintf(stderr, "rebuilding the QP pair: %s\n", strerror(r));
			return -r;
		}
	}
	struct ibv_sge sge = { .addr = (uintptr_t)P->d->lbuf + loff, .length = (uint32_t)len,
			       .lkey = P->d->lmr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	int r = ibv_post_send(P->a, &wr, &bad);
	if (r) {
		P->broken = true;
		return -r;
	}
	struct ibv_wc wc;
	double deadline = now_s() + 20;
	int n;
	while ((n = ibv_poll_cq(P->cq, 1, &wc)) == 0) {
		if (now_s() > deadline) {
			P->broken = true;
			return -ETIMEDOUT;
		}
		sched_yield();
	}
	if (n < 0) {
		P->broken = true;
		return -EIO;
	}
	if (wc.status != IBV_WC_SUCCESS) {
		P->broken = true;
		return (int)wc.status;
	}
	return 0;
}

static const char *op_err(int r, char *buf, size_t n)
{
	if (r < 0)
		snprintf(buf, n, "post/poll: %s", strerror(-r));
	else
		snprintf(buf, n, "completion %s", ibv_wc_status_str((enum ibv_wc_status)r));
	return buf;
}

// ------------------------------------------------------------------ data checks
// An MR target: slots of SLOT bytes at base (addressed remotely at rbase with rkey).
struct target {
	const char *kind;      // "odp", "pinned"
	char *base;            // the process's view of slot 0
	uint64_t rbase;        // remote address of slot 0 (iova)
	uint32_t rkey;
	unsigned next;         // next free slot
};

static char *next_slot(struct target *T, unsigned *idx)
{
	if (T->next >= NSLOTS) {
		fprintf(stderr, "out of slots\n");
		exit(2);
	}
	*idx = T->next++;
	return T->base + (size_t)*idx * SLOT;
}

// RDMA WRITE len bytes at slot offset off; fresh: leave the slot's pages untouched before.
static void data_write(struct pair *P, struct target *T, const char *name, size_t off,
		       size_t len, bool fresh)
{
	unsigned idx;
	char *slot = next_slot(T, &idx), *img = malloc(SLOT), detail[1024], w[32], e[64];
	uint8_t bg = fresh ? 0 : BG;
	if (!fresh)
		memset(slot, BG, SLOT);
	memset(img, bg, SLOT);
	fill_pattern(P->d->lbuf, len, 100 + idx);
	memcpy(img + off, P->d->lbuf, len);
	int r = rdma_op(P, IBV_WR_RDMA_WRITE, 0, len, T->rbase + (uint64_t)idx * SLOT + off, T->rkey);
	if (r) {
		check(name, "FAIL", "%zu B at %s: %s", len, where(w, sizeof w, (long)off), op_err(r, e, sizeof e));
		free(img);
		return;
	}
	size_t diff = 0, first = SLOT, last = 0;
	for (size_t i = 0; i < SLOT; i++)
		if (slot[i] != img[i]) {
			diff++;
			if (first == SLOT)
				first = i;
			last = i;
		}
	if (!diff) {
		check(name, "PASS", "%s %zu B written at %s (%s pages) landed there, nothing else changed",
		      T->kind, len, where(w, sizeof w, (long)off), fresh ? "untouched" : "resident");
	} else {
		char w2[32], w3[32];
		snprintf(detail, sizeof detail, "%s %zu B written at %s (%s pages): %zu bytes of the slot"
			 " differ from the expected image (%s..%s); each %d B chunk found at:",
			 T->kind, len, where(w, sizeof w, (long)off), fresh ? "untouched" : "resident", diff,
			 where(w2, sizeof w2, (long)first), where(w3, sizeof w3, (long)last),
			 mtu_bytes(P->mtu));
		locate_chunks(detail, sizeof detail, slot, SLOT, P->d->lbuf, len, (size_t)mtu_bytes(P->mtu));
		check(name, "FAIL", "%s", detail);
	}
	free(img);
}

// RDMA READ len bytes from slot offset off (slot filled with a unique pattern).
static void data_read(struct pair *P, struct target *T, const char *name, size_t off, size_t len)
{
	unsigned idx;
	char *slot = next_slot(T, &idx), detail[1024], w[32], e[64];
	fill_pattern(slot, SLOT, 200 + idx);
	memset(P->d->lbuf, SINK, len);
	int r = rdma_op(P, IBV_WR_RDMA_READ, 0, len, T->rbase + (uint64_t)idx * SLOT + off, T->rkey);
	if (r) {
		check(name, "FAIL", "%zu B from %s: %s", len, where(w, sizeof w, (long)off), op_err(r, e, sizeof e));
		return;
	}
	if (!memcmp(P->d->lbuf, slot + off, len)) {
		check(name, "PASS", "%s %zu B read from %s came from there", T->kind, len,
		      where(w, sizeof w, (long)off));
		return;
	}
	size_t diff = 0;
	for (size_t i = 0; i < len; i++)
		diff += P->d->lbuf[i] != slot[off + i];
	snprintf(detail, sizeof detail, "%s %zu B read from %s: %zu bytes differ; each %d B chunk"
		 " read came from:", T->kind, len, where(w, sizeof w, (long)off), diff, mtu_bytes(P->mtu));
	locate_chunks(detail, sizeof detail, slot, SLOT, P->d->lbuf, len, (size_t)mtu_bytes(P->mtu));
	check(name, "FAIL", "%s", detail);
}

static void data_checks(struct pair *P, struct target *T)
{
	char n[96];
	const char *k = T->kind;
	int m = mtu_bytes(P->mtu);
#define NAME(what) (snprintf(n, sizeof n, "%s_%s@mtu%d", k, what, m), n)
	data_write(P, T, NAME("write_offset"), PAGE + 1000, 100, false);
	data_write(P, T, NAME("write_offset_fresh"), PAGE + 1000, 100, true);
	data_read(P, T, NAME("read_offset"), PAGE + 1000, 100);
	data_write(P, T, NAME("write_page"), PAGE, PAGE, false);
	data_read(P, T, NAME("read_page"), PAGE, PAGE);
	data_write(P, T, NAME("write_4pages"), PAGE, 4 * PAGE, false);
	data_write(P, T, NAME("write_4pages_fresh"), PAGE, 4 * PAGE, true);
	data_read(P, T, NAME("read_4pages"), PAGE, 4 * PAGE);
	data_write(P, T, NAME("write_span"), PAGE + 1000, 6000, false);
	data_read(P, T, NAME("read_span"), PAGE + 1000, 6000);
#undef NAME
}

// ------------------------------------------------------------------ advise_mr
static const struct { enum ibv_advise_mr_advice a; const char *n; } advices[] = {
	{ IBV_ADVISE_MR_ADVICE_PREFETCH, "prefetch" },
	{ IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, "prefetch_write" },
	{ IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, "prefetch_no_fault" },
};

static void advise_odp(struct pair *P, struct target *T, struct ibv_mr *mr)
{
	int ok_write = -1;
	for (size_t i = 0; i < sizeof advices / sizeof advices[0]; i++)
		for (int fl = 0; fl < 2; fl++) {
			unsigned idx;
			char *slot = next_slot(T, &idx), name[64];
			(void)slot;   // untouched: the advice has pages to fault in
			struct ibv_sge sg = { .addr = T->rbase + (uint64_t)idx * SLOT, .length = SLOT,
					      .lkey = mr->lkey };
			uint32_t flags = fl ? IBV_ADVISE_MR_FLAG_FLUSH : 0;
			snprintf(name, sizeof name, "advise_odp_%s%s", advices[i].n, fl ? "_flush" : "");
			int r = ibv_advise_mr(P->d->pd, advices[i].a, flags, &sg, 1);
			if (!r)
				check(name, "PASS", "ibv_advise_mr on an ODP MR (%u B, untouched pages) returned 0", SLOT);
			else if (r == EOPNOTSUPP)
				check(name, "SKIP", "EOPNOTSUPP: this rdma-core's rxe provider has no advise_mr");
			else
				check(name, "FAIL", "returned %d (%s)", r, errname(r));
			if (advices[i].a == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE && fl)
				ok_write = r;
		}
	if (ok_write) {
		check("advise_odp_then_write", "SKIP", "prefetch_write_flush did not return 0");
		return;
	}
	// the slot of prefetch_write_flush is T->next - 3; write one whole page there, verify
	unsigned idx = T->next - 3;
	char *slot = T->base + (size_t)idx * SLOT, w[32], e[64];
	fill_pattern(P->d->lbuf, PAGE, 300);
	int r = rdma_op(P, IBV_WR_RDMA_WRITE, 0, PAGE, T->rbase + (uint64_t)idx * SLOT + 2 * PAGE, T->rkey);
	if (r)
		check("advise_odp_then_write", "FAIL", "%s", op_err(r, e, sizeof e));
	else if (memcmp(slot + 2 * PAGE, P->d->lbuf, PAGE))
		check("advise_odp_then_write", "FAIL", "4096 B at %s after prefetch_write_flush: data not there",
		      where(w, sizeof w, 2 * PAGE));
	else
		check("advise_odp_then_write", "PASS", "4096 B at %s of a prefetched range landed there",
		      where(w, sizeof w, 2 * PAGE));
}

// ------------------------------------------------------------------ statistics
static bool run_show(const char *cmd, bool *odp_fields)
{
	char line[1024];
	bool any = false;
	FILE *f = popen(cmd, "r");
	if (!f) {
		printf("INFO $ %s: popen: %s\n", cmd, strerror(errno));
		return false;
	}
	printf("INFO $ %s\n", cmd);
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		printf("INFO   %s\n", line);
		any = true;
		// mlx5's per-MR ODP counters are page_faults, page_invalidations, page_prefetch
		if (strstr(line, "page_") || strstr(line, "prefetch"))
			*odp_fields = true;
	}
	int st = pclose(f);
	printf("INFO   (exit status %d)\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	fflush(stdout);
	return any;
}

static void stats_check(struct dev *d, struct ibv_mr *odp_mr)
{
	static const char *const cmds[] = {
		"rdma statistic show mr 2>&1",
		"rdma statistic mr show 2>&1",
		"rdma -d statistic show mr 2>&1",
		"rdma -j -p statistic show mr 2>&1",
		"rdma -d resource show mr 2>&1",
		"rdma -dd -j -p resource show mr 2>&1",
		"rdma statistic show link %s/%u 2>&1",
		"rdma -V 2>&1",
	};
	bool odp = false;
	char cmd[256], dev[64];
	snprintf(dev, sizeof dev, "%s", ibv_get_device_name(d->ctx->device));
	printf("INFO ODP MR for the statistics: lkey 0x%x rkey 0x%x (after the data checks' traffic)\n",
	       odp_mr->lkey, odp_mr->rkey);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		bool o = false;
		if (strstr(cmds[i], "%s"))
			snprintf(cmd, sizeof cmd, "rdma statistic show link %s/%u 2>&1", dev, d->port);
		else
			snprintf(cmd, sizeof cmd, "%s", cmds[i]);
		run_show(cmd, &o);
		if (!strstr(cmd, "link") && !strstr(cmd, "-V"))
			odp |= o;
	}
	snprintf(cmd, sizeof cmd, "ls /sys/class/infiniband/%s/ports/%u/hw_counters/ 2>&1 | tr '\\n' ' '", dev, d->port);
	bool dummy = false;
	run_show(cmd, &dummy);
	check("odp_mr_stats", odp ? "PASS" : "FAIL", "%s", odp ?
	      "rdma(8) shows per-MR ODP fields (see the INFO lines)" :
	      "no per-MR ODP statistics: neither 'rdma statistic show mr' nor 'rdma -dd resource show mr'"
	      " shows page-fault/invalidation/prefetch fields for the ODP MR (INFO lines)");
}

// ------------------------------------------------------------------ caps
static void caps_check(struct dev *d)
{
	struct ibv_device_attr_ex x;
	memset(&x, 0, sizeof x);
	int r = ibv_query_device_ex(d->ctx, NULL, &x);
	if (r) {
		check("odp_caps", "FAIL", "ibv_query_device_ex: %s", strerror(r));
		return;
	}
	static const char *const tb[] = { "SEND", "RECV", "WRITE", "READ", "ATOMIC", "SRQ_RECV",
					  "FLUSH", "ATOMIC_WRITE" };
	char s[4][128];
	uint32_t v[4] = { x.odp_caps.per_transport_caps.rc_odp_caps, x.odp_caps.per_transport_caps.uc_odp_caps,
			  x.odp_caps.per_transport_caps.ud_odp_caps, x.xrc_odp_caps };
	for (int t = 0; t < 4; t++) {
		size_t u = 0;
		s[t][0] = 0;
		for (int b = 0; b < 8; b++)
			if (v[t] & 1u << b)
				u += (size_t)snprintf(s[t] + u, sizeof s[t] - u, "%s%s", u ? "|" : "", tb[b]);
		if (!u)
			snprintf(s[t], sizeof s[t], "none");
	}
	uint64_t g = x.odp_caps.general_caps;
	check("odp_caps", g & IBV_ODP_SUPPORT ? "PASS" : "FAIL",
	      "general_caps=0x%" PRIx64 " (ODP_SUPPORT=%d IMPLICIT=%d) rc=0x%x (%s) uc=0x%x (%s) ud=0x%x (%s)"
	      " xrc=0x%x (%s) max_mr_size=0x%" PRIx64,
	      g, !!(g & IBV_ODP_SUPPORT), !!(g & IBV_ODP_SUPPORT_IMPLICIT), v[0], s[0], v[1], s[1],
	      v[2], s[2], v[3], s[3], x.orig_attr.max_mr_size);
}

// ------------------------------------------------------------------ setup
static void dev_open(struct dev *d, const char *want)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n), *dv = NULL;
	if (!list || !n) {
		fprintf(stderr, "rxe-odp-probe: no RDMA device\n");
		exit(2);
	}
	for (int i = 0; i < n; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			dv = dv ? dv : list[i];
	if (!dv) {
		fprintf(stderr, "rxe-odp-probe: no device %s\n", want);
		exit(2);
	}
	d->ctx = ibv_open_device(dv);
	ibv_free_device_list(list);
	if (!d->ctx || !(d->pd = ibv_alloc_pd(d->ctx))) {
		perror("open device / alloc pd");
		exit(2);
	}
	d->port = 1;
	struct ibv_port_attr pa;
	if (ibv_query_port(d->ctx, d->port, &pa)) {
		perror("ibv_query_port");
		exit(2);
	}
	d->active_mtu = pa.active_mtu;
	d->gidx = -1;
	for (int i = 0; i < pa.gid_tbl_len && d->gidx < 0; i++) {
		struct ibv_gid_entry ge;
		if (ibv_query_gid_ex(d->ctx, d->port, (uint32_t)i, &ge, 0))
			continue;
		const uint8_t *g = ge.gid.raw;
		static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
		if (ge.gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(g, v4mapped, 12)) {
			d->gidx = i;
			d->gid = ge.gid;
		}
	}
	if (d->gidx < 0) {
		fprintf(stderr, "rxe-odp-probe: no IPv4-mapped RoCE v2 GID on %s port %u\n",
			ibv_get_device_name(dv), d->port);
		exit(2);
	}
	d->lbuf = memfd_views("rxe-odp-probe-local", LBUF_SIZE, 1, NULL);
	d->lmr = ibv_reg_mr(d->pd, d->lbuf, LBUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!d->lmr) {
		perror("ibv_reg_mr (local buffer)");
		exit(2);
	}
	struct utsname u;
	uname(&u);
	const uint8_t *g = d->gid.raw;
	printf("INFO kernel %s %s; device %s port %u state %s active_mtu %d; gid[%d] ::ffff:%u.%u.%u.%u"
	       " (RoCE v2); rdma-core profile %s\n",
	       u.release, u.version, ibv_get_device_name(dv), d->port, ibv_port_state_str(pa.state),
	       mtu_bytes(pa.active_mtu), d->gidx, g[12], g[13], g[14], g[15],
	       getenv("ODPD_VM_PROFILE") ? getenv("ODPD_VM_PROFILE") : "?");
}

// An ODP MR over a fresh memfd of NSLOTS slots. iova_view: also map the memfd a second time
// and register with iova = that view's address (addr != iova), the lower of the two views
// (above: the higher one); shift != 0: iova = addr + shift (one view).
static struct ibv_mr *odp_mr(struct dev *d, struct target *T, bool iova_view, bool above,
			    size_t shift, char **second)
{
	size_t len = (size_t)NSLOTS * SLOT;
	char *b = NULL, *a = memfd_views("rxe-odp-probe-odp", len, iova_view && !shift ? 2 : 1, &b);
	if (iova_view && (above ? b < a : b > a)) {  // iova (b) below or above addr (a)
		char *t = a;
		a = b;
		b = t;
	}
	if (shift)  // iova = addr + shift, inside the MR's own range
		b = a + shift;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_ON_DEMAND;
	struct ibv_mr *mr = iova_view ? ibv_reg_mr_iova(d->pd, a, len, (uintptr_t)b, acc)
				      : ibv_reg_mr(d->pd, a, len, acc);
	memset(T, 0, sizeof *T);
	T->kind = "odp";
	T->base = a;
	T->rbase = iova_view ? (uintptr_t)b : (uintptr_t)a;
	T->rkey = mr ? mr->rkey : 0;
	if (second)
		*second = b;
	return mr;
}

// ------------------------------------------------------------------ dangerous steps
static void iova_step(struct dev *d, const char *step)
{
	struct target T;
	char *b;
	bool above = strstr(step, "-above") != NULL;
	size_t shift = strstr(step, "-shift") ? SHIFT : 0;
	const char *sfx = above ? "_above" : shift ? "_shift" : "";
	struct ibv_mr *mr = odp_mr(d, &T, true, above, shift, &b);
	if (!mr) {
		check(step, "FAIL", "ibv_reg_mr_iova(ON_DEMAND, iova != addr): %s", strerror(errno));
		return;
	}
	printf("INFO ODP MR addr=%p iova=%p (%s; iova - addr = %" PRId64 ")\n",
	       (void *)T.base, (void *)b, shift ? "one view, iova inside the MR's own range" :
	       "the same memfd mapped twice", (int64_t)((uintptr_t)b - (uintptr_t)T.base));
	struct pair P = { .d = d, .mtu = d->active_mtu };
	int r = pair_open(&P);
	if (r) {
		fprintf(stderr, "QP pair: %s\n", strerror(r));
		exit(2);
	}
	printf("INFO running %s now (a kernel oops ends the VM here)\n", step);
	fflush(stdout);
	char name[64];
	if (!strncmp(step, "iova-write", 10)) {
		// one whole, page-aligned page at the active MTU: placement defect 1 stays out of it
		snprintf(name, sizeof name, "odp_iova_write%s", sfx);
		data_write(&P, &T, name, PAGE, PAGE, false);
		// anywhere else in the memfd? (slot 0 is the one written)
		size_t len = (size_t)NSLOTS * SLOT;
		const char *f = memmem(T.base + SLOT, len - SLOT, d->lbuf, PAGE);
		printf("INFO the 4096 B written: %s elsewhere in the memfd%s\n", f ? "found" : "not found",
		       f ? "" : " (slots 1..)");
		if (f)
			printf("INFO   at memfd offset %zu\n", (size_t)(f - T.base));
	} else if (!strncmp(step, "iova-read", 9)) {
		snprintf(name, sizeof name, "odp_iova_read%s", sfx);
		size_t len = (size_t)NSLOTS * SLOT;
		fill_pattern(T.base, len, 7);   // slot 0 gets its own pattern in data_read
		data_read(&P, &T, name, PAGE, PAGE);
		const char *f = memmem(T.base, len, d->lbuf, PAGE);
		if (f)
			printf("INFO the 4096 B read came from memfd offset %zu\n", (size_t)(f - T.base));
		else
			printf("INFO the 4096 B read are nowhere in the memfd\n");
	} else {
		struct ibv_sge sg = { .addr = T.rbase, .length = SLOT, .lkey = mr->lkey };
		r = ibv_advise_mr(d->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sg, 1);
		snprintf(name, sizeof name, "odp_iova_advise_at_iova%s", sfx);
		check(name, r ? (r == EOPNOTSUPP ? "SKIP" : "FAIL") : "PASS",
		      "PREFETCH_WRITE|FLUSH with sge.addr = iova: %d (%s)", r, errname(r));
		sg.addr = (uintptr_t)T.base;
		r = ibv_advise_mr(d->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sg, 1);
		snprintf(name, sizeof name, "odp_iova_advise_at_addr%s", sfx);
		check(name, r ? (r == EOPNOTSUPP ? "SKIP" : "PASS") : "FAIL",
		      "PREFETCH_WRITE|FLUSH with sge.addr = addr (outside the MR's iova range): %d (%s)%s",
		      r, errname(r), r ? "" : ": accepted an address outside the MR");
	}
	pair_close(&P);
	ibv_dereg_mr(mr);
}

static void advise_pinned_step(struct dev *d, bool async_only)
{
	char *a = memfd_views("rxe-odp-probe-pinned", SLOT, 1, NULL);
	struct ibv_mr *mr = ibv_reg_mr(d->pd, a, SLOT, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr) {
		perror("ibv_reg_mr (pinned)");
		exit(2);
	}
	printf("INFO running advise-pinned%s now (a kernel oops ends the VM here)\n",
	       async_only ? "-async" : "");
	fflush(stdout);
	for (size_t i = 0; i < sizeof advices / sizeof advices[0]; i++)
		for (int fl = async_only ? 0 : 1; fl >= 0; fl--) {
			char name[64];
			struct ibv_sge sg = { .addr = (uintptr_t)a, .length = PAGE, .lkey = mr->lkey };
			snprintf(name, sizeof name, "advise_pinned_%s%s", advices[i].n, fl ? "_flush" : "");
			int r = ibv_advise_mr(d->pd, advices[i].a, fl ? IBV_ADVISE_MR_FLAG_FLUSH : 0, &sg, 1);
			// a pinned MR has nothing to prefetch: an error (or 0) is fine, an oops is not
			check(name, r == EOPNOTSUPP ? "SKIP" : "PASS", "ibv_advise_mr on a pinned MR returned %d (%s)%s",
			      r, errname(r), r == EOPNOTSUPP ? ": this rdma-core's rxe provider has no advise_mr" : "");
		}
	sleep(1);   // without FLUSH the kernel prefetches from a work queue: give it time to run
	ibv_dereg_mr(mr);
}

// ------------------------------------------------------------------ main
static void usage(void)
{
	fprintf(stderr, "usage: rxe-odp-probe [--dev NAME] [--dangerous STEP[,STEP...]]\n"
		"  STEP: iova-write iova-read iova-advise (-above: iova above addr, -shift: iova = addr +\n"
		"        1 MiB), advise-pinned, advise-pinned-async\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *want = getenv("ODPD_VM_RXE"), *dangerous = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dev") && i + 1 < argc)
			want = argv[++i];
		else if (!strcmp(argv[i], "--dangerous") && i + 1 < argc)
			dangerous = argv[++i];
		else
			usage();
	}
	if (want && !*want)
		want = NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct dev d;
	memset(&d, 0, sizeof d);
	dev_open(&d, want);

	if (dangerous) {
		char *list = strdup(dangerous), *save = NULL;
		for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
			if (!strcmp(s, "iova-write") || !strcmp(s, "iova-read") || !strcmp(s, "iova-advise") ||
			    !strcmp(s, "iova-write-above") || !strcmp(s, "iova-read-above") ||
			    !strcmp(s, "iova-advise-above") || !strcmp(s, "iova-write-shift") ||
			    !strcmp(s, "iova-read-shift") || !strcmp(s, "iova-advise-shift"))
				iova_step(&d, s);
			else if (!strcmp(s, "advise-pinned") || !strcmp(s, "advise-pinned-async"))
				advise_pinned_step(&d, !strcmp(s, "advise-pinned-async"));
			else
				usage();
		}
		free(list);
		printf("INFO done: %d failed\n", failures);
		return failures ? 1 : 0;
	}

	caps_check(&d);

	// ODP MR with iova != addr: registration only (RDMA into it: --dangerous iova-*)
	{
		struct target T;
		char *b;
		struct ibv_mr *mr = odp_mr(&d, &T, true, false, 0, &b);
		if (mr)
			check("odp_iova_reg", "PASS", "ibv_reg_mr_iova(ON_DEMAND) with iova (%p) != addr (%p)"
			      " registered (rkey 0x%x); RDMA into it: --dangerous iova-write / iova-read",
			      (void *)b, (void *)T.base, mr->rkey);
		else
			check("odp_iova_reg", "FAIL", "ibv_reg_mr_iova(ON_DEMAND) with iova != addr: %s",
			      strerror(errno));
		if (mr)
			ibv_dereg_mr(mr);
	}

	// data placement: pinned MR (control) and ODP MR, at the active MTU and at 1024
	char *pbuf = memfd_views("rxe-odp-probe-pinned", (size_t)NSLOTS * SLOT, 1, NULL);
	struct ibv_mr *pmr = ibv_reg_mr(d.pd, pbuf, (size_t)NSLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE |
					IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct target PT = { .kind = "pinned", .base = pbuf, .rbase = (uintptr_t)pbuf,
			     .rkey = pmr ? pmr->rkey : 0 };
	struct target OT;
	struct ibv_mr *omr = odp_mr(&d, &OT, false, false, 0, NULL);
	if (!pmr || !omr) {
		check("odp_reg", "FAIL", "pinned MR %s, ODP MR %s (errno %s)", pmr ? "ok" : "failed",
		      omr ? "ok" : "failed", strerror(errno));
		return 1;
	}
	enum ibv_mtu mtus[2] = { d.active_mtu, IBV_MTU_1024 };
	for (int i = 0; i < (d.active_mtu == IBV_MTU_1024 ? 1 : 2); i++) {
		struct pair P = { .d = &d, .mtu = mtus[i] };
		int r = pair_open(&P);
		if (r) {
			check("qp_connect", "FAIL", "mtu %d: %s", mtu_bytes(mtus[i]), strerror(r));
			continue;
		}
		printf("INFO loopback RC QP pair %u <-> %u, path_mtu %d%s\n", P.a->qp_num, P.b->qp_num,
		       mtu_bytes(P.mtu), P.mtu == d.active_mtu ? " (the port's active MTU)" : " (set explicitly)");
		data_checks(&P, &PT);
		data_checks(&P, &OT);
		if (i == 0)
			advise_odp(&P, &OT, omr);
		pair_close(&P);
	}
	stats_check(&d, omr);
	ibv_dereg_mr(omr);
	ibv_dereg_mr(pmr);
	ibv_dereg_mr(d.lmr);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
	printf("INFO done: %d failed\n", failures);
	return failures ? 1 : 0;
}
