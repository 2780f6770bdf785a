/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handler.h"
#include "log.h"
#include "odpd-wire.h"

void odpd_answer_free(struct odpd_answer *a)
{
	if (!a)
		return;
	if (a->fd >= 0)
		close(a->fd);
	free(a);
}

void odpd_out_clear(struct odpd_out *o)
{
	odpd_answer_free(o->answer);
	o->answer = NULL;
}

void odpd_out_reply(struct odpd_out *o, const Odpd__Reply *reply, int fd)
{
	size_t len = odpd__reply__get_packed_size(reply);
	struct odpd_answer *a;

	/* one answer a request */
	odpd_out_clear(o);
	o->status = reply->status;
	if (len > ODPD_MAX_PACKET) {
		o->fail = "reply too large";
		o->fail_len = len;
	} else if (!(a = malloc(sizeof(*a) + len))) {
		o->fail = "out of memory";
	} else {
		a->next = NULL;
		a->fd = fd;
		a->status = reply->status;
		a->len = odpd__reply__pack(reply, a->data);
		o->answer = a;
		return;
	}
	if (fd >= 0)
		close(fd);
}

void odpd_out_error(struct odpd_out *o, const struct odpd_caller *k, int code, const char *msg)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;

	reply.has_id = 1;
	reply.id = k->id;
	reply.has_status = 1;
	reply.status = code;
	reply.message = (char *)msg;
	log_debug(CALLER_FMT ": request %llu: %s: %s", CALLER_ARGS(k), (unsigned long long)k->id,
		  strerror(code), msg);
	odpd_out_reply(o, &reply, -1);
}

void odpd_out_err(struct odpd_out *o, const struct odpd_caller *k, const struct odpd_err *err)
{
	odpd_out_error(o, k, err->code, err->msg);
}

void odpd_complete(const struct odpd_caller *k, struct odpd_out *o)
{
	const struct odpd_notify *n = &k->m->notify;

	n->complete(n->ctx, k->conn, k->id, o);
	o->answer = NULL;
	o->fail = NULL;
}

bool odpd_caller_connected(const struct odpd_caller *k)
{
	const struct odpd_notify *n = &k->m->notify;

	return n->connected(n->ctx, k->conn);
}
