/* SPDX-License-Identifier: MIT */
/*
 * test-faults (VM): clients killed at random points of their work leave
 * nothing behind. 1,000 client processes, 50 at a time, each looping
 * attach / register (pinned or ODP, some with remote access) / verify /
 * release (some relaxed) / detach until SIGKILLed after a random few ms;
 * afterwards odpd holds no client, segment or MR, the kernel no MR of odpd,
 * and odpd's VmPin, fds and mappings are back at their baseline. Also: odpd
 * restarted under its clients, and the device removed and added back.
 */
#include <errno.h>
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define CLIENTS 1000
#define AT_ONCE 50

/* Shared with the clients: what they got done before they were killed. */
static struct progress {
	unsigned long attached, registered, verified, released;
	unsigned char connected[CLIENTS];   /* each client, once connected */
} *progress;

static void client_loop(unsigned idx)
{
	unsigned seed = idx + 1;
	struct odpd_conn *c;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	srand(seed);
	c = odpd_connect(test_daemon.sock, NULL);
	if (!c)
		_exit(1);
	__atomic_store_n(&progress->connected[idx], 1, __ATOMIC_RELEASE);
	for (;;) {
		size_t len = (size_t)(1 + rand() % 64) * 4 * KIB;
		struct odpd_segment *s = odpd_alloc(c, len, 0);
		unsigned access = IBV_ACCESS_LOCAL_WRITE;
		struct odpd_mr *mr;
		uint8_t *p;
		uint32_t crc;

		if (!s)
			continue;
		__atomic_fetch_add(&progress->attached, 1, __ATOMIC_RELAXED);
		p = odpd_segment_addr(s);
		memset(p, (int)seed, len);
		if (rand() % 3 == 0)
			access |= IBV_ACCESS_REMOTE_READ;
		if (rand() % 4 == 0)
			access |= IBV_ACCESS_ON_DEMAND;
		mr = odpd_reg(c, p, len, access);
		if (mr) {
			__atomic_fetch_add(&progress->registered, 1, __ATOMIC_RELAXED);
			if (odpd_verify(mr, NULL, 0, &crc) == 0)
				__atomic_fetch_add(&progress->verified, 1, __ATOMIC_RELAXED);
			if ((rand() % 2 ? odpd_dereg_relaxed(mr) : odpd_dereg(mr)) == 0)
				__atomic_fetch_add(&progress->released, 1, __ATOMIC_RELAXED);
		}
		odpd_detach(s);
	}
}

static void test_clients_killed_anywhere(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Flush fl = ODPD__FLUSH__INIT;
	struct snapshot base, now;
	unsigned started = 0;
	Odpd__Reply *r;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	progress = mmap(NULL, sizeof(*progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(progress != MAP_FAILED);
	snapshot_take(&test_daemon, test_admin_fd, &base);
	srand((unsigned)time(NULL));
	while (started < CLIENTS) {
		pid_t pids[AT_ONCE];
		unsigned n = 0;

		for (; n < AT_ONCE && started < CLIENTS; n++, started++) {
			pids[n] = fork();
			assert_true(pids[n] >= 0);
			if (pids[n] == 0)
				client_loop(started);
		}
		for (unsigned i = 0; i < n; i++) {
			unsigned idx = started - n + i;

			/* anywhere in its work: a random while after it connected (how
			 * long connecting takes depends on the machine's load) */
			for (int t = 0; t < 2000 && !__atomic_load_n(&progress->connected[idx],
								   __ATOMIC_ACQUIRE); t++)
				usleep(5000);
			usleep((useconds_t)(rand() % 40000));
			kill(pids[i], SIGKILL);
		}
		for (unsigned i = 0; i < n; i++)
			waitpid(pids[i], NULL, 0);
	}
	/* Relaxed MRs of the dead wait on the invalidation queue: flush them. */
	fl.has_all = 1;
	fl.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	r = raw_call(test_admin_fd, 9, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	wait_idle(test_admin_fd);
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);
	snapshot_take(&test_daemon, test_admin_fd, &now);
	assert_int_equal(now.kernel_mrs, base.kernel_mrs);
	assert_int_equal(now.vmpin_kb, base.vmpin_kb);
	assert_int_equal(now.daemon_fds, base.daemon_fds);
	print_message("%u clients killed after %lu attaches, %lu registrations, %lu verifies, %lu "
		      "releases; odpd back at baseline: %d fds, %ld kB pinned, %d kernel MRs\n", started,
		      progress->attached, progress->registered, progress->verified, progress->released,
		      now.daemon_fds, now.vmpin_kb, now.kernel_mrs);
	/* the kills must have caught clients at work, not only before connecting */
	assert_true(progress->registered > CLIENTS / 4);
	munmap(progress, sizeof(*progress));
}

/*
 * odpd restarted by hand (no systemd, so no fd store: doc/design.md §12)
 * under its clients: a client's next call fails with ENOTCONN (and says
 * why), also once the new odpd listens on the same socket, nothing of the
 * old instance stays registered in the kernel, and the client connects to
 * the new one and works.
 */
static void test_restart_under_clients(void **state)
{
	struct test_daemon d1 = { 0 };
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *mr;
	uint32_t crc;
	int pds;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	pds = kernel_res_count("pd", 0);
	daemon_start(&d1, NULL);
	c = odpd_connect(d1.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 256 * KIB, 0);
	assert_non_null(s);
	mr = odpd_reg(c, odpd_segment_addr(s), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_true(kernel_mr_count(d1.pid) >= 1);
	assert_true(vmpin_kb(d1.pid) >= 256);
	daemon_stop(&d1);                              /* SIGTERM, clean exit */
	assert_int_equal(kernel_res_count("mr", 0), 0);  /* nothing of the old instance */
	assert_int_equal(kernel_res_count("pd", 0), pds);   /* ib_core's own stays */
	daemon_restart(&d1, NULL);                     /* the same socket */
	assert_null(odpd_reg(c, odpd_segment_addr(s), 4096, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, ENOTCONN);
	odpd_disconnect(c);                            /* frees the MR, segment and connection */
	c = odpd_connect(d1.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 256 * KIB, 0);
	assert_non_null(s);
	memset(odpd_segment_addr(s), 7, 256 * KIB);
	mr = odpd_reg(c, odpd_segment_addr(s), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_int_equal(odpd_verify(mr, NULL, 0, &crc), 0);
	assert_int_equal(odpd_dereg(mr), 0);
	assert_int_equal(odpd_detach(s), 0);
	odpd_disconnect(c);
	daemon_stop(&d1);
}

/* Run @cmd (sh -c) and wait up to @timeout_s for it: its exit status, or -1
 * if it did not end (then it is killed). */
static unsigned status_devices(int admin_fd, uint64_t *pinned, unsigned *mrs)
{
	Odpd__Reply *reply = NULL;
	Odpd__StatusReply *st = status_get(admin_fd, &reply);
	unsigned n = (unsigned)st->n_devices;

	*pinned = st->pinned_bytes;
	*mrs = st->mrs;
	odpd__reply__free_unpacked(reply, NULL);
	return n;
}

/* Invalidations by cause (odpctl(8), CACHE COUNTERS): a lost device's, and
 * the relaxed window's. */
static uint64_t inv_device(int admin_fd, uint64_t *expired)
{
	Odpd__Reply *reply = NULL;
	Odpd__StatusReply *st = status_get(admin_fd, &reply);
	uint64_t n;

	assert_non_null(st->cache);
	n = st->cache->invalidated_device;
	*expired = st->cache->invalidated_expired;
	odpd__reply__free_unpacked(reply, NULL);
	return n;
}

static bool one_device(void *arg)
{
	uint64_t pinned;
	unsigned mrs;

	return status_devices(*(int *)arg, &pinned, &mrs) == 1;
}

struct mrs_want {
	int admin;
	unsigned mrs;
};

static bool mrs_are(void *arg)
{
	const struct mrs_want *w = arg;
	uint64_t pinned;
	unsigned mrs;

	status_devices(w->admin, &pinned, &mrs);
	return mrs == w->mrs;
}

/* A device-removal test's start (skipped without a device): the link's
 * device and netdev names, an odpd of its own and an admin connection. */
static int removal_setup(struct test_daemon *d, char *dev, char *netdev)
{
	if (!test_require_device())
		skip();                         /* (leaves the test) */
	rdma_link(dev, netdev);
	daemon_start(d, NULL);
	return raw_connect_hello(d->sock);
}

/*
 * `rdma link delete` while clients hold MRs: odpd closes every context it
 * has on the device (the kernel waits for that: the command returns), the
 * MRs are dead (nothing pinned, none served from the cache), the clients
 * that had anything there get ENODEV once, their releases succeed, others
 * are untouched; `rdma link add` makes the device usable again, on the
 * same connections, without restarting odpd.
 */
static void test_device_removal(void **state)
{
	struct test_daemon d = { 0 };
	struct odpd_conn *a, *b, *idle, *c;
	struct odpd_segment *sa, *sb, *si, *sc;
	struct odpd_mr *mra, *mrb, *mro, *mrc;
	char dev[64], netdev[64], cmd[256];
	uint32_t crc1, crc2;
	uint64_t pinned;
	unsigned mrs;
	int admin;

	(void)state;
	admin = removal_setup(&d, dev, netdev);
	a = odpd_connect(d.sock, NULL);
	b = odpd_connect(d.sock, NULL);
	idle = odpd_connect(d.sock, NULL);
	assert_true(a && b && idle);
	sa = odpd_alloc(a, 1024 * KIB, 0);
	sb = odpd_alloc(b, 256 * KIB, 0);
	si = odpd_alloc(idle, 64 * KIB, 0);
	assert_true(sa && sb && si);
	memset(odpd_segment_addr(sa), 0x5a, 1024 * KIB);
	mra = odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mra);
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc1), 0);
	/* an ODP MR too, where the device has ODP (rxe does) */
	mro = odpd_reg(a, (char *)odpd_segment_addr(sa) + 512 * KIB, 64 * KIB,
		       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	/* b releases its MR relaxed: b's library keeps it (odpd takes it back
	 * when unused for a relaxed window, 100 ms here) */
	mrb = odpd_reg(b, odpd_segment_addr(sb), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mrb);
	assert_int_equal(odpd_dereg_relaxed(mrb), 0);
	{
		struct odpd_stats st;
		assert_int_equal(odpd_stats(b, &st, sizeof(st)), 0);
		assert_int_equal(st.cached_mrs, 1);
	}
	assert_true(kernel_mr_count(d.pid) >= 2);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 1);
	assert_true(pinned >= 512 * KIB);               /* b's relaxed MR may be invalidated by now */

	snprintf(cmd, sizeof(cmd), "rdma link delete %s", dev);
	/* Returns only once every context of the device is closed: odpd's too. */
	assert_int_equal(run_cmd(cmd, 60), 0);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 0);
	assert_int_equal(pinned, 0);                    /* dead MRs pin nothing */
	{
		/* mra and mro went with the device; b's, too, unless its
		 * relaxed window (taken back, then queued) passed first */
		uint64_t expired, dev_lost = inv_device(admin, &expired);

		assert_true(dev_lost >= (mro ? 2u : 1u));
		assert_int_equal(dev_lost + expired, mro ? 3 : 2);
	}
	/* a's, until it releases them (and b's kept one, until odpd took it back) */
	assert_true(wait_until(mrs_are, &(struct mrs_want){ admin, mro ? 2 : 1 }));

	/* a and b had MRs there: their next call says so, once */
	errno = 0;                                      /* mra's range: no local hit either */
	assert_null(odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	assert_int_equal(errno, ENODEV);
	assert_non_null(strstr(odpd_errmsg(), "was removed"));
	assert_non_null(strstr(odpd_errmsg(), dev));
	errno = 0;
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc2), -1);
	assert_int_equal(errno, ENODEV);                /* the daemon: the MR is dead */
	assert_int_equal(odpd_dereg(mra), 0);
	if (mro)
		assert_int_equal(odpd_dereg(mro), 0);
	errno = 0;                                      /* b's library serves nothing dead */
	assert_null(odpd_reg(b, odpd_segment_addr(sb), 4096, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, ENODEV);
	/* idle had nothing there: no event; attach and detach still work */
	assert_int_equal(odpd_detach(si), 0);
	si = odpd_alloc(idle, 64 * KIB, 0);
	assert_non_null(si);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 0);
	assert_int_equal(mrs, 0);

	snprintf(cmd, sizeof(cmd), "rdma link add %s type rxe netdev %s", dev, netdev);
	assert_int_equal(run_cmd(cmd, 60), 0);
	/* Found by a rescan once its uverbs node appears (inotify), with no
	 * request asking for it */
	assert_true(wait_until(one_device, &admin));
	mra = odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mra);
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc2), 0);
	assert_int_equal(crc2, crc1);                   /* the same bytes, read by the new device */
	assert_int_equal(status_devices(admin, &pinned, &mrs), 1);
	c = odpd_connect(d.sock, NULL);                 /* a new client sees it too */
	assert_non_null(c);
	sc = odpd_alloc(c, 64 * KIB, 0);
	assert_non_null(sc);
	mrc = odpd_reg(c, odpd_segment_addr(sc), 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mrc);
	assert_int_equal(odpd_dereg(mrc), 0);
	assert_int_equal(odpd_dereg(mra), 0);
	odpd_disconnect(c);
	odpd_disconnect(idle);
	odpd_disconnect(b);
	odpd_disconnect(a);
	wait_idle(admin);
	assert_int_equal(kernel_mr_count(d.pid), 0);
	close(admin);
	daemon_stop(&d);
}

struct word_want {
	const _Atomic uint64_t *word;
	uint64_t want;
};

static bool word_is(void *arg)
{
	const struct word_want *w = arg;

	return atomic_load(w->word) == w->want;
}

/*
 * The hit table's events word (issue 26): libodpd no longer looks for events
 * before each request while the word equals the events it has read, so that
 * a request costs a sendmsg and a recvmsg. A device removal counts its
 * DeviceEvent in the word before sending it: a raw client with a table sees
 * the word go from 0 to 1, then reads the event. A libodpd client with a
 * table (whose MR was on the device) fails its next call once with ENODEV
 * naming the device, even a call that needs no device (attaching a
 * segment); its release goes through, and the attach after succeeds.
 * (With a daemon that advertises the word but never stores it, the library
 * skipped its look and that first attach succeeded: checked by hand.)
 */
static void test_device_removal_events_word(void **state)
{
	struct test_daemon d = { 0 };
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__RegMr m = ODPD__REG_MR__INIT;
	struct odpd_conn *a;
	struct odpd_segment *sa, *s2;
	struct odpd_mr *mra;
	struct odpd_stats st;
	char dev[64], netdev[64], cmd[256];
	_Atomic uint64_t *use;
	const _Atomic uint64_t *gen;
	int admin, raw, use_fd, gen_fd, seg_fd;
	Odpd__Reply *r;

	(void)state;
	admin = removal_setup(&d, dev, netdev);
	raw = raw_connect_hello(d.sock);
	raw_open_hit_table(raw, 2, 64, &use_fd, &use, &gen_fd, &gen);
	seg_fd = sealed_memfd(64 * KIB);
	m.has_addr = m.has_length = m.has_access = 1;
	m.addr = raw_attach(raw, 3, seg_fd);
	m.length = 64 * KIB;
	m.access = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	r = raw_call(raw, 4, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	assert_true(r->mr->has_slot && r->mr->slot > 1);  /* the headers are never a reference's */
	odpd__reply__free_unpacked(r, NULL);
	assert_int_equal(atomic_load(&gen[1]), 0);

	a = odpd_connect(d.sock, NULL);
	assert_non_null(a);
	assert_int_equal(odpd_stats(a, &st, sizeof(st)), 0);
	assert_true(st.hit_table);
	sa = odpd_alloc(a, 256 * KIB, 0);
	assert_non_null(sa);
	mra = odpd_reg(a, odpd_segment_addr(sa), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mra);

	snprintf(cmd, sizeof(cmd), "rdma link delete %s", dev);
	assert_int_equal(run_cmd(cmd, 60), 0);
	assert_true(wait_until(word_is, &(struct word_want){ &gen[1], 1 }));
	r = raw_recv(raw);
	assert_int_equal(r->id, 0);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_DEVICE_EVENT);
	assert_int_equal(r->device_event->mrs, 1);
	odpd__reply__free_unpacked(r, NULL);

	/* told once, on a call that needs no device */
	errno = 0;
	assert_null(odpd_alloc(a, 64 * KIB, 0));
	assert_int_equal(errno, ENODEV);
	assert_non_null(strstr(odpd_errmsg(), "was removed"));
	assert_non_null(strstr(odpd_errmsg(), dev));
	assert_int_equal(odpd_dereg(mra), 0);
	s2 = odpd_alloc(a, 64 * KIB, 0);
	if (!s2)
		fail_msg("the call after the ENODEV: %s", odpd_errmsg());
	assert_int_equal(odpd_detach(s2), 0);
	assert_int_equal(odpd_detach(sa), 0);
	assert_int_equal(atomic_load(&gen[1]), 1);        /* one event, no more */

	snprintf(cmd, sizeof(cmd), "rdma link add %s type rxe netdev %s", dev, netdev);
	assert_int_equal(run_cmd(cmd, 60), 0);
	assert_true(wait_until(one_device, &admin));
	odpd_disconnect(a);
	close(raw);
	munmap(use, 4096);
	munmap((void *)gen, 4096);
	close(use_fd);
	close(gen_fd);
	close(seg_fd);
	wait_idle(admin);
	assert_int_equal(kernel_mr_count(d.pid), 0);
	close(admin);
	daemon_stop(&d);
}

/*
 * `rdma link delete` while clients keep requests of every kind in flight
 * (issue 23, section 4): attach/detach, pinned and ODP registration,
 * verify, prefetch (advise), relaxed release + flush, local cache hits,
 * import_pd, implicit ODP and client-PD registration (raw protocol, a
 * context of the client's own). Every call returns (an alarm catches a
 * hang) with success or an expected errno, then the device comes back,
 * everyone disconnects and odpd holds nothing: no MR in the kernel, no
 * pin, its fds back where they were.
 */
enum load_kind {
	L_ATTACH, L_PINNED, L_ODP, L_VERIFY, L_ADVISE, L_FLUSH, L_HITS, L_IMPORT, L_IMPLICIT,
	L_CLIENT_PD, L_KINDS
};
static const char *const load_names[L_KINDS] = {
	"attach", "pinned", "odp", "verify", "advise", "flush", "hits", "import_pd", "implicit",
	"client-pd",
};

#define LOADERS 12
static struct load_state {
	int stop;
	int hung_kind[LOADERS];                 /* -1, or the kind of the call that hung */
	unsigned long ok[L_KINDS], enodev[L_KINDS], other[L_KINDS];
	int other_errno[L_KINDS];
	char other_msg[L_KINDS][160];
} *load;
static int load_cur_kind[1];
static unsigned load_idx;

static void load_alarm(int sig)
{
	(void)sig;
	load->hung_kind[load_idx] = load_cur_kind[0];
	_exit(3);
}

/* Count one call's outcome: 0, ENODEV, or anything else (kept for the report). */
static void load_note(enum load_kind k, int rc)
{
	if (rc == 0) {
		__atomic_fetch_add(&load->ok[k], 1, __ATOMIC_RELAXED);
	} else if (errno == ENODEV) {
		__atomic_fetch_add(&load->enodev[k], 1, __ATOMIC_RELAXED);
	} else {
		__atomic_fetch_add(&load->other[k], 1, __ATOMIC_RELAXED);
		load->other_errno[k] = errno;
		snprintf(load->other_msg[k], sizeof(load->other_msg[k]), "%s", odpd_errmsg());
	}
}

/* One client-PD registration with the raw protocol: a context and PD of
 * our own (closed at once, or `rdma link delete` would wait for them). */
static void load_client_pd(const char *sock)
{
	const size_t len = 64 * KIB;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	int conn = -1, fd = -1;

	if (pd) {
		Odpd__RegMr m;
		Odpd__Request req;
		Odpd__Reply *r;

		conn = raw_connect_hello(sock);
		fd = sealed_memfd(len);
		raw_client_pd_req(&req, &m, raw_attach(conn, 2, fd), pd->handle);
		r = raw_call(conn, 3, &req, &ctx->cmd_fd, 1);
		errno = r->status;
		load_note(L_CLIENT_PD, r->status ? -1 : 0);
		odpd__reply__free_unpacked(r, NULL);
		close(conn);
		close(fd);
	} else {
		errno = ENODEV;
		load_note(L_CLIENT_PD, -1);
	}
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
	if (list)
		ibv_free_device_list(list);
}

static void load_one(struct odpd_conn *c, struct odpd_segment *s, enum load_kind k, const char *sock)
{
	char *p = odpd_segment_addr(s);
	struct odpd_mr *mr = NULL;
	uint32_t crc;
	int rc;

	load_cur_kind[0] = (int)k;
	alarm(30);
	switch (k) {
	case L_ATTACH: {
		struct odpd_segment *t = odpd_alloc(c, 64 * KIB, 0);

		load_note(k, t ? 0 : -1);
		if (t)
			odpd_detach(t);
		break;
	}
	case L_PINNED:
	case L_ODP:
		mr = odpd_reg(c, p + (rand() % 4) * 64 * KIB, 64 * KIB,
			      IBV_ACCESS_LOCAL_WRITE | (k == L_ODP ? IBV_ACCESS_ON_DEMAND : 0));
		load_note(k, mr ? 0 : -1);
		break;
	case L_VERIFY:
		mr = odpd_reg(c, p, 128 * KIB, IBV_ACCESS_LOCAL_WRITE |
			      (rand() % 2 ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_ON_DEMAND));
		load_note(k, mr ? odpd_verify(mr, NULL, 0, &crc) : -1);
		break;
	case L_ADVISE:
		mr = odpd_reg(c, p, 256 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		if (mr) {
			struct ibv_sge sge = { .addr = (uintptr_t)p, .length = 256 * KIB, .lkey = mr->lkey };

			rc = odpd_advise_mr(c, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
					    rand() % 2 ? IBV_ADVISE_MR_FLAG_FLUSH : 0, &sge, 1);
			load_note(k, rc == 0 || errno == EOPNOTSUPP ? 0 : -1);
		} else {
			load_note(k, -1);
		}
		break;
	case L_FLUSH:
		mr = odpd_reg_attr(c, p + 256 * KIB, 64 * KIB, &(struct odpd_reg_attr){
			.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
			.access = IBV_ACCESS_LOCAL_WRITE, .flags = ODPD_REG_NO_CACHE });
		if (mr && odpd_dereg_relaxed(mr) == 0)
			mr = NULL;
		load_note(k, odpd_flush_relaxed(c));
		break;
	case L_HITS:
		for (int i = 0; i < 8; i++) {
			mr = odpd_reg(c, p + 384 * KIB, 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
			load_note(k, mr ? 0 : -1);
			if (mr && odpd_dereg_relaxed(mr) == 0)
				mr = NULL;
			if (mr)
				break;
		}
		break;
	case L_IMPORT:
		/* import_pd binds the connection: on a connection of its own */
		{
			struct odpd_conn *ic = odpd_connect(sock, NULL);
			struct ibv_pd *pd = ic ? odpd_import_pd(ic) : NULL;

			load_note(k, pd || errno == EOPNOTSUPP ? 0 : -1);
			odpd_disconnect(ic);
		}
		break;
	case L_IMPLICIT:
		mr = odpd_reg(c, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		load_note(k, mr || errno == EOPNOTSUPP ? 0 : -1);
		break;
	case L_CLIENT_PD:
		load_client_pd(sock);
		break;
	case L_KINDS:
		break;
	}
	if (mr && (rand() % 2 ? odpd_dereg(mr) : odpd_dereg_relaxed(mr)) != 0)
		load_note(k, -1);
	alarm(0);
}

static void load_loop(unsigned idx, const char *sock)
{
	struct odpd_conn *c;
	struct odpd_segment *s;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	load_idx = idx;
	signal(SIGALRM, load_alarm);
	srand(idx + 1);
	c = odpd_connect(sock, NULL);
	s = c ? odpd_alloc(c, 1024 * KIB, 0) : NULL;
	if (!s)
		_exit(1);
	memset(odpd_segment_addr(s), (int)idx, 1024 * KIB);
	while (!__atomic_load_n(&load->stop, __ATOMIC_ACQUIRE))
		load_one(c, s, (enum load_kind)(idx < L_KINDS ? (rand() % 3 ? idx : (unsigned)rand() % L_KINDS) :
						 (unsigned)rand() % L_KINDS), sock);
	load_cur_kind[0] = -2;
	alarm(30);
	odpd_detach(s);
	odpd_disconnect(c);
	_exit(0);
}

/* A raw connection with a pinned MR on the device, that then shuts its
 * socket for reading: odpd's next send to it fails (EPIPE) and disconnects it. */
static int deaf_client(const char *sock, int *ret_memfd)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__RegMr m = ODPD__REG_MR__INIT;
	Odpd__Reply *r;
	int conn = raw_connect_hello(sock);

	*ret_memfd = sealed_memfd(64 * KIB);
	m.has_addr = m.has_length = m.has_access = 1;
	m.addr = raw_attach(conn, 2, *ret_memfd);
	m.length = 64 * KIB;
	m.access = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	r = raw_call(conn, 3, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	assert_int_equal(shutdown(conn, SHUT_RD), 0);
	return conn;
}

static void test_device_removal_under_load(void **state)
{
	struct test_daemon d = { 0 };
	struct snapshot base, now;
	char dev[64], netdev[64], cmd[256];
	pid_t pids[LOADERS];
	int admin, deaf[3], deaf_fd[3];

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	rdma_link(dev, netdev);
	load = mmap(NULL, sizeof(*load), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(load != MAP_FAILED);
	memset(load, 0, sizeof(*load));
	for (unsigned i = 0; i < LOADERS; i++)
		load->hung_kind[i] = -1;
	daemon_start(&d, (const char *const[]){ "--verify-idle-ms", "0", NULL });
	admin = raw_connect_hello(d.sock);
	snapshot_take(&d, admin, &base);
	for (unsigned i = 0; i < LOADERS; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0)
			load_loop(i, d.sock);
	}
	/* and clients that odpd's DeviceEvent will find deaf: telling them
	 * disconnects them in the middle of the device's removal (which used
	 * to free their state while the registry walked it: ASan saw a
	 * heap-use-after-free in notify_holder) */
	for (unsigned i = 0; i < 3; i++)
		deaf[i] = deaf_client(d.sock, &deaf_fd[i]);
	usleep(1500000);                                /* every kind under way */
	snprintf(cmd, sizeof(cmd), "rdma link delete %s", dev);
	assert_int_equal(run_cmd(cmd, 90), 0);
	for (unsigned i = 0; i < 3; i++) {
		close(deaf[i]);
		close(deaf_fd[i]);
	}
	usleep(1000000);                                /* requests meet the gone device */
	snprintf(cmd, sizeof(cmd), "rdma link add %s type rxe netdev %s", dev, netdev);
	assert_int_equal(run_cmd(cmd, 60), 0);
	assert_true(wait_until(one_device, &admin));
	usleep(1000000);                                /* and the new one */
	__atomic_store_n(&load->stop, 1, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < LOADERS; i++) {
		int st;

		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		if (load->hung_kind[i] != -1)
			fail_msg("client %u: a %s call did not return within 30 s", i,
				 load->hung_kind[i] >= 0 ? load_names[load->hung_kind[i]] : "disconnect");
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			fail_msg("client %u ended with status %#x", i, st);
	}
	for (unsigned k = 0; k < L_KINDS; k++) {
		print_message("%-10s ok %lu, ENODEV %lu, other %lu%s%s%s\n", load_names[k], load->ok[k],
			      load->enodev[k], load->other[k], load->other[k] ? " (" : "",
			      load->other[k] ? strerror(load->other_errno[k]) : "", load->other[k] ? ")" : "");
		if (load->other[k])
			print_message("  last: %s\n", load->other_msg[k]);
	}
	wait_idle(admin);
	snapshot_settles_to(&d, admin, &base);
	snapshot_take(&d, admin, &now);
	assert_int_equal(now.kernel_mrs, 0);
	assert_int_equal(now.vmpin_kb, base.vmpin_kb);
	close(admin);
	daemon_stop(&d);
	munmap(load, sizeof(*load));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_clients_killed_anywhere, harness_test_setup),
		cmocka_unit_test(test_restart_under_clients),
		cmocka_unit_test(test_device_removal),
		cmocka_unit_test(test_device_removal_under_load),
		cmocka_unit_test(test_device_removal_events_word),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
