/* SPDX-License-Identifier: MIT */
/*
 * mr.c - MRs in the daemon's PD: odpd_reg(_attr), odpd_dereg(_relaxed),
 * odpd_flush_relaxed, odpd_join_pd, odpd_verify.
 */
#include <stdlib.h>
#include <string.h>

#include "libodpd-private.h"

struct mr_entry {
	struct odpd_mr mr;              /* what the caller sees; first */
	struct odpd_link link;          /* in conn->mrs */
	struct odpd_conn *conn;
	struct odpd_segment *seg;
	struct hit_ref *ref;            /* the reference it shares in the cache (hit.c), or NULL */
};

/* ---------------------------------------------------------------- requests */

static int mr_reply(struct odpd_conn *c, const char *what, const void *addr,
		    const Odpd__MrReply *m, struct mr_result *ret)
{
	if (!m->has_handle)
		return errmsg_set(-EIO, "%s: the daemon's reply names no MR", what);
	if (!m->has_lkey) {
		mr_deregister(c, what, m->handle, false);
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
		.generation = m->generation,
		.cache_hit = m->cache_hit,
		.prefetch_errno = m->has_prefetch_errno ? m->prefetch_errno : 0,
		.slot = m->has_slot && m->has_ticket ? m->slot : 0,
		.ticket = m->ticket,
		.has_mr_range = m->has_mr_iova && m->has_mr_length,
		.mr_iova = m->mr_iova,
		.mr_length = m->mr_length,
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
	if (q->flags) {
		m.has_flags = true;
		m.flags = q->flags;
	}
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	r = conn_call(c, what, &req, &q->cmd_fd, q->client_pd ? 1 : 0, ODPD__REPLY__BODY_MR, &reply);
	if (r < 0)
		return r;
	r = mr_reply(c, what, addr, reply->mr, ret);
	conn_reply_free(c, reply);
	return r;
}

int mr_deregister(struct odpd_conn *c, const char *what, uint64_t handle, bool relaxed)
{
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	d.has_handle = true;
	d.handle = handle;
	if (relaxed) {
		d.has_relaxed = true;
		d.relaxed = true;
	}
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	return conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);
}

/* ---------------------------------------------------------------- the table */

/* Caller holds the tables lock. */
static void mr_insert_locked(struct odpd_conn *c, struct mr_entry *e, struct odpd_segment *seg)
{
	e->conn = c;
	e->seg = seg;
	link_add_tail(&c->mrs, &e->link);
	if (seg)                        /* NULL: implicit ODP, in no segment */
		seg->n_mrs++;
}



/* At most this many entries wait for reuse per connection (~100 B each). */
#define SPARE_MAX 64

/* A zeroed entry: a spare one, else NULL. Caller holds the tables lock. */
static struct mr_entry *spare_take_locked(struct odpd_conn *c)
{
	struct odpd_link *l = spares_take(&c->spare_mrs);
	struct mr_entry *e;

	if (!l)
		return NULL;
	e = container_of(l, struct mr_entry, link);
	memset(e, 0, sizeof(*e));
	return e;
}

/* Take @e out of the connection's MRs and keep it for reuse: true, else
 * the caller frees it. Caller holds the tables lock. */
static bool mr_retire_locked(struct odpd_conn *c, struct mr_entry *e)
{
	link_del(&e->link);
	if (e->seg)                     /* NULL: implicit ODP, in no segment */
		e->seg->n_mrs--;
	/* (with ASan freed, so that it reports a second odpd_dereg() of it;
	 * kept, it would be the spares' list that the second one corrupts) */
	return spares_put(&c->spare_mrs, &e->link, SPARE_MAX);
}

void mrs_release_all(struct odpd_conn *c)
{
	struct odpd_link *l, *tmp;

	while ((l = spares_take(&c->spare_mrs)))
		free(container_of(l, struct mr_entry, link));

	link_for_each_safe(l, tmp, &c->mrs) {
		struct mr_entry *e = container_of(l, struct mr_entry, link);

		link_del(l);
		if (e->ref)
			hit_drop_user(c, e->ref);
		free(e);
	}
}

/* ---------------------------------------------------------------- odpd_reg */

#define REG_ATTR_MASK_KNOWN (ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS)
#define REG_FLAGS_KNOWN (ODPD_REG_NO_CACHE | ODPD_REG_NO_POPULATE | ODPD_REG_PREFETCH)

/* A registration as the library does it: odpd_reg_attr() with the fields read. */
struct reg_args {
	unsigned access;                /* IBV_ACCESS_* */
	uint32_t flags;                 /* ODPD_REG_* */
};

/* @attr as rdma-core reads its *_attr structs: only the fields comp_mask names. */
static int reg_attr_read(const char *what, const struct odpd_reg_attr *attr, struct reg_args *ret)
{
	*ret = (struct reg_args) { 0 };
	if (!attr)
		return 0;
	if (attr->comp_mask & ~(uint32_t)REG_ATTR_MASK_KNOWN)
		return errmsg_set(-EINVAL, "%s: comp_mask 0x%x has bits this libodpd does not know "
				  "(0x%x; it knows ODPD_REG_ATTR_ACCESS and ODPD_REG_ATTR_FLAGS)", what,
				  attr->comp_mask, attr->comp_mask & ~(uint32_t)REG_ATTR_MASK_KNOWN);
	if (attr->comp_mask & ODPD_REG_ATTR_ACCESS)
		ret->access = attr->access;
	if (attr->comp_mask & ODPD_REG_ATTR_FLAGS) {
		if (attr->flags & ~(uint32_t)REG_FLAGS_KNOWN)
			return errmsg_set(-EINVAL, "%s: flags 0x%x not supported (only ODPD_REG_NO_CACHE, "
					  "ODPD_REG_NO_POPULATE and ODPD_REG_PREFETCH)", what,
					  attr->flags & ~(uint32_t)REG_FLAGS_KNOWN);
		ret->flags = attr->flags;
	}
	return 0;
}

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
	mr->generation = res->generation;
	mr->cache_hit = res->cache_hit;
	mr->prefetch_errno = res->prefetch_errno;
}

/* Populate (pinned MRs), then RegMr. Caller holds c->lock. */
static int mr_reg_locked(struct odpd_conn *c, const char *what, void *addr, size_t length,
			 const struct reg_args *a, const struct mr_request *q,
			 struct mr_entry *e)
{
	struct odpd_segment *seg = NULL;
	struct mr_request unpop = *q;
	bool populate = false, asked = false;
	struct mr_result res;
	int r;

	r = conn_check(c, what);
	if (r >= 0 && q->kind != ODPD__MR_KIND__MR_IMPLICIT_ODP)
		r = segment_lookup(c, what, addr, length, &seg);
	if (r >= 0 && q->kind == ODPD__MR_KIND__MR_PINNED && !(a->flags & ODPD_REG_NO_POPULATE) &&
	    !seg->no_populate)
		populate = true;
	/*
	 * A short range: the daemon looks whether its pages are resident
	 * (it must look at them anyway) and answers ENODATA if not; only then
	 * does this process fault them in and ask again. Saves the mincore(2)
	 * of every such registration of memory already used.
	 */
	if (r >= 0 && populate && length <= c->resident_check_max) {
		unpop.flags |= ODPD__REG_FLAGS__REG_UNPOPULATED;
		r = mr_register(c, what, addr, length, &unpop, &res);
		asked = r != -ENODATA;
		if (!asked) {                   /* not resident: fault in, ask again */
			errmsg_clear();
			r = 0;
		}
	}
	if (r >= 0 && !asked && populate)
		r = segment_populate(seg, what, addr, length);
	if (r >= 0 && !asked)
		r = mr_register(c, what, addr, length, q, &res);
	/* What this process keeps unused counts against its user's limits:
	 * give it back and ask once more. */
	if ((r == -EDQUOT || r == -ENOSPC || r == -ENOMEM) && hit_have_lazy(c)) {
		hit_trim(c, what, true, NULL);
		errmsg_clear();
		/* Refused with REG_UNPOPULATED (a limit is checked before
		 * residency): asked again without it, so fault the range in
		 * first, as above (this process's memory cgroup pays). */
		r = asked && populate ? segment_populate(seg, what, addr, length) : 0;
		if (r >= 0)
			r = mr_register(c, what, addr, length, q, &res);
	}
	if (r < 0)
		return r;
	mr_fill(&e->mr, addr, length, a->access, q->kind, &res);
	tables_lock(c);
	hit_add_locked(c, seg, addr, length, q, &res, &e->ref);
	mr_insert_locked(c, e, seg);
	tables_unlock(c);
	return 0;
}

static int mr_reg(struct odpd_conn *c, const char *what, void *addr, size_t length,
		  const struct reg_args *a, struct odpd_mr **ret)
{
	struct mr_request q = { .cmd_fd = -1 };
	struct mr_result res;
	struct mr_entry *e;
	int r;

	r = access_to_wire(what, a->access, &q.access, &q.kind);
	if (r < 0)
		return r;
	/* ibv_reg_mr(3)'s implicit ODP: address 0, length SIZE_MAX (the daemon decides) */
	if (q.kind == ODPD__MR_KIND__MR_ODP && addr == NULL && length == SIZE_MAX)
		q.kind = ODPD__MR_KIND__MR_IMPLICIT_ODP;
	if (a->flags & ODPD_REG_NO_CACHE)
		q.flags |= ODPD__REG_FLAGS__REG_NO_CACHE;
	if (a->flags & ODPD_REG_PREFETCH)
		q.flags |= ODPD__REG_FLAGS__REG_PREFETCH;
	/* A range this process holds, or keeps unused: answered here, under
	 * one lock, with an entry a local release left (no allocation). */
	tables_lock(c);
	e = spare_take_locked(c);
	if (!e) {
		tables_unlock(c);
		e = calloc(1, sizeof(*e));
		if (!e)
			return errmsg_set(-ENOMEM, "%s: %m", what);
		tables_lock(c);
	}
	if (hit_lookup(c, addr, length, &q, &res, &e->ref)) {
		mr_fill(&e->mr, addr, length, a->access, q.kind, &res);
		mr_insert_locked(c, e, e->ref->seg);
		tables_unlock(c);
		*ret = &e->mr;
		return 0;
	}
	tables_unlock(c);
	pthread_mutex_lock(&c->lock);
	r = mr_reg_locked(c, what, addr, length, a, &q, e);
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		free(e);
		return r;
	}
	*ret = &e->mr;
	return 0;
}

_public_ struct odpd_mr *odpd_reg_attr(struct odpd_conn *conn, void *addr, size_t length,
				       const struct odpd_reg_attr *attr)
{
	const char *what = "odpd_reg_attr";
	struct odpd_mr *mr = NULL;
	struct reg_args a = { 0 };
	int r;

	errmsg_clear();
	if (!conn)
		r = errmsg_set(-EINVAL, "%s: no connection", what);
	else
		r = reg_attr_read(what, attr, &a);
	if (r >= 0)
		r = mr_reg(conn, what, addr, length, &a, &mr);
	return public_ptr(r, mr);
}

_public_ struct odpd_mr *odpd_reg(struct odpd_conn *conn, void *addr, size_t length, unsigned int access)
{
	const char *what = "odpd_reg";
	struct reg_args a = { .access = access };
	struct odpd_mr *mr = NULL;
	int r;

	errmsg_clear();
	if (!conn)
		r = errmsg_set(-EINVAL, "%s: no connection", what);
	else
		r = mr_reg(conn, what, addr, length, &a, &mr);
	return public_ptr(r, mr);
}

/* ---------------------------------------------------------------- odpd_dereg */

/* Released in this process (hit.c): true, and @e is gone. */
static bool mr_dereg_local(struct mr_entry *e, const char *what, bool relaxed)
{
	struct odpd_conn *c = e->conn;
	enum hit_release fate;

	if (!e->ref)
		return false;
	tables_lock(c);
	fate = hit_release(c, e->ref, relaxed);
	if (fate == HIT_RELEASE_DONE && mr_retire_locked(c, e))
		e = NULL;
	tables_unlock(c);
	if (fate != HIT_RELEASE_DONE)
		return false;
	free(e);
	if (relaxed && hit_over(c)) {
		/* over ODPD_CACHE_MAX_*: the least recently released go to the daemon */
		pthread_mutex_lock(&c->lock);
		hit_trim(c, what, false, NULL);
		pthread_mutex_unlock(&c->lock);
		errmsg_clear();
	}
	return true;
}

/*
 * Released without waiting for odpd's answer (DeregMr.no_reply): a pinned
 * MR of odpd's PD that no remote peer can use, short enough for odpd to
 * deregister on its loop, while fewer than ONEWAY_MAX such releases are
 * unanswered. Caller holds c->lock.
 */
static bool mr_oneway(const struct odpd_conn *c, const struct mr_entry *e, bool relaxed)
{
	const unsigned remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
				IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND;

	return !relaxed && e->mr.length <= c->oneway_dereg_max && !(e->mr.access & remote) &&
	       c->n_oneway < ONEWAY_MAX;
}

static int mr_dereg(struct mr_entry *e, const char *what, bool relaxed)
{
	struct odpd_conn *c = e->conn;
	bool kept = false;
	int r;

	if (mr_dereg_local(e, what, relaxed))
		return 0;
	pthread_mutex_lock(&c->lock);
	r = mr_oneway(c, e, relaxed) ? conn_release_oneway(c, what, e->mr.handle) : 1;
	if (r == 1)                          /* not one-way, or its ring is full */
		r = mr_deregister(c, what, e->mr.handle, relaxed);
	if (r >= 0) {
		/* out of the tables, and kept for the next odpd_reg (a miss's
		 * release: no free here, no calloc there) */
		tables_lock(c);
		if (e->ref)
			hit_drop_user(c, e->ref);
		kept = mr_retire_locked(c, e);
		tables_unlock(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		if (e->ref)
			hit_unrelease(c, e->ref);
		return r;
	}
	if (!kept)
		free(e);
	return r;
}

_public_ int odpd_dereg(struct odpd_mr *mr)
{
	errmsg_clear();
	if (!mr)
		return public_int(errmsg_set(-EINVAL, "odpd_dereg: mr is NULL"));
	return public_int(mr_dereg(container_of(mr, struct mr_entry, mr), "odpd_dereg", false));
}

_public_ int odpd_dereg_relaxed(struct odpd_mr *mr)
{
	errmsg_clear();
	if (!mr)
		return public_int(errmsg_set(-EINVAL, "odpd_dereg_relaxed: mr is NULL"));
	return public_int(mr_dereg(container_of(mr, struct mr_entry, mr), "odpd_dereg_relaxed", true));
}

/* ---------------------------------------------------------------- odpd_flush_relaxed */

static int conn_flush(struct odpd_conn *c)
{
	/* No field set: the relaxed MRs of this connection's PD. */
	Odpd__Flush f = ODPD__FLUSH__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	int r;

	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &f;
	pthread_mutex_lock(&c->lock);
	r = conn_call(c, "odpd_flush_relaxed", &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);
	pthread_mutex_unlock(&c->lock);
	return r;
}

_public_ int odpd_flush_relaxed(struct odpd_conn *conn)
{
	errmsg_clear();
	if (!conn)
		return public_int(errmsg_set(-EINVAL, "odpd_flush_relaxed: no connection"));
	return public_int(conn_flush(conn));
}

/* ---------------------------------------------------------------- odpd_join_pd */

/* The daemon's limit; it also checks the characters ([A-Za-z0-9._:@-]). */
#define PD_NAME_MAX 63

static int conn_join_pd(struct odpd_conn *c, const char *name)
{
	const char *what = "odpd_join_pd";
	Odpd__JoinPd j = ODPD__JOIN_PD__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	size_t len = name ? strnlen(name, PD_NAME_MAX + 1) : 0;
	int r;

	if (!name || len == 0 || len > PD_NAME_MAX)
		return errmsg_set(-EINVAL, "%s: %s", what,
				  !name ? "name is NULL" : len == 0 ? "name is empty" :
				  "name is longer than 63 bytes");
	j.name = (char *)name;
	req.body_case = ODPD__REQUEST__BODY_JOIN_PD;
	req.join_pd = &j;
	pthread_mutex_lock(&c->lock);
	r = conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);
	pthread_mutex_unlock(&c->lock);
	return r;
}

_public_ int odpd_join_pd(struct odpd_conn *conn, const char *name)
{
	errmsg_clear();
	if (!conn)
		return public_int(errmsg_set(-EINVAL, "odpd_join_pd: no connection"));
	return public_int(conn_join_pd(conn, name));
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
	if (!addr && length == 0) {
		/* this registration's range: a local hit shares a reference
		 * (and its handle) over a larger MR */
		addr = e->mr.addr;
		length = e->mr.length;
	}
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
	conn_reply_free(c, reply);
	return r;
}

_public_ int odpd_verify(struct odpd_mr *mr, void *addr, size_t length, uint32_t *ret_crc32)
{
	errmsg_clear();
	if (!mr || !ret_crc32)
		return public_int(errmsg_set(-EINVAL, "odpd_verify: %s is NULL", !mr ? "mr" : "ret_crc32"));
	return public_int(mr_verify(container_of(mr, struct mr_entry, mr), addr, length, ret_crc32));
}

/* ---------------------------------------------------------------- odpd_advise_mr */

#define ADVISE_MAX_SGE 64

static int conn_advise(struct odpd_conn *c, const char *what, enum ibv_advise_mr_advice advice,
		       uint32_t flags, const struct ibv_sge *sg_list, uint32_t num_sge)
{
	Odpd__Sge sges[ADVISE_MAX_SGE], *ptrs[ADVISE_MAX_SGE];
	Odpd__AdviseMr a = ODPD__ADVISE_MR__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	int r;

	for (uint32_t i = 0; i < num_sge; i++) {
		odpd__sge__init(&sges[i]);
		sges[i].has_addr = sges[i].has_length = sges[i].has_lkey = true;
		sges[i].addr = sg_list[i].addr;
		sges[i].length = sg_list[i].length;
		sges[i].lkey = sg_list[i].lkey;
		ptrs[i] = &sges[i];
	}
	a.has_advice = a.has_flags = true;
	a.advice = (uint32_t)advice;
	a.flags = flags;
	a.n_sges = num_sge;
	a.sges = ptrs;
	req.body_case = ODPD__REQUEST__BODY_ADVISE_MR;
	req.advise_mr = &a;
	pthread_mutex_lock(&c->lock);
	r = conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY_ADVISE_MR, NULL);
	pthread_mutex_unlock(&c->lock);
	return r;
}

_public_ int odpd_advise_mr(struct odpd_conn *conn, enum ibv_advise_mr_advice advice, uint32_t flags,
			    struct ibv_sge *sg_list, uint32_t num_sge)
{
	const char *what = "odpd_advise_mr";
	int r;

	errmsg_clear();
	if (!conn || !sg_list || num_sge == 0 || num_sge > ADVISE_MAX_SGE)
		r = errmsg_set(-EINVAL, "%s: %s", what, !conn ? "conn is NULL" : !sg_list ? "sg_list is NULL" :
			       "num_sge must be 1 to 64");
	else
		r = conn_advise(conn, what, advice, flags, sg_list, num_sge);
	return public_int(r);
}
