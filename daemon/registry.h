/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The registry: the one owner of every MR, and the registration cache.
 *
 * MRs live in PDs (struct odpd_domain): a private PD per client and device,
 * or a named shared PD that several clients joined. The MRs over one
 * segment, of every PD and client address, sit in one interval tree over
 * their page-rounded file range (odpd_mapping.mrs); a lookup takes those of
 * its PD and iova base (client address of file offset 0), and the same tree
 * counts distinct pinned pages, so an MR costs no coverage structure of its
 * own. Clients hold
 * references (struct odpd_ref); an MR with no reference is deregistered at
 * once, or, released "relaxed", waits on the invalidation queue — still a
 * cache hit — until a batch invalidates it.
 *
 * Its parts, one concern each, in registry/ (each header says what the part
 * owns, its invariants and who calls it): lookup (the cache index), charge
 * (charges and quotas), holder (holders and references), hits (hit-table
 * slots and revocation), relaxed (the relaxed queue and flushes), batch
 * (deregistration batches, waiters, deferrals), mrlife (invalidation and
 * the one free), witness (hole detection), pds (domains, shared PDs,
 * export), cctx (client-PD contexts), reg (registration jobs), verifyjob
 * and advise (jobs on live MRs), core (set-up, device removal).
 *
 * The registry knows holders (who asks: client id, pid, uid, account), not
 * connections or sockets. Work that touches the kernel runs on the worker
 * pool; its completion calls back on the event loop. Everything here runs on
 * the event loop thread, except where a comment says "worker".
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <time.h>
#include <event2/event.h>

#include "conf.h"
#include "device.h"
#include "domain.h"
#include "error.h"
#include "hittab.h"
#include "itree.h"
#include "pool.h"
#include "quota.h"
#include "segment.h"
#include "slab.h"

/*
 * An MR's life, one state at a time. Every change goes through
 * mr_set_state() (registry/mrlife.c), which asserts that it is one of the
 * transitions below; an MR is freed in one place, mr_gc(), once it is DEAD,
 * no reference is left (mr->refs) and no verify reads through it (mr->busy).
 *
 *                         hit
 *   REGISTERING ---> LIVE <-----> RELAXED
 *    |    |           |  \ relaxed   |
 *    |    |           |   \ release  | flush, evict, stale, PD left,
 *    |    |           |    v         v device gone
 *    |    |           |   DEFERRED <-+  (while a verify reads through it)
 *    |    |           |    | last verify ends
 *    |    +-----------|--->v<--------+  (no verify)
 *    |                |   INVALIDATING  (in a batch)
 *    |                |    | batch done
 *    |    device gone |    v
 *    +----------------|-> DEAD ---- mr_gc: no reference, no verify ----> freed
 *                     |    ^
 *                     v    | batch done
 *        DEAD_DEFERRED --> DEAD_BATCHED
 *                 last verify ends
 *
 *   from            to              when
 *   REGISTERING     LIVE            registered, and the reference made
 *   REGISTERING     INVALIDATING    registered, but the request failed after all
 *   REGISTERING     DEAD            not registered (then freed)
 *   LIVE            RELAXED         its last reference released relaxed, cached
 *   LIVE            INVALIDATING    its last reference released (or not cached)
 *   LIVE            DEFERRED        the same while a verify reads through it
 *   LIVE            DEAD_BATCHED    its device went away (held: its holders
 *                                   keep their references)
 *   LIVE            DEAD_DEFERRED   the same while a verify reads through it
 *   RELAXED         LIVE            a hit
 *   RELAXED         INVALIDATING    flushed, evicted, stale, its PD left, its
 *                                   device gone
 *   RELAXED         DEFERRED        the same while a verify reads through it
 *   DEFERRED        INVALIDATING    its last verify ended
 *   DEAD_DEFERRED   DEAD_BATCHED    its last verify ended
 *   INVALIDATING    DEAD            its batch is done (then freed: no reference)
 *   DEAD_BATCHED    DEAD            its batch is done (freed if no reference)
 *
 * DEFERRED and DEAD_DEFERRED hold a batch number reserved at the
 * transition (registry->deferred), so that a flush waits for them as for
 * the batches in flight. INVALIDATING and DEAD_BATCHED are in a batch (by
 * batch_next). DEAD: deregistered and stripped (charges, pins, PD
 * released); only a removed device's MRs stay there, held by references
 * their clients have yet to release. Only LIVE MRs and those of a removed
 * device have references of holders; only REGISTERING, LIVE and RELAXED
 * ones can be in the cache. The first five values are the wire's MrState
 * (odpd_mr_wire_state).
 */
enum odpd_mr_state {
	ODPD_MR_REGISTERING,        /* ibv_reg_mr on a worker; requests for it join it */
	ODPD_MR_LIVE,               /* held */
	ODPD_MR_RELAXED,            /* no holder, on the invalidation queue: a hit */
	ODPD_MR_INVALIDATING,       /* in a batch: never a hit again */
	ODPD_MR_DEAD,               /* deregistered and stripped; freed with its last reference */
	ODPD_MR_DEFERRED,           /* out of the cache, waits for its verifies, then a batch */
	ODPD_MR_DEAD_DEFERRED,      /* its device went away, held; waits for its verifies */
	ODPD_MR_DEAD_BATCHED,       /* its device went away, held; in a batch */
};
#define ODPD_MR_N_STATES 8

struct odpd_holder;
struct odpd_mr;
struct reg_op;

/* One client's reference to an MR: what odpd_reg() returned. */
struct odpd_ref {
	LIST_ENTRY(odpd_ref) hlink;         /* in holder->refs */
	LIST_ENTRY(odpd_ref) mlink;         /* in mr->holders */
	struct odpd_holder *holder;
	struct odpd_mr *mr;
	uint64_t handle;                    /* the client's handle */
	uint64_t iova, length;              /* what the client asked for */
	void *cookie;                       /* the caller's (the client's segment) */
	/* In the holder's hit table (hittab.h), or slot 0. */
	uint32_t slot;
	bool claimed;                       /* the client's use word moved since the slot was given */
	uint64_t ticket;
	uint64_t last_use;                  /* the use word at the last look */
	struct odpd_ref *index_next;        /* in holder->ref_index[handle & mask] */
};

/* A holder's charge for one MR: its account pins the MR's pages. */
struct odpd_charge {
	struct odpd_charge *next;
	struct odpd_account *acct;
	unsigned refs;                      /* references of this account; 0: the relaxed charge */
};

/*
 * An MR: issue 11 wants a cached one to cost odpd at most 256 bytes, and
 * libibverbs' own MR object takes 64 of them, so this stays within 184
 * bytes (a static assertion in registry/mrlife.c; bench/run-mem measured 249 per
 * cached MR). Fields of states that never meet share a place. Fields a
 * worker writes (mr, ctime_*, witness*, imp) are members of their own,
 * never bits beside what the loop writes.
 */
struct odpd_mr {
	/* [start, end) of the file (page rounded; implicit: [0, UINT64_MAX)),
	 * in map->mrs from its registration until it is stripped (in_map);
	 * node.seq is its id (unique, increasing). */
	struct odpd_inode node;
	struct odpd_domain *dom;            /* daemon-PD mode */
	struct odpd_mapping *map;           /* a reference */
	uint64_t iova;                      /* of node.start */
	struct ibv_mr *mr;
	uint64_t ctime_ns;                  /* the segment's ctime when last proven current */
	uint64_t owner_id;                  /* the client that registered it */
	LIST_HEAD(, odpd_ref) holders;
	union {
		struct odpd_import *imp;    /* client-PD mode: imp->cctx (malloc'd on the loop;
					     * a worker imports imp->pd, a batch frees it) */
		struct odpd_registrar *registrar;   /* implicit: the domain's registrar (implicit.h),
						     * a reference */
	};
	TAILQ_ENTRY(odpd_mr) rlink;         /* RELAXED: in registry->relaxed */
	union {
		struct reg_op *joiners;     /* REGISTERING: requests it will serve */
		uint64_t relaxed_by;        /* RELAXED: the holder (client) that released it last */
		/* In a batch (INVALIDATING, DEAD), or a list the loop makes and
		 * consumes in one go (stale MRs a lookup found, also RELAXED
		 * ones: they are invalidated right after) */
		struct odpd_mr *batch_next;
	};
	/* Its charges: the first in place (acct NULL: free; most MRs have one
	 * and it costs no allocation of its own), more by charge0.next. */
	struct odpd_charge charge0;
	pid_t relaxed_pid;                  /* RELAXED: the process that released it last */
	uint32_t relaxed_ms;                /* RELAXED: since when: CLOCK_MONOTONIC in ms, rounded
					     * up, modulo 2^32 (49 days; the window is a day at most) */
	/* Pinned: are its pages still the segment's (see odpd_mapping.witness)? */
	uint32_t witness_epoch;             /* map->witness_epoch at its pin */
	unsigned refs;
	uint16_t busy;                      /* verify jobs using mr->mr (ODPD_MR_MAX_BUSY) */
	uint8_t prefetch_errno;             /* REG_PREFETCH when registered: ibv_advise_mr's errno */
	/* Set by mr_new, before any worker sees the MR, and never again. */
	unsigned access : 4;                /* Odpd__Access bits */
	unsigned pinned : 1;                /* counts pinned pages */
	unsigned implicit : 1;              /* implicit ODP: no segment, iova 0, length UINT64_MAX;
					     * registered by the domain's registrar (implicit.h) */
	/* (A member between bit-fields makes them memory locations of their own.) */
	bool witnessed;                     /* relies on its witness pages (workers set it,
					     * under map->witness_lock) */
	bool ctime_ok;                      /* ctime_ns is a valid fast-path baseline */
	/* Loop only, from here on. */
	unsigned state : 3;                 /* enum odpd_mr_state: only mr_set_state() writes it */
	unsigned in_map : 1;                /* in map->mrs */
	unsigned cached : 1;                /* a lookup may serve it (not stale, no-cache, client PD) */
	unsigned counted : 1;               /* its pages count in registry->pinned */
	unsigned invalidated : 1;           /* its generation moved (odpd_mr_generation) */
	unsigned jdirty : 1;                /* to be written at the journal's next commit (journal.c) */
	/* Its slot in the journal's limbo (keep.h; 0: none): set by the worker
	 * that registered it, cleared by the one that deregisters it. */
	uint32_t limbo;
};

/* Verifies in flight through one MR at most (EBUSY beyond). */
#define ODPD_MR_MAX_BUSY UINT16_MAX

/* A named shared PD: one domain per device, made on first use. */
struct odpd_shared_pd {
	LIST_ENTRY(odpd_shared_pd) link;
	char name[64];
	uid_t creator_uid;
	unsigned members;                   /* holders that joined */
	struct odpd_domain **doms;          /* [n_devices] */
};

/* Client-PD mode: device contexts with MRs in them per connection (librdmacm
 * opens one per device and process; contexts no MR uses are closed). */
#define ODPD_MAX_CLIENT_CTXS 16u

/* Who asks. Embedded in the connection's state. */
struct odpd_holder {
	LIST_ENTRY(odpd_holder) rlink;      /* in registry->holders */
	uint64_t id;
	pid_t pid;
	uid_t uid;
	struct odpd_account *acct;
	struct odpd_limit limit;
	struct odpd_shared_pd *spd;         /* joined, or NULL */
	struct odpd_domain **domains;       /* private, [n_devices] */
	bool registered;                    /* it has asked for an MR: too late to join */
	LIST_HEAD(, odpd_client_ctx) cctxs; /* client-PD mode: its contexts, imported */
	unsigned n_cctxs;
	LIST_HEAD(, odpd_ref) refs;
	unsigned n_refs;
	/* refs by handle: a power-of-two table, at least as large as n_refs
	 * while memory allows (NULL: look through refs) */
	struct odpd_ref **ref_index;
	uint32_t ref_index_size;
	struct odpd_hittab *hits;           /* OpenHitTable, or NULL */
	LIST_ENTRY(odpd_holder) ring_link;  /* in acct->ring_holders while its table has a ring */
	unsigned n_odp_refs;                /* of refs, those of ODP and implicit ODP MRs */
	uint64_t local_hits;                /* as its library last reported */
	uint64_t events;                    /* events sent to its client (the hit table's
					     * events word, daemon/hittab.h) */
};

/* The registration size histogram: bucket 0 counts registrations of at
 * most 4 KiB, bucket i of at most 4 KiB << i (up to 1 GiB, bucket 18), the
 * last one those larger (an implicit ODP MR, the whole address space,
 * among them). Its buckets add up to registrations. */
#define ODPD_REG_SIZE_BUCKETS 20

/* The bucket of a registration of @length bytes. */
static inline unsigned odpd_reg_size_bucket(uint64_t length)
{
	unsigned b = 0;

	while (b < ODPD_REG_SIZE_BUCKETS - 1 && length > 4096ull << b)
		b++;
	return b;
}

/*
 * Counters since start. Compared with UCX's rcache statistics (odpctl(8)):
 * gets, local_hits (hits_fast), hits (hits_slow), misses, registrations
 * (mem_regs), deregistrations (mem_deregs). Invalidations by cause: a
 * flush (inv_flush), eviction (inv_eviction), a punched hole (replaced),
 * a lost device (killed), and the relaxed window passing (inv_expired).
 */
struct odpd_cache_stats {
	uint64_t lookups, hits, misses, evictions;
	uint64_t registrations, deregistrations;
	uint64_t flushes, invalidated, replaced;
	uint64_t device_removals;           /* devices that went away while odpd ran */
	uint64_t killed;                    /* MRs that went with them */
	uint64_t local_hits;                /* answered by client libraries (as reported) */
	uint64_t revoked;                   /* unused references taken back from hit tables */
	uint64_t gets;                      /* registrations asked for, local hits included */
	uint64_t inv_flush;                 /* relaxed MRs a flush invalidated */
	uint64_t inv_eviction;              /* relaxed MRs invalidated to make room: evictions,
					     * and relaxed-max-mrs / relaxed-max-bytes passed */
	uint64_t inv_expired;               /* relaxed MRs invalidated as the window passed */
	uint64_t registered_bytes;          /* the lengths of the registrations, added up */
	uint64_t loop_registrations;        /* registrations made on the loop (reg_on_loop) */
	uint64_t loop_deregistrations;      /* deregistrations made on the loop (batch_on_loop) */
	uint64_t ring_releases;             /* references released through release rings */
	uint64_t ring_errors;               /* ring entries that named no reference, or a broken ring */
	uint64_t reg_sizes[ODPD_REG_SIZE_BUCKETS];
};

/* On-demand paging: ODP MRs count here, never as pinned bytes. */
struct odpd_odp_stats {
	unsigned mrs;                       /* now, explicit and implicit */
	unsigned implicit_mrs;              /* now, implicit (no bytes counted) */
	unsigned registrars;                /* implicit-ODP registrar processes now */
	uint64_t bytes;                     /* explicit ODP MRs' registered bytes */
	uint64_t registrations, prefetches, prefetch_bytes, prefetch_errors;
};

struct odpd_batch;
struct odpd_deferred;
struct odpd_waiter;

struct odpd_registry {
	struct event_base *base;
	struct odpd_pool *pool;
	struct odpd_segtable *segs;
	const struct odpd_conf *conf;
	struct odpd_devices *devices;
	struct odpd_quota quota;
	unsigned n_mrs;                     /* every MR: the objects of mr_slab */
	uint64_t pinned;                    /* distinct pinned bytes of the whole daemon */
	TAILQ_HEAD(, odpd_mr) relaxed;      /* oldest first */
	unsigned n_relaxed;
	uint64_t relaxed_bytes;
	struct event *relaxed_timer;
	struct event *hit_timer;            /* looks for unused references in hit tables */
	unsigned n_hit_tables;
	struct event *hole_timer;           /* looks for holes under pinned MRs in hit tables */
	unsigned n_hit_pinned;              /* references with a slot over pinned MRs */
	uint64_t hole_pass;                 /* holes_check passes (odpd_mapping.hole_pass) */
	/* Where the next look of each timer starts in @holders (NULL: at the
	 * head): a look takes at most ODPD_LOOK_HOLDERS holders, so that the
	 * loop's time per tick does not grow with the number of clients. */
	struct odpd_holder *hit_cursor, *hole_cursor;
	LIST_HEAD(, odpd_domain) domains;
	LIST_HEAD(, odpd_holder) holders;
	LIST_HEAD(, odpd_shared_pd) shared;
	unsigned n_shared;
	LIST_HEAD(, odpd_batch) batches;    /* in flight */
	/* MRs out of the cache that a verify still reads through, each with the
	 * batch number reserved for it: a flush waits for them too. */
	struct odpd_deferred *deferred;
	/* Small MRs whose last reference a release ring gave back before a
	 * registration, deregistered on the loop once that request has its
	 * answer (odpd_registry_take_releases_later, _run_later): linked by
	 * batch_next, INVALIDATING, in no batch. */
	struct odpd_mr *later;
	bool take_later;                    /* (while taking a ring for that) */
	LIST_HEAD(, odpd_waiter) waiters;
	uint64_t next_mr_id, generation, batch_seq;
	struct odpd_slab mr_slab, ref_slab; /* struct odpd_mr and struct odpd_ref */
	void *spare_op;                     /* a registration's request state, freed and
					     * kept for the next (reg.c; NULL: none) */
	int pagemap_fd;                     /* /proc/self/pagemap: witness pages present? */
	_Atomic bool pagemap_scan;          /* the kernel has PAGEMAP_SCAN (read by workers) */
	unsigned pending;                   /* jobs in flight that are not a client's */
	/* Domains whose verifier is kept idle, oldest first: each is freed on a
	 * worker verify_idle_ms after its last verify (0: at once, by the verify). */
	TAILQ_HEAD(, odpd_domain) idle_verifiers;
	struct event *verifier_timer;
	bool verifier_reaping;              /* a job frees verifiers: its end looks again */
	uint64_t verify_idle_ms;            /* odpd --verify-idle-ms; set before the first verify */
	/* ODPD_TEST_REG_DELAY_MS (tests only): a worker waits this long after
	 * the verb made an MR, before the loop learns of it (a crash then
	 * leaves an MR the journal does not know: test-restart). */
	unsigned test_reg_delay_ms;
	struct odpd_cache_stats stats;
	struct odpd_odp_stats odp;
};

int odpd_registry_init(struct odpd_registry *r, struct event_base *base, struct odpd_pool *pool,
		       struct odpd_segtable *segs, const struct odpd_conf *conf,
		       struct odpd_devices *devices);
/* At shutdown, after every holder is gone and the pool drained. */
void odpd_registry_finish(struct odpd_registry *r);

/* Worker: map odpd's view of a range of @map ahead of its registrations
 * (MapSegment); registry/witness.c. 0 or an errno of madvise. */
int odpd_registry_map_ahead(struct odpd_registry *r, struct odpd_mapping *map, uint64_t start,
			    uint64_t length);
/* Nothing in flight, nothing to release: shutdown may proceed. */
bool odpd_registry_idle(const struct odpd_registry *r);

/* Set up / tear down a holder. Release drops every reference (last ones
 * deregister), flushes the relaxed MRs with remote access it registered, and
 * leaves its PDs (whose relaxed MRs are flushed when nobody is left). */
int odpd_holder_init(struct odpd_registry *r, struct odpd_holder *h, uint64_t id, pid_t pid, uid_t uid,
		     const struct odpd_limit *limit);
void odpd_holder_release(struct odpd_registry *r, struct odpd_holder *h);

/* The PD @h registers into on device @dev_index, made (as a struct) on
 * first use. NULL on ENOMEM. */
struct odpd_domain *odpd_registry_holder_domain(struct odpd_registry *r, struct odpd_holder *h,
						unsigned dev_index);

/* Implicit ODP: start @d's registrar (implicit.h), or discard it (its
 * segments could not all be mapped). On the loop. */
int odpd_registry_start_registrar(struct odpd_registry *r, struct odpd_domain *d, const char *label,
				  uid_t uid, gid_t gid, struct odpd_err *err);
void odpd_registry_drop_registrar(struct odpd_registry *r, struct odpd_domain *d);

/*
 * The client-side cache (hittab.h): give @h a hit table over the client's
 * use table @use_fd (not taken); *@ret_gen_fd: the generation table for the
 * reply. EALREADY: it has one.
 */
int odpd_registry_open_hits(struct odpd_registry *r, struct odpd_holder *h, uint32_t slots, uint32_t ring,
			    int use_fd, int *ret_gen_fd, struct odpd_err *err);
/*
 * Release rings (hittab.h; doc/design.md §11): the releases @h's client
 * wrote into its ring and odpd has not taken yet, done now as DeregMr.
 * no_reply requests would be. Returns how many references went. odpd takes
 * a connection's ring before each of its requests, at every look of the
 * hit timer, at a flush and at a stop (holder_revoke), and:
 */
unsigned odpd_registry_take_releases(struct odpd_registry *r, struct odpd_holder *h);
/*
 * The same before a registration (RegMr), except that the MRs it leaves
 * without a reference, small enough for the loop, are deregistered only
 * when odpd_registry_run_later is called, after that request's answer was
 * sent: the verb is off the request's path. Their charges go now, as
 * always; so only while the daemon has room for a ring's worth below
 * max-mrs and max-pinned, which still count them until then, and
 * odpd_registry_settle deregisters them before either limit decides.
 */
unsigned odpd_registry_take_releases_later(struct odpd_registry *r, struct odpd_holder *h);
void odpd_registry_run_later(struct odpd_registry *r);
/* every ring (before an admin Status, a statistics read); */
void odpd_registry_take_all_releases(struct odpd_registry *r);
/*
 * before a registration of @length bytes at @addr (@pinned: of pinned
 * pages; the limits charge whole pages, so the pages it spans count) by
 * @h: if a limit of its user could refuse it, the rings of that user's
 * connections, and if one of the daemon's could, every ring. So a release
 * written before the request was sent counts, whichever connection wrote
 * it, and no request is refused for a charge already given back.
 */
void odpd_registry_settle(struct odpd_registry *r, struct odpd_holder *h, uint64_t addr, uint64_t length,
			  bool pinned);
/* An event (id 0, with a body) is about to be sent to @h's client: count
 * it, in the hit table's events word too (hittab.h). */
void odpd_registry_event_sent(struct odpd_holder *h);
/* Is live @mr held only by references that client libraries keep unused? */
bool odpd_registry_mr_kept(const struct odpd_mr *mr);
/* What a request of @h said about its cache: hits answered in-process
 * (cumulative) and the revocations its library has purged. */
void odpd_registry_hits_report(struct odpd_registry *r, struct odpd_holder *h, bool has_hits,
			       uint64_t local_hits, bool has_seen, uint64_t seen);

/* Join the shared PD @name (policy: the caller checked it). */
int odpd_registry_join(struct odpd_registry *r, struct odpd_holder *h, const char *name,
		       bool *ret_created, unsigned *ret_members, struct odpd_err *err);
struct odpd_shared_pd *odpd_registry_find_shared(struct odpd_registry *r, const char *name);

/* A registration request, validated by the caller. */
struct odpd_reg_req {
	struct odpd_device *dev;
	struct odpd_mapping *map;
	uint64_t offset;                    /* file offset of iova */
	uint64_t length;                    /* bytes */
	uint64_t iova;                      /* the client's address */
	uint32_t access;                    /* Odpd__Access */
	bool odp;                           /* explicit ODP: iova == odpd's address */
	bool implicit;                      /* implicit ODP: map NULL, iova 0, length UINT64_MAX;
					     * the holder's private PD has a registrar */
	bool prefetch;                      /* ODP: prefetch (FLUSH) after registering */
	bool no_cache;
	bool unpopulated;                   /* REG_UNPOPULATED: ENODATA unless resident */
	int cmd_fd;                         /* client-PD mode: consumed; else -1 */
	uint32_t pd_handle;
	uint64_t handle;                    /* for the new reference */
	void *cookie;
};

/* Completion of a request that went to a worker: @rc 0 with @ref, or
 * negative with @err. Called on the loop. */
typedef void (*odpd_reg_cb)(void *arg, int rc, const struct odpd_err *err, struct odpd_ref *ref,
			    bool hit);

/*
 * Register, or find in the cache. Returns 0 with *@ret_ref on a cache hit
 * (answered here, no worker), ODPD_REG_MADE with *@ret_ref for a miss
 * registered here on the loop (a small pinned MR of resident pages), 1 when
 * the answer will come through @cb, or a negative errno with @err (nothing
 * changed). q->cmd_fd is consumed on every path.
 */
#define ODPD_REG_MADE 2

/* The largest pinned MR odpd registers or deregisters on its event loop
 * instead of a worker (reg_on_loop, batch_on_loop; doc/design.md, "The
 * request path"), and the longest range a client may ask for with
 * REG_UNPOPULATED (HelloReply.resident_check_max). */
#define ODPD_LOOP_REG_MAX (64u << 10)
int odpd_registry_reg(struct odpd_registry *r, struct odpd_holder *h, const struct odpd_reg_req *q,
		      odpd_reg_cb cb, void *arg, struct odpd_ref **ret_ref, struct odpd_err *err);

typedef void (*odpd_done_cb)(void *arg, unsigned mrs, uint64_t bytes);

/*
 * Drop a reference. Returns 0 when done; 1 when the last reference of a
 * non-relaxed release deregisters the MR: @cb runs once it is deregistered.
 * @cb NULL: nobody waits (0; the deregistration still happens).
 */
int odpd_registry_release(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed,
			  odpd_done_cb cb, void *arg);

struct odpd_ref *odpd_holder_find_ref(struct odpd_holder *h, uint64_t handle);

/* Which relaxed MRs a flush invalidates. */
struct odpd_flush_sel {
	bool all;
	const struct odpd_holder *holder;   /* the PDs this holder uses */
	bool has_pid;
	pid_t pid;                          /* last released by this process */
	const char *pd;                     /* of this shared PD */
};

/* Invalidate the selected relaxed MRs, then call @cb once they and every
 * batch already in flight are deregistered (a barrier). Returns 0 when
 * nothing was to wait for (@cb not called; *@ret_mrs, *@ret_bytes 0), 1. */
int odpd_registry_flush(struct odpd_registry *r, const struct odpd_flush_sel *sel,
			odpd_done_cb cb, void *arg);

/*
 * Daemon-PD mode: open @h's PD on @dev (its private one, or the shared PD it
 * joined) if not yet open, and hand @cb a dup of the context's cmd_fd (the
 * callee owns it) and the PD's handle, on the loop. Binds the holder to that
 * PD as a registration does. EOPNOTSUPP where the provider cannot import.
 * Returns 1 (cb will be called) or -errno.
 */
typedef void (*odpd_export_cb)(void *arg, int rc, const struct odpd_err *err, int fd, uint32_t pd_handle);
int odpd_registry_export_pd(struct odpd_registry *r, struct odpd_holder *h, struct odpd_device *dev,
			    odpd_export_cb cb, void *arg, struct odpd_err *err);

/*
 * Prefetch (ibv_advise_mr) ranges of @h's ODP MRs, named by lkey, on a
 * worker. Checked here first: every lkey an MR @h holds, ODP (never a
 * pinned MR: advising one has oopsed rxe), one PD, each range inside its MR,
 * PREFETCH_WRITE only on MRs with local write (EPERM), known advice and
 * flags, and a device whose provider has advise_mr (EOPNOTSUPP). Returns 1
 * (@cb will be called on the loop with the verb's result), or -errno.
 */
struct odpd_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};
#define ODPD_ADVISE_MAX_SGE 64
typedef void (*odpd_advise_cb)(void *arg, int rc, const struct odpd_err *err, uint64_t bytes);
int odpd_registry_advise(struct odpd_registry *r, struct odpd_holder *h, uint32_t advice, uint32_t flags,
			 const struct odpd_sge *sges, unsigned n, odpd_advise_cb cb, void *arg,
			 struct odpd_err *err);

/* verify (verify.h) through @ref's MR on a worker. */
typedef void (*odpd_verify_cb)(void *arg, int rc, const struct odpd_err *err, uint32_t crc,
			       uint64_t length, const char *method);
/* With @probe_rkey: RDMA READ [iova, +length) with that key from the QP in
 * @ref's PD instead (proto: Verify.rkey). */
int odpd_registry_verify(struct odpd_registry *r, struct odpd_ref *ref, uint64_t iova, uint64_t length,
			 const uint32_t *probe_rkey, size_t buf_size, odpd_verify_cb cb, void *arg,
			 struct odpd_err *err);

/*
 * Device @dev went away (hotplug.c): its MRs are dead. Relaxed ones are
 * invalidated, held ones deregistered (the kernel already destroyed them;
 * the verbs only free odpd's side) and released — pins, charges — while
 * their holders keep the references until they release them. Its PDs are
 * detached from their holders and shared PDs and closed once nothing runs
 * in them, as are client contexts on it. @notify runs first for each
 * holder with anything on the device, with its number of MRs there.
 */
void odpd_registry_device_removed(struct odpd_registry *r, struct odpd_device *dev,
				  void (*notify)(struct odpd_holder *h, unsigned mrs, void *arg), void *arg);

/* Admin: verify the whole live MR with id @mr_id, held by whoever it is (a
 * reference of the request's own keeps it registered meanwhile). */
int odpd_registry_verify_mr(struct odpd_registry *r, uint64_t mr_id, size_t buf_size, odpd_verify_cb cb,
			    void *arg, struct odpd_err *err);

const char *odpd_mr_state_name(enum odpd_mr_state s);
/* The state as the protocol tells it (Odpd__MrState, without KEPT): the
 * states in between are shown as the one they lead to. */
unsigned odpd_mr_wire_state(const struct odpd_mr *mr);

/* Every MR, in no particular order: the first (@mr NULL) or the one after
 * @mr; NULL at the end. A walker may free @mr only after taking its next. */
static inline struct odpd_mr *odpd_registry_next_mr(const struct odpd_registry *r, const struct odpd_mr *mr)
{
	return odpd_slab_next(&r->mr_slab, mr);
}

/* The MR's generation: it changes when the MR is invalidated (out of the
 * cache for good: flushed, evicted, over a punched hole, its device gone),
 * and no two MRs share one (keys are reused). */
static inline uint64_t odpd_mr_generation(const struct odpd_mr *mr)
{
	return mr->node.seq << 1 | mr->invalidated;
}

/* CLOCK_MONOTONIC of when relaxed @mr became RELAXED, in ns (rounded up to
 * a millisecond), given CLOCK_MONOTONIC now, @now_ns. */
static inline uint64_t odpd_mr_relaxed_ns(const struct odpd_mr *mr, uint64_t now_ns)
{
	uint64_t now_ms = now_ns / 1000000;
	int32_t ago = (int32_t)((uint32_t)now_ms - mr->relaxed_ms);

	return (now_ms - (uint64_t)(int64_t)ago) * 1000000;
}

/* The first of @mr's charges (its account pays for a relaxed MR), or NULL
 * (as strchr(), const in, not out: the registry changes what it finds). */
static inline struct odpd_charge *odpd_mr_first_charge(const struct odpd_mr *mr)
{
	return mr->charge0.acct ? (struct odpd_charge *)&mr->charge0 : mr->charge0.next;
}

/* Bytes @mr registers (page rounded). */
static inline uint64_t odpd_mr_length(const struct odpd_mr *mr)
{
	return mr->node.end - mr->node.start;
}

/* ---------------------------------------------------------------- restart (registry/restore.c) */

/* What a stopping odpd cannot hand to the next one in @h (a reason), or
 * NULL: the connection can be kept (doc/design.md §12). */
const char *odpd_registry_holder_unkeepable(const struct odpd_registry *r, const struct odpd_holder *h);
/* What of @h a crash could not keep, from its counts alone (no walk over
 * its references, for each commit of the journal): its own PD, an ODP MR,
 * an implicit ODP registrar, a device gone. NULL: nothing. */
const char *odpd_registry_holder_lost(const struct odpd_holder *h);
/* Can a restart keep @mr (LIVE or RELAXED, pinned, in odpd's PD)? */
bool odpd_registry_mr_keepable(const struct odpd_mr *mr);
/* At start, before any client is served: a shared PD with no member yet. NULL on ENOMEM. */
struct odpd_shared_pd *odpd_registry_restore_shared(struct odpd_registry *r, const char *name, uid_t creator);
/* A domain whose context and PD were imported: @spd's, or @owner's private one. */
struct odpd_domain *odpd_registry_restore_domain(struct odpd_registry *r, unsigned dev_index,
						 struct odpd_shared_pd *spd, struct odpd_holder *owner,
						 struct ibv_context *ctx, struct ibv_pd *pd, bool exported);
/* @h joined @spd (before the domains of @spd were restored, or after). */
void odpd_registry_restore_join(struct odpd_holder *h, struct odpd_shared_pd *spd, bool registered);
/* An imported pinned MR, LIVE (its references follow) or RELAXED. */
struct odpd_mr_restore {
	uint64_t id;                        /* larger than every id restored before */
	struct odpd_domain *dom;
	struct odpd_mapping *map;
	uint64_t start, end, iova;
	unsigned access;
	struct ibv_mr *mr;
	uint64_t owner, relaxed_by, ctime_ns;
	pid_t relaxed_pid;
	uint32_t relaxed_ms;
	bool relaxed, ctime_ok, cached, invalidated;
};
struct odpd_mr *odpd_registry_restore_mr(struct odpd_registry *r, const struct odpd_mr_restore *q);
/* Its charge to @uid's account, with no reference yet (the references
 * restored count themselves). 0 or -ENOMEM. */
int odpd_registry_restore_charge(struct odpd_registry *r, struct odpd_mr *mr, uid_t uid);
/* @h's reference @handle to @mr, without a hit slot, counted in the charge
 * of @h's account. NULL on ENOMEM. */
struct odpd_ref *odpd_registry_restore_ref(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mr *mr,
					   uint64_t handle, uint64_t iova, uint64_t length, void *cookie);
/* A stopping odpd: invalidate the relaxed MRs a restart cannot keep. How many. */
unsigned odpd_registry_drop_unkeepable(struct odpd_registry *r);
/* A stopping odpd keeps @h: its hit table's slots all go invalid. */
void odpd_registry_hits_freeze(struct odpd_holder *h);
/* After the references: @mr, restored LIVE, with none is released
 * (deregistered); with some, the charges no reference came back for go. */
void odpd_registry_restore_orphan(struct odpd_registry *r, struct odpd_mr *mr);
/* Connection @id of the previous odpd was not taken back: the relaxed MRs
 * with remote access it owned go, as when a connection ends. */
void odpd_registry_restore_gone(struct odpd_registry *r, uint64_t id);
/* At the end of a restore: domains no member came back to and shared PDs
 * with none go, as after their last member left. */
void odpd_registry_restore_settle(struct odpd_registry *r);
/* A stopping odpd: does pinned @mr still pin its segment's pages, as far as
 * odpd can prove (its ctime baseline is @ctime_ns, a ctime read before and
 * settled; or its witness pages)? The next odpd trusts it only while the
 * segment's ctime stays @ctime_ns. */
bool odpd_registry_mr_current(struct odpd_registry *r, const struct odpd_mr *mr, uint64_t ctime_ns);
/* A stopping odpd keeps @h: take back the references its library keeps
 * unused (released relaxed: odpd's cache keeps them across the restart, and
 * a flush reaches them), as a flush does. */
void odpd_registry_revoke_unused(struct odpd_registry *r, struct odpd_holder *h);
