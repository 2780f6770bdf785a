/* SPDX-License-Identifier: MIT */
/*
 * odpd-registrar (daemon/registrar.c) on its own, driven over its two
 * sockets as odpd would drive it: what it maps lands at the asked address
 * in its address space and leaves again, its refusals answer with errno and
 * a message and leave it serving, and anything malformed, or odpd going
 * away, ends it with the documented exit status. Host tier: the verbs ops
 * are only tested up to where a device would be needed.
 *
 * Looking into the registrar (/proc/PID/maps, fd, its memory) needs
 * CAP_SYS_PTRACE, as it is not dumpable: without it those checks skip.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "registrar-proto.h"

extern char **environ;

#define SEG_SIZE (16 * pg)           /* 64 KiB with 4 KiB pages */
#define SEG_NAME "odpd-test-registrar"
#define REPLY_TIMEOUT_MS 10000
#define EXIT_TIMEOUT_MS 10000

static uint64_t pg;                     /* the page size */

struct reg {
	pid_t pid;              /* 0 once reaped */
	int maps, verbs;        /* our ends of fds 3 and 4 */
};

/* ---------------------------------------------------------------- spawning */

/* Above 4, so that the child's dup2 onto 3 and 4 clobbers none of them
 * (and never dup2s an fd onto itself, which would keep its CLOEXEC). */
static int fd_high(int fd)
{
	int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 10);

	assert_true(nfd >= 10);
	close(fd);
	return nfd;
}

/* Start the registrar with @child3 and @child4 as its fds 3 and 4 and
 * @ppid as its argument; $ODPD_TEST_REGISTRAR_WRAPPER (words) goes first. */
static pid_t spawn_with(int child3, int child4, pid_t ppid)
{
	const char *path = getenv("ODPD_TEST_REGISTRAR");
	char *wrapper = getenv("ODPD_TEST_REGISTRAR_WRAPPER");
	char *argv[32], ppid_s[16], uid_s[16], gid_s[16], *words = NULL, *save = NULL;
	posix_spawn_file_actions_t fa;
	unsigned argc = 0;
	pid_t pid;
	int rc;

	if (!path || !*path)
		fail_msg("ODPD_TEST_REGISTRAR is not set (run through meson test)");
	if (wrapper && *wrapper) {
		words = strdup(wrapper);
		for (char *w = strtok_r(words, " ", &save); w && argc < 28; w = strtok_r(NULL, " ", &save))
			argv[argc++] = w;
	}
	snprintf(ppid_s, sizeof(ppid_s), "%d", (int)ppid);
	snprintf(uid_s, sizeof(uid_s), "%u", (unsigned)getuid());
	snprintf(gid_s, sizeof(gid_s), "%u", (unsigned)getgid());
	argv[argc++] = (char *)path;
	argv[argc++] = ppid_s;
	argv[argc++] = uid_s;               /* it becomes the client's uid and gid: ours */
	argv[argc++] = gid_s;
	argv[argc] = NULL;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, child3, ODPD_REG_MAPS_FD);
	posix_spawn_file_actions_adddup2(&fa, child4, ODPD_REG_VERBS_FD);
	rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	free(words);
	if (rc)
		fail_msg("posix_spawn %s: %s", argv[0], strerror(rc));
	return pid;
}

/* Our ends into @g, the registrar's ends into @child (fds 3 and 4 to be). */
static void socket_pairs(struct reg *g, int child[2])
{
	int a[2], b[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, a), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, b), 0);
	g->maps = fd_high(a[0]);
	g->verbs = fd_high(b[0]);
	child[0] = fd_high(a[1]);
	child[1] = fd_high(b[1]);
}

static void reg_start(struct reg *g)
{
	int child[2];

	socket_pairs(g, child);
	g->pid = spawn_with(child[0], child[1], getpid());
	close(child[0]);
	close(child[1]);
}

/* Its wait status, within @ms; a registrar that does not exit fails the test. */
static int reg_wait(struct reg *g, int ms)
{
	struct timespec tick = { .tv_nsec = 10 * 1000 * 1000 };
	int st;

	for (int waited = 0; waited <= ms; waited += 10) {
		pid_t r = waitpid(g->pid, &st, WNOHANG);

		assert_true(r >= 0);
		if (r == g->pid) {
			g->pid = 0;
			return st;
		}
		nanosleep(&tick, NULL);
	}
	fail_msg("odpd-registrar (pid %d) did not exit within %d ms", (int)g->pid, ms);
	return -1;
}

static void assert_exit_status(int st, int want)
{
	if (!WIFEXITED(st))
		fail_msg("odpd-registrar was killed by signal %d, expected exit status %d",
			 WIFSIGNALED(st) ? WTERMSIG(st) : -1, want);
	assert_int_equal(WEXITSTATUS(st), want);
}

/* odpd goes away: close both sockets, expect exit status 0. */
static void reg_stop(struct reg *g)
{
	close(g->maps);
	close(g->verbs);
	g->maps = g->verbs = -1;
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 0);
}

static int setup(void **state)
{
	struct reg *g = calloc(1, sizeof(*g));

	reg_start(g);
	*state = g;
	return 0;
}

/* After a failed test: kill what is left. */
static int teardown(void **state)
{
	struct reg *g = *state;

	if (g->maps >= 0)
		close(g->maps);
	if (g->verbs >= 0)
		close(g->verbs);
	if (g->pid > 0) {
		kill(g->pid, SIGKILL);
		waitpid(g->pid, NULL, 0);
	}
	free(g);
	return 0;
}

/* ---------------------------------------------------------------- messages */

static void send_raw(int sock, const void *buf, size_t len, const int *fds, unsigned nfds)
{
	union { struct cmsghdr h; char b[CMSG_SPACE(4 * sizeof(int))]; } cm;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	assert_true(nfds <= 4);
	if (nfds) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.b;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), fds, nfds * sizeof(int));
	}
	assert_int_equal(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

static bool readable(int sock, int ms)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };

	return poll(&p, 1, ms) == 1;
}

/* Send @m (with @fd if >= 0) and return the one reply. */
static struct odpd_reg_reply call(int sock, const struct odpd_reg_msg *m, int fd)
{
	struct odpd_reg_reply rep;
	ssize_t n;

	send_raw(sock, m, sizeof(*m), &fd, fd >= 0);
	if (!readable(sock, REPLY_TIMEOUT_MS))
		fail_msg("no reply to op %u within %d ms", m->op, REPLY_TIMEOUT_MS);
	n = recv(sock, &rep, sizeof(rep), 0);
	assert_int_equal(n, (ssize_t)sizeof(rep));
	assert_int_equal(rep.magic, ODPD_REG_MAGIC);
	assert_non_null(memchr(rep.message, 0, sizeof(rep.message)));
	if (rep.error)
		assert_true(rep.message[0] != 0);           /* a failure says why */
	return rep;
}

/* The reply's errno must be @want (its message shown if not). */
static void expect(const struct odpd_reg_reply *rep, int want)
{
	if (rep->error != want)
		fail_msg("expected %s, got %s: %s", want ? strerror(want) : "success",
			 rep->error ? strerror(rep->error) : "success", rep->message);
}

static struct odpd_reg_reply map(struct reg *g, uint64_t id, int fd, uint64_t addr, uint64_t len,
				 uint64_t off)
{
	struct odpd_reg_msg m = {
		.magic = ODPD_REG_MAGIC, .op = ODPD_REG_MAP, .id = id, .addr = addr,
		.length = len, .offset = off,
	};

	return call(g->maps, &m, fd);
}

static struct odpd_reg_reply unmap(struct reg *g, uint64_t id)
{
	struct odpd_reg_msg m = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = id };

	return call(g->maps, &m, -1);
}

static struct odpd_reg_reply verb(struct reg *g, uint32_t op, uint32_t mr_handle, int fd)
{
	struct odpd_reg_msg m = { .magic = ODPD_REG_MAGIC, .op = op, .mr_handle = mr_handle };

	return call(g->verbs, &m, fd);
}

/* EOF (or a reset) on @sock within the exit timeout. */
static void expect_eof(int sock)
{
	char c;

	assert_true(readable(sock, EXIT_TIMEOUT_MS));
	assert_true(recv(sock, &c, 1, MSG_DONTWAIT) <= 0);
}

/* ---------------------------------------------------------------- looking in */

/* A sealed memfd of @size bytes, byte i = i * 7 + i / 4096 (no period of a page). */
static int seg_create(size_t size)
{
	int fd = memfd_create(SEG_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint8_t *buf = malloc(size);

	assert_true(fd >= 0 && buf);
	for (size_t i = 0; i < size; i++)
		buf[i] = (uint8_t)(i * 7 + i / 4096);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(pwrite(fd, buf, size, 0), (ssize_t)size);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
	free(buf);
	return fd;
}

/* The /proc/PID/maps line starting at @addr into @line: 1, 0 if none,
 * -1 if we may not read it (the registrar is not dumpable). */
static int maps_line(pid_t pid, uint64_t addr, char *line, size_t cap)
{
	char path[64], want[32];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	snprintf(want, sizeof(want), "%" PRIx64 "-", addr);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (!found && fgets(line, (int)cap, f))
		found = strncmp(line, want, strlen(want)) == 0;
	if (ferror(f))
		found = -1;
	fclose(f);
	return found;
}

/* Open fds of @pid numbered @from and up, -1 if we may not look. */
static int fds_from(pid_t pid, int from)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.' && atoi(e->d_name) >= from;
	closedir(d);
	return n;
}

/* The registrar's open fds once it is past its setup (a request answered:
 * until then it may still hold what it inherited), -1 if we may not look. */
static int reg_fd_count(struct reg *g)
{
	struct odpd_reg_msg m = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = UINT64_MAX };
	struct odpd_reg_reply rep = call(g->maps, &m, -1);

	expect(&rep, ENOENT);
	return fds_from(g->pid, 0);
}

static bool visible(pid_t pid)
{
	char line[256];

	return maps_line(pid, 0, line, sizeof(line)) >= 0 && fds_from(pid, 0) >= 0;
}

static void skip_invisible(void)
{
	print_message("cannot look into the registrar (not dumpable, and no CAP_SYS_PTRACE): "
		      "its side skipped\n");
	skip();
}

/* MAP @id of @fd [off, +len) at the first free one of a few client-like
 * addresses (something of the registrar's own may sit at one). */
static uint64_t map_somewhere(struct reg *g, uint64_t id, int fd, uint64_t len, uint64_t off)
{
	static const uint64_t candidates[] = {
		0x5a5a00000000, 0x3a5a00000000, 0x1a5a00000000, 0x5a5a000000,
	};
	struct odpd_reg_reply rep;

	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
		rep = map(g, id, fd, candidates[i], len, off);
		if (rep.error != EADDRINUSE && rep.error != ENOMEM) {
			expect(&rep, 0);
			return candidates[i];
		}
	}
	fail_msg("no free address for the test mapping: %s", rep.message);
	return 0;
}

/* ---------------------------------------------------------------- tests */

/* MAP puts the segment at the asked address, read-only as asked, with the
 * file's bytes from the asked offset, and keeps no fd of it. */
static void test_map(void **state)
{
	struct reg *g = *state;
	int fd = seg_create(SEG_SIZE), fds_before = reg_fd_count(g);
	uint8_t got[64], want[64];
	struct iovec local = { got, sizeof(got) }, remote;
	char line[256];
	uint64_t addr = map_somewhere(g, 7, fd, SEG_SIZE - pg, pg);

	if (!visible(g->pid))
		skip_invisible();
	assert_int_equal(maps_line(g->pid, addr, line, sizeof(line)), 1);
	if (!strstr(line, "memfd:" SEG_NAME) || !strstr(line, " r--s "))
		fail_msg("registrar's mapping at %#" PRIx64 " is not our read-only shared memfd: %s", addr, line);
	assert_int_equal(reg_fd_count(g), fds_before);       /* the memfd was closed */

	remote = (struct iovec){ (void *)(uintptr_t)(addr + pg), sizeof(got) };
	assert_int_equal(process_vm_readv(g->pid, &local, 1, &remote, 1, 0), (ssize_t)sizeof(got));
	assert_int_equal(pread(fd, want, sizeof(want), (off_t)(2 * pg)), (ssize_t)sizeof(want));
	assert_memory_equal(got, want, sizeof(got));
	close(fd);
	reg_stop(g);
}

/* Refusals: an occupied range, a known id, bad alignment; none of them
 * keeps the fd, and the registrar goes on answering. */
static void test_map_refused(void **state)
{
	struct reg *g = *state;
	int fd = seg_create(SEG_SIZE), fds_before = reg_fd_count(g);
	struct odpd_reg_reply rep;
	uint64_t addr = map_somewhere(g, 1, fd, SEG_SIZE, 0);

	rep = map(g, 2, fd, addr, SEG_SIZE, 0);
	expect(&rep, EADDRINUSE);
	rep = map(g, 2, fd, addr + SEG_SIZE - pg, 2 * pg, 0);       /* partial overlap */
	expect(&rep, EADDRINUSE);
	rep = map(g, 1, fd, addr + 2 * SEG_SIZE, SEG_SIZE, 0);
	expect(&rep, EEXIST);
	rep = map(g, 3, fd, addr + 2 * SEG_SIZE + 1, pg, 0);
	expect(&rep, EINVAL);
	rep = map(g, 3, fd, addr + 2 * SEG_SIZE, 100, 0);
	expect(&rep, EINVAL);
	rep = map(g, 3, fd, addr + 2 * SEG_SIZE, pg, 100);
	expect(&rep, EINVAL);
	rep = map(g, 3, fd, addr + 2 * SEG_SIZE, 0, 0);
	expect(&rep, EINVAL);
	rep = map(g, 3, fd, UINT64_MAX - pg + 1, 2 * pg, 0);           /* wraps */
	expect(&rep, EINVAL);
	if (fds_before >= 0)
		assert_int_equal(reg_fd_count(g), fds_before);
	rep = map(g, 3, fd, addr + 2 * SEG_SIZE, pg, 0);             /* still serving */
	expect(&rep, 0);
	close(fd);
	reg_stop(g);
}

/* UNMAP frees the range and the id: mapping them again works. */
static void test_unmap(void **state)
{
	struct reg *g = *state;
	int fd = seg_create(SEG_SIZE);
	struct odpd_reg_reply rep;
	uint64_t addr = map_somewhere(g, 1, fd, SEG_SIZE, 0);
	bool look = visible(g->pid);
	char line[256];

	if (look)
		assert_int_equal(maps_line(g->pid, addr, line, sizeof(line)), 1);
	rep = unmap(g, 1);
	expect(&rep, 0);
	if (look)
		assert_int_equal(maps_line(g->pid, addr, line, sizeof(line)), 0);
	rep = unmap(g, 1);
	expect(&rep, ENOENT);
	rep = map(g, 1, fd, addr, SEG_SIZE, 0);
	expect(&rep, 0);
	rep = unmap(g, 1);
	expect(&rep, 0);
	close(fd);
	reg_stop(g);
	if (!look)
		skip_invisible();
}

/* ODPD_REG_MAX_MAPS mappings and no more; each is removed exactly once,
 * whatever the order (the table moves its last entry into a hole). */
static void test_map_limit(void **state)
{
	struct reg *g = *state;
	size_t pages = ODPD_REG_MAX_MAPS + 1;
	int fd = memfd_create(SEG_NAME, MFD_CLOEXEC);
	struct odpd_reg_reply rep;
	uint64_t base;

	assert_int_equal(ftruncate(fd, (off_t)(pages * pg)), 0);
	/* Every other page, so that the kernel cannot merge them either. */
	base = map_somewhere(g, 0, fd, 2 * pages * pg, 0);
	rep = unmap(g, 0);
	expect(&rep, 0);
	for (uint64_t i = 0; i < ODPD_REG_MAX_MAPS; i++) {
		rep = map(g, i, fd, base + 2 * i * pg, pg, i * pg);
		expect(&rep, 0);
	}
	rep = map(g, ODPD_REG_MAX_MAPS, fd, base + 2 * ODPD_REG_MAX_MAPS * pg, pg, 0);
	expect(&rep, EMFILE);
	for (uint64_t i = 0; i < ODPD_REG_MAX_MAPS; i++) {
		uint64_t id = (i * 2654435761u) % ODPD_REG_MAX_MAPS;   /* a permutation */
		rep = unmap(g, id);
		expect(&rep, 0);
		rep = unmap(g, id);
		expect(&rep, ENOENT);
	}
	rep = map(g, ODPD_REG_MAX_MAPS, fd, base, pg, 0);
	expect(&rep, 0);
	close(fd);
	reg_stop(g);
}

/*
 * A hugetlb segment whose length is not whole huge pages (a client may
 * attach one small page of it): the kernel maps whole huge pages, and the
 * registrar unmaps what was mapped, so UNMAP succeeds and frees the range.
 */
static void test_map_hugetlb(void **state)
{
	struct reg *g = *state;
	const uint64_t huge = 2 << 20;
	int fd;
	struct odpd_reg_reply rep;
	uint64_t addr;
	bool look = visible(g->pid);
	char line[256];

	if (!hugepages_free(1)) {
		reg_stop(g);
		skip();
		return;
	}
	fd = memfd_create(SEG_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)huge), 0);
	addr = map_somewhere(g, 1, fd, pg, 0);          /* candidates are huge-page aligned */
	if (look) {
		assert_int_equal(maps_line(g->pid, addr, line, sizeof(line)), 1);
		if (!strstr(line, "memfd:" SEG_NAME))
			fail_msg("registrar's mapping at %#" PRIx64 " is not our hugetlb memfd: %s", addr, line);
	}
	rep = unmap(g, 1);
	expect(&rep, 0);
	if (look)
		assert_int_equal(maps_line(g->pid, addr, line, sizeof(line)), 0);
	rep = map(g, 1, fd, addr, pg, 0);               /* the range and the id are free again */
	expect(&rep, 0);
	rep = map(g, 2, fd, addr + huge, pg, pg);       /* not at a huge page of the file */
	expect(&rep, EINVAL);
	rep = unmap(g, 1);
	expect(&rep, 0);
	close(fd);
	reg_stop(g);
	hugepages_restore();
}

/* Verbs before INIT: nothing to register in, nothing to deregister. */
static void test_verbs_before_init(void **state)
{
	struct reg *g = *state;
	struct odpd_reg_reply rep;

	rep = verb(g, ODPD_REG_REG, 0, -1);
	expect(&rep, EINVAL);
	rep = verb(g, ODPD_REG_DEREG, 1234, -1);
	expect(&rep, ENOENT);
	reg_stop(g);
}

/* INIT with something that is not a uverbs fd: refused, the fd closed,
 * still uninitialised (no EALREADY next time), still serving both sockets. */
static void test_init_not_uverbs(void **state)
{
	struct reg *g = *state;
	int p[2], fds_before = reg_fd_count(g);
	struct odpd_reg_reply rep;

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	for (int i = 0; i < 2; i++) {
		rep = verb(g, ODPD_REG_INIT, 0, p[0]);
		assert_int_not_equal(rep.error, 0);
		assert_int_not_equal(rep.error, EALREADY);
		assert_non_null(strstr(rep.message, "ibv_import_device"));
	}
	if (fds_before >= 0)
		assert_int_equal(reg_fd_count(g), fds_before);
	rep = verb(g, ODPD_REG_REG, 0, -1);
	expect(&rep, EINVAL);
	rep = unmap(g, 1);
	expect(&rep, ENOENT);
	close(p[0]);
	close(p[1]);
	reg_stop(g);
}

/* Malformed on @sock: the registrar exits 3 without answering, and odpd
 * sees EOF on both sockets. */
static void expect_malformed(struct reg *g, int sock, const void *buf, size_t len, const int *fds,
			     unsigned nfds)
{
	send_raw(sock, buf, len, fds, nfds);
	expect_eof(g->maps);
	expect_eof(g->verbs);
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 3);
	close(g->maps);
	close(g->verbs);
	g->maps = g->verbs = -1;
}

static void test_wrong_magic(void **state)
{
	struct reg *g = *state;
	struct odpd_reg_msg m = { .magic = ODPD_REG_MAGIC + 1, .op = ODPD_REG_UNMAP, .id = 1 };

	expect_malformed(g, g->maps, &m, sizeof(m), NULL, 0);
}

/* MAP belongs on fd 3: on fd 4 it is a bug in odpd, not a request. */
static void test_map_on_verbs_socket(void **state)
{
	struct reg *g = *state;
	int fd = seg_create(SEG_SIZE);
	struct odpd_reg_msg m = {
		.magic = ODPD_REG_MAGIC, .op = ODPD_REG_MAP, .id = 1, .addr = 0x5a5a00000000,
		.length = SEG_SIZE,
	};

	expect_malformed(g, g->verbs, &m, sizeof(m), &fd, 1);
	close(fd);
}

/* Every other framing error, each on a fresh registrar. */
static void test_malformed(void **state)
{
	struct reg *g = *state;
	struct odpd_reg_msg unmap_msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = 1 };
	struct odpd_reg_msg map_msg = {
		.magic = ODPD_REG_MAGIC, .op = ODPD_REG_MAP, .id = 1, .addr = 0x5a5a00000000, .length = pg,
	};
	struct odpd_reg_msg reg_msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_REG };
	struct odpd_reg_msg bad_op = { .magic = ODPD_REG_MAGIC, .op = 99 };
	char longer[sizeof(struct odpd_reg_msg) + 8] = { 0 };
	int fd = seg_create(SEG_SIZE), two[2] = { fd, fd };

	memcpy(longer, &unmap_msg, sizeof(unmap_msg));
	expect_malformed(g, g->maps, &unmap_msg, sizeof(unmap_msg) - 1, NULL, 0);
	reg_start(g);
	expect_malformed(g, g->maps, longer, sizeof(longer), NULL, 0);
	reg_start(g);
	expect_malformed(g, g->maps, &bad_op, sizeof(bad_op), NULL, 0);
	reg_start(g);
	expect_malformed(g, g->maps, &map_msg, sizeof(map_msg), NULL, 0);      /* MAP without fd */
	reg_start(g);
	expect_malformed(g, g->maps, &map_msg, sizeof(map_msg), two, 2);       /* two fds */
	reg_start(g);
	expect_malformed(g, g->maps, &unmap_msg, sizeof(unmap_msg), &fd, 1);   /* fd on UNMAP */
	reg_start(g);
	expect_malformed(g, g->maps, &reg_msg, sizeof(reg_msg), NULL, 0);      /* REG on fd 3 */
	reg_start(g);
	expect_malformed(g, g->verbs, &reg_msg, sizeof(reg_msg), &fd, 1);      /* fd on REG */
	close(fd);
}

/* odpd closing either socket is the normal end: exit 0, mappings or not. */
static void test_eof_maps(void **state)
{
	struct reg *g = *state;
	int fd = seg_create(SEG_SIZE);

	map_somewhere(g, 1, fd, SEG_SIZE, 0);
	close(fd);
	close(g->maps);
	g->maps = -1;
	expect_eof(g->verbs);
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 0);
}

static void test_eof_verbs(void **state)
{
	struct reg *g = *state;

	close(g->verbs);
	g->verbs = -1;
	expect_eof(g->maps);
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 0);
}

/* It keeps no fd but 0-4, whatever it inherits. (valgrind's own fds, when
 * under it, sit at the top of the fd limit.) */
static void test_closes_other_fds(void **state)
{
	struct reg *g = *state;
	int stray = open("/dev/null", O_RDONLY), high;      /* no O_CLOEXEC: inherited */

	assert_true(stray >= 0);
	high = fcntl(stray, F_DUPFD, 200);
	assert_true(high >= 200);
	reg_stop(g);
	reg_start(g);
	close(stray);
	close(high);
	if (reg_fd_count(g) < 0)
		skip_invisible();
	assert_int_equal(fds_from(g->pid, ODPD_REG_VERBS_FD + 1) - fds_from(g->pid, 1000), 0);
	reg_stop(g);
}

/* Started with anything but socketpairs on 3 and 4, or by someone else
 * than its argument names: it refuses to run. */
static void test_bad_start(void **state)
{
	struct reg *g = *state;
	int p[2], s[2];

	reg_stop(g);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	p[0] = fd_high(p[0]);
	p[1] = fd_high(p[1]);
	g->pid = spawn_with(p[0], p[1], getpid());
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 2);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s), 0);
	s[0] = fd_high(s[0]);
	s[1] = fd_high(s[1]);
	g->pid = spawn_with(s[0], s[1], getpid());
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 2);
	g->pid = spawn_with(s[0], s[1], getppid());             /* not its parent */
	assert_exit_status(reg_wait(g, EXIT_TIMEOUT_MS), 1);
	close(p[0]);
	close(p[1]);
	close(s[0]);
	close(s[1]);
}

/* odpd dies (a crash: its sockets stay open, here in the test): PDEATHSIG
 * kills the registrar. A middle process plays odpd; we are its subreaper,
 * so the orphaned registrar comes back to us to be reaped. */
static void test_parent_death(void **state)
{
	struct reg *g = *state;
	int child[2], pp[2], st;
	pid_t mid;

	reg_stop(g);
	socket_pairs(g, child);
	assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	assert_int_equal(pipe(pp), 0);
	mid = fork();
	assert_true(mid >= 0);
	if (mid == 0) {
		struct odpd_reg_msg m = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = 1 };
		struct odpd_reg_reply rep;
		pid_t pid = spawn_with(child[0], child[1], getpid());

		/* An answer: it is past its setup, PDEATHSIG armed. */
		if (send(g->maps, &m, sizeof(m), 0) != sizeof(m) ||
		    recv(g->maps, &rep, sizeof(rep), 0) != sizeof(rep) || rep.error != ENOENT)
			_exit(10);
		_exit(write(pp[1], &pid, sizeof(pid)) == sizeof(pid) ? 0 : 11);
	}
	close(child[0]);
	close(child[1]);
	close(pp[1]);
	assert_int_equal(waitpid(mid, &st, 0), mid);
	assert_exit_status(st, 0);
	assert_int_equal(read(pp[0], &g->pid, sizeof(g->pid)), (ssize_t)sizeof(g->pid));
	close(pp[0]);
	st = reg_wait(g, EXIT_TIMEOUT_MS);
	prctl(PR_SET_CHILD_SUBREAPER, 0);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		fail_msg("the orphaned registrar was not killed by PDEATHSIG (wait status %#x)", st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_map, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unmap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_hugetlb, setup, teardown),
		cmocka_unit_test_setup_teardown(test_verbs_before_init, setup, teardown),
		cmocka_unit_test_setup_teardown(test_init_not_uverbs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_magic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_on_verbs_socket, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof_maps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof_verbs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_closes_other_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_start, setup, teardown),
		cmocka_unit_test_setup_teardown(test_parent_death, setup, teardown),
	};

	pg = (uint64_t)sysconf(_SC_PAGESIZE);
	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
