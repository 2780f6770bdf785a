/* SPDX-License-Identifier: MIT */
/*
 * Client-PD mode (the librdmacm mirror) on real rxe verbs over rdma_cm, in
 * the VM: odpd_reg_msgs / odpd_reg_read / odpd_reg_write register into the
 * rdma_cm_id's own PD (the daemon imports the id's context and PD, the
 * library imports the MR). In the `testbed` profile (rdma-core 65 with the
 * rxe import patch) that works and must interoperate with rdma-core's
 * unmodified rdma_server and rdma_client (Debian's rdmacm-utils); in `stock`
 * (rdma-core 44) the mirror answers EOPNOTSUPP and registers nothing.
 *
 * The rdma_cm sides run in child processes (tests/cm-peer, and rdma_server /
 * rdma_client), each with its own default connection to the test daemon;
 * they report on a pipe and wait for "go" where the test looks at the
 * kernel. Every child and pipe is reaped and closed by the test's teardown,
 * whatever path the test took. That an MR exists, in which PD, and that it
 * is gone, is judged from the kernel's side (rdma resource show mr / pd).
 *
 * Needs ODPD_VM_CM_ADDR (the VM's rxe0 on dummy0): without it the rdma_cm
 * tests skip with a message. The refusal of an fd that is not a uverbs
 * device needs no device and runs in the host suite too.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <json-c/json.h>
#include <infiniband/verbs.h>

#include "harness.h"

#define UID_NOBODY 65534
#define LINE_TIMEOUT_MS 60000        /* TCG: a verb can take seconds */
#define ZEROS16 "00000000000000000000000000000000"

static const char *cm_addr;

/* ---------------------------------------------------------------- child processes */

struct proc {
	pid_t pid;                   /* 0: slot free; -1: reaped */
	int in;                      /* its stdin (write end), or -1 */
	int out;                     /* its stdout (read end), or -1 at EOF */
	int child_in, child_out;     /* the child's ends, until it has them */
	int status;                  /* once reaped */
	char name[48];
	char buf[4096];              /* unread bytes of out */
	size_t len;
	char log[16384];             /* everything it wrote, for failure messages */
	size_t log_len;
};

static struct proc procs[6];

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

struct spawn_opts {
	bool tool;                   /* stderr into the pipe too, stdin /dev/null */
	uid_t uid;                   /* 0: stay root; else this uid and gid... */
	const gid_t *groups;         /* ...with these supplementary groups */
	int ngroups;
	const char *sock;            /* ODPD_SOCKET (NULL: the test daemon's) */
	bool system_libs;            /* drop LD_LIBRARY_PATH: the system's rdma-core */
};

/*
 * Start @argv with its stdout (and, for a tool, stderr) on a pipe to us and,
 * unless a tool, its stdin on a pipe from us. Pipes are close-on-exec here,
 * so no child holds another's ends (a peer sees EOF when we close its stdin).
 * Every fd is in @p from the moment it exists, for procs_cleanup().
 */
static struct proc *spawn(const char *name, const char *const *argv, const struct spawn_opts *o)
{
	struct proc *p = NULL;
	pid_t parent = getpid();
	int in[2], out[2];

	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]) && !p; i++)
		if (procs[i].pid == 0)
			p = &procs[i];
	assert_non_null(p);
	memset(p, 0, sizeof(*p));
	p->pid = -1;                                 /* in use, nothing to reap yet */
	p->in = p->out = p->child_in = p->child_out = -1;
	snprintf(p->name, sizeof(p->name), "%s", name);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	p->out = out[0];
	p->child_out = out[1];
	if (!o->tool) {
		assert_int_equal(pipe2(in, O_CLOEXEC), 0);
		p->child_in = in[0];
		p->in = in[1];
	}
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

		if (dup2(o->tool ? null : p->child_in, 0) < 0 || dup2(p->child_out, 1) < 0 ||
		    (o->tool && dup2(p->child_out, 2) < 0))
			_exit(126);
		setenv("ODPD_SOCKET", o->sock ? o->sock : test_daemon.sock, 1);
		if (o->system_libs)
			unsetenv("LD_LIBRARY_PATH");
		if (o->uid && (setgroups((size_t)o->ngroups, o->groups) < 0 || setgid(o->uid) < 0 ||
			       setuid(o->uid) < 0))
			_exit(125);
		/* after setuid, which clears it: a test that dies takes its children along */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(124);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(p->child_out);
	p->child_out = -1;
	if (p->child_in >= 0) {
		close(p->child_in);
		p->child_in = -1;
	}
	return p;
}

/* Read what @p wrote, waiting up to @ms; false at EOF or timeout. */
static bool proc_read(struct proc *p, int ms)
{
	struct pollfd pfd = { .fd = p->out, .events = POLLIN };
	ssize_t n;

	if (p->out < 0 || poll(&pfd, 1, ms) != 1)
		return false;
	n = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
	if (n <= 0) {
		close(p->out);
		p->out = -1;
		return false;
	}
	if (p->log_len + (size_t)n < sizeof(p->log)) {
		memcpy(p->log + p->log_len, p->buf + p->len, (size_t)n);
		p->log_len += (size_t)n;
		p->log[p->log_len] = 0;
	}
	p->len += (size_t)n;
	p->buf[p->len] = 0;
	return true;
}

/*
 * The next line of @p that starts with the word @word, into @line (other
 * lines are skipped: they stay in the log). A "fail ..." line, EOF or 60 s
 * without it fail the test with what the child wrote.
 */
static void proc_expect(struct proc *p, const char *word, char *line, size_t cap)
{
	long deadline = now_ms() + LINE_TIMEOUT_MS;
	size_t wl = strlen(word);

	for (;;) {
		char *nl = memchr(p->buf, '\n', p->len);
		if (nl) {
			size_t ll = (size_t)(nl - p->buf);
			bool match = !wl || (ll >= wl && !memcmp(p->buf, word, wl) &&
					     (ll == wl || p->buf[wl] == ' '));
			bool failed = ll >= 5 && !memcmp(p->buf, "fail ", 5);
			snprintf(line, cap, "%.*s", (int)ll, p->buf);
			memmove(p->buf, nl + 1, p->len - ll - 1);
			p->len -= ll + 1;
			if (failed)
				fail_msg("%s (pid %d) failed: %s\n--- its output:\n%s", p->name, (int)p->pid, line,
					 p->log);
			if (match)
				return;
			continue;
		}
		long left = deadline - now_ms();
		if (left <= 0 || !proc_read(p, (int)left))
			fail_msg("%s (pid %d): %s before a '%s' line\n--- its output:\n%s", p->name, (int)p->pid,
				 p->out < 0 ? "EOF" : "60 s passed", word, p->log);
	}
}

static void proc_go(struct proc *p)
{
	assert_int_equal(write(p->in, "go\n", 3), 3);
}

static void proc_cmd(struct proc *p, const char *cmd, char *line, size_t cap)
{
	size_t n = strlen(cmd);

	assert_int_equal(write(p->in, cmd, n), (ssize_t)n);
	assert_int_equal(write(p->in, "\n", 1), 1);
	for (;;) {
		proc_expect(p, "", line, cap);
		if (!strncmp(line, "ok", 2) || !strncmp(line, "err", 3))
			return;
	}
}

/* Wait (up to 60 s, reading its output) until @p exits; its wait status. */
static int proc_wait(struct proc *p)
{
	long deadline = now_ms() + LINE_TIMEOUT_MS;
	int st;

	if (p->pid < 0)
		return p->status;
	if (p->in >= 0) {
		close(p->in);
		p->in = -1;
	}
	while (waitpid(p->pid, &st, WNOHANG) == 0) {
		if (now_ms() > deadline) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &st, 0);
			p->pid = -1;
			fail_msg("%s did not exit within 60 s\n--- its output:\n%s", p->name, p->log);
		}
		if (!proc_read(p, 50) && p->out < 0)
			sleep_ms(20);
	}
	while (proc_read(p, 0))
		;
	p->pid = -1;
	p->status = st;
	return st;
}

/* Require that @p exited with status 0. */
static void proc_exit_ok(struct proc *p)
{
	int st = proc_wait(p);

	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("%s: %s %d\n--- its output:\n%s", p->name, WIFEXITED(st) ? "exit status" : "signal",
			 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), p->log);
}

/* Kill and reap every child still running, close every pipe: each test's teardown. */
static void procs_cleanup(void)
{
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		struct proc *p = &procs[i];

		if (p->pid > 0) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
		}
		if (p->pid != 0) {                   /* a slot in use: its fds are real */
			int fds[] = { p->in, p->out, p->child_in, p->child_out };
			for (size_t j = 0; j < sizeof(fds) / sizeof(fds[0]); j++)
				if (fds[j] >= 0)
					close(fds[j]);
		}
		memset(p, 0, sizeof(*p));
	}
}

/* fds and a verbs context a test opened in this process: closed by the
 * teardown on every path. */
static int tracked[16];
static unsigned n_tracked;
static struct {
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
} verbs;

static int track_fd(int fd)
{
	assert_true(fd >= 0);
	assert_true(n_tracked < sizeof(tracked) / sizeof(tracked[0]));
	tracked[n_tracked++] = fd;
	return fd;
}

static void close_tracked(void)
{
	while (n_tracked)
		close(tracked[--n_tracked]);
}

static void verbs_cleanup(void)
{
	if (verbs.pd && ibv_dealloc_pd(verbs.pd))
		fprintf(stderr, "test-cm: ibv_dealloc_pd: %s\n", strerror(errno));
	if (verbs.ctx)
		ibv_close_device(verbs.ctx);
	if (verbs.list)
		ibv_free_device_list(verbs.list);
	memset(&verbs, 0, sizeof(verbs));
}

/* A second odpd a test started (test_remote_access_policy), stopped by the
 * teardown if the test did not get to stop it. */
static struct test_daemon extra_daemon;

static int cm_teardown(void **state)
{
	(void)state;
	procs_cleanup();
	close_tracked();
	verbs_cleanup();
	if (extra_daemon.pid > 0) {
		kill(extra_daemon.pid, SIGKILL);
		waitpid(extra_daemon.pid, NULL, 0);
		extra_daemon.pid = 0;
		unlink(extra_daemon.sock);
		rmdir(extra_daemon.dir);
	}
	return 0;
}

/* ---------------------------------------------------------------- report lines */

/* The value of key=VALUE in @line (up to the next space), or fail. */
static const char *field(const char *line, const char *key, char *val, size_t cap)
{
	size_t kl = strlen(key);

	for (const char *s = line; (s = strstr(s, key)); s++) {
		if ((s == line || s[-1] == ' ') && s[kl] == '=') {
			size_t n = strcspn(s + kl + 1, " ");
			snprintf(val, cap, "%.*s", (int)n, s + kl + 1);
			return val;
		}
	}
	fail_msg("no %s= in \"%s\"", key, line);
	return NULL;
}

static uint64_t field_u64(const char *line, const char *key)
{
	char v[64];

	return strtoull(field(line, key, v, sizeof(v)), NULL, 0);
}

static bool field_is(const char *line, const char *key, const char *want)
{
	char v[256];

	return strcmp(field(line, key, v, sizeof(v)), want) == 0;
}

/* A mirror MR as a peer reported it ("mr ..." or "ok mr=N ..."). */
struct peer_mr {
	uint64_t addr, want_addr;
	uint64_t length, want_length;
	uint32_t lkey, rkey;
};

/* Parse and check what rdma_reg_msgs(3) would give: the caller's address and
 * length, the id's PD and context. */
static struct peer_mr mr_line(const char *line)
{
	struct peer_mr m = {
		.addr = field_u64(line, "addr"), .want_addr = field_u64(line, "want_addr"),
		.length = field_u64(line, "length"), .want_length = field_u64(line, "want_length"),
		.lkey = (uint32_t)field_u64(line, "lkey"), .rkey = (uint32_t)field_u64(line, "rkey"),
	};

	if (m.addr != m.want_addr || m.length != m.want_length || !field_is(line, "pd", "1") ||
	    !field_is(line, "ctx", "1") || m.lkey == 0)
		fail_msg("the mirror's ibv_mr is not what rdma_reg_msgs would give: %s", line);
	return m;
}

/* ---------------------------------------------------------------- the kernel's view */

struct kmr {
	uint32_t mrlen;
	int pid;                     /* the task that created it */
	unsigned pdn;
	char comm[32];
};

static json_object *rdma_res(const char *what)
{
	static char out[1 << 20];
	char cmd[64];
	size_t len;
	FILE *p;
	json_object *arr;

	snprintf(cmd, sizeof(cmd), "rdma -j resource show %s 2>&1", what);
	p = popen(cmd, "r");
	assert_non_null(p);
	len = fread(out, 1, sizeof(out) - 1, p);
	out[len] = 0;
	if (pclose(p) != 0)
		fail_msg("%s: %s", cmd, out);
	arr = json_tokener_parse(out);
	if (!arr || !json_object_is_type(arr, json_type_array))
		fail_msg("%s: not a JSON array: %s", cmd, out);
	return arr;
}

static const char *jstr(json_object *o, const char *key)
{
	json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "";
}

static int64_t jint(json_object *o, const char *key)
{
	json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -1;
}

/* Is the kernel MR with lkey @lkey registered (rdma resource show mr)? */
static bool kernel_mr(uint32_t lkey, struct kmr *ret)
{
	json_object *arr = rdma_res("mr");
	bool found = false;

	for (size_t i = 0; i < json_object_array_length(arr) && !found; i++) {
		json_object *o = json_object_array_get_idx(arr, i);
		/* keys are hex strings without 0x */
		if (strtoul(jstr(o, "lkey"), NULL, 16) != lkey || !*jstr(o, "lkey"))
			continue;
		found = true;
		if (ret) {
			ret->mrlen = (uint32_t)jint(o, "mrlen");
			ret->pid = (int)jint(o, "pid");
			ret->pdn = (unsigned)jint(o, "pdn");
			snprintf(ret->comm, sizeof(ret->comm), "%s", jstr(o, "comm"));
		}
	}
	json_object_put(arr);
	return found;
}

/* The pid of the process whose PD @pdn is (rdma resource show pd). */
static int kernel_pd_pid(unsigned pdn)
{
	json_object *arr = rdma_res("pd");
	int pid = -1;

	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *o = json_object_array_get_idx(arr, i);
		if (jint(o, "pdn") == (int64_t)pdn)
			pid = (int)jint(o, "pid");
	}
	json_object_put(arr);
	return pid;
}

static uid_t uid_of(pid_t pid)
{
	char path[64], l[256];
	unsigned uid = (unsigned)-1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(l, sizeof(l), f))
		if (sscanf(l, "Uid: %u", &uid) == 1)
			break;
	fclose(f);
	return (uid_t)uid;
}

/* How many PDs the kernel holds that @pid made (rdma resource show pd). */
static int kernel_pds_of(pid_t pid)
{
	json_object *arr = rdma_res("pd");
	int n = 0;

	for (size_t i = 0; i < json_object_array_length(arr); i++)
		n += jint(json_object_array_get_idx(arr, i), "pid") == pid;
	json_object_put(arr);
	return n;
}

static bool is_thread_of(pid_t pid, int tid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)pid, tid);
	return access(path, F_OK) == 0;
}

/*
 * The MR with @m's lkey is in the kernel's table, registered by odpd (one
 * of its worker threads made it) over the page-rounded range, and lives in
 * a PD of @owner, the client: client-PD mode.
 */
static void assert_client_pd_mr(const struct peer_mr *m, pid_t owner)
{
	uint64_t first = m->want_addr & ~4095ull, end = (m->want_addr + m->want_length + 4095) & ~4095ull;
	struct kmr k;

	if (!kernel_mr(m->lkey, &k))
		fail_msg("lkey %#x is not in the kernel's MR table", m->lkey);
	assert_int_equal(k.mrlen, end - first);
	if (!is_thread_of(test_daemon.pid, k.pid))
		fail_msg("MR lkey %#x was made by pid %d (%s), not by odpd (%d)", m->lkey, k.pid, k.comm,
			 (int)test_daemon.pid);
	assert_int_equal(kernel_pd_pid(k.pdn), owner);
}

static void assert_kernel_mr_gone(uint32_t lkey)
{
	if (kernel_mr(lkey, NULL))
		fail_msg("lkey %#x is still in the kernel's MR table", lkey);
}

/*
 * After a client-PD registration is released: no MR, pin or segment change
 * against @a. odpd's fds are not compared: odpd may keep its copy of the
 * client's context (the cmd_fd) until the client disconnects (doc/design.md §4.2),
 * and that is checked once the client is gone (snapshot_settles_to).
 */
static void assert_released_but_ctx(const struct snapshot *a)
{
	struct snapshot b;

	snapshot_take(&test_daemon, test_admin_fd, &b);
	assert_int_equal(a->segments, b.segments);
	assert_int_equal(a->segment_bytes, b.segment_bytes);
	assert_int_equal(a->mrs, b.mrs);
	assert_int_equal(a->pinned_bytes, b.pinned_bytes);
	assert_int_equal(a->kernel_mrs, b.kernel_mrs);
	assert_int_equal(a->vmpin_kb, b.vmpin_kb);
}

/* odpd's count of MRs (admin Status). */
static unsigned daemon_mrs(void)
{
	Odpd__Reply *r;
	unsigned n = status_get(test_admin_fd, &r)->mrs;

	odpd__reply__free_unpacked(r, NULL);
	return n;
}

/* ---------------------------------------------------------------- preconditions */

static const char *peer_path(void)
{
	static char path[4096];
	const char *e = getenv("ODPD_TEST_CM_PEER");
	ssize_t n;

	if (e)
		return e;
	n = readlink("/proc/self/exe", path, sizeof(path) - 16);
	assert_true(n > 0);
	path[n] = 0;
	strcpy(strrchr(path, '/') + 1, "cm-peer");
	return path;
}

/*
 * Skip, with a message, where rdma_cm cannot run: no ODPD_VM_CM_ADDR, no
 * device (a failure with ODPD_TEST_REQUIRE_DEVICE=1), or (@testbed_only)
 * the stock profile, where the mirror cannot import.
 */
static void cm_require(const char *test, bool testbed_only)
{
	Odpd__Reply *r;
	size_t ndev;

	cm_addr = test_cm_addr();
	if (!cm_addr) {
		fprintf(stderr, "test-cm: %s skipped: ODPD_VM_CM_ADDR is not set (rdma_cm needs the VM's "
			"rxe0 on dummy0: tests/vm/rxe-vm)\n", test);
		skip();
	}
	ndev = status_get(test_admin_fd, &r)->n_devices;
	odpd__reply__free_unpacked(r, NULL);
	if (ndev == 0) {
		if (test_require_device())
			fail_msg("odpd has no RDMA device (ODPD_TEST_REQUIRE_DEVICE=1)");
		fprintf(stderr, "test-cm: %s skipped: odpd has no RDMA device\n", test);
		skip();
	}
	if (testbed_only && !test_profile_testbed()) {
		fprintf(stderr, "test-cm: %s skipped: needs the testbed profile (ODPD_VM_PROFILE=testbed: "
			"import on rxe); the stock profile's EOPNOTSUPP is test_mirror_by_profile's\n", test);
		skip();
	}
}

/* The file @pid maps whose name contains @lib (e.g. "libibverbs.so"), or "". */
static const char *mapped_lib(pid_t pid, const char *lib, char *out, size_t cap)
{
	char path[64], l[4096];
	FILE *f;

	*out = 0;
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (!*out && fgets(l, sizeof(l), f)) {
		char *name = strchr(l, '/');
		if (name && strstr(name, lib))
			snprintf(out, cap, "%.*s", (int)strcspn(name, "\n"), name);
	}
	fclose(f);
	return out;
}

/*
 * In the testbed profile, @p must run on the testbed's libibverbs (under
 * ODPD_VM_RDMA_CORE), not the system's rdma-core 44, which cannot import:
 * otherwise its failures would be about the wrong library.
 */
static void assert_testbed_libs(const struct proc *p)
{
	const char *prefix = getenv("ODPD_VM_RDMA_CORE");
	char lib[4096];

	if (!test_profile_testbed())
		return;
	assert_non_null(prefix);
	mapped_lib(p->pid, "libibverbs.so", lib, sizeof(lib));
	if (strncmp(lib, prefix, strlen(prefix)) != 0)
		fail_msg("%s (pid %d) runs on libibverbs \"%s\", not the testbed's under %s: is that "
			 "prefix readable by every user in the VM (uid %d)? The system's rdma-core 44 "
			 "cannot import on rxe", p->name, (int)p->pid, lib, prefix, (int)uid_of(p->pid));
}

/* Debian's rdmacm-utils program @name (tests/deps installs them). */
static const char *tool_path(const char *name)
{
	static char path[256];

	snprintf(path, sizeof(path), "/usr/bin/%s", name);
	if (access(path, X_OK) != 0) {
		if (test_require_device())
			fail_msg("%s not found: install rdmacm-utils (tests/deps)", path);
		fprintf(stderr, "test-cm: %s not found (rdmacm-utils): skipped\n", path);
		skip();
	}
	return path;
}

/* Wait until rdma_server @p listens on @port (rdma resource show cm_id),
 * or fail if it exits first. */
static void wait_listening(struct proc *p, const char *port)
{
	char want[32];

	snprintf(want, sizeof(want), ":%s", port);
	for (long deadline = now_ms() + LINE_TIMEOUT_MS; now_ms() < deadline; sleep_ms(50)) {
		json_object *arr = rdma_res("cm_id");
		bool up = false;

		for (size_t i = 0; i < json_object_array_length(arr) && !up; i++) {
			json_object *o = json_object_array_get_idx(arr, i);
			const char *src = jstr(o, "src-addr");
			size_t n = strlen(src);
			up = jint(o, "pid") == p->pid && !strcmp(jstr(o, "state"), "LISTEN") &&
			     n > strlen(want) && !strcmp(src + n - strlen(want), want);
		}
		json_object_put(arr);
		if (up)
			return;
		while (proc_read(p, 0))
			;
		if (waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
			p->pid = -1;
			fail_msg("%s exited before it listened\n--- its output:\n%s", p->name, p->log);
		}
	}
	fail_msg("%s did not listen on port %s within 60 s\n--- its output:\n%s", p->name, port, p->log);
}

/* ---------------------------------------------------------------- tests */

/*
 * Our client (cm-peer client: rdma_client's exchange, buffers from
 * odpd_alloc registered with odpd_reg_msgs) against Debian's unmodified
 * rdma_server: the MRs are what rdma_reg_msgs gives, live in the id's own PD
 * in the kernel while registered, carry the messages both ways, and are gone
 * from the kernel after odpd_dereg_mr.
 */
static void test_client_against_rdma_server(void **state)
{
	const char *port = "7471";
	char line[512];
	struct proc *srv, *cli;
	struct peer_mr recv, send;
	unsigned mrs0;

	(void)state;
	cm_require("test_client_against_rdma_server", true);
	{
		const char *argv[] = { tool_path("rdma_server"), "-s", cm_addr, "-p", port, NULL };
		const struct spawn_opts o = { .tool = true };
		srv = spawn("rdma_server", argv, &o);
	}
	wait_listening(srv, port);
	assert_testbed_libs(srv);              /* Debian's program on the 65 libraries */
	mrs0 = daemon_mrs();
	{
		const char *argv[] = { peer_path(), "client", cm_addr, port, NULL };
		const struct spawn_opts o = { 0 };
		cli = spawn("cm-peer client", argv, &o);
	}
	proc_expect(cli, "ref", line, sizeof(line));
	uint64_t ref_addr = field_u64(line, "addr"), ref_length = field_u64(line, "length");
	proc_expect(cli, "mr", line, sizeof(line));
	recv = mr_line(line);
	proc_expect(cli, "mr", line, sizeof(line));
	send = mr_line(line);
	/* rdma_reg_msgs on the same buffer gave the same address and length */
	assert_int_equal(recv.addr, ref_addr);
	assert_int_equal(recv.length, ref_length);
	assert_int_equal(recv.length, 16);
	assert_int_not_equal(recv.lkey, send.lkey);
	proc_expect(cli, "registered", line, sizeof(line));
	assert_client_pd_mr(&recv, cli->pid);
	assert_client_pd_mr(&send, cli->pid);
	assert_int_equal(daemon_mrs(), mrs0 + 2);

	proc_go(cli);
	proc_expect(cli, "exchanged", line, sizeof(line));
	/* rdma_server sends its 16 zero bytes into our 0xa5-filled buffer */
	assert_int_equal(field_u64(line, "byte_len"), 16);
	if (!field_is(line, "recv", ZEROS16))
		fail_msg("rdma_server's message did not arrive through the mirror MR: %s", line);
	proc_expect(cli, "deregistered", line, sizeof(line));
	/* gone from the kernel while the client still runs */
	assert_kernel_mr_gone(recv.lkey);
	assert_kernel_mr_gone(send.lkey);
	assert_int_equal(daemon_mrs(), mrs0);
	proc_go(cli);
	proc_exit_ok(cli);
	/* rdma_server exits 0 only after our message arrived and its reply was sent */
	proc_exit_ok(srv);
	if (!strstr(srv->log, "rdma_server: end 0"))
		fail_msg("rdma_server:\n%s", srv->log);
}

/* Our server (cm-peer server: rdma_server's exchange through the mirror)
 * against Debian's unmodified rdma_client. */
static void test_server_against_rdma_client(void **state)
{
	const char *port = "7472";
	char line[512];
	struct proc *srv, *cli;
	struct peer_mr recv, send;

	(void)state;
	cm_require("test_server_against_rdma_client", true);
	{
		const char *argv[] = { peer_path(), "server", cm_addr, port, NULL };
		const struct spawn_opts o = { 0 };
		srv = spawn("cm-peer server", argv, &o);
	}
	proc_expect(srv, "listening", line, sizeof(line));
	{
		const char *argv[] = { tool_path("rdma_client"), "-s", cm_addr, "-p", port, NULL };
		const struct spawn_opts o = { .tool = true };
		cli = spawn("rdma_client", argv, &o);
	}
	proc_expect(srv, "mr", line, sizeof(line));
	recv = mr_line(line);
	assert_int_equal(recv.length, 16);
	proc_expect(srv, "mr", line, sizeof(line));
	send = mr_line(line);
	proc_expect(srv, "received", line, sizeof(line));
	assert_int_equal(field_u64(line, "byte_len"), 16);
	if (!field_is(line, "recv", ZEROS16))
		fail_msg("rdma_client's message did not arrive through the mirror MR: %s", line);
	proc_expect(srv, "exchanged", line, sizeof(line));
	assert_client_pd_mr(&recv, srv->pid);
	assert_client_pd_mr(&send, srv->pid);
	/* rdma_client exits 0 only after its send and a receive of our message completed */
	proc_exit_ok(cli);
	if (!strstr(cli->log, "rdma_client: end 0"))
		fail_msg("rdma_client:\n%s", cli->log);
	proc_go(srv);
	proc_expect(srv, "deregistered", line, sizeof(line));
	assert_kernel_mr_gone(recv.lkey);
	assert_kernel_mr_gone(send.lkey);
	proc_go(srv);
	proc_exit_ok(srv);
}

/*
 * RDMA WRITE and READ between two processes over rdma_cm through
 * odpd_reg_write / odpd_reg_read MRs: the target sends its buffer's address
 * and the two rkeys; the initiator writes the first half, reads the whole
 * buffer back (the second half holds the target's own bytes), and its WRITE
 * through the read-only MR's rkey is refused. The target checks its bytes in
 * its own mapping.
 */
static void test_rdma_write_read(void **state)
{
	const char *port = "7473";
	char line[512];
	struct proc *tgt, *ini;
	struct peer_mr wmr, rmr, msg;

	(void)state;
	cm_require("test_rdma_write_read", true);
	{
		const char *argv[] = { peer_path(), "target", cm_addr, port, "65536", NULL };
		const struct spawn_opts o = { 0 };
		tgt = spawn("cm-peer target", argv, &o);
	}
	proc_expect(tgt, "listening", line, sizeof(line));
	{
		const char *argv[] = { peer_path(), "initiator", cm_addr, port, NULL };
		const struct spawn_opts o = { 0 };
		ini = spawn("cm-peer initiator", argv, &o);
	}
	proc_expect(tgt, "mr", line, sizeof(line));
	assert_true(field_is(line, "name", "write"));
	wmr = mr_line(line);
	proc_expect(tgt, "mr", line, sizeof(line));
	assert_true(field_is(line, "name", "read"));
	rmr = mr_line(line);
	proc_expect(tgt, "mr", line, sizeof(line));
	msg = mr_line(line);
	assert_int_equal(wmr.length, 65536);
	assert_int_equal(rmr.addr, wmr.addr);
	assert_int_not_equal(wmr.rkey, rmr.rkey);
	assert_client_pd_mr(&wmr, tgt->pid);
	assert_client_pd_mr(&rmr, tgt->pid);

	proc_expect(tgt, "sent", line, sizeof(line));
	proc_expect(ini, "got", line, sizeof(line));
	assert_int_equal(field_u64(line, "addr"), wmr.addr);
	assert_int_equal(field_u64(line, "length"), 65536);
	assert_int_equal(field_u64(line, "write_rkey"), wmr.rkey);
	assert_int_equal(field_u64(line, "read_rkey"), rmr.rkey);
	proc_expect(ini, "rw", line, sizeof(line));
	if (!field_is(line, "read", "ok"))
		fail_msg("RDMA READ did not return the bytes written and the target's own: %s", line);
	proc_expect(ini, "denied", line, sizeof(line));
	if (!strstr(line, "status=remote access error"))
		fail_msg("an RDMA WRITE through the odpd_reg_read MR was not refused: %s", line);

	/* the initiator is done (it waits in rdma_disconnect for the target) */
	proc_go(tgt);
	proc_expect(tgt, "checked", line, sizeof(line));
	if (!field_is(line, "first", "ok") || !field_is(line, "second", "ok"))
		fail_msg("the target's own mapping does not hold the expected bytes: %s", line);
	proc_expect(tgt, "deregistered", line, sizeof(line));
	assert_kernel_mr_gone(wmr.lkey);
	assert_kernel_mr_gone(rmr.lkey);
	assert_kernel_mr_gone(msg.lkey);
	proc_go(tgt);
	proc_exit_ok(tgt);
	proc_expect(ini, "deregistered", line, sizeof(line));
	proc_go(ini);
	proc_exit_ok(ini);
}

static struct proc *drive(const char *name, const struct spawn_opts *o, char *line, size_t cap)
{
	const char *argv[] = { peer_path(), "drive", cm_addr, NULL };
	struct proc *p = spawn(name, argv, o);

	proc_expect(p, "ready", line, cap);
	return p;
}

/* "quit": the peer deregisters what it still holds, frees its PD and exits 0. */
static void drive_quit(struct proc *p)
{
	assert_int_equal(write(p->in, "quit\n", 5), 5);
	proc_exit_ok(p);
}

static void expect_err(struct proc *p, const char *cmd, const char *err, const char *msg_part)
{
	char line[512];

	proc_cmd(p, cmd, line, sizeof(line));
	if (strncmp(line, "err", 3) || !field_is(line, "errno", err) || !strstr(line, msg_part))
		fail_msg("%s: '%s': expected %s (\"%s\"), got: %s", p->name, cmd, err, msg_part, line);
}

static struct peer_mr expect_ok(struct proc *p, const char *cmd)
{
	char line[512];

	proc_cmd(p, cmd, line, sizeof(line));
	if (strncmp(line, "ok", 2))
		fail_msg("%s: '%s': %s", p->name, cmd, line);
	return mr_line(line);
}

static void expect_dereg(struct proc *p, unsigned n)
{
	char cmd[32], line[512];

	snprintf(cmd, sizeof(cmd), "dereg %u", n);
	proc_cmd(p, cmd, line, sizeof(line));
	if (strcmp(line, "ok"))
		fail_msg("%s: '%s': %s", p->name, cmd, line);
}

/*
 * Remote access in client-PD mode is for root and the admin group only: as
 * uid 65534, odpd_reg_read and odpd_reg_write fail with EPERM and leave
 * nothing (no MR, no pin, no fd of the client's context in odpd), while
 * odpd_reg_msgs works. With --admin-group nogroup the same user may.
 */
static void test_remote_access_policy(void **state)
{
	static const char *const args[] = { "--admin-group", "nogroup", NULL };
	const gid_t nogroup = 65534;
	char line[512];
	struct snapshot base, before, after;
	struct peer_mr m, m2;
	struct proc *p;

	(void)state;
	cm_require("test_remote_access_policy", true);
	if (geteuid() != 0) {
		fprintf(stderr, "test-cm: test_remote_access_policy skipped: needs root to switch users\n");
		skip();
	}
	snapshot_take(&test_daemon, test_admin_fd, &base);
	{
		const struct spawn_opts o = { .uid = UID_NOBODY, .groups = &nogroup, .ngroups = 1 };
		p = drive("cm-peer drive (uid 65534)", &o, line, sizeof(line));
	}
	snapshot_take(&test_daemon, test_admin_fd, &before);
	expect_err(p, "read 0 4096", "EPERM", "remote access");
	expect_err(p, "write 4096 4096", "EPERM", "remote access");
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	assert_testbed_libs(p);                      /* the library's import needs them */
	m = expect_ok(p, "msgs 8192 100");
	assert_client_pd_mr(&m, p->pid);
	assert_int_equal(daemon_mrs(), before.mrs + 1);
	expect_dereg(p, 0);
	assert_kernel_mr_gone(m.lkey);
	assert_released_but_ctx(&before);
	drive_quit(p);
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);   /* its context's copy closed too */

	/* the admin group (a supplementary group counts) is granted remote access */
	if (!getgrnam("nogroup") || getgrnam("nogroup")->gr_gid != nogroup) {
		fprintf(stderr, "test-cm: no group nogroup (65534): admin-group half skipped\n");
		return;
	}
	daemon_start(&extra_daemon, args);
	{
		const struct spawn_opts o = { .uid = UID_NOBODY, .groups = &nogroup, .ngroups = 1,
					      .sock = extra_daemon.sock };
		p = drive("cm-peer drive (uid 65534, admin group)", &o, line, sizeof(line));
	}
	assert_testbed_libs(p);
	m = expect_ok(p, "read 0 4096");
	assert_true(kernel_mr(m.lkey, NULL));
	m2 = expect_ok(p, "write 4096 4096");
	assert_true(kernel_mr(m2.lkey, NULL));
	drive_quit(p);                               /* deregisters both */
	assert_kernel_mr_gone(m.lkey);
	assert_kernel_mr_gone(m2.lkey);
	daemon_stop(&extra_daemon);
}

/*
 * A client killed while it holds client-PD MRs, remote keys among them: once
 * odpd has released it, the MRs and the client's PD are gone from the
 * kernel - odpd's copy of the client's cmd_fd, which would keep the dead
 * client's context and rkeys alive, is closed - and odpd is back where it
 * was (fds, pins, segments).
 */
static void test_killed_client_leaves_nothing(void **state)
{
	static const char *const cmds[] = { "msgs 0 4096", "read 4096 8192", "write 16384 100" };
	char line[512];
	struct snapshot base;
	struct peer_mr m[3];
	struct proc *p;
	pid_t pid;
	int st;

	(void)state;
	cm_require("test_killed_client_leaves_nothing", true);
	snapshot_take(&test_daemon, test_admin_fd, &base);
	{
		const struct spawn_opts o = { 0 };
		p = drive("cm-peer drive", &o, line, sizeof(line));
	}
	pid = p->pid;
	for (size_t i = 0; i < 3; i++) {
		m[i] = expect_ok(p, cmds[i]);
		assert_client_pd_mr(&m[i], pid);
	}
	assert_true(kernel_pds_of(pid) >= 1);
	kill(pid, SIGKILL);
	st = proc_wait(p);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);
	for (size_t i = 0; i < 3; i++)
		assert_kernel_mr_gone(m[i].lkey);
	if (kernel_pds_of(pid) != 0)
		fail_msg("the killed client's PD is still in the kernel: odpd kept its context");
}

/* odpctl status --json: the totals and this @pid's client entry, as text. */
static void odpctl_totals(pid_t pid, char *out, size_t cap)
{
	json_object *root = odpctl_json(test_daemon.sock, "status"), *totals, *clients, *mine = NULL;

	assert_true(json_object_object_get_ex(root, "totals", &totals));
	assert_true(json_object_object_get_ex(root, "clients", &clients));
	for (size_t i = 0; i < json_object_array_length(clients); i++)
		if (jint(json_object_array_get_idx(clients, i), "pid") == pid)
			mine = json_object_array_get_idx(clients, i);
	if (!mine)
		fail_msg("odpctl status: no client with pid %d:\n%s", (int)pid, json_object_to_json_string(root));
	snprintf(out, cap, "mrs %" PRId64 " pinned %" PRId64 " registrations %" PRId64 " errors %" PRId64
		 " | client mrs %" PRId64 " pinned %" PRId64, jint(totals, "mrs"), jint(totals, "pinned_bytes"),
		 jint(totals, "registrations"), jint(totals, "errors"), jint(mine, "mrs"),
		 jint(mine, "pinned_bytes"));
	json_object_put(root);
}

/*
 * The daemon can import (testbed) but the client's own libibverbs cannot
 * (Debian 12's rdma-core 44, the system's): the library refuses with
 * EOPNOTSUPP before the daemon registers anything, instead of registering
 * an MR it could not import.
 */
static void test_mirror_client_cannot_import(void **state)
{
	char line[512], st0[256], st1[256];
	struct snapshot before, after;
	struct proc *p;
	int kmrs0;

	(void)state;
	cm_require("test_mirror_client_cannot_import", false);
	if (!test_profile_testbed())
		skip();                          /* stock: test_mirror_by_profile covers it */
	{
		const struct spawn_opts o = { .system_libs = true };
		p = drive("cm-peer drive (system rdma-core)", &o, line, sizeof(line));
	}
	snapshot_take(&test_daemon, test_admin_fd, &before);
	odpctl_totals(p->pid, st0, sizeof(st0));
	kmrs0 = kernel_res_count("mr", 0);
	expect_err(p, "msgs 0 4096", "EOPNOTSUPP", "this process's libibverbs provider cannot import");
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	odpctl_totals(p->pid, st1, sizeof(st1));
	assert_string_equal(st0, st1);             /* no registration reached the daemon */
	assert_int_equal(kernel_res_count("mr", 0), kmrs0);
	drive_quit(p);
}

/*
 * The mirror by profile: in `stock` (rdma-core 44 cannot import on rxe)
 * odpd_reg_msgs/_read/_write answer EOPNOTSUPP and nothing is registered -
 * the kernel's MR table and odpctl status are unchanged; in `testbed` the
 * same calls register into the id's PD.
 */
static void test_mirror_by_profile(void **state)
{
	static const char *const cmds[] = { "msgs 0 4096", "read 4096 8192", "write 16384 100" };
	char line[512], st0[256], st1[256];
	int kmrs0;
	struct snapshot base, before, after;
	struct proc *p;

	(void)state;
	cm_require("test_mirror_by_profile", false);
	snapshot_take(&test_daemon, test_admin_fd, &base);
	{
		const struct spawn_opts o = { 0 };
		p = drive("cm-peer drive", &o, line, sizeof(line));
	}
	assert_testbed_libs(p);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	odpctl_totals(p->pid, st0, sizeof(st0));
	kmrs0 = kernel_res_count("mr", 0);
	if (!test_profile_testbed()) {
		for (size_t i = 0; i < 3; i++)
			expect_err(p, cmds[i], "EOPNOTSUPP", "import");
		snapshot_take(&test_daemon, test_admin_fd, &after);
		snapshot_assert_equal(&before, &after);
		odpctl_totals(p->pid, st1, sizeof(st1));
		assert_string_equal(st0, st1);
		assert_int_equal(kernel_res_count("mr", 0), kmrs0);
	} else {
		struct peer_mr m[3];
		for (size_t i = 0; i < 3; i++) {
			m[i] = expect_ok(p, cmds[i]);
			assert_client_pd_mr(&m[i], p->pid);
		}
		assert_int_equal(kernel_res_count("mr", 0), kmrs0 + 3);
		assert_int_equal(daemon_mrs(), before.mrs + 3);
		odpctl_totals(p->pid, st1, sizeof(st1));
		assert_string_not_equal(st0, st1);
		for (unsigned i = 0; i < 3; i++) {
			expect_dereg(p, i);
			assert_kernel_mr_gone(m[i].lkey);
		}
		assert_int_equal(kernel_res_count("mr", 0), kmrs0);
		assert_released_but_ctx(&before);
	}
	drive_quit(p);
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);
}

/*
 * Client-PD RegMr (raw protocol) whose fd is not a uverbs device - a memfd,
 * a pipe, /dev/null, and (in the VM) /dev/infiniband/rdma_cm, a character
 * device next to the uverbs nodes - is refused with EINVAL and the uverbs
 * message, before odpd imports (an import attempt would answer otherwise),
 * and nothing is registered. A real cmd_fd passes that check: the stock
 * profile's import answers EOPNOTSUPP, the testbed's registers.
 */
static void test_client_pd_fd_not_uverbs(void **state)
{
	static const char *const what[] = { "memfd", "pipe", "/dev/null", "/dev/infiniband/rdma_cm" };
	Odpd__RegMr m;
	Odpd__Request req;
	struct snapshot base, before, after;
	int conn, seg, pipefd[2], fds[4], nfds = 0;
	Odpd__Reply *r;
	uint64_t id = 10;

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &base);
	conn = track_fd(raw_connect_hello(test_daemon.sock));
	seg = track_fd(sealed_memfd(1 << 20));
	fds[nfds++] = track_fd(sealed_memfd(4096));
	assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
	track_fd(pipefd[1]);
	fds[nfds++] = track_fd(pipefd[0]);
	fds[nfds++] = track_fd(open("/dev/null", O_RDWR | O_CLOEXEC));
	assert_true(fds[2] >= 0);
	fds[nfds] = open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
	if (fds[nfds] >= 0)
		track_fd(fds[nfds++]);
	raw_client_pd_req(&req, &m, raw_attach(conn, 2, seg), 0);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	for (int i = 0; i < nfds; i++) {
		r = raw_call(conn, ++id, &req, &fds[i], 1);
		if (r->status != EINVAL || !r->message || !strstr(r->message, "not a uverbs device"))
			fail_msg("client-PD RegMr with a %s as its fd: %s: %s", what[i], strerror(r->status),
				 r->message ? r->message : "");
		odpd__reply__free_unpacked(r, NULL);
	}
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);

	/* a real cmd_fd gets past the check */
	verbs.list = ibv_get_device_list(NULL);
	verbs.ctx = verbs.list && verbs.list[0] ? ibv_open_device(verbs.list[0]) : NULL;
	verbs.pd = verbs.ctx ? ibv_alloc_pd(verbs.ctx) : NULL;
	if (!verbs.pd) {
		if (test_require_device())
			fail_msg("no RDMA device to open in the test process");
		return;
	}
	m.client_pd_handle = verbs.pd->handle;
	r = raw_call(conn, ++id, &req, &verbs.ctx->cmd_fd, 1);
	if (test_profile_testbed()) {
		Odpd__DeregMr dm = ODPD__DEREG_MR__INIT;
		Odpd__Request dreq = ODPD__REQUEST__INIT;
		Odpd__Reply *dr;

		if (r->status != 0)
			fail_msg("client-PD RegMr with a real cmd_fd: %s: %s", strerror(r->status),
				 r->message ? r->message : "");
		dm.has_handle = 1;
		dm.handle = r->mr->handle;
		dreq.body_case = ODPD__REQUEST__BODY_DEREG_MR;
		dreq.dereg_mr = &dm;
		dr = raw_call(conn, ++id, &dreq, NULL, 0);
		assert_int_equal(dr->status, 0);
		odpd__reply__free_unpacked(dr, NULL);
		assert_released_but_ctx(&before);
	} else {
		if (r->status != EOPNOTSUPP || !r->message || !strstr(r->message, "ibv_import_device"))
			fail_msg("client-PD RegMr with a real cmd_fd (stock): %s: %s", strerror(r->status),
				 r->message ? r->message : "");
		/* a context that failed to import is not kept */
		snapshot_take(&test_daemon, test_admin_fd, &after);
		snapshot_assert_equal(&before, &after);
	}
	odpd__reply__free_unpacked(r, NULL);
	close_tracked();                             /* the connection too */
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_client_pd_fd_not_uverbs, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_mirror_by_profile, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_mirror_client_cannot_import, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_client_against_rdma_server, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_server_against_rdma_client, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_rdma_write_read, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_remote_access_policy, harness_test_setup, cm_teardown),
		cmocka_unit_test_setup_teardown(test_killed_client_leaves_nothing, harness_test_setup, cm_teardown),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	if (getenv("ODPD_TEST_FILTER"))           /* e.g. "test_rdma*" */
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
