/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "implicit.h"
#include "log.h"
#include "handler.h"
#include "journal.h"

static struct odpd_cseg *cseg_overlapping(const struct odpd_caller *c, uint64_t addr, uint64_t length)
{
	struct odpd_cseg *s;

	LIST_FOREACH(s, &c->segs->list, link)
		if (addr < s->client_addr + s->length && s->client_addr < addr + length)
			return s;
	return NULL;
}

/*
 * Check the client's view of the segment and work out where odpd should map
 * file offset 0 (@ret_want, 0: anywhere in the window).
 */
static int attach_check(const struct odpd_caller *c, const Odpd__AttachSegment *req,
			const struct odpd_seginfo *info, uint64_t *ret_off, uint64_t *ret_len,
			uintptr_t *ret_want, struct odpd_err *err)
{
	uint64_t addr = req->client_addr, off = req->file_offset, len = req->length;
	const uint64_t page = info->page_size;

	if (addr == 0) {                     /* the daemon picks the address */
		if (off != 0 || (len != 0 && len != info->size))
			return err_set(err, EINVAL, "an attach without an address covers the whole "
				       "file: file_offset and length must be 0");
		*ret_off = 0;
		*ret_len = info->size;
		*ret_want = 0;
		return 0;
	}
	if (addr % page || off % page)
		return err_set(err, EINVAL, "address %#" PRIx64 " and file offset %#" PRIx64
			       " must be multiples of the page size %" PRIu64, addr, off, page);
	if (len == 0)
		return err_set(err, EINVAL, "length 0");
	if (addr + len < addr)
		return err_set(err, EINVAL, "address + length overflows");
	if (len > info->size || off > info->size - len)
		return err_set(err, EINVAL, "file range [%#" PRIx64 ", +%" PRIu64 ") is past the end "
			       "of the %" PRIu64 "-byte segment", off, len, info->size);
	int r = odpd_client_mapping_check(c->pid, c->pidfd, addr, len, off, info->dev, info->ino, err);
	if (r < 0)
		return r;
	*ret_off = off;
	*ret_len = len;
	*ret_want = addr >= off ? (uintptr_t)(addr - off) : 0;
	return 0;
}

static void reply_segment(struct odpd_out *o, uint64_t id, const struct odpd_cseg *s)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__SegmentReply sr = ODPD__SEGMENT_REPLY__INIT;

	sr.has_segment = sr.has_addr = sr.has_length = sr.has_file_offset = sr.has_iova_is_addr = 1;
	sr.segment = s->handle;
	sr.addr = s->client_addr;
	sr.length = s->length;
	sr.file_offset = s->file_offset;
	sr.iova_is_addr = (uintptr_t)(s->map->addr + s->file_offset) == s->client_addr;
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_SEGMENT;
	reply.segment = &sr;
	odpd_out_reply(o, &reply, -1);
}

/* The live registrar of the client's private PD on device @i (implicit
 * ODP), or NULL. A dead one's MRs reach nothing: no attach waits for it. */
static struct odpd_registrar *client_registrar(const struct odpd_caller *c, unsigned i)
{
	struct odpd_registrar *g;

	if (c->holder->spd || !c->holder->domains[i])
		return NULL;
	g = c->holder->domains[i]->registrar;
	return g && !odpd_registrar_dead(g) ? g : NULL;
}

static unsigned client_registrars(const struct odpd_caller *c)
{
	unsigned n = 0;

	for (unsigned i = 0; i < c->m->devices.n; i++)
		n += client_registrar(c, i) != NULL;
	return n;
}

void odpd_cseg_drop(struct odpd_manager *m, struct odpd_holder *h, struct odpd_csegs *segs, struct odpd_cseg *s)
{
	struct odpd_account *a = h->acct;

	odpd_journal_segment_gone(h->id, s->handle);
	LIST_REMOVE(s, link);
	segs->n--;
	odpd_account_hold(a, ODPD_UL_SEGMENTS, -1);
	odpd_account_hold(a, ODPD_UL_MAPPED, -(int64_t)s->charged);
	odpd_account_hold(a, ODPD_UL_MAPPINGS, -ODPD_SEGMENT_MAPPINGS);
	odpd_mapping_put(&m->segs, s->map);
	free(s);
}

static void cseg_drop(const struct odpd_caller *k, struct odpd_cseg *s)
{
	odpd_cseg_drop(k->m, k->holder, k->segs, s);
}

/*
 * A client with implicit ODP MRs: a new segment is mapped in its
 * registrars before the attach is answered, so that the client never
 * learns of a segment its implicit MRs cannot reach. Where one cannot map
 * it (its address is taken there), the attach fails.
 */
struct attach_wait {
	struct odpd_caller k;
	struct odpd_cseg *s;
	unsigned pending, n;
	int rc;
	struct odpd_err err;
	struct {
		struct odpd_registrar *g;
		bool ok;
	} regs[];
};

static void attach_mapped_one(struct attach_wait *w, unsigned i, int rc, const struct odpd_err *err)
{
	/* A registrar that died meanwhile: its MRs reach nothing any more,
	 * and the next implicit request replaces it (mr.c). */
	if (rc < 0 && rc != -EPIPE && w->rc == 0) {
		w->rc = rc;
		w->err = *err;
	}
	w->regs[i].ok = rc == 0;
}

static void attach_finish(struct attach_wait *w)
{
	struct odpd_out o = { 0 };

	if (w->rc < 0) {
		for (unsigned i = 0; i < w->n; i++)
			if (w->regs[i].ok)
				odpd_registrar_unmap(w->regs[i].g, w->s->handle);
		cseg_drop(&w->k, w->s);
		odpd_out_err(&o, &w->k, &w->err);
	} else {
		reply_segment(&o, w->k.id, w->s);
	}
	odpd_complete(&w->k, &o);
	free(w);
}

/* Callbacks carry the index in their argument: an array of pointers into w. */
struct attach_arg {
	struct attach_wait *w;
	unsigned i;
};

static void attach_mapped(void *arg, int rc, const struct odpd_err *err)
{
	struct attach_arg *a = arg;
	struct attach_wait *w = a->w;

	attach_mapped_one(w, a->i, rc, err);
	free(a);
	if (--w->pending == 0)
		attach_finish(w);
}

/* 1: the answer comes later (attach_finish, maybe before this returns);
 * 0: nothing to wait for. */
static int attach_registrars(const struct odpd_caller *c, struct odpd_cseg *s)
{
	unsigned n = client_registrars(c), j = 0;
	struct attach_wait *w;

	if (n == 0)
		return 0;
	w = calloc(1, sizeof(*w) + n * sizeof(w->regs[0]));
	if (!w)
		return -ENOMEM;
	w->k = *c;
	w->k.pidfd = -1;
	w->k.groups = NULL;
	w->k.n_groups = 0;
	w->s = s;
	w->n = n;
	w->pending = 1;                      /* until every map is sent */
	for (unsigned d = 0; d < c->m->devices.n; d++) {
		struct odpd_registrar *g = client_registrar(c, d);
		unsigned i = j;
		struct attach_arg *a;
		int rc;

		if (!g)
			continue;
		j++;
		a = malloc(sizeof(*a));
		rc = a ? 0 : -ENOMEM;
		w->regs[i].g = g;
		if (a) {
			a->w = w;
			a->i = i;
			rc = odpd_registrar_map(g, s->handle, s->map->fd, s->client_addr, s->length,
						s->file_offset, s->writable, attach_mapped, a);
		}
		if (rc < 0) {
			struct odpd_err err = { 0 };

			free(a);
			err_set(&err, -rc, "mapping the segment in the implicit-ODP registrar: %s",
				strerror(-rc));
			attach_mapped_one(w, i, rc, &err);
			continue;
		}
		w->pending++;
	}
	if (--w->pending == 0)
		attach_finish(w);
	return 1;
}

int odpd_attach_segment(const struct odpd_caller *c, const Odpd__AttachSegment *req, int fd, struct odpd_out *o)
{
	struct odpd_manager *m = c->m;
	struct odpd_err err = { 0 };
	struct odpd_seginfo info;
	struct odpd_mapping *map;
	struct odpd_cseg *s, *other;
	uint64_t off = 0, len = 0, charge;
	uintptr_t want = 0;

	if (c->segs->n >= m->cfg.max_segments) {
		err_set(&err, EMFILE, "a client may attach at most %u segments", m->cfg.max_segments);
		goto fail;
	}
	if (odpd_fd_short(m->nofile, fd, true)) {
		err_set(&err, EMFILE, "odpd is short of file descriptors (fd %d of a limit of %llu); "
			"try again later", fd, (unsigned long long)m->nofile);
		goto fail;
	}
	if (odpd_segment_validate(fd, m->cfg.max_segment_size, &info, &err) < 0 ||
	    attach_check(c, req, &info, &off, &len, &want, &err) < 0)
		goto fail;
	/* Per user: its segments, and the address space they take in odpd
	 * (the whole file, page rounded: a sparse segment costs its size). */
	charge = info.map_len;                   /* what the kernel maps, and odpd_mapping unmaps */
	if (odpd_account_may(c->holder->acct, &c->holder->limit, ODPD_UL_SEGMENTS, 1, &err) < 0 ||
	    odpd_account_may(c->holder->acct, &c->holder->limit, ODPD_UL_MAPPED, charge, &err) < 0 ||
	    odpd_account_may(c->holder->acct, &c->holder->limit, ODPD_UL_MAPPINGS, ODPD_SEGMENT_MAPPINGS,
			     &err) < 0)
		goto fail;
	s = calloc(1, sizeof(*s));
	if (!s) {
		err_set(&err, ENOMEM, "out of memory");
		goto fail;
	}
	if (odpd_mapping_get(&m->segs, fd, &info, want, &map, &err) < 0) {
		free(s);
		odpd_out_err(o, c, &err);        /* fd consumed */
		return ODPD_DONE;
	}
	s->map = map;
	s->charged = charge;
	odpd_account_hold(c->holder->acct, ODPD_UL_SEGMENTS, 1);
	odpd_account_hold(c->holder->acct, ODPD_UL_MAPPED, (int64_t)charge);
	odpd_account_hold(c->holder->acct, ODPD_UL_MAPPINGS, ODPD_SEGMENT_MAPPINGS);
	s->file_offset = off;
	s->length = len;
	s->client_addr = req->client_addr ? req->client_addr : (uintptr_t)map->addr;
	s->writable = info.writable && map->writable;
	other = cseg_overlapping(c, s->client_addr, s->length);
	if (other) {
		err_set(&err, EEXIST, "[%#" PRIx64 ", +%" PRIu64 ") overlaps your segment %" PRIu64,
			s->client_addr, s->length, other->handle);
		odpd_account_hold(c->holder->acct, ODPD_UL_SEGMENTS, -1);
		odpd_account_hold(c->holder->acct, ODPD_UL_MAPPED, -(int64_t)charge);
		odpd_account_hold(c->holder->acct, ODPD_UL_MAPPINGS, -ODPD_SEGMENT_MAPPINGS);
		odpd_mapping_put(&m->segs, map);
		free(s);
		odpd_out_err(o, c, &err);
		return ODPD_DONE;
	}
	s->handle = ++c->segs->next_handle;
	LIST_INSERT_HEAD(&c->segs->list, s, link);
	c->segs->n++;
	odpd_journal_segment(c->holder->id, s);
	log_debug(CALLER_FMT ": segment %" PRIu64 " at %#" PRIx64 " (+%" PRIu64 "), odpd %p",
		  CALLER_ARGS(c), s->handle, s->client_addr, s->length,
		  (void *)(s->map->addr + s->file_offset));
	switch (attach_registrars(c, s)) {
	case 0:
		reply_segment(o, c->id, s);
		return ODPD_DONE;
	case 1:
		return ODPD_PENDING;
	default:
		cseg_drop(c, s);
		odpd_out_error(o, c, ENOMEM, "out of memory");
		return ODPD_DONE;
	}
fail:
	close(fd);
	odpd_out_err(o, c, &err);
	return ODPD_DONE;
}

struct odpd_cseg *odpd_attach_restore(struct odpd_csegs *segs, struct odpd_holder *h, struct odpd_mapping *map,
				      uint64_t handle, uint64_t client_addr, uint64_t file_offset, uint64_t length,
				      bool writable, uint64_t charged)
{
	struct odpd_cseg *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	odpd_mapping_ref(map);
	s->map = map;
	s->handle = handle;
	s->client_addr = client_addr;
	s->file_offset = file_offset;
	s->length = length;
	s->writable = writable && map->writable;
	s->charged = charged;
	odpd_account_hold(h->acct, ODPD_UL_SEGMENTS, 1);
	odpd_account_hold(h->acct, ODPD_UL_MAPPED, (int64_t)charged);
	odpd_account_hold(h->acct, ODPD_UL_MAPPINGS, ODPD_SEGMENT_MAPPINGS);
	LIST_INSERT_HEAD(&segs->list, s, link);
	segs->n++;
	return s;
}

/* The client's segment @handle; else NULL, and @o has ENOENT. */
static struct odpd_cseg *cseg_find(const struct odpd_caller *c, struct odpd_out *o, uint64_t handle)
{
	struct odpd_cseg *s;

	LIST_FOREACH(s, &c->segs->list, link)
		if (s->handle == handle)
			return s;
	odpd_out_error(o, c, ENOENT, "no such segment");
	return NULL;
}

/*
 * The client's references over @s, counted again: s->n_mrs counts what
 * it registered and released itself, but the registry also drops
 * references on its own - a hit-table reference its library kept unused,
 * revoked by the hit timer or a flush - without telling the client layer.
 */
static unsigned cseg_refs(const struct odpd_caller *c, const struct odpd_cseg *s)
{
	const struct odpd_ref *ref;
	unsigned n = 0;

	LIST_FOREACH(ref, &c->holder->refs, hlink)
		n += ref->cookie == s;
	return n;
}

int odpd_detach_segment(const struct odpd_caller *c, const Odpd__DetachSegment *req, struct odpd_out *o)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	struct odpd_cseg *s = cseg_find(c, o, req->segment);

	if (!s)
		return ODPD_DONE;
	if (s->n_mrs && (s->n_mrs = cseg_refs(c, s)) > 0) {
		odpd_out_error(o, c, EBUSY, "MRs over the segment are still registered");
		return ODPD_DONE;
	}
	for (unsigned i = 0; i < c->m->devices.n; i++)
		if (client_registrar(c, i))
			odpd_registrar_unmap(client_registrar(c, i), s->handle);
	cseg_drop(c, s);
	reply.has_id = reply.has_status = 1;
	reply.id = c->id;
	odpd_out_reply(o, &reply, -1);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- MapSegment */

struct map_op {
	struct odpd_job job;
	struct odpd_caller k;
	struct odpd_mapping *map;           /* the client's segment holds it */
	uint64_t start, length;             /* file offsets, whole pages */
	int rc;                             /* errno of madvise */
};

static void map_run(struct odpd_job *job)
{
	struct map_op *op = (struct map_op *)job;

	/* Resident pages, as the client says: read faults map them, writable
	 * (shmem needs no write notification), without allocating. */
	op->rc = odpd_registry_map_ahead(&op->k.m->registry, op->map, op->start, op->length);
}

static void map_done(struct odpd_job *job)
{
	struct map_op *op = (struct map_op *)job;
	struct odpd_out o = { 0 };
	Odpd__Reply reply = ODPD__REPLY__INIT;
	char msg[160];

	if (!odpd_caller_connected(&op->k)) {
		/* gone: its answer would be dropped */
	} else if (op->rc && op->rc != EINVAL) {     /* EINVAL: a kernel before 5.14 */
		snprintf(msg, sizeof(msg), "mapping odpd's view of the range: madvise(MADV_POPULATE_READ): %s",
			 strerror(op->rc));
		odpd_out_error(&o, &op->k, op->rc, msg);
	} else {
		reply.has_id = reply.has_status = 1;
		reply.id = op->k.id;
		odpd_out_reply(&o, &reply, -1);
	}
	odpd_complete(&op->k, &o);
	free(op);
}

int odpd_map_segment(const struct odpd_caller *c, const Odpd__MapSegment *req, struct odpd_out *o)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), off, len, start, end;
	struct odpd_cseg *s = cseg_find(c, o, req->segment);
	struct map_op *op;

	if (!s)
		return ODPD_DONE;
	off = req->has_offset ? req->offset : 0;
	len = req->has_length && req->length ? req->length : s->length - (off < s->length ? off : s->length);
	if (off >= s->length || len == 0 || len > s->length - off) {
		odpd_out_error(o, c, EINVAL, "MapSegment: the range is not inside the segment");
		return ODPD_DONE;
	}
	/* file offsets, pages rounded out (the segment lies within the mapping) */
	start = (s->file_offset + off) / page * page;
	end = (s->file_offset + off + len + page - 1) / page * page;
	if (end > s->map->size)
		end = s->map->size;
	op = calloc(1, sizeof(*op));
	if (!op) {
		odpd_out_error(o, c, ENOMEM, "out of memory");
		return ODPD_DONE;
	}
	op->k = *c;
	op->k.pidfd = -1;
	op->k.groups = NULL;
	op->k.n_groups = 0;
	op->map = s->map;
	op->start = start;
	op->length = end - start;
	op->job.run = map_run;
	op->job.done = map_done;
	op->job.lane = ODPD_LANE_USER(c->uid);
	op->job.big = op->length >= (16u << 20);
	odpd_pool_submit(c->m->pool, &op->job);
	return ODPD_PENDING;
}
