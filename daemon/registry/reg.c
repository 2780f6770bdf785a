/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "stages.h"
#include "odpd.pb-c.h"
#include "implicit.h"
#include "verify.h"
#include "advise.h"
#include "batch.h"
#include "cctx.h"
#include "charge.h"
#include "holder.h"
#include "lookup.h"
#include "mrlife.h"
#include "pds.h"
#include "reg.h"
#include "relaxed.h"
#include "witness.h"
#include "internal.h"
#include "keep.h"

static int reg_start(struct reg_op *op, struct odpd_ref **ret_ref, struct odpd_err *err);
static void reg_pin_locked(struct reg_op *op, struct ibv_pd *pd);
static int reg_hit(struct reg_op *op, struct odpd_mr *mr, struct odpd_ref **ret_ref, struct odpd_err *err);

static int access_to_ibv(uint32_t a)
{
	return (a & ODPD__ACCESS__ACCESS_LOCAL_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

/* ---------------------------------------------------------------- registration */

struct reg_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_holder *h;
	struct odpd_reg_req q;
	odpd_reg_cb cb;
	void *arg;
	struct odpd_mr *mr;
	bool evicted;
	void *daemon_addr;
	int ibv_access;
	struct reg_op *next_joiner;         /* waiting for the same REGISTERING MR */
	struct odpd_client_ctx *cctx;       /* client-PD mode: a reference, until the MR takes it */
	int prefetch_rc;                    /* REG_PREFETCH: ibv_advise_mr's result (errno) */
	bool witness_seen;                  /* every witness page of the range was mapped */
	bool resident_seen;                 /* every page of the range was in the page cache */
	uint32_t implicit_handle;           /* the registrar's implicit MR, to import */
	struct odpd_err err;
	int rc;
};

/* A zeroed request state: the one the last registration left, else
 * calloc's. The loop thread, as every op's end. */
static struct reg_op *op_new(struct odpd_registry *r)
{
	struct reg_op *op = odpd_spare_take(&r->spare_op);

	if (!op)
		return calloc(1, sizeof(*op));
	memset(op, 0, sizeof(*op));
	return op;
}

/* @op ended: kept for op_new, or freed. */
static void op_free(struct reg_op *op)
{
	if (!odpd_spare_keep(&op->r->spare_op, op))
		free(op);
}


static int reg_import(struct reg_op *op)
{
	struct odpd_mr *mr = op->mr;
	int r;

	r = odpd_client_ctx_import(mr->imp->cctx, &op->err);
	if (r < 0)
		return r;
	mr->imp->pd = ibv_import_pd(mr->imp->cctx->ctx, op->q.pd_handle);
	if (!mr->imp->pd)
		return err_set(&op->err, errno, "ibv_import_pd(%u): %s", op->q.pd_handle, strerror(errno));
	return 0;
}

/* REG_PREFETCH: map the whole ODP MR now, writable if it may be written, in
 * calls of up to 1 GiB (ibv_sge.length has 32 bits). 0 or the verb's errno. */
static int prefetch_whole(struct ibv_pd *pd, const struct odpd_mr *mr)
{
	const uint64_t chunk = 1ull << 30;
	enum ibv_advise_mr_advice advice = mr->access & ODPD__ACCESS__ACCESS_LOCAL_WRITE ?
		IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE : IBV_ADVISE_MR_ADVICE_PREFETCH;

	for (uint64_t off = 0; off < odpd_mr_length(mr); off += chunk) {
		struct ibv_sge sge = {
			.addr = mr->iova + off, .lkey = mr->mr->lkey,
			.length = (uint32_t)(odpd_mr_length(mr) - off < chunk ? odpd_mr_length(mr) - off : chunk),
		};
		int rc = ibv_advise_mr(pd, advice, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);

		if (rc)
			return rc;
	}
	return 0;
}

static void reg_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;
	struct ibv_pd *pd;

	if (mr_cctx(mr)) {                     /* client-PD mode */
		op->rc = reg_import(op);
		if (op->rc < 0)
			return;
		pd = mr->imp->pd;
	} else {
		pthread_mutex_lock(&mr->dom->lock);
		op->rc = odpd_domain_open_locked(mr->dom, &op->err);
		pthread_mutex_unlock(&mr->dom->lock);
		if (op->rc < 0)
			return;
		pd = mr->dom->pd;
	}
	if (!mr->pinned) {
		/* ODP: nothing to fault or witness; the device pages on demand,
		 * following whatever pages the segment has then. iova is odpd's
		 * own address (checked by the caller). */
		uint32_t slot = mr_cctx(mr) ? 0 : keep_limbo_enter(mr->dom, ODPD_LIMBO_PENDING);

		mr->mr = ibv_reg_mr(pd, op->daemon_addr, odpd_mr_length(mr), op->ibv_access);
		if (!mr->mr) {
			op->rc = err_set(&op->err, errno, "ibv_reg_mr (ODP) on %s: %s", op->q.dev->name,
					 strerror(errno));
			keep_limbo_leave(slot);
			return;
		}
		keep_limbo_set(slot, mr->dom, mr->mr->handle);
		mr->limbo = slot;
		if (op->q.prefetch)
			op->prefetch_rc = prefetch_whole(pd, mr);
		return;
	}
	/*
	 * Map odpd's view of the range first with read faults: they map
	 * neighbouring pages too (fault-around), and as shmem needs no write
	 * notification they map them writable, so the pin faults nothing. A pin
	 * that faults writes page by page took 207 ms for 256 MiB in the VM,
	 * this 58 + 18 ms; and write faults would move the segment's ctime.
	 * Mapped already (MapSegment, an earlier MR there): one PAGEMAP_SCAN
	 * walk finds that faster than populating walks the pages again.
	 */
	if (!mapped_already(op->r, op->daemon_addr, odpd_mr_length(mr)))
		madvise(op->daemon_addr, odpd_mr_length(mr), MADV_POPULATE_READ);
	/* Witness, then pin, as one step among the segment's registrations. */
	pthread_mutex_lock(&mr->map->witness_lock);
	witness_begin(op->r, mr);
	reg_pin_locked(op, pd);
}

/*
 * The pin of a pinned MR, witness_lock held (released here) and its
 * witness begun: the verb. A worker, or the loop (reg_on_loop).
 */
static void reg_pin_locked(struct reg_op *op, struct ibv_pd *pd)
{
	struct odpd_mr *mr = op->mr;
	/* before the verb: a crash inside it may leave the MR made (keep.h) */
	uint32_t slot = mr_cctx(mr) ? 0 : keep_limbo_enter(mr->dom, ODPD_LIMBO_PENDING);
	int e;

	odpd_stage(ODPD_STAGE_CHECK);
	if ((uintptr_t)op->daemon_addr == mr->iova)
		mr->mr = ibv_reg_mr(pd, op->daemon_addr, odpd_mr_length(mr), op->ibv_access);
	else
		mr->mr = ibv_reg_mr_iova(pd, op->daemon_addr, odpd_mr_length(mr), mr->iova, op->ibv_access);
	e = errno;                           /* the verb's, before anything else can set it */
	odpd_stage(ODPD_STAGE_VERB);
	/* ODPD_TEST_REG_DELAY_MS: the MR made, its handle not yet in the
	 * limbo, as when a crash comes inside the verb */
	if (mr->mr && op->r->test_reg_delay_ms)
		nanosleep(&(struct timespec){ op->r->test_reg_delay_ms / 1000,
					      (long)(op->r->test_reg_delay_ms % 1000) * 1000000L }, NULL);
	if (!mr->mr) {
		mr->witnessed = false;           /* (witness_end) nothing relies on those pages */
		keep_limbo_leave(slot);
	} else {
		keep_limbo_set(slot, mr->dom, mr->mr->handle);
		mr->limbo = slot;
	}
	pthread_mutex_unlock(&mr->map->witness_lock);
	if (!mr->mr)
		op->rc = err_set(&op->err, e, "ibv_reg_mr%s on %s: %s%s",
				 (uintptr_t)op->daemon_addr == mr->iova ? "" : "_iova", op->q.dev->name,
				 strerror(e), e == ENOMEM ? " (the kernel could not pin the pages: the host, "
				 "or odpd's memory cgroup, is short of memory; not an odpd.conf limit)" : "");
}

static int reg_hit(struct reg_op *op, struct odpd_mr *mr, struct odpd_ref **ret_ref, struct odpd_err *err);

/* The requests that waited for an MR being registered: served by @mr, or,
 * when its registration failed (@mr NULL), asked again from the start. */
static void joiners_answer(struct reg_op *list, struct odpd_mr *mr)
{
	for (struct reg_op *op = list, *next; op; op = next) {
		struct odpd_err err = { 0 };
		struct odpd_ref *ref = NULL;
		int rc;

		next = op->next_joiner;
		rc = mr ? reg_hit(op, mr, &ref, &err) : reg_start(op, &ref, &err);
		if (rc == 1)
			continue;                   /* it waits again */
		op->cb(op->arg, rc == ODPD_REG_MADE ? 0 : rc, &err, ref, rc == 0);
		op_free(op);
	}
}

/*
 * The registration of @op's MR has run: the MR goes LIVE and @op's holder
 * gets its reference in *@ret_ref (0), or everything made for it goes
 * (the errno, op->err saying why). The requests that waited for it are
 * answered either way. The loop thread.
 */
static int reg_finish(struct reg_op *op, struct odpd_ref **ret_ref)
{
	struct odpd_registry *r = op->r;
	struct odpd_mr *mr = op->mr;
	struct reg_op *joiners = mr->joiners;
	struct odpd_ref *ref = NULL;

	mr->joiners = NULL;
	/* The device went away meanwhile: whatever the verb said, it is gone. */
	if (op->q.dev->removed) {
		char was[sizeof(op->err.msg)];

		snprintf(was, sizeof(was), "%s", op->rc < 0 ? op->err.msg : "");
		op->rc = err_set(&op->err, ENODEV, "device %s was removed%s%s", op->q.dev->name,
				 *was ? ": " : "", was);
	}
	/* Checked again here: other requests of the user may have taken its
	 * last MR references while this one was on a worker. */
	if (op->rc == 0 &&
	    odpd_account_may(op->h->acct, &op->h->limit, ODPD_UL_MRS, 1, &op->err) == 0) {
		ref = ref_new(op->r, op->h, mr, &op->q);
		if (!ref)
			op->rc = err_set(&op->err, ENOMEM, "out of memory");
	} else if (op->rc == 0) {
		op->rc = -op->err.code;
	}
	if (op->rc < 0) {
		/* Registered but no memory for the reference: deregister on a
		 * worker. Never registered: nothing for a worker to do. */
		if (mr->mr) {
			struct odpd_mr *list = NULL;
			mr_invalidate(r, mr, &list);
			start_batch(r, list, false, NULL);
		} else {
			struct odpd_client_ctx *cctx = mr_cctx(mr);

			if (cctx) {
				mr->imp->cctx = NULL;    /* its reference, dropped below */
				import_drop(&mr->imp);
				cctx_drop(r, op->h, cctx);
			}
			mr_unindex(mr);
			mr_dead(r, mr);          /* freed: nobody holds it */
		}
		joiners_answer(joiners, NULL);
		return op->rc;
	}
	mr_set_state(mr, ODPD_MR_LIVE);
	charge_find(mr, op->h->acct)->refs++;
	r->stats.registrations++;
	r->stats.registered_bytes += odpd_mr_length(mr);
	r->stats.reg_sizes[odpd_reg_size_bucket(odpd_mr_length(mr))]++;
	if (!mr->pinned)
		r->odp.registrations++;
	if (op->q.prefetch) {
		prefetch_count(r, op->q.dev, op->prefetch_rc, odpd_mr_length(mr));
		/* an errno (Linux's are below 256); anything else says EIO */
		mr->prefetch_errno = op->prefetch_rc > 0 && op->prefetch_rc < 256 ?
				     (uint8_t)op->prefetch_rc : op->prefetch_rc ? EIO : 0;
	}
	log_debug("registry: MR %" PRIu64 " [%#" PRIx64 ", +%" PRIu64 ") lkey %#x rkey %#x",
		  mr->node.seq, mr->iova, odpd_mr_length(mr), mr->mr->lkey, mr->mr->rkey);
	*ret_ref = ref;
	joiners_answer(joiners, mr);
	return 0;
}

static void reg_done(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_ref *ref = NULL;
	int rc = reg_finish(op, &ref);

	op->cb(op->arg, rc, rc < 0 ? &op->err : NULL, ref, false);
	op_free(op);
}

/*
 * A small pinned registration of resident pages is made here, on the loop:
 * the pin is then a few microseconds of kernel time, less than handing the
 * request to a worker and its answer back (two thread wake-ups;
 * doc/design.md, "The request path"). Only when nothing can make the loop
 * wait: the PD is open, no worker holds the segment's witness lock (a big
 * pin in the same segment), and every page of the range is resident: its
 * witness pages are mapped (a page reclaimed or punched out is unmapped
 * from every view), which is also all that witness_begin would look at, or
 * else the page cache has them all (mincore), and the witness maps them
 * without I/O. Where odpd's own view lacks a page, the pin's fault is a
 * minor one.
 * True when it ran (op->rc says how), false for a worker.
 */
static bool reg_on_loop(struct reg_op *op)
{
	struct odpd_mr *mr = op->mr;
	struct odpd_mapping *map = mr->map;
	uint64_t len = odpd_mr_length(mr);
	struct ibv_pd *pd;

	if (!mr->pinned || mr_cctx(mr) || len > ODPD_LOOP_REG_MAX || op->q.dev->removed || !map->witness)
		return false;
	if (pthread_mutex_trylock(&mr->dom->lock) != 0)
		return false;
	pd = mr->dom->pd;
	pthread_mutex_unlock(&mr->dom->lock);
	if (!pd || pthread_mutex_trylock(&map->witness_lock) != 0)
		return false;
	odpd_stage(ODPD_STAGE_WORK);
	if (op->witness_seen || mapped_now(op->r, map->witness + mr->node.start, len)) {
		witness_begin_present(mr);
	} else if (op->resident_seen || cached_now(map->addr + mr->node.start, len)) {
		/* resident, never witnessed: the witness pages are mapped here,
		 * from the page cache (no I/O, nothing allocated) */
		witness_begin(op->r, mr);
	} else {
		pthread_mutex_unlock(&map->witness_lock);
		return false;
	}
	reg_pin_locked(op, pd);
	if (mr->mr)
		op->r->stats.loop_registrations++;
	return true;
}

/* Relaxed MRs were invalidated to make room: try once more. */
static void reg_retry(void *arg, unsigned mrs, uint64_t bytes)
{
	struct reg_op *op = arg;
	struct odpd_ref *ref = NULL;
	struct odpd_err err = { 0 };
	int rc;

	(void)mrs;
	(void)bytes;
	op->evicted = true;
	rc = reg_start(op, &ref, &err);
	if (rc == 1)
		return;
	cctx_drop(op->r, op->h, op->cctx);
	op->cb(op->arg, rc == ODPD_REG_MADE ? 0 : rc, &err, ref, rc == 0);
	op_free(op);
}

/* Invalidate @evict (relaxed MRs in the way of a quota), then try @op once
 * more. Returns 1 (the answer comes through op->cb), or -ENOMEM. */
static int evict_then_retry(struct reg_op *op, struct odpd_mr *evict, struct odpd_err *err)
{
	struct odpd_waiter *w = calloc(1, sizeof(*w));

	for (struct odpd_mr *mr = evict; mr; mr = mr->batch_next) {
		op->r->stats.evictions++;          /* MRs invalidated to make room */
		op->r->stats.inv_eviction++;
	}
	if (w) {
		w->cb = reg_retry;
		w->arg = op;
	}
	start_batch(op->r, evict, true, w);
	return w ? 1 : err_set(err, ENOMEM, "out of memory");
}

/* A hit: @h takes a reference on @mr. */
static int reg_hit(struct reg_op *op, struct odpd_mr *mr, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_holder *h = op->h;
	struct odpd_charge *c = charge_find(mr, h->acct), *relaxed_charge = NULL;
	struct odpd_mr *evict = NULL;
	bool new_charge = false;
	int rc;

	rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MRS, 1, err);   /* also for joiners */
	if (rc < 0)
		return rc;
	if (!c) {
		rc = quota_check(r, h, mr->map, mr->node.start, mr->node.end, mr->pinned, false,
				 !op->evicted, &evict, err);
		if (rc < 0)
			return rc;
		if (evict)                     /* (never @mr: not charged to this account) */
			return evict_then_retry(op, evict, err);
		if (mr->state == ODPD_MR_RELAXED)
			relaxed_charge = odpd_mr_first_charge(mr);  /* the last holder's, refs 0 */
		rc = charge_add(r, mr, h->acct, &c);
		if (rc < 0)
			return err_set(err, ENOMEM, "out of memory");
		new_charge = true;
	}
	*ret_ref = ref_new(r, h, mr, &op->q);
	if (!*ret_ref) {
		if (new_charge)
			charge_drop(r, mr, c);
		return err_set(err, ENOMEM, "out of memory");
	}
	c->refs++;
	if (mr->state == ODPD_MR_RELAXED) {
		relaxed_remove(r, mr);
		mr_set_state(mr, ODPD_MR_LIVE);
		if (relaxed_charge && relaxed_charge->refs == 0)
			charge_drop(r, mr, relaxed_charge);
		relaxed_arm(r);
	}
	r->stats.hits++;
	return 0;
}

static struct odpd_mr *mr_new(struct odpd_registry *r, struct reg_op *op, struct odpd_domain *d,
			      uint64_t s, uint64_t e)
{
	struct odpd_mr *mr = odpd_slab_zalloc(&r->mr_slab);

	if (!mr)
		return NULL;
	mr->node.seq = ++r->next_mr_id;        /* its id, and its place among equal starts */
	mr->dom = d;
	mr->map = op->q.map;                 /* NULL: implicit */
	mr->node.start = s;
	mr->node.end = e;
	mr->iova = op->q.iova - op->q.offset + s;
	mr->access = op->q.access;
	mr->pinned = !op->q.odp && !op->q.implicit;
	mr->implicit = op->q.implicit;
	if (mr->implicit) {
		r->odp.mrs++;
		r->odp.implicit_mrs++;
	} else if (!mr->pinned) {
		r->odp.mrs++;
		r->odp.bytes += odpd_mr_length(mr);
	}
	mr->state = ODPD_MR_REGISTERING;       /* its birth: the one state not reached by a transition */
	mr->owner_id = op->h->id;
	LIST_INIT(&mr->holders);
	return mr;
}

/*
 * REG_UNPOPULATED: the client did not fault [@s, @e) in, to save itself a
 * system call. Resident (its witness pages mapped, which is also what
 * reg_on_loop looks at, or else every page in the page cache): go on. Not:
 * ENODATA, and the client faults the range in (its memory cgroup pays, not
 * odpd's) and asks again without the flag.
 */
static int check_resident(struct reg_op *op, uint64_t s, uint64_t e, struct odpd_err *err)
{
	struct odpd_mapping *map = op->q.map;

	if (map->witness && mapped_now(op->r, map->witness + s, e - s)) {
		op->witness_seen = true;
		return 0;
	}
	if (cached_now(map->addr + s, e - s)) {
		op->resident_seen = true;
		return 0;
	}
	return err_set(err, ENODATA, "pages of [%#" PRIx64 ", +%" PRIu64 ") are not resident: fault the "
		       "range in and register it again without REG_UNPOPULATED", op->q.iova, op->q.length);
}

static int reg_miss(struct reg_op *op, struct odpd_domain *d, uint64_t s, uint64_t e, struct odpd_ref **ret_ref,
		    struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_mr *mr, *evict = NULL;
	struct odpd_import *imp = NULL;
	struct odpd_charge *c;
	int rc;

	odpd_stage(ODPD_STAGE_WORK);
	if (op->q.unpopulated && (rc = check_resident(op, s, e, err)) < 0)
		return rc;
	odpd_stage(ODPD_STAGE_CHECK);

	rc = quota_check(r, op->h, op->q.map, s, e, !op->q.odp, true, !op->evicted, &evict, err);
	if (rc < 0)
		return rc;
	if (evict)
		return evict_then_retry(op, evict, err);
	/* Client-PD mode: the import's place (few MRs need one: it is not in
	 * the MR), with the context set here, where device removal reads it. */
	if (op->cctx && !(imp = calloc(1, sizeof(*imp))))
		return err_set(err, ENOMEM, "out of memory");
	mr = mr_new(r, op, d, s, e);
	if (!mr) {
		free(imp);
		return err_set(err, ENOMEM, "out of memory");
	}
	/* In its mapping's tree from now on, in the cache unless no-cache: a
	 * request for it meanwhile waits for it. */
	map_insert(mr);
	mr->cached = d && !op->q.no_cache;
	/* Reserve the quota now, so that requests in flight cannot overbook it. */
	global_charge(r, mr);
	if (charge_add(r, mr, op->h->acct, &c) < 0) {
		global_uncharge(r, mr);
		map_remove(mr);
		if (!mr->pinned) {
			r->odp.mrs--;
			r->odp.bytes -= odpd_mr_length(mr);
		}
		odpd_slab_free(&r->mr_slab, mr);
		free(imp);
		return err_set(err, ENOMEM, "out of memory");
	}
	if (imp) {
		mr->imp = imp;
		imp->cctx = op->cctx;        /* the request's reference is the MR's now */
		op->cctx = NULL;
	}
	odpd_mapping_ref(mr->map);
	r->n_mrs++;
	if (d)
		d->n_mrs++;
	op->mr = mr;
	op->daemon_addr = mr->map->addr + s;
	op->ibv_access = access_to_ibv(op->q.access) | (op->q.odp ? IBV_ACCESS_ON_DEMAND : 0);
	op->job.run = reg_run;
	op->job.done = reg_done;
	/* Pinning 16 MiB and more takes long: it leaves a worker to others. */
	op->job.big = mr->pinned && odpd_mr_length(mr) >= (16u << 20);
	op->job.lane = ODPD_LANE_USER(op->h->uid);
	if (reg_on_loop(op)) {
		rc = reg_finish(op, ret_ref);
		if (rc < 0)
			*err = op->err;
		return rc < 0 ? rc : ODPD_REG_MADE;
	}
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

/*
 * An implicit ODP MR, in three steps: a worker opens the domain's PD (if
 * not yet open); the loop asks the domain's registrar (started by the
 * caller, with the client's segments mapped) to import the PD (once) and
 * register; a worker imports the MR by handle, and from then on it is an
 * MR of the PD like any other, for replies, verify and advise. No worker
 * waits for the registrar: its user may have stopped it (implicit.h).
 */
static void implicit_open_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_domain *d = op->mr->dom;

	pthread_mutex_lock(&d->lock);
	op->rc = odpd_domain_open_locked(d, &op->err);
	pthread_mutex_unlock(&d->lock);
}

static void implicit_import_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;

	mr->mr = ibv_import_mr(mr->dom->pd, op->implicit_handle);
	if (!mr->mr) {
		int e = errno ? errno : EOPNOTSUPP;

		op->rc = err_set(&op->err, e, "ibv_import_mr of the registrar's implicit ODP MR: %s",
				 strerror(e));
	}
}


static void implicit_imported(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;

	/* Not imported: the registrar's MR must not outlive the request. */
	if (!op->mr->mr && odpd_registrar_dereg(op->mr->registrar, op->implicit_handle,
						implicit_dereg_answered, NULL) < 0)
		implicit_dereg_answered(NULL, -EPIPE, NULL, op->implicit_handle);
	reg_done(job);
}

static void implicit_registered(void *arg, int rc, const struct odpd_err *err, uint32_t handle)
{
	struct reg_op *op = arg;

	if (rc < 0) {
		op->rc = rc;
		op->err = *err;
		reg_done(&op->job);
		return;
	}
	op->implicit_handle = handle;
	op->job.run = implicit_import_run;
	op->job.done = implicit_imported;
	odpd_pool_submit(op->r->pool, &op->job);
}

static void implicit_opened(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;
	struct odpd_domain *d = mr->dom;
	int rc;

	if (op->rc < 0 || op->q.dev->removed) {
		reg_done(job);
		return;
	}
	/* The PD is open (its MR keeps it so): its context's cmd_fd is read
	 * here, after the worker that opened it. */
	rc = odpd_registrar_reg(mr->registrar, d->ctx->cmd_fd, d->pd->handle, (uint32_t)op->ibv_access,
				implicit_registered, op);
	if (rc < 0) {
		op->rc = err_set(&op->err, -rc, "the implicit-ODP registrar (pid %d) %s",
				 (int)odpd_registrar_pid(mr->registrar),
				 rc == -EPIPE ? "has exited" : strerror(-rc));
		reg_done(job);
	}
}

/* An implicit ODP MR: never a cache hit (the client registers it once and
 * keeps it), counted as an ODP MR without bytes, no pages charged. */
static int reg_implicit(struct reg_op *op, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_domain *d = holder_domain(r, op->h, (unsigned)(op->q.dev - r->devices->dev));
	struct odpd_mr *mr, *evict = NULL;
	struct odpd_charge *c;
	int rc;

	if (!d || !d->registrar)
		return err_set(err, d ? EINVAL : ENOMEM, d ? "no implicit-ODP registrar for this PD" :
			       "out of memory");
	op->h->registered = true;
	rc = quota_check(r, op->h, NULL, 0, 0, false, true, !op->evicted, &evict, err);
	if (rc < 0)
		return rc;
	if (evict)
		return evict_then_retry(op, evict, err);
	mr = mr_new(r, op, d, 0, UINT64_MAX);
	if (!mr)
		return err_set(err, ENOMEM, "out of memory");
	if (charge_add(r, mr, op->h->acct, &c) < 0) {
		r->odp.mrs--;
		r->odp.implicit_mrs--;
		odpd_slab_free(&r->mr_slab, mr);
		return err_set(err, ENOMEM, "out of memory");
	}
	mr->iova = 0;
	mr->registrar = d->registrar;        /* read on the loop, kept by the MR */
	odpd_registrar_get(mr->registrar);
	r->n_mrs++;
	d->n_mrs++;
	op->mr = mr;
	op->ibv_access = access_to_ibv(op->q.access);
	op->job.run = implicit_open_run;
	op->job.done = implicit_opened;
	op->job.lane = ODPD_LANE_USER(op->h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

static int reg_start(struct reg_op *op, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	const struct odpd_reg_req *q = &op->q;
	bool client_pd = op->cctx != NULL;
	uint64_t s = q->offset & ~(PAGE - 1);
	uint64_t e = (q->offset + q->length + PAGE - 1) & ~(PAGE - 1);
	struct odpd_domain *d = NULL;
	struct odpd_mr *mr;
	struct lookup l = { .r = r, .h = op->h, .s = s, .e = e, .access = q->access, .odp = q->odp };
	int rc;

	if (q->dev->removed)
		return err_set(err, ENODEV, "device %s was removed", q->dev->name);
	if (q->implicit)
		return reg_implicit(op, err);
	if (e > q->map->size)
		e = q->map->size;
	if (!client_pd) {
		d = holder_domain(r, op->h, (unsigned)(q->dev - r->devices->dev));
		if (!d)
			return err_set(err, ENOMEM, "out of memory");
	}
	op->h->registered = true;
	if (d && !q->no_cache) {
		if (!op->evicted)
			r->stats.lookups++;
		odpd_stage(ODPD_STAGE_WORK);
		mr = cache_lookup(r, d, q, &l);
		odpd_stage(ODPD_STAGE_CHECK);
		if (mr)
			return reg_hit(op, mr, ret_ref, err);
		if (l.registering) {
			/* Served when that MR is registered (reg_done): N processes
			 * of a shared PD asking at once still make one MR. */
			op->next_joiner = l.registering->joiners;
			l.registering->joiners = op;
			return 1;
		}
		if (!op->evicted)
			r->stats.misses++;
	}
	rc = reg_miss(op, d, s, e, ret_ref, err);
	if (rc == -ENODATA) {
		/* REG_UNPOPULATED, not resident: the client asks again, and
		 * that request is the one get (lookup, miss) counted */
		r->stats.gets--;
		if (d && !q->no_cache && !op->evicted) {
			r->stats.lookups--;
			r->stats.misses--;
		}
	}
	return rc;
}

int odpd_registry_reg(struct odpd_registry *r, struct odpd_holder *h, const struct odpd_reg_req *q,
		      odpd_reg_cb cb, void *arg, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct reg_op *op = op_new(r);
	int rc;

	r->stats.gets++;                     /* once per request (not on a retry) */
	if (!op) {
		if (q->cmd_fd >= 0)
			close(q->cmd_fd);
		return err_set(err, ENOMEM, "out of memory");
	}
	op->r = r;
	op->h = h;
	op->q = *q;
	op->cb = cb;
	op->arg = arg;
	if (q->cmd_fd >= 0) {
		op->q.cmd_fd = -1;
		op->q.no_cache = true;           /* client-PD: the client's own PD */
		op->cctx = holder_client_ctx(r, h, q->cmd_fd, err);
		if (!op->cctx) {
			op_free(op);
			return -err->code;
		}
	}
	rc = reg_start(op, ret_ref, err);
	if (rc != 1) {
		cctx_drop(r, h, op->cctx);
		op_free(op);
	}
	return rc;
}
