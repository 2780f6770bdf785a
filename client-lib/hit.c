/* SPDX-License-Identifier: MIT */
/*
 * hit.c - the registration cache of this process: a registration of a range
 * the process already holds, and the reuse of an MR it released relaxed,
 * answered without a system call.
 *
 * The daemon vouches for every answer through the connection's hit table
 * (proto/odpd.proto, OpenHitTable; daemon/hittab.h): each MR reference the
 * library may serve again has a slot; the daemon's generation table (mapped
 * read-only here: no process but odpd can write it) holds the reference's
 * ticket while the MR is valid, and something else from the moment the
 * daemon invalidated it (device loss, a punched hole found) or took the
 * reference back. The use table is ours: the ticket while the process uses
 * the reference, a release stamp while the library only keeps it.
 *
 * A relaxed release (odpd_dereg_relaxed) of the last user keeps the
 * reference in this process, unused, bounded by ODPD_CACHE_MAX_MRS and
 * ODPD_CACHE_MAX_BYTES; the next registration of that range takes it back
 * (hit_claim). The daemon takes back what stays unused for a whole relaxed
 * window, and everything unused on a flush; it then waits for the library
 * to say it has forgotten those slots (Request.revocations_seen) before it
 * reuses them.
 *
 * The table's second header slot, where the daemon names it, is its events
 * word: how many events it has sent on the connection. conn.c looks for
 * events on the socket before a request only while that is ahead of what it
 * has read (hit_events_all_received).
 *
 * After the slots, the release ring (since 1.4.5): a release that would go
 * as a one-way DeregMr is written there instead (hit_ring_push), and odpd
 * takes it before this connection's next request, before a limit could
 * refuse any request for want of it, or within a few relaxed windows. The
 * ring is why a table is opened even with ODPD_CACHE=0: then it has no
 * slot for a reference (local hits off), only the events word and the ring.
 */
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "libodpd-private.h"

#define HIT_INVALID (UINT64_C(1) << 63)
#define HIT_REVOKING (UINT64_C(1) << 62)
#define HIT_STAMP (UINT64_C(1) << 61)   /* release stamps: never a ticket */
#define HIT_RETIRED UINT64_MAX          /* the events word of a retired table (daemon/hittab.h) */
#define HIT_SLOTS 4096u
#define HIT_BUCKETS 1024u               /* hash buckets, a power of two */
#define CACHE_MAX_MRS_DEFAULT 256u
#define CACHE_MAX_BYTES_DEFAULT (256ull << 20)


/* ---------------------------------------------------------------- setup */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long n;

	if (!v || !*v)
		return dflt;
	errno = 0;
	n = strtoull(v, &end, 0);
	return errno || *end ? dflt : (uint64_t)n;
}

static size_t table_len(uint32_t slots)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return ((size_t)slots * sizeof(uint64_t) + page - 1) / page * page;
}

/* Words of a table of @slots with a ring of @ring entries (daemon/hittab.h). */
static uint32_t table_words(uint32_t slots, uint32_t ring)
{
	return slots + (ring ? 1 + ring : 0);
}

/* The use table: ours, sealed so that the daemon's mapping of it stays whole. */
static int use_table_make(size_t len, int *ret_fd, _Atomic uint64_t **ret_map)
{
	int fd = memfd_create("odpd-hit-use", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p = MAP_FAILED;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
	    (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		int r = -errno;

		close(fd);
		return r;
	}
	madvise(p, len, MADV_DONTFORK);      /* a child's connections are dead */
	*ret_fd = fd;
	*ret_map = p;
	return 0;
}

int hit_open(struct odpd_conn *c)
{
	Odpd__OpenHitTable o = ODPD__OPEN_HIT_TABLE__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *reply = NULL;
	_Atomic uint64_t *use = NULL;
	/* Without the cache, a table for the ring and the events word only:
	 * the two header slots, none for a reference. */
	bool cache = env_u64("ODPD_CACHE", 1) != 0;
	uint32_t want = cache ? HIT_SLOTS : 2, ring_want = c->oneway_dereg_max ? ONEWAY_MAX : 0;
	size_t len = table_len(table_words(want, ring_want));
	uint32_t slots, events_slot, ring;
	int use_fd = -1, gen_fd = -1, r;
	void *gen;

	c->cache_max_mrs = (unsigned)env_u64("ODPD_CACHE_MAX_MRS", CACHE_MAX_MRS_DEFAULT);
	c->cache_max_bytes = env_u64("ODPD_CACHE_MAX_BYTES", CACHE_MAX_BYTES_DEFAULT);
	c->hit_ring = 0;
	c->ring_tail = 0;
	if (!cache && !ring_want)
		return 0;
	c->hit_buckets = calloc(HIT_BUCKETS, sizeof(*c->hit_buckets));
	c->hit_by_slot = calloc(want, sizeof(*c->hit_by_slot));
	if (!c->hit_buckets || !c->hit_by_slot)
		goto off;
	r = use_table_make(len, &use_fd, &use);
	if (r < 0)
		goto off;
	o.has_slots = true;
	o.slots = want;
	o.has_release_ring = ring_want != 0;
	o.release_ring = ring_want;
	req.body_case = ODPD__REQUEST__BODY_OPEN_HIT_TABLE;
	req.open_hit_table = &o;
	/* An odpd without hit tables refuses the request: no cache, nothing else changes. */
	r = conn_call_fd(c, "odpd_connect: hit table", &req, &use_fd, 1, ODPD__REPLY__BODY_HIT_TABLE,
			 &reply, &gen_fd);
	close(use_fd);
	if (r < 0)
		goto off;
	slots = reply->hit_table->has_slots ? reply->hit_table->slots : 0;
	events_slot = reply->hit_table->has_events_slot ? reply->hit_table->events_slot : 0;
	ring = reply->hit_table->has_release_ring ? reply->hit_table->release_ring : 0;
	conn_reply_free(c, reply);
	if (events_slot >= slots)
		events_slot = 0;                 /* not a word of the table: drain as without one */
	if (slots < 2 || slots > want || ring > ring_want)
		goto off;
	/* Read-only: the daemon sends a read-only description of it (an older
	 * odpd: sealed F_SEAL_FUTURE_WRITE), so nothing can ever map it
	 * writable here. */
	gen = mmap(NULL, table_len(table_words(slots, ring)), PROT_READ, MAP_SHARED, gen_fd, 0);
	close(gen_fd);
	gen_fd = -1;
	if (gen == MAP_FAILED)
		goto off;
	madvise(gen, table_len(table_words(slots, ring)), MADV_DONTFORK);
	c->hit_gen = gen;
	c->hit_use = use;
	c->hit_slots = slots;
	c->hit_events_slot = events_slot;
	c->hit_len = len;
	c->hit_gen_len = table_len(table_words(slots, ring));
	c->hit_ring = ring;
	c->hit_cache = cache;
	errmsg_clear();
	return 0;
off:
	if (gen_fd >= 0)
		close(gen_fd);
	if (use)
		munmap(use, len);
	free(c->hit_buckets);
	free(c->hit_by_slot);
	c->hit_buckets = NULL;
	c->hit_by_slot = NULL;
	errmsg_clear();
	return 0;
}

/* ---------------------------------------------------------------- the index */

static unsigned bucket_of(uintptr_t addr, size_t length)
{
	uint64_t h = (uint64_t)addr * 0x9e3779b97f4a7c15ull ^ (uint64_t)length * 0xc2b2ae3d27d4eb4full;

	return (unsigned)(h >> 40) & (HIT_BUCKETS - 1);
}

static void index_add(struct odpd_conn *c, struct hit_ref *h)
{
	unsigned b = bucket_of(h->addr0, h->length0);

	h->hnext = c->hit_buckets[b];
	c->hit_buckets[b] = h;
	c->hit_by_slot[h->slot] = h;
	link_add_tail(&c->hit_refs, &h->link);
	c->n_hit_refs++;
	h->indexed = true;
}

static void index_del(struct odpd_conn *c, struct hit_ref *h)
{
	struct hit_ref **p = &c->hit_buckets[bucket_of(h->addr0, h->length0)];

	if (!h->indexed)
		return;
	while (*p && *p != h)
		p = &(*p)->hnext;
	if (*p)
		*p = h->hnext;
	if (c->hit_by_slot[h->slot] == h)
		c->hit_by_slot[h->slot] = NULL;
	link_del(&h->link);
	c->n_hit_refs--;
	h->indexed = false;
}

static void lazy_del(struct odpd_conn *c, struct hit_ref *h)
{
	link_del(&h->lru);
	c->n_lazy--;
	c->lazy_bytes -= h->end - h->start;
}

/* At most this many freed references wait for reuse per connection. */
#define SPARE_REFS_MAX 64

/* A zeroed reference: a spare one, else calloc's (NULL: out of memory).
 * Caller holds the tables lock. */
static struct hit_ref *ref_alloc_locked(struct odpd_conn *c)
{
	struct odpd_link *l = spares_take(&c->spare_refs);
	struct hit_ref *h;

	if (!l)
		return calloc(1, sizeof(*h));
	h = container_of(l, struct hit_ref, lru);
	memset(h, 0, sizeof(*h));
	return h;
}

/* @h, in no list, kept for ref_alloc_locked or freed. Caller holds the tables lock. */
static void ref_free_locked(struct odpd_conn *c, struct hit_ref *h)
{
	if (!spares_put(&c->spare_refs, &h->lru, SPARE_REFS_MAX))
		free(h);
}

/* Forget @h here (the daemon revoked it, or the connection is gone). */
static void ref_forget(struct odpd_conn *c, struct hit_ref *h)
{
	index_del(c, h);
	if (h->users == 0) {
		lazy_del(c, h);
		ref_free_locked(c, h);
	}
}

/* ---------------------------------------------------------------- the tables */

static uint64_t gen_load(const struct odpd_conn *c, uint32_t slot)
{
	return atomic_load_explicit(&c->hit_gen[slot], memory_order_acquire);
}

/* Ours while the process uses it: the daemon never takes it back. */
static void use_mark(struct odpd_conn *c, const struct hit_ref *h)
{
	atomic_store_explicit(&c->hit_use[h->slot], h->ticket, memory_order_seq_cst);
}

/* Unused: a new stamp each time, so that the daemon sees reuse. */
static void use_release(struct odpd_conn *c, const struct hit_ref *h)
{
	atomic_store_explicit(&c->hit_use[h->slot], HIT_STAMP | (++c->release_stamp & (HIT_STAMP - 1)),
			      memory_order_release);
}

enum claim { CLAIM_REVOKED, CLAIM_VALID, CLAIM_INVALID };

/*
 * Take back unused @h: mark it used, fence, and see whether the daemon was
 * revoking it meanwhile (daemon/hittab.c does store, fence, load the other
 * way round). A revocation in progress is waited for. CLAIM_VALID: ours
 * again, and the daemon vouches for it; CLAIM_INVALID: ours again, but the
 * daemon invalidated the MR (only to be released); CLAIM_REVOKED: the
 * daemon took it back (only to be forgotten).
 */
static enum claim hit_claim(struct odpd_conn *c, struct hit_ref *h, bool invalid_too)
{
	uint64_t g = gen_load(c, h->slot);

	if (g != h->ticket && !(invalid_too && g == (h->ticket | HIT_INVALID)))
		return CLAIM_REVOKED;
	use_mark(c, h);
	atomic_thread_fence(memory_order_seq_cst);
	for (unsigned spins = 0;; spins++) {
		g = atomic_load_explicit(&c->hit_gen[h->slot], memory_order_seq_cst);
		if (g != (h->ticket | HIT_REVOKING) || spins > 100000)
			break;
		sched_yield();
	}
	if (g == h->ticket)
		return CLAIM_VALID;
	/* invalid stays invalid: the daemon never takes back what is in use */
	if (invalid_too && g == (h->ticket | HIT_INVALID))
		return CLAIM_INVALID;
	use_release(c, h);
	return CLAIM_REVOKED;
}

/* ---------------------------------------------------------------- lookup */

/* Would the daemon serve this request with @h? (daemon/registry/lookup.c, hit_ok) */
static bool ref_serves(const struct hit_ref *h, uintptr_t a, size_t length, uint32_t access,
		       Odpd__MrKind kind)
{
	size_t page;

	if (h->kind != kind || (h->access & access) != access)
		return false;
	if (a < h->start || a + length > h->end || a + length < a)
		return false;
	if (!h->remote)
		return true;
	/* a remote key is served again only for its own range (page rounded;
	 * sysconf is 8 % of a local hit: only asked here) */
	page = (size_t)sysconf(_SC_PAGESIZE);
	return (a & ~(uintptr_t)(page - 1)) == h->start &&
	       ((a + length + page - 1) & ~(uintptr_t)(page - 1)) == h->end;
}

static struct hit_ref *ref_find(struct odpd_conn *c, uintptr_t a, size_t length, uint32_t access,
				Odpd__MrKind kind)
{
	struct odpd_link *l;
	unsigned scanned = 0;

	for (struct hit_ref *h = c->hit_buckets[bucket_of(a, length)]; h; h = h->hnext)
		if (h->addr0 == a && h->length0 == length && ref_serves(h, a, length, access, kind) &&
		    gen_load(c, h->slot) == h->ticket)
			return h;
	/* Inside a larger MR: a bounded look at the most recent references. */
	for (l = c->hit_refs.prev; l != &c->hit_refs && scanned < 64; l = l->prev, scanned++) {
		struct hit_ref *h = container_of(l, struct hit_ref, link);

		if (ref_serves(h, a, length, access, kind) && gen_load(c, h->slot) == h->ticket)
			return h;
	}
	return NULL;
}

bool hit_lookup(struct odpd_conn *c, void *addr, size_t length, const struct mr_request *q,
		struct mr_result *ret, struct hit_ref **ret_ref)
{
	uintptr_t a = (uintptr_t)addr;
	struct hit_ref *h;

	if (!c->hit_gen || !c->hit_cache || q->client_pd || q->device || q->kind == ODPD__MR_KIND__MR_IMPLICIT_ODP ||
	    (q->flags & (ODPD__REG_FLAGS__REG_NO_CACHE | ODPD__REG_FLAGS__REG_PREFETCH)) || length == 0)
		return false;
	/* A dead connection: the daemon's word no longer counts. (A device
	 * loss marked the MRs on it invalid before the daemon said so.) Nor
	 * does a retired table's, or the table of an odpd that crashed (a
	 * RestartEvent came), whatever its words say: the next call opens a
	 * new one. */
	if (atomic_load(&c->dead) || hit_retired(c))
		return false;
	h = ref_find(c, a, length, q->access, q->kind);
	if (h && h->users == 0) {
		if (hit_claim(c, h, false) == CLAIM_VALID) {
			lazy_del(c, h);
		} else {
			h = NULL;                    /* revoked: forgotten when the daemon says */
		}
	}
	if (h) {
		h->users++;
		c->stats.local_hits++;
		*ret = (struct mr_result) {
			.handle = h->handle,
			.iova = h->iova0 + (a - h->addr0),
			.lkey = h->lkey,
			.rkey = h->rkey,
			.has_access = true,
			.access = h->access,
			.generation = h->generation,
			.cache_hit = true,
		};
		*ret_ref = h;
	}
	return h != NULL;
}

/* ---------------------------------------------------------------- new references */

int hit_add_locked(struct odpd_conn *c, struct odpd_segment *seg, void *addr, size_t length,
		   const struct mr_request *q, const struct mr_result *res, struct hit_ref **ret)
{
	struct hit_ref *h = NULL, *old;

	if (c->hit_gen && c->hit_cache && res->slot && res->slot < c->hit_slots && res->slot != c->hit_events_slot &&
	    seg && res->has_mr_range)
		h = ref_alloc_locked(c);        /* NULL: served by the daemon only */
	if (h) {
		h->seg = seg;
		h->addr0 = (uintptr_t)addr;
		h->length0 = length;
		h->iova0 = res->iova;
		/* The MR's whole range, in this process's addresses. */
		h->start = h->addr0 - (uintptr_t)(res->iova - res->mr_iova);
		h->end = h->start + res->mr_length;
		h->handle = res->handle;
		h->ticket = res->ticket;
		h->slot = res->slot;
		h->generation = res->generation;
		h->lkey = res->lkey;
		h->rkey = res->rkey;
		h->access = res->has_access ? res->access : q->access;
		h->kind = q->kind;
		h->remote = h->access & (ODPD__ACCESS__ACCESS_REMOTE_READ |
					 ODPD__ACCESS__ACCESS_REMOTE_WRITE |
					 ODPD__ACCESS__ACCESS_REMOTE_ATOMIC);
		h->users = 1;
	}
	if (res->cache_hit)
		c->stats.daemon_hits++;
	else
		c->stats.misses++;
	if (h) {
		/* The daemon reuses a slot only after we said we forgot what was in it. */
		old = c->hit_by_slot[h->slot];
		if (old)
			ref_forget(c, old);
		use_mark(c, h);
		index_add(c, h);
	}
	*ret = h;
	return 0;
}

/* ---------------------------------------------------------------- releases */

/* What to do after one user of @h let go. Caller holds the tables lock. */
enum hit_release hit_release(struct odpd_conn *c, struct hit_ref *h, bool relaxed)
{
	if (h->users > 1) {
		h->users--;
		c->stats.local_releases++;
		return HIT_RELEASE_DONE;
	}
	if (!c->hit_gen || !relaxed || !h->indexed || c->cache_max_mrs == 0 ||
	    h->end - h->start > c->cache_max_bytes || gen_load(c, h->slot) != h->ticket) {
		/* the daemon releases it; off the index first, so nobody finds it */
		index_del(c, h);
		return HIT_RELEASE_DAEMON;
	}
	h->users = 0;
	use_release(c, h);
	link_add_tail(&c->lazy, &h->lru);       /* most recent last */
	c->n_lazy++;
	c->lazy_bytes += h->end - h->start;
	c->stats.local_releases++;
	return HIT_RELEASE_DONE;
}

/* The daemon could not release @h (hit_release said HIT_RELEASE_DAEMON): it is the caller's again. */
void hit_unrelease(struct odpd_conn *c, struct hit_ref *h)
{
	tables_lock(c);
	if (!h->indexed && h->slot && c->hit_by_slot[h->slot] == NULL)
		index_add(c, h);
	tables_unlock(c);
}

/*
 * Unused references over the cache's bounds (@all: every one; @seg: every
 * one over that segment), claimed back so that the daemon cannot revoke
 * them meanwhile, for the caller to release. Returns them linked by lru.
 * Revoked ones are only forgotten. Caller holds the tables lock.
 */
static void lazy_take(struct odpd_conn *c, bool all, const struct odpd_segment *seg,
		      struct odpd_link *out)
{
	struct odpd_link *l, *tmp;

	link_for_each_safe(l, tmp, &c->lazy) {
		struct hit_ref *h = container_of(l, struct hit_ref, lru);

		if (!all && !seg && c->n_lazy <= c->cache_max_mrs && c->lazy_bytes <= c->cache_max_bytes)
			break;
		if (seg && h->seg != seg)
			continue;
		lazy_del(c, h);
		index_del(c, h);
		/* an invalidated one is still the daemon's reference: released too */
		if (hit_claim(c, h, true) != CLAIM_REVOKED) {
			link_add_tail(out, &h->lru);
		} else {
			c->stats.revoked++;
			free(h);
		}
	}
}

/* Release what lazy_take() returned, relaxed. Caller holds c->lock. */
static int lazy_release(struct odpd_conn *c, const char *what, struct odpd_link *list)
{
	struct odpd_link *l, *tmp;
	int r = 0;

	link_for_each_safe(l, tmp, list) {
		struct hit_ref *h = container_of(l, struct hit_ref, lru);
		int k = mr_deregister(c, what, h->handle, true);

		if (k < 0 && r == 0)
			r = k;
		link_del(&h->lru);
		free(h);
	}
	return r;
}

int hit_trim(struct odpd_conn *c, const char *what, bool all, const struct odpd_segment *seg)
{
	struct odpd_link list = LINK_HEAD_INIT(list);

	if (!c->hit_gen)
		return 0;
	tables_lock(c);
	lazy_take(c, all, seg, &list);
	tables_unlock(c);
	return lazy_release(c, what, &list);
}

bool hit_over(struct odpd_conn *c)
{
	bool over;

	tables_lock(c);
	over = c->n_lazy > c->cache_max_mrs || c->lazy_bytes > c->cache_max_bytes;
	tables_unlock(c);
	return over;
}

bool hit_have_lazy(struct odpd_conn *c)
{
	bool any;

	tables_lock(c);
	any = c->n_lazy > 0;
	tables_unlock(c);
	return any;
}

/* ---------------------------------------------------------------- every request */

void hit_before_request(struct odpd_conn *c, Odpd__Request *req)
{
	uint64_t seen;

	if (!c->hit_gen)
		return;
	seen = gen_load(c, 0);
	tables_lock(c);
	if (seen != c->revocations_seen) {
		struct odpd_link *l, *tmp;

		/* Forget every reference the daemon took back: only unused ones
		 * can be. Then it may give their slots out again. */
		link_for_each_safe(l, tmp, &c->lazy) {
			struct hit_ref *h = container_of(l, struct hit_ref, lru);
			uint64_t g = gen_load(c, h->slot) & ~(HIT_INVALID | HIT_REVOKING);

			if (g != h->ticket) {
				c->stats.revoked++;
				ref_forget(c, h);
			}
		}
		c->revocations_seen = seen;
	}
	req->has_revocations_seen = req->has_local_hits = true;
	req->revocations_seen = c->revocations_seen;
	req->local_hits = c->stats.local_hits;
	tables_unlock(c);
}

bool hit_retired(const struct odpd_conn *c)
{
	/* The flag does not wait for the new odpd to have written the word. */
	return c->hit_gen && (atomic_load_explicit(&c->hit_stale, memory_order_relaxed) ||
			      (c->hit_events_slot && gen_load(c, c->hit_events_slot) == HIT_RETIRED));
}

int hit_retire(struct odpd_conn *c, const char *what)
{
	struct odpd_link keep = LINK_HEAD_INIT(keep), *l, *tmp;

	tables_lock(c);
	link_for_each_safe(l, tmp, &c->hit_refs) {
		struct hit_ref *h = container_of(l, struct hit_ref, link);
		uint64_t g = gen_load(c, h->slot) & ~(HIT_INVALID | HIT_REVOKING);

		index_del(c, h);
		if (h->users > 0) {
			h->slot = 0;             /* in use: its release goes to the daemon */
			continue;
		}
		lazy_del(c, h);
		if (g == h->ticket) {
			link_add_tail(&keep, &h->lru);   /* still the daemon's: released below */
		} else {
			c->stats.revoked++;      /* taken back at the daemon's stop */
			free(h);
		}
	}
	munmap((void *)c->hit_gen, c->hit_gen_len);
	munmap(c->hit_use, c->hit_len);
	c->hit_gen = NULL;
	c->hit_use = NULL;
	c->hit_events_slot = 0;
	c->hit_ring = 0;
	c->revocations_seen = 0;
	atomic_store(&c->hit_stale, false);  /* it was about this table */
	free(c->hit_buckets);
	free(c->hit_by_slot);
	c->hit_buckets = NULL;
	c->hit_by_slot = NULL;
	tables_unlock(c);
	lazy_release(c, what, &keep);        /* (relaxed: odpd's cache keeps them) */
	return hit_open(c);
}

bool hit_ring_push(struct odpd_conn *c, uint64_t handle)
{
	uint64_t taken;

	if (!c->hit_gen || !c->hit_ring || hit_retired(c))
		return false;
	/* Acquire: pairs with odpd's release store of its count, made after
	 * it read the entries (daemon/hittab.c, odpd_hittab_ring_take). */
	taken = atomic_load_explicit(&c->hit_gen[c->hit_slots], memory_order_acquire);
	if (c->ring_tail - taken >= c->hit_ring)
		return false;                    /* full: odpd has not taken them yet */
	atomic_store_explicit(&c->hit_use[c->hit_slots + 1 + c->ring_tail % c->hit_ring], handle,
			      memory_order_relaxed);
	c->ring_tail++;
	/* Release: odpd that sees the count sees the entry. */
	atomic_store_explicit(&c->hit_use[c->hit_slots], c->ring_tail, memory_order_release);
	return true;
}

unsigned hit_ring_untaken(const struct odpd_conn *c, uint64_t *handles)
{
	uint64_t taken, n;

	if (!c->hit_gen || !c->hit_ring)
		return 0;
	/* Acquire: as in hit_ring_push. The odpd that retired the table
	 * takes nothing more from it. */
	taken = atomic_load_explicit(&c->hit_gen[c->hit_slots], memory_order_acquire);
	n = c->ring_tail - taken;
	if (n > c->hit_ring)
		return 0;                        /* (never: odpd's count is ours or behind) */
	for (uint64_t i = 0; i < n; i++)
		handles[i] = atomic_load_explicit(&c->hit_use[c->hit_slots + 1 + (taken + i) % c->hit_ring],
						  memory_order_relaxed);
	return (unsigned)n;
}

bool hit_events_all_received(const struct odpd_conn *c)
{
	/* Acquire: pairs with the daemon's release store of the word, made
	 * before it sends the event (daemon/hittab.h). */
	return c->hit_gen && c->hit_events_slot &&
	       gen_load(c, c->hit_events_slot) == c->events_received;
}

/* One user of @h is gone with its connection (odpd_disconnect). */
void hit_drop_user(struct odpd_conn *c, struct hit_ref *h)
{
	if (--h->users > 0)
		return;
	index_del(c, h);
	ref_free_locked(c, h);
}

/* ---------------------------------------------------------------- teardown */

static void hit_forget_all(struct odpd_conn *c)
{
	struct odpd_link *l, *tmp;

	link_for_each_safe(l, tmp, &c->hit_refs)
		ref_forget(c, container_of(l, struct hit_ref, link));
	link_for_each_safe(l, tmp, &c->lazy) {
		link_del(l);
		free(container_of(l, struct hit_ref, lru));
	}
	c->n_lazy = 0;
	c->lazy_bytes = 0;
	while ((l = spares_take(&c->spare_refs)))
		free(container_of(l, struct hit_ref, lru));
}

void hit_close(struct odpd_conn *c)
{
	hit_forget_all(c);
	if (c->hit_gen)
		munmap((void *)c->hit_gen, c->hit_gen_len);
	if (c->hit_use)
		munmap((void *)c->hit_use, c->hit_len);
	c->hit_gen = NULL;
	c->hit_use = NULL;
	c->hit_events_slot = 0;
	c->hit_ring = 0;
	free(c->hit_buckets);
	free(c->hit_by_slot);
	c->hit_buckets = NULL;
	c->hit_by_slot = NULL;
}

/* After fork: the tables are not mapped in the child (MADV_DONTFORK). */
void hit_fork_child(struct odpd_conn *c)
{
	c->hit_gen = NULL;
	c->hit_use = NULL;
	c->hit_events_slot = 0;
	c->hit_ring = 0;
}

/* ---------------------------------------------------------------- odpd_stats */

_public_ int odpd_stats(const struct odpd_conn *conn, struct odpd_stats *stats, size_t stats_size)
{
	struct odpd_conn *c = (struct odpd_conn *)conn;
	struct odpd_stats s;

	errmsg_clear();
	if (!conn || !stats || stats_size < ODPD_STATS_SIZE_1_3)
		return public_int(errmsg_set(-EINVAL, "odpd_stats: %s", !conn ? "no connection" :
					     !stats ? "stats is NULL" :
					     "stats_size is smaller than struct odpd_stats's first version"));
	tables_lock(c);
	s = c->stats;
	s.cached_mrs = c->n_lazy;
	s.cached_bytes = c->lazy_bytes;
	s.hit_table = c->hit_gen != NULL && c->hit_cache;   /* (a table for the ring alone: no) */
	tables_unlock(c);
	public_copy_out(stats, stats_size, &s, sizeof(s));
	return 0;
}
