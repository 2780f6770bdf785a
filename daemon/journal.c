/* SPDX-License-Identifier: MIT */
/*
 * The journal (journal.h, doc/design.md §12): records of what changed,
 * appended to a memfd that systemd's fd store keeps, and committed before
 * any reply leaves.
 *
 * The memfd: a header, then records. A record is its length and a CRC-32
 * (zlib's) of its bytes, then a packed odpd_state.Record. The header's
 * committed length is stored (release) after the record is complete: a
 * crash mid-record leaves it past the committed length, where the next
 * odpd does not read. No fsync: the memfd's pages outlive the process, not
 * the machine.
 *
 * A record is built as changes happen, already packed: protobuf's repeated
 * fields are a sequence of (tag, bytes), so each change appends one field
 * (the object's message as it is then). MRs change several times within a
 * request (state, charges): they are marked and written once, at the commit.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <event2/event.h>
#include <infiniband/verbs.h>

#include "domain.h"
#include "fdstore.h"
#include "handler.h"
#include "journal.h"
#include "keep.h"
#include "log.h"
#include "manager.h"
#include "registry.h"
#include "segment.h"

#define JOURNAL_MAGIC "ODPDJNL1"
#define JOURNAL_FORMAT 1u
#define JOURNAL_MAP (1ull << 30)            /* bytes of the memfd at most (sparse) */
#define JOURNAL_COMPACT_MIN (4u << 20)      /* rewritten past max(this, 2 x its snapshot) */
#define RECORD_HEAD 8u

struct journal_header {
	char magic[8];
	uint32_t format;
	uint32_t reserved;
	uint64_t epoch;
	_Atomic uint64_t committed;         /* bytes from the start that hold complete records */
};

struct buf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
};

struct journal {
	struct odpd_manager *m;
	odpd_state_build_fn *build;
	int fd;
	uint8_t *map;
	struct journal_header *hdr;
	uint64_t epoch;
	size_t len;                         /* committed */
	size_t snapshot_len;
	struct buf pend;                    /* the record being built */
	struct odpd_mr **dirty;             /* MRs to write at the commit (NULL: freed since) */
	size_t n_dirty, cap_dirty;
	uint32_t next_mapping;
	bool failed;                        /* a commit could not be written: off from then on */
	/* What it cost (logged at the stop: its CPU time on the loop) */
	uint64_t n_commits, commit_bytes, commit_ns, n_rewrites, rewrite_ns;
	struct event *ev_commit;            /* a change no answer follows: committed on the next turn */
	bool commit_armed;
};

static struct journal *J;

/* Something changed: committed before the next answer, or at the loop's
 * next turn if none comes (a timer's revocation or expiry, a disconnect, a
 * deregistration done: a client may see those without an answer). */
static void want_commit(void)
{
	if (J && J->ev_commit && !J->commit_armed) {
		J->commit_armed = true;
		event_active(J->ev_commit, 0, 0);
	}
}

static void on_commit_event(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	J->commit_armed = false;
	odpd_journal_commit(NULL, 0, NULL, 0, false);
}

bool odpd_journal_on(void)
{
	return J != NULL;
}

/* ---------------------------------------------------------------- packing */

static bool buf_room(struct buf *b, size_t n)
{
	uint8_t *p;
	size_t cap;

	if (b->oom)
		return false;
	if (b->len + n <= b->cap)
		return true;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + n)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static void put_varint(struct buf *b, uint64_t v)
{
	if (!buf_room(b, 10))
		return;
	while (v >= 0x80) {
		b->p[b->len++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	b->p[b->len++] = (uint8_t)v;
}

static void put_u64(struct buf *b, unsigned field, uint64_t v)
{
	want_commit();
	put_varint(b, (uint64_t)field << 3);
	put_varint(b, v);
}

static void put_bytes(struct buf *b, unsigned field, const void *p, size_t n)
{
	want_commit();
	put_varint(b, (uint64_t)field << 3 | 2);
	put_varint(b, n);
	if (buf_room(b, n)) {
		memcpy(b->p + b->len, p, n);
		b->len += n;
	}
}

static void put_msg(struct buf *b, unsigned field, const ProtobufCMessage *msg)
{
	size_t n = protobuf_c_message_get_packed_size(msg);

	want_commit();
	put_varint(b, (uint64_t)field << 3 | 2);
	put_varint(b, n);
	if (buf_room(b, n)) {
		protobuf_c_message_pack(msg, b->p + b->len);
		b->len += n;
	}
}

static void put_key(struct buf *b, unsigned field, uint64_t client, uint64_t handle)
{
	OdpdState__Key k = ODPD_STATE__KEY__INIT;

	k.client = client;
	k.handle = handle;
	put_msg(b, field, &k.base);
}

/* ---------------------------------------------------------------- the fd store */

static void store_name(char *buf, size_t len, const char *kind, uint64_t id)
{
	snprintf(buf, len, "%s-%" PRIu64, kind, id);
}

static int store_put(const char *kind, uint64_t id, int fd)
{
	char name[48];
	int r;

	store_name(name, sizeof(name), kind, id);
	r = odpd_fdstore_put(name, fd);
	if (r < 0)    /* (full: fdstore.c said so once) */
		log_errno(r == -EXFULL ? LOG_DEBUG : LOG_WARNING, -r, "journal: cannot store %s in systemd's fd store",
			  name);
	return r;
}

static void store_remove(const char *kind, uint64_t id)
{
	char name[48];

	store_name(name, sizeof(name), kind, id);
	(void)odpd_fdstore_remove(name);
}

/* ---------------------------------------------------------------- the limbo */

#define LIMBO_MAGIC "ODPDLMB1"
#define LIMBO_SLOTS (1u << 21)              /* 16 MiB of memfd at most (sparse) */
#define LIMBO_FIRST 2u                      /* the header takes the first two */

_Static_assert(sizeof(struct { char m[8]; uint32_t s, r; }) <= LIMBO_FIRST * 8, "the limbo header overlaps a slot");

struct limbo_header {
	char magic[8];
	uint32_t slots;
	uint32_t reserved;
};

struct limbo {
	pthread_mutex_t lock;
	int fd;
	_Atomic uint64_t *slot;             /* jid << 32 | handle; 0: free (slots 0 and 1: the header) */
	uint32_t next;                      /* never used from here on */
	uint32_t next_domain;               /* the last domain id given (struct odpd_domain.save_id) */
	uint32_t *free_slots;
	size_t n_free, cap_free;
	bool full_said;
	uint64_t epoch;                     /* its name: limbo-EPOCH */
};

static struct limbo *_Atomic L;

static uint32_t domain_jid_locked(struct limbo *l, struct odpd_domain *d)
{
	if (!d->save_id)
		d->save_id = ++l->next_domain;
	return d->save_id;
}

/* @d's id, given now if it has none: on the loop, or on a worker (enter). */
static uint32_t domain_jid(struct odpd_domain *d)
{
	struct limbo *l = atomic_load_explicit(&L, memory_order_acquire);
	uint32_t id;

	if (!l)
		return d->save_id;
	pthread_mutex_lock(&l->lock);
	id = domain_jid_locked(l, d);
	pthread_mutex_unlock(&l->lock);
	return id;
}

/* Slot @s names @handle in @d's PD (ODPD_LIMBO_PENDING: its verb runs). */
static void slot_store_locked(struct limbo *l, uint32_t s, struct odpd_domain *d, uint32_t handle)
{
	atomic_store_explicit(&l->slot[s], (uint64_t)domain_jid_locked(l, d) << 32 | handle, memory_order_release);
}

uint32_t odpd_limbo_enter(struct odpd_domain *d, uint32_t handle)
{
	struct limbo *l = atomic_load_explicit(&L, memory_order_acquire);
	uint32_t s = 0;

	if (!l || !d)
		return 0;
	pthread_mutex_lock(&l->lock);
	if (l->n_free)
		s = l->free_slots[--l->n_free];
	else if (l->next < LIMBO_SLOTS)
		s = l->next++;
	if (s) {
		slot_store_locked(l, s, d, handle);
	} else if (!l->full_said) {
		l->full_said = true;
		log_warning("journal: more than %u MRs: those beyond are not tracked, and one whose "
			    "registration is in flight at a crash stays until its PD closes", LIMBO_SLOTS - LIMBO_FIRST);
	}
	pthread_mutex_unlock(&l->lock);
	return s;
}

void odpd_limbo_set(uint32_t s, struct odpd_domain *d, uint32_t handle)
{
	struct limbo *l = atomic_load_explicit(&L, memory_order_acquire);

	if (!l || !s || !d)
		return;
	pthread_mutex_lock(&l->lock);
	slot_store_locked(l, s, d, handle);
	pthread_mutex_unlock(&l->lock);
}

void odpd_limbo_leave(uint32_t s)
{
	struct limbo *l = atomic_load_explicit(&L, memory_order_acquire);

	if (!l || !s)
		return;
	pthread_mutex_lock(&l->lock);
	atomic_store_explicit(&l->slot[s], 0, memory_order_release);
	if (l->n_free == l->cap_free) {
		size_t cap = l->cap_free ? l->cap_free * 2 : 1024;
		uint32_t *a = realloc(l->free_slots, cap * sizeof(*a));

		if (a) {
			l->free_slots = a;
			l->cap_free = cap;
		}
	}
	if (l->n_free < l->cap_free)
		l->free_slots[l->n_free++] = s;  /* (else lost: one slot fewer) */
	pthread_mutex_unlock(&l->lock);
}

int odpd_journal_prepare(uint64_t epoch, uint32_t max_domain)
{
	struct limbo *l;
	struct limbo_header *h;
	void *map;
	int r;

	if (atomic_load(&L))
		return 0;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->epoch = epoch;
	l->fd = memfd_create("odpd-limbo", MFD_CLOEXEC);
	if (l->fd < 0 || ftruncate(l->fd, (off_t)LIMBO_SLOTS * 8) < 0) {
		r = -errno;
		goto fail;
	}
	map = mmap(NULL, (size_t)LIMBO_SLOTS * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, l->fd, 0);
	if (map == MAP_FAILED) {
		r = -errno;
		goto fail;
	}
	(void)madvise(map, (size_t)LIMBO_SLOTS * 8, MADV_DONTDUMP);
	h = map;
	memcpy(h->magic, LIMBO_MAGIC, 8);
	h->slots = LIMBO_SLOTS;
	l->slot = map;
	l->next = LIMBO_FIRST;
	l->next_domain = max_domain;
	pthread_mutex_init(&l->lock, NULL);
	r = store_put("limbo", epoch, l->fd);
	if (r < 0) {
		munmap(map, (size_t)LIMBO_SLOTS * 8);
		goto fail;
	}
	atomic_store_explicit(&L, l, memory_order_release);
	return 0;
fail:
	if (l->fd >= 0)
		close(l->fd);
	free(l);
	return r;
}

/* Off: out of the store and freed. Only where no worker runs: at start, or
 * once the pool is gone (odpd_manager_finish). */
static void limbo_close(void)
{
	struct limbo *l = atomic_exchange(&L, NULL);

	if (!l)
		return;
	store_remove("limbo", l->epoch);
	munmap((void *)l->slot, (size_t)LIMBO_SLOTS * 8);
	close(l->fd);
	pthread_mutex_destroy(&l->lock);
	free(l->free_slots);
	free(l);
}

bool odpd_journal_owns(const char *name)
{
	struct limbo *l = atomic_load(&L);
	char buf[48];

	if (l) {
		store_name(buf, sizeof(buf), "limbo", l->epoch);
		if (strcmp(name, buf) == 0)
			return true;
	}
	if (J) {
		store_name(buf, sizeof(buf), "journal", J->epoch);
		if (strcmp(name, buf) == 0)
			return true;
	}
	return false;
}

int odpd_limbo_read(int fd, uint64_t **ret, size_t *ret_n)
{
	struct limbo_header h;
	struct stat sb;
	uint64_t buf[8192], *out = NULL;
	size_t n = 0, cap = 0;
	off_t end, off;

	*ret = NULL;
	*ret_n = 0;
	if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < sizeof(h) || pread(fd, &h, sizeof(h), 0) != sizeof(h) ||
	    memcmp(h.magic, LIMBO_MAGIC, 8) != 0 || (uint64_t)h.slots * 8 > (uint64_t)sb.st_size)
		return -EINVAL;
	end = (off_t)h.slots * 8;
	/* Its written parts only (a mapping would fault the holes in: 16 MiB) */
	for (off = LIMBO_FIRST * 8; off < end;) {
		off_t data = lseek(fd, off, SEEK_DATA), hole;
		ssize_t got;

		if (data < 0 || data >= end)
			break;                       /* (ENXIO: no data after off) */
		hole = lseek(fd, data, SEEK_HOLE);
		if (hole < 0 || hole > end)
			hole = end;
		data &= ~(off_t)7;
		for (off = data; off < hole; off += got) {
			size_t want = (size_t)(hole - off) < sizeof(buf) ? (size_t)(hole - off) : sizeof(buf);

			got = pread(fd, buf, want, off);
			if (got <= 0 || got % 8) {
				free(out);
				return got < 0 ? -errno : -EIO;
			}
			for (size_t i = 0; i < (size_t)got / 8; i++) {
				if (!buf[i] || off + (off_t)i * 8 < (off_t)LIMBO_FIRST * 8)
					continue;
				if (n == cap) {
					uint64_t *a = realloc(out, (cap = cap ? cap * 2 : 256) * sizeof(*a));

					if (!a) {
						free(out);
						return -ENOMEM;
					}
					out = a;
				}
				out[n++] = buf[i];
			}
		}
	}
	*ret = out;
	*ret_n = n;
	return 0;
}

/* ---------------------------------------------------------------- records */

static void put_domain(struct odpd_domain *d)
{
	OdpdState__Domain pd = ODPD_STATE__DOMAIN__INIT;
	char fd[48];

	store_name(fd, sizeof(fd), "ctx", d->save_id);
	pd.id = d->save_id;
	pd.dev_index = d->dev_index;
	pd.shared = d->spd ? d->spd->name : NULL;
	pd.has_owner = pd.has_pd_handle = pd.has_exported = 1;
	pd.owner = d->owner_id;
	pd.pd_handle = d->pd->handle;
	pd.exported = d->exported;
	pd.fd = fd;
	put_msg(&J->pend, 6, &pd.base);
}

uint32_t odpd_journal_domain_id(struct odpd_domain *d)
{
	if (!J || d->jstored || !d->ctx || !d->pd || d->retired)
		return d->jstored ? d->save_id : 0;
	if (!domain_jid(d) || store_put("ctx", d->save_id, d->ctx->cmd_fd) < 0)
		return 0;
	d->jstored = true;
	put_domain(d);
	return d->save_id;
}

uint32_t odpd_journal_mapping_id(struct odpd_mapping *map)
{
	OdpdState__Mapping pm = ODPD_STATE__MAPPING__INIT;
	char fd[48];

	if (!J || map->save_id)
		return map->save_id;
	/* its id only once stored: one refused (a full store) is asked
	 * again next time, and is never named in the state meanwhile */
	if (store_put("seg", J->next_mapping + 1, map->fd) < 0)
		return 0;
	map->save_id = ++J->next_mapping;
	store_name(fd, sizeof(fd), "seg", map->save_id);
	pm.id = map->save_id;
	pm.fd = fd;
	pm.addr = (uintptr_t)map->addr;
	pm.has_in_window = 1;
	pm.in_window = map->in_window;
	put_msg(&J->pend, 8, &pm.base);
	return map->save_id;
}

int odpd_journal_fill_mr(OdpdState__Mr *pm, const struct odpd_mr *mr)
{
	unsigned n = 0;

	odpd_state__mr__init(pm);
	pm->id = mr->node.seq;
	pm->domain = mr->dom->save_id;
	pm->mapping = mr->map->save_id;
	pm->start = mr->node.start;
	pm->end = mr->node.end;
	pm->iova = mr->iova;
	pm->has_access = 1;
	pm->access = mr->access;
	pm->handle = mr->mr->handle;
	pm->has_lkey = pm->has_rkey = 1;
	pm->lkey = mr->mr->lkey;
	pm->rkey = mr->mr->rkey;
	pm->has_relaxed = 1;
	pm->relaxed = mr->state == ODPD_MR_RELAXED;
	if (pm->relaxed) {
		pm->has_relaxed_by = pm->has_relaxed_pid = pm->has_relaxed_ms = 1;
		pm->relaxed_by = mr->relaxed_by;
		pm->relaxed_pid = mr->relaxed_pid;
		pm->relaxed_ms = mr->relaxed_ms;
	}
	pm->has_ctime_ns = pm->has_ctime_ok = pm->has_owner = pm->has_cached = pm->has_invalidated = 1;
	pm->ctime_ns = mr->ctime_ns;
	pm->ctime_ok = mr->ctime_ok;
	pm->owner = mr->owner_id;
	pm->cached = mr->cached;
	pm->invalidated = mr->invalidated;
	for (const struct odpd_charge *c = odpd_mr_first_charge(mr); c; c = c->next)
		n++;
	if (!n)
		return 0;
	pm->charges = calloc(n, sizeof(*pm->charges) + sizeof(OdpdState__Charge));
	if (!pm->charges)
		return -ENOMEM;
	{
		OdpdState__Charge *each = (OdpdState__Charge *)(pm->charges + n);

		for (const struct odpd_charge *c = odpd_mr_first_charge(mr); c; c = c->next) {
			OdpdState__Charge *pc = &each[pm->n_charges];

			odpd_state__charge__init(pc);
			pc->uid = c->acct->uid;
			pc->has_refs = 1;
			pc->refs = c->refs;
			pm->charges[pm->n_charges++] = pc;
		}
	}
	return 0;
}

void odpd_journal_mr_clear(OdpdState__Mr *pm)
{
	free(pm->charges);                   /* (one block: the pointers, then the charges) */
	pm->charges = NULL;
	pm->n_charges = 0;
}

/* A pinned MR of odpd's PDs, live or relaxed: what a crash keeps. (Not
 * odpd_registry_mr_keepable: an MR a verify reads through is kept, only a
 * stop waits for the verify.) */
bool odpd_journal_mr_kept(const struct odpd_mr *mr)
{
	return (mr->state == ODPD_MR_LIVE || mr->state == ODPD_MR_RELAXED) && mr->pinned && !mr->implicit &&
	       mr->mr && mr->dom && mr->map;
}

static void write_mr(struct odpd_mr *mr)
{
	OdpdState__Mr pm;

	if (!odpd_journal_mr_kept(mr) || !odpd_journal_domain_id(mr->dom) || !odpd_journal_mapping_id(mr->map)) {
		put_u64(&J->pend, 13, mr->node.seq);
		return;
	}
	if (odpd_journal_fill_mr(&pm, mr) < 0) {
		J->pend.oom = true;
		return;
	}
	put_msg(&J->pend, 12, &pm.base);
	odpd_journal_mr_clear(&pm);
}

/* keep.h's hooks */

static void on_mr(void *ctx, struct odpd_mr *mr)
{
	(void)ctx;
	if (mr->jdirty)
		return;
	if (J->n_dirty == J->cap_dirty) {
		size_t cap = J->cap_dirty ? J->cap_dirty * 2 : 64;
		struct odpd_mr **a = realloc(J->dirty, cap * sizeof(*a));

		if (!a) {
			J->pend.oom = true;
			return;
		}
		J->dirty = a;
		J->cap_dirty = cap;
	}
	J->dirty[J->n_dirty++] = mr;
	mr->jdirty = 1;
	want_commit();
}

static void on_mr_free(void *ctx, struct odpd_mr *mr)
{
	(void)ctx;
	if (mr->jdirty) {
		for (size_t i = J->n_dirty; i-- > 0;)
			if (J->dirty[i] == mr) {
				J->dirty[i] = NULL;
				break;
			}
		mr->jdirty = 0;
	}
	put_u64(&J->pend, 13, mr->node.seq);
}

static void on_ref(void *ctx, uint64_t holder, const struct odpd_ref *ref, bool gone)
{
	OdpdState__ClientRef cr = ODPD_STATE__CLIENT_REF__INIT;
	OdpdState__Ref pr = ODPD_STATE__REF__INIT;
	const struct odpd_cseg *seg = ref->cookie;

	(void)ctx;
	if (gone) {
		put_key(&J->pend, 17, holder, ref->handle);
		return;
	}
	pr.mr = ref->mr->node.seq;
	pr.handle = ref->handle;
	pr.has_iova = pr.has_length = pr.has_segment = 1;
	pr.iova = ref->iova;
	pr.length = ref->length;
	pr.segment = seg ? seg->handle : 0;
	cr.client = holder;
	cr.ref = &pr;
	put_msg(&J->pend, 16, &cr.base);
}

static void on_domain(void *ctx, struct odpd_domain *d)
{
	(void)ctx;
	if (!d->jstored)
		(void)odpd_journal_domain_id(d);
	else
		put_domain(d);
}

static void on_domain_gone(void *ctx, struct odpd_domain *d)
{
	(void)ctx;
	if (!d->jstored)
		return;
	d->jstored = false;
	put_u64(&J->pend, 7, d->save_id);
	store_remove("ctx", d->save_id);
}

static void on_mapping_gone(void *ctx, struct odpd_mapping *map)
{
	(void)ctx;
	if (!map->save_id)
		return;
	put_u64(&J->pend, 9, map->save_id);
	store_remove("seg", map->save_id);
}

static void on_shared_gone(void *ctx, const char *name)
{
	(void)ctx;
	put_bytes(&J->pend, 5, name, strlen(name));
}

static uint32_t on_limbo_enter(void *ctx, struct odpd_domain *d, uint32_t handle)
{
	(void)ctx;
	return odpd_limbo_enter(d, handle);
}

static void on_limbo_set(void *ctx, uint32_t slot, struct odpd_domain *d, uint32_t handle)
{
	(void)ctx;
	odpd_limbo_set(slot, d, handle);
}

static void on_limbo_leave(void *ctx, uint32_t slot)
{
	(void)ctx;
	odpd_limbo_leave(slot);
}

static const struct odpd_keep hooks = {
	.mr = on_mr,
	.mr_free = on_mr_free,
	.ref = on_ref,
	.domain = on_domain,
	.domain_gone = on_domain_gone,
	.mapping_gone = on_mapping_gone,
	.shared_gone = on_shared_gone,
	.limbo_enter = on_limbo_enter,
	.limbo_set = on_limbo_set,
	.limbo_leave = on_limbo_leave,
};

/* connections and their segments */

static void put_client(const struct odpd_keep_client *c, uint64_t id, const void *data, size_t len)
{
	OdpdState__Client pc = ODPD_STATE__CLIENT__INIT;
	char fd[48];

	store_name(fd, sizeof(fd), "conn", c->id);
	pc.id = c->id;
	pc.fd = fd;
	pc.name = (char *)c->name;
	pc.shared = (char *)c->shared;
	pc.has_registered = pc.has_next_handle = pc.has_local_hits = pc.has_events = pc.has_starttime = 1;
	pc.registered = c->registered;
	pc.next_handle = c->next_handle;
	pc.local_hits = c->local_hits;
	pc.events = c->events;
	pc.starttime = c->starttime;
	pc.unkeepable = (char *)c->unkeepable;
	pc.has_hit_slots = c->hit_slots != 0;
	pc.hit_slots = c->hit_slots;
	if (!id && c->last_id) {            /* an event's: the last request's stays */
		id = c->last_id;
		data = c->last_reply;
		len = c->last_len;
	}
	if (id) {
		pc.has_last_id = 1;
		pc.last_id = id;
		if (data) {
			pc.has_last_reply = 1;
			pc.last_reply.data = (uint8_t *)data;
			pc.last_reply.len = len;
		}
	}
	put_msg(&J->pend, 10, &pc.base);
}

bool odpd_journal_client_new(const struct odpd_keep_client *c, int fd)
{
	if (!J || store_put("conn", c->id, fd) < 0)
		return false;
	put_client(c, 0, NULL, 0);
	return true;
}

void odpd_journal_client_hits(uint64_t id, int fd)
{
	if (J)
		(void)store_put("hit", id, fd);
}

void odpd_journal_client_gone(uint64_t id, bool had_hits)
{
	if (!J)
		return;
	store_remove("conn", id);
	if (had_hits)
		store_remove("hit", id);
	put_u64(&J->pend, 11, id);
}

void odpd_journal_segment(uint64_t client, const struct odpd_cseg *s)
{
	OdpdState__ClientSegment cs = ODPD_STATE__CLIENT_SEGMENT__INIT;
	OdpdState__Segment ps = ODPD_STATE__SEGMENT__INIT;

	if (!J)
		return;
	ps.handle = s->handle;
	ps.mapping = odpd_journal_mapping_id(s->map);
	ps.has_client_addr = ps.has_file_offset = ps.has_length = ps.has_writable = ps.has_charged = 1;
	ps.client_addr = s->client_addr;
	ps.file_offset = s->file_offset;
	ps.length = s->length;
	ps.writable = s->writable;
	ps.charged = s->charged;
	cs.client = client;
	cs.segment = &ps;
	put_msg(&J->pend, 14, &cs.base);
}

void odpd_journal_segment_gone(uint64_t client, uint64_t handle)
{
	if (J)
		put_key(&J->pend, 15, client, handle);
}

static void split_record(void);

void odpd_journal_shared(const char *name, uint32_t creator_uid)
{
	OdpdState__SharedPd ps = ODPD_STATE__SHARED_PD__INIT;

	if (!J)
		return;
	/* A name is the one key used again: freed (its last member left) and
	 * made again before one commit. The fold reads a record's removals
	 * after its additions, so the removal goes in a record of its own. */
	split_record();
	ps.name = (char *)name;
	ps.has_creator_uid = 1;
	ps.creator_uid = creator_uid;
	put_msg(&J->pend, 4, &ps.base);
}

/* ---------------------------------------------------------------- commits */

bool odpd_journal_pending(void)
{
	return J && (J->pend.len || J->n_dirty);
}

/* Append @len bytes of record @p and publish them. */
static int append(const uint8_t *p, size_t len)
{
	uint8_t *at;
	uint32_t head[2];

	if (J->len + RECORD_HEAD + len > JOURNAL_MAP)
		return -ENOSPC;
	at = J->map + J->len;
	head[0] = (uint32_t)len;
	head[1] = (uint32_t)crc32(0, p, (uInt)len);
	memcpy(at, head, RECORD_HEAD);
	memcpy(at + RECORD_HEAD, p, len);
	J->len += RECORD_HEAD + len;
	atomic_store_explicit(&J->hdr->committed, J->len, memory_order_release);
	return 0;
}

/* What is pending so far as a record of its own (dirty MRs stay for the
 * commit): the fold reads each record's additions before its removals. */
static void split_record(void)
{
	if (J->failed || J->pend.oom || !J->pend.len)
		return;
	if (append(J->pend.p, J->pend.len) == 0)   /* (else full: the commit compacts) */
		J->pend.len = 0;
}

/* What is pending, dropped (the MRs marked dirty unmarked). */
static void discard_pending(void)
{
	for (size_t i = 0; i < J->n_dirty; i++)
		if (J->dirty[i])
			J->dirty[i]->jdirty = 0;
	J->n_dirty = 0;
	J->pend.len = 0;
	J->pend.oom = false;
}

/* A journal that misses a change must not be read after a crash: out of the
 * store with it (the next odpd then drops everything, cleanly). A stop's
 * hand-over writes a new one. */
static void journal_fail(const char *why, int r)
{
	log_errno(LOG_ERR, -r, "journal: %s: from now on a crash of odpd drops every MR (a restart "
		  "still keeps them)", why);
	J->failed = true;
	store_remove("journal", J->epoch);
	discard_pending();
}

static int compact(void);

static uint64_t thread_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void commit(const struct odpd_keep_client *c, uint64_t id, const void *data, size_t len, bool has_fd);

void odpd_journal_commit(const struct odpd_keep_client *c, uint64_t id, const void *data, size_t len,
			 bool has_fd)
{
	uint64_t t0, before, rw0;

	if (!J || !odpd_journal_pending())
		return;
	if (J->failed) {
		discard_pending();               /* (else it grew for as long as odpd runs) */
		return;
	}
	t0 = thread_ns();
	before = J->len;
	rw0 = J->rewrite_ns;
	commit(c, id, data, len, has_fd);
	if (!J->failed) {
		J->n_commits++;
		J->commit_bytes += J->len > before ? J->len - before : 0;
		J->commit_ns += thread_ns() - t0 - (J->rewrite_ns - rw0);   /* (a rewrite apart) */
	}
}

static void commit(const struct odpd_keep_client *c, uint64_t id, const void *data, size_t len, bool has_fd)
{
	int r;

	for (size_t i = 0; i < J->n_dirty; i++)
		if (J->dirty[i]) {
			J->dirty[i]->jdirty = 0;
			write_mr(J->dirty[i]);
		}
	J->n_dirty = 0;
	if (c)
		put_client(c, id, has_fd || !id ? NULL : data, len);
	/* the ticket counter: tickets and generations never go back */
	if (J->m)                            /* (unit tests have none) */
		put_u64(&J->pend, 3, J->m->registry.generation);
	if (J->pend.oom) {
		journal_fail("out of memory for a record", -ENOMEM);
		return;
	}
	r = append(J->pend.p, J->pend.len);
	J->pend.len = 0;
	if (r < 0 || J->len > JOURNAL_COMPACT_MIN + 2 * J->snapshot_len) {
		r = compact();
		if (r < 0) {
			journal_fail("cannot rewrite the journal", r);
			return;
		}
		/* The snapshot has every effect, not the answer that goes now. */
		J->pend.len = 0;
		if (c) {
			put_client(c, id, has_fd || !id ? NULL : data, len);
			r = J->pend.oom ? -ENOMEM : append(J->pend.p, J->pend.len);
			J->pend.len = 0;
			if (r < 0)
				journal_fail("cannot write a record", r);
		}
	}
}

/* ---------------------------------------------------------------- journal memfds */

static int journal_open(uint64_t epoch, int *ret_fd, uint8_t **ret_map)
{
	struct journal_header *h;
	uint8_t *map;
	int fd = memfd_create("odpd-journal", MFD_CLOEXEC);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)JOURNAL_MAP) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	map = mmap(NULL, JOURNAL_MAP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (map == MAP_FAILED) {
		int e = errno;

		close(fd);
		return -e;
	}
	(void)madvise(map, JOURNAL_MAP, MADV_DONTDUMP);
	h = (struct journal_header *)map;
	memcpy(h->magic, JOURNAL_MAGIC, 8);
	h->format = JOURNAL_FORMAT;
	h->epoch = epoch;
	atomic_store_explicit(&h->committed, sizeof(*h), memory_order_release);
	*ret_fd = fd;
	*ret_map = map;
	return 0;
}

/*
 * A new journal memfd holding @st (a snapshot; @clean: a hand-over's),
 * stored as journal-(epoch + 1); the old one removed from the store and
 * unmapped. The old stays in use if anything fails.
 */
static int rewrite(const OdpdState__State *st, bool clean)
{
	OdpdState__Record rec = ODPD_STATE__RECORD__INIT;
	size_t len, old_len = J->len;
	uint8_t *p, *map = NULL, *old_map = J->map;
	int fd = -1, r, old_fd = J->fd;
	uint64_t old_epoch = J->epoch;

	rec.snapshot = (OdpdState__State *)st;
	rec.has_clean = clean;
	rec.clean = clean;
	len = odpd_state__record__get_packed_size(&rec);
	p = malloc(len ? len : 1);
	if (!p)
		return -ENOMEM;
	odpd_state__record__pack(&rec, p);
	r = journal_open(old_epoch + 1, &fd, &map);
	if (r < 0) {
		free(p);
		return r;
	}
	J->fd = fd;
	J->map = map;
	J->hdr = (struct journal_header *)map;
	J->len = sizeof(struct journal_header);
	J->epoch = old_epoch + 1;
	r = append(p, len);
	free(p);
	if (r >= 0)
		r = store_put("journal", J->epoch, fd);
	if (r < 0) {
		munmap(map, JOURNAL_MAP);
		close(fd);
		J->fd = old_fd;
		J->map = old_map;
		J->hdr = (struct journal_header *)old_map;
		J->len = old_len;
		J->epoch = old_epoch;
		return r;
	}
	J->snapshot_len = len;
	if (old_map) {
		store_remove("journal", old_epoch);
		munmap(old_map, JOURNAL_MAP);
		close(old_fd);
	}
	return 0;
}

static int snapshot(bool clean, const OdpdState__State *given)
{
	OdpdState__State st = ODPD_STATE__STATE__INIT;
	int r;

	if (given)
		return rewrite(given, clean);
	r = J->build(J->m, &st, false);
	if (r >= 0)
		r = rewrite(&st, clean);
	odpd_journal_state_free_built(&st);
	return r;
}

static int compact(void)
{
	uint64_t t0 = thread_ns();
	int r;

	/* What the record being built says is in the snapshot too. */
	J->pend.len = 0;
	r = snapshot(false, NULL);
	J->n_rewrites++;
	J->rewrite_ns += thread_ns() - t0;
	if (r >= 0)
		log_info("journal: rewritten as journal-%" PRIu64 " (%zu bytes of snapshot) in %" PRIu64 " us",
			 J->epoch, J->snapshot_len, (thread_ns() - t0) / 1000);
	return r;
}

/* What the journal cost so far, in the log (at a stop). */
static void report(void)
{
	if (!J->n_commits)
		return;
	log_info("journal: %" PRIu64 " commit(s), %" PRIu64 " bytes and %" PRIu64 " ns of the loop's CPU time "
		 "each on average; %" PRIu64 " rewrite(s), %" PRIu64 " us each on average", J->n_commits,
		 J->commit_bytes / J->n_commits, J->commit_ns / J->n_commits, J->n_rewrites,
		 J->n_rewrites ? J->rewrite_ns / J->n_rewrites / 1000 : 0);
}

int odpd_journal_start(struct odpd_manager *m, odpd_state_build_fn *build, uint64_t epoch,
		       uint32_t max_domain, uint32_t max_mapping)
{
	int r;

	if (J)
		return 0;
	J = calloc(1, sizeof(*J));
	if (!J)
		return -ENOMEM;
	J->m = m;
	J->build = build;
	J->fd = -1;
	J->epoch = epoch;
	J->next_mapping = max_mapping;
	r = odpd_journal_prepare(epoch + 1, max_domain);
	if (r >= 0) {
		odpd_keep = &hooks;
		r = snapshot(false, NULL);
	}
	if (r < 0) {
		log_errno(LOG_WARNING, -r, "journal: cannot start one: a crash of odpd drops every MR");
		odpd_keep = NULL;
		limbo_close();
		free(J->pend.p);
		free(J);
		J = NULL;
		return r;
	}
	if (m)
		J->ev_commit = event_new(m->base, -1, 0, on_commit_event, NULL);
	if (odpd_journal_pending())
		want_commit();
	log_info("journal: kept in systemd's fd store (journal-%" PRIu64 ", %zu bytes of snapshot)", J->epoch,
		 J->snapshot_len);
	return 0;
}

int odpd_journal_hand_over(const OdpdState__State *st)
{
	int r;

	if (!J)
		return -ENOENT;
	report();
	r = snapshot(true, st);
	if (r >= 0) {
		J->failed = false;
		r = odpd_fdstore_sync();     /* (sd_notify_barrier: > 0 once systemd has read it all) */
	}
	return r < 0 ? r : 0;
}

void odpd_journal_stop(void)
{
	limbo_close();                       /* (also one a restore made for a journal that never started) */
	if (!J)
		return;
	report();
	odpd_keep = NULL;
	if (J->ev_commit)
		event_free(J->ev_commit);
	store_remove("journal", J->epoch);
	if (J->map)
		munmap(J->map, JOURNAL_MAP);
	if (J->fd >= 0)
		close(J->fd);
	free(J->pend.p);
	free(J->dirty);
	free(J);
	J = NULL;
}

/* ---------------------------------------------------------------- reading at start */

/* Free a state built with calloc and strdup, as protobuf-c frees what it
 * unpacked (the message itself is the caller's). */
void odpd_journal_state_free_built(OdpdState__State *st)
{
	OdpdState__State *heap = malloc(sizeof(*heap));

	if (!heap)
		return;
	*heap = *st;
	protobuf_c_message_free_unpacked(&heap->base, NULL);
	odpd_state__state__init(st);
}

/* One object as the records left it: the last message about it, or NULL
 * once removed. */
struct ent {
	uint64_t k1, k2;
	uint64_t seq;
	void *msg;
};

struct ents {
	struct ent *a;
	size_t n, cap;
};

struct fold {
	OdpdState__Record **recs;
	size_t n_recs;
	uint64_t seq;
	struct ents shared, domains, maps, clients, mrs, segs, refs;
	char **shared_names;                /* ents.shared's k1 indexes this */
	size_t n_names;
	uint64_t max_client, max_mr;        /* the highest ids named, gone ones too */
	bool oom;
};

static void ent_add(struct fold *f, struct ents *e, uint64_t k1, uint64_t k2, void *msg)
{
	if (e->n == e->cap) {
		size_t cap = e->cap ? e->cap * 2 : 64;
		struct ent *a = realloc(e->a, cap * sizeof(*a));

		if (!a) {
			f->oom = true;
			return;
		}
		e->a = a;
		e->cap = cap;
	}
	e->a[e->n++] = (struct ent){ k1, k2, ++f->seq, msg };
}

static int ent_cmp(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;

	if (x->k1 != y->k1)
		return x->k1 < y->k1 ? -1 : 1;
	if (x->k2 != y->k2)
		return x->k2 < y->k2 ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sort, and keep the last word about each key (removals dropped). */
static void ent_settle(struct ents *e)
{
	size_t out = 0;

	if (!e->n)
		return;
	qsort(e->a, e->n, sizeof(*e->a), ent_cmp);
	for (size_t i = 0; i < e->n; i++) {
		if (i + 1 < e->n && e->a[i + 1].k1 == e->a[i].k1 && e->a[i + 1].k2 == e->a[i].k2)
			continue;
		if (e->a[i].msg)
			e->a[out++] = e->a[i];
	}
	e->n = out;
}

static uint64_t shared_key(struct fold *f, const char *name)
{
	for (size_t i = 0; i < f->n_names; i++)
		if (strcmp(f->shared_names[i], name) == 0)
			return i;
	{
		char **a = realloc(f->shared_names, (f->n_names + 1) * sizeof(*a));

		if (!a) {
			f->oom = true;
			return UINT64_MAX;
		}
		f->shared_names = a;
		a[f->n_names] = (char *)name;
		return f->n_names++;
	}
}

static void fold_snapshot(struct fold *f, OdpdState__State *st)
{
	f->shared.n = f->domains.n = f->maps.n = f->clients.n = f->mrs.n = f->segs.n = f->refs.n = 0;
	for (size_t i = 0; i < st->n_shared; i++)
		ent_add(f, &f->shared, shared_key(f, st->shared[i]->name), 0, st->shared[i]);
	for (size_t i = 0; i < st->n_domains; i++)
		ent_add(f, &f->domains, st->domains[i]->id, 0, st->domains[i]);
	for (size_t i = 0; i < st->n_mappings; i++)
		ent_add(f, &f->maps, st->mappings[i]->id, 0, st->mappings[i]);
	for (size_t i = 0; i < st->n_mrs; i++)
		ent_add(f, &f->mrs, st->mrs[i]->id, 0, st->mrs[i]);
	for (size_t i = 0; i < st->n_clients; i++) {
		OdpdState__Client *pc = st->clients[i];

		ent_add(f, &f->clients, pc->id, 0, pc);
		for (size_t k = 0; k < pc->n_segments; k++)
			ent_add(f, &f->segs, pc->id, pc->segments[k]->handle, pc->segments[k]);
		for (size_t k = 0; k < pc->n_refs; k++)
			ent_add(f, &f->refs, pc->id, pc->refs[k]->handle, pc->refs[k]);
	}
}

static void max_id(uint64_t *max, uint64_t id)
{
	if (id > *max)
		*max = id;
}

static void fold_record(struct fold *f, OdpdState__Record *r)
{
	if (r->snapshot)
		fold_snapshot(f, r->snapshot);
	/* Ids are never given again: not those of objects gone since either. */
	for (size_t i = 0; i < r->n_clients; i++)
		max_id(&f->max_client, r->clients[i]->id);
	for (size_t i = 0; i < r->n_clients_gone; i++)
		max_id(&f->max_client, r->clients_gone[i]);
	for (size_t i = 0; i < r->n_mrs; i++)
		max_id(&f->max_mr, r->mrs[i]->id);
	for (size_t i = 0; i < r->n_mrs_gone; i++)
		max_id(&f->max_mr, r->mrs_gone[i]);
	for (size_t i = 0; i < r->n_shared; i++)
		ent_add(f, &f->shared, shared_key(f, r->shared[i]->name), 0, r->shared[i]);
	for (size_t i = 0; i < r->n_shared_gone; i++)
		ent_add(f, &f->shared, shared_key(f, r->shared_gone[i]), 0, NULL);
	for (size_t i = 0; i < r->n_domains; i++)
		ent_add(f, &f->domains, r->domains[i]->id, 0, r->domains[i]);
	for (size_t i = 0; i < r->n_domains_gone; i++)
		ent_add(f, &f->domains, r->domains_gone[i], 0, NULL);
	for (size_t i = 0; i < r->n_mappings; i++)
		ent_add(f, &f->maps, r->mappings[i]->id, 0, r->mappings[i]);
	for (size_t i = 0; i < r->n_mappings_gone; i++)
		ent_add(f, &f->maps, r->mappings_gone[i], 0, NULL);
	for (size_t i = 0; i < r->n_mrs; i++)
		ent_add(f, &f->mrs, r->mrs[i]->id, 0, r->mrs[i]);
	for (size_t i = 0; i < r->n_mrs_gone; i++)
		ent_add(f, &f->mrs, r->mrs_gone[i], 0, NULL);
	for (size_t i = 0; i < r->n_clients; i++)
		ent_add(f, &f->clients, r->clients[i]->id, 0, r->clients[i]);
	for (size_t i = 0; i < r->n_clients_gone; i++)
		ent_add(f, &f->clients, r->clients_gone[i], 0, NULL);
	for (size_t i = 0; i < r->n_segments; i++)
		ent_add(f, &f->segs, r->segments[i]->client, r->segments[i]->segment->handle,
			r->segments[i]->segment);
	for (size_t i = 0; i < r->n_segments_gone; i++)
		ent_add(f, &f->segs, r->segments_gone[i]->client, r->segments_gone[i]->handle, NULL);
	for (size_t i = 0; i < r->n_refs; i++)
		ent_add(f, &f->refs, r->refs[i]->client, r->refs[i]->ref->handle, r->refs[i]->ref);
	for (size_t i = 0; i < r->n_refs_gone; i++)
		ent_add(f, &f->refs, r->refs_gone[i]->client, r->refs_gone[i]->handle, NULL);
}

/* What the fold hands out: a State whose arrays are its own, pointing into
 * the records it keeps until odpd_journal_state_free. */
struct folded {
	OdpdState__State st;                /* first: odpd_journal_state_free gets &st */
	struct fold f;
	OdpdState__Client *clients;         /* shallow copies with their own arrays */
	OdpdState__Domain *domains;
	OdpdState__Mapping *maps;
	OdpdState__Mr *mrs;
	OdpdState__Segment **segs;
	OdpdState__Ref **refs;
};

/* The dense number (1..n) of jid @id among @e (sorted), 0 if gone. */
static uint32_t renumber(const struct ents *e, uint64_t id)
{
	size_t lo = 0, hi = e->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (e->a[mid].k1 < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < e->n && e->a[lo].k1 == id ? (uint32_t)lo + 1 : 0;
}

static int assemble(struct folded *x, bool *ret_crashed, uint64_t generation)
{
	struct fold *f = &x->f;
	OdpdState__State *st = &x->st;
	size_t is = 0, ir = 0;

	(void)ret_crashed;
	ent_settle(&f->shared);
	ent_settle(&f->domains);
	ent_settle(&f->maps);
	ent_settle(&f->clients);
	ent_settle(&f->mrs);
	ent_settle(&f->segs);
	ent_settle(&f->refs);
	st->has_generation = generation != 0;
	st->generation = generation;
	st->shared = calloc(f->shared.n + 1, sizeof(*st->shared));
	st->domains = calloc(f->domains.n + 1, sizeof(*st->domains));
	st->mappings = calloc(f->maps.n + 1, sizeof(*st->mappings));
	st->clients = calloc(f->clients.n + 1, sizeof(*st->clients));
	st->mrs = calloc(f->mrs.n + 1, sizeof(*st->mrs));
	x->clients = calloc(f->clients.n + 1, sizeof(*x->clients));
	x->domains = calloc(f->domains.n + 1, sizeof(*x->domains));
	x->maps = calloc(f->maps.n + 1, sizeof(*x->maps));
	x->mrs = calloc(f->mrs.n + 1, sizeof(*x->mrs));
	x->segs = calloc(f->segs.n + 1, sizeof(*x->segs));
	x->refs = calloc(f->refs.n + 1, sizeof(*x->refs));
	if (!st->shared || !st->domains || !st->mappings || !st->clients || !st->mrs || !x->clients ||
	    !x->domains || !x->maps || !x->mrs || !x->segs || !x->refs)
		return -ENOMEM;
	for (size_t i = 0; i < f->shared.n; i++)
		st->shared[st->n_shared++] = f->shared.a[i].msg;
	for (size_t i = 0; i < f->domains.n; i++) {
		x->domains[i] = *(OdpdState__Domain *)f->domains.a[i].msg;
		x->domains[i].id = (uint32_t)i + 1;
		x->domains[i].has_handle_max = 1;
		x->domains[i].handle_max = 0;
		st->domains[st->n_domains++] = &x->domains[i];
	}
	for (size_t i = 0; i < f->maps.n; i++) {
		x->maps[i] = *(OdpdState__Mapping *)f->maps.a[i].msg;
		x->maps[i].id = (uint32_t)i + 1;
		st->mappings[st->n_mappings++] = &x->maps[i];
	}
	for (size_t i = 0; i < f->mrs.n; i++) {
		OdpdState__Mr *pm = &x->mrs[i];

		*pm = *(OdpdState__Mr *)f->mrs.a[i].msg;
		pm->domain = renumber(&f->domains, pm->domain);
		pm->mapping = renumber(&f->maps, pm->mapping);
		if (pm->domain && pm->handle > x->domains[pm->domain - 1].handle_max)
			x->domains[pm->domain - 1].handle_max = pm->handle;
		st->mrs[st->n_mrs++] = pm;      /* (by id: the state's order) */
	}
	/* Segments and references by client (sorted so), then the clients. */
	for (size_t i = 0; i < f->clients.n; i++) {
		OdpdState__Client *pc = &x->clients[i];
		uint64_t id = f->clients.a[i].k1;

		*pc = *(OdpdState__Client *)f->clients.a[i].msg;
		while (is < f->segs.n && f->segs.a[is].k1 < id)
			is++;
		pc->segments = &x->segs[is];
		pc->n_segments = 0;
		for (; is < f->segs.n && f->segs.a[is].k1 == id; is++) {
			OdpdState__Segment *ps = f->segs.a[is].msg;

			ps->mapping = renumber(&f->maps, ps->mapping);
			x->segs[is] = ps;
			pc->n_segments++;
		}
		while (ir < f->refs.n && f->refs.a[ir].k1 < id)
			ir++;
		pc->refs = &x->refs[ir];
		pc->n_refs = 0;
		for (; ir < f->refs.n && f->refs.a[ir].k1 == id; ir++) {
			x->refs[ir] = f->refs.a[ir].msg;
			pc->n_refs++;
		}
		st->clients[st->n_clients++] = pc;
	}
	return 0;
}

static void fold_free(struct fold *f)
{
	for (size_t i = 0; i < f->n_recs; i++)
		odpd_state__record__free_unpacked(f->recs[i], NULL);
	free(f->recs);
	free(f->shared.a);
	free(f->domains.a);
	free(f->maps.a);
	free(f->clients.a);
	free(f->mrs.a);
	free(f->segs.a);
	free(f->refs.a);
	free(f->shared_names);
}

void odpd_journal_state_free(OdpdState__State *st)
{
	struct folded *x = (struct folded *)st;

	if (!st)
		return;
	free(st->shared);
	free(st->domains);
	free(st->mappings);
	free(st->clients);
	free(st->mrs);
	free(x->clients);
	free(x->domains);
	free(x->maps);
	free(x->mrs);
	free(x->segs);
	free(x->refs);
	fold_free(&x->f);
	free(x);
}

OdpdState__State *odpd_journal_read(int fd, bool *ret_crashed, uint64_t *ret_epoch)
{
	struct journal_header h;
	struct folded *x;
	struct stat sb;
	uint8_t *map;
	uint64_t committed, off, generation = 0;
	const OdpdState__State *first = NULL;
	bool clean = false;

	*ret_crashed = true;
	*ret_epoch = 0;
	if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < sizeof(h) || pread(fd, &h, sizeof(h), 0) != sizeof(h) ||
	    memcmp(h.magic, JOURNAL_MAGIC, 8) != 0) {
		log_warning("restart: the stored journal is not one");
		return NULL;
	}
	if (h.format != JOURNAL_FORMAT) {
		log_warning("restart: the stored journal has format %u; this odpd reads %u", h.format,
			    JOURNAL_FORMAT);
		return NULL;
	}
	committed = atomic_load(&h.committed);
	if (committed > (uint64_t)sb.st_size || committed < sizeof(h))
		return NULL;
	map = mmap(NULL, (size_t)committed, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return NULL;
	x = calloc(1, sizeof(*x));
	if (!x) {
		munmap(map, (size_t)committed);
		return NULL;
	}
	odpd_state__state__init(&x->st);
	for (off = sizeof(h); off + RECORD_HEAD <= committed;) {
		uint32_t head[2];
		OdpdState__Record *r, **a;

		memcpy(head, map + off, RECORD_HEAD);
		if (off + RECORD_HEAD + head[0] > committed ||
		    (uint32_t)crc32(0, map + off + RECORD_HEAD, head[0]) != head[1]) {
			log_warning("restart: journal record at %" PRIu64 " is damaged: read up to it", off);
			break;
		}
		r = odpd_state__record__unpack(NULL, head[0], map + off + RECORD_HEAD);
		off += RECORD_HEAD + head[0];
		a = r ? realloc(x->f.recs, (x->f.n_recs + 1) * sizeof(*a)) : NULL;
		if (!a) {
			if (r)
				odpd_state__record__free_unpacked(r, NULL);
			log_warning("restart: a journal record does not decode: read up to it");
			break;
		}
		x->f.recs = a;
		a[x->f.n_recs++] = r;
		if (r->snapshot && !first)
			first = r->snapshot;
		if (r->snapshot) {
			first = r->snapshot;
			clean = r->clean;
		} else if (r->n_mrs || r->n_mrs_gone || r->n_refs || r->n_refs_gone || r->n_clients ||
			   r->n_clients_gone || r->n_segments || r->n_segments_gone || r->n_domains ||
			   r->n_domains_gone || r->n_mappings || r->n_mappings_gone || r->n_shared ||
			   r->n_shared_gone) {
			clean = false;
		}
		if (r->has_generation)
			generation = r->generation;
		fold_record(&x->f, r);
	}
	munmap(map, (size_t)committed);
	if (!first || first->format < 1 || x->f.oom) {
		log_warning("restart: the stored journal holds no usable snapshot");
		odpd_journal_state_free(&x->st);
		return NULL;
	}
	if (first->has_generation && first->generation > generation)
		generation = first->generation;
	if (assemble(x, ret_crashed, generation) < 0) {
		odpd_journal_state_free(&x->st);
		return NULL;
	}
	x->st.format = first->format;
	x->st.version = first->version;
	x->st.has_window_base = first->has_window_base;
	x->st.window_base = first->window_base;
	x->st.has_window_size = first->has_window_size;
	x->st.window_size = first->window_size;
	x->st.has_next_client_id = first->has_next_client_id;
	x->st.next_client_id = first->next_client_id;
	x->st.has_next_mr_id = first->has_next_mr_id;
	x->st.next_mr_id = first->next_mr_id;
	x->st.devices = first->devices;
	x->st.n_devices = first->n_devices;
	for (size_t i = 0; i < x->st.n_clients; i++)
		if (x->st.clients[i]->id >= x->st.next_client_id)
			x->st.next_client_id = x->st.clients[i]->id + 1;
	for (size_t i = 0; i < x->st.n_mrs; i++)
		if (x->st.mrs[i]->id >= x->st.next_mr_id)
			x->st.next_mr_id = x->st.mrs[i]->id + 1;
	if (x->f.max_client >= x->st.next_client_id) {
		x->st.has_next_client_id = 1;
		x->st.next_client_id = x->f.max_client + 1;
	}
	if (x->f.max_mr >= x->st.next_mr_id) {
		x->st.has_next_mr_id = 1;
		x->st.next_mr_id = x->f.max_mr + 1;
	}
	*ret_crashed = !clean;
	*ret_epoch = h.epoch;
	return &x->st;
}
