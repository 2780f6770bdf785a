/* SPDX-License-Identifier: MIT */
/* mr.c - MRs in the daemon's PD: odpd_reg, odpd_dereg, odpd_verify. */
#include <stdlib.h>

#include "libodpd-private.h"

struct mr_entry {
	struct odpd_mr mr;              /* what the caller sees; first */
	struct odpd_link link;          /* in conn->mrs */
	struct odpd_conn *conn;
	struct odpd_segment *seg;
};

/* ---------------------------------------------------------------- requests */

static int mr_reply(struct odpd_conn *c, const char *what, const void *addr,
		    const Odpd__MrReply *m, struct mr_result *ret)
{
	if (!m->has_handle)
		return errmsg_set(-EIO, "%s: the daemon's reply names no MR", what);
	if (!m->has_lkey) {
		mr_deregister(c, what, m->handle);
		return errmsg_set(-EIO, "%s: the daemon's reply has no lkey", what);
	}
	*ret = (struct mr_result) {
		.handle = m->handle,
		.iova = m->has_iova ? m->iova : (uintptr_t)addr,
		.lkey = m->lkey,
		.rkey = m->rkey,
		.kernel_handle = m->kernel_handle,
		.has_kernel_handle = m->has_kernel_handle,
		.has_access = m->has_access,
		.access = m->access,
	};
	return 0;
}

int mr_register(struct odpd_conn *c, const char *what, const void *addr, size_t length,
		const struct mr_request *q, struct mr_result *ret)
{
	Odpd__RegMr m = ODPD__REG_MR__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *reply = NULL;
	int r;

	m.has_addr = m.has_length = m.has_access = m.has_kind = true;
	m.addr = (uintptr_t)addr;
	m.length = length;
	m.access = q->access;
	m.kind = q->kind;
	m.device = (char *)(q->device ? q->device : c->device[0] ? c->device : NULL);
	if (q->client_pd) {
		m.has_client_pd = m.has_client_pd_handle = true;
		m.client_pd = true;
		m.client_pd_handle = q->client_pd_handle;
	}
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	r = conn_call(c, what, &req, &q->cmd_fd, q->client_pd ? 1 : 0, ODPD__REPLY__BODY_MR, &reply);
	if (r < 0)
		return r;
	r = mr_reply(c, what, addr, reply->mr, ret);
	odpd__reply__free_unpacked(reply, NULL);
	return r;
}

int mr_deregister(struct odpd_conn *c, const char *what, uint64_t handle)
{
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	d.has_handle = true;
	d.handle = handle;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	return conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);
}

/* ---------------------------------------------------------------- the table */

static void mr_insert(struct odpd_conn *c, struct mr_entry *e, struct odpd_segment *seg)
{
	e->conn = c;
	e->seg = seg;
	tables_lock(c);
	link_add_tail(&c->mrs, &e->link);
	seg->n_mrs++;
	tables_unlock(c);
}

static void mr_remove(struct mr_entry *e)
{
	tables_lock(e->conn);
	link_del(&e->link);
	e->seg->n_mrs--;
	tables_unlock(e->conn);
}

void mrs_release_all(struct odpd_conn *c)
{
	struct odpd_link *l, *tmp;

	link_for_each_safe(l, tmp, &c->mrs) {
		link_del(l);
		free(container_of(l, struct mr_entry, link));
	}
}

/* ---------------------------------------------------------------- odpd_reg */

static void mr_fill(struct odpd_mr *mr, void *addr, size_t length, unsigned access,
		    Odpd__MrKind kind, const struct mr_result *res)
{
	mr->addr = addr;
	mr->length = length;
	mr->iova = res->iova;
	mr->lkey = res->lkey;
	mr->rkey = res->rkey;
	mr->access = res->has_access ? access_from_wire(res->access, kind) : access;
	mr->handle = res->handle;
}

static int mr_reg(struct odpd_conn *c, void *addr, size_t length, unsigned access,
		  struct odpd_mr **ret)
{
	const char *what = "odpd_reg";
	struct mr_request q = { .cmd_fd = -1 };
	struct odpd_segment *seg;
	struct mr_result res;
	struct mr_entry *e;
	int r;

	r = access_to_wire(what, access, &q.access, &q.kind);
	if (r < 0)
		return r;
	e = calloc(1, sizeof(*e));
	if (!e)
		return errmsg_set(-ENOMEM, "%s: %m", what);

	pthread_mutex_lock(&c->lock);
	r = conn_check(c, what);
	if (r >= 0)
		r = segment_lookup(c, what, addr, length, &seg);
	if (r >= 0)
		r = mr_register(c, what, addr, length, &q, &res);
	if (r >= 0) {
		mr_fill(&e->mr, addr, length, access, q.kind, &res);
		mr_insert(c, e, seg);
	}
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		free(e);
		return r;
	}
	*ret = &e->mr;
	return 0;
}

_public_ struct odpd_mr *odpd_reg(struct odpd_conn *conn, void *addr, size_t length, unsigned int access)
{
	struct odpd_mr *mr = NULL;
	int r;

	errmsg_clear();
	if (!conn)
		r = errmsg_set(-EINVAL, "odpd_reg: no connection");
	else
		r = mr_reg(conn, addr, length, access, &mr);
	return public_ptr(r, mr);
}

/* ---------------------------------------------------------------- odpd_dereg */

static int mr_dereg(struct mr_entry *e)
{
	struct odpd_conn *c = e->conn;
	int r;

	pthread_mutex_lock(&c->lock);
	r = mr_deregister(c, "odpd_dereg", e->mr.handle);
	if (r >= 0)
		mr_remove(e);
	pthread_mutex_unlock(&c->lock);
	if (r >= 0)
		free(e);
	return r;
}

_public_ int odpd_dereg(struct odpd_mr *mr)
{
	errmsg_clear();
	if (!mr)
		return public_int(errmsg_set(-EINVAL, "odpd_dereg: mr is NULL"));
	return public_int(mr_dereg(container_of(mr, struct mr_entry, mr)));
}

/* ---------------------------------------------------------------- odpd_verify */

/* [@addr, @addr + @length) inside @mr; NULL/0 is the whole MR. */
static int verify_range(const char *what, const struct odpd_mr *mr, const void *addr, size_t length)
{
	uintptr_t a = (uintptr_t)addr, start = (uintptr_t)mr->addr;

	if (!addr && length == 0)
		return 0;
	if (!addr || length == 0)
		return errmsg_set(-EINVAL, "%s: give addr and length, or NULL and 0 for the whole MR", what);
	if (a + length < a || a < start || a + length > start + mr->length)
		return errmsg_set(-EINVAL, "%s: [%p, +%zu) is not inside the MR [%p, +%zu)", what,
				  addr, length, mr->addr, mr->length);
	return 0;
}

static int mr_verify(struct mr_entry *e, void *addr, size_t length, uint32_t *ret_crc32)
{
	const char *what = "odpd_verify";
	Odpd__Verify v = ODPD__VERIFY__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	struct odpd_conn *c = e->conn;
	Odpd__Reply *reply = NULL;
	int r;

	r = verify_range(what, &e->mr, addr, length);
	if (r < 0)
		return r;
	v.has_handle = v.has_addr = v.has_length = true;
	v.handle = e->mr.handle;
	v.addr = (uintptr_t)addr;
	v.length = length;
	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = &v;

	pthread_mutex_lock(&c->lock);
	r = conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY_VERIFY, &reply);
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	if (reply->verify->has_crc32)
		*ret_crc32 = reply->verify->crc32;
	else
		r = errmsg_set(-EIO, "%s: the daemon's reply has no CRC", what);
	odpd__reply__free_unpacked(reply, NULL);
	return r;
}

_public_ int odpd_verify(struct odpd_mr *mr, void *addr, size_t length, uint32_t *ret_crc32)
{
	errmsg_clear();
	if (!mr || !ret_crc32)
		return public_int(errmsg_set(-EINVAL, "odpd_verify: %s is NULL", !mr ? "mr" : "ret_crc32"));
	return public_int(mr_verify(container_of(mr, struct mr_entry, mr), addr, length, ret_crc32));
}
