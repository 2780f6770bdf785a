/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The handlers' side of one request: who asked (struct odpd_caller), what
 * they answer (struct odpd_answer), and how a job answers later
 * (odpd_complete). A handler never sees the connection and never sends:
 *
 *   connection (client.c) -- receives, decodes (request.c), dispatches -->
 *   handler(caller, request, answer) -- returns ODPD_DONE or ODPD_PENDING
 *   connection layer sends the answer, if one was put
 *   ... a job's callback: odpd_complete(caller, answer or NULL)
 *   connection layer looks the connection id up, sends, reads again
 *
 * The connection layer frees no connection whose request is pending, so
 * the caller's holder and segments stay valid until odpd_complete; a
 * connection that disconnected meanwhile has the answer dropped.
 * This header includes nothing of the connection's.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "error.h"
#include "manager.h"
#include "odpd.pb-c.h"

/* A client's attachment of a segment: its window [client_addr, +length) onto
 * the shared mapping at file offset file_offset (attach.c). */
struct odpd_cseg {
	LIST_ENTRY(odpd_cseg) link;
	uint64_t handle;
	struct odpd_mapping *map;
	uint64_t client_addr;
	uint64_t file_offset;
	uint64_t length;
	bool writable;                  /* the client's fd allows writing */
	unsigned n_mrs;                 /* references of this client over it (at least:
					 * attach.c, cseg_refs) */
	uint64_t charged;               /* bytes of its user's mapped limit */
};

/* A client's segments, and the counter its segment and MR handles come from. */
struct odpd_csegs {
	LIST_HEAD(, odpd_cseg) list;
	unsigned n;
	uint64_t next_handle;
};

/* Who made a request, and where its answer goes: ids, not the connection. */
struct odpd_caller {
	struct odpd_manager *m;         /* the daemon's state */
	uint64_t conn;                  /* the connection's id (logs say "client N") */
	uint64_t id;                    /* the request's id */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int pidfd;                      /* -1: none; valid during the handler only */
	const gid_t *groups;            /* supplementary; during the handler only */
	unsigned n_groups;
	bool admin;                     /* root or odpd's admin group */
	struct odpd_holder *holder;     /* its MR references and PDs (registry.h) */
	struct odpd_csegs *segs;        /* its segments */
};

/* How every log line about a client names it: "client 7 (pid 1234)". */
#define CALLER_FMT "client %llu (pid %d)"
#define CALLER_ARGS(k) (unsigned long long)(k)->conn, (int)(k)->pid

/* A reply, packed: what a handler or a job hands to the connection layer.
 * odpd_out_reply packs it in the loop's reply buffer, valid until it is sent
 * or freed (odpd_answer_free); odpd_answer_keep copies what must wait. */
struct odpd_answer {
	struct odpd_answer *next;       /* the connection layer's output queue */
	int fd;                         /* sent along (SCM_RIGHTS) and closed, or -1 */
	int status;                     /* the reply's status */
	uint64_t id;                    /* the reply's id (0: an event) */
	size_t len;
	uint8_t data[];
};

/* A handler's slot for its answer: empty (NULL) until it puts one. When
 * packing fails, @fail says why (the connection is then dropped, as a
 * reply that cannot be sent drops it). */
struct odpd_out {
	struct odpd_answer *answer;
	const char *fail;               /* "out of memory", "reply too large" */
	size_t fail_len;                /* the size of a reply too large */
	int status;                     /* of the reply last put */
};

enum {
	ODPD_DONE = 0,                  /* answered in @out, or has nothing to answer */
	ODPD_PENDING = 1,               /* a job holds the request: it ends in odpd_complete */
};

/* Put @reply (and @fd, taken: closed on failure) in @o. */
void odpd_out_reply(struct odpd_out *o, const Odpd__Reply *reply, int fd);
/* An error reply for @k's request. */
void odpd_out_error(struct odpd_out *o, const struct odpd_caller *k, int code, const char *msg);
void odpd_out_err(struct odpd_out *o, const struct odpd_caller *k, const struct odpd_err *err);
/* Free what @o holds (an answer not handed on). */
void odpd_out_clear(struct odpd_out *o);
void odpd_answer_free(struct odpd_answer *a);
/* An answer that may wait (an output queue): @a, or a copy of it when it is
 * in the loop's reply buffer (answer.c). NULL (@a freed): out of memory. */
struct odpd_answer *odpd_answer_keep(struct odpd_answer *a);

/*
 * A pending request of @k ends: @o's answer (if any) goes to @k's
 * connection, if it is still there, and the connection reads again. Every
 * ODPD_PENDING ends here exactly once. @o is emptied.
 */
void odpd_complete(const struct odpd_caller *k, struct odpd_out *o);
/* Is @k's connection still there (a job may skip work for one gone)? */
bool odpd_caller_connected(const struct odpd_caller *k);

/* Segments (attach.c). @fd is consumed. */
/* A restart (restart.c): client segment @handle over @map as it was, charged
 * to @h's account again. NULL on ENOMEM. */
struct odpd_cseg *odpd_attach_restore(struct odpd_csegs *segs, struct odpd_holder *h, struct odpd_mapping *map,
				      uint64_t handle, uint64_t client_addr, uint64_t file_offset, uint64_t length,
				      bool writable, uint64_t charged);
int odpd_attach_segment(const struct odpd_caller *k, const Odpd__AttachSegment *req, int fd, struct odpd_out *o);
int odpd_detach_segment(const struct odpd_caller *k, const Odpd__DetachSegment *req, struct odpd_out *o);
int odpd_map_segment(const struct odpd_caller *k, const Odpd__MapSegment *req, struct odpd_out *o);
/* Forget @s: its mapping reference and what its user was charged for it. */
void odpd_cseg_drop(struct odpd_manager *m, struct odpd_holder *h, struct odpd_csegs *segs, struct odpd_cseg *s);

/* MRs (mr.c). @fd (client-PD mode, else -1) is consumed. */
int odpd_reg_mr(const struct odpd_caller *k, const Odpd__RegMr *req, int fd, struct odpd_out *o);
int odpd_dereg_mr(const struct odpd_caller *k, const Odpd__DeregMr *req, struct odpd_out *o);
/* OpenHitTable: @fd, the client's use table, is taken. */
int odpd_open_hit_table(const struct odpd_caller *k, const Odpd__OpenHitTable *req, int fd, struct odpd_out *o);
int odpd_verify(const struct odpd_caller *k, const Odpd__Verify *req, struct odpd_out *o);
int odpd_join_pd(const struct odpd_caller *k, const Odpd__JoinPd *req, struct odpd_out *o);
int odpd_flush(const struct odpd_caller *k, const Odpd__Flush *req, struct odpd_out *o);
int odpd_import_pd(const struct odpd_caller *k, const Odpd__ImportPd *req, struct odpd_out *o);
int odpd_advise_mr(const struct odpd_caller *k, const Odpd__AdviseMr *req, struct odpd_out *o);
int odpd_admin_verify(const struct odpd_caller *k, const Odpd__AdminVerify *req, struct odpd_out *o);

/* A connection as the status request lists it, filled by the connection
 * layer (notify.h, clients). */
struct odpd_conn_view {
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	const char *name;
	const struct odpd_holder *holder;
	const struct odpd_csegs *segs;
};

/* Admin requests (admin.c). */
int odpd_admin_status(const struct odpd_caller *k, struct odpd_out *o);
int odpd_admin_reload(const struct odpd_caller *k, struct odpd_out *o);
int odpd_admin_list_mrs(const struct odpd_caller *k, const Odpd__ListMrs *req, struct odpd_out *o);
