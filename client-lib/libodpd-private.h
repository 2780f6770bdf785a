/* SPDX-License-Identifier: MIT */
/*
 * libodpd-private.h - what the modules of libodpd share. Not installed.
 *
 * Conventions: internal functions return 0 or a negative errno and set the
 * thread's error message (errmsg_set) where the failure is found; public
 * functions turn that into -1/NULL with errno (public_int, public_ptr).
 * Out parameters are named ret_* and are left untouched on failure.
 */
#pragma once

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "odpd.h"
#include "odpd-wire.h"

/* Everything is hidden (-fvisibility=hidden); the API is marked with this. */
#define _public_ __attribute__((visibility("default")))

/* One-way releases sent in a row before one waits for its answer (conn.c). */
#define ONEWAY_MAX 32

#define container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* ---------------------------------------------------------------- lists */

/* An intrusive, circular, doubly linked list; a head is a link to itself. */
struct odpd_link {
	struct odpd_link *prev, *next;
};

#define LINK_HEAD_INIT(h) { &(h), &(h) }

static inline void link_init(struct odpd_link *head)
{
	head->prev = head->next = head;
}

static inline bool link_empty(const struct odpd_link *head)
{
	return head->next == head;
}

static inline void link_add_tail(struct odpd_link *head, struct odpd_link *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}

static inline void link_del(struct odpd_link *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->prev = n->next = n;
}

/* Safe against removal of @pos inside the loop. */
#define link_for_each_safe(pos, tmp, head) \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); \
	     (pos) = (tmp), (tmp) = (pos)->next)

/* Built with AddressSanitizer (gcc defines __SANITIZE_ADDRESS__; clang 14
 * only answers __has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define LIBODPD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LIBODPD_ASAN 1
#endif
#endif

/* A few freed objects of one kind, each by one of its links, kept for the
 * next allocation: a request's path then neither frees nor allocates.
 * Under the lock of whatever holds the list. */
struct spares {
	struct odpd_link head;
	unsigned n;
};

/* One kept object's link, or NULL: none kept. */
static inline struct odpd_link *spares_take(struct spares *s)
{
	struct odpd_link *l;

	if (!s->n)
		return NULL;
	l = s->head.next;
	link_del(l);
	s->n--;
	return l;
}

/* Keep the object of @l (not in any list): true, else the caller frees it.
 * Builds with ASan keep nothing, so that it reports a use after free. */
static inline bool spares_put(struct spares *s, struct odpd_link *l, unsigned max)
{
#ifdef LIBODPD_ASAN
	(void)s;
	(void)l;
	(void)max;
	return false;
#else
	if (s->n >= max)
		return false;
	link_add_tail(&s->head, l);
	s->n++;
	return true;
#endif
}

/* ---------------------------------------------------------------- errors */

/* This thread's error message is not "": one byte of static TLS
 * (initial-exec), so that errmsg_clear() on every call's fast path needs no
 * __tls_get_addr for the message itself. */
extern _Thread_local bool errmsg_dirty __attribute__((tls_model("initial-exec")));
void errmsg_reset(void);

/* Reset this thread's error message to "". */
static inline void errmsg_clear(void)
{
	if (errmsg_dirty)
		errmsg_reset();
}

/*
 * Store "@fmt ..." as this thread's error message and return @r (a negative
 * errno). Inside @fmt, %m is strerror(-@r).
 */
int errmsg_set(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline int public_int(int r)
{
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return r;
}

static inline void *public_ptr(int r, void *p)
{
	if (r < 0) {
		errno = -r;
		return NULL;
	}
	return p;
}

/*
 * Fill a caller's struct of @size bytes (its sizeof at the caller's compile
 * time, at least the struct's first version) from ours of @have bytes: an
 * older caller gets what fits and nothing is written past @size; a newer
 * one gets zeros past ours (as ibv_query_device_ex does).
 */
static inline void public_copy_out(void *dst, size_t size, const void *src, size_t have)
{
	memcpy(dst, src, size < have ? size : have);
	if (size > have)
		memset((char *)dst + have, 0, size - have);
}

/* segment.c: how many parts, each on a thread, a large range may be faulted
 * in: ODPD_POPULATE_THREADS, else the CPUs of the calling thread's affinity
 * mask, at most 8. */
unsigned populate_threads(void);

/* ---------------------------------------------------------------- objects */

struct odpd_conn {
	struct odpd_link link;          /* in the process's list of connections */
	/* Serializes the calls on this connection; held across a round trip. */
	pthread_mutex_t lock;
	/*
	 * Whoever changes the lists below holds @lock and this. The atfork
	 * prepare handler takes it, so that a child sees the lists whole even
	 * when another thread of the parent was changing them.
	 */
	pthread_mutex_t tables_lock;
	int sock;                       /* -1: dead, see dead_reason */
	atomic_bool dead;               /* sock is -1 (read without the lock: hit.c) */
	char dead_reason[96];
	uint64_t last_id;               /* of the last request sent */
	uint8_t *buf;                   /* ODPD_MAX_PACKET + 1 bytes, for replies */
	/* Where a reply is decoded, if no other reply holds it (reply_arena
	 * in conn.c): no malloc or free for the usual one. */
	struct reply_arena {
		_Alignas(max_align_t) uint8_t mem[1024];  /* (calloc's alignment) */
		size_t used;
		bool spilled;           /* a piece of the reply went to malloc */
		atomic_bool busy;       /* a reply lives in it (freed after the lock) */
	} *arena;
	struct odpd_device_attr *devices;
	unsigned n_devices;
	char device[64];                /* RegMr.device; "": the daemon's first */
	/* A DeviceEvent came: the next call (other than a release) fails with
	 * ENODEV, once, naming the device. */
	bool lost_pending;
	char lost_device[64];
	unsigned lost_mrs;
	/* Events (id 0, with a body) received since connect; under @lock.
	 * Equal to the hit table's events word: none waits to be read. */
	uint64_t events_received;
	/* A RestartEvent came while the hit table was mapped: odpd crashed
	 * and a new one took the connection back, so the table is the old
	 * odpd's. No local hit is served from it (read without the lock:
	 * hit.c), and the next conn_drain retires it (hit_retire clears this). */
	atomic_bool hit_stale;
	uint64_t client_id;
	/* HelloReply.resident_check_max: pinned ranges up to this long are
	 * registered with REG_UNPOPULATED (0: never) */
	uint64_t resident_check_max;
	/* HelloReply.oneway_dereg_max: a pinned MR without remote access up
	 * to this long is released without waiting for odpd (DeregMr.no_reply;
	 * 0: never; ODPD_ONEWAY_DEREG=0 turns it off). The releases sent so
	 * far that no answer to a later request has covered yet, to be sent
	 * again after a RestartEvent that did not keep them; at ONEWAY_MAX
	 * the next release waits for its answer. Under @lock. */
	uint64_t oneway_dereg_max;
	uint64_t oneway_ids[ONEWAY_MAX], oneway_handles[ONEWAY_MAX];
	bool oneway_ring[ONEWAY_MAX];       /* written into the release ring: its id is the
					     * next request's, sent again as the one before */
	unsigned n_oneway;
	struct odpd_link segments;      /* struct odpd_segment */
	struct odpd_link mrs;           /* struct mr_entry (mr.c) */
	/* Entries of MRs released in-process, for the next local hit: no
	 * allocation on the fast path (mr.c). Under tables_lock. */
	struct spares spare_mrs;
	struct odpd_link mirror_mrs;    /* struct mirror_entry (mirror.c) */
	/* odpd_import_pd() (import.c): the daemon's context and PD, imported */
	struct ibv_context *imp_ctx;
	struct ibv_pd *imp_pd;
	/* The registration cache of this process (hit.c). Under tables_lock
	 * unless said otherwise. NULL hit_gen: off. */
	const _Atomic uint64_t *hit_gen;    /* the daemon's generation table, read-only */
	_Atomic uint64_t *hit_use;          /* ours */
	size_t hit_len;                     /* of the use table */
	size_t hit_gen_len;                 /* of the generation table's mapping */
	uint32_t hit_slots;
	/* The release ring (OpenHitTable.release_ring; hit_ring_push): its
	 * entries (0: none) and how many releases were written into it. Under
	 * c->lock, as the one-way releases. */
	uint32_t hit_ring;
	uint64_t ring_tail;
	bool hit_cache;                     /* local hits served (ODPD_CACHE is not 0) */
	uint32_t hit_events_slot;           /* the events word's slot, 0: none (older odpd) */
	struct hit_ref **hit_buckets;       /* by (addr, length) of the first request */
	struct hit_ref **hit_by_slot;
	struct odpd_link hit_refs;          /* indexed, oldest first */
	unsigned n_hit_refs;
	struct spares spare_refs;           /* struct hit_ref by lru, for the next hit_add_locked */
	struct odpd_link lazy;              /* unused, kept: least recently released first */
	unsigned n_lazy;
	uint64_t lazy_bytes;
	unsigned cache_max_mrs;             /* ODPD_CACHE_MAX_MRS */
	uint64_t cache_max_bytes;           /* ODPD_CACHE_MAX_BYTES */
	uint64_t release_stamp;
	uint64_t revocations_seen;          /* under c->lock */
	struct odpd_stats stats;
};

struct odpd_segment {
	struct odpd_link link;          /* in conn->segments */
	struct odpd_conn *conn;
	uint64_t handle;                /* the daemon's, for DetachSegment */
	uint8_t *addr;
	size_t length;
	int fd;
	bool owns_fd;                   /* odpd_alloc(): close on detach */
	bool owns_map;                  /* mapped by the library: munmap on detach */
	bool writable;                  /* mapped PROT_WRITE here (populate for writing) */
	bool no_populate;               /* ODPD_ALLOC_NO_POPULATE: registrations never fault it in */
	unsigned n_mrs;                 /* MRs of this connection inside */
};

/* ---------------------------------------------------------------- conn.c */

/* The default connection (odpd_default_conn), connected on first use. */
int conn_default(struct odpd_conn **ret);

/* ENOTCONN (with the reason) if @c is dead, else 0. Caller holds c->lock. */
int conn_check(struct odpd_conn *c, const char *what);

/* Free @reply, which a call on @c returned (NULL: nothing); the lock need
 * not be held. */
void conn_reply_free(struct odpd_conn *c, Odpd__Reply *reply);
/*
 * Send @req (its id is assigned here) with @fds, wait for its reply and
 * return it in *@ret_reply (free with conn_reply_free(c, r); pass NULL to
 * drop it). A reply whose status is not 0 is that errno, with
 * "@what: <the daemon's message>". @want: the body the reply must carry, or
 * ODPD__REPLY__BODY__NOT_SET for any. Caller holds c->lock.
 */
int conn_call(struct odpd_conn *c, const char *what, Odpd__Request *req,
	      const int *fds, unsigned nfds, Odpd__Reply__BodyCase want,
	      Odpd__Reply **ret_reply);
/* The same for a reply that carries one fd: *@ret_fd on success (the
 * caller owns it); a successful reply without one is EIO. */
int conn_call_fd(struct odpd_conn *c, const char *what, Odpd__Request *req,
		 const int *fds, unsigned nfds, Odpd__Reply__BodyCase want,
		 Odpd__Reply **ret_reply, int *ret_fd);

/* The device called @name among those the daemon reported, or NULL. */
const struct odpd_device_attr *conn_find_device(const struct odpd_conn *c, const char *name);

/*
 * The first connection of the process for which @match returns true, or
 * NULL. @match runs under the list's lock and may take c->tables_lock, not
 * c->lock. Only connections that are never freed while the process runs
 * (the default connections) may be used after this returns.
 */
struct odpd_conn *conns_find(bool (*match)(struct odpd_conn *c, const void *key), const void *key);

static inline void tables_lock(struct odpd_conn *c)
{
	pthread_mutex_lock(&c->tables_lock);
}

static inline void tables_unlock(struct odpd_conn *c)
{
	pthread_mutex_unlock(&c->tables_lock);
}

/* ---------------------------------------------------------------- segment.c */

/*
 * The segment of @c that holds [@addr, @addr + @length), or EINVAL with a
 * message naming @what and how to fix it (also for @length 0 and overflow).
 * Caller holds c->lock.
 */
int segment_lookup(struct odpd_conn *c, const char *what, const void *addr, size_t length,
		   struct odpd_segment **ret_seg);

/* Unmap, close and free every segment of @c (odpd_disconnect). */
void segments_release_all(struct odpd_conn *c);

/*
 * Fault the pages of [@addr, @addr + @length) (rounded out to pages) of @seg
 * in this process, so that they are allocated by, and charged to, this
 * process and not the daemon: MADV_POPULATE_WRITE where @seg is mapped
 * writable, else (or if the kernel refuses that for the mapping)
 * MADV_POPULATE_READ. EINVAL from madvise (a kernel before 5.14, or a
 * mapping that cannot be populated) is ignored: 0. Other errors of madvise
 * are returned, with a message naming @what. A range of 16 MiB or more is
 * split in parts of at least 8 MiB, as many as the CPUs it may use (at most 8),
 * each on a thread of its own. The caller keeps @seg attached meanwhile
 * (c->lock, or a segment nobody else knows yet).
 */
int segment_populate(const struct odpd_segment *seg, const char *what, const void *addr,
		     size_t length);

/* ---------------------------------------------------------------- mr.c */

/* What a RegMr sends beside the range. */
struct mr_request {
	uint32_t access;                /* bit mask of Odpd__Access */
	Odpd__MrKind kind;
	bool client_pd;
	uint32_t client_pd_handle;
	int cmd_fd;                     /* with client_pd */
	const char *device;             /* NULL: the connection's device */
	uint32_t flags;                 /* bit mask of Odpd__RegFlags */
};

struct mr_result {
	uint64_t handle;
	uint32_t slot;                  /* in the hit table, 0: none */
	uint64_t ticket;
	bool has_mr_range;
	uint64_t mr_iova, mr_length;    /* the MR's registered range */
	uint64_t iova;
	uint32_t lkey, rkey;
	uint32_t kernel_handle;
	bool has_kernel_handle;
	bool has_access;
	uint32_t access;                /* bit mask of Odpd__Access granted */
	uint64_t generation;            /* 0 if the daemon sent none */
	bool cache_hit;
	int prefetch_errno;             /* REG_PREFETCH failed in the kernel, else 0 */
};

/* RegMr on @c's device. Caller holds c->lock. */
int mr_register(struct odpd_conn *c, const char *what, const void *addr, size_t length,
		const struct mr_request *q, struct mr_result *ret);

/*
 * DeregMr. @relaxed: the daemon may keep the MR registered (relaxed) after
 * the last reference. Caller holds c->lock.
 */
int mr_deregister(struct odpd_conn *c, const char *what, uint64_t handle, bool relaxed);
/* DeregMr.no_reply: sent, not answered (conn.c). Caller holds c->lock. */
int conn_release_oneway(struct odpd_conn *c, const char *what, uint64_t handle);
/* Write the release of @handle into the hit table's release ring instead of
 * sending it: false if there is no ring, it is full or the table is stale.
 * Caller holds c->lock. */
bool hit_ring_push(struct odpd_conn *c, uint64_t handle);
/* The releases written into the ring that odpd has not taken, oldest first,
 * into @handles (room for ONEWAY_MAX); how many. Caller holds c->lock. */
unsigned hit_ring_untaken(const struct odpd_conn *c, uint64_t *handles);

/* Free every struct odpd_mr of @c (odpd_disconnect: no other thread uses @c
 * any more, so the tables lock, which what it calls expects, is not taken). */
void mrs_release_all(struct odpd_conn *c);

/* ---------------------------------------------------------------- hit.c */

/* One MR reference of the connection that the library may serve again itself. */
struct hit_ref {
	struct odpd_link link;          /* in conn->hit_refs while indexed */
	struct odpd_link lru;           /* in conn->lazy while unused */
	struct hit_ref *hnext;          /* hash chain */
	bool indexed;
	struct odpd_segment *seg;
	uintptr_t addr0;                /* the request that made it: address, length, iova */
	size_t length0;
	uint64_t iova0;
	uintptr_t start, end;           /* the MR's range in this process */
	uint64_t handle, ticket, generation;
	uint32_t slot, lkey, rkey;
	uint32_t access;                /* Odpd__Access granted */
	Odpd__MrKind kind;
	bool remote;
	unsigned users;                 /* struct mr_entry pointing here; 0: kept unused */
};

enum hit_release {
	HIT_RELEASE_DONE,               /* answered here */
	HIT_RELEASE_DAEMON,             /* the caller sends DeregMr (then hit_drop_user) */
};

/* Has the daemon retired this connection's hit table (its events word says
 * so: a restart of odpd, doc/design.md §12; or a RestartEvent came while it
 * was mapped: hit_stale)? Then no local hit is served from it. */
bool hit_retired(const struct odpd_conn *c);
/* Then: forget what it took back, release to it what this process kept
 * unused, serve nothing more from the old table, and open a new one. Caller
 * holds c->lock, not the tables lock. 0 (a table or none) or -errno. */
int hit_retire(struct odpd_conn *c, const char *what);
/* Open the connection's hit table (after Hello); off if the daemon has none. */
int hit_open(struct odpd_conn *c);
void hit_close(struct odpd_conn *c);
void hit_fork_child(struct odpd_conn *c);
/* Serve the request from the cache: true with *@ret and *@ret_ref. Caller
 * holds the tables lock. */
bool hit_lookup(struct odpd_conn *c, void *addr, size_t length, const struct mr_request *q,
		struct mr_result *ret, struct hit_ref **ret_ref);
/* A reply of the daemon: index its reference if it has a slot (*@ret, else
 * NULL). Caller holds the tables lock. */
int hit_add_locked(struct odpd_conn *c, struct odpd_segment *seg, void *addr, size_t length,
		   const struct mr_request *q, const struct mr_result *res, struct hit_ref **ret);
/* One user lets go. Caller holds the tables lock. */
enum hit_release hit_release(struct odpd_conn *c, struct hit_ref *h, bool relaxed);
void hit_unrelease(struct odpd_conn *c, struct hit_ref *h);
/* A user is gone for good (disconnect, or after the daemon's DeregMr). */
void hit_drop_user(struct odpd_conn *c, struct hit_ref *h);
/* Release unused references: over the bounds, @all, or over @seg. Caller holds c->lock. */
int hit_trim(struct odpd_conn *c, const char *what, bool all, const struct odpd_segment *seg);
bool hit_over(struct odpd_conn *c);
bool hit_have_lazy(struct odpd_conn *c);
/* Every request: forget revoked references, report. Caller holds c->lock. */
void hit_before_request(struct odpd_conn *c, Odpd__Request *req);
/* Has this connection received every event the daemon says it sent (the hit
 * table's events word)? false without an events word. Caller holds c->lock. */
bool hit_events_all_received(const struct odpd_conn *c);

/* ---------------------------------------------------------------- mirror.c */

/* Unimport and forget every mirror MR of @c (odpd_disconnect). */
void mirror_release_all(struct odpd_conn *c);

struct ibv_pd;
struct ibv_mr;
/*
 * Client-PD registration into @pd through the default connection: the
 * daemon imports @pd's context, registers [@addr, @addr + @length) there
 * (iova = @addr) with @access (IBV_ACCESS_*), and the MR is imported here.
 * @addr must lie in a segment of the default connection. odpd_reg_msgs()
 * and the preload (client-lib/preload) use it.
 */
int mirror_reg_pd(const char *what, struct ibv_pd *pd, void *addr, size_t length,
		  unsigned access, struct ibv_mr **ret);
/* Deregister a mirror MR in the daemon, then unimport it (odpd_dereg_mr). */
int mirror_dereg(const char *what, struct ibv_mr *mr);
/* Forget a mirror MR whose connection is gone, without the daemon (mirror.c). */
int mirror_forget(struct ibv_mr *mr);
/* ibv_rereg_mr for a mirror MR: @fresh takes @mr's place (mirror.c). */
int mirror_swap(const char *what, struct ibv_mr *mr, struct ibv_mr *fresh);

/* ---------------------------------------------------------------- import.c */

/* Unimport the PD odpd_import_pd() returned and close its context. */
void import_release(struct odpd_conn *c);

/* ---------------------------------------------------------------- access.c */

/*
 * IBV_ACCESS_* mask → Odpd__Access mask and MR kind. EINVAL (with a message
 * naming @what) for bits other than LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE,
 * REMOTE_ATOMIC and ON_DEMAND, and for REMOTE_WRITE or REMOTE_ATOMIC without
 * LOCAL_WRITE (as ibv_reg_mr).
 */
int access_to_wire(const char *what, unsigned ibv_access, uint32_t *ret_access,
		   Odpd__MrKind *ret_kind);

/* Odpd__Access mask (and kind) → IBV_ACCESS_* mask. Unknown bits are dropped. */
unsigned access_from_wire(uint32_t access, Odpd__MrKind kind);

/* ---------------------------------------------------------------- maps.c */

/* One line of /proc/PID/maps. */
struct maps_entry {
	uintptr_t start, end;
	uint64_t offset;                /* file offset of start */
	unsigned dev_major, dev_minor;
	uint64_t inode;
	char perms[5];                  /* "rw-s" */
	bool shared;                    /* perms[3] == 's' */
};

/* Parse one line. 0, or -EINVAL if it is not a maps line. */
int maps_parse_line(const char *line, struct maps_entry *ret);

/*
 * Find the mapping of @f (a /proc/PID/maps stream) that holds
 * [@addr, @addr + @length). Adjacent lines that continue one another (same
 * file, contiguous offsets, same sharing: a mapping split by mprotect or
 * madvise) count as one mapping; *@ret then spans them all, with the perms
 * of the first.
 * Returns 0; -ENOENT: @addr is not mapped; -ERANGE: the range runs past the
 * end of that mapping; -EIO: a line could not be parsed (or a read error).
 */
int maps_find(FILE *f, uintptr_t addr, size_t length, struct maps_entry *ret);
