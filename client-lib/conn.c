/* SPDX-License-Identifier: MIT */
/*
 * conn.c - connections to the daemon: connect and Hello, one request in
 * flight per connection, the process's list of connections (dropped in a
 * child after fork) and the default connection of the librdmacm mirror.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "libodpd-private.h"
#include "odpd-envelope.h"

/* Every connection of the process, so that a child after fork can drop them. */
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct odpd_link conns = LINK_HEAD_INIT(conns);

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_error;

/* Lock order: default_lock, then conns_lock, then a connection's tables_lock. */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static struct odpd_conn *default_conn;
/* The daemon dropped the default connection and the loss was not reported
 * yet (the reconnecting call fails with ECONNRESET once): why. */
static bool default_lost;
static char default_lost_reason[96];

/* ---------------------------------------------------------------- state */

static void conn_kill(struct odpd_conn *c, const char *reason)
{
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	atomic_store(&c->dead, true);        /* no more local hits (hit.c) */
	snprintf(c->dead_reason, sizeof(c->dead_reason), "%s", reason);
}

int conn_check(struct odpd_conn *c, const char *what)
{
	if (c->sock < 0)
		return errmsg_set(-ENOTCONN, "%s: %s", what, c->dead_reason);
	return 0;
}

static int conn_lost(struct odpd_conn *c, const char *what)
{
	conn_kill(c, "the daemon closed the connection");
	return conn_check(c, what);
}

/* ---------------------------------------------------------------- fork */

static void atfork_prepare(void)
{
	struct odpd_link *l;

	pthread_mutex_lock(&conns_lock);
	for (l = conns.next; l != &conns; l = l->next)
		tables_lock(container_of(l, struct odpd_conn, link));
}

static void atfork_parent(void)
{
	struct odpd_link *l;

	for (l = conns.next; l != &conns; l = l->next)
		tables_unlock(container_of(l, struct odpd_conn, link));
	pthread_mutex_unlock(&conns_lock);
}

/*
 * The child has one thread: the one that forked, which held no connection's
 * lock (libodpd never forks). A lock that another thread of the parent held
 * has no owner here, so it is made anew; the connection is dead anyway. The
 * child closes only its own copy of each socket: the parent's stays open.
 */
static void atfork_child(void)
{
	struct odpd_link *l;

	for (l = conns.next; l != &conns; l = l->next) {
		struct odpd_conn *c = container_of(l, struct odpd_conn, link);

		tables_unlock(c);
		pthread_mutex_init(&c->lock, NULL);
		conn_kill(c, "connection belongs to the parent process (fork)");
		hit_fork_child(c);
	}
	/* The dead default connection stays listed: its objects may still be used. */
	default_conn = NULL;
	default_lost = false;               /* the parent's loss, not the child's */
	pthread_mutex_init(&default_lock, NULL);
	pthread_mutex_unlock(&conns_lock);
}

static void atfork_register(void)
{
	atfork_error = pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---------------------------------------------------------------- list */

static void conns_add(struct odpd_conn *c)
{
	pthread_mutex_lock(&conns_lock);
	link_add_tail(&conns, &c->link);
	pthread_mutex_unlock(&conns_lock);
}

static void conns_del(struct odpd_conn *c)
{
	pthread_mutex_lock(&conns_lock);
	link_del(&c->link);
	pthread_mutex_unlock(&conns_lock);
}

struct odpd_conn *conns_find(bool (*match)(struct odpd_conn *c, const void *key), const void *key)
{
	struct odpd_conn *found = NULL;
	struct odpd_link *l;

	pthread_mutex_lock(&conns_lock);
	for (l = conns.next; l != &conns && !found; l = l->next) {
		struct odpd_conn *c = container_of(l, struct odpd_conn, link);

		if (match(c, key))
			found = c;
	}
	pthread_mutex_unlock(&conns_lock);
	return found;
}

/* ---------------------------------------------------------------- replies' memory */

/*
 * A reply is decoded into the connection's arena when no other reply lives
 * there (a caller may still hold the last one after dropping the lock), so
 * the usual reply costs no malloc or free; what does not fit goes to
 * malloc, and such a reply is walked when freed (only its malloc'd pieces
 * are freed).
 */
static bool in_arena(const struct reply_arena *a, const void *p)
{
	return (const uint8_t *)p >= a->mem && (const uint8_t *)p < a->mem + sizeof(a->mem);
}

static void *arena_alloc(void *data, size_t size)
{
	struct reply_arena *a = data;
	size_t need = (size + 15) & ~(size_t)15;

	if (need >= size && need <= sizeof(a->mem) - a->used) {
		void *p = a->mem + a->used;

		a->used += need;
		return p;
	}
	a->spilled = true;
	return malloc(size);
}

static void arena_free(void *data, void *p)
{
	if (!in_arena(data, p))
		free(p);
}

static ProtobufCAllocator arena_allocator(struct reply_arena *a)
{
	return (ProtobufCAllocator){ .alloc = arena_alloc, .free = arena_free, .allocator_data = a };
}

static Odpd__Reply *reply_unpack(struct odpd_conn *c, size_t len)
{
	struct reply_arena *a = c->arena;
	ProtobufCAllocator al = arena_allocator(a);
	Odpd__Reply *reply;

	if (!a || atomic_exchange(&a->busy, true))
		return odpd_reply_unpack(NULL, len, c->buf);
	a->used = 0;
	a->spilled = false;
	reply = odpd_reply_unpack(&al, len, c->buf);
	if (!reply || !in_arena(a, reply)) {       /* (a reply of malloc only: freed as one) */
		if (reply)
			protobuf_c_message_free_unpacked(&reply->base, &al);
		reply = reply ? odpd_reply_unpack(NULL, len, c->buf) : NULL;
		atomic_store(&a->busy, false);
	}
	return reply;
}

void conn_reply_free(struct odpd_conn *c, Odpd__Reply *reply)
{
	struct reply_arena *a = c->arena;

	if (!reply)
		return;
	if (a && in_arena(a, reply)) {
		if (a->spilled) {
			ProtobufCAllocator al = arena_allocator(a);

			protobuf_c_message_free_unpacked(&reply->base, &al);
		}
		atomic_store(&a->busy, false);
		return;
	}
	odpd__reply__free_unpacked(reply, NULL);
}

/* ---------------------------------------------------------------- request/reply */

static int call_send(struct odpd_conn *c, const char *what, const Odpd__Request *req,
		     const int *fds, unsigned nfds)
{
	int r = odpd_wire_send(c->sock, &req->base, fds, nfds, 0);

	if (r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN)
		return conn_lost(c, what);
	if (r < 0)
		return errmsg_set(r, "%s: sending the request: %m", what);
	return 0;
}

/* Receive and parse one reply. Its first fd, if any, goes to *ret_fd (else
 * -1); the caller closes it. Further fds are closed. */
static int call_recv(struct odpd_conn *c, const char *what, Odpd__Reply **ret, int *ret_fd, int flags)
{
	struct odpd_packet p;
	Odpd__Reply *reply = NULL;
	int r;

	*ret_fd = -1;
	r = odpd_wire_recv(c->sock, c->buf, ODPD_MAX_PACKET + 1, &p, flags);
	if (r == -EAGAIN && (flags & MSG_DONTWAIT))
		return r;
	if (r == -ECONNRESET)
		return conn_lost(c, what);
	if (r < 0)
		return errmsg_set(r, "%s: receiving the reply: %m", what);
	if (p.nfds > 0 && !p.eof && !p.truncated) {
		*ret_fd = p.fds[0];
		p.fds[0] = -1;
	}
	odpd_packet_close_fds(&p);
	if (*ret_fd >= 0 && (p.ctrunc || p.eof || p.truncated)) {
		close(*ret_fd);
		*ret_fd = -1;
	}
	if (p.eof)
		return conn_lost(c, what);
	if (p.truncated)
		return errmsg_set(-EIO, "%s: the daemon's reply is larger than %u bytes",
				  what, ODPD_MAX_PACKET);
	reply = reply_unpack(c, p.len);
	if (!reply) {
		if (*ret_fd >= 0)
			close(*ret_fd);
		*ret_fd = -1;
		return errmsg_set(-EIO, "%s: malformed reply from the daemon", what);
	}
	*ret = reply;
	return 0;
}

enum reply_fate { REPLY_OURS, REPLY_SKIP, REPLY_BAD };

static enum reply_fate reply_classify(const Odpd__Reply *reply, uint64_t id)
{
	if (reply->id == id)
		return REPLY_OURS;
	/*
	 * Id 0 is an event (a DeviceEvent, a RestartEvent), or the daemon's answer to
	 * a packet whose id it could not read: with one request in flight,
	 * that error is ours. Events carry a body; such an error does not.
	 */
	if (reply->id == 0)
		return reply->status != 0 && reply->body_case == ODPD__REPLY__BODY__NOT_SET ?
		       REPLY_OURS : REPLY_SKIP;
	/* The late answer to a request that failed here (EIO): stale. */
	if (reply->id < id)
		return REPLY_SKIP;
	return REPLY_BAD;
}

/* The daemon refused: its errno and message. */
static int reply_error(const char *what, const Odpd__Reply *reply)
{
	int status = reply->status;

	if (status <= 0 || status >= 4096)
		return errmsg_set(-EIO, "%s: the daemon replied with invalid status %d", what, status);
	if (reply->message && reply->message[0])
		return errmsg_set(-status, "%s: %s", what, reply->message);
	return errmsg_set(-status, "%s: %m", what);
}

/* A RestartEvent (id 0): odpd crashed, and a new one took the connection back. */
static const Odpd__RestartEvent *restart_event(const Odpd__Reply *reply)
{
	if (reply->id != 0 || reply->body_case != ODPD__REPLY__BODY_RESTART_EVENT)
		return NULL;
	return reply->restart_event;
}

/* ODPD_ONEWAY_DEREG=0: every release waits for odpd's answer. */
static bool oneway_off(void)
{
	const char *v = getenv("ODPD_ONEWAY_DEREG");

	return v && strcmp(v, "0") == 0;
}

/* @req a DeregMr.no_reply of @handle, @d its body (no id yet). */
static void oneway_request(Odpd__Request *req, Odpd__DeregMr *d, uint64_t handle)
{
	odpd__dereg_mr__init(d);
	odpd__request__init(req);
	d->has_handle = d->has_no_reply = true;
	d->handle = handle;
	d->no_reply = true;
	req->body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req->dereg_mr = d;
}

/* The one-way releases sent after @last_id (a RestartEvent's: what the new
 * odpd kept), sent again with the same ids. A copy odpd did read fails
 * there quietly (no such MR: a handle is never given twice). */
static int oneway_resend(struct odpd_conn *c, const char *what, uint64_t last_id)
{
	for (unsigned i = 0; i < c->n_oneway; i++) {
		Odpd__DeregMr d;
		Odpd__Request req;
		int r;

		if (c->oneway_ids[i] <= last_id)
			continue;
		oneway_request(&req, &d, c->oneway_handles[i]);
		req.has_id = true;
		/* A ring's release is sent with the id of the request before it
		 * (answered, so never sent again): not the one after, which may
		 * be the request this restart sends again. */
		req.id = c->oneway_ids[i] - c->oneway_ring[i];
		r = call_send(c, what, &req, NULL, 0);
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * The releases written into a retired table's ring that the odpd before
 * did not take, sent as DeregMr.no_reply. After a stop that handed the
 * connection over (no RestartEvent) nothing else sends them: a release
 * written after that odpd last took the ring would be lost, and the new
 * odpd would hold the reference for as long as the connection lasts.
 * After a crash (a RestartEvent: hit_stale) oneway_resend sent them
 * already: none of them was in a request the new odpd kept.
 */
static int ring_resend(struct odpd_conn *c, const char *what)
{
	uint64_t handles[ONEWAY_MAX];
	unsigned n;

	if (atomic_load(&c->hit_stale))
		return 0;
	n = hit_ring_untaken(c, handles);
	for (unsigned i = 0; i < n; i++) {
		Odpd__DeregMr d;
		Odpd__Request req;
		unsigned k;
		int r;

		oneway_request(&req, &d, handles[i]);
		req.has_id = true;
		req.id = ++c->last_id;
		r = call_send(c, what, &req, NULL, 0);
		if (r < 0)
			return r;
		/* sent again after a RestartEvent that does not keep it */
		for (k = 0; k < c->n_oneway && c->oneway_handles[k] != handles[i]; k++)
			;
		if (k == c->n_oneway && c->n_oneway < ONEWAY_MAX)
			c->oneway_handles[c->n_oneway++] = handles[i];
		if (k < c->n_oneway) {
			c->oneway_ids[k] = req.id;
			c->oneway_ring[k] = false;   /* a request of its own now */
		}
	}
	return 0;
}

/* An event from the daemon (id 0, with a body). */
static void conn_event(struct odpd_conn *c, const Odpd__Reply *reply)
{
	const Odpd__DeviceEvent *ev = reply->device_event;

	if (reply->id == 0 && reply->body_case != ODPD__REPLY__BODY__NOT_SET)
		c->events_received++;            /* known or not: the daemon counted it */
	/*
	 * The hit table mapped now is the crashed odpd's: the next conn_drain
	 * retires it, whether or not the new odpd marked it retired. (None
	 * mapped: the table a call in flight opens is the new odpd's, as its
	 * reply comes after this event.)
	 */
	if (restart_event(reply) && c->hit_gen)
		atomic_store(&c->hit_stale, true);
	if (reply->id != 0 || reply->body_case != ODPD__REPLY__BODY_DEVICE_EVENT || !ev ||
	    ev->kind != ODPD__DEVICE_EVENT__KIND__KIND_REMOVED)
		return;                          /* unknown events are for newer libraries */
	snprintf(c->lost_device, sizeof(c->lost_device), "%s", ev->device ? ev->device : "");
	c->lost_mrs += ev->mrs;
	c->lost_pending = true;
}

/*
 * Read the events that came while no call was in flight: a non-blocking
 * receive, unless the hit table's events word says that every event the
 * daemon sent was read already (then a request costs a send and a receive).
 * The daemon stores the word before it sends the event; were it ever
 * ahead of what can be read, this reads nothing now and looks again before
 * the next request.
 */
static int conn_drain_events(struct odpd_conn *c, const char *what)
{
	if (hit_events_all_received(c))
		return 0;
	for (;;) {
		Odpd__Reply *reply = NULL;
		int fd = -1;
		int r = call_recv(c, what, &reply, &fd, MSG_DONTWAIT);

		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		if (fd >= 0)
			close(fd);
		/* an event (a RestartEvent outside a call: only one-way
		 * releases to send again), else the late answer to a failed
		 * call, or the second answer to a request sent again after a
		 * RestartEvent */
		conn_event(c, reply);
		r = restart_event(reply) ? oneway_resend(c, what, restart_event(reply)->last_id) : 0;
		conn_reply_free(c, reply);
		if (r < 0)
			return r;
	}
}

/*
 * Before a request: the events, then a new hit table if the daemon retired
 * this one (a restart of odpd: its events word, or a RestartEvent read by
 * the last call or just now). A retired table's events word never equals
 * the events received, so what is queued is read first.
 */
static int conn_drain(struct odpd_conn *c, const char *what)
{
	int r = conn_drain_events(c, what);

	if (r >= 0 && hit_retired(c)) {
		r = ring_resend(c, what);
		if (r >= 0)
			r = hit_retire(c, what); /* odpd restarted: a new table */
		if (r >= 0)
			r = conn_check(c, what); /* (the new odpd may have dropped us) */
	}
	return r;
}

/* Releases go through after a device loss: they are how the caller cleans up. */
static bool is_release(const Odpd__Request *req)
{
	return req->body_case == ODPD__REQUEST__BODY_DEREG_MR ||
	       req->body_case == ODPD__REQUEST__BODY_DETACH_SEGMENT;
}

/*
 * Read until the reply to @req (sent, with @fds) arrives. A RestartEvent
 * read here means the answer is not coming: odpd crashed before it sent it
 * (whatever the odpd before sent is read before the event). So @req goes
 * again, same id, same fds, whether the event says the new odpd did not keep
 * its effect (@req may or may not have been read) or kept it (the journal
 * took its answer, and the crash came before the send): the new odpd
 * answers it once, from the journal's answer in the second case, and, if it
 * also reads the first copy, answers that too with the same reply, which
 * the next call skips as stale (reply_classify).
 */
static int call_wait(struct odpd_conn *c, const char *what, const Odpd__Request *req,
		     const int *fds, unsigned nfds, Odpd__Reply **ret, int *ret_fd)
{
	uint64_t id = req->id;

	for (;;) {
		const Odpd__RestartEvent *restart;
		Odpd__Reply *reply = NULL;
		enum reply_fate fate;
		uint64_t kept;
		bool resend;
		int r = call_recv(c, what, &reply, ret_fd, 0);

		if (r < 0)
			return r;
		fate = reply_classify(reply, id);
		if (fate == REPLY_OURS) {
			*ret = reply;
			return 0;
		}
		conn_event(c, reply);
		restart = restart_event(reply);
		resend = restart && restart->last_id <= id;
		kept = restart ? restart->last_id : 0;
		if (*ret_fd >= 0)
			close(*ret_fd);
		*ret_fd = -1;
		conn_reply_free(c, reply);   /* (and *restart with it) */
		if (fate == REPLY_BAD)
			return errmsg_set(-EIO, "%s: the daemon answered a request not yet sent", what);
		if (restart)
			r = oneway_resend(c, what, kept);
		if (r < 0)
			return r;
		if (resend) {
			r = call_send(c, what, req, fds, nfds);
			if (r < 0)
				return r;
		}
	}
}

int conn_call(struct odpd_conn *c, const char *what, Odpd__Request *req,
	      const int *fds, unsigned nfds, Odpd__Reply__BodyCase want,
	      Odpd__Reply **ret_reply)
{
	return conn_call_fd(c, what, req, fds, nfds, want, ret_reply, NULL);
}

int conn_call_fd(struct odpd_conn *c, const char *what, Odpd__Request *req,
		 const int *fds, unsigned nfds, Odpd__Reply__BodyCase want,
		 Odpd__Reply **ret_reply, int *ret_fd)
{
	Odpd__Reply *reply = NULL;
	int fd = -1;
	int r;

	r = conn_check(c, what);
	if (r < 0)
		return r;
	r = conn_drain(c, what);
	if (r < 0)
		return r;
	if (c->lost_pending && !is_release(req)) {
		unsigned mrs = c->lost_mrs;

		c->lost_pending = false;
		c->lost_mrs = 0;
		return errmsg_set(-ENODEV, "%s: device %s was removed; the %u MR(s) this connection had "
				  "on it are gone (release them: odpd_dereg succeeds)", what,
				  c->lost_device, mrs);
	}
	hit_before_request(c, req);
	req->has_id = true;
	req->id = ++c->last_id;
	r = call_send(c, what, req, fds, nfds);
	if (r < 0)
		return r;
	r = call_wait(c, what, req, fds, nfds, &reply, &fd);
	if (r < 0)
		return r;
	c->n_oneway = 0;                     /* answered after them: kept, if odpd's journal runs */

	if (reply->status != 0)
		r = reply_error(what, reply);
	else if (want != ODPD__REPLY__BODY__NOT_SET && reply->body_case != want)
		r = errmsg_set(-EIO, "%s: the daemon's reply lacks its body", what);
	else if (ret_fd && fd < 0)
		r = errmsg_set(-EIO, "%s: the daemon's reply lacks its file descriptor", what);
	if (r < 0 || !ret_reply)
		conn_reply_free(c, reply);
	else
		*ret_reply = reply;
	if (r >= 0 && ret_fd) {
		*ret_fd = fd;
		fd = -1;
	}
	if (fd >= 0)
		close(fd);
	return r;
}

/*
 * A release that does not wait: written into the hit table's release ring
 * if it has room (no system call), else DeregMr.no_reply of @handle, sent
 * and not waited for. odpd takes the ring before any request whose answer
 * it could change, and reads the one-way releases this connection sends
 * next in the same turn and nothing of another connection in between, so
 * whatever any process asks after this returns sees the release done
 * (doc/design.md §11). 1: the ring is full, release it with an answer.
 */
int conn_release_oneway(struct odpd_conn *c, const char *what, uint64_t handle)
{
	Odpd__DeregMr d;
	Odpd__Request req;
	int r;

	r = conn_check(c, what);
	if (r >= 0)
		r = conn_drain(c, what);
	if (r < 0)
		return r;
	if (hit_ring_push(c, handle)) {
		/* sent again after a RestartEvent unless the request after it
		 * (the next id), before which odpd takes the ring, was kept */
		c->oneway_ids[c->n_oneway] = c->last_id + 1;
		c->oneway_ring[c->n_oneway] = true;
		c->oneway_handles[c->n_oneway++] = handle;
		return 0;
	}
	/* A full ring: this release waits for its answer (odpd takes the ring
	 * before it). Only without a ring (an odpd before 1.4.5) a one-way
	 * request goes: its order holds for requests that odpd reads after it
	 * in the readiness order (doc/design.md §11). */
	if (c->hit_ring)
		return 1;
	oneway_request(&req, &d, handle);
	hit_before_request(c, &req);
	req.has_id = true;
	req.id = ++c->last_id;
	r = call_send(c, what, &req, NULL, 0);
	if (r < 0)
		return r;
	c->oneway_ids[c->n_oneway] = req.id;
	c->oneway_ring[c->n_oneway] = false;
	c->oneway_handles[c->n_oneway++] = handle;
	return 0;
}

/* ---------------------------------------------------------------- devices */

static void copy_string(char *dst, size_t size, const char *src)
{
	snprintf(dst, size, "%s", src ? src : "");
}

static enum odpd_support support_from_wire(protobuf_c_boolean has, Odpd__Support s)
{
	if (!has)
		return ODPD_SUPPORT_UNKNOWN;
	switch (s) {
	case ODPD__SUPPORT__SUPPORT_YES:
		return ODPD_SUPPORT_YES;
	case ODPD__SUPPORT__SUPPORT_NO:
		return ODPD_SUPPORT_NO;
	default:
		return ODPD_SUPPORT_UNKNOWN;
	}
}

static void device_from_wire(const Odpd__Device *d, struct odpd_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	copy_string(a->name, sizeof(a->name), d->name);
	copy_string(a->transport, sizeof(a->transport), d->transport);
	copy_string(a->fw_ver, sizeof(a->fw_ver), d->fw_ver);
	a->node_guid = d->node_guid;
	a->phys_port_cnt = d->phys_port_cnt;
	a->max_mr_size = d->max_mr_size;
	a->odp_general_caps = d->odp_general_caps;
	a->odp_rc_caps = d->odp_rc_caps;
	a->odp_uc_caps = d->odp_uc_caps;
	a->odp_ud_caps = d->odp_ud_caps;
	a->odp = d->odp;
	a->implicit_odp = d->implicit_odp;
	a->advise_mr = support_from_wire(d->has_advise_mr, d->advise_mr);
	a->advise_mr_errno = d->advise_mr_errno;
	a->import = support_from_wire(d->has_import, d->import);
	a->import_errno = d->import_errno;
}

static int conn_store_devices(struct odpd_conn *c, const Odpd__HelloReply *h)
{
	if (h->n_devices == 0)
		return 0;
	if (h->n_devices > 4096)
		return errmsg_set(-EIO, "odpd_connect: the daemon reported %zu devices", h->n_devices);
	c->devices = calloc(h->n_devices, sizeof(*c->devices));
	if (!c->devices)
		return errmsg_set(-ENOMEM, "odpd_connect: %m");
	for (size_t i = 0; i < h->n_devices; i++)
		device_from_wire(h->devices[i], &c->devices[i]);
	c->n_devices = (unsigned)h->n_devices;
	return 0;
}

const struct odpd_device_attr *conn_find_device(const struct odpd_conn *c, const char *name)
{
	for (unsigned i = 0; i < c->n_devices; i++)
		if (strcmp(c->devices[i].name, name) == 0)
			return &c->devices[i];
	return NULL;
}

/* Pick the device RegMr names: @device, or the first one (if any). */
static int conn_select_device(struct odpd_conn *c, const char *device)
{
	if (!device) {
		if (c->n_devices > 0)
			copy_string(c->device, sizeof(c->device), c->devices[0].name);
		return 0;
	}
	if (!conn_find_device(c, device))
		return errmsg_set(-ENODEV, "odpd_connect: device %s: not one of the daemon's %u devices",
				  device, c->n_devices);
	copy_string(c->device, sizeof(c->device), device);
	return 0;
}

/* ---------------------------------------------------------------- connect */

static int conn_hello(struct odpd_conn *c)
{
	const char *what = "odpd_connect: hello";
	Odpd__Hello hello = ODPD__HELLO__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *reply = NULL;
	const Odpd__HelloReply *h;
	int r;

	hello.has_version = true;
	hello.version = ODPD_PROTOCOL_VERSION;
	hello.client_name = program_invocation_short_name;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY_HELLO, &reply);
	if (r < 0)
		return r;

	h = reply->hello;
	if (!h->has_version || h->version != ODPD_PROTOCOL_VERSION)
		r = errmsg_set(-EPROTONOSUPPORT,
			       "%s: the daemon speaks protocol versions %u to %u, libodpd speaks %u",
			       what, h->version_min, h->version_max, ODPD_PROTOCOL_VERSION);
	else
		r = conn_store_devices(c, h);
	c->client_id = h->client_id;
	c->resident_check_max = h->has_resident_check_max ? h->resident_check_max : 0;
	c->oneway_dereg_max = h->has_oneway_dereg_max ? h->oneway_dereg_max : 0;
	if (oneway_off())
		c->oneway_dereg_max = 0;
	conn_reply_free(c, reply);
	return r;
}

/*
 * The socket is made under conns_lock, so that a fork cannot come between
 * its creation and the moment the atfork handler can see it.
 */
static int conn_open(struct odpd_conn *c, const char *path)
{
	struct sockaddr_un sa;
	int r = 0;

	if (odpd_wire_sockaddr(path, &sa) < 0)
		return errmsg_set(-EINVAL, "odpd_connect: invalid socket path \"%s\"", path);

	pthread_mutex_lock(&conns_lock);
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0)
		r = -errno;
	pthread_mutex_unlock(&conns_lock);
	if (r < 0)
		return errmsg_set(r, "odpd_connect: socket: %m");

	r = odpd_wire_connect_to(c->sock, &sa);     /* blocks while odpd's listen queue is full */
	if (r < 0)
		return errmsg_set(r, "odpd_connect: connecting to %s: %m", path);
	return 0;
}

static struct odpd_conn *conn_new(void)
{
	struct odpd_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->buf = malloc(ODPD_MAX_PACKET + 1);
	c->arena = calloc(1, sizeof(*c->arena));
	if (!c->buf || !c->arena) {
		free(c->buf);
		free(c->arena);
		free(c);
		return NULL;
	}
	c->sock = -1;
	snprintf(c->dead_reason, sizeof(c->dead_reason), "not connected");
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->tables_lock, NULL);
	link_init(&c->link);
	link_init(&c->segments);
	link_init(&c->mrs);
	link_init(&c->spare_mrs.head);
	link_init(&c->spare_refs.head);
	link_init(&c->mirror_mrs);
	link_init(&c->hit_refs);
	link_init(&c->lazy);
	return c;
}

static void conn_free(struct odpd_conn *c)
{
	conns_del(c);
	import_release(c);                  /* before the daemon closes the PD */
	if (c->sock >= 0)
		close(c->sock);
	mirror_release_all(c);
	mrs_release_all(c);
	hit_close(c);
	segments_release_all(c);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->tables_lock);
	free(c->devices);
	free(c->buf);
	free(c->arena);
	free(c);
}

static const char *socket_path(const char *path)
{
	if (path)
		return path;
	path = secure_getenv(ODPD_SOCKET_ENV);
	return path && path[0] ? path : ODPD_SOCKET_DEFAULT;
}

/*
 * A new connection to @path with its Hello answered (*@ret), or a negative
 * errno. A connection that odpd drops before it answers the Hello is made
 * once more: odpd keeps a connection across a crash only from its Hello's
 * answer on, so a crash (kill -9, an abort) before that closes it, and
 * under systemd's socket the next odpd takes a new one from the listening
 * socket, which outlives odpd (doc/design.md §12). Without it the second
 * connect fails as the first would have.
 */
static int conn_open_hello(const char *path, struct odpd_conn **ret)
{
	int r = 0;

	for (int attempt = 0; attempt < 2; attempt++) {
		struct odpd_conn *c = conn_new();

		if (!c)
			return errmsg_set(-ENOMEM, "odpd_connect: %m");
		conns_add(c);
		r = conn_open(c, path);
		if (r >= 0)
			r = conn_hello(c);
		if (r >= 0) {
			*ret = c;
			return 0;
		}
		conn_free(c);
		if (r != -ENOTCONN)                 /* not dropped: an answer, or no connection */
			break;
	}
	return r;
}

static int conn_connect(const char *path, const char *device, struct odpd_conn **ret)
{
	struct odpd_conn *c = NULL;
	int r;

	pthread_once(&atfork_once, atfork_register);
	if (atfork_error)
		return errmsg_set(-atfork_error, "odpd_connect: pthread_atfork: %m");
	r = conn_open_hello(socket_path(path), &c);
	if (r < 0)
		return r;
	r = conn_select_device(c, device);
	if (r >= 0)
		r = hit_open(c);
	if (r < 0) {
		conn_free(c);
		return r;
	}
	*ret = c;
	return 0;
}

_public_ struct odpd_conn *odpd_connect(const char *socket_path, const char *device)
{
	struct odpd_conn *c = NULL;
	int r;

	errmsg_clear();
	r = conn_connect(socket_path, device, &c);
	return public_ptr(r, c);
}

static bool conn_is_default(struct odpd_conn *c)
{
	bool is;

	pthread_mutex_lock(&default_lock);
	is = c == default_conn;
	pthread_mutex_unlock(&default_lock);
	return is;
}

_public_ void odpd_disconnect(struct odpd_conn *conn)
{
	if (!conn || conn_is_default(conn))
		return;
	conn_free(conn);
}

/*
 * Has the daemon dropped @c (a call saw it close, or the socket hangs up
 * now: odpd exited or was restarted)? Then it is dead from here on, and
 * @why says why. Takes c->lock: a call in flight on @c finishes first.
 */
static bool conn_dropped(struct odpd_conn *c, char *why, size_t len)
{
	bool dropped;

	pthread_mutex_lock(&c->lock);
	if (c->sock >= 0) {
		struct pollfd p = { .fd = c->sock, .events = POLLRDHUP };

		/* queued events (POLLIN) are no reason; a hang-up is */
		if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
			conn_kill(c, "the daemon closed the connection");
	}
	dropped = c->sock < 0;
	if (dropped)
		snprintf(why, len, "%s", c->dead_reason);
	pthread_mutex_unlock(&c->lock);
	return dropped;
}

/*
 * The default connection, made on first use, and made again when the
 * daemon has dropped it (a restart). The call that makes it again fails
 * once with ECONNRESET, so that the caller learns that what it registered
 * through the old one is gone; the next call uses the new one. The old
 * connection stays listed, dead: its objects still answer (ENOTCONN).
 */
int conn_default(struct odpd_conn **ret)
{
	int r = 0;

	pthread_mutex_lock(&default_lock);
	if (default_conn && conn_dropped(default_conn, default_lost_reason, sizeof(default_lost_reason))) {
		default_conn = NULL;
		default_lost = true;
	}
	if (!default_conn)
		r = conn_connect(NULL, NULL, &default_conn);
	if (r < 0 && default_lost) {
		/* not reconnected yet: say what was lost too */
		char msg[512];

		snprintf(msg, sizeof(msg), "%s", odpd_errmsg());
		r = errmsg_set(r, "%s (the default connection was lost before: %s; what was registered "
			       "through it is gone)", msg, default_lost_reason);
	} else if (r >= 0 && default_lost) {
		default_lost = false;
		r = errmsg_set(-ECONNRESET, "the daemon dropped the default connection (%s); the library "
			       "connected again, but the MRs and segments registered through the old "
			       "connection are gone (odpd_dereg_mr() on them fails with ENOTCONN): register "
			       "again", default_lost_reason);
	} else if (r >= 0) {
		*ret = default_conn;
	}
	pthread_mutex_unlock(&default_lock);
	return r;
}

_public_ struct odpd_conn *odpd_default_conn(void)
{
	struct odpd_conn *c = NULL;
	int r;

	errmsg_clear();
	r = conn_default(&c);
	return public_ptr(r, c);
}

/* ---------------------------------------------------------------- devices API */

_public_ unsigned odpd_device_count(const struct odpd_conn *conn)
{
	return conn ? conn->n_devices : 0;
}

_public_ int odpd_query_device(const struct odpd_conn *conn, unsigned index,
			       struct odpd_device_attr *attr, size_t attr_size)
{
	errmsg_clear();
	if (!conn || !attr || attr_size < ODPD_DEVICE_ATTR_SIZE_1_0)
		return public_int(errmsg_set(-EINVAL, "odpd_query_device: %s",
					     !conn ? "no connection" : !attr ? "attr is NULL" :
					     "attr_size is smaller than struct odpd_device_attr's first version"));
	if (index >= conn->n_devices)
		return public_int(errmsg_set(-ENODEV, "odpd_query_device: no device %u (the daemon has %u)",
					     index, conn->n_devices));
	public_copy_out(attr, attr_size, &conn->devices[index], sizeof(*attr));
	return 0;
}
