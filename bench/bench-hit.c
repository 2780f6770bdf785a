/* SPDX-License-Identifier: MIT */
/*
 * bench-hit: a repeated registration, measured side by side in one process
 * (issue 11's benchmark, the cache part):
 *   local-hit       odpd_reg + odpd_dereg of a range an MR this process
 *                   holds covers: answered by libodpd, no system call;
 *   local-relaxed   odpd_reg + odpd_dereg_relaxed of the same range again
 *                   and again: the library keeps the MR and takes it back;
 *   daemon-hit      odpd_reg alone of a held range with the library's cache
 *                   off (ODPD_CACHE=0): one request answered on odpd's loop;
 *   miss            odpd_reg alone of a range no MR covers (cache off;
 *                   resident pages): one request, ibv_reg_mr on a worker;
 *   refusal         odpd_join_pd on a connection that has registered: a
 *                   request odpd refuses at once (EBUSY) on its loop, with no
 *                   cache work: the floor of any request through libodpd,
 *                   protobuf-c and odpd's event loop;
 *   rtt             a bare SOCK_SEQPACKET round trip (64 bytes) to another
 *                   process: what any request to a daemon costs at least;
 *   verbs           ibv_reg_mr alone, in-process, resident pages;
 *   ucx-hit         ucp_mem_map + ucp_mem_unmap again and again (UCX's
 *                   registration cache; Debian 12's libucx0) on rxe0;
 *   fabric-hit      fi_mr_reg + fi_close again and again (libfabric's MR
 *                   cache, verbs provider; Debian 12's libfabric1).
 * Fast cases run in batches and report per-operation times; every case
 * reports the median, p10 and p90 of its batches. Prints the ratios that
 * issue 11 sets targets for, met or not. A benchmark: never asserts on speed.
 *
 * bench-hit --socket PATH [--sizes 4096,1048576] [--rounds N] [--out DIR]
 * bench/run-hit runs it in the rxe VM and plots the CSV (bench/bench-hit.gp).
 */
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef HAVE_UCX
#include <ucp/api/ucp.h>
#endif
#ifdef HAVE_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#endif

#include "bench-util.h"

const char bench_name[] = "bench-hit";

#define LW IBV_ACCESS_LOCAL_WRITE
#define MAX_SIZES 8

static unsigned rounds = 31;          /* batches per case */

static struct series *report(struct series *s, size_t size, const char *how)
{
	summarize(s);
	printf("  %-14s %9zu B  median %10.3f us  p10 %10.3f  p90 %10.3f  (%s)\n",
	       s->name, size, s->median, s->p10, s->p90, how);
	return s;
}

/* One case at one size: per-operation µs of each batch. */
static struct series *run_case(const char *name, size_t size, unsigned batch,
			       void (*op)(void *arg), void *arg)
{
	struct series *s = series_new(rounds, "%s", name);
	char how[32];

	for (unsigned i = 0; i < batch; i++)     /* warm: the first is a miss */
		op(arg);
	for (unsigned r = 0; r < rounds; r++) {
		double t0 = now_us();

		for (unsigned i = 0; i < batch; i++)
			op(arg);
		add(s, (now_us() - t0) / batch);
	}
	snprintf(how, sizeof(how), "batches of %u", batch);
	return report(s, size, how);
}

/* One case at one size whose operation is timed alone: @one returns the µs
 * of its timed part (a release after it stays off the clock). */
static struct series *run_alone(const char *name, size_t size, const char *how,
				double (*one)(void *arg), void *arg)
{
	struct series *s = series_new(rounds * 4, "%s", name);

	for (unsigned r = 0; r < rounds * 4 + 4; r++) {
		double us = one(arg);

		if (r >= 4)                              /* warm: the first few */
			add(s, us);
	}
	return report(s, size, how);
}

/* ---------------------------------------------------------------- odpd */

struct odpd_op {
	struct odpd_conn *c;
	void *addr;
	size_t len;
};

static struct odpd_mr *reg(struct odpd_conn *c, void *addr, size_t len)
{
	struct odpd_mr *mr = odpd_reg(c, addr, len, LW);

	if (!mr)
		die("odpd_reg(%p, %zu): %s: %s", addr, len, strerror(errno), odpd_errmsg());
	return mr;
}

static void dereg(struct odpd_mr *mr, bool relaxed)
{
	if ((relaxed ? odpd_dereg_relaxed(mr) : odpd_dereg(mr)) < 0)
		die("odpd_dereg: %s: %s", strerror(errno), odpd_errmsg());
}

static void op_reg_dereg(void *arg)
{
	struct odpd_op *o = arg;

	dereg(reg(o->c, o->addr, o->len), false);
}

static void op_reg_relaxed(void *arg)
{
	struct odpd_op *o = arg;

	dereg(reg(o->c, o->addr, o->len), true);
}

/* odpd_reg alone; the release after it is off the clock. */
static double one_reg(void *arg)
{
	struct odpd_op *o = arg;
	double t0 = now_us(), t1;
	struct odpd_mr *mr = reg(o->c, o->addr, o->len);

	t1 = now_us();
	dereg(mr, false);
	return t1 - t0;
}

/* A request odpd refuses at once: joining a shared PD after registering. */
static void op_refusal(void *arg)
{
	struct odpd_op *o = arg;

	if (odpd_join_pd(o->c, "bench-hit") != -1 || errno != EBUSY)
		die("odpd_join_pd after a registration: expected EBUSY, got %s", strerror(errno));
}

/* ---------------------------------------------------------------- a bare round trip */

static int rtt_sock = -1;

static void op_rtt(void *arg)
{
	(void)arg;
	echo_rtt(rtt_sock);
}

/* ---------------------------------------------------------------- verbs */

struct verbs_op {
	struct verbs *v;
	void *addr;
	size_t len;
};

/* ibv_reg_mr alone, resident pages; ibv_dereg_mr is off the clock. */
static double one_verbs(void *arg)
{
	struct verbs_op *o = arg;
	double t[3];

	verbs_reg_dereg(o->v, o->addr, o->len, LW, t);
	return t[1] - t[0];
}

/* ---------------------------------------------------------------- UCX */

#ifdef HAVE_UCX
static ucp_context_h ucx;

static bool ucx_open(void)
{
	ucp_params_t p = { .field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA };
	ucp_config_t *cfg;
	char *info = NULL;
	size_t info_len = 0;
	FILE *f;
	bool on_rxe;

	setenv("UCX_NET_DEVICES", "rxe0:1", 0);
	if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
		return false;
	if (ucp_init(&p, cfg, &ucx) != UCS_OK) {
		ucp_config_release(cfg);
		return false;
	}
	ucp_config_release(cfg);
	/* registration reaches the rxe device only if UCX opened it */
	f = open_memstream(&info, &info_len);
	if (f) {
		ucp_context_print_info(ucx, f);
		fclose(f);
	}
	on_rxe = info && strstr(info, "rxe0");
	free(info);
	if (!on_rxe) {
		printf("  ucx: UCX did not open rxe0 (ucp_context_print_info): no UCX numbers\n");
		ucp_cleanup(ucx);
		return false;
	}
	return true;
}

struct ucx_op {
	void *addr;
	size_t len;
};

static void op_ucx(void *arg)
{
	struct ucx_op *o = arg;
	ucp_mem_map_params_t mp = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
		.address = o->addr,
		.length = o->len,
	};
	ucp_mem_h memh;

	if (ucp_mem_map(ucx, &mp, &memh) != UCS_OK)
		die("ucp_mem_map failed");
	if (ucp_mem_unmap(ucx, memh) != UCS_OK)
		die("ucp_mem_unmap failed");
}
#endif

/* ---------------------------------------------------------------- libfabric */

#ifdef HAVE_FABRIC
static struct fid_fabric *fabric;
static struct fid_domain *domain;

static bool fabric_open(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	int r;

	if (!hints)
		return false;
	hints->fabric_attr->prov_name = strdup("verbs");
	hints->ep_attr->type = FI_EP_MSG;
	hints->caps = FI_MSG | FI_RMA;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	fi_freeinfo(hints);
	if (r) {
		printf("  fabric: fi_getinfo(verbs): %s: no libfabric numbers\n", fi_strerror(-r));
		return false;
	}
	printf("  fabric: provider %s, domain %s\n", info->fabric_attr->prov_name, info->domain_attr->name);
	r = fi_fabric(info->fabric_attr, &fabric, NULL);
	if (!r)
		r = fi_domain(fabric, info, &domain, NULL);
	fi_freeinfo(info);
	if (r) {
		printf("  fabric: fi_fabric/fi_domain: %s: no libfabric numbers\n", fi_strerror(-r));
		return false;
	}
	return true;
}

struct fabric_op {
	void *addr;
	size_t len;
};

static void op_fabric(void *arg)
{
	struct fabric_op *o = arg;
	struct fid_mr *mr;
	int r = fi_mr_reg(domain, o->addr, o->len, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
			  0, 0, 0, &mr, NULL);

	if (r)
		die("fi_mr_reg: %s", fi_strerror(-r));
	fi_close(&mr->fid);
}
#endif

/* ---------------------------------------------------------------- main */

static void usage(void)
{
	printf("usage: bench-hit --socket PATH [--sizes N,N,...] [--rounds N] [--out DIR]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "out", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *sock = NULL, *out = "build/bench-results/hit";
	size_t sizes[MAX_SIZES] = { 4096, 1 << 20 };
	unsigned n_sizes = 2;
	struct verbs v;
	bool have_ucx = false, have_fabric = false;
	pid_t rtt_child;
	FILE *csv;
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'r': rounds = parse_n(optarg, 100000); break;
		case 'o': out = optarg; break;
		case 'z': n_sizes = parse_sizes(optarg, sizes, MAX_SIZES, 1024 * MiB); break;
		case 'h': usage(); return 0;
		default: usage(); return 2;
		}
	}
	if (!sock)
		die("--socket is required");
	print_command(argc, argv);
	printf("\n");
	rtt_sock = echo_start(&rtt_child);   /* before any verbs or odpd state exists */
	verbs_open(&v);
#ifdef HAVE_UCX
	have_ucx = ucx_open();
#else
	printf("  ucx: not built with UCX (libucx-dev): no UCX numbers\n");
#endif
#ifdef HAVE_FABRIC
	have_fabric = fabric_open();
#else
	printf("  fabric: not built with libfabric (libfabric-dev): no libfabric numbers\n");
#endif
	mkdir_p(out);
	csv = csv_open(out, "hit.csv", "case size median_us p10_us p90_us");

	for (unsigned i = 0; i < n_sizes; i++) {
		size_t len = sizes[i];
		struct odpd_conn *c = connect_odpd(sock), *c0;
		struct odpd_segment *seg = segment(c, 4 * len), *seg0;
		uint8_t *p = odpd_segment_addr(seg), *p0;
		struct odpd_mr *held, *held0;
		struct odpd_stats st;
		struct series *s[10] = { 0 };
		unsigned n = 0;
		double l_hit, l_rel, d_hit, refusal, miss, rtt, direct, u_hit = 0, f_hit = 0;
		void *plain = memfd_buffer(len);

		setenv("ODPD_CACHE", "0", 1);
		c0 = connect_odpd(sock);
		unsetenv("ODPD_CACHE");
		seg0 = segment(c0, 4 * len);
		p0 = odpd_segment_addr(seg0);
		printf("size %zu bytes:\n", len);
		if (odpd_stats(c, &st, sizeof(st)) < 0 || !st.hit_table)
			die("the library has no hit table: is odpd older than 1.3?");

		held = reg(c, p, len);
		s[n++] = run_case("local-hit", len, 1000, op_reg_dereg,
				  &(struct odpd_op){ c, p, len });
		l_hit = s[n - 1]->median;
		s[n++] = run_case("local-relaxed", len, 1000, op_reg_relaxed,
				  &(struct odpd_op){ c, p + len, len });
		l_rel = s[n - 1]->median;
		held0 = reg(c0, p0, len);
		s[n++] = run_alone("daemon-hit", len, "one request each", one_reg,
				   &(struct odpd_op){ c0, p0, len });
		d_hit = s[n - 1]->median;
		s[n++] = run_case("refusal", 0, 200, op_refusal, &(struct odpd_op){ c0, p0, len });
		refusal = s[n - 1]->median;
		s[n++] = run_alone("miss", len, "one request each", one_reg,
				   &(struct odpd_op){ c0, p0 + 2 * len, len });
		miss = s[n - 1]->median;
		s[n++] = run_case("rtt", 64, 200, op_rtt, NULL);
		rtt = s[n - 1]->median;
		s[n++] = run_alone("verbs", len, "ibv_reg_mr alone", one_verbs,
				   &(struct verbs_op){ &v, plain, len });
		direct = s[n - 1]->median;
#ifdef HAVE_UCX
		if (have_ucx) {
			s[n++] = run_case("ucx-hit", len, 1000, op_ucx, &(struct ucx_op){ plain, len });
			u_hit = s[n - 1]->median;
		}
#endif
#ifdef HAVE_FABRIC
		if (have_fabric) {
			s[n++] = run_case("fabric-hit", len, 1000, op_fabric, &(struct fabric_op){ plain, len });
			f_hit = s[n - 1]->median;
		}
#endif
		for (unsigned k = 0; k < n; k++)
			fprintf(csv, "%s %zu %.4f %.4f %.4f\n", s[k]->name, len, s[k]->median, s[k]->p10,
				s[k]->p90);
		if (odpd_stats(c, &st, sizeof(st)) < 0)
			die("odpd_stats: %s", strerror(errno));
		printf("  odpd_stats: local_hits %llu daemon_hits %llu misses %llu local_releases %llu "
		       "revoked %llu cached_mrs %llu\n", (unsigned long long)st.local_hits,
		       (unsigned long long)st.daemon_hits, (unsigned long long)st.misses,
		       (unsigned long long)st.local_releases, (unsigned long long)st.revoked,
		       (unsigned long long)st.cached_mrs);
		printf("ratios at %zu bytes (medians, this run):\n", len);
		if (f_hit > 0)
			print_ratio("local hit (reg+dereg) / libfabric MR-cache hit", l_hit, f_hit, 2.0, true);
		if (u_hit > 0)
			print_ratio("local hit (reg+dereg) / UCX ucp_mem_map rcache hit", l_hit, u_hit, 0, true);
		if (f_hit > 0)
			print_ratio("local relaxed reuse / libfabric MR-cache hit", l_rel, f_hit, 0, true);
		print_ratio("daemon hit (one request) / bare SEQPACKET round trip", d_hit, rtt, 1.2, true);
		print_ratio("miss (one request) / (ibv_reg_mr + 1.5 round trips)", miss, direct + 1.5 * rtt,
		      len <= 4096 ? 1.0 : 0, true);
		print_ratio("odpd refusal (no cache work) / bare SEQPACKET round trip", refusal, rtt, 0, false);
		print_ratio("daemon hit / odpd refusal", d_hit, refusal, 0, false);
		print_ratio("daemon hit / local hit", d_hit, l_hit, 0, false);
		print_ratio("miss / ibv_reg_mr", miss, direct, 0, false);
		dereg(held, false);
		dereg(held0, false);
		odpd_detach(seg);
		odpd_detach(seg0);
		odpd_disconnect(c);
		odpd_disconnect(c0);
		munmap(plain, len);
		for (unsigned k = 0; k < n; k++) {
			free(s[k]->us);
			free(s[k]);
		}
	}
	csv_close(csv, out, "hit.csv");
#ifdef HAVE_UCX
	if (have_ucx)
		ucp_cleanup(ucx);
#endif
#ifdef HAVE_FABRIC
	if (have_fabric) {
		fi_close(&domain->fid);
		fi_close(&fabric->fid);
	}
#endif
	child_stop(rtt_sock, rtt_child);
	verbs_close(&v);
	printf("bench-hit: csv in %s/hit.csv\n", out);
	return 0;
}
