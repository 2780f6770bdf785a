/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client.h"
#include "slab.h"
#include "hittab.h"
#include "domain.h"
#include "log.h"
#include "odpd-envelope.h"
#include "odpd-wire.h"
#include "peer.h"
#include "config.h"
#include "stages.h"
#include "request.h"


#define OUTQ_MAX 64                  /* replies queued for a slow reader */
#define ACCEPT_PAUSE_MS 200          /* accept4 out of fds or memory: stop listening this long */
#define REFUSED_MS 100               /* a refused connection waits this long for its Hello */
#define REFUSING_MAX 4               /* refused connections of one user waiting for that; beyond: closed */
/* One packet per wake-up: a client that waits for each answer (libodpd)
 * then costs no recvmsg that finds nothing, and the loop takes turns
 * between clients (its epoll is level-triggered: a client with more
 * packets wakes it again at once). */
#define PACKETS_PER_WAKEUP 1
/* After a request that wants no answer (DeregMr.no_reply) the client is
 * not waiting: the one-way requests it sent next are read in the same
 * turn, up to this many (a request that waits stays for its next turn:
 * client_next_oneway). So a one-way release is done before any request
 * that another connection sent after it (its epoll readiness came first):
 * the user's charges are as they would be had the client waited for an
 * answer. */
#define ONEWAY_PER_WAKEUP 64

static void client_on_read(evutil_socket_t fd, short what, void *arg);
static void client_teardown(struct odpd_client *c);
static void client_reap_later(struct odpd_client *c);
static void client_on_write(evutil_socket_t fd, short what, void *arg);
static void outq_push(struct odpd_client *c, struct odpd_answer *it);
static void notify_complete(void *ctx, uint64_t conn, uint64_t id, struct odpd_out *o);
static bool notify_connected(void *ctx, uint64_t conn);
static unsigned notify_clients(void *ctx, struct odpd_conn_view *v, unsigned cap, unsigned *monitors);

static bool peer_is_admin(const struct odpd_manager *m, const struct odpd_client *c)
{
	if (c->cred.uid == 0)
		return true;
	if (!m->cfg.has_admin_gid)
		return false;
	if (c->cred.gid == m->cfg.admin_gid)
		return true;
	for (unsigned i = 0; i < c->n_groups; i++)
		if (c->groups[i] == m->cfg.admin_gid)
			return true;
	return false;
}

static void client_read_name(struct odpd_client *c)
{
	char path[64];
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)c->cred.pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, c->name, sizeof(c->name) - 1);
	close(fd);
	if (n > 0)
		c->name[strcspn(c->name, "\n")] = 0;
}

/* Give back the user's connection before the holder (and maybe the account) goes. */
static void client_release_holder(struct odpd_client *c)
{
	if (!c->has_holder)
		return;
	if (c->holds_connection)
		odpd_account_hold(c->holder.acct, ODPD_UL_CONNECTIONS, -1);
	c->holds_connection = false;
	if (c->refused && c->counted_refused) {
		c->holder.acct->refusing--;
		c->m->n_refused--;
	}
	c->counted_refused = false;
	odpd_holder_release(&c->m->registry, &c->holder);
	c->has_holder = false;
}

#define CONN_BUCKETS (sizeof(((struct odpd_manager *)0)->conn_ids) / sizeof(((struct odpd_manager *)0)->conn_ids[0]))

/* Connection @id, connected or not, until it is freed; NULL once freed. */
static struct odpd_client *client_by_id(struct odpd_manager *m, uint64_t id)
{
	struct odpd_client *c;

	LIST_FOREACH(c, &m->conn_ids[id % CONN_BUCKETS], idlink)
		if (c->id == id)
			return c;
	return NULL;
}

struct odpd_client *odpd_client_connected(struct odpd_manager *m, uint64_t id)
{
	struct odpd_client *c = client_by_id(m, id);

	return c && !c->dead ? c : NULL;
}

static void client_free(struct odpd_client *c)
{
	LIST_REMOVE(c, idlink);
	if (c->ev_read)
		event_free(c->ev_read);
	if (c->ev_write)
		event_free(c->ev_write);
	if (c->ev_peer)
		event_free(c->ev_peer);
	if (c->ev_refused)
		event_free(c->ev_refused);
	if (c->pidfd >= 0)
		close(c->pidfd);
	client_release_holder(c);
	free(c->groups);
	free(c->resume_reply);
	free(c->gone_handles);
	free(c->jlast_reply);
	free(c);
}

/* Who the peer is: credentials, groups, pidfd, and what it may pin. */
static int client_identify(struct odpd_manager *m, struct odpd_client *c)
{
	socklen_t len = sizeof(c->cred);
	struct odpd_limit limit;
	struct odpd_err err = { 0 };
	int r;

	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) < 0)
		return -errno;
	r = odpd_peer_groups(c->fd, &c->groups, &c->n_groups);
	if (r < 0)
		return r;
	c->pidfd = odpd_peer_pidfd(c->fd, c->cred.pid);
	{
		struct odpd_peer_stat st;

		if (odpd_peer_stat_read(c->cred.pid, &st) == 0)
			c->starttime = st.starttime;
	}
	c->admin = peer_is_admin(m, c);
	odpd_manager_resolve_names(m);
	r = odpd_limit_for_client(&m->conf, c->cred.pid, c->pidfd, c->cred.uid, c->cred.gid,
				  c->groups, c->n_groups, &m->budget, &limit);
	if (r < 0)
		return r;
	r = odpd_holder_init(&m->registry, &c->holder, c->id, c->cred.pid, c->cred.uid, &limit);
	if (r < 0)
		return r;
	c->has_holder = true;
	if (odpd_account_may(c->holder.acct, &limit, ODPD_UL_CONNECTIONS, 1, &err) < 0) {
		/* Answered at Hello, with the reason, then closed; a user with
		 * REFUSING_MAX such answers pending gets none: closed at once.
		 * Refused connections take no max-clients slot of anyone's. */
		log_ratelimited(LOG_WARNING, "refusing a connection of pid %d (uid %u): %s", (int)c->cred.pid,
				(unsigned)c->cred.uid, err.msg);
		if (c->holder.acct->refusing >= REFUSING_MAX)
			return -EUSERS;
		c->refused = err.code;
		snprintf(c->refused_msg, sizeof(c->refused_msg), "%s", err.msg);
		c->holder.acct->refusing++;
		m->n_refused++;
		c->counted_refused = true;
	} else {
		odpd_account_hold(c->holder.acct, ODPD_UL_CONNECTIONS, 1);
		c->holds_connection = true;
	}
	return 0;
}

/* A refused connection that never said Hello: it holds no slot of its user,
 * so it may not hold one of anyone's for long either. */
static void client_on_refused_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_client *c = arg;

	(void)fd;
	(void)what;
	odpd_client_disconnect(c, c->refused_msg);
}

/* The process that connected has exited: whoever still holds its socket (a
 * child it forked) is not the client odpd checked, so the connection ends
 * with everything it held. */
static void client_on_peer_exit(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_client *c = arg;
	char why[160], how[96];

	(void)fd;
	(void)what;
	if (!odpd_peer_exit_text(c->pidfd, c->cred.pid, c->starttime, how, sizeof(how)))
		snprintf(how, sizeof(how), "its process exited");
	snprintf(why, sizeof(why), "%s (pidfd); another process still held the socket", how);
	odpd_client_disconnect(c, why);
}

static int client_new(struct odpd_manager *m, int fd, uint64_t id, struct odpd_client **ret)
{
	static const struct timeval refused_wait = { 0, REFUSED_MS * 1000 };
	struct odpd_client *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->m = m;
	c->fd = fd;
	c->pidfd = -1;
	c->id = id ? id : ++m->next_client_id;
	LIST_INSERT_HEAD(&m->conn_ids[c->id % CONN_BUCKETS], c, idlink);
	c->outq_tail = &c->outq;
	LIST_INIT(&c->segs.list);
	r = client_identify(m, c);
	if (r < 0) {
		client_free(c);
		return r;
	}
	client_read_name(c);
	c->ev_read = event_new(m->base, fd, EV_READ | EV_PERSIST, client_on_read, c);
	c->ev_write = event_new(m->base, fd, EV_WRITE | EV_PERSIST, client_on_write, c);
	if (c->pidfd >= 0)
		c->ev_peer = event_new(m->base, c->pidfd, EV_READ, client_on_peer_exit, c);
	if (c->refused)
		c->ev_refused = evtimer_new(m->base, client_on_refused_timeout, c);
	if (!c->ev_read || !c->ev_write || event_add(c->ev_read, NULL) < 0 ||
	    (c->pidfd >= 0 && (!c->ev_peer || event_add(c->ev_peer, NULL) < 0)) ||
	    (c->refused && (!c->ev_refused || evtimer_add(c->ev_refused, &refused_wait) < 0))) {
		client_free(c);
		return -ENOMEM;
	}
	LIST_INSERT_HEAD(&m->clients, c, link);
	m->n_clients++;
	*ret = c;
	return 0;
}

int odpd_client_adopt(struct odpd_manager *m, int fd, uint64_t id, const char *name, uint64_t starttime,
		      struct odpd_client **ret)
{
	struct odpd_client *c;
	int r = client_new(m, fd, id, &c);

	if (r < 0)
		return r;
	if (c->refused) {
		odpd_client_disconnect(c, c->refused_msg);
		return -c->refused;
	}
	/* The pid SO_PEERCRED names is the one that connected: if that process
	 * exited during the restart (a child it forked may hold the socket),
	 * the pid is gone or another process's, whose pidfd and limits
	 * client_identify took (without SO_PEERPIDFD). */
	if (starttime && c->starttime != starttime) {
		odpd_client_disconnect(c, "its process exited during the restart");
		return -ESRCH;
	}
	if (name && *name)
		snprintf(c->name, sizeof(c->name), "%s", name);
	c->hello = true;
	*ret = c;
	return 0;
}

void odpd_client_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct odpd_manager *m = arg;
	struct odpd_client *c = NULL;
	int fd, r;

	(void)what;
	fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		int e = errno;

		if (e == EAGAIN || e == EINTR || e == ECONNABORTED)
			return;
		/* Out of fds or memory: the listening socket stays readable, so
		 * retrying now would spin. Pause listening for a moment. */
		log_ratelimited(LOG_WARNING, "accept: %s; not accepting for %d ms", strerror(e),
				ACCEPT_PAUSE_MS);
		odpd_manager_pause_listening(m, ACCEPT_PAUSE_MS);
		return;
	}
	if (m->stopping || m->n_clients - m->n_refused >= m->cfg.max_clients ||
	    odpd_fd_short(m->nofile, fd, false)) {
		log_ratelimited(LOG_WARNING, "refusing a connection: %s", m->stopping ? "shutting down" :
				m->n_clients - m->n_refused >= m->cfg.max_clients ? "max-clients connected" :
				"odpd is short of file descriptors");
		close(fd);
		return;
	}
	r = client_new(m, fd, 0, &c);
	if (r == -ESRCH || r == -EUSERS) {   /* exited before odpd looked; or refused at once */
		log_debug("a client %s", r == -ESRCH ? "exited before it was set up" :
			  "over its user's connection limit was closed without an answer");
		close(fd);
		return;
	}
	if (r < 0) {
		log_ratelimited(LOG_WARNING, "cannot set up a client: %s", strerror(-r));
		close(fd);
		return;
	}
	if (c->refused)                      /* said once, rate-limited, in client_identify */
		return;
	/* said at Hello, which says whether it is a monitor */
	log_debug(CLIENT_FMT " accepted: uid %u (%s)", CLIENT_ARGS(c), (unsigned)c->cred.uid, c->name);
}

/* Monitors (odpctl, one connection per call) at debug: a textfile cron job
 * must not fill the journal. */
static int client_level(const struct odpd_client *c)
{
	return c->refused || c->monitor || !c->hello ? LOG_DEBUG : LOG_INFO;
}

void odpd_client_log_hello(const struct odpd_client *c)
{
	char b[LOG_BYTES_LEN];

	if (c->holder.limit.max_pinned == ODPD_UNLIMITED)
		log_msg(client_level(c), CLIENT_FMT " connected: uid %u (%s)%s, may pin without limit (%s)",
			CLIENT_ARGS(c), (unsigned)c->cred.uid, c->name, c->monitor ? ", a monitor" : "",
			c->holder.limit.rule);
	else
		log_msg(client_level(c), CLIENT_FMT " connected: uid %u (%s)%s, may pin %s (%s)",
			CLIENT_ARGS(c), (unsigned)c->cred.uid, c->name, c->monitor ? ", a monitor" : "",
			log_bytes(c->holder.limit.max_pinned, b), c->holder.limit.rule);
}

/* ---------------------------------------------------------------- output */

static void outq_item_free(struct odpd_answer *it)
{
	odpd_answer_free(it);
}

static int outq_flush(struct odpd_client *c)
{
	while (c->outq) {
		struct odpd_answer *it = c->outq;
		int r = odpd_wire_send_buf(c->fd, it->data, it->len, &it->fd, it->fd >= 0, MSG_DONTWAIT);

		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		c->outq = it->next;
		if (!c->outq)
			c->outq_tail = &c->outq;
		c->outq_len--;
		outq_item_free(it);
	}
	event_del(c->ev_write);
	return 0;
}

static void client_on_write(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_client *c = arg;
	int r;

	(void)fd;
	(void)what;
	r = outq_flush(c);
	if (r < 0)
		odpd_client_disconnect(c, strerror(-r));
}

void odpd_reply_err(struct odpd_client *c, uint64_t id, const struct odpd_err *err)
{
	odpd_client_send_error(c, id, err->code, err->msg);
}

void odpd_client_send(struct odpd_client *c, Odpd__Reply *reply)
{
	odpd_client_send_fd(c, reply, -1);
}

/* notify.h: tell @h's client that @device is gone (an event: id 0, a
 * DeviceEvent body). */
static void notify_device_gone(void *ctx, struct odpd_holder *h, const char *device, unsigned mrs)
{
	struct odpd_client *c = (struct odpd_client *)((char *)h - offsetof(struct odpd_client, holder));
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__DeviceEvent ev = ODPD__DEVICE_EVENT__INIT;

	(void)ctx;
	if (c->dead)
		return;
	ev.has_kind = 1;
	ev.kind = ODPD__DEVICE_EVENT__KIND__KIND_REMOVED;
	ev.device = (char *)device;
	ev.has_mrs = 1;
	ev.mrs = mrs;
	reply.has_id = reply.has_status = 1;
	reply.body_case = ODPD__REPLY__BODY_DEVICE_EVENT;
	reply.device_event = &ev;
	/* The events word first: whenever the client can read the event,
	 * the word counts it (and the client does not skip its drain). */
	odpd_registry_event_sent(h);
	odpd_client_send(c, &reply);
	log_info("client %" PRIu64 " (pid %d): told that %s was removed (%u MR(s))", c->id,
		 (int)c->cred.pid, device, mrs);
}

void odpd_client_notify_init(struct odpd_notify *n, struct odpd_manager *m)
{
	n->device_gone = notify_device_gone;
	n->complete = notify_complete;
	n->connected = notify_connected;
	n->clients = notify_clients;
	n->ctx = m;
}

/* A copy of @it's packed reply in *@buf (reused), or none (NULL) if it
 * carries an fd, which a copy could not send again. */
static void answer_keep(uint8_t **buf, size_t *len, const struct odpd_answer *it)
{
	uint8_t *p = it->fd < 0 ? realloc(*buf, it->len ? it->len : 1) : NULL;

	if (!p)
		free(*buf);
	else
		memcpy(p, it->data, it->len);
	*buf = p;
	*len = p ? it->len : 0;
}

/*
 * Queue what @o holds, a packed reply (or why packing failed): the one
 * place a reply leaves for a client. Empties @o.
 */
static void client_put(struct odpd_client *c, struct odpd_out *o)
{
	struct odpd_answer *it = o->answer;
	const char *fail = o->fail;
	bool committed;

	o->answer = NULL;
	o->fail = NULL;
	if (c->dead) {
		odpd_answer_free(it);
		return;
	}
	if (fail) {
		if (o->status != 0)
			c->m->stats.errors++;
		if (o->fail_len)
			log_error(CLIENT_FMT ": reply of %zu bytes is too large", CLIENT_ARGS(c), o->fail_len);
		odpd_answer_free(it);
		odpd_client_disconnect(c, fail);
		return;
	}
	if (!it)
		return;
	if (it->status != 0)
		c->m->stats.errors++;
	if (c->outq_len >= OUTQ_MAX) {
		odpd_answer_free(it);
		odpd_client_disconnect(c, "slow reader: output queue full");
		return;
	}
	if (c->resume_capture && it->id == c->resume_id) {
		c->resume_capture = false;
		c->resume_captured = true;
		answer_keep(&c->resume_reply, &c->resume_len, it);
	}
	/* Nothing leaves that the journal does not hold (journal.h). */
	committed = odpd_journal_pending();
	if (committed) {
		struct odpd_keep_client v;

		if (c->stored)
			odpd_client_keep_view(c, &v);
		odpd_journal_commit(c->stored ? &v : NULL, it->id, it->data, it->len, it->fd >= 0);
		if (c->stored && it->id) {
			c->jlast_id = it->id;
			answer_keep(&c->jlast_reply, &c->jlast_len, it);
		}
	}
	if (c->m->test_crash_id && it->id == c->m->test_crash_id && c->id == c->m->test_crash_conn) {
		if (committed) {
			log_warning(CLIENT_FMT ": ODPD_TEST_CRASH_BEFORE_ANSWER: killed before the answer to "
				    "request %" PRIu64, CLIENT_ARGS(c), it->id);
			raise(SIGKILL);
		}
		c->m->test_crash_id = 0;         /* it changed nothing: the next one */
	}
	outq_push(c, it);
}

void odpd_client_send_fd(struct odpd_client *c, Odpd__Reply *reply, int fd)
{
	struct odpd_out o = { 0 };

	if (c->dead) {
		if (fd >= 0)
			close(fd);
		return;
	}
	odpd_out_reply(&o, reply, fd);
	client_put(c, &o);
}

/* Send @it at once if nothing waits before it, else (or if the socket is
 * full) queue it. */
static void outq_push(struct odpd_client *c, struct odpd_answer *it)
{
	if (!c->outq) {
		int r;

		odpd_stage(ODPD_STAGE_ANSWER);
		r = odpd_wire_send_buf(c->fd, it->data, it->len, &it->fd, it->fd >= 0, MSG_DONTWAIT);
		odpd_stage(ODPD_STAGE_SEND);
		if (r != -EAGAIN) {
			odpd_answer_free(it);
			if (r < 0)
				odpd_client_disconnect(c, strerror(-r));
			return;
		}
	}
	it = odpd_answer_keep(it);
	if (!it) {
		odpd_client_disconnect(c, "out of memory");
		return;
	}
	it->next = NULL;
	*c->outq_tail = it;
	c->outq_tail = &it->next;
	if (c->outq_len++ == 0)
		event_add(c->ev_write, NULL);
}

void odpd_client_send_error(struct odpd_client *c, uint64_t id, int code, const char *msg)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;

	reply.has_id = 1;
	reply.id = id;
	reply.has_status = 1;
	reply.status = code;
	reply.message = (char *)msg;
	log_debug(CLIENT_FMT ": request %llu: %s: %s", CLIENT_ARGS(c),
		  (unsigned long long)id, strerror(code), msg);
	odpd_client_send(c, &reply);
}

void odpd_client_keep_view(const struct odpd_client *c, struct odpd_keep_client *v)
{
	*v = (struct odpd_keep_client){
		.id = c->id,
		.name = c->name,
		.shared = c->has_holder && c->holder.spd ? c->holder.spd->name : NULL,
		.registered = c->has_holder && c->holder.registered,
		.next_handle = c->segs.next_handle,
		.local_hits = c->has_holder ? c->holder.local_hits : 0,
		.events = c->has_holder ? c->holder.events : 0,
		.starttime = c->starttime,
		.unkeepable = c->has_holder ? odpd_registry_holder_lost(&c->holder) : NULL,
		.hit_slots = c->has_holder && c->holder.hits ? odpd_hittab_slots(c->holder.hits) : 0,
		.last_id = c->jlast_id,
		.last_reply = c->jlast_reply,
		.last_len = c->jlast_len,
	};
}

/* ---------------------------------------------------------------- input */

/*
 * Hello. Its reply's framing (Reply.id/status/message/hello and
 * HelloReply.version/version_min/version_max) is frozen, so a client of any
 * version can read a refusal.
 */
static void handle_hello(struct odpd_client *c, uint64_t id, const Odpd__Hello *req)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__HelloReply hr = ODPD__HELLO_REPLY__INIT;
	Odpd__Device **devs = NULL;
	char msg[160];

	reply.has_id = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_HELLO;
	reply.hello = &hr;
	hr.has_version = hr.has_version_min = hr.has_version_max = 1;
	hr.version_min = ODPD_PROTOCOL_VERSION_MIN;
	hr.version_max = ODPD_PROTOCOL_VERSION_MAX;
	reply.has_status = 1;
	if (c->m->test_crash_kind && strcmp(c->m->test_crash_kind, "hello") == 0 && !c->hello) {
		log_warning(CLIENT_FMT ": ODPD_TEST_CRASH_BEFORE_ANSWER: killed at its Hello, before the "
			    "connection is kept", CLIENT_ARGS(c));
		raise(SIGKILL);
	}
	if (c->hello) {
		reply.status = EALREADY;
		reply.message = (char *)"Hello was already answered on this connection";
	} else if (c->refused) {                 /* then closed (client.c) */
		reply.status = c->refused;
		reply.message = c->refused_msg;
	} else if (!req->has_version || req->version < ODPD_PROTOCOL_VERSION_MIN ||
		   req->version > ODPD_PROTOCOL_VERSION_MAX) {
		snprintf(msg, sizeof(msg), "protocol version %u is not supported; this daemon speaks %u..%u",
			 req->version, ODPD_PROTOCOL_VERSION_MIN, ODPD_PROTOCOL_VERSION_MAX);
		reply.status = EPROTONOSUPPORT;
		reply.message = msg;
	} else if (req->has_monitor && req->monitor && !c->admin) {
		/* A monitor is left out of the clients an operator sees
		 * (odpctl clients, D-Bus): only admin tools may be one. The
		 * connection may say Hello again, as a plain client. */
		reply.status = EPERM;
		reply.message = (char *)"Hello.monitor is for admin tools (root or odpd's admin group): "
				       "say Hello without it, as a client";
	} else if (odpd_devices_to_proto(&c->m->devices, &devs) < 0) {
		reply.status = ENOMEM;
		reply.message = (char *)"out of memory";
	} else {
		c->hello = true;
		hr.version = req->version;
		hr.devices = devs;
		hr.n_devices = c->m->devices.n_live;
		hr.has_max_packet = 1;
		hr.max_packet = ODPD_MAX_PACKET;
		hr.has_client_id = 1;
		hr.client_id = c->id;
		hr.daemon_version = (char *)ODPD_VERSION;
		hr.has_resident_check_max = 1;
		hr.resident_check_max = ODPD_LOOP_REG_MAX;
		hr.has_oneway_dereg_max = 1;
		hr.oneway_dereg_max = ODPD_LOOP_REG_MAX;
		if (req->client_name && *req->client_name)
			snprintf(c->name, sizeof(c->name), "%s", req->client_name);
		c->monitor = req->has_monitor && req->monitor;
		odpd_client_log_hello(c);
		if (!c->monitor && odpd_journal_on()) {
			struct odpd_keep_client v;

			odpd_client_keep_view(c, &v);
			c->stored = odpd_journal_client_new(&v, c->fd);
		}
	}
	odpd_client_send(c, &reply);
	free(devs);
}

/* How many fds a request must carry. */
static unsigned fds_wanted(const Odpd__Request *req)
{
	switch (req->body_case) {
	case ODPD__REQUEST__BODY_ATTACH_SEGMENT:
	case ODPD__REQUEST__BODY_OPEN_HIT_TABLE:
		return 1;
	case ODPD__REQUEST__BODY_REG_MR:
		return req->reg_mr->has_client_pd && req->reg_mr->client_pd ? 1 : 0;
	default:
		return 0;
	}
}

/* The handler gets who asked, not the connection; it answers in @o, or
 * later through odpd_complete (handler.h). Reading stops until then. */
static void client_dispatch(struct odpd_client *c, const Odpd__Request *req, struct odpd_packet *pkt)
{
	int fd = pkt->nfds ? pkt->fds[0] : -1;
	struct odpd_out o = { 0 };
	struct odpd_caller k;
	int r;

	pkt->nfds = 0;                       /* consumed by the handler */
	odpd_client_caller(c, req->id, &k);
	odpd_client_begin(c);
	r = odpd_request_dispatch(&k, req, fd, &o);
	odpd_client_end(c, &o, r);
}

/*
 * protobuf-c's allocations for a request: from the manager's arena (a bump
 * allocator, manager.h), and from odpd's own malloc for what does not fit,
 * so that running out of memory is told apart from a malformed packet. The
 * arena is emptied when the request has been handled: the handlers keep no
 * pointer into a request (what a job needs later, it copies), so nothing
 * in it is freed one by one. Under ASan the arena's free part is poisoned,
 * and a pointer kept past the request is caught as if it had been freed.
 */
#ifdef ODPD_ASAN
#include <sanitizer/asan_interface.h>
#define arena_poison(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define arena_unpoison(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define arena_poison(p, n) ((void)(p), (void)(n))
#define arena_unpoison(p, n) ((void)(p), (void)(n))
#endif

#define ARENA_ALIGN 16u                      /* malloc's: any of protobuf-c's types */

static void *pb_alloc(void *data, size_t size)
{
	struct odpd_arena *a = data;
	void *p;

	if (size <= ODPD_ARENA_SIZE - a->used) {
		p = a->buf + a->used;
		a->used += (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
		if (a->used > ODPD_ARENA_SIZE)
			a->used = ODPD_ARENA_SIZE;
		arena_unpoison(p, size);
		return p;
	}
	p = malloc(size);
	if (!p)
		a->oom = true;
	else
		a->spilled++;
	return p;
}

static void pb_free(void *data, void *p)
{
	struct odpd_arena *a = data;

	if ((uint8_t *)p >= a->buf && (uint8_t *)p < a->buf + ODPD_ARENA_SIZE)
		return;                      /* emptied with the arena */
	free(p);
}

/* Start decoding a request in @a. */
static void arena_begin(struct odpd_arena *a)
{
	a->used = 0;
	a->spilled = 0;
	a->oom = false;
	a->busy = true;
}

/* The request decoded in @a (or NULL) is done with: free what went to
 * malloc, if anything did, and empty the arena. */
static void arena_end(struct odpd_arena *a, Odpd__Request *req, ProtobufCAllocator *pa)
{
	if (req && a->spilled)
		odpd__request__free_unpacked(req, pa);
	arena_poison(a->buf, ODPD_ARENA_SIZE);
	a->used = 0;
	a->busy = false;
}

/* Decode and act on one packet of @c. Consumes @pkt's fds on every path. */
/*
 * After a crash (restart.c, RestartEvent): the library sends its request in
 * flight again, and may have sent it to the odpd that crashed too. Is
 * request @id one the journal has the answer to (sent again now), or an
 * older one (dropped)? A newer one ends the resumption.
 */
static bool client_resumed(struct odpd_client *c, uint64_t id)
{
	struct odpd_answer *a;

	if (id > c->resume_id) {
		free(c->resume_reply);
		c->resume_reply = NULL;
		c->resume_len = 0;
		if (c->resume_captured) {
			c->resume_id = 0;        /* resumed */
		} else {
			c->resume_id = id;       /* done now; its answer kept (client_put) */
			c->resume_capture = true;
			c->resume_first = id;
		}
		return false;
	}
	if (id < c->resume_id || !c->resume_reply) {
		/* older: a duplicate; the same without its answer: done again
		 * (the journal keeps answers of requests that changed nothing
		 * only as "not kept") */
		if (id == c->resume_id)
			return false;
		log_debug(CLIENT_FMT ": request %" PRIu64 " again after the restart: answered before", CLIENT_ARGS(c),
			  id);
		return true;
	}
	a = malloc(sizeof(*a) + c->resume_len);
	if (!a) {
		odpd_client_disconnect(c, "out of memory");
		return true;
	}
	a->next = NULL;
	a->fd = -1;
	a->status = 0;
	a->id = id;
	a->len = c->resume_len;
	memcpy(a->data, c->resume_reply, c->resume_len);
	log_info(CLIENT_FMT ": request %" PRIu64 " again after the restart: its answer sent again", CLIENT_ARGS(c),
		 id);
	outq_push(c, a);
	/* the request in flight at the crash is answered: the next one ends
	 * the resumption (none of its answer to keep) */
	c->resume_captured = true;
	return true;
}

/* Was @handle's MR deregistered just before a crash (gone_handles)? Once. */
static bool client_gone_handle(struct odpd_client *c, uint64_t handle)
{
	for (size_t i = 0; i < c->n_gone; i++)
		if (c->gone_handles[i] == handle) {
			c->gone_handles[i] = c->gone_handles[--c->n_gone];
			log_info(CLIENT_FMT ": its MR %" PRIu64 " went at the crash: released", CLIENT_ARGS(c), handle);
			return true;
		}
	return false;
}

/*
 * A DeregMr in flight at the crash whose reference the journal no longer
 * has: odpd had dropped it (its answer waited for the deregistration) and
 * another answer committed that. Done, as it was before the crash: a handle
 * this client was given (not a segment's) that it no longer holds.
 */
static bool client_released_at_crash(struct odpd_client *c, uint64_t id, uint64_t handle)
{
	struct odpd_cseg *s;

	if (!c->resume_first || id != c->resume_first || !c->has_holder || !handle ||
	    handle > c->segs.next_handle || odpd_holder_find_ref(&c->holder, handle))
		return false;
	LIST_FOREACH(s, &c->segs.list, link)
		if (s->handle == handle)
			return false;
	c->resume_first = 0;
	log_info(CLIENT_FMT ": its release of MR %" PRIu64 " was done at the crash", CLIENT_ARGS(c), handle);
	return true;
}

static void client_request(struct odpd_client *c, const uint8_t *buf, size_t len, struct odpd_packet *pkt)
{
	struct odpd_arena *a = &c->m->arena;
	ProtobufCAllocator pa = { .alloc = pb_alloc, .free = pb_free, .allocator_data = a };
	Odpd__Request *req;
	char msg[128];

	if (len == 0) {
		odpd_client_send_error(c, 0, EBADMSG, "empty packet: expected one odpd.Request");
		goto out;
	}
	if (a->busy) {                       /* never: one request at a time on the loop */
		log_error(CLIENT_FMT ": a request was read while another was handled", CLIENT_ARGS(c));
		odpd_client_send_error(c, 0, EBUSY, "odpd is handling another request");
		goto out;
	}
	arena_begin(a);
	req = odpd_request_unpack(&pa, len, buf);
	if (!req) {
		if (a->oom)
			odpd_client_send_error(c, 0, ENOMEM, "odpd is out of memory: the request was not read");
		else
			odpd_client_send_error(c, 0, EBADMSG, "cannot parse the packet as an odpd.Request");
		arena_end(a, NULL, &pa);
		goto out;
	}
	log_debug(CLIENT_FMT ": request %llu: %s", CLIENT_ARGS(c),
		  (unsigned long long)req->id, odpd_request_name(req->body_case));
	/* One-way: no answer, nothing to answer again; a copy sent again after
	 * a crash is done again (a handle is never given twice: ENOENT). */
	c->oneway = req->body_case == ODPD__REQUEST__BODY_DEREG_MR && req->dereg_mr->no_reply;
	if (c->m->test_crash_kind && !c->m->test_crash_id && c->stored && req->has_id &&
	    strcmp(c->m->test_crash_kind, odpd_request_name(req->body_case)) == 0) {
		c->m->test_crash_id = req->id;
		c->m->test_crash_conn = c->id;
	}
	/* What it released through its ring, written before it sent this,
	 * goes first (doc/design.md §11). */
	if (c->has_holder && c->holder.hits && req->body_case == ODPD__REQUEST__BODY_REG_MR)
		odpd_registry_take_releases_later(&c->m->registry, &c->holder);
	else if (c->has_holder && c->holder.hits)
		odpd_registry_take_releases(&c->m->registry, &c->holder);
	odpd_stage_kind(req->body_case);
	odpd_stage(ODPD_STAGE_DECODE);
	if (!req->has_id || req->id == 0)
		odpd_client_send_error(c, 0, EINVAL, "request id 0 is reserved for events");
	else if (c->resume_id && !c->oneway && client_resumed(c, req->id))
		;                            /* answered before the crash (or a duplicate) */
	else if (req->body_case == ODPD__REQUEST__BODY_HELLO)
		handle_hello(c, req->id, req->hello);
	else if (!c->hello)
		odpd_client_send_error(c, req->id, EPROTO, "send Hello first");
	else if (pkt->nfds != fds_wanted(req)) {
		snprintf(msg, sizeof(msg), "%s takes %u file descriptor(s), the packet carried %u",
			 odpd_request_name(req->body_case), fds_wanted(req), pkt->nfds);
		odpd_client_send_error(c, req->id, EINVAL, msg);
	} else if (req->body_case == ODPD__REQUEST__BODY_DEREG_MR &&
		   ((c->n_gone && client_gone_handle(c, req->dereg_mr->handle)) ||
		    client_released_at_crash(c, req->id, req->dereg_mr->handle))) {
		Odpd__Reply ok = ODPD__REPLY__INIT;

		ok.has_id = ok.has_status = 1;
		ok.id = req->id;
		if (!c->oneway)
			odpd_client_send(c, &ok);
	} else {
		if (c->has_holder)
			odpd_registry_hits_report(&c->m->registry, &c->holder, req->has_local_hits,
						  req->local_hits, req->has_revocations_seen,
						  req->revocations_seen);
		client_dispatch(c, req, pkt);
	}
	/* what the ring released, deregistered now that the answer is sent */
	odpd_stage(ODPD_STAGE_AFTER);
	odpd_registry_run_later(&c->m->registry);
	odpd_stage(ODPD_STAGE_LATER);
	arena_end(a, req, &pa);
out:
	odpd_packet_close_fds(pkt);
}


/* Read one packet and act on it. Returns false when reading must stop. */
static bool client_read_one(struct odpd_client *c)
{
	struct odpd_manager *m = c->m;
	struct odpd_packet pkt;
	int r;

	odpd_stage(ODPD_STAGE_START);
	r = odpd_wire_recv(c->fd, m->rbuf, ODPD_MAX_PACKET + 1, &pkt, MSG_DONTWAIT);
	if (r == -EAGAIN)
		return false;
	odpd_stage(ODPD_STAGE_RECV);
	if (r < 0) {
		odpd_client_disconnect(c, strerror(-r));
		return false;
	}
	if (pkt.ctrunc) {
		/* The kernel dropped fds (too many, or a security module): the
		 * request cannot be trusted, and neither can the peer. */
		odpd_packet_close_fds(&pkt);
		odpd_client_send_error(c, 0, EBADMSG, "too many file descriptors in one packet");
		odpd_client_disconnect(c, "control data truncated");
		return false;
	}
	if (pkt.eof) {
		char how[96];

		/* it closed the connection, or its process died (and the kernel closed it) */
		odpd_client_disconnect(c, odpd_peer_exit_text(c->pidfd, c->cred.pid, c->starttime, how, sizeof(how)) ? how :
					  "it closed the connection");
		return false;
	}
	if (pkt.truncated) {
		char msg[96];
		odpd_packet_close_fds(&pkt);
		snprintf(msg, sizeof(msg), "packet larger than the limit of %u bytes", ODPD_MAX_PACKET);
		odpd_client_send_error(c, 0, EMSGSIZE, msg);
		return !c->dead;
	}
	/* A reply that cannot be sent disconnects the client inside the
	 * handler, and a job may complete there too: neither frees @c under
	 * us; this function finishes what they started. */
	c->handling = true;
	client_request(c, m->rbuf, pkt.len, &pkt);  /* consumes pkt's fds */
	c->handling = false;
	if (c->dead) {
		if (!c->busy)
			client_reap_later(c);
		return false;
	}
	if (c->refused) {                    /* Hello was answered with the refusal */
		odpd_client_disconnect(c, c->refused_msg);
		return false;
	}
	c->resume = false;
	return !c->busy;
}

/*
 * Is the packet @c sent next a one-way request? Peeked at, not read. After
 * a one-way request odpd reads on only while this holds: a request that
 * waits for its answer stays for the client's next turn, since it may have
 * been sent after another connection's one-way release that odpd has not
 * read yet (that connection became readable later than this one, with its
 * own one-way release queued first), and must see that release done.
 */
static bool client_next_oneway(struct odpd_client *c)
{
	struct odpd_arena *a = &c->m->arena;
	ProtobufCAllocator pa = { .alloc = pb_alloc, .free = pb_free, .allocator_data = a };
	Odpd__Request *req;
	ssize_t n;
	bool oneway;

	do
		n = recv(c->fd, c->m->rbuf, ODPD_MAX_PACKET + 1, MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n <= 0 || n > ODPD_MAX_PACKET || a->busy)
		return false;
	arena_begin(a);
	req = odpd_request_unpack(&pa, (size_t)n, c->m->rbuf);
	oneway = req && req->body_case == ODPD__REQUEST__BODY_DEREG_MR && req->dereg_mr->no_reply;
	arena_end(a, req, &pa);
	return oneway;
}

static void client_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_client *c = arg;

	(void)fd;
	(void)what;
	/*
	 * One request at a time per connection. The read event stays armed
	 * while a job runs (no epoll_ctl per request for a client that waits
	 * for its answer, as libodpd does); only a client that sends more
	 * meanwhile gets it deleted here, until the job is done.
	 */
	if (c->busy || c->m->quiescing) {
		event_del(c->ev_read);
		c->read_paused = true;
		return;
	}
	/* past PACKETS_PER_WAKEUP, only what follows a one-way request, and
	 * only while it is one-way too (client_next_oneway) */
	for (int i = 0, oneway = 0; i < PACKETS_PER_WAKEUP + oneway; i++) {
		if (i >= PACKETS_PER_WAKEUP && !client_next_oneway(c))
			break;
		c->oneway = false;
		if (!client_read_one(c))
			break;
		if (c->oneway && oneway < ONEWAY_PER_WAKEUP)
			oneway++;
	}
}

void odpd_client_read_oneway_first(struct odpd_manager *m)
{
	struct odpd_client *c, *next;

	for (c = LIST_FIRST(&m->clients); c; c = next) {
		next = LIST_NEXT(c, link);   /* (@c leaves the list if it is disconnected) */
		for (int i = 0; i < ONEWAY_PER_WAKEUP && !c->busy && client_next_oneway(c); i++) {
			c->oneway = false;
			if (!client_read_one(c))
				break;
		}
	}
}

/* ---------------------------------------------------------------- lifetime */

void odpd_client_begin(struct odpd_client *c)
{
	c->busy = true;                      /* client_on_read reads no more until done */
}

static void client_job_done(struct odpd_client *c);

void odpd_client_end(struct odpd_client *c, struct odpd_out *o, int r)
{
	client_put(c, o);
	if (r == ODPD_DONE)
		client_job_done(c);
}

void odpd_client_caller(struct odpd_client *c, uint64_t id, struct odpd_caller *k)
{
	*k = (struct odpd_caller){
		.m = c->m,
		.conn = c->id,
		.id = id,
		.pid = c->cred.pid,
		.uid = c->cred.uid,
		.gid = c->cred.gid,
		.pidfd = c->pidfd,
		.groups = c->groups,
		.n_groups = c->n_groups,
		.admin = c->admin,
		.holder = &c->holder,
		.segs = &c->segs,
	};
}

/* notify.h: a pending request of connection @conn ends. The connection is
 * found by its id: one being torn down is still there (a busy client is
 * not freed), and its answer is dropped (client_put). */
static void notify_complete(void *ctx, uint64_t conn, uint64_t id, struct odpd_out *o)
{
	struct odpd_client *c = client_by_id(ctx, conn);

	if (!c || !c->busy) {
		log_error("request %llu of client %llu: completed but not pending%s; answer dropped",
			  (unsigned long long)id, (unsigned long long)conn, c ? "" : " (connection freed)");
		odpd_out_clear(o);
		o->fail = NULL;
		return;
	}
	client_put(c, o);
	client_job_done(c);
}

static bool notify_connected(void *ctx, uint64_t conn)
{
	struct odpd_client *c = client_by_id(ctx, conn);

	return c && !c->dead;
}

static unsigned notify_clients(void *ctx, struct odpd_conn_view *v, unsigned cap, unsigned *monitors)
{
	struct odpd_manager *m = ctx;
	struct odpd_client *c;
	unsigned n = 0;

	*monitors = 0;
	LIST_FOREACH(c, &m->clients, link) {
		if (c->monitor) {
			(*monitors)++;
			continue;
		}
		if (n == cap)
			continue;
		v[n++] = (struct odpd_conn_view){
			.id = c->id, .pid = c->cred.pid, .uid = c->cred.uid, .gid = c->cred.gid,
			.name = c->name, .holder = &c->holder, .segs = &c->segs,
		};
	}
	return n;
}

/*
 * Everything heavy (deregistration, unmapping, closing PDs) is the
 * registry's and the segment table's, on workers: here only references are
 * dropped.
 */
static void client_teardown(struct odpd_client *c)
{
	struct odpd_manager *m = c->m;
	const struct odpd_ref *ref;
	const struct odpd_cseg *s;
	uint64_t mr_bytes = 0, seg_bytes = 0;
	unsigned n_mrs = c->has_holder ? c->holder.n_refs : 0, n_segs = c->segs.n;
	char b1[LOG_BYTES_LEN], b2[LOG_BYTES_LEN];

	if (c->has_holder)
		LIST_FOREACH(ref, &c->holder.refs, hlink)
			mr_bytes += ref->length;
	LIST_FOREACH(s, &c->segs.list, link)
		seg_bytes += s->length;
	while (!LIST_EMPTY(&c->segs.list))
		odpd_cseg_drop(m, &c->holder, &c->segs, LIST_FIRST(&c->segs.list));
	client_release_holder(c);
	/* References: an MR another client holds stays, one nobody holds goes
	 * relaxed or is deregistered (registry.h). */
	log_msg(client_level(c), CLIENT_FMT " released: %u MR reference%s (%s), %u segment%s (%s)",
		CLIENT_ARGS(c), n_mrs, n_mrs == 1 ? "" : "s", log_bytes(mr_bytes, b1), n_segs,
		n_segs == 1 ? "" : "s", log_bytes(seg_bytes, b2));
	client_free(c);
	odpd_manager_client_released(m);
}

/*
 * A disconnected client is torn down on the loop's next turn, never inside
 * the call that found it gone: a reply that cannot be sent (out of memory, a
 * slow reader) disconnects its client in odpd_client_send, and the caller
 * (a walk over a device's holders, a batch's waiters) still holds pointers
 * to it and to what it holds.
 */
static void client_reap_later(struct odpd_client *c)
{
	struct odpd_manager *m = c->m;

	LIST_INSERT_HEAD(&m->reap, c, link);
	event_active(m->ev_reap, 0, 0);
}

void odpd_client_on_reap(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_manager *m = arg;

	(void)fd;
	(void)what;
	while (!LIST_EMPTY(&m->reap)) {
		struct odpd_client *c = LIST_FIRST(&m->reap);

		LIST_REMOVE(c, link);
		client_teardown(c);
	}
}

static void client_job_done(struct odpd_client *c)
{
	c->busy = false;
	if (c->handling) {                   /* answered inside the request: client_read_one goes on */
		c->resume = true;
		return;
	}
	if (c->dead) {
		client_reap_later(c);
		return;
	}
	if (c->read_paused && !c->m->quiescing) {   /* packets queued meanwhile */
		c->read_paused = false;
		event_add(c->ev_read, NULL);
		event_active(c->ev_read, EV_READ, 0);
	}
}

void odpd_client_disconnect(struct odpd_client *c, const char *why)
{
	if (c->dead)
		return;
	log_msg(client_level(c), CLIENT_FMT " disconnected: %s", CLIENT_ARGS(c), why);
	c->dead = true;
	if (c->stored) {
		/* systemd's copy of the socket goes too: the client sees the end */
		odpd_journal_client_gone(c->id, true);
		c->stored = false;
	}
	LIST_REMOVE(c, link);
	event_free(c->ev_read);
	event_free(c->ev_write);
	if (c->ev_peer)
		event_free(c->ev_peer);
	if (c->ev_refused)
		event_free(c->ev_refused);
	c->ev_read = c->ev_write = c->ev_peer = c->ev_refused = NULL;
	while (c->outq) {
		struct odpd_answer *it = c->outq;
		c->outq = it->next;
		outq_item_free(it);
	}
	close(c->fd);
	c->fd = -1;
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->pidfd = -1;
	if (!c->busy && !c->handling)
		client_reap_later(c);
}
