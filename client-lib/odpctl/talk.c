/* SPDX-License-Identifier: MIT */
/* talk.c - talking to odpd: connect, Hello, one request and its reply. */
#include "odpctl.h"

/* ----------------------------------------------------------------- talking */

/* Wait at most @sec seconds for each reply. Returns 0 or -1 after printing why. */
int set_reply_timeout(int sock, int sec)
{
	struct timeval tv = { .tv_sec = sec };

	if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
		fail("setsockopt(SO_RCVTIMEO)", errno, NULL);
		return -1;
	}
	return 0;
}

/* The reply timeout of @sock in seconds, for messages. */
static long reply_timeout(int sock)
{
	struct timeval tv = { .tv_sec = TIMEOUT_SEC };
	socklen_t len = sizeof(tv);

	if (getsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) < 0)
		return TIMEOUT_SEC;
	return (long)tv.tv_sec;
}

/* Returns a connected socket, or -1 after printing why. */
int connect_daemon(const char *path)
{
	struct timeval tv = { .tv_sec = TIMEOUT_SEC };
	int sock, err;
	char *what;

	if (asprintf(&what, "connect to %s", path) < 0)
		oom();
	sock = odpd_wire_connect(path);
	if (sock >= 0 && (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
			  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)) {
		err = errno;
		close(sock);
		sock = -err;
	}
	if (sock < 0) {
		err = -sock;
		fail(what, err, err == ENOENT || err == ECONNREFUSED ?
		     "is odpd running? (another socket: --socket or $" ODPD_SOCKET_ENV ")" : NULL);
		sock = -1;
	}
	free(what);
	return sock;
}

/*
 * Wait for the reply to request @id. Events (id 0, status 0) are skipped;
 * an error with id 0 is the daemon refusing a packet it could not read, so
 * it is ours. Returns the reply, or NULL after printing why.
 */
static Odpd__Reply *receive_reply(int sock, uint64_t id, const char *what)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];

	for (;;) {
		struct odpd_packet p;
		int r = odpd_wire_recv(sock, buf, sizeof(buf), &p, 0);

		if (r == -EAGAIN) {
			fail(what, ETIMEDOUT, "no reply from odpd within %ld s", reply_timeout(sock));
			return NULL;
		}
		if (r < 0) {
			fail(what, -r, NULL);
			return NULL;
		}
		odpd_packet_close_fds(&p);
		if (p.eof) {
			fail(what, ECONNRESET, "odpd closed the connection");
			return NULL;
		}
		if (p.truncated || p.ctrunc) {
			fail(what, EMSGSIZE, "reply larger than %u bytes or with too many fds",
			     ODPD_MAX_PACKET);
			return NULL;
		}
		Odpd__Reply *rep = odpd__reply__unpack(NULL, p.len, buf);
		if (!rep) {
			fail(what, EBADMSG, "cannot parse odpd's reply");
			return NULL;
		}
		if (rep->id == id || (rep->id == 0 && rep->status != 0))
			return rep;
		if (rep->id != 0) {
			fail(what, EBADMSG, "reply to request %" PRIu64 ", expected %" PRIu64,
			     rep->id, id);
			odpd__reply__free_unpacked(rep, NULL);
			return NULL;
		}
		odpd__reply__free_unpacked(rep, NULL);
	}
}

/* The requests odpctl sends that the daemon answers only for admins. */
static bool is_admin_request(Odpd__Request__BodyCase c)
{
	return c == ODPD__REQUEST__BODY_STATUS || c == ODPD__REQUEST__BODY_LIST_MRS ||
	       c == ODPD__REQUEST__BODY_FLUSH;
}

/*
 * Send @req, wait for its reply, check its status and that it carries a
 * @want body. Returns the reply, or NULL after printing why.
 */
Odpd__Reply *call(int sock, Odpd__Request *req, const char *what,
			 Odpd__Reply__BodyCase want)
{
	int r = odpd_wire_send(sock, &req->base, NULL, 0, 0);
	if (r < 0) {
		fail(what, r == -EAGAIN ? ETIMEDOUT : -r, NULL);
		return NULL;
	}

	Odpd__Reply *rep = receive_reply(sock, req->id, what);
	if (!rep)
		return NULL;
	if (rep->status != 0) {
		const char *msg = rep->message ? rep->message : "";

		fail(what, rep->status, *msg ? "%s" : NULL, msg);
		if (rep->status == EPERM && (is_admin_request(req->body_case) ||
					     req->body_case == ODPD__REQUEST__BODY_HELLO))
			fputs("odpctl: run odpctl as root or as a member of odpd's admin group "
			      "(odpd --admin-group)\n", stderr);
	} else if (rep->body_case != want) {
		fail(what, EBADMSG, "odpd's reply lacks the expected body");
	} else {
		return rep;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return NULL;
}

int hello(int sock)
{
	Odpd__Hello body = ODPD__HELLO__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	body.has_version = true;
	body.version = ODPD_PROTOCOL_VERSION;
	body.client_name = (char *)"odpctl";
	body.has_monitor = true;             /* not listed as a client */
	body.monitor = true;
	req.has_id = true;
	req.id = 1;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &body;

	rep = call(sock, &req, "hello", ODPD__REPLY__BODY_HELLO);
	if (!rep)
		return -1;
	if (rep->hello->version != ODPD_PROTOCOL_VERSION) {
		fail("hello", EPROTONOSUPPORT, "odpd speaks protocol versions %" PRIu32
		     "..%" PRIu32 ", odpctl speaks %u", rep->hello->version_min,
		     rep->hello->version_max, ODPD_PROTOCOL_VERSION);
		odpd__reply__free_unpacked(rep, NULL);
		return -1;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return 0;
}
