/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "handler.h"
#include "journal.h"
#include "manager.h"
#include "odpd.pb-c.h"
#include "registry.h"

struct odpd_client {
	struct odpd_manager *m;
	LIST_ENTRY(odpd_client) link;
	uint64_t id;
	int fd;
	int pidfd;
	struct ucred cred;
	bool admin;
	char name[64];
	bool hello;
	bool monitor;                   /* Hello.monitor: an admin tool, not listed as a client */
	bool busy;                      /* a job of this client is queued or running */
	bool dead;                      /* disconnected; torn down when not busy */
	bool handling;                  /* inside client_request: client_read_one tears down */
	bool resume;                    /* a job completed meanwhile: read again after it */
	bool read_paused;               /* ev_read deleted: readable while a job ran */
	bool oneway;                    /* the last request read wants no answer (DeregMr.no_reply) */
	struct event *ev_read, *ev_write;
	struct odpd_answer *outq, **outq_tail;
	unsigned outq_len;
	LIST_ENTRY(odpd_client) idlink;    /* in m->conn_ids: completions find it by id */
	struct odpd_csegs segs;         /* its segments (attach.c) */
	struct odpd_holder holder;      /* its MR references and PDs (registry.h) */
	bool has_holder;
	struct event *ev_peer;          /* pidfd readable: the peer process exited */
	bool holds_connection;          /* counted in its user's connections */
	int refused;                    /* errno: over its user's limit; closed after Hello's answer */
	bool counted_refused;           /* in its account's refusing and the manager's n_refused */
	struct event *ev_refused;       /* or after REFUSED_MS without a Hello */
	char refused_msg[256];
	gid_t *groups;                  /* supplementary groups (SO_PEERGROUPS) */
	unsigned n_groups;
	unsigned long long starttime;   /* of its process (/proc/PID/stat), to know it again; 0 unknown */
	bool stored;                    /* its socket is in systemd's fd store (journal.h) */
	/* Taken back after a crash (restart.c): the last request whose effect
	 * the journal kept, and its answer (NULL: none kept). A request again
	 * with that id gets the answer again; one with an older id is a
	 * duplicate. Cleared by the first newer request. */
	uint64_t resume_id;
	uint8_t *resume_reply;
	size_t resume_len;
	/* The first newer request's answer is kept too (resume_capture until
	 * it is sent): the library may have sent it to this odpd and then, on
	 * the event, again. Any later request ends the resumption. */
	bool resume_capture, resume_captured;
	/* That first newer request's id: the one in flight at the crash. */
	uint64_t resume_first;
	/* The last request whose effect the journal committed, and its answer
	 * (NULL: not kept): in every later record and snapshot of it. */
	uint64_t jlast_id;
	uint8_t *jlast_reply;
	size_t jlast_len;
	/* Handles of references whose MR was deregistered after the journal's
	 * last commit (its release was in flight at the crash): a DeregMr of
	 * one succeeds, as it did before the crash. */
	uint64_t *gone_handles;
	size_t n_gone;
};

/* The journal's view of @c (journal.h). */
void odpd_client_keep_view(const struct odpd_client *c, struct odpd_keep_client *v);

/* How every log line about a client names it: "client 7 (pid 1234)". */
#define CLIENT_FMT "client %llu (pid %d)"
#define CLIENT_ARGS(c) (unsigned long long)(c)->id, (int)(c)->cred.pid

/* A restart (restart.c): take connection @fd back from the fd store as client
 * @id, Hello answered, named @name. Its peer is identified anew (SO_PEERCRED,
 * pidfd, limits), and must still be the process that connected, started at
 * @starttime (0: unknown). 0, or -errno with @fd closed. */
int odpd_client_adopt(struct odpd_manager *m, int fd, uint64_t id, const char *name, uint64_t starttime,
		      struct odpd_client **ret);
/* After a restart, before the loop runs: the one-way requests at the head
 * of each connection's queue, sent while no odpd read. They come before any
 * request that waits, on any connection: it may have been sent after them. */
void odpd_client_read_oneway_first(struct odpd_manager *m);
/* Connection @id if it is still connected, else NULL. */
struct odpd_client *odpd_client_connected(struct odpd_manager *m, uint64_t id);
/* Accept callback of the listening socket. */
void odpd_client_accept(evutil_socket_t fd, short what, void *arg);

/* Queue a reply. May disconnect a client whose output queue is full, or
 * when out of memory; @c stays valid until the loop's next turn either way
 * (its teardown is deferred: odpd_client_on_reap). */
void odpd_client_send(struct odpd_client *c, Odpd__Reply *reply);
/* The same with one fd, which it takes (closed once sent, or on failure). */
void odpd_client_send_fd(struct odpd_client *c, Odpd__Reply *reply, int fd);
/* Send an error reply (status = @err code) for request @id. */
void odpd_client_send_error(struct odpd_client *c, uint64_t id, int code, const char *msg);
/* The same from @err. */
void odpd_reply_err(struct odpd_client *c, uint64_t id, const struct odpd_err *err);

/* A request goes to its handler (handler.h): reading stops until it ends. */
void odpd_client_begin(struct odpd_client *c);
/* The handler returned @r (ODPD_DONE or ODPD_PENDING): send what it put
 * in @o; a request done lets reading go on, a pending one ends in
 * odpd_complete (notify.h, complete). */
void odpd_client_end(struct odpd_client *c, struct odpd_out *o, int r);
/* The caller record of request @id of @c, for its handler. */
void odpd_client_caller(struct odpd_client *c, uint64_t id, struct odpd_caller *k);

/* Fill @n with the connection layer's side of notify.h: events to the
 * clients of @m's connections. */
void odpd_client_notify_init(struct odpd_notify *n, struct odpd_manager *m);

/* Drop the connection; the client's objects are released once no job runs,
 * on the loop's next turn (never inside this call). */
void odpd_client_disconnect(struct odpd_client *c, const char *why);
/* The manager's ev_reap: tear down the clients on m->reap. */
void odpd_client_on_reap(evutil_socket_t fd, short what, void *arg);
/* Hello answered: log the connection (at debug for a monitor, such as odpctl). */
void odpd_client_log_hello(const struct odpd_client *c);
