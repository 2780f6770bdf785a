/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "implicit.h"
#include "log.h"
#include "odpd-wire.h"
#include "registrar-proto.h"

extern char **environ;

/* A worker waits this long for the registrar's answer to a verb (importing
 * a PD, registering or deregistering an implicit MR pins nothing: fast),
 * and the loop for the answer to its oldest map, ms. The registrar runs as
 * the client's uid, which may stop it (SIGSTOP): then it is killed. A
 * worker waiting is a worker lost to everyone meanwhile: keep it short. */
#define VERBS_TIMEOUT_MS 2000
#define MAPS_TIMEOUT_MS 10000
/* After closing its sockets, how long the registrar may take to exit, ms. */
#define EXIT_TIMEOUT_MS 3000

/* A map or unmap of the loop, sent in order, as the socket takes them, then
 * waiting for its answer (in order). Never dropped: a registrar that cannot
 * take them is discarded. */
struct map_call {
	struct map_call *next;
	odpd_registrar_cb cb;               /* NULL: an unmap, only logged */
	void *arg;
	struct odpd_reg_msg msg;
	int fd;                             /* ours (a dup), sent with msg; -1 */
	bool sent;
};

struct odpd_registrar {
	pid_t pid;
	int pidfd;                          /* -1 where pidfd_open is missing */
	int maps_fd, verbs_fd;
	struct event *ev;                   /* maps_fd readable */
	struct event *ev_write;             /* maps_fd writable, while calls wait to be sent */
	struct event *ev_timeout;           /* the oldest call's answer is late */
	struct map_call *head, **tail;      /* sent ones first */
	struct map_call *unsent;            /* the first not yet sent, or NULL */
	atomic_uint refs;                   /* the domain's, each implicit MR's */
	pthread_mutex_t lock;               /* verbs calls, one at a time */
	bool ready;                         /* INIT succeeded (under lock) */
	atomic_bool dead;
	const char *dead_why;               /* found dead inside a call: said on the next turn */
	char label[64];
	struct odpd_job discard;            /* odpd_registrar_discard's reaping */
};

const char *odpd_registrar_path(void)
{
	const char *p = getenv("ODPD_REGISTRAR");

	return p && *p ? p : ODPD_LIBEXECDIR "/odpd-registrar";
}

pid_t odpd_registrar_pid(const struct odpd_registrar *g)
{
	return g->pid;
}

bool odpd_registrar_dead(struct odpd_registrar *g)
{
	return atomic_load(&g->dead);
}

/* ---------------------------------------------------------------- messages */

static int send_msg(int fd, const struct odpd_reg_msg *msg, int pass_fd, int flags)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = sizeof(*msg) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (pass_fd >= 0) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.buf;
		mh.msg_controllen = sizeof(cm.buf);
		CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &pass_fd, sizeof(int));
	}
	if (sendmsg(fd, &mh, flags | MSG_NOSIGNAL) != (ssize_t)sizeof(*msg))
		return errno ? -errno : -EIO;
	return 0;
}

/* One reply: 0, -EPIPE at EOF, -EBADMSG for a malformed one, or -errno. */
static int recv_reply(int fd, struct odpd_reg_reply *rep, int flags)
{
	ssize_t n = recv(fd, rep, sizeof(*rep), flags);

	if (n == 0)
		return -EPIPE;
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(*rep) || rep->magic != ODPD_REG_MAGIC || rep->error < 0)
		return -EBADMSG;
	rep->message[sizeof(rep->message) - 1] = 0;
	return 0;
}

/* ---------------------------------------------------------------- the loop's side */

static void call_free(struct map_call *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

/* Every call still waiting gets -EPIPE (unmaps are dropped: the registrar's
 * mappings go with it). */
static void fail_pending(struct odpd_registrar *g, const char *why)
{
	struct odpd_err err = { 0 };

	err_set(&err, EPIPE, "the implicit-ODP registrar (pid %d) %s (odpd's log says more)", (int)g->pid, why);
	if (g->ev_write)
		event_del(g->ev_write);
	if (g->ev_timeout)
		evtimer_del(g->ev_timeout);
	while (g->head) {
		struct map_call *c = g->head;
		g->head = c->next;
		if (c->cb)
			c->cb(c->arg, -EPIPE, &err);
		call_free(c);
	}
	g->tail = &g->head;
	g->unsent = NULL;
}

/* It exited, misbehaved or hangs: never talk to it again. */
static void mark_dead(struct odpd_registrar *g, const char *why)
{
	if (atomic_exchange(&g->dead, true) && !g->head)
		return;
	log_warning("%s: implicit-ODP registrar (pid %d) %s", g->label, (int)g->pid, why);
	kill(g->pid, SIGKILL);                  /* if it is still there: it may hang */
	if (g->ev)
		event_del(g->ev);
	fail_pending(g, why);
}

static void arm_timeout(struct odpd_registrar *g)
{
	static const struct timeval tv = { MAPS_TIMEOUT_MS / 1000, (MAPS_TIMEOUT_MS % 1000) * 1000 };

	if (g->head && g->head->sent)
		evtimer_add(g->ev_timeout, &tv);     /* (re)started for the oldest call */
	else
		evtimer_del(g->ev_timeout);
}

/* Send what the socket takes, in order. 0, or -errno (then it is dead). */
static int flush_calls(struct odpd_registrar *g)
{
	while (g->unsent) {
		struct map_call *c = g->unsent;
		int rc = send_msg(g->maps_fd, &c->msg, c->fd, MSG_DONTWAIT);

		if (rc == -EAGAIN) {
			event_add(g->ev_write, NULL);
			return 0;
		}
		if (rc < 0)
			return rc;
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		c->sent = true;
		g->unsent = c->next;
		if (c == g->head)
			arm_timeout(g);
	}
	event_del(g->ev_write);
	return 0;
}

static void on_maps_writable(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registrar *g = arg;
	int rc;

	(void)fd;
	(void)what;
	rc = flush_calls(g);
	if (rc < 0)
		mark_dead(g, rc == -EPIPE || rc == -ECONNRESET ? "exited" : "cannot be written to");
}

static void on_maps_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registrar *g = arg;

	(void)fd;
	(void)what;
	mark_dead(g, g->dead_why ? g->dead_why : "did not answer a map in time: killed");
}

static void on_maps(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registrar *g = arg;
	struct odpd_reg_reply rep;
	struct odpd_err err = { 0 };

	(void)what;
	for (;;) {
		struct map_call *c = g->head;
		int rc = recv_reply((int)fd, &rep, MSG_DONTWAIT);

		if (rc == -EAGAIN || rc == -EINTR)
			return;
		if (rc < 0 || !c || !c->sent) {
			mark_dead(g, rc == -EPIPE || rc == -ECONNRESET ? "exited" :
				  rc < 0 ? "sent a malformed answer" : "answered nothing asked");
			return;
		}
		g->head = c->next;
		if (!g->head)
			g->tail = &g->head;
		arm_timeout(g);
		if (!c->cb) {
			if (rep.error)
				log_warning("%s: registrar: unmapping segment %" PRIu64 ": %s", g->label,
					    c->msg.id, rep.message);
		} else if (rep.error) {
			err_set(&err, rep.error, "%s", rep.message);
			c->cb(c->arg, -rep.error, &err);
		} else {
			c->cb(c->arg, 0, NULL);
		}
		call_free(c);
		if (atomic_load(&g->dead) || !g->ev)  /* a callback stopped it */
			return;
	}
}

/* Move @fd to 5 or above, so that the child's dup2 onto 3 and 4 can clobber
 * neither (nor leave a descriptor already at 3 with its close-on-exec). */
static int fd_high(int fd)
{
	int nfd;

	if (fd >= 5)
		return fd;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 5);
	close(fd);
	return nfd;
}

/* What of odpd's environment the registrar needs: where libibverbs and its
 * providers are, and their own settings. Nothing else (systemd's sockets,
 * credentials, odpd's own settings) is the client's business. */
static bool env_passed(const char *e)
{
	static const char *const prefixes[] = {
		"LD_LIBRARY_PATH=", "RDMAV_", "IBV_", "MLX5_", "MLX4_", "RXE_",
		"ASAN_OPTIONS=", "LSAN_OPTIONS=", "UBSAN_OPTIONS=",
	};

	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (strncmp(e, prefixes[i], strlen(prefixes[i])) == 0)
			return true;
	return false;
}

static int spawn(struct odpd_registrar *g, int child_maps, int child_verbs, uid_t uid, gid_t gid,
		 struct odpd_err *err)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t all, none;
	char ppid[16], suid[16], sgid[16];
	char *argv[] = { "odpd-registrar", ppid, suid, sgid, NULL };
	char *envp[32];
	const char *path = odpd_registrar_path();
	unsigned n = 0;
	int rc;

	snprintf(ppid, sizeof(ppid), "%d", (int)getpid());
	snprintf(suid, sizeof(suid), "%u", (unsigned)uid);
	snprintf(sgid, sizeof(sgid), "%u", (unsigned)gid);
	for (char **e = environ; *e && n < sizeof(envp) / sizeof(envp[0]) - 1; e++)
		if (env_passed(*e))
			envp[n++] = *e;
	envp[n] = NULL;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, child_maps, ODPD_REG_MAPS_FD);
	posix_spawn_file_actions_adddup2(&fa, child_verbs, ODPD_REG_VERBS_FD);
	/* Nothing else of odpd's: every client's socket and segment is one
	 * of its fds (they are close-on-exec too; this does not rely on it). */
	posix_spawn_file_actions_addclosefrom_np(&fa, ODPD_REG_VERBS_FD + 1);
	posix_spawnattr_init(&attr);
	sigfillset(&all);
	sigemptyset(&none);
	posix_spawnattr_setsigdefault(&attr, &all);   /* odpd ignores SIGPIPE */
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	rc = posix_spawn(&g->pid, path, &fa, &attr, argv, envp);
	posix_spawnattr_destroy(&attr);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return err_set(err, rc, "cannot start the implicit-ODP registrar %s: %s", path, strerror(rc));
	return 0;
}

int odpd_registrar_spawn(struct event_base *base, const char *label, uid_t uid, gid_t gid,
			 struct odpd_registrar **ret, struct odpd_err *err)
{
	struct odpd_registrar *g = calloc(1, sizeof(*g));
	int maps[2] = { -1, -1 }, verbs[2] = { -1, -1 };
	int rc;

	if (!g)
		return err_set(err, ENOMEM, "out of memory");
	g->pidfd = g->maps_fd = g->verbs_fd = -1;
	g->tail = &g->head;
	pthread_mutex_init(&g->lock, NULL);
	atomic_init(&g->dead, false);
	atomic_init(&g->refs, 1);
	snprintf(g->label, sizeof(g->label), "%s", label);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, maps) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, verbs) < 0) {
		rc = err_set(err, errno, "socketpair for the registrar: %s", strerror(errno));
		goto fail;
	}
	maps[1] = fd_high(maps[1]);
	verbs[1] = fd_high(verbs[1]);
	if (maps[1] < 0 || verbs[1] < 0) {
		rc = err_set(err, errno, "fcntl(F_DUPFD_CLOEXEC): %s", strerror(errno));
		goto fail;
	}
	rc = spawn(g, maps[1], verbs[1], uid, gid, err);
	if (rc < 0)
		goto fail;
	g->pidfd = (int)syscall(SYS_pidfd_open, g->pid, 0);
	close(maps[1]);
	close(verbs[1]);
	g->maps_fd = maps[0];
	g->verbs_fd = verbs[0];
	g->ev = event_new(base, g->maps_fd, EV_READ | EV_PERSIST, on_maps, g);
	g->ev_write = event_new(base, g->maps_fd, EV_WRITE | EV_PERSIST, on_maps_writable, g);
	g->ev_timeout = evtimer_new(base, on_maps_timeout, g);
	if (!g->ev || !g->ev_write || !g->ev_timeout || event_add(g->ev, NULL) < 0) {
		err_set(err, ENOMEM, "out of memory");
		odpd_registrar_stop(g);
		odpd_registrar_reap(g);
		return -ENOMEM;
	}
	log_info("%s: implicit-ODP registrar started (pid %d, uid %u)", label, (int)g->pid, (unsigned)uid);
	*ret = g;
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		if (maps[i] >= 0)
			close(maps[i]);
		if (verbs[i] >= 0)
			close(verbs[i]);
	}
	pthread_mutex_destroy(&g->lock);
	free(g);
	return rc;
}

/* Queue a call (a dup of @fd goes with it) and send what can be sent. */
static int map_send(struct odpd_registrar *g, const struct odpd_reg_msg *msg, int fd,
		    odpd_registrar_cb cb, void *arg)
{
	struct map_call *c;
	int rc;

	if (atomic_load(&g->dead) || g->maps_fd < 0)
		return -EPIPE;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	if (fd >= 0 && (c->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
		rc = -errno;
		free(c);
		return rc;
	}
	c->msg = *msg;
	c->cb = cb;
	c->arg = arg;
	*g->tail = c;
	g->tail = &c->next;
	if (!g->unsent)
		g->unsent = c;
	rc = flush_calls(g);
	if (rc < 0) {
		/* @c is on the list: its callback runs with -EPIPE like the rest,
		 * on the next turn of the loop, never inside this call. */
		atomic_store(&g->dead, true);
		g->dead_why = rc == -EPIPE || rc == -ECONNRESET || rc == -ECONNREFUSED ? "exited" :
			      "cannot be written to";
		event_active(g->ev_timeout, EV_TIMEOUT, 0);
	}
	return 0;
}

int odpd_registrar_map(struct odpd_registrar *g, uint64_t id, int fd, uint64_t addr, uint64_t length,
		       uint64_t offset, bool writable, odpd_registrar_cb cb, void *arg)
{
	struct odpd_reg_msg msg = {
		.magic = ODPD_REG_MAGIC, .op = ODPD_REG_MAP, .id = id, .addr = addr,
		.length = length, .offset = offset, .writable = writable,
	};

	return map_send(g, &msg, fd, cb, arg);
}

void odpd_registrar_unmap(struct odpd_registrar *g, uint64_t id)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = id };

	/* An unmap is never dropped: a registrar that cannot take it goes. */
	if (map_send(g, &msg, -1, NULL, NULL) == -ENOMEM) {
		atomic_store(&g->dead, true);
		g->dead_why = "could not be told to unmap (out of memory): killed";
		event_active(g->ev_timeout, EV_TIMEOUT, 0);
	}
}

void odpd_registrar_stop(struct odpd_registrar *g)
{
	if (g->ev)
		event_free(g->ev);
	g->ev = NULL;
	fail_pending(g, "was stopped");
	if (g->ev_write)
		event_free(g->ev_write);
	if (g->ev_timeout)
		event_free(g->ev_timeout);
	g->ev_write = g->ev_timeout = NULL;
	if (g->maps_fd >= 0)
		close(g->maps_fd);
	g->maps_fd = -1;
}

void odpd_registrar_get(struct odpd_registrar *g)
{
	atomic_fetch_add(&g->refs, 1);
}

/* ---------------------------------------------------------------- the workers' side */

/* One verb: send @msg (and @fd), wait for the answer. Under g->lock. */
static int verbs_call(struct odpd_registrar *g, const struct odpd_reg_msg *msg, int fd,
		      struct odpd_reg_reply *rep, struct odpd_err *err)
{
	struct pollfd p = { .fd = g->verbs_fd, .events = POLLIN };
	int rc;

	if (atomic_load(&g->dead))
		return err_set(err, EPIPE, "the implicit-ODP registrar (pid %d) has exited", (int)g->pid);
	rc = send_msg(g->verbs_fd, msg, fd, 0);
	if (rc < 0)
		goto dead;
	rc = odpd_poll(&p, 1, VERBS_TIMEOUT_MS);
	if (rc <= 0) {                       /* no answer in time, or no way to wait for one */
		log_error("%s: implicit-ODP registrar (pid %d) did not answer in %d s%s%s: killing it",
			  g->label, (int)g->pid, VERBS_TIMEOUT_MS / 1000, rc < 0 ? ": poll: " : "",
			  rc < 0 ? strerror(-rc) : "");
		kill(g->pid, SIGKILL);
		atomic_store(&g->dead, true);
		return err_set(err, ETIMEDOUT, "the implicit-ODP registrar did not answer");
	}
	rc = recv_reply(g->verbs_fd, rep, 0);
	if (rc < 0)
		goto dead;
	if (rep->error)
		return err_set(err, rep->error, "%s", rep->message);
	return 0;
dead:
	atomic_store(&g->dead, true);
	return err_set(err, EPIPE, "the implicit-ODP registrar (pid %d) %s", (int)g->pid,
		       rc == -EBADMSG ? "sent a malformed answer" : "has exited");
}

int odpd_registrar_init(struct odpd_registrar *g, int cmd_fd, uint32_t pd_handle, struct odpd_err *err)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_INIT, .pd_handle = pd_handle };
	struct odpd_reg_reply rep;
	int rc = 0;

	pthread_mutex_lock(&g->lock);
	if (!g->ready) {
		rc = verbs_call(g, &msg, cmd_fd, &rep, err);
		g->ready = rc == 0;
	}
	pthread_mutex_unlock(&g->lock);
	return rc;
}

bool odpd_registrar_ready(struct odpd_registrar *g)
{
	bool ready;

	pthread_mutex_lock(&g->lock);
	ready = g->ready && !atomic_load(&g->dead);
	pthread_mutex_unlock(&g->lock);
	return ready;
}

int odpd_registrar_reg(struct odpd_registrar *g, uint32_t access, uint32_t *ret_handle, struct odpd_err *err)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_REG, .access = access };
	struct odpd_reg_reply rep;
	int rc;

	pthread_mutex_lock(&g->lock);
	rc = verbs_call(g, &msg, -1, &rep, err);
	pthread_mutex_unlock(&g->lock);
	if (rc == 0)
		*ret_handle = rep.mr_handle;
	return rc;
}

int odpd_registrar_dereg(struct odpd_registrar *g, uint32_t handle, struct odpd_err *err)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_DEREG, .mr_handle = handle };
	struct odpd_reg_reply rep;
	int rc;

	pthread_mutex_lock(&g->lock);
	rc = verbs_call(g, &msg, -1, &rep, err);
	pthread_mutex_unlock(&g->lock);
	return rc;
}

/* Worker: wait for the registrar's exit. */
static void reap_wait(struct odpd_registrar *g)
{
	int status = 0;
	pid_t r;

	if (g->verbs_fd >= 0)
		close(g->verbs_fd);        /* with the maps socket closed: EOF, it exits */
	if (g->pidfd >= 0) {
		struct pollfd p = { .fd = g->pidfd, .events = POLLIN };

		/* not exited in time, or no way to wait for it: the waitpid
		 * below must not block on a stopped registrar */
		if (odpd_poll(&p, 1, EXIT_TIMEOUT_MS) <= 0) {
			log_warning("%s: implicit-ODP registrar (pid %d) did not exit: killing it",
				    g->label, (int)g->pid);
			kill(g->pid, SIGKILL);
		}
		close(g->pidfd);
	} else {
		kill(g->pid, SIGKILL);      /* no pidfd: cannot wait with a timeout */
	}
	do
		r = waitpid(g->pid, &status, 0);
	while (r < 0 && errno == EINTR);
	if (r == g->pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
	    !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
		log_warning("%s: implicit-ODP registrar (pid %d) ended with %s %d", g->label, (int)g->pid,
			    WIFEXITED(status) ? "exit status" : "signal",
			    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	else
		log_info("%s: implicit-ODP registrar (pid %d) ended", g->label, (int)g->pid);
}

void odpd_registrar_put(struct odpd_registrar *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&g->lock);
	free(g);
}

void odpd_registrar_reap(struct odpd_registrar *g)
{
	if (!g)
		return;
	reap_wait(g);
	odpd_registrar_put(g);
}

static void discard_run(struct odpd_job *job)
{
	reap_wait((struct odpd_registrar *)((char *)job - offsetof(struct odpd_registrar, discard)));
}

static void discard_done(struct odpd_job *job)
{
	odpd_registrar_put((struct odpd_registrar *)((char *)job - offsetof(struct odpd_registrar, discard)));
}

void odpd_registrar_discard(struct odpd_registrar *g, struct odpd_pool *pool)
{
	odpd_registrar_stop(g);
	g->discard.run = discard_run;
	g->discard.done = discard_done;
	odpd_pool_submit(pool, &g->discard);
}
