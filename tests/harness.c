/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <grp.h>
#include <unistd.h>
#include <cmocka.h>
#include <json-c/json.h>

#include "harness.h"

void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

bool test_require_device(void)
{
	const char *e = getenv("ODPD_TEST_REQUIRE_DEVICE");

	return e && strcmp(e, "1") == 0;
}

bool test_profile_testbed(void)
{
	const char *e = getenv("ODPD_VM_PROFILE");

	return e && strcmp(e, "testbed") == 0;
}

const char *test_cm_addr(void)
{
	const char *e = getenv("ODPD_VM_CM_ADDR");

	return e && *e ? e : NULL;
}

/*
 * ODPD_TEST_JOURNAL=1: every daemon of the test program runs with a fake fd
 * store (one for the program, never stopped), so that it keeps its journal
 * (daemon/journal.h) while the program's tests run: every reply is then
 * preceded by a commit. For a run of a suite to shake the journal's hooks;
 * not for tests that restart odpd by hand (they expect a plain stop).
 */
static void journal_store(void)
{
	static struct fake_store st;
	static bool started;

	if (started || !getenv("ODPD_TEST_JOURNAL") || getenv("NOTIFY_SOCKET"))
		return;
	fake_store_start(&st);
	started = true;
}

void daemon_start(struct test_daemon *d, const char *const *args)
{
	journal_store();
	snprintf(d->dir, sizeof(d->dir), "/tmp/odpd-test.XXXXXX");
	assert_non_null(mkdtemp(d->dir));
	chmod(d->dir, 0755);                         /* other users reach the socket too */
	snprintf(d->sock, sizeof(d->sock), "%s/odpd.sock", d->dir);
	daemon_restart(d, args);
}

/* What the next daemon_restart passes as systemd would (LISTEN_FDS). */
static struct {
	const int *fds;
	const char *const *names;
	unsigned n;
} pass;

void daemon_pass_fds(const int *fds, const char *const *names, unsigned n)
{
	pass.fds = fds;
	pass.names = names;
	pass.n = n;
}

/* In the child: fds 3.. and the variables sd_listen_fds_with_names reads. */
static void pass_fds_child(void)
{
	int high[64];
	char names[4096] = "", num[32];
	size_t len = 0;

	for (unsigned i = 0; i < pass.n && i < 64; i++)
		high[i] = fcntl(pass.fds[i], F_DUPFD_CLOEXEC, 200);   /* out of the way of 3.. */
	for (unsigned i = 0; i < pass.n && i < 64; i++) {
		if (dup2(high[i], 3 + (int)i) < 0)
			_exit(126);
		close(high[i]);
		len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ":" : "", pass.names[i]);
	}
	snprintf(num, sizeof(num), "%u", pass.n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", names, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
}

void daemon_restart(struct test_daemon *d, const char *const *args)
{
	const char *bin = getenv("ODPD_TEST_DAEMON");
	const char *wrapper = getenv("ODPD_TEST_WRAPPER");   /* e.g. valgrind and its options */
	const char *extra = getenv("ODPD_TEST_DAEMON_ARGS"); /* e.g. a smaller --window-size */
	char *wrap = wrapper ? strdup(wrapper) : NULL, *more = extra ? strdup(extra) : NULL, *save = NULL;
	const char *argv[48];
	int n = 0;

	assert_non_null(bin);
	for (char *w = wrap ? strtok_r(wrap, " ", &save) : NULL; w && n < 24; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	argv[n++] = bin;
	argv[n++] = "--foreground";
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	/* On the system bus only where a test set up a bus of its own (test-bus) */
	if (!getenv("DBUS_SYSTEM_BUS_ADDRESS"))
		argv[n++] = "--no-bus";
	/* A verifier stays until its client goes, so that the tests' counts of
	 * the kernel's MRs after a verify are exact (odpd's default gives it
	 * back after a second idle); test-rxe's verifier tests pass their own
	 * (a later --verify-idle-ms wins). */
	argv[n++] = "--verify-idle-ms";
	argv[n++] = "600000";
	for (char *w = more ? strtok_r(more, " ", &save) : NULL; w && n < 40; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	for (; args && *args && n < 47; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	d->pid = fork();
	assert_true(d->pid >= 0);
	if (d->pid == 0) {
		/* a failed test must not leave odpd running (and its output open) */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (pass.n)
			pass_fds_child();
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	pass.n = 0;
	free(wrap);
	free(more);
	for (int i = 0; i < 1200; i++) {             /* up to 60 s: TCG and valgrind are slow */
		int fd = odpd_wire_connect(d->sock);
		if (fd >= 0) {
			close(fd);
			return;
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid)
			fail_msg("odpd exited during start-up (status %#x)", st);
		sleep_ms(50);
	}
	fail_msg("odpd did not start listening on %s", d->sock);
}

/* ---------------------------------------------------------------- systemd's fd store, faked */

static void *store_run(void *arg)
{
	struct fake_store *st = arg;

	while (!atomic_load(&st->stop)) {
		char buf[4096], ctl[CMSG_SPACE(sizeof(int) * 16)];
		struct iovec iov = { buf, sizeof(buf) - 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
				     .msg_controllen = sizeof(ctl) };
		struct pollfd p = { .fd = st->sock, .events = POLLIN };
		int fds[16], nfds = 0;
		ssize_t n;
		char *name;

		if (poll(&p, 1, 100) <= 0)
			continue;
		/* (the system call itself: tests that count the client's
		 * recvmsg calls by interposing it must not count this thread's) */
		n = syscall(SYS_recvmsg, st->sock, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0)
			continue;
		buf[n] = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));

				for (int i = 0; i < k && nfds < 16; i++)
					memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			}
		name = strstr(buf, "FDNAME=");
		if (name) {
			name += 7;
			name[strcspn(name, "\n")] = 0;
		}
		pthread_mutex_lock(&st->lock);
		if (strstr(buf, "FDSTOREREMOVE=1") && name) {
			for (unsigned i = 0; i < st->n; i++)
				if (strcmp(st->names[i], name) == 0) {
					close(st->fds[i]);
					st->fds[i] = st->fds[st->n - 1];
					memmove(st->names[i], st->names[st->n - 1], sizeof(st->names[i]));
					st->n--;
					i--;
				}
		} else if (strstr(buf, "FDSTORE=1") && name) {
			for (int i = 0; i < nfds; i++) {
				if (st->n < (st->max && st->max < FAKE_STORE_MAX ? st->max : FAKE_STORE_MAX)) {
					snprintf(st->names[st->n], sizeof(st->names[0]), "%s", name);
					st->fds[st->n++] = fds[i];
				} else {
					close(fds[i]);
				}
			}
			nfds = 0;
		}
		if (strstr(buf, "BARRIER=1")) {
			st->barriers++;
			for (int i = 0; st->hold_barriers && i < nfds; i++)
				if (st->n_held < FAKE_STORE_MAX)
					st->held[st->n_held++] = fds[i];   /* unanswered */
			if (st->hold_barriers)
				nfds = 0;
		}
		pthread_mutex_unlock(&st->lock);
		for (int i = 0; i < nfds; i++)          /* a barrier's pipe: closing it answers */
			close(fds[i]);
	}
	return NULL;
}

void fake_store_start(struct fake_store *st)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(st, 0, sizeof(*st));
	pthread_mutex_init(&st->lock, NULL);
	snprintf(st->dir, sizeof(st->dir), "/tmp/odpd-notify.XXXXXX");
	assert_non_null(mkdtemp(st->dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", st->dir);
	st->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(st->sock >= 0);
	assert_int_equal(bind(st->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	chmod(st->dir, 0755);
	chmod(sa.sun_path, 0666);
	assert_int_equal(setenv("NOTIFY_SOCKET", sa.sun_path, 1), 0);
	assert_int_equal(pthread_create(&st->thread, NULL, store_run, st), 0);
}

void fake_store_stop(struct fake_store *st)
{
	char path[96];

	unsetenv("NOTIFY_SOCKET");
	atomic_store(&st->stop, true);
	pthread_join(st->thread, NULL);
	close(st->sock);
	for (unsigned i = 0; i < st->n; i++)
		close(st->fds[i]);
	st->n = 0;
	for (unsigned i = 0; i < st->n_held; i++)
		close(st->held[i]);
	st->n_held = 0;
	snprintf(path, sizeof(path), "%s/notify", st->dir);
	unlink(path);
	rmdir(st->dir);
}

int fake_store_find(struct fake_store *st, const char *prefix)
{
	int fd = -1;

	pthread_mutex_lock(&st->lock);
	for (unsigned i = 0; i < st->n && fd < 0; i++)
		if (strncmp(st->names[i], prefix, strlen(prefix)) == 0)
			fd = st->fds[i];
	pthread_mutex_unlock(&st->lock);
	return fd;
}

json_object *odpctl_json(const char *sock, const char *args)
{
	const char *odpctl = getenv("ODPD_TEST_ODPCTL");
	static char out[1 << 20];
	char cmd[512];
	json_object *root;
	size_t n;
	FILE *p;

	assert_non_null(odpctl);
	snprintf(cmd, sizeof(cmd), "%s --socket %s %s --json", odpctl, sock, args);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	assert_int_equal(pclose(p), 0);
	out[n] = 0;
	root = json_tokener_parse(out);
	if (!root)
		fail_msg("odpctl %s printed no JSON:\n%s", args, out);
	return root;
}

void daemon_stop(struct test_daemon *d)
{
	int st = 0;

	if (d->pid <= 0)
		return;
	kill(d->pid, SIGTERM);
	for (int i = 0; i < 1200 && waitpid(d->pid, &st, WNOHANG) != d->pid; i++)
		sleep_ms(50);                        /* up to 60 s */
	if (waitpid(d->pid, &st, WNOHANG) == 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, &st, 0);
		d->pid = 0;
		fail_msg("odpd did not stop on SIGTERM");
	}
	d->pid = 0;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	unlink(d->sock);
	rmdir(d->dir);
}

void raw_send(int fd, Odpd__Request *req, const int *fds, unsigned nfds)
{
	assert_int_equal(odpd_wire_send(fd, &req->base, fds, nfds, 0), 0);
}

void raw_send_bytes(int fd, const void *buf, size_t len)
{
	assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

static Odpd__Reply *recv_fd(int fd, int *ret_fd)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct odpd_packet pkt;
	Odpd__Reply *r;

	assert_int_equal(poll(&p, 1, 20000), 1);
	assert_int_equal(odpd_wire_recv(fd, buf, sizeof(buf), &pkt, 0), 0);
	assert_false(pkt.eof);
	assert_false(pkt.truncated);
	if (ret_fd) {
		assert_true(pkt.nfds <= 1);
		*ret_fd = pkt.nfds ? pkt.fds[0] : -1;
	} else {
		assert_int_equal(pkt.nfds, 0);
	}
	r = odpd__reply__unpack(NULL, pkt.len, buf);
	assert_non_null(r);
	return r;
}

Odpd__Reply *raw_recv(int fd)
{
	return recv_fd(fd, NULL);
}

Odpd__Reply *raw_call_fd(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds,
			 int *ret_fd)
{
	Odpd__Reply *r;

	req->has_id = 1;
	req->id = id;
	raw_send(fd, req, fds, nfds);
	r = recv_fd(fd, ret_fd);
	assert_int_equal(r->id, id);
	return r;
}

Odpd__Reply *raw_call(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds)
{
	return raw_call_fd(fd, id, req, fds, nfds, NULL);
}

void raw_oneway_dereg_req(Odpd__Request *req, Odpd__DeregMr *d, uint64_t handle)
{
	odpd__dereg_mr__init(d);
	odpd__request__init(req);
	d->has_handle = d->has_no_reply = 1;
	d->handle = handle;
	d->no_reply = 1;
	req->has_id = 1;
	req->body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req->dereg_mr = d;
}

void raw_expect_error(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds,
		      int status)
{
	Odpd__Reply *r = raw_call(fd, id, req, fds, nfds);

	if (r->status != status)
		fail_msg("request %llu: expected %s, got %s: %s", (unsigned long long)id,
			 strerror(status), strerror(r->status), r->message ? r->message : "");
	assert_non_null(r->message);
	assert_true(strlen(r->message) > 0);
	odpd__reply__free_unpacked(r, NULL);
}

int raw_connect_hello(const char *sock)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	Odpd__Reply *r;
	int fd = odpd_wire_connect(sock);

	assert_true(fd >= 0);
	h.has_version = 1;
	h.version = ODPD_PROTOCOL_VERSION;
	h.client_name = (char *)"odpd-test";
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &h;
	r = raw_call(fd, 1, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	return fd;
}

int fd_count(pid_t pid)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

int maps_named(pid_t pid, const char *needle, uint64_t *ret_bytes)
{
	char path[64], line[512];
	unsigned long long start, end;
	uint64_t bytes = 0;
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle) && sscanf(line, "%llx-%llx", &start, &end) == 2) {
			n++;
			bytes += end - start;
		}
	fclose(f);
	if (ret_bytes)
		*ret_bytes = bytes;
	return n;
}

static long meminfo_value(const char *key)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ':')
			v = strtol(line + strlen(key) + 1, NULL, 10);
	fclose(f);
	return v;
}

static long nr_hugepages_before = -1;

static int nr_hugepages_write(long n)
{
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "we");
	int r;

	if (!f)
		return -1;
	r = fprintf(f, "%ld\n", n) < 0;
	return fclose(f) || r ? -1 : 0;
}

void hugepages_restore(void)
{
	if (nr_hugepages_before >= 0)
		nr_hugepages_write(nr_hugepages_before);
	nr_hugepages_before = -1;
}

bool hugepages_free(unsigned n)
{
	long free_pages = meminfo_value("HugePages_Free"), total = meminfo_value("HugePages_Total");

	if (free_pages >= (long)n)
		return true;
	if (geteuid() == 0 && total >= 0 && nr_hugepages_before < 0) {
		nr_hugepages_before = total;
		atexit(hugepages_restore);
		nr_hugepages_write(total + (long)n - (free_pages > 0 ? free_pages : 0));
		free_pages = meminfo_value("HugePages_Free");
		if (free_pages >= (long)n)
			return true;
		hugepages_restore();
	}
	print_message("no %u free huge pages (HugePages_Free %ld)%s: MFD_HUGETLB test skipped\n", n,
		      free_pages, geteuid() == 0 ? " and vm.nr_hugepages could not provide them" :
		      "; as root it would raise vm.nr_hugepages");
	return false;
}

long vmpin_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* The kernel's restrack names the task that created an MR: for odpd that is
 * a worker thread, so "odpd's MRs" are those of any thread of the process. */
static bool is_thread_of(pid_t pid, int tid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)pid, tid);
	return access(path, F_OK) == 0;
}

int kernel_mr_count(pid_t pid)
{
	return kernel_res_count("mr", pid);
}

int kernel_res_count(const char *res, pid_t pid)
{
	static char out[1 << 20];
	char cmd[64];
	size_t len;
	FILE *p;
	int n = 0;

	snprintf(cmd, sizeof(cmd), "rdma -j resource show %s 2>/dev/null", res);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	len = fread(out, 1, sizeof(out) - 1, p);
	if (pclose(p) != 0)
		return -1;
	out[len] = 0;
	json_object *arr = json_tokener_parse(out);
	if (!arr)
		return -1;
	for (size_t i = 0; json_object_is_type(arr, json_type_array) && i < json_object_array_length(arr); i++) {
		json_object *o = json_object_array_get_idx(arr, i), *jp;
		if (pid == 0 || (json_object_object_get_ex(o, "pid", &jp) &&
				 is_thread_of(pid, json_object_get_int(jp))))
			n++;
	}
	json_object_put(arr);
	return n;
}

uint64_t raw_attach(int fd_conn, uint64_t id, int fd)
{
	Odpd__AttachSegment a = ODPD__ATTACH_SEGMENT__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *r;
	uint64_t addr;

	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &a;
	r = raw_call(fd_conn, id, &req, &fd, 1);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_SEGMENT);
	addr = r->segment->addr;
	odpd__reply__free_unpacked(r, NULL);
	return addr;
}

void raw_client_pd_req(Odpd__Request *req, Odpd__RegMr *m, uint64_t addr, uint32_t pd_handle)
{
	odpd__reg_mr__init(m);
	m->has_addr = m->has_length = m->has_access = m->has_client_pd = m->has_client_pd_handle = 1;
	m->addr = addr;
	m->length = 4096;
	m->access = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	m->client_pd = 1;
	m->client_pd_handle = pd_handle;
	odpd__request__init(req);
	req->body_case = ODPD__REQUEST__BODY_REG_MR;
	req->reg_mr = m;
}

Odpd__StatusReply *status_get(int admin_fd, Odpd__Reply **ret_reply)
{
	static uint64_t id = 1000;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__Reply *r;

	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	r = raw_call(admin_fd, ++id, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_STATUS_REPLY);
	*ret_reply = r;
	return r->status_reply;
}

uint64_t quota_pinned(uid_t uid)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(test_admin_fd, &r);
	uint64_t v = 0;

	for (size_t i = 0; i < sr->n_quotas; i++)
		if (sr->quotas[i]->uid == uid)
			v = sr->quotas[i]->pinned_bytes;
	odpd__reply__free_unpacked(r, NULL);
	return v;
}

void snapshot_take(const struct test_daemon *d, int admin_fd, struct snapshot *s)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(admin_fd, &r);

	s->segments = sr->segments;
	s->segment_bytes = sr->segment_bytes;
	s->mrs = sr->mrs;
	s->pinned_bytes = sr->pinned_bytes;
	s->clients = (unsigned)sr->n_clients;
	odpd__reply__free_unpacked(r, NULL);
	s->daemon_fds = fd_count(d->pid);
	s->kernel_mrs = kernel_mr_count(d->pid);
	s->vmpin_kb = vmpin_kb(d->pid);
}

void snapshot_assert_equal(const struct snapshot *a, const struct snapshot *b)
{
	assert_int_equal(a->segments, b->segments);
	assert_int_equal(a->segment_bytes, b->segment_bytes);
	assert_int_equal(a->mrs, b->mrs);
	assert_int_equal(a->pinned_bytes, b->pinned_bytes);
	assert_int_equal(a->daemon_fds, b->daemon_fds);
	assert_int_equal(a->kernel_mrs, b->kernel_mrs);
	assert_int_equal(a->vmpin_kb, b->vmpin_kb);
}

struct settle {
	const struct test_daemon *d;
	int admin_fd;
	const struct snapshot *want;
};

static bool snapshot_matches(void *arg)
{
	const struct settle *st = arg;
	const struct snapshot *a = st->want;
	struct snapshot b;

	snapshot_take(st->d, st->admin_fd, &b);
	return a->segments == b.segments && a->segment_bytes == b.segment_bytes && a->mrs == b.mrs &&
	       a->pinned_bytes == b.pinned_bytes && a->daemon_fds == b.daemon_fds &&
	       a->kernel_mrs == b.kernel_mrs && a->vmpin_kb == b.vmpin_kb;
}

void snapshot_settles_to(const struct test_daemon *d, int admin_fd, const struct snapshot *want)
{
	struct settle st = { d, admin_fd, want };
	struct snapshot now;

	wait_until(snapshot_matches, &st);
	snapshot_take(d, admin_fd, &now);
	snapshot_assert_equal(want, &now);
}

bool wait_until(bool (*cond)(void *arg), void *arg)
{
	for (int i = 0; i < 400; i++) {
		if (cond(arg))
			return true;
		sleep_ms(50);
	}
	return cond(arg);
}

int sealed_memfd(size_t size)
{
	int fd = memfd_create("odpd-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

static int idle_admin_fd = -1;

static bool daemon_idle(void *arg)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(idle_admin_fd, &r);
	bool idle = sr->n_clients == 1 && sr->releasing == 0 && sr->segments == 0 && sr->mrs == 0;

	(void)arg;
	odpd__reply__free_unpacked(r, NULL);
	return idle;
}

void wait_idle(int admin_fd)
{
	idle_admin_fd = admin_fd;
	if (!wait_until(daemon_idle, NULL)) {
		Odpd__Reply *r;
		Odpd__StatusReply *sr = status_get(admin_fd, &r);
		fail_msg("odpd did not release the previous test's clients: clients %zu (want 1), "
			 "releasing %u, segments %u, MRs %u", sr->n_clients, sr->releasing, sr->segments,
			 sr->mrs);
	}
}

struct test_daemon test_daemon;
int test_admin_fd = -1;

int harness_group_setup(void **state)
{
	(void)state;
	daemon_start(&test_daemon, NULL);
	test_admin_fd = raw_connect_hello(test_daemon.sock);
	return 0;
}

/*
 * A test that failed left its connections to the daemon open (cmocka jumps
 * out of it): close every socket of this process whose peer is the test
 * daemon's socket, but the admin connection, so that one failure does not
 * fail every later test in wait_idle.
 */
static void close_stray_connections(void)
{
	struct sockaddr_un peer;
	struct dirent *de;
	DIR *d = opendir("/proc/self/fd");
	int dfd = d ? dirfd(d) : -1;

	while (d && (de = readdir(d))) {
		int fd = atoi(de->d_name);
		socklen_t len = sizeof(peer);
		if (de->d_name[0] == '.' || fd == dfd || fd == test_admin_fd)
			continue;
		if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0 && peer.sun_family == AF_UNIX &&
		    strcmp(peer.sun_path, test_daemon.sock) == 0) {
			fprintf(stderr, "harness: closing fd %d, a connection an earlier test left open\n", fd);
			close(fd);
		}
	}
	if (d)
		closedir(d);
}

int harness_test_setup(void **state)
{
	(void)state;
	close_stray_connections();
	wait_idle(test_admin_fd);
	return 0;
}

void harness_test_daemon_exits_cleanly(void **state)
{
	(void)state;
	close(test_admin_fd);
	test_admin_fd = -1;
	daemon_stop(&test_daemon);
}

static char conf_path[96];

void daemon_start_conf(struct test_daemon *d, char *path, size_t cap, const char *tag, const char *text,
		       const char *arg, const char *val)
{
	const char *args[] = { "--config", path, arg, val, NULL };
	FILE *f;

	snprintf(path, cap, "/tmp/odpd-test.%d.%s.conf", (int)getpid(), tag);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	chmod(path, 0644);                       /* odpd may run as another user */
	daemon_start(d, args);
}

int harness_group_setup_conf(const char *text)
{
	daemon_start_conf(&test_daemon, conf_path, sizeof(conf_path), "group", text, NULL, NULL);
	test_admin_fd = raw_connect_hello(test_daemon.sock);
	return 0;
}

int run_as(uid_t uid, rlim_t memlock, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int st;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = { memlock, memlock };
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (setrlimit(RLIMIT_MEMLOCK, &rl) < 0 || setgroups(0, NULL) < 0 ||
		    setgid(uid) < 0 || setuid(uid) < 0)
			_exit(90);
		_exit(fn(arg));
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

int harness_group_teardown(void **state)
{
	(void)state;
	if (test_daemon.pid > 0)                 /* an earlier failure: just stop it */
		kill(test_daemon.pid, SIGKILL);
	if (conf_path[0])
		unlink(conf_path);
	return 0;
}

/* ---------------------------------------------------------------- tools */

static char bus_dir[64];
char bus_addr[160];
pid_t bus_pid;

/* dbus-daemon on bus_dir's configuration; wait for its socket. */
static void bus_spawn(void)
{
	char conf[128], sock[128];

	snprintf(conf, sizeof(conf), "%s/bus.conf", bus_dir);
	snprintf(sock, sizeof(sock), "%s/bus", bus_dir);
	bus_pid = fork();
	assert_true(bus_pid >= 0);
	if (bus_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execlp("dbus-daemon", "dbus-daemon", "--nofork", "--nopidfile", "--config-file", conf,
		       (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 200 && access(sock, F_OK) != 0; i++)
		usleep(50000);
	assert_int_equal(access(sock, F_OK), 0);
}

void bus_start(void)
{
	const char *policy = getenv("ODPD_TEST_BUS_POLICY");
	char conf[128], sock[128];
	FILE *f;

	assert_non_null(policy);
	snprintf(bus_dir, sizeof(bus_dir), "/tmp/odpd-bus.XXXXXX");
	assert_non_null(mkdtemp(bus_dir));
	chmod(bus_dir, 0755);
	snprintf(conf, sizeof(conf), "%s/bus.conf", bus_dir);
	snprintf(sock, sizeof(sock), "%s/bus", bus_dir);
	f = fopen(conf, "w");
	assert_non_null(f);
	/* A system bus's usual default policy, in short: nobody owns names or
	 * calls methods unless a rule says so; replies and the bus driver pass. */
	fprintf(f,
		"<busconfig>\n"
		" <type>system</type>\n"
		" <listen>unix:path=%s</listen>\n"
		" <auth>EXTERNAL</auth>\n"
		" <policy context=\"default\">\n"
		"  <allow user=\"*\"/>\n"
		"  <deny own=\"*\"/>\n"
		"  <deny send_type=\"method_call\"/>\n"
		"  <allow send_type=\"signal\"/>\n"
		"  <allow send_requested_reply=\"true\" send_type=\"method_return\"/>\n"
		"  <allow send_requested_reply=\"true\" send_type=\"error\"/>\n"
		"  <allow receive_type=\"method_call\"/>\n"
		"  <allow receive_type=\"method_return\"/>\n"
		"  <allow receive_type=\"error\"/>\n"
		"  <allow receive_type=\"signal\"/>\n"
		"  <allow send_destination=\"org.freedesktop.DBus\"/>\n"
		" </policy>\n"
		" <policy user=\"daemon\">\n"
		"  <allow send_destination=\"org.odpd1\" send_interface=\"org.odpd1.Manager\" send_member=\"Flush\"/>\n"
		" </policy>\n"
		" <include>%s</include>\n"
		"</busconfig>\n", sock, policy);
	fclose(f);
	bus_spawn();
	snprintf(bus_addr, sizeof(bus_addr), "unix:path=%s", sock);
	/* odpd (daemon_start) connects there instead of the system bus */
	setenv("DBUS_SYSTEM_BUS_ADDRESS", bus_addr, 1);
}

void bus_restart(void)
{
	char sock[128];

	assert_int_equal(bus_pid, 0);
	snprintf(sock, sizeof(sock), "%s/bus", bus_dir);
	unlink(sock);                          /* the dead one's */
	bus_spawn();
}

void bus_stop(void)
{
	char path[160];

	unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
	if (bus_pid > 0) {
		kill(bus_pid, SIGTERM);
		waitpid(bus_pid, NULL, 0);
	}
	bus_pid = 0;
	snprintf(path, sizeof(path), "%s/bus.conf", bus_dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/bus", bus_dir);
	unlink(path);
	rmdir(bus_dir);
}

/* Run @argv as @uid (0: as we are); its stdout and stderr in @out. Returns
 * its exit status. */
int run_tool(uid_t uid, char *out, size_t cap, const char *const *argv)
{
	int pfd[2], st;
	size_t len = 0;
	ssize_t k;
	pid_t pid;

	assert_int_equal(pipe(pfd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		if (uid && (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
			    setresuid(uid, uid, uid) < 0))
			_exit(126);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	while (len + 1 < cap && (k = read(pfd[0], out + len, cap - 1 - len)) > 0)
		len += (size_t)k;
	out[len] = 0;
	close(pfd[0]);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int run_cmd(const char *cmd, int timeout_s)
{
	pid_t pid = fork();
	int st;

	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < timeout_s * 10; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(100000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* The first rxe link and its netdev, from `rdma link show`. */
void rdma_link(char *dev, char *netdev)
{
	FILE *p = popen("rdma link show", "r");
	char line[512];
	bool found = false;

	assert_non_null(p);
	while (!found && fgets(line, sizeof(line), p)) {
		const char *nd = strstr(line, " netdev ");
		found = sscanf(line, "link %63[^/]/", dev) == 1 && nd && sscanf(nd, " netdev %63s", netdev) == 1;
	}
	pclose(p);
	assert_true(found);
}

bool kernel_holds(void *arg)
{
	const struct kernel_want *w = arg;

	return kernel_mr_count(w->pid) == w->mrs;
}

void raw_verify_begin(int conn, uint64_t id, Odpd__Verify *v, const struct kernel_want *kw,
		      struct timespec *t0)
{
	Odpd__Request req = ODPD__REQUEST__INIT;

	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = v;
	req.has_id = 1;
	req.id = id;
	clock_gettime(CLOCK_MONOTONIC, t0);
	raw_send(conn, &req, NULL, 0);
	if (!wait_until(kernel_holds, (void *)kw))
		fail_msg("the verify's bounce buffer never appeared: odpd holds %d MRs (want %d)",
			 kernel_mr_count(kw->pid), kw->mrs);
}

double secs_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

bool hit_revoked(void *arg)
{
	const _Atomic uint64_t *gen = arg;

	return atomic_load(&gen[0]) != 0;
}

void raw_open_hit_table(int fd, uint64_t id, uint32_t slots, int *use_fd, _Atomic uint64_t **use,
			int *gen_fd, const _Atomic uint64_t **gen)
{
	raw_open_hit_table_ring(fd, id, slots, 0, use_fd, use, gen_fd, gen);
}

uint32_t raw_open_hit_table_ring(int fd, uint64_t id, uint32_t slots, uint32_t ring, int *use_fd,
				 _Atomic uint64_t **use, int *gen_fd, const _Atomic uint64_t **gen)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__OpenHitTable o = ODPD__OPEN_HIT_TABLE__INIT;
	Odpd__Reply *r;
	uint32_t granted;

	*use_fd = sealed_memfd(4096);
	*gen_fd = -1;
	o.has_slots = 1;
	o.slots = slots;
	o.has_release_ring = ring != 0;
	o.release_ring = ring;
	req.body_case = ODPD__REQUEST__BODY_OPEN_HIT_TABLE;
	req.open_hit_table = &o;
	r = raw_call_fd(fd, id, &req, use_fd, 1, gen_fd);
	assert_int_equal(r->status, 0);
	granted = r->hit_table->has_release_ring ? r->hit_table->release_ring : 0;
	odpd__reply__free_unpacked(r, NULL);
	assert_true(*gen_fd >= 0);
	*use = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, *use_fd, 0);
	*gen = mmap(NULL, 4096, PROT_READ, MAP_SHARED, *gen_fd, 0);
	assert_true(*use != MAP_FAILED && *gen != MAP_FAILED);
	return granted;
}
