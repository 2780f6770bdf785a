/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "request.h"

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
		if (req->client_name && *req->client_name)
			snprintf(c->name, sizeof(c->name), "%s", req->client_name);
		c->monitor = req->has_monitor && req->monitor;
		odpd_client_log_hello(c);
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

static void dispatch(struct odpd_client *c, const Odpd__Request *req, struct odpd_packet *pkt)
{
	uint64_t id = req->id;
	int fd = pkt->nfds ? pkt->fds[0] : -1;
	struct odpd_out o = { 0 };
	struct odpd_caller k;
	int r;

	/* The handler gets who asked, not the connection; it answers in @o,
	 * or later through odpd_complete (handler.h). */
	odpd_client_caller(c, id, &k);
	odpd_client_begin(c);
	switch (req->body_case) {
	case ODPD__REQUEST__BODY_ATTACH_SEGMENT:
		pkt->nfds = 0;                   /* consumed */
		r = odpd_attach_segment(&k, req->attach_segment, fd, &o);
		break;
	case ODPD__REQUEST__BODY_DETACH_SEGMENT:
		r = odpd_detach_segment(&k, req->detach_segment, &o);
		break;
	case ODPD__REQUEST__BODY_MAP_SEGMENT:
		r = odpd_map_segment(&k, req->map_segment, &o);
		break;
	case ODPD__REQUEST__BODY_REG_MR:
		pkt->nfds = 0;
		r = odpd_reg_mr(&k, req->reg_mr, fd, &o);
		break;
	case ODPD__REQUEST__BODY_DEREG_MR:
		r = odpd_dereg_mr(&k, req->dereg_mr, &o);
		break;
	case ODPD__REQUEST__BODY_VERIFY:
		r = odpd_verify(&k, req->verify, &o);
		break;
	case ODPD__REQUEST__BODY_STATUS:
		r = odpd_admin_status(&k, &o);
		break;
	case ODPD__REQUEST__BODY_LIST_MRS:
		r = odpd_admin_list_mrs(&k, req->list_mrs, &o);
		break;
	case ODPD__REQUEST__BODY_RELOAD:
		r = odpd_admin_reload(&k, &o);
		break;
	case ODPD__REQUEST__BODY_JOIN_PD:
		r = odpd_join_pd(&k, req->join_pd, &o);
		break;
	case ODPD__REQUEST__BODY_FLUSH:
		r = odpd_flush(&k, req->flush, &o);
		break;
	case ODPD__REQUEST__BODY_IMPORT_PD:
		r = odpd_import_pd(&k, req->import_pd, &o);
		break;
	case ODPD__REQUEST__BODY_ADVISE_MR:
		r = odpd_advise_mr(&k, req->advise_mr, &o);
		break;
	case ODPD__REQUEST__BODY_ADMIN_VERIFY:
		r = odpd_admin_verify(&k, req->admin_verify, &o);
		break;
	case ODPD__REQUEST__BODY_OPEN_HIT_TABLE:
		pkt->nfds = 0;
		r = odpd_open_hit_table(&k, req->open_hit_table, fd, &o);
		break;
	default:
		odpd_out_error(&o, &k, EOPNOTSUPP, "unknown request type (a newer client?)");
		r = ODPD_DONE;
		break;
	}
	odpd_client_end(c, &o, r);
}

/* protobuf-c's allocations for a request, through odpd's own malloc, so that
 * running out of memory is told apart from a malformed packet. */
static bool unpack_oom;

static void *pb_alloc(void *data, size_t size)
{
	void *p = malloc(size);

	(void)data;
	if (!p)
		unpack_oom = true;
	return p;
}

static void pb_free(void *data, void *p)
{
	(void)data;
	free(p);
}

static ProtobufCAllocator pb_allocator = { .alloc = pb_alloc, .free = pb_free };

void odpd_request_handle(struct odpd_client *c, const uint8_t *buf, size_t len, struct odpd_packet *pkt)
{
	Odpd__Request *req;
	char msg[128];

	if (len == 0) {
		odpd_client_send_error(c, 0, EBADMSG, "empty packet: expected one odpd.Request");
		goto out;
	}
	unpack_oom = false;
	req = odpd__request__unpack(&pb_allocator, len, buf);
	if (!req && unpack_oom) {
		odpd_client_send_error(c, 0, ENOMEM, "odpd is out of memory: the request was not read");
		goto out;
	}
	if (!req) {
		odpd_client_send_error(c, 0, EBADMSG, "cannot parse the packet as an odpd.Request");
		goto out;
	}
	log_debug(CLIENT_FMT ": request %llu: %s", CLIENT_ARGS(c),
		  (unsigned long long)req->id, odpd_request_name(req->body_case));
	if (!req->has_id || req->id == 0)
		odpd_client_send_error(c, 0, EINVAL, "request id 0 is reserved for events");
	else if (req->body_case == ODPD__REQUEST__BODY_HELLO)
		handle_hello(c, req->id, req->hello);
	else if (!c->hello)
		odpd_client_send_error(c, req->id, EPROTO, "send Hello first");
	else if (pkt->nfds != fds_wanted(req)) {
		snprintf(msg, sizeof(msg), "%s takes %u file descriptor(s), the packet carried %u",
			 odpd_request_name(req->body_case), fds_wanted(req), pkt->nfds);
		odpd_client_send_error(c, req->id, EINVAL, msg);
	} else {
		if (c->has_holder)
			odpd_registry_hits_report(&c->m->registry, &c->holder, req->has_local_hits,
						  req->local_hits, req->has_revocations_seen,
						  req->revocations_seen);
		dispatch(c, req, pkt);
	}
	odpd__request__free_unpacked(req, &pb_allocator);
out:
	odpd_packet_close_fds(pkt);
}
