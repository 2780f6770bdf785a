/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handler.h"
#include "log.h"
#include "odpd-envelope.h"
#include "odpd-wire.h"

/*
 * The loop's reply buffer: odpd_out_reply packs a reply here, and the
 * connection layer sends it from here at once, copying it into an
 * allocated answer only when it must wait in a client's output queue
 * (odpd_answer_keep). One answer at a time holds it: a reply packed while
 * another holds it is allocated. Replies are packed and sent on the event
 * loop only (a job answers from its done callback).
 */
static _Alignas(struct odpd_answer) uint8_t scratch_mem[sizeof(struct odpd_answer) + ODPD_MAX_PACKET];
#define scratch ((struct odpd_answer *)scratch_mem)
static bool scratch_busy;

void odpd_answer_free(struct odpd_answer *a)
{
	if (!a)
		return;
	if (a->fd >= 0)
		close(a->fd);
	if (a == scratch)
		scratch_busy = false;
	else
		free(a);
}

struct odpd_answer *odpd_answer_keep(struct odpd_answer *a)
{
	struct odpd_answer *k;

	if (a != scratch)
		return a;
	k = malloc(sizeof(*k) + a->len);
	if (!k) {
		odpd_answer_free(a);
		return NULL;
	}
	memcpy(k, a, sizeof(*k) + a->len);
	scratch_busy = false;
	return k;
}

void odpd_out_clear(struct odpd_out *o)
{
	odpd_answer_free(o->answer);
	o->answer = NULL;
}

void odpd_out_reply(struct odpd_out *o, const Odpd__Reply *reply, int fd)
{
	struct odpd_answer *a = NULL;
	size_t len;

	/* one answer a request */
	odpd_out_clear(o);
	o->status = reply->status;
	if (!scratch_busy) {
		len = odpd_reply_pack_bounded(reply, scratch->data, ODPD_MAX_PACKET);
		if (len <= ODPD_MAX_PACKET) {
			a = scratch;
			scratch_busy = true;
		}
	} else {
		len = odpd__reply__get_packed_size(reply);
		if (len <= ODPD_MAX_PACKET) {
			a = malloc(sizeof(*a) + len);
			if (!a) {
				o->fail = "out of memory";
				goto fail;
			}
			len = odpd__reply__pack(reply, a->data);
		}
	}
	if (len > ODPD_MAX_PACKET) {
		o->fail = "reply too large";
		o->fail_len = len;
		goto fail;
	}
	a->next = NULL;
	a->fd = fd;
	a->status = reply->status;
	a->id = reply->id;
	a->len = len;
	o->answer = a;
	return;
fail:
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
