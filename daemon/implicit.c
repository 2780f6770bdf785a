/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

/*
 * How long the loop waits for the answer to the oldest call on a socket, ms:
 * a map, and a verb (importing a PD, registering or deregistering an
 * implicit MR pins nothing: fast). The registrar runs as the client's uid,
 * which may stop it (SIGSTOP): then it is killed. Meanwhile only the
 * requests that wait for it wait: no thread of odpd does (issue 23).
 */
#define MAPS_TIMEOUT_MS 10000
#define VERBS_TIMEOUT_MS 2000
/* After closing its sockets, how long the registrar may take to exit, ms;
 * then, or at once without a pidfd, it is killed, and the loop looks for
 * its exit this often until it is collected. */
#define EXIT_TIMEOUT_MS 3000
#define EXIT_POLL_MS 10

/* A call: queued, sent in order as its socket takes it, then waiting for
 * its answer (in order). Never dropped: a registrar that cannot take one is
 * discarded, and every call still queued is failed. */
struct call {
	struct call *next;
	odpd_registrar_cb cb;               /* a map's */
	odpd_registrar_verb_cb vcb;         /* a verb's; neither: an unmap or an INIT */
	void *arg;
	struct odpd_reg_msg msg;
	int fd;                             /* ours (a dup), sent with msg; -1 */
	bool sent;
	struct call *reg;                   /* INIT: the REG queued right after it */
	struct odpd_err *init_err;          /* REG: why that INIT failed (its answer), or NULL */
};

/* One of the two sockets, and its calls. */
struct chan {
	struct odpd_registrar *g;
	int fd;
	int timeout_ms;
	int late_errno;                     /* for a call not answered in time */
	const char *what;                   /* "a map", "a verb" */
	struct event *ev;                   /* readable */
	struct event *ev_write;             /* writable, while calls wait to be sent */
	struct event *ev_timeout;           /* the oldest call's answer is late */
	struct call *head, **tail;          /* sent ones first */
	struct call *unsent;                /* the first not yet sent, or NULL */
};

enum init_state { INIT_NONE, INIT_SENT, INIT_DONE };

struct odpd_registrar {
	struct event_base *base;
	pid_t pid;
	int pidfd;                          /* -1 where pidfd_open is missing */
	struct chan maps, verbs;
	struct event *ev_dead;              /* made active: fail the calls on the next turn */
	atomic_uint refs;                   /* the domain's, each implicit MR's, handlers' */
	enum init_state init;               /* the PD imported? */
	bool dead;                          /* exited, misbehaved or hangs: no new call */
	bool killed;                        /* said and SIGKILLed */
	bool stopped;                       /* sockets closed, events freed */
	const char *dead_why;               /* found dead inside a call: said on the next turn */
	char label[64];
	/* reaping (odpd_registrar_reap) */
	struct event *ev_exit;              /* the pidfd readable, or a timer */
	bool exit_killed;
	void (*reaped)(void *arg);
	void *reaped_arg;
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

bool odpd_registrar_dead(const struct odpd_registrar *g)
{
	return g->dead || g->stopped;
}

void odpd_registrar_get(struct odpd_registrar *g)
{
	atomic_fetch_add(&g->refs, 1);
}

void odpd_registrar_put(struct odpd_registrar *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	free(g);
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

/* ---------------------------------------------------------------- calls */

static void call_free(struct call *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->init_err);
	free(c);
}

/* Answer @c: @rc 0 with the registrar's @rep, or -errno with @err (@rep
 * NULL when the registrar did not answer it). */
static void call_answer(struct odpd_registrar *g, struct call *c, int rc, const struct odpd_err *err,
			const struct odpd_reg_reply *rep)
{
	if (c->msg.op == ODPD_REG_INIT) {
		g->init = rc == 0 ? INIT_DONE : INIT_NONE;
		/* The REG after it answers with this failure, not with its own
		 * ("no PD yet"); without memory for it, with its own. */
		if (rc < 0 && c->reg && !c->reg->init_err && (c->reg->init_err = malloc(sizeof(*err))))
			*c->reg->init_err = *err;
	} else if (c->vcb && c->init_err) {
		c->vcb(c->arg, -c->init_err->code, c->init_err, 0);
	} else if (c->vcb) {
		c->vcb(c->arg, rc, err, rc == 0 && c->msg.op == ODPD_REG_REG ? rep->mr_handle : c->msg.mr_handle);
	} else if (c->cb) {
		c->cb(c->arg, rc, err);
	} else if (rc < 0 && rep) {
		log_warning("%s: registrar: unmapping segment %" PRIu64 ": %s", g->label, c->msg.id, err->msg);
	}
}

/* Every call still queued gets -EPIPE, but the oldest one of @late (if
 * not NULL) late->late_errno: it was not answered in time. The queues are
 * taken first, so that a callback that stops the registrar finds them empty. */
static void fail_all(struct odpd_registrar *g, const char *why, struct chan *late)
{
	struct chan *chans[2] = { &g->maps, &g->verbs };
	struct call *lists[2];
	struct odpd_err epipe = { 0 }, etime = { 0 };

	err_set(&epipe, EPIPE, "the implicit-ODP registrar (pid %d) %s (odpd's log says more)", (int)g->pid, why);
	if (late)
		err_set(&etime, late->late_errno, "the implicit-ODP registrar (pid %d) did not answer %s within %d s: "
			"killed (its user may have stopped it)", (int)g->pid, late->what, late->timeout_ms / 1000);
	for (int i = 0; i < 2; i++) {
		lists[i] = chans[i]->head;
		chans[i]->head = chans[i]->unsent = NULL;
		chans[i]->tail = &chans[i]->head;
		if (chans[i]->ev_write)
			event_del(chans[i]->ev_write);
		if (chans[i]->ev_timeout)
			evtimer_del(chans[i]->ev_timeout);
	}
	odpd_registrar_get(g);
	for (int i = 0; i < 2; i++) {
		bool first = true;

		while (lists[i]) {
			struct call *c = lists[i];
			bool is_late = first && chans[i] == late && c->sent;

			lists[i] = c->next;
			first = false;
			call_answer(g, c, is_late ? -late->late_errno : -EPIPE, is_late ? &etime : &epipe, NULL);
			call_free(c);
		}
	}
	odpd_registrar_put(g);
}

/* It exited, misbehaved or hangs: never talk to it again. @late: the
 * socket whose oldest call is late, or NULL. */
static void mark_dead(struct odpd_registrar *g, const char *why, struct chan *late)
{
	g->dead = true;
	if (!g->killed) {
		g->killed = true;
		log_warning("%s: implicit-ODP registrar (pid %d) %s", g->label, (int)g->pid, why);
		if (!g->stopped)
			kill(g->pid, SIGKILL);      /* if it is still there: it may hang */
	}
	if (g->maps.ev)
		event_del(g->maps.ev);
	if (g->verbs.ev)
		event_del(g->verbs.ev);
	fail_all(g, why, late);
}

static void arm_timeout(struct chan *ch)
{
	struct timeval tv = { ch->timeout_ms / 1000, (ch->timeout_ms % 1000) * 1000 };

	if (ch->head && ch->head->sent)
		evtimer_add(ch->ev_timeout, &tv);    /* (re)started for the oldest call */
	else
		evtimer_del(ch->ev_timeout);
}

/* Send what the socket takes, in order. 0, or -errno (then it is dead). */
static int flush_calls(struct chan *ch)
{
	while (ch->unsent) {
		struct call *c = ch->unsent;
		int rc = send_msg(ch->fd, &c->msg, c->fd, MSG_DONTWAIT);

		if (rc == -EAGAIN) {
			event_add(ch->ev_write, NULL);
			return 0;
		}
		if (rc < 0)
			return rc;
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		c->sent = true;
		ch->unsent = c->next;
		if (c == ch->head)
			arm_timeout(ch);
	}
	event_del(ch->ev_write);
	return 0;
}

static const char *send_error_why(int rc)
{
	return rc == -EPIPE || rc == -ECONNRESET || rc == -ECONNREFUSED ? "exited" : "cannot be written to";
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct chan *ch = arg;
	int rc;

	(void)fd;
	(void)what;
	rc = flush_calls(ch);
	if (rc < 0)
		mark_dead(ch->g, send_error_why(rc), NULL);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct chan *ch = arg;

	(void)fd;
	(void)what;
	mark_dead(ch->g, ch == &ch->g->maps ? "did not answer a map in time: killed" :
		  "did not answer a verb in time: killed", ch);
}

/* Found dead inside a call (map_send): failed here, on the next turn. */
static void on_dead(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registrar *g = arg;

	(void)fd;
	(void)what;
	mark_dead(g, g->dead_why ? g->dead_why : "is gone", NULL);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct chan *ch = arg;
	struct odpd_registrar *g = ch->g;
	struct odpd_reg_reply rep;
	struct odpd_err err = { 0 };

	(void)what;
	odpd_registrar_get(g);                  /* a callback may drop the last other one */
	while (!g->dead && !g->stopped) {
		struct call *c = ch->head;
		int rc = recv_reply((int)fd, &rep, MSG_DONTWAIT);

		if (rc == -EAGAIN || rc == -EINTR)
			break;
		if (rc < 0 || !c || !c->sent) {
			mark_dead(g, rc == -EPIPE || rc == -ECONNRESET ? "exited" :
				  rc < 0 ? "sent a malformed answer" : "answered nothing asked", NULL);
			break;
		}
		ch->head = c->next;
		if (!ch->head)
			ch->tail = &ch->head;
		arm_timeout(ch);
		if (rep.error)
			err_set(&err, rep.error, "%s", rep.message);
		call_answer(g, c, rep.error ? -rep.error : 0, rep.error ? &err : NULL, &rep);
		call_free(c);
	}
	odpd_registrar_put(g);
}

/* A call of @msg (with a dup of @fd, if >= 0), not queued yet; NULL: -errno in *@rc. */
static struct call *call_new(const struct odpd_reg_msg *msg, int fd, int *rc)
{
	struct call *c = calloc(1, sizeof(*c));

	if (!c) {
		*rc = -ENOMEM;
		return NULL;
	}
	c->fd = -1;
	if (fd >= 0 && (c->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
		*rc = -errno;
		free(c);
		return NULL;
	}
	c->msg = *msg;
	return c;
}

/* Queue @c on @ch and send what can be sent. Its callback runs later in
 * any case: a registrar found dead here fails it on the next turn. */
static void call_queue(struct odpd_registrar *g, struct chan *ch, struct call *c)
{
	int rc;

	*ch->tail = c;
	ch->tail = &c->next;
	if (!ch->unsent)
		ch->unsent = c;
	if (g->dead)
		return;                        /* on_dead fails it */
	rc = flush_calls(ch);
	if (rc < 0) {
		g->dead = true;
		g->dead_why = send_error_why(rc);
		event_active(g->ev_dead, EV_TIMEOUT, 0);
	}
}

/* Queue one call; 0 (a callback will run) or -errno (none will). */
static int call_send(struct odpd_registrar *g, struct chan *ch, const struct odpd_reg_msg *msg, int fd,
		     odpd_registrar_cb cb, odpd_registrar_verb_cb vcb, void *arg)
{
	struct call *c;
	int rc;

	if (g->dead || g->stopped)
		return -EPIPE;
	c = call_new(msg, fd, &rc);
	if (!c)
		return rc;
	c->cb = cb;
	c->vcb = vcb;
	c->arg = arg;
	call_queue(g, ch, c);
	return 0;
}

int odpd_registrar_map(struct odpd_registrar *g, uint64_t id, int fd, uint64_t addr, uint64_t length,
		       uint64_t offset, bool writable, odpd_registrar_cb cb, void *arg)
{
	struct odpd_reg_msg msg = {
		.magic = ODPD_REG_MAGIC, .op = ODPD_REG_MAP, .id = id, .addr = addr,
		.length = length, .offset = offset, .writable = writable,
	};

	return call_send(g, &g->maps, &msg, fd, cb, NULL, arg);
}

void odpd_registrar_unmap(struct odpd_registrar *g, uint64_t id)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_UNMAP, .id = id };

	/* An unmap is never dropped: a registrar that cannot take it goes. */
	if (call_send(g, &g->maps, &msg, -1, NULL, NULL, NULL) == -ENOMEM) {
		g->dead = true;
		g->dead_why = "could not be told to unmap (out of memory): killed";
		event_active(g->ev_dead, EV_TIMEOUT, 0);
	}
}

int odpd_registrar_reg(struct odpd_registrar *g, int cmd_fd, uint32_t pd_handle, uint32_t access,
		       odpd_registrar_verb_cb cb, void *arg)
{
	struct odpd_reg_msg init = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_INIT, .pd_handle = pd_handle };
	struct odpd_reg_msg reg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_REG, .access = access };
	struct call *ic = NULL, *rc_call;
	int rc;

	if (g->dead || g->stopped)
		return -EPIPE;
	if (g->init == INIT_NONE && !(ic = call_new(&init, cmd_fd, &rc)))
		return rc;
	rc_call = call_new(&reg, -1, &rc);
	if (!rc_call) {
		if (ic)
			call_free(ic);
		return rc;
	}
	rc_call->vcb = cb;
	rc_call->arg = arg;
	if (ic) {
		/* Answered in order on the verbs socket: the REG right after it
		 * learns whether the PD was imported. */
		ic->reg = rc_call;
		g->init = INIT_SENT;
		call_queue(g, &g->verbs, ic);
	}
	call_queue(g, &g->verbs, rc_call);
	return 0;
}

int odpd_registrar_dereg(struct odpd_registrar *g, uint32_t mr_handle, odpd_registrar_verb_cb cb, void *arg)
{
	struct odpd_reg_msg msg = { .magic = ODPD_REG_MAGIC, .op = ODPD_REG_DEREG, .mr_handle = mr_handle };

	return call_send(g, &g->verbs, &msg, -1, NULL, cb, arg);
}

/* ---------------------------------------------------------------- spawning */

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

static int chan_open(struct odpd_registrar *g, struct chan *ch, int fd, int timeout_ms, int late_errno,
		     const char *what)
{
	ch->g = g;
	ch->fd = fd;
	ch->timeout_ms = timeout_ms;
	ch->late_errno = late_errno;
	ch->what = what;
	ch->tail = &ch->head;
	ch->ev = event_new(g->base, fd, EV_READ | EV_PERSIST, on_readable, ch);
	ch->ev_write = event_new(g->base, fd, EV_WRITE | EV_PERSIST, on_writable, ch);
	ch->ev_timeout = evtimer_new(g->base, on_timeout, ch);
	return ch->ev && ch->ev_write && ch->ev_timeout && event_add(ch->ev, NULL) == 0 ? 0 : -ENOMEM;
}

static void chan_close(struct chan *ch)
{
	if (ch->ev)
		event_free(ch->ev);
	if (ch->ev_write)
		event_free(ch->ev_write);
	if (ch->ev_timeout)
		event_free(ch->ev_timeout);
	ch->ev = ch->ev_write = ch->ev_timeout = NULL;
}

int odpd_registrar_spawn(struct event_base *base, const char *label, uid_t uid, gid_t gid,
			 struct odpd_registrar **ret, struct odpd_err *err)
{
	struct odpd_registrar *g = calloc(1, sizeof(*g));
	int maps[2] = { -1, -1 }, verbs[2] = { -1, -1 };
	int rc;

	if (!g)
		return err_set(err, ENOMEM, "out of memory");
	g->base = base;
	g->pidfd = g->maps.fd = g->verbs.fd = -1;
	g->maps.tail = &g->maps.head;
	g->verbs.tail = &g->verbs.head;
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
	g->ev_dead = evtimer_new(base, on_dead, g);
	/* A late map is EPIPE like a dead registrar's (attaches go on without
	 * it: attach.c); a late verb ETIMEDOUT, the answer to its request. */
	if (chan_open(g, &g->maps, maps[0], MAPS_TIMEOUT_MS, EPIPE, "a map") < 0 ||
	    chan_open(g, &g->verbs, verbs[0], VERBS_TIMEOUT_MS, ETIMEDOUT, "a verb") < 0 || !g->ev_dead) {
		err_set(err, ENOMEM, "out of memory");
		if (g->maps.fd < 0)
			close(maps[0]);
		if (g->verbs.fd < 0)
			close(verbs[0]);
		odpd_registrar_reap_now(g);
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
	free(g);
	return rc;
}

void odpd_registrar_stop(struct odpd_registrar *g)
{
	if (g->stopped)
		return;
	g->stopped = true;
	chan_close(&g->maps);
	chan_close(&g->verbs);
	if (g->ev_dead)
		event_free(g->ev_dead);
	g->ev_dead = NULL;
	fail_all(g, "was stopped", NULL);
	/* EOF on either: it exits */
	if (g->maps.fd >= 0)
		close(g->maps.fd);
	if (g->verbs.fd >= 0)
		close(g->verbs.fd);
	g->maps.fd = g->verbs.fd = -1;
}

/* ---------------------------------------------------------------- reaping */

/* Has it exited? Then it is collected (and said how). */
static bool collect(struct odpd_registrar *g)
{
	int status = 0;
	pid_t r;

	do
		r = waitpid(g->pid, &status, WNOHANG);
	while (r < 0 && errno == EINTR);
	if (r == 0)
		return false;
	if (r == g->pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
	    !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
		log_warning("%s: implicit-ODP registrar (pid %d) ended with %s %d", g->label, (int)g->pid,
			    WIFEXITED(status) ? "exit status" : "signal",
			    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	else
		log_info("%s: implicit-ODP registrar (pid %d) ended", g->label, (int)g->pid);
	return true;
}

static void reaped(struct odpd_registrar *g)
{
	void (*done)(void *) = g->reaped;
	void *arg = g->reaped_arg;

	if (g->ev_exit)
		event_free(g->ev_exit);
	g->ev_exit = NULL;
	if (g->pidfd >= 0)
		close(g->pidfd);
	g->pidfd = -1;
	odpd_registrar_put(g);                  /* the domain's */
	if (done)
		done(arg);
}

static void on_exit_event(evutil_socket_t fd, short what, void *arg)
{
	static const struct timeval poll_tv = { 0, EXIT_POLL_MS * 1000 };
	struct odpd_registrar *g = arg;

	(void)fd;
	if (collect(g)) {
		reaped(g);
		return;
	}
	if ((what & EV_TIMEOUT) && !g->exit_killed) {
		/* stopped, or hanging: it will not exit by itself */
		log_warning("%s: implicit-ODP registrar (pid %d) did not exit: killing it", g->label, (int)g->pid);
		kill(g->pid, SIGKILL);
		g->exit_killed = true;
	}
	if (event_add(g->ev_exit, &poll_tv) < 0) {
		log_error("%s: cannot wait for the registrar on the loop: waiting here", g->label);
		odpd_registrar_reap_now(g);     /* (ev_exit is freed by reaped) */
	}
}

void odpd_registrar_reap(struct odpd_registrar *g, void (*done)(void *arg), void *arg)
{
	struct timeval tv = { EXIT_TIMEOUT_MS / 1000, (EXIT_TIMEOUT_MS % 1000) * 1000 };

	odpd_registrar_stop(g);
	g->reaped = done;
	g->reaped_arg = arg;
	if (g->pidfd >= 0) {
		g->ev_exit = event_new(g->base, g->pidfd, EV_READ, on_exit_event, g);
	} else {
		kill(g->pid, SIGKILL);          /* no pidfd: cannot wait for its exit with a timeout */
		g->exit_killed = true;
		g->ev_exit = evtimer_new(g->base, on_exit_event, g);
		tv = (struct timeval){ 0, EXIT_POLL_MS * 1000 };
	}
	if (!g->ev_exit || event_add(g->ev_exit, &tv) < 0) {
		log_error("%s: out of memory: reaping the registrar on the loop at once", g->label);
		odpd_registrar_reap_now(g);
	}
}

void odpd_registrar_reap_now(struct odpd_registrar *g)
{
	odpd_registrar_stop(g);
	if (!collect(g)) {
		kill(g->pid, SIGKILL);          /* even a stopped process dies at once */
		while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR)
			;
		log_info("%s: implicit-ODP registrar (pid %d) killed", g->label, (int)g->pid);
	}
	reaped(g);
}
