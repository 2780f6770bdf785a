/* SPDX-License-Identifier: MIT */
/*
 * test-inject (VM, odpd built with -Dfault_injection=true: tests/check
 * --sanitize): failure injection in the way the reference D-Bus
 * implementation tests its out-of-memory paths. odpd's allocations, and
 * separately its fd- and process-creating calls, are counted (daemon/fault.h);
 * a scenario runs with the Nth of them made to fail, for N = 1, 2, ... until
 * a run completes with nothing injected: every injection point the scenario
 * reaches has then failed once. After each run:
 *   - the scenario's client got an answer to every call (a hang fails: 30 s);
 *   - odpd still runs, and once the client is gone holds no client, segment,
 *     MR or pinned byte, and no more fds, memfd or uverbs mappings, or kernel
 *     MRs than before the run;
 *   - a new client registers and deregisters memory.
 * odpd runs under ASan+LSan (tests/check --sanitize): an invalid access
 * kills it at once, a leak fails its exit status at the end.
 *
 * Scenarios: every request type through libodpd and the raw protocol (the
 * registry's batch, flush and verify paths included), device removal with
 * MRs held, and a D-Bus Flush() barrier. Each prints how many injection
 * points it covered, at how many call sites, and how the client saw them.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <infiniband/verbs.h>

#include "fault.h"
#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define MAX_SITES 4096

/* What the scenario's client saw, written by the child. */
struct outcome {
	unsigned refused;       /* calls that failed with an errno (not a lost connection) */
	unsigned disconnected;  /* calls that failed with ENOTCONN/ECONNRESET/EPIPE/EIO */
	int first_errno;
	char first_call[48];
};

static struct odpd_fault_control *ctl;
static char ctl_path[96];
static struct outcome *seen;
static char dev[64], netdev[64];

static void ctl_arm(unsigned kind, int64_t n)
{
	atomic_store(&ctl->kind, 0);
	atomic_store(&ctl->calls, 0);
	atomic_store(&ctl->injected, 0);
	ctl->site = 0;
	ctl->function[0] = 0;
	atomic_store(&ctl->countdown, n);
	atomic_store(&ctl->kind, kind);
}

static void ctl_disarm(void)
{
	atomic_store(&ctl->kind, 0);
}

/* Note a call's result in the child: true if it succeeded. */
static bool note(bool ok, const char *call)
{
	int e = errno;

	if (ok)
		return true;
	if (e == ENOTCONN || e == ECONNRESET || e == EPIPE || e == EIO)
		seen->disconnected++;
	else
		seen->refused++;
	if (!seen->first_errno) {
		seen->first_errno = e;
		snprintf(seen->first_call, sizeof(seen->first_call), "%s", call);
	}
	return false;
}

/* ------------------------------------------------------------ scenarios */

/* Every request type a client sends, through libodpd: Hello and the hit
 * table, alloc and attach, pinned, remote-access and ODP registration, hits,
 * query and stats, verify, prefetch, relaxed release and flush, implicit ODP
 * (the registrar), a shared PD left by its last member, import. */
static void scenario_requests(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL), *c2;
	struct odpd_segment *s1 = NULL, *s2 = NULL, *s3;
	struct odpd_mr *m1, *m2, *m3, *m4, *m5;
	struct odpd_device_attr attr;
	struct odpd_stats st;
	uint32_t crc;
	void *addr = MAP_FAILED;
	int fd;

	if (!note(c != NULL, "odpd_connect"))
		return;
	if (note((s1 = odpd_alloc(c, MIB, 0)) != NULL, "odpd_alloc"))
		memset(odpd_segment_addr(s1), 0x5a, MIB);
	fd = memfd_create("inject", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd >= 0 && ftruncate(fd, (off_t)MIB) == 0 &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
		addr = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr != MAP_FAILED) {
		memset(addr, 0xa5, MIB);
		note((s2 = odpd_attach(c, fd, addr, MIB)) != NULL, "odpd_attach");
	}
	if (fd >= 0)
		close(fd);
	note(odpd_query_device(c, 0, &attr, sizeof(attr)) == 0, "odpd_query_device");
	if (s1) {
		char *a = odpd_segment_addr(s1);

		m1 = odpd_reg(c, a, 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
		note(m1 != NULL, "odpd_reg");
		m2 = odpd_reg(c, a, 64 * KIB, IBV_ACCESS_LOCAL_WRITE);     /* a hit */
		note(m2 != NULL, "odpd_reg (hit)");
		if (m1)
			note(odpd_verify(m1, a, 64 * KIB, &crc) == 0, "odpd_verify");
		if (m1)
			note(odpd_dereg_relaxed(m1) == 0, "odpd_dereg_relaxed");
		if (m2)
			note(odpd_dereg_relaxed(m2) == 0, "odpd_dereg_relaxed");
		note(odpd_flush_relaxed(c) == 0, "odpd_flush_relaxed");
		m4 = odpd_reg(c, a + 256 * KIB, 64 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		if (note(m4 != NULL, "odpd_reg (ODP)")) {
			struct ibv_sge sge = { .addr = (uintptr_t)(a + 256 * KIB), .length = 4096,
					       .lkey = m4->lkey };
			int r = odpd_advise_mr(c, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
					       IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
			note(r == 0 || errno == EOPNOTSUPP, "odpd_advise_mr");
			note(odpd_dereg(m4) == 0, "odpd_dereg (ODP)");
		}
	}
	if (s2) {
		m3 = odpd_reg(c, addr, 128 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_WRITE);
		if (note(m3 != NULL, "odpd_reg (remote)")) {
			note(odpd_verify(m3, NULL, 0, &crc) == 0, "odpd_verify (remote)");
			note(odpd_dereg(m3) == 0, "odpd_dereg");
		}
	}
	/* implicit ODP: the registrar (rxe refuses it at the kernel) */
	m5 = odpd_reg(c, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	if (m5)
		odpd_dereg(m5);
	note(odpd_stats(c, &st, sizeof(st)) == 0, "odpd_stats");
	if (test_profile_testbed()) {
		struct ibv_pd *pd = odpd_import_pd(c);

		note(pd != NULL, "odpd_import_pd");
	}
	/* a shared PD whose only member registers, releases relaxed and leaves */
	c2 = odpd_connect(sock, NULL);
	if (note(c2 != NULL, "odpd_connect (2)")) {
		if (note(odpd_join_pd(c2, "inject") == 0, "odpd_join_pd") &&
		    note((s3 = odpd_alloc(c2, 256 * KIB, 0)) != NULL, "odpd_alloc (2)")) {
			struct odpd_mr *m = odpd_reg(c2, odpd_segment_addr(s3), 256 * KIB,
						     IBV_ACCESS_LOCAL_WRITE);
			if (note(m != NULL, "odpd_reg (shared PD)"))
				note(odpd_dereg_relaxed(m) == 0, "odpd_dereg_relaxed (shared PD)");
		}
		odpd_disconnect(c2);
	}
	if (s2)
		note(odpd_detach(s2) == 0, "odpd_detach");
	odpd_disconnect(c);
	if (addr != MAP_FAILED)
		munmap(addr, MIB);
}

/* One raw request on @fd; its reply (NULL after noting a failure). */
static Odpd__Reply *raw_ask(int fd, Odpd__Request *req, const char *what)
{
	static uint64_t id;
	uint8_t buf[ODPD_MAX_PACKET + 1];
	struct odpd_packet pkt;
	Odpd__Reply *r;
	int n;

	req->has_id = 1;
	req->id = ++id;
	n = odpd_wire_send(fd, &req->base, NULL, 0, 0);
	if (n == 0)
		n = odpd_wire_recv(fd, buf, sizeof(buf), &pkt, 0);
	if (n == 0 && pkt.eof)
		n = -ENOTCONN;
	if (n < 0) {
		errno = -n;
		note(false, what);
		return NULL;
	}
	odpd_packet_close_fds(&pkt);
	r = odpd__reply__unpack(NULL, pkt.len, buf);
	if (!r) {
		errno = EBADMSG;
		note(false, what);
	} else if (r->status) {
		errno = r->status;
		note(false, what);
	}
	return r;
}

/* Admin requests over the raw protocol: Hello, Status, ListMrs, Verify of
 * a client's MR, Flush of every PD, Reload; with a client that holds a live
 * MR and a relaxed one. */
static void scenario_admin(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL);
	struct odpd_segment *s;
	struct odpd_mr *m;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello hello = ODPD__HELLO__INIT;
	Odpd__Status status = ODPD__STATUS__INIT;
	Odpd__ListMrs list = ODPD__LIST_MRS__INIT;
	Odpd__AdminVerify verify = ODPD__ADMIN_VERIFY__INIT;
	Odpd__Flush flush = ODPD__FLUSH__INIT;
	Odpd__Reload reload = ODPD__RELOAD__INIT;
	Odpd__Reply *r;
	int fd;

	if (!note(c != NULL, "odpd_connect"))
		return;
	if (note((s = odpd_alloc(c, 512 * KIB, 0)) != NULL, "odpd_alloc")) {
		char *a = odpd_segment_addr(s);

		note(odpd_reg(c, a, 256 * KIB, IBV_ACCESS_LOCAL_WRITE) != NULL, "odpd_reg");
		if (note((m = odpd_reg(c, a + 256 * KIB, 256 * KIB, IBV_ACCESS_LOCAL_WRITE)) != NULL,
			 "odpd_reg"))
			note(odpd_dereg_relaxed(m) == 0, "odpd_dereg_relaxed");
	}
	fd = odpd_wire_connect(sock);
	if (fd < 0) {
		errno = -fd;
		note(false, "connect (admin)");
		odpd_disconnect(c);
		return;
	}
	hello.has_version = 1;
	hello.version = ODPD_PROTOCOL_VERSION;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	if ((r = raw_ask(fd, &req, "Hello (admin)")) != NULL && r->status == 0) {
		odpd__reply__free_unpacked(r, NULL);
		req.body_case = ODPD__REQUEST__BODY_STATUS;
		req.status = &status;
		if ((r = raw_ask(fd, &req, "Status")) != NULL)
			odpd__reply__free_unpacked(r, NULL);
		req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
		req.list_mrs = &list;
		if ((r = raw_ask(fd, &req, "ListMrs")) != NULL) {
			if (r->body_case == ODPD__REPLY__BODY_MRS && r->mrs->n_mrs > 0) {
				verify.has_mr_id = 1;
				verify.mr_id = r->mrs->mrs[0]->id;
			}
			odpd__reply__free_unpacked(r, NULL);
		}
		if (verify.has_mr_id) {
			req.body_case = ODPD__REQUEST__BODY_ADMIN_VERIFY;
			req.admin_verify = &verify;
			if ((r = raw_ask(fd, &req, "AdminVerify")) != NULL)
				odpd__reply__free_unpacked(r, NULL);
		}
		flush.has_all = 1;
		flush.all = 1;
		req.body_case = ODPD__REQUEST__BODY_FLUSH;
		req.flush = &flush;
		if ((r = raw_ask(fd, &req, "Flush (all)")) != NULL)
			odpd__reply__free_unpacked(r, NULL);
		req.body_case = ODPD__REQUEST__BODY_RELOAD;
		req.reload = &reload;
		if ((r = raw_ask(fd, &req, "Reload")) != NULL)
			odpd__reply__free_unpacked(r, NULL);
	} else if (r) {
		odpd__reply__free_unpacked(r, NULL);
	}
	close(fd);
	odpd_disconnect(c);
}

/* Device removal with MRs held (pinned, ODP, relaxed) and a verify's QPs
 * made; the device is added back, and the client's next call sees ENODEV. */
static void scenario_device_removal(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL);
	struct odpd_segment *s;
	struct odpd_mr *m1 = NULL, *m2 = NULL, *m3 = NULL;
	char cmd[256];
	uint32_t crc;

	if (!note(c != NULL, "odpd_connect"))
		return;
	if (note((s = odpd_alloc(c, MIB, 0)) != NULL, "odpd_alloc")) {
		char *a = odpd_segment_addr(s);

		memset(a, 1, MIB);
		m1 = odpd_reg(c, a, 256 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		if (note(m1 != NULL, "odpd_reg"))
			note(odpd_verify(m1, NULL, 0, &crc) == 0, "odpd_verify");
		m2 = odpd_reg(c, a + 256 * KIB, 64 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		note(m2 != NULL, "odpd_reg (ODP)");
		m3 = odpd_reg(c, a + 512 * KIB, 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
		if (note(m3 != NULL, "odpd_reg (relaxed)"))
			note(odpd_dereg_relaxed(m3) == 0, "odpd_dereg_relaxed");
	}
	snprintf(cmd, sizeof(cmd), "rdma link delete %s", dev);
	if (run_cmd(cmd, 20) != 0)
		_exit(3);
	snprintf(cmd, sizeof(cmd), "rdma link add %s type rxe netdev %s", dev, netdev);
	if (run_cmd(cmd, 20) != 0)
		_exit(4);
	/* the next call says ENODEV once; releases succeed */
	if (m1)
		odpd_dereg(m1);
	if (m2)
		odpd_dereg(m2);
	odpd_disconnect(c);
}

/* A relaxed MR, then Flush() over D-Bus as root: a barrier behind its batch. */
static void scenario_bus_flush(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL);
	struct odpd_segment *s;
	struct odpd_mr *m;
	char out[512], addr[192];
	const char *argv[] = { "dbus-send", addr, "--print-reply", "--reply-timeout=20000",
			       "--dest=org.odpd1", "/org/odpd1", "org.odpd1.Manager.Flush", NULL };

	if (!note(c != NULL, "odpd_connect"))
		return;
	if (note((s = odpd_alloc(c, 256 * KIB, 0)) != NULL, "odpd_alloc") &&
	    note((m = odpd_reg(c, odpd_segment_addr(s), 256 * KIB, IBV_ACCESS_LOCAL_WRITE)) != NULL,
		 "odpd_reg"))
		note(odpd_dereg_relaxed(m) == 0, "odpd_dereg_relaxed");
	snprintf(addr, sizeof(addr), "--bus=%s", bus_addr);
	if (run_tool(0, out, sizeof(out), argv) != 0) {
		errno = EREMOTEIO;
		note(false, "Flush() over D-Bus");
	}
	odpd_disconnect(c);
}

/* ------------------------------------------------------------ the loop */

/* Run @fn in a child against @sock; its exit status, or -1 if it hung. */
static int run_scenario(void (*fn)(const char *), const char *sock)
{
	pid_t pid;
	int st;

	memset(seen, 0, sizeof(*seen));
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(30);                       /* a call odpd never answers */
		fn(sock);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A new client registers and deregisters memory. */
static void probe(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL);
	struct odpd_segment *s = c ? odpd_alloc(c, 64 * KIB, 0) : NULL;
	struct odpd_mr *m = s ? odpd_reg(c, odpd_segment_addr(s), 64 * KIB, IBV_ACCESS_LOCAL_WRITE) : NULL;

	if (!m || odpd_dereg(m) != 0)
		_exit(1);
	odpd_disconnect(c);
}

struct held {
	unsigned clients, segments, mrs, devices;
	uint64_t pinned;
	int fds, memfd_maps, uverbs_maps, kernel_mrs;
};

static void held_take(const struct test_daemon *d, int admin, struct held *h, bool kernel)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(admin, &r);

	h->clients = (unsigned)sr->n_clients + sr->releasing;
	h->segments = sr->segments;
	h->mrs = sr->mrs;
	h->pinned = sr->pinned_bytes;
	h->devices = (unsigned)sr->n_devices;
	odpd__reply__free_unpacked(r, NULL);
	h->fds = fd_count(d->pid);
	h->memfd_maps = maps_named(d->pid, "/memfd:", NULL);
	h->uverbs_maps = maps_named(d->pid, "/dev/infiniband/uverbs", NULL);
	h->kernel_mrs = kernel ? kernel_mr_count(d->pid) : 0;
}

static bool held_equal(const struct held *a, const struct held *b)
{
	return a->clients == b->clients && a->devices == b->devices && a->segments == b->segments && a->mrs == b->mrs &&
	       a->pinned == b->pinned && a->fds == b->fds && a->memfd_maps == b->memfd_maps &&
	       a->uverbs_maps == b->uverbs_maps && a->kernel_mrs == b->kernel_mrs;
}

/* Wait (up to 20 s) for odpd to hold what it held at @base. */
static void settle(const struct test_daemon *d, int admin, const struct held *base, const char *when)
{
	struct held h;

	for (int i = 0; i < 2000; i++) {
		held_take(d, admin, &h, false);
		h.kernel_mrs = base->kernel_mrs;
		if (held_equal(&h, base)) {
			held_take(d, admin, &h, true);
			if (held_equal(&h, base))
				return;
		}
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	fail_msg("%s: odpd has devices %u (want %u), clients %u (%u), segments %u (%u), MRs %u (%u), pinned %llu (%llu), "
		 "fds %d (%d), memfd mappings %d (%d), uverbs mappings %d (%d), kernel MRs %d (%d)", when,
		 h.devices, base->devices, h.clients, base->clients, h.segments, base->segments, h.mrs, base->mrs,
		 (unsigned long long)h.pinned, (unsigned long long)base->pinned, h.fds, base->fds,
		 h.memfd_maps, base->memfd_maps, h.uverbs_maps, base->uverbs_maps, h.kernel_mrs,
		 base->kernel_mrs);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static const char *kind_name(unsigned kind)
{
	return kind == ODPD_FAULT_ALLOC ? "allocations" : "fd-creating calls";
}

/* The functions of odpd at @sites (offsets from its load address), through
 * addr2line where there is one: where failures went unseen by the client. */
static void print_sites(const char *what, pid_t pid, uint64_t *sites, unsigned n)
{
	char cmd[8192], exe[64], path[512] = "", fn[256];
	size_t len;
	ssize_t k;
	FILE *p;

	snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)pid);
	k = readlink(exe, path, sizeof(path) - 1);
	if (k <= 0 || n == 0 || system("command -v addr2line >/dev/null 2>&1") != 0)
		return;
	path[k] = 0;
	qsort(sites, n, sizeof(sites[0]), cmp_u64);
	len = (size_t)snprintf(cmd, sizeof(cmd), "addr2line -f -s -e %s", path);
	for (unsigned i = 0; i < n && len < sizeof(cmd) - 24; i++)
		if (i == 0 || sites[i] != sites[i - 1])
			len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " %#llx",
						(unsigned long long)(sites[i] - 1));
	p = popen(cmd, "r");
	if (!p)
		return;
	printf("inject:   %s:", what);
	for (int line = 0; fgets(fn, sizeof(fn), p); line++) {
		fn[strcspn(fn, "\n")] = 0;
		printf(line % 2 ? " (%s)%s" : " %s", fn, line % 2 ? "," : "");
	}
	printf("\n");
	pclose(p);
}

/* The loop for one scenario and kind; prints its report line. */
static void inject(const char *name, void (*fn)(const char *), unsigned kind, const char *const *args)
{
	static uint64_t sites[MAX_SITES], quiet[MAX_SITES];
	unsigned n_quiet = 0;
	struct test_daemon d = { 0 };
	unsigned n_sites = 0, distinct = 0, refused = 0, disconnected = 0, absorbed = 0;
	struct held base;
	int admin, st, dst;
	int64_t n;
	char when[160];

	daemon_start(&d, args);
	admin = raw_connect_hello(d.sock);
	/* one run unharmed: odpd's pools and caches are as warm as they get */
	assert_int_equal(run_scenario(fn, d.sock), 0);
	assert_int_equal(seen->disconnected, 0);
	wait_idle(admin);
	/* after a device removal: until odpd has found the device again */
	for (int i = 0; i < 2000; i++) {
		held_take(&d, admin, &base, true);
		if (base.devices > 0)
			break;
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	assert_int_equal(run_scenario(probe, d.sock), 0);
	settle(&d, admin, &base, "after an unharmed run");
	for (n = 1;; n++) {
		bool hit;

		ctl_arm(kind, n);
		st = run_scenario(fn, d.sock);
		ctl_disarm();
		hit = atomic_load(&ctl->injected) != 0;
		if (seen->disconnected)
			disconnected++;
		else if (seen->refused)
			refused++;
		else if (hit) {
			absorbed++;
			if (n_quiet < MAX_SITES)
				quiet[n_quiet++] = ctl->site;
		}
		snprintf(when, sizeof(when), "%s, %s: call %lld failed (%s at odpd+%#llx)", name,
			 kind_name(kind), (long long)n, hit ? ctl->function : "none",
			 (unsigned long long)ctl->site);
		if (waitpid(d.pid, &dst, WNOHANG) == d.pid)
			fail_msg("%s: odpd died (status %#x)", when, dst);
		if (st == -1)
			fail_msg("%s: the client got no answer within 30 s", when);
		if (st != 0)
			fail_msg("%s: the scenario's client exited with %d", when, st);
		settle(&d, admin, &base, when);
		if (run_scenario(probe, d.sock) != 0)
			fail_msg("%s: a new client could not register afterwards", when);
		if (!hit)
			break;
		if (n_sites < MAX_SITES)
			sites[n_sites++] = ctl->site;
	}
	qsort(sites, n_sites, sizeof(sites[0]), cmp_u64);
	for (unsigned i = 0; i < n_sites; i++)
		distinct += i == 0 || sites[i] != sites[i - 1];
	printf("inject: %-15s %-17s %4lld injection points at %3u call sites: %u refused with an errno, "
	       "%u disconnected, %u absorbed (the client saw no failure)\n", name, kind_name(kind),
	       (long long)(n - 1), distinct, refused, disconnected, absorbed);
	print_sites("absorbed at", d.pid, quiet, n_quiet);
	fflush(stdout);
	close(admin);
	daemon_stop(&d);   /* exit status 0: under LSan, no leak */
}

static void test_requests(void **state)
{
	(void)state;
	inject("requests", scenario_requests, ODPD_FAULT_ALLOC, NULL);
	inject("requests", scenario_requests, ODPD_FAULT_FD, NULL);
}

static void test_admin(void **state)
{
	(void)state;
	inject("admin", scenario_admin, ODPD_FAULT_ALLOC, NULL);
	inject("admin", scenario_admin, ODPD_FAULT_FD, NULL);
}

static void test_device_removal(void **state)
{
	(void)state;
	rdma_link(dev, netdev);
	inject("device-removal", scenario_device_removal, ODPD_FAULT_ALLOC, NULL);
	inject("device-removal", scenario_device_removal, ODPD_FAULT_FD, NULL);
}

static void test_bus_flush(void **state)
{
	(void)state;
	bus_start();
	inject("bus-flush", scenario_bus_flush, ODPD_FAULT_ALLOC, NULL);
	inject("bus-flush", scenario_bus_flush, ODPD_FAULT_FD, NULL);
	bus_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_requests),
		cmocka_unit_test(test_admin),
		cmocka_unit_test(test_bus_flush),
		cmocka_unit_test(test_device_removal),
	};
	int fd;

	if (!test_require_device()) {
		printf("test-inject: needs a device (the VM tier)\n");
		return 77;
	}
	snprintf(ctl_path, sizeof(ctl_path), "/tmp/odpd-inject.%d", (int)getpid());
	fd = open(ctl_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, sizeof(*ctl)) < 0)
		return 1;
	ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	seen = mmap(NULL, sizeof(*seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (ctl == MAP_FAILED || seen == MAP_FAILED)
		return 1;
	ctl->magic = ODPD_FAULT_MAGIC;
	setenv("ODPD_FAULT_CONTROL", ctl_path, 1);
	if (getenv("ODPD_TEST_FILTER"))                  /* e.g. "test_device_removal" */
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	fd = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(ctl_path);
	return fd;
}
