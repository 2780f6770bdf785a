/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "hotplug.h"
#include "implicit.h"
#include "journal.h"
#include "log.h"
#include "handler.h"
#include "slab.h"

#define ACCESS_KNOWN (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_READ | \
		      ODPD__ACCESS__ACCESS_REMOTE_WRITE | ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)
#define ACCESS_REMOTE (ODPD__ACCESS__ACCESS_REMOTE_READ | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)
#define ACCESS_WRITES (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)

/* Is @fd a uverbs character device of this host? Decided with statx and
 * sysfs only, before any ioctl can reach whatever the fd really is. */
static bool is_uverbs_fd(int fd)
{
	struct statx stx;
	struct dirent *de;
	bool found = false;
	DIR *d;

	if (statx(fd, "", AT_EMPTY_PATH, STATX_TYPE, &stx) < 0 || !S_ISCHR(stx.stx_mode))
		return false;
	d = opendir("/sys/class/infiniband_verbs");
	if (!d)
		return false;
	while (!found && (de = readdir(d))) {
		char path[300];
		unsigned maj, min;
		FILE *f;
		if (strncmp(de->d_name, "uverbs", 6) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband_verbs/%s/dev", de->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		found = fscanf(f, "%u:%u", &maj, &min) == 2 &&
			maj == stx.stx_rdev_major && min == stx.stx_rdev_minor;
		fclose(f);
	}
	closedir(d);
	return found;
}

/* ---------------------------------------------------------------- reg */

static void reply_mr(struct odpd_out *o, uint64_t id, const struct odpd_ref *ref, bool hit)
{
	const struct odpd_mr *e = ref->mr;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__MrReply mr = ODPD__MR_REPLY__INIT;

	mr.has_handle = mr.has_lkey = mr.has_rkey = mr.has_iova = mr.has_length = 1;
	mr.has_kernel_handle = mr.has_access = mr.has_generation = mr.has_cache_hit = 1;
	mr.has_mr_iova = mr.has_mr_length = 1;
	mr.handle = ref->handle;
	mr.lkey = e->mr->lkey;
	mr.rkey = e->mr->rkey;
	mr.iova = ref->iova;
	mr.length = ref->length;
	mr.kernel_handle = e->mr->handle;
	mr.access = e->access;
	mr.generation = odpd_mr_generation(e);
	mr.cache_hit = hit;
	mr.mr_iova = e->iova;
	mr.mr_length = odpd_mr_length(e);
	if (ref->slot) {
		mr.has_slot = mr.has_ticket = 1;
		mr.slot = ref->slot;
		mr.ticket = ref->ticket;
	}
	if (!hit && e->prefetch_errno) {       /* reported, never hidden */
		mr.has_prefetch_errno = 1;
		mr.prefetch_errno = e->prefetch_errno;
	}
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_MR;
	reply.mr = &mr;
	odpd_out_reply(o, &reply, -1);
}

/* A request waiting for the registry: its caller. */
struct pending {
	struct odpd_caller k;
	const struct odpd_device *dev;      /* ImportPd */
	bool flush;                         /* AdviseMr: answer when done */
	bool implicit;                      /* RegMr: an implicit request, a registrar wait */
};

/* The last request's, kept for the next: a registration neither allocates
 * nor frees one (the loop thread, as every request's end). */
static void *spare_pending;

static void pending_free(struct pending *p)
{
	if (!odpd_spare_keep(&spare_pending, p))
		free(p);
}

/* NULL after answering ENOMEM. */
static struct pending *pending_new(const struct odpd_caller *k, struct odpd_out *o)
{
	struct pending *p = odpd_spare_take(&spare_pending);

	if (!p)
		p = malloc(sizeof(*p));
	if (!p) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		return NULL;
	}
	p->k = *k;
	p->k.pidfd = -1;                    /* the handler's only */
	p->k.groups = NULL;
	p->k.n_groups = 0;
	p->dev = NULL;
	p->flush = false;
	p->implicit = false;
	return p;
}

/* The client's reference @handle, or NULL after answering ENOENT. */
static struct odpd_ref *ref_or_reply(const struct odpd_caller *k, struct odpd_out *o, uint64_t handle)
{
	struct odpd_ref *ref = odpd_holder_find_ref(k->holder, handle);

	if (!ref)
		odpd_out_error(o, k, ENOENT, "no such MR");
	return ref;
}

static void reg_accepted(const struct odpd_caller *k, struct odpd_out *o, struct odpd_ref *ref, bool hit)
{
	struct odpd_cseg *s = ref->cookie;

	if (s)                              /* NULL: implicit ODP, in no segment */
		s->n_mrs++;
	log_debug(CALLER_FMT ": MR handle %" PRIu64 " [%#" PRIx64 ", +%" PRIu64 ") %s", CALLER_ARGS(k),
		  ref->handle, ref->iova, ref->length, hit ? "cache hit" : "registered");
	reply_mr(o, k->id, ref, hit);
}

/* An implicit request is answered: it no longer waits for a registrar
 * (implicit_reg took its place among its user's waits). */
static void implicit_end(const struct odpd_caller *k)
{
	odpd_account_hold(k->holder->acct, ODPD_UL_REGISTRAR_WAITS, -1);
}

static void reg_cb(void *arg, int rc, const struct odpd_err *err, struct odpd_ref *ref, bool hit)
{
	struct pending *p = arg;
	struct odpd_out o = { 0 };

	if (rc < 0)
		odpd_out_err(&o, &p->k, err);
	else
		reg_accepted(&p->k, &o, ref, hit);
	if (p->implicit)
		implicit_end(&p->k);
	odpd_complete(&p->k, &o);
	pending_free(p);
}

/* Find the client's segment holding [addr, addr + length). */
static int find_segment(const struct odpd_caller *k, uint64_t addr, uint64_t length,
			struct odpd_cseg **ret, struct odpd_err *err)
{
	struct odpd_cseg *s;

	if (length == 0)
		return err_set(err, EINVAL, "length 0");
	if (addr + length < addr)
		return err_set(err, EINVAL, "address %#" PRIx64 " + length %" PRIu64 " overflows", addr, length);
	LIST_FOREACH(s, &k->segs->list, link) {
		if (addr < s->client_addr || addr - s->client_addr >= s->length)
			continue;
		if (length > s->length - (addr - s->client_addr))
			return err_set(err, EINVAL, "[%#" PRIx64 ", +%" PRIu64 ") runs past the end of "
				       "segment %" PRIu64 " at %#" PRIx64 " (+%" PRIu64 ")", addr, length,
				       s->handle, s->client_addr, s->length);
		*ret = s;
		return 0;
	}
	return err_set(err, EINVAL, "%#" PRIx64 " is in none of your segments: allocate the buffer "
		       "with odpd_alloc() or attach its memfd with odpd_attach()", addr);
}

#define REG_FLAGS_KNOWN ((uint32_t)(ODPD__REG_FLAGS__REG_NO_CACHE | ODPD__REG_FLAGS__REG_PREFETCH | \
				     ODPD__REG_FLAGS__REG_UNPOPULATED))

/* The RC ODP capabilities an MR with @access needs: its pages as the local
 * buffer of sends and RDMA WRITE/READ requests (SEND), as where receives and
 * READ responses land (RECV, with local write), and as the target of remote
 * writes, reads and atomics. */
static uint32_t odp_caps_needed(uint32_t access)
{
	return IBV_ODP_SUPPORT_SEND |
	       (access & ODPD__ACCESS__ACCESS_LOCAL_WRITE ? IBV_ODP_SUPPORT_RECV : 0) |
	       (access & ODPD__ACCESS__ACCESS_REMOTE_WRITE ? IBV_ODP_SUPPORT_WRITE : 0) |
	       (access & ODPD__ACCESS__ACCESS_REMOTE_READ ? IBV_ODP_SUPPORT_READ : 0) |
	       (access & ODPD__ACCESS__ACCESS_REMOTE_ATOMIC ? IBV_ODP_SUPPORT_ATOMIC : 0);
}

/* An explicit ODP MR: the device must page on demand for RC with this
 * access, and its iova must be odpd's own address of the range (rxe: an ODP
 * MR with iova != addr oopses the kernel or writes elsewhere). */
static int odp_check(const struct odpd_device *dev, uint32_t access, const struct odpd_cseg *s,
		     bool client_pd, struct odpd_err *err)
{
	uint32_t missing = odp_caps_needed(access) & ~dev->odp_rc_caps;

	if (client_pd)
		return err_set(err, EOPNOTSUPP, "ODP MRs are registered in odpd's PDs only, not in "
			       "client-PD mode (the MR would page in odpd's address space)");
	if (!dev->odp)
		return err_set(err, EOPNOTSUPP, "device %s has no on-demand paging (IBV_ODP_SUPPORT "
			       "is not in its general ODP caps %#" PRIx64 "): register pinned",
			       dev->name, dev->odp_general_caps);
	if (missing)
		return err_set(err, EOPNOTSUPP, "device %s cannot page on demand for RC with this "
			       "access: missing RC ODP caps %#x (of %#x needed: SEND=1 RECV=2 WRITE=4 "
			       "READ=8 ATOMIC=16)", dev->name, missing, odp_caps_needed(access));
	if ((uintptr_t)(s->map->addr + s->file_offset) != s->client_addr)
		return err_set(err, EINVAL, "an ODP MR needs odpd's mapping of the segment at your "
			       "address (iova = address), and odpd mapped segment %" PRIu64 " elsewhere: "
			       "use odpd_alloc(), or odpd_attach() with addr NULL", s->handle);
	return 0;
}

/*
 * Implicit ODP (addr 0, length SIZE_MAX) covers the whole address space of
 * the process that registers it, so odpd makes it only in a registrar that
 * holds nothing but the client's own segments (doc/design.md §8.2,
 * implicit.h): in the client's private PD, where the device has the cap and
 * its provider can import (the registrar imports the PD).
 */
static int implicit_check(const struct odpd_caller *k, const Odpd__RegMr *req, bool client_pd,
			  struct odpd_reg_req *q, struct odpd_err *err)
{
	struct odpd_manager *m = k->m;
	struct odpd_device *dev = odpd_hotplug_device(&m->hotplug, req->device, err);
	uint32_t missing;

	if (!dev)
		return -err->code;
	if (client_pd)
		return err_set(err, EOPNOTSUPP, "implicit ODP is not available in client-PD mode");
	if (req->addr != 0 || req->length != UINT64_MAX)
		return err_set(err, EINVAL, "an implicit ODP MR has address 0 and length SIZE_MAX");
	if (!dev->implicit_odp && !m->implicit_without_cap)
		return err_set(err, EOPNOTSUPP, "device %s does not support implicit ODP: "
			       "IBV_ODP_SUPPORT_IMPLICIT is not in its general ODP caps %#" PRIx64
			       " (it needs hardware with that cap); register explicit ODP MRs over "
			       "segments instead", dev->name, dev->odp_general_caps);
	missing = odp_caps_needed(req->access) & ~dev->odp_rc_caps;
	if (missing)
		return err_set(err, EOPNOTSUPP, "device %s cannot page on demand for RC with this "
			       "access: missing RC ODP caps %#x", dev->name, missing);
	if (dev->import != ODPD__SUPPORT__SUPPORT_YES)
		return err_set(err, EOPNOTSUPP, "device %s: implicit ODP MRs are made by a registrar "
			       "process that imports the PD, and this provider cannot import (%s)",
			       dev->name, dev->import_errno ? strerror(dev->import_errno) : "not probed");
	if (k->holder->spd)
		return err_set(err, EOPNOTSUPP, "no implicit ODP in shared PD %s: an implicit MR covers "
			       "one process's address space, and a shared PD's members are several "
			       "processes; register it in your private PD", k->holder->spd->name);
	if (req->flags & ODPD__REG_FLAGS__REG_PREFETCH)
		return err_set(err, EINVAL, "REG_PREFETCH needs a range: prefetch ranges of an implicit "
			       "ODP MR with odpd_advise_mr()");
	q->dev = dev;
	q->length = UINT64_MAX;
	q->access = req->access;
	q->implicit = true;
	q->no_cache = true;
	return 0;
}

static int reg_check(const struct odpd_caller *k, const Odpd__RegMr *req, int fd, struct odpd_reg_req *q,
		     struct odpd_err *err)
{
	struct odpd_manager *m = k->m;
	uint32_t access = req->access;
	bool client_pd = req->has_client_pd && req->client_pd;
	struct odpd_cseg *s = NULL;
	int r;

	/* releases other connections wrote in their rings count before any
	 * limit below refuses (doc/design.md §11) */
	odpd_registry_settle(&m->registry, k->holder, req->addr, req->has_length ? req->length : 0,
			     !req->has_kind || req->kind == ODPD__MR_KIND__MR_PINNED);
	if (k->holder->n_refs >= m->cfg.max_mrs)
		return err_set(err, EDQUOT, "per-connection MR limit: a connection may hold at most %u "
			       "MRs at a time (this is not the pinning quota): release some, or register "
			       "on another connection", m->cfg.max_mrs);
	if (odpd_account_may(k->holder->acct, &k->holder->limit, ODPD_UL_MRS, 1, err) < 0)
		return -err->code;
	if (access & ~(uint32_t)ACCESS_KNOWN)
		return err_set(err, EINVAL, "unknown access bits %#x", access & ~(uint32_t)ACCESS_KNOWN);
	if ((access & (ODPD__ACCESS__ACCESS_REMOTE_WRITE | ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)) &&
	    !(access & ODPD__ACCESS__ACCESS_LOCAL_WRITE))
		return err_set(err, EINVAL, "remote write or atomic access needs local write access");
	if (req->flags & ~REG_FLAGS_KNOWN)
		return err_set(err, EINVAL, "unknown registration flags %#x", req->flags & ~REG_FLAGS_KNOWN);
	/* (implicit_check would ignore it) */
	if ((req->flags & ODPD__REG_FLAGS__REG_UNPOPULATED) && req->has_kind && req->kind != ODPD__MR_KIND__MR_PINNED)
		return err_set(err, EINVAL, "REG_UNPOPULATED is for pinned ranges of at most %u bytes "
			       "(HelloReply.resident_check_max)", ODPD_LOOP_REG_MAX);
	switch (req->has_kind ? req->kind : ODPD__MR_KIND__MR_PINNED) {
	case ODPD__MR_KIND__MR_PINNED:
		break;
	case ODPD__MR_KIND__MR_ODP:
		q->odp = true;
		break;
	case ODPD__MR_KIND__MR_IMPLICIT_ODP:
		return implicit_check(k, req, client_pd, q, err);
	default:
		return err_set(err, EINVAL, "unknown MR kind %d", (int)req->kind);
	}
	r = find_segment(k, req->addr, req->length, &s, err);
	if (r < 0)
		return r;
	if ((access & ACCESS_WRITES) && !s->writable)
		return err_set(err, EACCES, "segment %" PRIu64 " is read-only (fd mode or write seal): "
			       "register it without write access", s->handle);
	if (client_pd) {
		if (!is_uverbs_fd(fd))
			return err_set(err, EINVAL, "client-PD mode: the fd is not a uverbs device of this host");
		if ((access & ACCESS_REMOTE) && !k->admin && !k->holder->limit.remote_access)
			return err_set(err, EPERM, "client-PD mode: remote access is granted to root, "
				       "the admin group and users a rule of odpd.conf gives "
				       "remote-access = yes");
	}
	q->dev = odpd_hotplug_device(&m->hotplug, req->device, err);
	if (!q->dev)
		return -err->code;
	if (q->odp && (r = odp_check(q->dev, access, s, client_pd, err)) < 0)
		return r;
	q->map = s->map;
	q->offset = s->file_offset + (req->addr - s->client_addr);
	q->length = req->length;
	q->iova = req->addr;
	q->access = access;
	q->no_cache = (req->flags & ODPD__REG_FLAGS__REG_NO_CACHE) != 0;
	q->prefetch = (req->flags & ODPD__REG_FLAGS__REG_PREFETCH) != 0;
	q->unpopulated = (req->flags & ODPD__REG_FLAGS__REG_UNPOPULATED) != 0;
	if (q->unpopulated && (q->odp || req->length > ODPD_LOOP_REG_MAX))
		return err_set(err, EINVAL, "REG_UNPOPULATED is for pinned ranges of at most %u bytes "
			       "(HelloReply.resident_check_max)", ODPD_LOOP_REG_MAX);
	/* [odp] prefetch-on-register: where the provider can (odpctl status says where not) */
	if (q->odp && m->conf.prefetch_on_register && q->dev->advise_mr == ODPD__SUPPORT__SUPPORT_YES)
		q->prefetch = true;
	if (q->prefetch && !q->odp)
		return err_set(err, EINVAL, "REG_PREFETCH is for ODP MRs (a pinned MR's pages are mapped "
			       "when it is registered)");
	if (q->prefetch && q->dev->advise_mr != ODPD__SUPPORT__SUPPORT_YES)
		return err_set(err, EOPNOTSUPP, "device %s: its provider has no ibv_advise_mr (%s), so "
			       "odpd cannot prefetch: register without REG_PREFETCH", q->dev->name,
			       q->dev->advise_mr_errno ? strerror(q->dev->advise_mr_errno) : "not probed");
	q->pd_handle = req->client_pd_handle;
	q->cookie = s;
	return 0;
}

/* Register in the registry, answering now in @o (a refusal, a cache hit:
 * ODPD_DONE) or through reg_cb (ODPD_PENDING). */
static int reg_submit(const struct odpd_caller *k, struct odpd_out *o, struct odpd_reg_req *q)
{
	struct odpd_err err = { 0 };
	struct odpd_ref *ref = NULL;
	struct pending *p = pending_new(k, o);
	int r;

	if (!p) {
		if (q->cmd_fd >= 0)
			close(q->cmd_fd);
		if (q->implicit)
			implicit_end(k);
		return ODPD_DONE;
	}
	p->implicit = q->implicit;
	q->handle = ++k->segs->next_handle;
	r = odpd_registry_reg(&k->m->registry, k->holder, q, reg_cb, p, &ref, &err);
	if (r == 1)
		return ODPD_PENDING;
	pending_free(p);
	if (r < 0)
		odpd_out_err(o, k, &err);
	else
		reg_accepted(k, o, ref, r == 0);     /* (ODPD_REG_MADE: a miss) */
	if (q->implicit)
		implicit_end(k);
	return ODPD_DONE;
}

/* Implicit ODP, first time in a PD: its registrar is started and the
 * client's segments mapped in it, all of them answered, before the MR is
 * registered. A segment it cannot map (its address is taken there) would be
 * out of the MR's reach: then the registrar goes and the request fails. */
struct implicit_start {
	struct odpd_caller k;
	struct odpd_reg_req q;
	struct odpd_domain *d;
	unsigned pending;
	int rc;
	struct odpd_err err;                /* the first failure */
};

static void implicit_mapped(void *arg, int rc, const struct odpd_err *err)
{
	struct implicit_start *st = arg;
	const struct odpd_caller *k = &st->k;
	struct odpd_out o = { 0 };

	if (rc < 0 && st->rc == 0) {
		st->rc = rc;
		st->err = *err;
	}
	if (--st->pending)
		return;
	if (!odpd_caller_connected(k)) {
		/* Gone meanwhile (odpd stopping, or its process exited): nothing
		 * to register for; the PD and its registrar go with it. */
		implicit_end(k);
		odpd_complete(k, &o);
	} else if (st->rc < 0) {
		odpd_registry_drop_registrar(&k->m->registry, st->d);
		odpd_out_err(&o, k, &st->err);
		implicit_end(k);
		odpd_complete(k, &o);
	} else if (reg_submit(k, &o, &st->q) == ODPD_DONE) {
		odpd_complete(k, &o);
	}
	free(st);
}

/*
 * A registrar runs as its client's user, who can kill it or stop it. A
 * stopped one holds nothing of odpd's but the requests that wait for it
 * (on the loop, until its deadline: implicit.h), and a user has at most
 * default-registrar-waits of those at once (implicit_reg). Each one killed
 * is replaced by a new process, though: so a user whose registrars died
 * REGISTRAR_DEATHS times within REGISTRAR_WINDOW_S seconds gets no new one
 * until that window ends (EAGAIN). @died: this domain's registrar is found
 * dead now.
 */
#define REGISTRAR_DEATHS 3u
#define REGISTRAR_WINDOW_S 60u

/* The latest registrar deaths, whoever's: a user's count survives its
 * connections (reconnecting resets nothing). */
static struct { uid_t uid; uint64_t ns; } deaths[256];
static unsigned deaths_next;

static int registrar_deaths_over(const struct odpd_caller *k, bool died, struct odpd_err *err)
{
	const uint64_t window = REGISTRAR_WINDOW_S * 1000000000ull;
	uint64_t now, oldest = UINT64_MAX;
	struct timespec ts;
	unsigned n = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + window;  /* never 0 */
	if (died) {
		deaths[deaths_next].uid = k->uid;
		deaths[deaths_next].ns = now;
		deaths_next = (deaths_next + 1) % (sizeof(deaths) / sizeof(deaths[0]));
	}
	for (unsigned i = 0; i < sizeof(deaths) / sizeof(deaths[0]); i++)
		if (deaths[i].ns && deaths[i].uid == k->uid && now - deaths[i].ns < window) {
			n++;
			if (deaths[i].ns < oldest)
				oldest = deaths[i].ns;
		}
	if (n < REGISTRAR_DEATHS)
		return 0;
	return err_set(err, EAGAIN, "implicit ODP is paused for your user for up to %llu s: %u of "
		       "its registrar processes died or stopped answering within %u s",
		       (unsigned long long)((oldest + window - now) / 1000000000u) + 1, n,
		       REGISTRAR_WINDOW_S);
}

static int implicit_reg(const struct odpd_caller *k, struct odpd_out *o, struct odpd_reg_req *q)
{
	struct odpd_registry *r = &k->m->registry;
	struct odpd_domain *d = odpd_registry_holder_domain(r, k->holder, (unsigned)(q->dev - k->m->devices.dev));
	struct implicit_start *st;
	struct odpd_err err = { 0 };
	struct odpd_cseg *s;
	char label[96];

	if (!d) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		return ODPD_DONE;
	}
	/* From here until it is answered, the request waits for a registrar
	 * (one its user may have stopped): a few of them per user at once. */
	if (odpd_account_may(k->holder->acct, &k->holder->limit, ODPD_UL_REGISTRAR_WAITS, 1, &err) < 0) {
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	odpd_account_hold(k->holder->acct, ODPD_UL_REGISTRAR_WAITS, 1);
	if (d->registrar && !odpd_registrar_dead(d->registrar))
		return reg_submit(k, o, q);
	/* A registrar that died: its MRs reach nothing and stay in the PD's
	 * context until they are released (odpd drops its imports) and the PD
	 * closes; a new registrar serves from here on, unless too many died. */
	if (registrar_deaths_over(k, d->registrar != NULL, &err) < 0) {
		odpd_registry_drop_registrar(r, d);
		odpd_out_err(o, k, &err);
		implicit_end(k);
		return ODPD_DONE;
	}
	odpd_registry_drop_registrar(r, d);
	st = calloc(1, sizeof(*st));
	if (!st) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		implicit_end(k);
		return ODPD_DONE;
	}
	snprintf(label, sizeof(label), "client %llu, %s", (unsigned long long)k->conn, q->dev->name);
	if (odpd_registry_start_registrar(r, d, label, k->uid, k->gid, &err) < 0) {
		free(st);
		odpd_out_err(o, k, &err);
		implicit_end(k);
		return ODPD_DONE;
	}
	st->k = *k;
	st->k.pidfd = -1;
	st->k.groups = NULL;
	st->k.n_groups = 0;
	st->q = *q;
	st->d = d;
	st->pending = 1;                     /* until every map is sent */
	LIST_FOREACH(s, &k->segs->list, link) {
		int rc = odpd_registrar_map(d->registrar, s->handle, s->map->fd, s->client_addr, s->length,
					    s->file_offset, s->writable, implicit_mapped, st);
		if (rc < 0) {
			st->rc = err_set(&st->err, -rc, "mapping segment %" PRIu64 " in the registrar: %s",
					 s->handle, strerror(-rc));
			break;
		}
		st->pending++;
	}
	/* may complete the request now (odpd_complete), before this returns */
	implicit_mapped(st, 0, NULL);
	return ODPD_PENDING;
}

int odpd_reg_mr(const struct odpd_caller *k, const Odpd__RegMr *req, int fd, struct odpd_out *o)
{
	struct odpd_reg_req q = { .cmd_fd = -1 };
	struct odpd_err err = { 0 };

	/* Client-PD mode: odpd may keep this fd (a copy of the client's
	 * context) as long as its MRs: within the reserve, like a segment's. */
	if (fd >= 0 && odpd_fd_short(k->m->nofile, fd, true))
		err_set(&err, EMFILE, "odpd is short of file descriptors: it keeps no more "
			"client contexts now");
	if (err.code || reg_check(k, req, fd, &q, &err) < 0) {
		if (fd >= 0)
			close(fd);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	if (q.implicit) {
		if (fd >= 0)
			close(fd);
		return implicit_reg(k, o, &q);
	}
	q.cmd_fd = fd;                        /* consumed by the registry */
	return reg_submit(k, o, &q);
}

static void reply_advise(struct odpd_out *o, uint64_t id, uint64_t bytes, bool flushed)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__AdviseMrReply ar = ODPD__ADVISE_MR_REPLY__INIT;

	ar.has_bytes = ar.has_flushed = 1;
	ar.bytes = bytes;
	ar.flushed = flushed;
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_ADVISE_MR;
	reply.advise_mr = &ar;
	odpd_out_reply(o, &reply, -1);
}

/* ---------------------------------------------------------------- dereg */

static void reply_ok(struct odpd_out *o, uint64_t id)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;

	reply.has_id = reply.has_status = 1;
	reply.id = id;
	odpd_out_reply(o, &reply, -1);
}

static void dereg_cb(void *arg, unsigned mrs, uint64_t bytes)
{
	struct pending *p = arg;
	struct odpd_out o = { 0 };

	(void)mrs;
	(void)bytes;
	reply_ok(&o, p->k.id);
	odpd_complete(&p->k, &o);
	pending_free(p);
}

/*
 * DeregMr.no_reply: the client does not wait, and gets no answer. The
 * reference goes (and with it the user's charge) as for any release; the
 * MR's deregistration, if this was its last reference, runs on the loop
 * (batch_on_loop) or in a batch nobody waits for. A failure is logged and
 * counted, not answered: libodpd sends it only for a handle it holds.
 */
static int dereg_oneway(const struct odpd_caller *k, const Odpd__DeregMr *req)
{
	struct odpd_ref *ref = odpd_holder_find_ref(k->holder, req->handle);
	struct odpd_cseg *s;

	if (!ref) {
		k->m->stats.errors++;
		log_debug(CALLER_FMT ": one-way release of MR handle %" PRIu64 ": no such MR", CALLER_ARGS(k),
			  req->handle);
		return ODPD_DONE;
	}
	s = ref->cookie;
	if (s)
		s->n_mrs--;
	odpd_registry_release(&k->m->registry, ref, req->has_relaxed && req->relaxed, NULL, NULL);
	return ODPD_DONE;
}

int odpd_dereg_mr(const struct odpd_caller *k, const Odpd__DeregMr *req, struct odpd_out *o)
{
	struct odpd_ref *ref;
	struct odpd_cseg *s;
	struct pending *p;

	if (req->no_reply)
		return dereg_oneway(k, req);
	ref = ref_or_reply(k, o, req->handle);
	if (!ref || !(p = pending_new(k, o)))
		return ODPD_DONE;
	s = ref->cookie;
	if (s)
		s->n_mrs--;
	if (odpd_registry_release(&k->m->registry, ref, req->has_relaxed && req->relaxed, dereg_cb, p) == 1)
		return ODPD_PENDING;
	pending_free(p);
	reply_ok(o, k->id);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- verify */

static void verify_cb(void *arg, int rc, const struct odpd_err *err, uint32_t crc, uint64_t length,
		      const char *method)
{
	struct pending *p = arg;
	struct odpd_out o = { 0 };
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__VerifyReply vr = ODPD__VERIFY_REPLY__INIT;

	if (rc < 0) {
		odpd_out_err(&o, &p->k, err);
	} else {
		vr.has_crc32 = vr.has_length = 1;
		vr.crc32 = crc;
		vr.length = length;
		vr.method = (char *)method;
		reply.has_id = reply.has_status = 1;
		reply.id = p->k.id;
		reply.body_case = ODPD__REPLY__BODY_VERIFY;
		reply.verify = &vr;
		odpd_out_reply(&o, &reply, -1);
	}
	odpd_complete(&p->k, &o);
	pending_free(p);
}

int odpd_verify(const struct odpd_caller *k, const Odpd__Verify *req, struct odpd_out *o)
{
	struct odpd_ref *ref = ref_or_reply(k, o, req->handle);
	struct odpd_err err = { 0 };
	struct pending *p;

	if (!ref || !(p = pending_new(k, o)))
		return ODPD_DONE;
	if (odpd_registry_verify(&k->m->registry, ref, req->addr, req->length,
				 req->has_rkey ? &req->rkey : NULL, k->m->cfg.verify_buffer, verify_cb, p,
				 &err) < 0) {
		pending_free(p);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	return ODPD_PENDING;
}

int odpd_admin_verify(const struct odpd_caller *k, const Odpd__AdminVerify *req, struct odpd_out *o)
{
	struct odpd_err err = { 0 };
	struct pending *p;

	if (!k->admin) {
		odpd_out_error(o, k, EPERM, "verify of any MR is an admin request: root or the "
			       "admin group only");
		return ODPD_DONE;
	}
	if (!(p = pending_new(k, o)))
		return ODPD_DONE;
	if (odpd_registry_verify_mr(&k->m->registry, req->mr_id, k->m->cfg.verify_buffer, verify_cb, p,
				    &err) < 0) {
		pending_free(p);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	return ODPD_PENDING;
}

/* ---------------------------------------------------------------- shared PDs */

int odpd_join_pd(const struct odpd_caller *k, const Odpd__JoinPd *req, struct odpd_out *o)
{
	struct odpd_manager *m = k->m;
	const char *name = req->name ? req->name : "";
	struct odpd_shared_pd *spd;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__JoinPdReply jr = ODPD__JOIN_PD_REPLY__INIT;
	struct odpd_err err = { 0 };
	char why[200];
	bool created;
	unsigned members;

	if (!odpd_conf_pd_name_valid(name)) {
		odpd_out_error(o, k, EINVAL, "a shared PD name is 1 to 63 bytes of "
			       "A-Z a-z 0-9 . _ : @ -");
		return ODPD_DONE;
	}
	spd = odpd_registry_find_shared(&m->registry, name);
	if (!odpd_conf_pd_allowed(&m->conf, name, k->uid, k->gid, k->groups, k->n_groups,
				  spd ? spd->creator_uid : k->uid, why, sizeof(why))) {
		odpd_out_error(o, k, EPERM, why);
		return ODPD_DONE;
	}
	if (odpd_registry_join(&m->registry, k->holder, name, &created, &members, &err) < 0) {
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	log_info(CALLER_FMT " (uid %u) joined shared PD \"%s\"%s", CALLER_ARGS(k),
		 k->uid, name, created ? " (created)" : "");
	odpd_journal_shared(name, spd ? spd->creator_uid : k->uid);
	jr.has_created = jr.has_members = 1;
	jr.created = created;
	jr.members = members;
	reply.has_id = reply.has_status = 1;
	reply.id = k->id;
	reply.body_case = ODPD__REPLY__BODY_JOIN_PD;
	reply.join_pd = &jr;
	odpd_out_reply(o, &reply, -1);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- flush */

static void reply_flush(struct odpd_out *o, uint64_t id, unsigned mrs, uint64_t bytes)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__FlushReply fr = ODPD__FLUSH_REPLY__INIT;

	fr.has_mrs = fr.has_bytes = 1;
	fr.mrs = mrs;
	fr.bytes = bytes;
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_FLUSH;
	reply.flush = &fr;
	odpd_out_reply(o, &reply, -1);
}

static void flush_cb(void *arg, unsigned mrs, uint64_t bytes)
{
	struct pending *p = arg;
	struct odpd_out o = { 0 };
	char b[LOG_BYTES_LEN];

	log_info(CALLER_FMT ": flush: %u MR(s), %s invalidated", CALLER_ARGS(&p->k), mrs, log_bytes(bytes, b));
	reply_flush(&o, p->k.id, mrs, bytes);
	odpd_complete(&p->k, &o);
	pending_free(p);
}

/* A client's flush covers its own PDs; all, pid and pd are for admins. */
int odpd_flush(const struct odpd_caller *k, const Odpd__Flush *req, struct odpd_out *o)
{
	struct odpd_flush_sel sel = { 0 };
	struct pending *p;

	if ((req->has_all && req->all) || req->has_pid || (req->pd && *req->pd)) {
		if (!k->admin) {
			odpd_out_error(o, k, EPERM, "flush of other clients' MRs (all, pid, pd) is "
				       "an admin request: root or the admin group only");
			return ODPD_DONE;
		}
		sel.all = req->has_all && req->all;
		sel.has_pid = req->has_pid;
		sel.pid = req->pid;
		sel.pd = req->pd && *req->pd ? req->pd : NULL;
	} else {
		sel.holder = k->holder;
	}
	p = pending_new(k, o);
	if (!p)
		return ODPD_DONE;
	if (odpd_registry_flush(&k->m->registry, &sel, flush_cb, p) == 1)
		return ODPD_PENDING;
	pending_free(p);
	reply_flush(o, k->id, 0, 0);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- the client's cache */

int odpd_open_hit_table(const struct odpd_caller *k, const Odpd__OpenHitTable *req, int fd, struct odpd_out *o)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__HitTableReply ht = ODPD__HIT_TABLE_REPLY__INIT;
	struct odpd_err err = { 0 };
	int gen_fd = -1;

	if (odpd_registry_open_hits(&k->m->registry, k->holder, req->has_slots ? req->slots : 0,
				    req->has_release_ring ? req->release_ring : 0, fd, &gen_fd, &err) < 0) {
		close(fd);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	close(fd);                           /* mapped */
	odpd_journal_client_hits(k->holder->id, odpd_hittab_fd(k->holder->hits));
	ht.has_slots = 1;
	ht.slots = odpd_hittab_slots(k->holder->hits);
	ht.has_events_slot = 1;
	ht.events_slot = ODPD_HIT_EVENTS_SLOT;
	ht.has_release_ring = 1;
	ht.release_ring = odpd_hittab_ring(k->holder->hits);
	reply.has_id = reply.has_status = 1;
	reply.id = k->id;
	reply.body_case = ODPD__REPLY__BODY_HIT_TABLE;
	reply.hit_table = &ht;
	odpd_out_reply(o, &reply, gen_fd);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- import (daemon-PD mode) */

static void export_cb(void *arg, int rc, const struct odpd_err *err, int fd, uint32_t pd_handle)
{
	struct pending *p = arg;
	const struct odpd_caller *k = &p->k;
	struct odpd_out o = { 0 };
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__ImportPdReply ir = ODPD__IMPORT_PD_REPLY__INIT;
	const struct odpd_device *dev = p->dev;

	if (rc == 0 && odpd_fd_short(k->m->nofile, fd, false)) {
		/* the reply would hold it until the client reads it */
		close(fd);
		odpd_out_error(&o, k, EMFILE, "odpd is short of file descriptors: try again later");
	} else if (rc < 0) {
		odpd_out_err(&o, k, err);
	} else {
		ir.has_pd_handle = 1;
		ir.pd_handle = pd_handle;
		ir.device = (char *)dev->name;
		ir.pd = k->holder->spd ? k->holder->spd->name : NULL;
		reply.has_id = reply.has_status = 1;
		reply.id = k->id;
		reply.body_case = ODPD__REPLY__BODY_IMPORT_PD;
		reply.import_pd = &ir;
		log_info(CALLER_FMT ": handed over %s PD %u of %s%s%s", CALLER_ARGS(k),
			 ir.pd ? "shared" : "its", pd_handle, dev->name, ir.pd ? " " : "",
			 ir.pd ? ir.pd : "");
		odpd_out_reply(&o, &reply, fd);
	}
	odpd_complete(k, &o);
	pending_free(p);
}

int odpd_import_pd(const struct odpd_caller *k, const Odpd__ImportPd *req, struct odpd_out *o)
{
	struct odpd_manager *m = k->m;
	struct odpd_err err = { 0 };
	struct odpd_device *dev = odpd_hotplug_device(&m->hotplug, req->device, &err);
	struct pending *p;

	if (!dev) {
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	p = pending_new(k, o);
	if (!p)
		return ODPD_DONE;
	p->dev = dev;
	if (odpd_registry_export_pd(&m->registry, k->holder, dev, export_cb, p, &err) < 0) {
		pending_free(p);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	return ODPD_PENDING;
}

/* ---------------------------------------------------------------- prefetch */

static void advise_cb(void *arg, int rc, const struct odpd_err *err, uint64_t bytes)
{
	struct pending *p = arg;
	struct odpd_out o = { 0 };

	/* Without FLUSH the client had its answer when the daemon accepted. */
	if (p->flush) {
		if (rc < 0)
			odpd_out_err(&o, &p->k, err);
		else
			reply_advise(&o, p->k.id, bytes, true);
	}
	odpd_complete(&p->k, &o);
	pending_free(p);
}

int odpd_advise_mr(const struct odpd_caller *k, const Odpd__AdviseMr *req, struct odpd_out *o)
{
	struct odpd_sge sges[ODPD_ADVISE_MAX_SGE];
	struct odpd_err err = { 0 };
	struct pending *p;
	uint64_t bytes = 0;

	if (req->n_sges > ODPD_ADVISE_MAX_SGE) {
		odpd_out_error(o, k, EINVAL, "AdviseMr takes 1 to 64 ranges");
		return ODPD_DONE;
	}
	for (size_t i = 0; i < req->n_sges; i++) {
		sges[i] = (struct odpd_sge){ req->sges[i]->addr, req->sges[i]->length, req->sges[i]->lkey };
		bytes += sges[i].length;
	}
	p = pending_new(k, o);
	if (!p)
		return ODPD_DONE;
	p->flush = (req->flags & IBV_ADVISE_MR_FLAG_FLUSH) != 0;
	if (odpd_registry_advise(&k->m->registry, k->holder, req->advice, req->flags, sges,
				 (unsigned)req->n_sges, advise_cb, p, &err) < 0) {
		pending_free(p);
		odpd_out_err(o, k, &err);
		return ODPD_DONE;
	}
	if (!p->flush)
		reply_advise(o, k->id, bytes, false);  /* accepted; it runs on a worker: answered now, done later */
	return ODPD_PENDING;
}
