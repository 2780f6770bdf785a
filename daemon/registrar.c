/* SPDX-License-Identifier: MIT */
/*
 * odpd-registrar: where one PD's implicit ODP MRs are made (the protocol is
 * registrar-proto.h, the reason doc/design.md §8.2).
 *
 * An implicit MR reaches everything mapped in the process that registers
 * it, so this process maps nothing but what odpd sends: one client's
 * segments, at the client's addresses. It links libibverbs and libc only.
 *
 * Exit status: 0 odpd closed a socket; 1 odpd died before PDEATHSIG took
 * hold; 2 bad arguments or fds; 3 a malformed request; 4 a socket error;
 * 5 it cannot become the client's uid and gid.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <grp.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <linux/magic.h>

#include "registrar-proto.h"

/* Room for this many fds per message: more than one is malformed, but
 * they must be received to be closed. */
#define MAX_FDS 8

struct mapping {
	uint64_t id;
	void *addr;
	size_t length;
};

struct registrar {
	uint64_t page_size;
	struct mapping maps[ODPD_REG_MAX_MAPS];
	unsigned nmaps;
	struct ibv_context *ctx;          /* owns the INIT fd */
	struct ibv_pd *pd;                /* imported: odpd owns it */
	struct ibv_mr *mrs[ODPD_REG_MAX_MRS];
	unsigned nmrs;
};

__attribute__((format(printf, 1, 2)))
static void say(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n = snprintf(line, sizeof(line), "odpd-registrar[%d]: ", (int)getpid());

	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line);
}

__attribute__((format(printf, 3, 4)))
static void fail(struct odpd_reg_reply *rep, int error, const char *fmt, ...)
{
	va_list ap;

	rep->error = error;
	va_start(ap, fmt);
	vsnprintf(rep->message, sizeof(rep->message), fmt, ap);
	va_end(ap);
}

/* ---------------------------------------------------------------- maps */

/* "segment 7: [0x7f0000000000, +65536)", as odpd names it to its clients */
#define SEG_FMT "segment %" PRIu64 ": [%#" PRIx64 ", +%" PRIu64 ")"
#define SEG_ARGS(m) (m)->id, (m)->addr, (m)->length

static struct mapping *map_find(struct registrar *r, uint64_t id)
{
	for (unsigned i = 0; i < r->nmaps; i++)
		if (r->maps[i].id == id)
			return &r->maps[i];
	return NULL;
}

/* The request's own faults, before the kernel's: false with @rep filled. */
static bool map_check(struct registrar *r, const struct odpd_reg_msg *m, struct odpd_reg_reply *rep)
{
	if (!m->length || (m->addr | m->length | m->offset) % r->page_size)
		fail(rep, EINVAL, SEG_FMT " at offset %#" PRIx64 " is empty or not page-aligned",
		     SEG_ARGS(m), m->offset);
	else if (m->addr + m->length < m->addr || m->offset > (uint64_t)INT64_MAX - m->length)
		fail(rep, EINVAL, SEG_FMT " at offset %#" PRIx64 " overflows", SEG_ARGS(m), m->offset);
	else if (map_find(r, m->id))
		fail(rep, EEXIST, "segment %" PRIu64 " is already mapped in the registrar", m->id);
	else if (r->nmaps == ODPD_REG_MAX_MAPS)
		fail(rep, EMFILE, "the registrar already maps %u segments", ODPD_REG_MAX_MAPS);
	return rep->error == 0;
}

/*
 * Bytes the kernel maps for @length bytes of @fd: a hugetlb memfd is mapped
 * (and can only be unmapped) in whole huge pages. 0 with @rep filled if the
 * file system cannot be read.
 */
static uint64_t map_length(const struct odpd_reg_msg *m, int fd, struct odpd_reg_reply *rep)
{
	struct statfs sf;
	uint64_t page;

	if (fstatfs(fd, &sf) < 0) {
		fail(rep, errno, SEG_FMT ": fstatfs in the registrar: %s", SEG_ARGS(m), strerror(errno));
		return 0;
	}
	if (sf.f_type != HUGETLBFS_MAGIC)
		return m->length;
	page = (uint64_t)sf.f_bsize;
	if (!page || (page & (page - 1)) || (m->addr | m->offset) % page) {
		fail(rep, EINVAL, SEG_FMT " at offset %#" PRIx64 " is not aligned to the segment's "
		     "%" PRIu64 "-byte huge pages", SEG_ARGS(m), m->offset, page);
		return 0;
	}
	if (m->length > UINT64_MAX - (page - 1)) {
		fail(rep, EINVAL, SEG_FMT " overflows", SEG_ARGS(m));
		return 0;
	}
	return (m->length + page - 1) & ~(page - 1);
}

static void do_map(struct registrar *r, const struct odpd_reg_msg *m, int fd, struct odpd_reg_reply *rep)
{
	void *want = (void *)(uintptr_t)m->addr, *p;
	int prot = PROT_READ | (m->writable ? PROT_WRITE : 0), e;
	uint64_t length;

	if (!map_check(r, m, rep) || !(length = map_length(m, fd, rep)))
		goto out;
	p = mmap(want, length, prot, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, (off_t)m->offset);
	e = errno;
	if (p == MAP_FAILED && e == EEXIST) {
		fail(rep, EADDRINUSE, SEG_FMT " overlaps something already mapped in the registrar",
		     SEG_ARGS(m));
	} else if (p == MAP_FAILED) {
		fail(rep, e, SEG_FMT ": mmap in the registrar: %s", SEG_ARGS(m), strerror(e));
	} else if (p != want) {
		/* Before Linux 4.17 the flag is only a hint. */
		munmap(p, length);
		fail(rep, EADDRINUSE, SEG_FMT " is taken in the registrar's address space", SEG_ARGS(m));
	} else {
		/* No client data in a core dump (PR_SET_DUMPABLE is the main guard). */
		madvise(p, length, MADV_DONTDUMP);
		/* what was mapped, so that unmapping it succeeds */
		r->maps[r->nmaps++] = (struct mapping){ .id = m->id, .addr = p, .length = length };
	}
out:
	close(fd);      /* the mapping keeps the file */
}

static void do_unmap(struct registrar *r, const struct odpd_reg_msg *m, struct odpd_reg_reply *rep)
{
	struct mapping *map = map_find(r, m->id);

	if (!map)
		fail(rep, ENOENT, "segment %" PRIu64 " is not mapped in the registrar", m->id);
	else if (munmap(map->addr, map->length) < 0)
		fail(rep, errno, "segment %" PRIu64 ": munmap in the registrar: %s", m->id, strerror(errno));
	else
		*map = r->maps[--r->nmaps];
}

/* ---------------------------------------------------------------- verbs */

static void do_init(struct registrar *r, const struct odpd_reg_msg *m, int fd, struct odpd_reg_reply *rep)
{
	int e;

	if (r->ctx) {
		close(fd);
		fail(rep, EALREADY, "the registrar already holds its PD");
		return;
	}
	errno = 0;
	r->ctx = ibv_import_device(fd);
	if (!r->ctx) {
		e = errno ? errno : EOPNOTSUPP;
		close(fd);
		fail(rep, e, "ibv_import_device in the registrar: %s", strerror(e));
		return;
	}
	errno = 0;
	r->pd = ibv_import_pd(r->ctx, m->pd_handle);
	if (!r->pd) {
		e = errno ? errno : EOPNOTSUPP;
		ibv_close_device(r->ctx);       /* closes fd */
		r->ctx = NULL;
		fail(rep, e, "ibv_import_pd(%u) in the registrar: %s", m->pd_handle, strerror(e));
	}
}

static void do_reg(struct registrar *r, const struct odpd_reg_msg *m, struct odpd_reg_reply *rep)
{
	struct ibv_mr *mr = NULL;
	int e;

	errno = 0;
	if (!r->pd) {
		fail(rep, EINVAL, "the registrar has no PD yet (INIT first)");
	} else if (r->nmrs == ODPD_REG_MAX_MRS) {
		fail(rep, EMFILE, "the registrar already holds %u implicit ODP MRs", ODPD_REG_MAX_MRS);
	} else if (!(mr = ibv_reg_mr(r->pd, NULL, SIZE_MAX, (int)(m->access | IBV_ACCESS_ON_DEMAND)))) {
		e = errno ? errno : EINVAL;
		fail(rep, e, "ibv_reg_mr(NULL, SIZE_MAX, ON_DEMAND | %#x) in the registrar: %s", m->access,
		     strerror(e));
	} else {
		r->mrs[r->nmrs++] = mr;
		rep->mr_handle = mr->handle;
		rep->lkey = mr->lkey;
		rep->rkey = mr->rkey;
	}
}

static void do_dereg(struct registrar *r, const struct odpd_reg_msg *m, struct odpd_reg_reply *rep)
{
	unsigned i = 0;
	int e;

	while (i < r->nmrs && r->mrs[i]->handle != m->mr_handle)
		i++;
	if (i == r->nmrs) {
		fail(rep, ENOENT, "the registrar holds no MR %u", m->mr_handle);
	} else if ((e = ibv_dereg_mr(r->mrs[i]))) {
		fail(rep, e, "ibv_dereg_mr of MR %u in the registrar: %s", m->mr_handle, strerror(e));
	} else {
		r->mrs[i] = r->mrs[--r->nmrs];
	}
}

/* EOF from odpd: undo what is ours, never odpd's PD. */
static _Noreturn void finish(struct registrar *r)
{
	while (r->nmrs)
		ibv_dereg_mr(r->mrs[--r->nmrs]);
	if (r->pd)
		ibv_unimport_pd(r->pd);
	if (r->ctx)
		ibv_close_device(r->ctx);
	exit(0);
}

/* ---------------------------------------------------------------- requests */

/* Which socket an op belongs on, and whether it carries an fd; 0 if unknown. */
static int op_socket(uint32_t op, bool *ret_takes_fd)
{
	*ret_takes_fd = op == ODPD_REG_MAP || op == ODPD_REG_INIT;
	switch (op) {
	case ODPD_REG_MAP: case ODPD_REG_UNMAP:
		return ODPD_REG_MAPS_FD;
	case ODPD_REG_INIT: case ODPD_REG_REG: case ODPD_REG_DEREG:
		return ODPD_REG_VERBS_FD;
	}
	return 0;
}

static const char *framing_error(int sock, const struct msghdr *mh, ssize_t n, const struct odpd_reg_msg *m,
				 unsigned nfds, bool foreign_cmsg)
{
	bool takes_fd;

	if (mh->msg_flags & (MSG_TRUNC | MSG_CTRUNC) || foreign_cmsg)
		return "truncated, or with an unexpected control message";
	if (n != (ssize_t)sizeof(*m))
		return "wrong size";
	if (m->magic != ODPD_REG_MAGIC)
		return "wrong magic (odpd and odpd-registrar from different builds?)";
	if (op_socket(m->op, &takes_fd) == 0)
		return "unknown op";
	if (op_socket(m->op, &takes_fd) != sock)
		return "op sent on the wrong socket";
	if (nfds > 1 || nfds != takes_fd)
		return nfds > 1 ? "more than one fd" : nfds ? "an fd on an op that takes none" : "fd missing";
	return NULL;
}

/* The next request on @sock and its fd (-1 if none); false at EOF. Exits on
 * a malformed one: odpd and the registrar are one build, so that is a bug. */
static bool receive(int sock, struct odpd_reg_msg *m, int *ret_fd)
{
	char buf[sizeof(*m) + 1];
	union { struct cmsghdr h; char b[CMSG_SPACE(MAX_FDS * sizeof(int))]; } cm;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b) };
	int fds[MAX_FDS];
	unsigned nfds = 0;
	bool foreign = false;
	const char *why;
	ssize_t n;

	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n == 0 || (n < 0 && errno == ECONNRESET))
		return false;
	if (n < 0) {
		say("recvmsg on fd %d: %s", sock, strerror(errno));
		exit(4);
	}
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k = c->cmsg_len > CMSG_LEN(0) ? (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
			foreign = true;
			continue;
		}
		for (size_t i = 0; i < k && nfds < MAX_FDS; i++)
			memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	memcpy(m, buf, sizeof(*m));
	why = framing_error(sock, &mh, n, m, nfds, foreign);
	if (why) {
		while (nfds)
			close(fds[--nfds]);
		say("malformed request on fd %d (%zd bytes): %s", sock, n, why);
		exit(3);
	}
	*ret_fd = nfds ? fds[0] : -1;
	return true;
}

static void serve(struct registrar *r, int sock)
{
	struct odpd_reg_msg m;
	struct odpd_reg_reply rep = { .magic = ODPD_REG_MAGIC };
	int fd;

	if (!receive(sock, &m, &fd))
		finish(r);
	switch (m.op) {
	case ODPD_REG_MAP: do_map(r, &m, fd, &rep); break;
	case ODPD_REG_UNMAP: do_unmap(r, &m, &rep); break;
	case ODPD_REG_INIT: do_init(r, &m, fd, &rep); break;
	case ODPD_REG_REG: do_reg(r, &m, &rep); break;
	case ODPD_REG_DEREG: do_dereg(r, &m, &rep); break;
	}
	if (send(sock, &rep, sizeof(rep), MSG_NOSIGNAL) != (ssize_t)sizeof(rep)) {
		say("cannot answer on fd %d: %s", sock, strerror(errno));
		exit(4);
	}
}

/* ---------------------------------------------------------------- setup */

static bool is_seqpacket_unix(int fd)
{
	int type = 0, domain = 0;
	socklen_t len = sizeof(int);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
		return false;
	len = sizeof(int);
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
		return false;
	return type == SOCK_SEQPACKET && domain == AF_UNIX;
}

/* Keep nothing odpd did not mean to give (its own spawn closes them too). */
static void close_others(void)
{
	if (syscall(SYS_close_range, ODPD_REG_VERBS_FD + 1, ~0U, 0) == 0)
		return;
	for (long fd = ODPD_REG_VERBS_FD + 1, max = sysconf(_SC_OPEN_MAX); fd < max; fd++)
		close((int)fd);
}

/*
 * Nothing it does needs a capability: mmap of a memfd, importing a context
 * and registering an ODP MR (which pins nothing, so CAP_IPC_LOCK and
 * RLIMIT_MEMLOCK do not apply). So it keeps none of odpd's, and can gain
 * none through exec.
 */
static void drop_privileges(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = { { 0 } };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || syscall(SYS_capset, &h, none) < 0) {
		say("dropping privileges: %s", strerror(errno));
		exit(2);
	}
}

/* A decimal id, or -1. */
static long parse_id(const char *s)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	return errno || *end || end == s || v < 0 || v > 0x7fffffffL ? -1 : v;
}

/*
 * Become the client: an implicit MR reaches this process's own memory (its
 * stack, heap, libraries) as much as the segments, so a client could take
 * it over through its key. It must then hold nothing the client could not:
 * the client's uid and gid, no supplementary groups, no capability.
 */
static void become(uid_t uid, gid_t gid)
{
	if (getuid() == uid && geteuid() == uid && getgid() == gid && getegid() == gid &&
	    getgroups(0, NULL) == 0)
		return;
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) {
		say("cannot run as the client's uid %u gid %u: %s (odpd needs CAP_SETUID and CAP_SETGID "
		    "for implicit ODP)", (unsigned)uid, (unsigned)gid, strerror(errno));
		exit(5);
	}
}

static void setup(int argc, char **argv)
{
	long ppid = argc == 4 ? parse_id(argv[1]) : -1;
	long uid = argc == 4 ? parse_id(argv[2]) : -1, gid = argc == 4 ? parse_id(argv[3]) : -1;

	if (ppid <= 0 || uid < 0 || gid < 0) {
		fprintf(stderr, "usage: odpd-registrar PARENT_PID UID GID (started by odpd only)\n");
		exit(2);
	}
	become((uid_t)uid, (gid_t)gid);
	/* PDEATHSIG after the credentials change (which clears it), then check:
	 * odpd may have died before it took hold. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != (pid_t)ppid)
		exit(1);
	prctl(PR_SET_DUMPABLE, 0);      /* client memory: no core dumps, no ptrace by the uid */
	drop_privileges();
	signal(SIGPIPE, SIG_IGN);
	if (!is_seqpacket_unix(ODPD_REG_MAPS_FD) || !is_seqpacket_unix(ODPD_REG_VERBS_FD)) {
		say("fds %d and %d must be AF_UNIX SOCK_SEQPACKET sockets (started by odpd only)",
		    ODPD_REG_MAPS_FD, ODPD_REG_VERBS_FD);
		exit(2);
	}
	close_others();
}

int main(int argc, char **argv)
{
	static struct registrar r;      /* ~100 KiB of maps: not on the stack */

	setup(argc, argv);
	r.page_size = (uint64_t)sysconf(_SC_PAGESIZE);
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = ODPD_REG_MAPS_FD, .events = POLLIN },
			{ .fd = ODPD_REG_VERBS_FD, .events = POLLIN },
		};

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			say("poll: %s", strerror(errno));
			exit(4);
		}
		for (int i = 0; i < 2; i++) {
			/* A hangup ends everything, even with requests left. */
			if (p[i].revents & POLLHUP)
				finish(&r);
			if (p[i].revents)
				serve(&r, p[i].fd);
		}
	}
}
