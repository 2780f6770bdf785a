/* SPDX-License-Identifier: MIT */
/*
 * libodpd against a scripted fake daemon.
 *
 * The fake is a forked process on a private socket. It speaks the real wire
 * protocol, maps the segments it is sent from an address window of its own
 * (as odpd does), computes verify CRCs through its own mapping of the memfd,
 * answers every request after an asynchronous event (id 0), and records what
 * it was asked in shared memory for the test to check. Special requests
 * script failures: RegMr of 12345 bytes is refused with ENOMEM, of 7777
 * bytes closes the connection; client-PD RegMr is refused with EPERM;
 * Verify of 333 bytes is answered with garbage, of 334 bytes with an
 * oversized packet, of 335 bytes with garbage and then, late, the reply;
 * a relaxed DeregMr of an MR of 4321 bytes is refused with ENOMEM; JoinPd
 * of "forbidden" is refused with EPERM.
 *
 * A crash of odpd taken back under systemd (RestartEvent) is scripted by
 * Verify lengths too: 336, a RestartEvent that did not keep the request
 * instead of the reply, then the reply to the same request sent again (same
 * id, same bytes: flog->resends); 337, a RestartEvent that kept it and no
 * reply (lost at the crash: the journal has it), then the reply to the
 * request sent again; 338, as 336 but the request sent again is answered twice, the
 * second time with an fd; 339, the reply, then a RestartEvent; 340, as 336
 * but the event keeps only what came before the two requests before it
 * (one-way releases, to be sent again: flog->oneway_resends). A request id
 * seen again unasked counts in flog->unasked_resends.
 *
 * With flog->oneway_dereg_max set, its Hello offers one-way releases; a
 * DeregMr.no_reply is done and not answered (flog->oneway_deregs).
 *
 * With flog->hit_tables set, it answers OpenHitTable with a generation
 * table of its own, gives every RegMr without REG_NO_CACHE a slot and
 * ticket there, and stores the number of events it sent in the events
 * word; it never invalidates nor retires a table.
 *
 * Its registration cache is a caricature of odpd's: a RegMr without
 * REG_NO_CACHE for the same range, kind and no more access than a live or
 * relaxed MR of the connection is a hit (same MR, handle and generation);
 * a relaxed DeregMr of the last reference keeps the MR until a Flush. At
 * RegMr it records how many pages of the range (rounded out to pages) were
 * already in the memfd's page cache (mincore through its own mapping): the
 * library must have faulted them in before it asked.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "odpd.h"
#include "odpd-wire.h"

#define CHECK(expr) do { \
	if (!(expr)) { \
		fprintf(stderr, "%s:%d: CHECK(%s) failed (errno %d %s, errmsg \"%s\")\n", \
			__FILE__, __LINE__, #expr, errno, strerror(errno), odpd_errmsg()); \
		exit(1); \
	} \
} while (0)

/* A call fails with @err and odpd_errmsg() contains @text. */
#define CHECK_FAIL(call, err, text) do { \
	errno = 0; \
	CHECK(!(call)); \
	CHECK(errno == (err)); \
	CHECK(strstr(odpd_errmsg(), (text)) != NULL); \
} while (0)

#define FAKE_WINDOW 0x500000000000ull   /* where the fake maps segments */
#define FAKE_CLIENTS 8
#define FAKE_SEGS 32
#define FAKE_MRS 64
#define QUOTA_LENGTH 12345
/* odpd_reg of this length: refused with a message longer than the library's
 * reply arena (it goes to malloc, and is freed) */
#define LONG_MSG_LENGTH 12346
#define HANGUP_LENGTH 7777
#define GARBAGE_LENGTH 333
#define HUGE_LENGTH 334
#define LATE_LENGTH 335
#define RESTART_LENGTH 336
#define RESTART_KEPT_LENGTH 337
#define RESTART_DUP_LENGTH 338
#define RESTART_AFTER_LENGTH 339
#define RESTART_ONEWAY_LENGTH 340
#define RETIRE_LENGTH 341
#define NO_RELAX_LENGTH 4321
#define FAKE_GENERATION (1ull << 40)    /* + the MR's handle: 64 bits on the wire */
#define FAKE_FORBIDDEN_PD "forbidden"
#define FAKE_PD_RULE "fake: [pd forb*] lists neither uid 1000 nor its groups"

/* What the fake saw; in shared memory. */
struct fake_log {
	unsigned hellos, attaches, detaches, regs, deregs, verifies;
	uint32_t hello_version;
	char client_name[64];
	uint64_t attach_client_addr, attach_file_offset, attach_length;
	unsigned attach_nfds;
	uint64_t attach_file_size;
	uint64_t next_window;           /* where the next segment goes */
	char reg_device[64];
	uint32_t reg_access;
	int reg_kind;
	int reg_client_pd;
	uint32_t reg_pd_handle;
	unsigned reg_nfds;
	int reg_has_flags;
	uint32_t reg_flags;
	unsigned reg_pages;             /* of the range rounded out to pages */
	unsigned reg_resident;          /* of those, in the page cache at RegMr */
	uint64_t resident_check_max;    /* for the next Hello (HelloReply.resident_check_max) */
	uint64_t oneway_dereg_max;      /* for the next Hello (HelloReply.oneway_dereg_max) */
	unsigned oneway_deregs;         /* DeregMr.no_reply read (not answered) */
	unsigned oneway_resends;        /* of those, sent again after a RestartEvent */
	unsigned reg_unpopulated;       /* RegMr requests with REG_UNPOPULATED */
	int dereg_has_relaxed, dereg_relaxed;
	unsigned flushes, flushed;      /* Flush requests; MRs they dropped */
	int flush_fields;               /* the last Flush had a field set */
	unsigned joins;
	char join_name[128];
	unsigned maps;                  /* MapSegment requests; the last one's range */
	uint64_t map_offset, map_length;
	int hit_tables;                 /* answer OpenHitTable (else EINVAL: no cache) */
	unsigned hit_opens;             /* tables handed out */
	uint32_t ring;                  /* with hit_tables: release ring entries granted, at most */
	unsigned ring_deregs;           /* releases taken from rings (before each request) */
	uint32_t last_hit_slots;        /* slots asked for by the last OpenHitTable */
	unsigned resends;               /* requests sent again as asked, byte for byte */
	unsigned resend_mismatches;     /* sent again, but not the same bytes */
	unsigned unasked_resends;       /* an id seen again without a RestartEvent asking */
	unsigned restart_events;        /* RestartEvents sent (after the send returned) */
};

struct fake_opts {
	uint32_t version;               /* HelloReply.version; 0: ours */
	int hello_status;               /* refuse the Hello with this errno */
	int accept_gate;                /* > 0: accept nothing until a byte can be read here */
};

struct fake_seg {
	bool used;
	uint64_t handle, client_addr, length;
	uint8_t *map;
};

struct fake_mr {
	bool used;
	uint64_t handle, addr, length;
	uint32_t access;
	int kind;
	bool no_cache;                  /* registered with REG_NO_CACHE: never a hit */
	unsigned refs;                  /* 0: relaxed */
};

struct fake_client {
	int sock;
	struct fake_seg segs[FAKE_SEGS];
	struct fake_mr mrs[FAKE_MRS];
	uint64_t next_handle;
	bool registered, joined;
	uint64_t last_id;               /* of the last request read */
	int restart_len;                /* a RestartEvent asked for this request again: */
	uint64_t restart_id;            /* its id and bytes */
	uint8_t restart_req[512];
	uint64_t events;                /* RestartEvents sent */
	_Atomic uint64_t *gen;          /* the generation table (flog->hit_tables) */
	size_t gen_len;
	uint32_t gen_slots, next_slot;
	const _Atomic uint64_t *use;    /* the client's use table, with a ring (flog->ring) */
	size_t use_len;
	uint32_t ring;
	uint64_t ring_head;
	bool ring_frozen;               /* retired (RETIRE_LENGTH): taken no more */
};

/* What one request produced: a status, or one of the bodies. */
struct fake_reply {
	Odpd__Reply r;
	Odpd__HelloReply hello;
	Odpd__Device dev[2];
	Odpd__Device *devp[2];
	Odpd__SegmentReply seg;
	Odpd__MrReply mr;
	Odpd__VerifyReply verify;
	Odpd__JoinPdReply join;
	Odpd__FlushReply flush;
	Odpd__HitTableReply hit_table;
	int fd;                         /* sent along, then closed; -1: none */
};

static struct fake_log *flog;
static char test_dir[64];

/* ---------------------------------------------------------------- fake daemon */

static void fake_fail(struct fake_reply *f, int status, const char *msg)
{
	f->r.has_status = true;
	f->r.status = status;
	f->r.message = (char *)msg;
}

static void fake_hello(const Odpd__Hello *h, const struct fake_opts *o, struct fake_reply *f)
{
	flog->hellos++;
	flog->hello_version = h->version;
	snprintf(flog->client_name, sizeof(flog->client_name), "%s", h->client_name ? h->client_name : "");
	if (o->hello_status)
		return fake_fail(f, o->hello_status, "fake: protocol version refused");

	odpd__hello_reply__init(&f->hello);
	f->hello.has_version = f->hello.has_version_min = f->hello.has_version_max = true;
	f->hello.version = o->version ? o->version : ODPD_PROTOCOL_VERSION;
	f->hello.version_min = f->hello.version_max = ODPD_PROTOCOL_VERSION;
	for (int i = 0; i < 2; i++) {
		odpd__device__init(&f->dev[i]);
		f->dev[i].name = i == 0 ? "rxe0" : "mlx5_0";
		f->dev[i].transport = "RoCE";
		f->dev[i].has_node_guid = true;
		f->dev[i].node_guid = 0x1122334455667788ull + (uint64_t)i;
		f->dev[i].has_import = f->dev[i].has_import_errno = true;
		f->dev[i].import = i == 0 ? ODPD__SUPPORT__SUPPORT_NO : ODPD__SUPPORT__SUPPORT_YES;
		f->dev[i].import_errno = i == 0 ? EOPNOTSUPP : 0;
		f->dev[i].has_odp = true;
		f->dev[i].odp = true;
		f->devp[i] = &f->dev[i];
	}
	f->hello.n_devices = 2;
	f->hello.devices = f->devp;
	if (flog->resident_check_max) {
		f->hello.has_resident_check_max = true;
		f->hello.resident_check_max = flog->resident_check_max;
	}
	if (flog->oneway_dereg_max) {
		f->hello.has_oneway_dereg_max = true;
		f->hello.oneway_dereg_max = flog->oneway_dereg_max;
	}
	f->r.body_case = ODPD__REPLY__BODY_HELLO;
	f->r.hello = &f->hello;
}

static struct fake_seg *fake_seg_slot(struct fake_client *c)
{
	for (int i = 0; i < FAKE_SEGS; i++)
		if (!c->segs[i].used)
			return &c->segs[i];
	return NULL;
}

/* Map the file from the window, as odpd does. */
static void fake_attach(struct fake_client *c, const Odpd__AttachSegment *a,
			const struct odpd_packet *p, struct fake_reply *f)
{
	struct fake_seg *s = fake_seg_slot(c);
	struct stat st;
	uint64_t len;
	void *map;

	flog->attaches++;
	flog->attach_client_addr = a->client_addr;
	flog->attach_file_offset = a->file_offset;
	flog->attach_length = a->length;
	flog->attach_nfds = p->nfds;
	if (p->nfds != 1 || !s || fstat(p->fds[0], &st) < 0)
		return fake_fail(f, EINVAL, "fake: one memfd expected");
	flog->attach_file_size = (uint64_t)st.st_size;
	len = a->length ? a->length : (uint64_t)st.st_size;
	map = mmap((void *)(uintptr_t)flog->next_window, len, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_FIXED_NOREPLACE, p->fds[0], (off_t)a->file_offset);
	if (map == MAP_FAILED && errno == EACCES)       /* an O_RDONLY fd */
		map = mmap((void *)(uintptr_t)flog->next_window, len, PROT_READ,
			   MAP_SHARED | MAP_FIXED_NOREPLACE, p->fds[0], (off_t)a->file_offset);
	if (map == MAP_FAILED)
		return fake_fail(f, errno, "fake: mmap failed");
	flog->next_window += (len + 0xffffffull) & ~0xffffffull;

	*s = (struct fake_seg) {
		.used = true, .handle = ++c->next_handle, .length = len, .map = map,
		.client_addr = a->client_addr ? a->client_addr : (uintptr_t)map,
	};
	odpd__segment_reply__init(&f->seg);
	f->seg.has_segment = f->seg.has_addr = f->seg.has_length = f->seg.has_file_offset = true;
	f->seg.segment = s->handle;
	f->seg.addr = s->client_addr;
	f->seg.length = len;
	f->seg.file_offset = a->file_offset;
	f->r.body_case = ODPD__REPLY__BODY_SEGMENT;
	f->r.segment = &f->seg;
}

static void fake_detach(struct fake_client *c, const Odpd__DetachSegment *d, struct fake_reply *f)
{
	flog->detaches++;
	for (int i = 0; i < FAKE_SEGS; i++) {
		struct fake_seg *s = &c->segs[i];

		if (s->used && s->handle == d->segment) {
			munmap(s->map, s->length);
			s->used = false;
			return;
		}
	}
	fake_fail(f, ENOENT, "fake: no such segment");
}

static struct fake_seg *fake_seg_of(struct fake_client *c, uint64_t addr, uint64_t length)
{
	for (int i = 0; i < FAKE_SEGS; i++) {
		struct fake_seg *s = &c->segs[i];

		if (s->used && addr >= s->client_addr && addr + length <= s->client_addr + s->length)
			return s;
	}
	return NULL;
}

static struct fake_mr *fake_mr_find(struct fake_client *c, uint64_t handle)
{
	for (int i = 0; i < FAKE_MRS; i++)
		if (c->mrs[i].used && c->mrs[i].handle == handle)
			return &c->mrs[i];
	return NULL;
}

/* A live or relaxed MR that can serve @m, as odpd's cache would (simplified). */
static struct fake_mr *fake_mr_hit(struct fake_client *c, const Odpd__RegMr *m)
{
	if (m->flags & ODPD__REG_FLAGS__REG_NO_CACHE)
		return NULL;
	for (int i = 0; i < FAKE_MRS; i++) {
		struct fake_mr *mr = &c->mrs[i];

		if (mr->used && !mr->no_cache && mr->addr == m->addr && mr->length == m->length &&
		    mr->kind == (int)m->kind && (mr->access & m->access) == m->access)
			return mr;
	}
	return NULL;
}

/* How many pages of [addr, addr + length), rounded out, are in the page cache. */
static void fake_residency(const struct fake_seg *s, uint64_t addr, uint64_t length)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t start = addr & ~(pg - 1), end = (addr + length + pg - 1) & ~(pg - 1);
	unsigned char vec[1024];
	uint64_t n = (end - start) / pg;

	flog->reg_pages = (unsigned)n;
	flog->reg_resident = 0;
	if (n > sizeof(vec) || mincore(s->map + (start - s->client_addr), end - start, vec) < 0)
		return;
	for (uint64_t i = 0; i < n; i++)
		flog->reg_resident += vec[i] & 1;
}

/* false: hang up on the client. */
static bool fake_reg(struct fake_client *c, const Odpd__RegMr *m, const struct odpd_packet *p,
		     struct fake_reply *f)
{
	struct fake_seg *s = fake_seg_of(c, m->addr, m->length);
	struct fake_mr *mr = fake_mr_hit(c, m);
	bool hit = mr != NULL;

	flog->regs++;
	snprintf(flog->reg_device, sizeof(flog->reg_device), "%s", m->device ? m->device : "");
	flog->reg_access = m->access;
	flog->reg_kind = m->kind;
	flog->reg_client_pd = m->client_pd;
	flog->reg_pd_handle = m->client_pd_handle;
	flog->reg_nfds = p->nfds;
	flog->reg_has_flags = m->has_flags;
	flog->reg_flags = m->flags;
	flog->reg_pages = flog->reg_resident = 0;
	if (s)
		fake_residency(s, m->addr, m->length);
	for (int i = 0; i < FAKE_MRS && !mr; i++)
		if (!c->mrs[i].used)
			mr = &c->mrs[i];
	if (m->length == HANGUP_LENGTH)
		return false;
	if (m->flags & ODPD__REG_FLAGS__REG_UNPOPULATED)
		flog->reg_unpopulated++;
	if ((m->flags & ODPD__REG_FLAGS__REG_UNPOPULATED) && !hit && flog->reg_resident < flog->reg_pages)
		fake_fail(f, ENODATA, "fake: pages not resident");
	else if (m->length == QUOTA_LENGTH)
		fake_fail(f, ENOMEM, "fake: pinned quota exceeded");
	else if (m->length == LONG_MSG_LENGTH) {
		static char msg[3000];

		memset(msg, 'x', sizeof(msg) - 1);
		memcpy(msg, "fake: long", 10);
		fake_fail(f, E2BIG, msg);
	}
	else if (m->client_pd)
		fake_fail(f, EPERM, "fake: remote access not granted");
	else if (m->kind == ODPD__MR_KIND__MR_ODP)
		fake_fail(f, EOPNOTSUPP, "fake: ODP registration is not implemented yet");
	else if (!s || !mr)
		fake_fail(f, EINVAL, "fake: not inside a segment");
	if (f->r.status)
		return true;

	if (hit)
		mr->refs++;
	else
		*mr = (struct fake_mr) {
			.used = true, .handle = ++c->next_handle, .addr = m->addr, .length = m->length,
			.access = m->access, .kind = m->kind, .refs = 1,
			.no_cache = m->flags & ODPD__REG_FLAGS__REG_NO_CACHE,
		};
	c->registered = true;
	odpd__mr_reply__init(&f->mr);
	f->mr.has_handle = f->mr.has_lkey = f->mr.has_rkey = f->mr.has_iova = true;
	f->mr.has_length = f->mr.has_access = true;
	f->mr.has_generation = f->mr.has_cache_hit = true;
	f->mr.handle = mr->handle;
	f->mr.lkey = 0x1000 + (uint32_t)mr->handle;
	f->mr.rkey = 0x2000 + (uint32_t)mr->handle;
	f->mr.iova = m->addr;
	f->mr.length = m->length;
	f->mr.access = mr->access;
	f->mr.generation = FAKE_GENERATION + mr->handle;
	f->mr.cache_hit = hit;
	if (c->gen && !(m->flags & ODPD__REG_FLAGS__REG_NO_CACHE) && c->next_slot < c->gen_slots) {
		uint32_t slot = c->next_slot++;

		f->mr.has_slot = f->mr.has_ticket = f->mr.has_mr_iova = f->mr.has_mr_length = true;
		f->mr.slot = slot;
		f->mr.ticket = 1000 + slot;
		f->mr.mr_iova = mr->addr;
		f->mr.mr_length = mr->length;
		atomic_store(&c->gen[slot], f->mr.ticket);
	}
	f->r.body_case = ODPD__REPLY__BODY_MR;
	f->r.mr = &f->mr;
	return true;
}

static void fake_dereg(struct fake_client *c, const Odpd__DeregMr *d, struct fake_reply *f)
{
	struct fake_mr *mr = fake_mr_find(c, d->handle);

	flog->deregs++;
	flog->oneway_deregs += d->no_reply;
	flog->dereg_has_relaxed = d->has_relaxed;
	flog->dereg_relaxed = d->relaxed;
	if (!mr || mr->refs == 0)
		return fake_fail(f, ENOENT, "fake: no such MR");
	if (d->relaxed && mr->length == NO_RELAX_LENGTH)
		return fake_fail(f, ENOMEM, "fake: no room on the invalidation queue");
	if (--mr->refs == 0 && !d->relaxed)
		mr->used = false;
}

/* Drop the relaxed MRs (no holder left). */
static void fake_flush(struct fake_client *c, const Odpd__Flush *q, struct fake_reply *f)
{
	odpd__flush_reply__init(&f->flush);
	flog->flushes++;
	flog->flush_fields = q->has_all || q->has_pid || q->pd;
	for (int i = 0; i < FAKE_MRS; i++) {
		struct fake_mr *mr = &c->mrs[i];

		if (mr->used && mr->refs == 0) {
			mr->used = false;
			f->flush.mrs++;
			f->flush.bytes += mr->length;
		}
	}
	flog->flushed += f->flush.mrs;
	f->flush.has_mrs = f->flush.has_bytes = true;
	f->r.body_case = ODPD__REPLY__BODY_FLUSH;
	f->r.flush = &f->flush;
}

static void fake_join(struct fake_client *c, const Odpd__JoinPd *j, struct fake_reply *f)
{
	const char *name = j->name ? j->name : "";

	flog->joins++;
	snprintf(flog->join_name, sizeof(flog->join_name), "%s", name);
	if (c->registered)
		return fake_fail(f, EBUSY, "fake: the connection has registered an MR");
	if (c->joined)
		return fake_fail(f, EALREADY, "fake: the connection has joined a PD");
	if (!name[0] || strlen(name) > 63 ||
	    strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@-") != strlen(name))
		return fake_fail(f, EINVAL, "fake: invalid PD name");
	if (strcmp(name, FAKE_FORBIDDEN_PD) == 0)
		return fake_fail(f, EPERM, FAKE_PD_RULE);
	c->joined = true;
	odpd__join_pd_reply__init(&f->join);
	f->join.has_created = f->join.has_members = true;
	f->join.created = true;
	f->join.members = 1;
	f->r.body_case = ODPD__REPLY__BODY_JOIN_PD;
	f->r.join_pd = &f->join;
}

/* The CRC of the bytes through the fake's own mapping of the memfd. */
static void fake_verify(struct fake_client *c, const Odpd__Verify *v, struct fake_reply *f)
{
	struct fake_mr *mr = fake_mr_find(c, v->handle);
	uint64_t addr = v->length ? v->addr : mr ? mr->addr : 0;
	uint64_t len = v->length ? v->length : mr ? mr->length : 0;
	struct fake_seg *s = fake_seg_of(c, addr, len);

	flog->verifies++;
	if (!mr || !s)
		return fake_fail(f, !mr ? ENOENT : EINVAL, "fake: bad verify");
	odpd__verify_reply__init(&f->verify);
	f->verify.has_crc32 = f->verify.has_length = true;
	f->verify.crc32 = (uint32_t)crc32(0, s->map + (addr - s->client_addr), (uInt)len);
	f->verify.length = len;
	f->verify.method = "fake";
	f->r.body_case = ODPD__REPLY__BODY_VERIFY;
	f->r.verify = &f->verify;
}

static void fake_gen_unmap(struct fake_client *c)
{
	if (c->gen)
		munmap((void *)c->gen, c->gen_len);
	c->gen = NULL;
	if (c->use)
		munmap((void *)c->use, c->use_len);
	c->use = NULL;
	c->ring = 0;
	c->ring_head = 0;
	c->ring_frozen = false;
}

/* A stop that handed the connection over, before this request was read
 * (the next odpd reads it): the table is retired, its ring taken no more. */
static void fake_retire(struct fake_client *c)
{
	if (!c->gen)
		return;
	atomic_store(&c->gen[1], UINT64_MAX);
	c->ring_frozen = true;
}

/* Before each request, as odpd does: the releases written into the ring. */
static void fake_take_ring(struct fake_client *c)
{
	uint64_t tail;

	if (!c->ring || c->ring_frozen)
		return;
	tail = atomic_load(&c->use[c->gen_slots]);
	for (; c->ring_head < tail; c->ring_head++) {
		struct fake_mr *mr = fake_mr_find(c, atomic_load(&c->use[c->gen_slots + 1 +
									 c->ring_head % c->ring]));

		flog->ring_deregs++;
		if (mr && mr->refs > 0 && --mr->refs == 0)
			mr->used = false;
	}
	atomic_store(&c->gen[c->gen_slots], c->ring_head);
}

/* A generation table of its own (a new one each time); the events word counts on. */
static void fake_open_hit_table(struct fake_client *c, const Odpd__OpenHitTable *o, int use_fd,
				struct fake_reply *f)
{
	uint32_t slots = o->has_slots && o->slots <= 4096 ? o->slots : 4096;
	uint32_t ring = o->has_release_ring ? o->release_ring : 0;
	struct stat st;
	int fd;

	if (!flog->hit_tables)
		return fake_fail(f, EINVAL, "fake: unknown request");
	fake_gen_unmap(c);
	flog->last_hit_slots = slots;
	if (ring > flog->ring)
		ring = flog->ring;
	if (ring && (use_fd < 0 || fstat(use_fd, &st) < 0 ||
		     (uint64_t)st.st_size < (slots + 1 + ring) * sizeof(uint64_t) ||
		     (c->use = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, use_fd, 0)) == MAP_FAILED)) {
		c->use = NULL;
		return fake_fail(f, EINVAL, "fake: no room for the ring in the use table");
	}
	if (ring)
		c->use_len = (size_t)st.st_size;
	c->ring = ring;
	c->gen_slots = slots;
	c->gen_len = ((slots + (ring ? 1 + ring : 0)) * sizeof(uint64_t) + 4095) & ~(size_t)4095;
	c->next_slot = 2;
	fd = memfd_create("fake-hit-generations", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)c->gen_len) < 0 ||
	    (c->gen = mmap(NULL, c->gen_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		c->gen = NULL;
		if (fd >= 0)
			close(fd);
		return fake_fail(f, EIO, "fake: no generation table");
	}
	atomic_store(&c->gen[1], c->events);
	flog->hit_opens++;
	odpd__hit_table_reply__init(&f->hit_table);
	f->hit_table.has_slots = f->hit_table.has_events_slot = true;
	f->hit_table.slots = slots;
	f->hit_table.events_slot = 1;
	f->hit_table.has_release_ring = ring != 0;
	f->hit_table.release_ring = ring;
	f->r.body_case = ODPD__REPLY__BODY_HIT_TABLE;
	f->r.hit_table = &f->hit_table;
	f->fd = fd;
}

static bool fake_dispatch(struct fake_client *c, const Odpd__Request *q, const struct odpd_packet *p,
			  const struct fake_opts *o, struct fake_reply *f)
{
	switch (q->body_case) {
	case ODPD__REQUEST__BODY_HELLO:
		fake_hello(q->hello, o, f);
		return true;
	case ODPD__REQUEST__BODY_ATTACH_SEGMENT:
		fake_attach(c, q->attach_segment, p, f);
		return true;
	case ODPD__REQUEST__BODY_DETACH_SEGMENT:
		fake_detach(c, q->detach_segment, f);
		return true;
	case ODPD__REQUEST__BODY_REG_MR:
		return fake_reg(c, q->reg_mr, p, f);
	case ODPD__REQUEST__BODY_DEREG_MR:
		fake_dereg(c, q->dereg_mr, f);
		return true;
	case ODPD__REQUEST__BODY_VERIFY:
		fake_verify(c, q->verify, f);
		return true;
	case ODPD__REQUEST__BODY_FLUSH:
		fake_flush(c, q->flush, f);
		return true;
	case ODPD__REQUEST__BODY_JOIN_PD:
		fake_join(c, q->join_pd, f);
		return true;
	case ODPD__REQUEST__BODY_OPEN_HIT_TABLE:
		fake_open_hit_table(c, q->open_hit_table, p->nfds ? p->fds[0] : -1, f);
		return true;
	case ODPD__REQUEST__BODY_MAP_SEGMENT:
		flog->maps++;
		flog->map_offset = q->map_segment->offset;
		flog->map_length = q->map_segment->length;
		return true;
	default:
		fake_fail(f, EINVAL, "fake: unknown request");
		return true;
	}
}

static void fake_drop(struct fake_client *c)
{
	for (int i = 0; i < FAKE_SEGS; i++)
		if (c->segs[i].used)
			munmap(c->segs[i].map, c->segs[i].length);
	close(c->sock);
	fake_gen_unmap(c);
	memset(c, 0, sizeof(*c));
	c->sock = -1;
}

static uint64_t verify_length(const Odpd__Request *q)
{
	return q->body_case == ODPD__REQUEST__BODY_VERIFY ? q->verify->length : 0;
}

/* An event as the new odpd sends it after a crash: counted in the events word first. */
static void fake_restart_event(struct fake_client *c, uint64_t last_id)
{
	Odpd__Reply event = ODPD__REPLY__INIT;
	Odpd__RestartEvent re = ODPD__RESTART_EVENT__INIT;

	re.has_last_id = true;
	re.last_id = last_id;
	event.has_id = true;
	event.body_case = ODPD__REPLY__BODY_RESTART_EVENT;
	event.restart_event = &re;
	c->events++;
	if (c->gen)
		atomic_store(&c->gen[1], c->events);
	odpd_wire_send(c->sock, &event.base, NULL, 0, 0);
	__atomic_add_fetch(&flog->restart_events, 1, __ATOMIC_RELEASE);
}

static bool fake_oneway(const Odpd__Request *q)
{
	return q->body_case == ODPD__REQUEST__BODY_DEREG_MR && q->dereg_mr->no_reply;
}

/*
 * The crash scripts before the reply (Verify lengths, see the top). true:
 * no reply now (the request is to be sent again). @dup: answer twice.
 */
static bool fake_restart(struct fake_client *c, const Odpd__Request *q, const struct odpd_packet *p,
			 const uint8_t *buf, bool *dup)
{
	uint64_t len = verify_length(q);

	*dup = false;
	if (c->restart_len && q->id == c->restart_id) {
		/* the request sent again */
		if ((size_t)c->restart_len == p->len && memcmp(c->restart_req, buf, p->len) == 0)
			flog->resends++;
		else
			flog->resend_mismatches++;
		*dup = verify_length(q) == RESTART_DUP_LENGTH;
		c->restart_len = 0;
		return false;
	}
	if (q->id <= c->last_id && fake_oneway(q)) {
		flog->oneway_resends++;
		return false;
	}
	if (q->id <= c->last_id)
		flog->unasked_resends++;
	c->last_id = q->id;
	if ((len == RESTART_LENGTH || len == RESTART_DUP_LENGTH || len == RESTART_ONEWAY_LENGTH ||
	     len == RESTART_KEPT_LENGTH) && p->len <= sizeof(c->restart_req)) {
		c->restart_len = (int)p->len;
		c->restart_id = q->id;
		memcpy(c->restart_req, buf, p->len);
		fake_restart_event(c, len == RESTART_KEPT_LENGTH ? q->id :
				   q->id - (len == RESTART_ONEWAY_LENGTH ? 3 : 1));
		return true;
	}
	return false;
}

/* Scripted bad answers to Verify; true if the normal reply is not to follow. */
static bool fake_misbehave(struct fake_client *c, const Odpd__Request *q)
{
	static uint8_t junk[ODPD_MAX_PACKET + 100];
	uint64_t len = q->body_case == ODPD__REQUEST__BODY_VERIFY ? q->verify->length : 0;

	memset(junk, 0xff, sizeof(junk));
	if (len == GARBAGE_LENGTH || len == LATE_LENGTH)
		send(c->sock, junk, 16, MSG_NOSIGNAL);
	else if (len == HUGE_LENGTH)
		send(c->sock, junk, sizeof(junk), MSG_NOSIGNAL);
	return len == GARBAGE_LENGTH || len == HUGE_LENGTH;
}

/* One request: an event first (which the library must skip), then the reply. */
static void fake_handle(struct fake_client *c, const struct fake_opts *o)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];
	Odpd__Reply event = ODPD__REPLY__INIT;
	struct fake_reply f;
	struct odpd_packet p;
	Odpd__Request *q;
	bool keep, quiet, dup;

	if (odpd_wire_recv(c->sock, buf, sizeof(buf), &p, 0) < 0 || p.eof)
		return fake_drop(c);
	q = odpd__request__unpack(NULL, p.len, buf);
	if (!q) {
		odpd_packet_close_fds(&p);
		return fake_drop(c);
	}
	if (verify_length(q) == RETIRE_LENGTH)
		fake_retire(c);
	fake_take_ring(c);
	if (fake_restart(c, q, &p, buf, &dup)) {
		odpd_packet_close_fds(&p);
		odpd__request__free_unpacked(q, NULL);
		return;
	}
	memset(&f, 0, sizeof(f));
	f.fd = -1;
	odpd__reply__init(&f.r);
	f.r.has_id = true;
	f.r.id = q->id;
	keep = fake_dispatch(c, q, &p, o, &f);
	odpd_packet_close_fds(&p);
	if (!keep) {
		odpd__request__free_unpacked(q, NULL);
		return fake_drop(c);
	}
	if (fake_oneway(q)) {                /* no event, no reply */
		odpd__request__free_unpacked(q, NULL);
		return;
	}
	event.has_id = true;
	odpd_wire_send(c->sock, &event.base, NULL, 0, 0);
	quiet = fake_misbehave(c, q);
	if (!quiet)
		odpd_wire_send(c->sock, &f.r.base, f.fd >= 0 ? &f.fd : NULL, f.fd >= 0 ? 1 : 0, 0);
	if (dup) {
		/* the first copy's answer too, with an fd the library must close */
		int fd = memfd_create("fake-dup-reply", MFD_CLOEXEC);

		odpd_wire_send(c->sock, &f.r.base, &fd, fd >= 0 ? 1 : 0, 0);
		if (fd >= 0)
			close(fd);
	}
	if (verify_length(q) == RESTART_AFTER_LENGTH)
		fake_restart_event(c, q->id);
	odpd__request__free_unpacked(q, NULL);
	if (f.fd >= 0)
		close(f.fd);
}

static void fake_accept(int listener, struct fake_client *cl)
{
	int s = accept4(listener, NULL, NULL, SOCK_CLOEXEC);

	for (int i = 0; s >= 0 && i < FAKE_CLIENTS; i++) {
		if (cl[i].sock < 0) {
			cl[i].sock = s;
			return;
		}
	}
	if (s >= 0)
		close(s);
}

static void fake_serve(int listener, const struct fake_opts *o)
{
	struct fake_client cl[FAKE_CLIENTS];

	memset(cl, 0, sizeof(cl));
	for (int i = 0; i < FAKE_CLIENTS; i++)
		cl[i].sock = -1;
	if (o->accept_gate > 0) {
		char b;

		while (read(o->accept_gate, &b, 1) < 0 && errno == EINTR)
			;
	}
	for (;;) {
		struct pollfd p[FAKE_CLIENTS + 1] = { { .fd = listener, .events = POLLIN } };

		for (int i = 0; i < FAKE_CLIENTS; i++)
			p[i + 1] = (struct pollfd) { .fd = cl[i].sock, .events = POLLIN };
		if (poll(p, FAKE_CLIENTS + 1, -1) < 0)
			continue;
		if (p[0].revents & POLLIN)
			fake_accept(listener, cl);
		for (int i = 0; i < FAKE_CLIENTS; i++)
			if (cl[i].sock >= 0 && p[i + 1].revents)
				fake_handle(&cl[i], o);
	}
}

/* Listen at @path and serve there from a child process. */
static pid_t fake_start(const char *path, const struct fake_opts *o)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	pid_t pid;

	CHECK(listener >= 0 && strlen(path) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, path);
	CHECK(bind(listener, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(listener, 8) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fake_serve(listener, o);
		_exit(0);
	}
	close(listener);
	return pid;
}

static void fake_stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* ---------------------------------------------------------------- helpers */

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static int sealed_memfd(size_t size)
{
	int fd = memfd_create("test-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)size) == 0);
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	return fd;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Is the page at @p mapped in this process's page tables (/proc/self/pagemap bit 63)? */
static bool page_present(const void *p)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t e = 0;

	CHECK(fd >= 0);
	CHECK(pread(fd, &e, sizeof(e), (off_t)((uintptr_t)p / page_size() * sizeof(e))) == sizeof(e));
	close(fd);
	return e >> 63;
}

/* Dirty bytes (Shared_Dirty + Private_Dirty of smaps) of the mapping that starts at @start. */
static size_t mapping_dirty(const void *start)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512], head[32];
	bool in = false, found = false;
	size_t dirty = 0, kb;

	CHECK(f);
	snprintf(head, sizeof(head), "%lx-", (unsigned long)(uintptr_t)start);
	while (fgets(line, sizeof(line), f)) {
		/* a mapping's first line: "start-end perms ..." (no ':' after the first word) */
		if (strchr(line, '-') && strcspn(line, ":") > strcspn(line, " ")) {
			in = strncmp(line, head, strlen(head)) == 0;
			found |= in;
		} else if (in && (sscanf(line, "Shared_Dirty: %zu kB", &kb) == 1 ||
				  sscanf(line, "Private_Dirty: %zu kB", &kb) == 1)) {
			dirty += kb * 1024;
		}
	}
	fclose(f);
	CHECK(found);
	return dirty;
}

/* ---------------------------------------------------------------- tests */

/*
 * A program built against an older odpd.h passes the sizeof of its older
 * struct: struct odpd_device_attr as in 1.0 and struct odpd_stats as in 1.3
 * (written out here as they were released). Any size from those up is
 * accepted, the call writes nothing past the size it was given, and a
 * smaller size is EINVAL.
 */
struct device_attr_1_0 {
	char name[64], transport[16], fw_ver[64];
	uint64_t node_guid;
	uint32_t phys_port_cnt;
	uint64_t max_mr_size, odp_general_caps;
	uint32_t odp_rc_caps, odp_uc_caps, odp_ud_caps;
	int odp, implicit_odp;
	enum odpd_support advise_mr;
	int advise_mr_errno;
	enum odpd_support import;
	int import_errno;
};
struct stats_1_3 {
	uint64_t local_hits, daemon_hits, misses, local_releases, revoked, cached_mrs, cached_bytes;
	int hit_table;
};

static void test_old_struct_sizes(struct odpd_conn *c)
{
	union {
		struct device_attr_1_0 v1;
		unsigned char bytes[sizeof(struct odpd_device_attr) + 64];
	} a;
	union {
		struct stats_1_3 v1;
		unsigned char bytes[sizeof(struct odpd_stats) + 64];
	} st;

	memset(&a, 0xa5, sizeof(a));
	CHECK(odpd_query_device(c, 1, (struct odpd_device_attr *)&a.v1, sizeof(a.v1)) == 0);
	CHECK(strcmp(a.v1.name, "mlx5_0") == 0 && a.v1.import == ODPD_SUPPORT_YES);
	for (size_t i = sizeof(a.v1); i < sizeof(a.bytes); i++)
		CHECK(a.bytes[i] == 0xa5);
	/* the end of its last field (no tail padding): still accepted, and
	 * nothing written past it */
	memset(&a, 0xa5, sizeof(a));
	CHECK(odpd_query_device(c, 1, (struct odpd_device_attr *)&a.v1, ODPD_DEVICE_ATTR_SIZE_1_0) == 0);
	CHECK(a.v1.import_errno == 0);
	for (size_t i = ODPD_DEVICE_ATTR_SIZE_1_0; i < sizeof(a.bytes); i++)
		CHECK(a.bytes[i] == 0xa5);
	CHECK_FAIL(odpd_query_device(c, 1, (struct odpd_device_attr *)&a.v1, ODPD_DEVICE_ATTR_SIZE_1_0 - 1) == 0,
		   EINVAL, "first version");
	/* a newer caller's larger struct: zeros past ours */
	memset(&a, 0xa5, sizeof(a));
	CHECK(odpd_query_device(c, 1, (struct odpd_device_attr *)&a.v1, sizeof(a.bytes)) == 0);
	for (size_t i = sizeof(struct odpd_device_attr); i < sizeof(a.bytes); i++)
		CHECK(a.bytes[i] == 0);

	memset(&st, 0xa5, sizeof(st));
	CHECK(odpd_stats(c, (struct odpd_stats *)&st.v1, sizeof(st.v1)) == 0);
	CHECK(st.v1.local_hits == 0 && st.v1.hit_table == 0);
	for (size_t i = sizeof(st.v1); i < sizeof(st.bytes); i++)
		CHECK(st.bytes[i] == 0xa5);
	memset(&st, 0xa5, sizeof(st));
	CHECK(odpd_stats(c, (struct odpd_stats *)&st.v1, ODPD_STATS_SIZE_1_3) == 0);
	for (size_t i = ODPD_STATS_SIZE_1_3; i < sizeof(st.bytes); i++)
		CHECK(st.bytes[i] == 0xa5);
	CHECK_FAIL(odpd_stats(c, (struct odpd_stats *)&st.v1, ODPD_STATS_SIZE_1_3 - 1) == 0, EINVAL,
		   "first version");
	CHECK(odpd_stats(c, (struct odpd_stats *)&st.v1, sizeof(st.bytes)) == 0);
	for (size_t i = sizeof(struct odpd_stats); i < sizeof(st.bytes); i++)
		CHECK(st.bytes[i] == 0);
}

static void test_connect(const char *path)
{
	struct odpd_device_attr attr;
	struct odpd_conn *c;

	c = odpd_connect(path, NULL);
	CHECK(c);
	CHECK(strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->hello_version == ODPD_PROTOCOL_VERSION);
	CHECK(strcmp(flog->client_name, program_invocation_short_name) == 0);
	CHECK(odpd_device_count(c) == 2);
	CHECK(odpd_query_device(c, 1, &attr, sizeof(attr)) == 0);
	CHECK(strcmp(attr.name, "mlx5_0") == 0 && strcmp(attr.transport, "RoCE") == 0);
	CHECK(attr.import == ODPD_SUPPORT_YES && attr.odp && attr.node_guid == 0x1122334455667789ull);
	CHECK(odpd_query_device(c, 0, &attr, sizeof(attr)) == 0);
	CHECK(attr.import == ODPD_SUPPORT_NO && attr.import_errno == EOPNOTSUPP);
	CHECK(attr.advise_mr == ODPD_SUPPORT_UNKNOWN);
	CHECK_FAIL(odpd_query_device(c, 2, &attr, sizeof(attr)) == 0, ENODEV, "no device 2");
	CHECK_FAIL(odpd_query_device(c, 0, &attr, 8) == 0, EINVAL, "attr_size");
	test_old_struct_sizes(c);
	CHECK_FAIL(odpd_query_device(c, 0, NULL, sizeof(attr)) == 0, EINVAL, "attr");
	odpd_disconnect(c);

	CHECK_FAIL(odpd_connect(path, "nodev9"), ENODEV, "nodev9");
	CHECK_FAIL(odpd_connect("", NULL), EINVAL, "socket path");
}

static void test_version(void)
{
	char path[128];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/refuse.sock", test_dir);
	pid = fake_start(path, &(struct fake_opts) { .hello_status = EPROTONOSUPPORT });
	CHECK_FAIL(odpd_connect(path, NULL), EPROTONOSUPPORT, "odpd_connect: hello: fake: protocol version refused");
	fake_stop(pid);
	unlink(path);

	snprintf(path, sizeof(path), "%s/v7.sock", test_dir);
	pid = fake_start(path, &(struct fake_opts) { .version = 7 });
	CHECK_FAIL(odpd_connect(path, NULL), EPROTONOSUPPORT, "libodpd speaks 1");
	fake_stop(pid);
	unlink(path);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

struct fill {
	int fd[64];
	int n;
	int gate;                       /* write end: lets the fake daemon accept */
};

/* Once odpd_connect() was interrupted a few times in its connect(2), close
 * the connections that fill the queue and let the fake daemon accept: it
 * reads their end of file and has room for the one that waited. */
static void *fill_close(void *arg)
{
	struct fill *f = arg;

	for (int i = 0; i < 10000 && alarms < 5; i++)
		usleep(1000);
	while (f->n)
		close(f->fd[--f->n]);
	CHECK(write(f->gate, "g", 1) == 1);
	return NULL;
}

/* odpd_connect() while odpd's listen queue is full blocks in connect(2); a
 * signal of the application's (its handler without SA_RESTART) interrupts
 * that, and the library connects again instead of failing with EINTR. */
static void test_connect_interrupted(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct sigaction act = { .sa_handler = on_alarm }, old;
	struct itimerval tick = { { 0, 20000 }, { 0, 20000 } }, off = { 0 };
	struct fill f = { .n = 0 };
	struct odpd_conn *c;
	sigset_t alrm;
	pthread_t th;
	char path[128];
	int gate[2];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/full.sock", test_dir);
	CHECK(pipe2(gate, O_CLOEXEC) == 0);
	pid = fake_start(path, &(struct fake_opts) { .accept_gate = gate[0] });
	close(gate[0]);
	f.gate = gate[1];
	strcpy(sa.sun_path, path);
	/* fill the listen queue (backlog 8): a further connect would block */
	for (; f.n < 64; f.n++) {
		f.fd[f.n] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		CHECK(f.fd[f.n] >= 0);
		if (connect(f.fd[f.n], (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			CHECK(errno == EAGAIN);
			close(f.fd[f.n]);
			break;
		}
	}
	CHECK(f.n > 0 && f.n < 64);
	sigemptyset(&act.sa_mask);                /* no SA_RESTART */
	CHECK(sigaction(SIGALRM, &act, &old) == 0);
	alarms = 0;
	/* the signals go to this thread: the helper starts with SIGALRM blocked */
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	CHECK(pthread_sigmask(SIG_BLOCK, &alrm, NULL) == 0);
	CHECK(pthread_create(&th, NULL, fill_close, &f) == 0);
	CHECK(pthread_sigmask(SIG_UNBLOCK, &alrm, NULL) == 0);
	CHECK(setitimer(ITIMER_REAL, &tick, NULL) == 0);
	c = odpd_connect(path, NULL);
	setitimer(ITIMER_REAL, &off, NULL);
	CHECK(pthread_join(th, NULL) == 0);
	sigaction(SIGALRM, &old, NULL);
	if (!c)
		fprintf(stderr, "odpd_connect: %s\n", odpd_errmsg());
	CHECK(c);
	CHECK(alarms >= 5);                       /* it was interrupted while it waited */
	odpd_disconnect(c);
	close(gate[1]);
	fake_stop(pid);
	unlink(path);
}

static void test_alloc_reg_verify(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, "mlx5_0");
	uint64_t window = flog->next_window;
	struct odpd_segment *seg;
	struct odpd_mr *mr, *mr2;
	unsigned regs;
	uint8_t *p, local[64];
	uint32_t crc;

	CHECK(c);
	CHECK_FAIL(odpd_alloc(c, 0, 0), EINVAL, "length is 0");
	CHECK_FAIL(odpd_alloc(c, 4096, 0x80), EINVAL, "unknown flags");
	CHECK_FAIL(odpd_alloc(c, SIZE_MAX - 5, 0), ENOMEM, "too large");

	seg = odpd_alloc(c, 5000, 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	/* mapped where the daemon mapped it: iova == address on both sides */
	CHECK((uintptr_t)p == window && flog->attach_client_addr == 0);
	CHECK(odpd_segment_length(seg) == 2 * page_size());
	CHECK(flog->attach_nfds == 1 && odpd_segment_fd(seg) >= 0);
	CHECK(fcntl(odpd_segment_fd(seg), F_GET_SEALS) == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
	CHECK(all_zero(p, odpd_segment_length(seg)));
	for (size_t i = 0; i < odpd_segment_length(seg); i++)
		p[i] = (uint8_t)(i * 7);

	mr = odpd_reg(c, p + 100, 4000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr);
	CHECK(mr->addr == p + 100 && mr->length == 4000 && mr->iova == (uintptr_t)(p + 100));
	CHECK(mr->access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	CHECK(mr->lkey == 0x1000 + mr->handle && mr->rkey == 0x2000 + mr->handle);
	CHECK(strcmp(flog->reg_device, "mlx5_0") == 0 && flog->reg_kind == ODPD__MR_KIND__MR_PINNED);
	CHECK(flog->reg_access == (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_READ));
	CHECK(!flog->reg_client_pd && flog->reg_nfds == 0);

	/* The daemon sees this process's writes: the memory is shared. */
	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0);
	CHECK(crc == crc32(0, p + 100, 4000));
	CHECK(odpd_verify(mr, p + 200, 64, &crc) == 0);
	CHECK(crc == crc32(0, p + 200, 64));
	memset(p + 200, 0xab, 64);
	CHECK(odpd_verify(mr, p + 200, 64, &crc) == 0 && crc == crc32(0, p + 200, 64));
	CHECK_FAIL(odpd_verify(mr, p + 50, 64, &crc) == 0, EINVAL, "not inside the MR");
	CHECK_FAIL(odpd_verify(mr, p + 4000, 200, &crc) == 0, EINVAL, "not inside the MR");
	CHECK_FAIL(odpd_verify(mr, NULL, 64, &crc) == 0, EINVAL, "whole MR");

	/* Checked here, before anything is sent. */
	regs = flog->regs;
	CHECK_FAIL(odpd_reg(c, local, sizeof(local), 0), EINVAL, "allocate the buffer with odpd_alloc()");
	CHECK_FAIL(odpd_reg(c, p, 2 * page_size() + 1, 0), EINVAL, "odpd_attach()");
	CHECK_FAIL(odpd_reg(c, (void *)(UINTPTR_MAX - 10), 100, 0), EINVAL, "overflows");
	CHECK_FAIL(odpd_reg(c, p, 0, 0), EINVAL, "length is 0");
	CHECK_FAIL(odpd_reg(c, p, 64, IBV_ACCESS_REMOTE_WRITE), EINVAL, "LOCAL_WRITE");
	CHECK_FAIL(odpd_reg(c, p, 64, IBV_ACCESS_MW_BIND), EINVAL, "not supported");
	CHECK(flog->regs == regs);

	/* The daemon's refusal, with its errno and message. */
	mr2 = odpd_reg(c, p, 64, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr2 && errno == EOPNOTSUPP && flog->reg_kind == ODPD__MR_KIND__MR_ODP);
	CHECK(strcmp(odpd_errmsg(), "odpd_reg: fake: ODP registration is not implemented yet") == 0);

	/* EBUSY while an MR lies in the segment. */
	CHECK_FAIL(odpd_detach(seg) == 0, EBUSY, "deregister them first");
	CHECK(odpd_dereg(mr) == 0);
	CHECK(odpd_detach(seg) == 0);
	CHECK(strcmp(odpd_errmsg(), "") == 0);
	odpd_disconnect(c);
}

/* odpd_reg_attr: what it sends, what it checks before sending, what it returns. */
static void test_reg_attr(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, 8 * page_size(), 0) : NULL;
	uint8_t *p = odpd_segment_addr(seg);
	struct odpd_reg_attr attr;
	struct odpd_mr *mr, *mr2, *mr3;
	unsigned regs;

	CHECK(seg);
	/* Checked here, before anything is sent. */
	regs = flog->regs;
	attr = (struct odpd_reg_attr) { .comp_mask = 1u << 2 };
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EINVAL, "odpd_reg_attr: comp_mask 0x4");
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_ACCESS | 0x80000000u };
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EINVAL, "comp_mask");
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_FLAGS, .flags = 1u << 3 };
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EINVAL, "odpd_reg_attr: flags 0x8 not supported");
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_ACCESS, .access = IBV_ACCESS_REMOTE_WRITE };
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EINVAL, "LOCAL_WRITE");
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_ACCESS, .access = IBV_ACCESS_MW_BIND };
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EINVAL, "not supported");
	CHECK_FAIL(odpd_reg_attr(c, p, 0, NULL), EINVAL, "odpd_reg_attr: length is 0");
	CHECK_FAIL(odpd_reg_attr(c, p, 9 * page_size(), NULL), EINVAL, "odpd_alloc()");
	CHECK_FAIL(odpd_reg_attr(NULL, p, 64, NULL), EINVAL, "odpd_reg_attr: no connection");
	CHECK(flog->regs == regs);

	/* attr NULL: access 0, no flags. */
	mr = odpd_reg_attr(c, p, 64, NULL);
	CHECK(mr && flog->regs == regs + 1 && strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->reg_access == 0 && flog->reg_kind == ODPD__MR_KIND__MR_PINNED && !flog->reg_has_flags);
	CHECK(mr->access == 0 && mr->addr == p && mr->length == 64 && mr->iova == (uintptr_t)p);
	CHECK(odpd_dereg(mr) == 0);

	/* Fields comp_mask does not name are not read. */
	attr = (struct odpd_reg_attr) { .comp_mask = 0, .access = 0xffff, .flags = 0xffff };
	mr = odpd_reg_attr(c, p, 64, &attr);
	CHECK(mr && flog->reg_access == 0 && !flog->reg_has_flags && mr->access == 0);
	CHECK(odpd_dereg(mr) == 0);
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_FLAGS, .access = IBV_ACCESS_LOCAL_WRITE };
	mr = odpd_reg_attr(c, p, 64, &attr);
	CHECK(mr && flog->reg_access == 0 && !flog->reg_has_flags);
	CHECK(odpd_dereg(mr) == 0);

	/* Access and NO_CACHE go out; the reply is mapped, generation 64 bits wide. */
	attr = (struct odpd_reg_attr) {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
		.flags = ODPD_REG_NO_CACHE,
	};
	mr = odpd_reg_attr(c, p + 100, 4000, &attr);
	CHECK(mr && flog->reg_has_flags && flog->reg_flags == ODPD__REG_FLAGS__REG_NO_CACHE);
	CHECK(flog->reg_access == (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_READ));
	CHECK(mr->access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	CHECK(mr->addr == p + 100 && mr->length == 4000 && mr->lkey == 0x1000 + mr->handle);
	CHECK(mr->generation == FAKE_GENERATION + mr->handle && mr->cache_hit == 0);
	/* Again with NO_CACHE: sent again, so a fresh MR. */
	mr2 = odpd_reg_attr(c, p + 100, 4000, &attr);
	CHECK(mr2 && mr2->handle != mr->handle && mr2->cache_hit == 0 && flog->reg_flags == ODPD__REG_FLAGS__REG_NO_CACHE);
	/* ODPD_REG_NO_POPULATE stays here: not a wire flag. */
	attr.flags = ODPD_REG_NO_POPULATE;
	mr3 = odpd_reg_attr(c, p + 100, 4000, &attr);
	CHECK(mr3 && !flog->reg_has_flags && mr3->cache_hit == 0);
	CHECK(odpd_dereg(mr3) == 0 && odpd_dereg(mr2) == 0 && odpd_dereg(mr) == 0);

	/* odpd_reg is odpd_reg_attr with comp_mask ODPD_REG_ATTR_ACCESS. */
	mr = odpd_reg(c, p, 128, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && flog->reg_access == ODPD__ACCESS__ACCESS_LOCAL_WRITE && !flog->reg_has_flags);
	CHECK(mr->generation == FAKE_GENERATION + mr->handle && mr->cache_hit == 0);
	/* A second registration of the range is the fake's cache hit: same MR, mapped as such. */
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_ACCESS, .access = 0 };
	mr2 = odpd_reg_attr(c, p, 128, &attr);
	CHECK(mr2 && mr2 != mr && mr2->cache_hit == 1);
	CHECK(mr2->lkey == mr->lkey && mr2->generation == mr->generation);
	CHECK(mr2->access == IBV_ACCESS_LOCAL_WRITE);  /* granted: more than asked */
	CHECK(odpd_dereg(mr2) == 0 && odpd_dereg(mr) == 0);

	/* The daemon's refusals carry this call's name. */
	attr = (struct odpd_reg_attr) { .comp_mask = ODPD_REG_ATTR_ACCESS, .access = IBV_ACCESS_LOCAL_WRITE };
	CHECK(odpd_reg_attr(c, p, QUOTA_LENGTH, &attr) == NULL && errno == ENOMEM);
	CHECK(strcmp(odpd_errmsg(), "odpd_reg_attr: fake: pinned quota exceeded") == 0);
	attr.access |= IBV_ACCESS_ON_DEMAND;
	CHECK_FAIL(odpd_reg_attr(c, p, 64, &attr), EOPNOTSUPP, "odpd_reg_attr: fake: ODP");
	CHECK(flog->reg_kind == ODPD__MR_KIND__MR_ODP);
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

/* odpd_dereg_relaxed sends relaxed; odpd_flush_relaxed sends an empty Flush. */
static void test_relaxed(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, 4 * page_size(), 0) : NULL;
	uint8_t *p = odpd_segment_addr(seg);
	size_t len = 2 * page_size();
	struct odpd_mr *mr, *mr2;
	unsigned deregs, flushes;
	uint64_t generation;
	uint32_t lkey, crc;

	CHECK(seg);
	mr = odpd_reg(c, p, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->cache_hit == 0);
	generation = mr->generation;
	lkey = mr->lkey;

	/* odpd_dereg: not relaxed. */
	mr2 = odpd_reg(c, p, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2 && mr2->cache_hit == 1);
	deregs = flog->deregs;
	CHECK(odpd_dereg(mr2) == 0);
	CHECK(flog->deregs == deregs + 1 && !flog->dereg_relaxed);

	/* The last reference released relaxed: the MR stays, and is a hit again. */
	CHECK(odpd_dereg_relaxed(mr) == 0 && strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->deregs == deregs + 2 && flog->dereg_has_relaxed && flog->dereg_relaxed);
	mr = odpd_reg(c, p, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->cache_hit == 1 && mr->lkey == lkey && mr->generation == generation);
	/* The library forgot the released MR: the segment holds one MR again. */
	CHECK(odpd_dereg_relaxed(mr) == 0);
	CHECK(odpd_dereg_relaxed(NULL) == -1 && errno == EINVAL);
	CHECK(strcmp(odpd_errmsg(), "odpd_dereg_relaxed: mr is NULL") == 0);

	/* Flush: no field set; afterwards a registration is a new MR. */
	flushes = flog->flushes;
	flog->flushed = 0;
	CHECK(odpd_flush_relaxed(c) == 0 && strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->flushes == flushes + 1 && !flog->flush_fields && flog->flushed == 1);
	mr = odpd_reg(c, p, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->cache_hit == 0 && mr->generation != generation);
	CHECK(odpd_flush_relaxed(c) == 0 && flog->flushed == 1);  /* a live MR stays */
	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0);
	CHECK(odpd_dereg(mr) == 0);
	CHECK_FAIL(odpd_flush_relaxed(NULL) == 0, EINVAL, "odpd_flush_relaxed: no connection");

	/* Refused: the daemon's errno and message, and the MR stays valid. */
	mr = odpd_reg(c, p, NO_RELAX_LENGTH, 0);
	CHECK(mr);
	CHECK_FAIL(odpd_dereg_relaxed(mr) == 0, ENOMEM,
		   "odpd_dereg_relaxed: fake: no room on the invalidation queue");
	CHECK_FAIL(odpd_detach(seg) == 0, EBUSY, "deregister them first");
	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0 && crc == crc32(0, p, NO_RELAX_LENGTH));
	CHECK(odpd_dereg(mr) == 0);
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

static void test_join_pd(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL), *c2 = odpd_connect(path, NULL);
	struct odpd_segment *seg;
	char name[80];
	unsigned joins = flog->joins;

	CHECK(c && c2);
	/* Checked here, before anything is sent. */
	CHECK_FAIL(odpd_join_pd(c, NULL) == 0, EINVAL, "odpd_join_pd: name is NULL");
	CHECK_FAIL(odpd_join_pd(c, "") == 0, EINVAL, "odpd_join_pd: name is empty");
	memset(name, 'a', 64);
	name[64] = '\0';
	CHECK_FAIL(odpd_join_pd(c, name) == 0, EINVAL, "longer than 63 bytes");
	CHECK_FAIL(odpd_join_pd(NULL, "x") == 0, EINVAL, "odpd_join_pd: no connection");
	CHECK(flog->joins == joins);

	/* 63 bytes are fine; the name goes out as given. */
	name[63] = '\0';
	CHECK(odpd_join_pd(c, name) == 0 && strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->joins == joins + 1 && strcmp(flog->join_name, name) == 0);
	CHECK_FAIL(odpd_join_pd(c, "other") == 0, EALREADY, "odpd_join_pd: fake: the connection has joined a PD");

	/* The daemon's policy: EPERM with the rule that refused. */
	errno = 0;
	CHECK(odpd_join_pd(c2, FAKE_FORBIDDEN_PD) == -1 && errno == EPERM);
	CHECK(strcmp(odpd_errmsg(), "odpd_join_pd: " FAKE_PD_RULE) == 0);
	CHECK(strcmp(flog->join_name, FAKE_FORBIDDEN_PD) == 0);
	/* The characters are the daemon's to check. */
	CHECK_FAIL(odpd_join_pd(c2, "no spaces") == 0, EINVAL, "odpd_join_pd: fake: invalid PD name");
	CHECK(flog->joins == joins + 4 && strcmp(flog->join_name, "no spaces") == 0);

	/* After a registration: EBUSY. */
	seg = odpd_alloc(c2, page_size(), 0);
	CHECK(seg);
	CHECK(odpd_dereg(odpd_reg(c2, odpd_segment_addr(seg), 64, 0)) == 0);
	CHECK_FAIL(odpd_join_pd(c2, "late") == 0, EBUSY, "odpd_join_pd: fake: the connection has registered an MR");
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c2);
	odpd_disconnect(c);
}

/* A memfd of @pages pages mapped MAP_SHARED with @prot here. */
static uint8_t *map_memfd(size_t pages, int prot, int *ret_fd)
{
	int fd = sealed_memfd(pages * page_size());
	void *p = mmap(NULL, pages * page_size(), prot, MAP_SHARED, fd, 0);

	CHECK(p != MAP_FAILED);
	*ret_fd = fd;
	return p;
}

/* Does this kernel know MADV_POPULATE_READ (Linux 5.14)? */
static bool populate_supported(void)
{
	void *p = mmap(NULL, page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok;

	CHECK(p != MAP_FAILED);
	ok = madvise(p, page_size(), 22 /* MADV_POPULATE_READ */) == 0;
	CHECK(ok || errno == EINVAL);
	munmap(p, page_size());
	return ok;
}

/*
 * Pinned registrations fault the range in this process first (so the pages
 * are charged to this process, not the daemon): writable mappings for
 * writing, read-only ones for reading; not with ODPD_REG_NO_POPULATE, not
 * for ODP.
 */
static void test_populate(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	size_t pg = page_size();
	struct odpd_segment *seg = c ? odpd_alloc(c, 8 * pg, 0) : NULL, *seg2;
	struct odpd_reg_attr attr = { .comp_mask = ODPD_REG_ATTR_FLAGS, .flags = ODPD_REG_NO_POPULATE };
	uint8_t *p = odpd_segment_addr(seg), *q;
	struct odpd_mr *mr, *mr2;
	char fdpath[64];
	unsigned regs;
	int fd, rofd;

	CHECK(seg);
	for (size_t i = 0; i < 8; i++)
		CHECK(!page_present(p + i * pg));
	CHECK(mapping_dirty(p) == 0);
	if (!populate_supported()) {
		/* madvise's EINVAL is ignored: the registration goes ahead unpopulated. */
		printf("populate: this kernel has no MADV_POPULATE_*: checked that registration works\n");
		mr = odpd_reg(c, p, pg, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr && strcmp(odpd_errmsg(), "") == 0 && flog->reg_resident == 0);
		CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);
		odpd_disconnect(c);
		return;
	}

	/* [p + pg + 100, +2 pages) rounds out to pages 1..3: all in memory when RegMr came. */
	mr = odpd_reg(c, p + pg + 100, 2 * pg, 0);
	CHECK(mr && flog->reg_pages == 3 && flog->reg_resident == 3);
	CHECK(!page_present(p) && page_present(p + pg) && page_present(p + 2 * pg));
	CHECK(page_present(p + 3 * pg) && !page_present(p + 4 * pg));
	/* faulted for writing: the segment is writable */
	CHECK(mapping_dirty(p) == 3 * pg);

	/* ODPD_REG_NO_POPULATE: left to the daemon. */
	mr2 = odpd_reg_attr(c, p + 5 * pg, pg, &attr);
	CHECK(mr2 && flog->reg_pages == 1 && flog->reg_resident == 0 && !page_present(p + 5 * pg));
	CHECK(odpd_dereg(mr2) == 0);
	/* ODP: nothing pinned, nothing faulted. */
	CHECK_FAIL(odpd_reg(c, p + 6 * pg, pg, IBV_ACCESS_ON_DEMAND), EOPNOTSUPP, "ODP");
	CHECK(flog->reg_pages == 1 && flog->reg_resident == 0 && !page_present(p + 6 * pg));
	CHECK(mapping_dirty(p) == 3 * pg);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);

	/* A read-only segment (O_RDONLY fd: mapped PROT_READ) is faulted for reading. */
	fd = sealed_memfd(2 * pg);
	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
	rofd = open(fdpath, O_RDONLY | O_CLOEXEC);
	CHECK(rofd >= 0);
	seg2 = odpd_attach(c, rofd, NULL, 0);
	CHECK(seg2);
	q = odpd_segment_addr(seg2);
	mr = odpd_reg(c, q, 2 * pg, 0);
	CHECK(mr && flog->reg_pages == 2 && flog->reg_resident == 2);
	CHECK(page_present(q) && page_present(q + pg) && mapping_dirty(q) == 0);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg2) == 0);
	close(rofd);
	close(fd);

	/* Attached writable, made read-only since: faulted for reading. */
	q = map_memfd(2, PROT_READ | PROT_WRITE, &fd);
	seg2 = odpd_attach(c, fd, q, 2 * pg);
	CHECK(seg2 && mprotect(q, 2 * pg, PROT_READ) == 0);
	mr = odpd_reg(c, q, 2 * pg, 0);
	CHECK(mr && flog->reg_resident == 2 && page_present(q) && mapping_dirty(q) == 0);
	CHECK(odpd_dereg(mr) == 0);
	/* madvise's EINVAL (here: PROT_NONE; or a kernel before 5.14) is no error. */
	CHECK(mprotect(q, 2 * pg, PROT_NONE) == 0);
	CHECK(madvise(q, 2 * pg, MADV_DONTNEED) == 0);
	mr = odpd_reg(c, q, pg, 0);
	CHECK(mr && strcmp(odpd_errmsg(), "") == 0);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg2) == 0);
	munmap(q, 2 * pg);
	close(fd);

	/* Other errors of madvise fail the call, before anything is sent: a hole. */
	q = map_memfd(3, PROT_READ | PROT_WRITE, &fd);
	seg2 = odpd_attach(c, fd, q, 3 * pg);
	CHECK(seg2 && munmap(q + pg, pg) == 0);
	regs = flog->regs;
	CHECK_FAIL(odpd_reg(c, q, 3 * pg, IBV_ACCESS_LOCAL_WRITE), ENOMEM, "odpd_reg: faulting in");
	CHECK(strstr(odpd_errmsg(), "MADV_POPULATE_WRITE") && flog->regs == regs);
	mr = odpd_reg_attr(c, q, 3 * pg, &attr);          /* NO_POPULATE: sent */
	CHECK(mr && flog->regs == regs + 1);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg2) == 0);
	munmap(q, pg);
	munmap(q + 2 * pg, pg);
	close(fd);
	odpd_disconnect(c);
}

/* How many of the @n pages from @p are present in this process's page table. */
static size_t pages_present(const void *p, size_t n)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t e[512];
	size_t present = 0;

	CHECK(fd >= 0);
	for (size_t done = 0; done < n;) {
		size_t k = n - done < 512 ? n - done : 512;
		off_t at = (off_t)(((uintptr_t)p / page_size() + done) * sizeof(e[0]));

		CHECK(pread(fd, e, k * sizeof(e[0]), at) == (ssize_t)(k * sizeof(e[0])));
		for (size_t i = 0; i < k; i++)
			present += e[i] >> 63;
		done += k;
	}
	close(fd);
	return present;
}

/*
 * The pre-fault policies: on attach (ODPD_ALLOC_POPULATE), on hint
 * (odpd_populate: no registration, one MapSegment), never
 * (ODPD_ALLOC_NO_POPULATE); a large
 * range is split over threads: every page of it and none beside it, and an
 * error in any part fails the call.
 */
/*
 * A daemon that says HelloReply.resident_check_max: a pinned range up to
 * that long goes with REG_UNPOPULATED and no fault-in here; where pages
 * are not resident, the daemon's ENODATA makes the library fault them in
 * (here, for writing) and ask again without the flag; longer ranges are
 * faulted in first, as before.
 */
static void test_reg_unpopulated(const char *path)
{
	struct odpd_conn *c;
	size_t pg = page_size();
	struct odpd_segment *seg;
	struct odpd_mr *mr;
	unsigned regs, unpop;
	uint8_t *p;

	flog->resident_check_max = 4 * pg;
	c = odpd_connect(path, NULL);
	flog->resident_check_max = 0;
	CHECK(c);
	seg = odpd_alloc(c, 16 * pg, 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	CHECK(!page_present(p) && !page_present(p + pg));
	/* not resident: asked with the flag, refused, faulted in, asked again */
	regs = flog->regs;
	unpop = flog->reg_unpopulated;
	mr = odpd_reg(c, p, 2 * pg, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && strcmp(odpd_errmsg(), "") == 0);
	CHECK(flog->regs == regs + 2 && flog->reg_unpopulated == unpop + 1);
	CHECK(!(flog->reg_flags & ODPD__REG_FLAGS__REG_UNPOPULATED));
	CHECK(flog->reg_pages == 2 && flog->reg_resident == 2 && mapping_dirty(p) == 2 * pg);
	CHECK(odpd_dereg(mr) == 0);
	/* resident now: one request, with the flag */
	mr = odpd_reg(c, p, 2 * pg, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && flog->regs == regs + 3 && flog->reg_unpopulated == unpop + 2);
	CHECK(flog->reg_flags & ODPD__REG_FLAGS__REG_UNPOPULATED);
	CHECK(odpd_dereg(mr) == 0);
	/* longer than resident_check_max: faulted in first, no flag */
	mr = odpd_reg(c, p + 4 * pg, 5 * pg, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && flog->regs == regs + 4 && flog->reg_unpopulated == unpop + 2);
	CHECK(flog->reg_resident == 5 && !(flog->reg_flags & ODPD__REG_FLAGS__REG_UNPOPULATED));
	CHECK(odpd_dereg(mr) == 0);
	/* ODPD_REG_NO_POPULATE: no flag either (the daemon faults) */
	mr = odpd_reg_attr(c, p + 12 * pg, pg, &(struct odpd_reg_attr){ .comp_mask = ODPD_REG_ATTR_FLAGS,
				   .flags = ODPD_REG_NO_POPULATE });
	CHECK(mr && flog->reg_unpopulated == unpop + 2 && flog->reg_resident == 0);
	CHECK(odpd_dereg(mr) == 0);
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

static void test_populate_policy(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	size_t pg = page_size(), big = (48u << 20) + 4 * pg, big_pages = big / pg;
	struct odpd_segment *seg, *seg2;
	struct odpd_mr *mr;
	unsigned regs, maps;
	uint8_t *p;
	int fd;

	CHECK(c);
	if (!populate_supported()) {
		printf("populate policy: this kernel has no MADV_POPULATE_*: not checked\n");
		odpd_disconnect(c);
		return;
	}
	CHECK_FAIL(odpd_alloc(c, pg, ODPD_ALLOC_POPULATE | ODPD_ALLOC_NO_POPULATE), EINVAL,
		   "ODPD_ALLOC_POPULATE and ODPD_ALLOC_NO_POPULATE");
	CHECK_FAIL(odpd_alloc(c, pg, 1u << 7), EINVAL, "unknown flags");

	/* on attach: all 8 pages, faulted for writing, before odpd_alloc returns;
	 * then odpd maps its view of them (MapSegment) */
	maps = flog->maps;
	seg = odpd_alloc(c, 8 * pg, ODPD_ALLOC_POPULATE);
	CHECK(seg && pages_present(odpd_segment_addr(seg), 8) == 8);
	CHECK(flog->maps == maps + 1 && flog->map_offset == 0 && flog->map_length == 8 * pg);
	CHECK(mapping_dirty(odpd_segment_addr(seg)) == 8 * pg);
	CHECK(odpd_detach(seg) == 0);

	/* never: a pinned registration leaves the faulting to the daemon */
	seg = odpd_alloc(c, 4 * pg, ODPD_ALLOC_NO_POPULATE);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	mr = odpd_reg(c, p, 2 * pg, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && flog->reg_pages == 2 && flog->reg_resident == 0 && pages_present(p, 4) == 0);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);

	/* on hint: just the range, rounded out to pages; one MapSegment, no RegMr */
	seg = odpd_alloc(c, 8 * pg, 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	regs = flog->regs;
	maps = flog->maps;
	CHECK(odpd_populate(seg, p + pg + 10, 2 * pg) == 0);
	CHECK(!page_present(p) && pages_present(p + pg, 3) == 3 && pages_present(p + 4 * pg, 4) == 0);
	CHECK(flog->regs == regs && flog->maps == maps + 1);
	CHECK(flog->map_offset == pg + 10 && flog->map_length == 2 * pg);
	mr = odpd_reg(c, p + pg, 3 * pg, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && flog->reg_pages == 3 && flog->reg_resident == 3);
	CHECK(odpd_dereg(mr) == 0);
	CHECK_FAIL(odpd_populate(NULL, p, pg) == 0, EINVAL, "segment is NULL");
	CHECK_FAIL(odpd_populate(seg, p, 0) == 0, EINVAL, "not inside the segment");
	CHECK_FAIL(odpd_populate(seg, p - pg, 2 * pg) == 0, EINVAL, "not inside the segment");
	CHECK_FAIL(odpd_populate(seg, p + 7 * pg, 2 * pg) == 0, EINVAL, "not inside the segment");
	CHECK_FAIL(odpd_populate(seg, p + pg, SIZE_MAX) == 0, EINVAL, "not inside the segment");
	CHECK(pages_present(p + 4 * pg, 4) == 0 && flog->maps == maps + 1);
	CHECK(odpd_detach(seg) == 0);

	/* a large range, in 4 parts on 3 threads and this one (ODPD_POPULATE_THREADS=4) */
	seg = odpd_alloc(c, big + 2 * pg, 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	CHECK(odpd_populate(seg, p + pg, big) == 0);
	CHECK(!page_present(p) && pages_present(p + pg, big_pages) == big_pages);
	CHECK(!page_present(p + pg + big));
	CHECK(mapping_dirty(p) == big);
	CHECK(odpd_detach(seg) == 0);

	/* an error in the last part (a page no longer mapped) fails the call */
	p = map_memfd(big_pages, PROT_READ | PROT_WRITE, &fd);
	seg2 = odpd_attach(c, fd, p, big);
	CHECK(seg2 && munmap(p + big - 2 * pg, pg) == 0);
	CHECK_FAIL(odpd_populate(seg2, p, big) == 0, ENOMEM, "MADV_POPULATE_WRITE");
	/* every part ran: the third up to the hole */
	CHECK(pages_present(p, big_pages - 2) == big_pages - 2 && !page_present(p + big - pg));
	CHECK(odpd_detach(seg2) == 0);
	munmap(p, big - 2 * pg);
	munmap(p + big - pg, pg);
	close(fd);
	odpd_disconnect(c);
}

/* The daemon's answer with errno and message, for a quota refusal. */
static void test_daemon_error(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg;

	CHECK(c);
	seg = odpd_alloc(c, 4 * page_size(), 0);
	CHECK(seg);
	CHECK_FAIL(odpd_reg(c, odpd_segment_addr(seg), QUOTA_LENGTH, IBV_ACCESS_LOCAL_WRITE), ENOMEM,
		   "odpd_reg: fake: pinned quota exceeded");
	CHECK(strcmp(flog->reg_device, "rxe0") == 0);   /* NULL device: the first */
	/* A reply too large for the library's reply arena (a long message):
	 * the same error; the sanitizers' run finds a leak or a bad free. The
	 * call after it decodes into the arena again. */
	errno = 0;
	CHECK(odpd_reg(c, odpd_segment_addr(seg), LONG_MSG_LENGTH, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == E2BIG);
	CHECK(strncmp(odpd_errmsg(), "odpd_reg: fake: longxxx", 23) == 0);
	CHECK_FAIL(odpd_reg(c, odpd_segment_addr(seg), QUOTA_LENGTH, IBV_ACCESS_LOCAL_WRITE), ENOMEM,
		   "odpd_reg: fake: pinned quota exceeded");
	/* Disconnect with a segment and an MR still there frees them. */
	CHECK(odpd_reg(c, odpd_segment_addr(seg), 100, 0));
	odpd_disconnect(c);
}

/* The daemon's address is taken here: map elsewhere and attach there. */
static void test_alloc_taken(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	void *blocker = mmap((void *)(uintptr_t)flog->next_window, page_size(), PROT_NONE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	unsigned attaches = flog->attaches, detaches = flog->detaches;
	struct odpd_segment *seg;
	struct odpd_mr *mr;
	uint8_t *p;
	uint32_t crc;

	CHECK(c && blocker == (void *)(uintptr_t)flog->next_window);
	seg = odpd_alloc(c, 3 * page_size(), 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	CHECK(p != blocker);
	CHECK(flog->attaches == attaches + 2 && flog->detaches == detaches + 1);
	CHECK(flog->attach_client_addr == (uintptr_t)p && flog->attach_file_offset == 0);
	CHECK(flog->attach_length == 3 * page_size());
	memset(p, 0x5a, 3 * page_size());
	mr = odpd_reg(c, p, 3 * page_size(), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && odpd_verify(mr, NULL, 0, &crc) == 0 && crc == crc32(0, p, 3 * (uInt)page_size()));
	CHECK(odpd_dereg(mr) == 0);
	CHECK(odpd_detach(seg) == 0);
	munmap(blocker, page_size());
	odpd_disconnect(c);
}

static void test_attach(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	size_t pg = page_size();
	int fd = sealed_memfd(4 * pg), other = sealed_memfd(4 * pg), unsealed;
	struct odpd_segment *seg;
	uint8_t *shared, *priv, *p;
	struct odpd_mr *mr;
	uint32_t crc;

	CHECK(c);
	/* The whole file where the daemon put it; the fd stays the caller's. */
	seg = odpd_attach(c, fd, NULL, 0);
	CHECK(seg && odpd_segment_fd(seg) == fd && odpd_segment_length(seg) == 4 * pg);
	CHECK(flog->attach_client_addr == 0 && flog->attach_length == 0);
	p = odpd_segment_addr(seg);
	p[0] = 42;
	CHECK(odpd_detach(seg) == 0);
	CHECK(fcntl(fd, F_GETFD) >= 0);

	/* A mapping the caller made: pages 1 and 2 of the file. */
	shared = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)pg);
	CHECK(shared != MAP_FAILED);
	seg = odpd_attach(c, fd, shared, 2 * pg);
	CHECK(seg && odpd_segment_addr(seg) == shared && odpd_segment_length(seg) == 2 * pg);
	CHECK(flog->attach_client_addr == (uintptr_t)shared && flog->attach_file_offset == pg);
	CHECK(flog->attach_length == 2 * pg);
	memset(shared, 0x33, 2 * pg);
	mr = odpd_reg(c, shared + pg, pg, 0);
	CHECK(mr && odpd_verify(mr, NULL, 0, &crc) == 0 && crc == crc32(0, shared + pg, (uInt)pg));
	CHECK(odpd_dereg(mr) == 0);
	/* Inside the mapping, at an offset. */
	CHECK(odpd_detach(seg) == 0);
	seg = odpd_attach(c, fd, shared + pg, pg);
	CHECK(seg && flog->attach_file_offset == 2 * pg);
	CHECK(odpd_detach(seg) == 0);

	CHECK_FAIL(odpd_attach(c, fd, shared, 3 * pg), EINVAL, "not inside one mapping");
	CHECK_FAIL(odpd_attach(c, fd, shared + 1, pg), EINVAL, "page aligned");
	CHECK_FAIL(odpd_attach(c, fd, shared, 0), EINVAL, "length is 0");
	CHECK_FAIL(odpd_attach(c, fd, NULL, pg), EINVAL, "must be 0");
	CHECK_FAIL(odpd_attach(c, other, shared, pg), EINVAL, "is not of fd");
	CHECK_FAIL(odpd_attach(c, -1, NULL, 0), EBADF, "fd -1");
	CHECK_FAIL(odpd_attach(c, 1000, NULL, 0), EBADF, "fd 1000");

	priv = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	CHECK(priv != MAP_FAILED);
	CHECK_FAIL(odpd_attach(c, fd, priv, pg), EINVAL, "MAP_PRIVATE");
	CHECK(strstr(odpd_errmsg(), "MAP_SHARED"));

	unsealed = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(unsealed >= 0 && ftruncate(unsealed, (off_t)pg) == 0);
	CHECK_FAIL(odpd_attach(c, unsealed, NULL, 0), EINVAL, "F_SEAL_SHRINK | F_SEAL_GROW");
	CHECK_FAIL(odpd_attach(c, 0, NULL, 0), EINVAL, "not a memfd");

	munmap(priv, pg);
	munmap(shared, 2 * pg);
	close(unsealed);
	close(other);
	close(fd);
	odpd_disconnect(c);
}

/* After fork the child's copy is dead; the parent's connection is untouched. */
static void test_fork(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, page_size(), 0) : NULL;
	struct odpd_mr *mr = seg ? odpd_reg(c, odpd_segment_addr(seg), 64, 0) : NULL;
	uint32_t crc;
	int status;
	pid_t pid;

	CHECK(mr);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		const char *msg = "connection belongs to the parent process (fork)";

		CHECK_FAIL(odpd_reg(c, odpd_segment_addr(seg), 64, 0), ENOTCONN, msg);
		CHECK_FAIL(odpd_verify(mr, NULL, 0, &crc) == 0, ENOTCONN, msg);
		CHECK_FAIL(odpd_dereg(mr) == 0, ENOTCONN, msg);
		CHECK_FAIL(odpd_detach(seg) == 0, ENOTCONN, msg);
		CHECK_FAIL(odpd_alloc(c, 4096, 0), ENOTCONN, msg);
		CHECK_FAIL(odpd_reg_attr(c, odpd_segment_addr(seg), 64, NULL), ENOTCONN, msg);
		CHECK_FAIL(odpd_dereg_relaxed(mr) == 0, ENOTCONN, msg);
		CHECK_FAIL(odpd_flush_relaxed(c) == 0, ENOTCONN, msg);
		CHECK_FAIL(odpd_join_pd(c, "pd") == 0, ENOTCONN, msg);
		odpd_disconnect(c);
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0);
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

/* The daemon hangs up: ENOTCONN now and for every later call. */
static void test_hangup(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, 4 * page_size(), 0) : NULL;

	CHECK(seg);
	CHECK_FAIL(odpd_reg(c, odpd_segment_addr(seg), HANGUP_LENGTH, 0), ENOTCONN,
		   "the daemon closed the connection");
	CHECK_FAIL(odpd_reg(c, odpd_segment_addr(seg), 64, 0), ENOTCONN, "the daemon closed");
	CHECK_FAIL(odpd_detach(seg) == 0, ENOTCONN, "odpd_detach");
	odpd_disconnect(c);
}

/* Unreadable replies are EIO; the connection stays usable. */
static void test_bad_replies(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, page_size(), 0) : NULL;
	uint8_t *p = odpd_segment_addr(seg);
	struct odpd_mr *mr = seg ? odpd_reg(c, p, page_size(), 0) : NULL;
	uint32_t crc;

	CHECK(mr);
	CHECK_FAIL(odpd_verify(mr, p, GARBAGE_LENGTH, &crc) == 0, EIO, "malformed reply");
	CHECK(odpd_verify(mr, p, 64, &crc) == 0 && crc == crc32(0, p, 64));
	CHECK_FAIL(odpd_verify(mr, p, HUGE_LENGTH, &crc) == 0, EIO, "larger than");
	CHECK(odpd_verify(mr, p, 64, &crc) == 0 && crc == crc32(0, p, 64));
	/* The late reply to the failed request is skipped by the next call. */
	CHECK_FAIL(odpd_verify(mr, p, LATE_LENGTH, &crc) == 0, EIO, "malformed reply");
	CHECK(odpd_verify(mr, p + 64, 128, &crc) == 0 && crc == crc32(0, p + 64, 128));
	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

static unsigned open_fds(void)
{
	char path[64];
	unsigned n = 0;

	for (int fd = 0; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n += access(path, F_OK) == 0;
	}
	return n;
}

/*
 * odpd crashed and a new one took the connection back (RestartEvent): the
 * request it did not keep is sent again, same id and bytes, and answered;
 * one it kept is not sent again; a second answer to a request sent again is
 * skipped by the next call, its fd closed. From the event on, the hit table
 * serves no local hit, and the next call opens a new one, although the
 * (fake) daemon never marked the old one retired; an event read between
 * calls does the same, and sends nothing again.
 */
static void test_restart_event(const char *path)
{
	struct odpd_conn *c;
	struct odpd_segment *seg;
	struct odpd_mr *mr, *mr2;
	struct odpd_stats st;
	unsigned regs, fds, events;
	uint32_t crc;
	uint8_t *p;

	flog->hit_tables = 1;
	flog->hit_opens = flog->resends = flog->resend_mismatches = flog->unasked_resends = 0;
	c = odpd_connect(path, NULL);
	CHECK(c && flog->hit_opens == 1);
	CHECK(odpd_stats(c, &st, sizeof(st)) == 0 && st.hit_table);
	seg = odpd_alloc(c, 4 * page_size(), 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);
	memset(p, 0x5a, page_size());
	mr = odpd_reg(c, p, page_size(), 0);
	CHECK(mr && mr->cache_hit == 0);
	regs = flog->regs;
	mr2 = odpd_reg(c, p, page_size(), 0);         /* a local hit: the daemon is not asked */
	CHECK(mr2 && mr2->cache_hit == 1 && flog->regs == regs);
	CHECK(odpd_dereg(mr2) == 0);

	/* not kept: sent again, answered */
	CHECK(odpd_verify(mr, p, RESTART_LENGTH, &crc) == 0 && crc == crc32(0, p, RESTART_LENGTH));
	CHECK(flog->resends == 1 && flog->resend_mismatches == 0);
	CHECK(flog->hit_opens == 1);                  /* not yet: the next call */
	/* the old table serves nothing more, though its words did not change */
	mr2 = odpd_reg(c, p, page_size(), 0);
	CHECK(mr2 && flog->regs == regs + 1);
	CHECK(flog->hit_opens == 2);
	CHECK(odpd_stats(c, &st, sizeof(st)) == 0 && st.hit_table);
	CHECK(odpd_dereg(mr2) == 0);

	/* kept, its answer lost at the crash (the journal took it before the
	 * send): sent again all the same, or the call would wait forever */
	CHECK(odpd_verify(mr, p, RESTART_KEPT_LENGTH, &crc) == 0 && crc == crc32(0, p, RESTART_KEPT_LENGTH));
	CHECK(flog->resends == 2 && flog->resend_mismatches == 0);
	CHECK(odpd_verify(mr, p, 64, &crc) == 0 && crc == crc32(0, p, 64));
	CHECK(flog->unasked_resends == 0 && flog->resends == 2);
	CHECK(flog->hit_opens == 3);                  /* that table was mapped at the event too */

	/* answered twice: the second answer is skipped, its fd closed */
	fds = open_fds();
	CHECK(odpd_verify(mr, p, RESTART_DUP_LENGTH, &crc) == 0 && crc == crc32(0, p, RESTART_DUP_LENGTH));
	CHECK(flog->resends == 3);
	CHECK(odpd_verify(mr, p + 64, 128, &crc) == 0 && crc == crc32(0, p + 64, 128));
	CHECK(open_fds() == fds);
	CHECK(flog->hit_opens == 4);

	/*
	 * between calls: read by the next call's drain, nothing sent again. The
	 * fake sends the event after the reply; wait until it is queued, or
	 * the next call may run before it arrives.
	 */
	events = __atomic_load_n(&flog->restart_events, __ATOMIC_ACQUIRE);
	CHECK(odpd_verify(mr, p, RESTART_AFTER_LENGTH, &crc) == 0);
	for (int i = 0; i < 5000 && __atomic_load_n(&flog->restart_events, __ATOMIC_ACQUIRE) == events; i++)
		usleep(1000);
	CHECK(__atomic_load_n(&flog->restart_events, __ATOMIC_ACQUIRE) == events + 1);
	CHECK(flog->hit_opens == 4);
	CHECK(odpd_verify(mr, p, 64, &crc) == 0 && crc == crc32(0, p, 64));
	CHECK(flog->hit_opens == 5);
	CHECK(flog->unasked_resends == 0 && flog->resends == 3 && flog->resend_mismatches == 0);

	CHECK(odpd_dereg(mr) == 0 && odpd_detach(seg) == 0);
	odpd_disconnect(c);
	flog->hit_tables = 0;
}

/* A connection for the one-way tests: one-way releases up to 16 pages, a
 * segment of 64 pages at *@p, and *@keep, an MR of page 40 it holds. */
static struct odpd_conn *oneway_connect(const char *path, struct odpd_segment **seg, char **p,
					struct odpd_mr **keep)
{
	struct odpd_conn *c;

	flog->oneway_dereg_max = 16 * page_size();
	flog->resends = flog->resend_mismatches = flog->unasked_resends = flog->oneway_resends = 0;
	c = odpd_connect(path, NULL);
	CHECK(c);
	*seg = odpd_alloc(c, 64 * page_size(), 0);
	CHECK(*seg);
	*p = odpd_segment_addr(*seg);
	memset(*p, 0x3c, 64 * page_size());
	*keep = odpd_reg(c, *p + 40 * page_size(), page_size(), IBV_ACCESS_LOCAL_WRITE);
	CHECK(*keep);
	return c;
}

/* Two releases that do not wait, then a crash whose new odpd kept neither
 * (the fake's RestartEvent for RESTART_ONEWAY_LENGTH): both sent again. */
static void oneway_crash(struct odpd_conn *c, char *p, struct odpd_mr *keep)
{
	struct odpd_mr *mr[2];
	uint32_t crc;

	mr[0] = odpd_reg(c, p, page_size(), IBV_ACCESS_LOCAL_WRITE);
	mr[1] = odpd_reg(c, p + page_size(), page_size(), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr[0] && mr[1] && odpd_dereg(mr[0]) == 0 && odpd_dereg(mr[1]) == 0);
	CHECK(odpd_verify(keep, p + 40 * page_size(), RESTART_ONEWAY_LENGTH, &crc) == 0 &&
	      crc == crc32(0, (const uint8_t *)p + 40 * page_size(), RESTART_ONEWAY_LENGTH));
	CHECK(flog->oneway_resends == 2 && flog->resends == 1 && flog->unasked_resends == 0);
}

/*
 * One-way releases (DeregMr.no_reply; the fake does not answer them): a
 * short local pinned MR's release is not waited for; one with remote
 * access, longer than HelloReply.oneway_dereg_max, relaxed, or with
 * ODPD_ONEWAY_DEREG=0 is; after 32 in a row the next waits. After a
 * RestartEvent that did not keep them, they are sent again, same ids.
 */
static void test_oneway_dereg(const char *path)
{
	const unsigned lw = IBV_ACCESS_LOCAL_WRITE;
	struct odpd_conn *c;
	struct odpd_segment *seg;
	struct odpd_mr *mr[33], *keep;
	unsigned deregs, oneway;
	uint32_t crc;
	char *p;

	c = oneway_connect(path, &seg, &p, &keep);

	/* short and local: sent, not waited for (the fake never answers it) */
	deregs = flog->deregs;
	oneway = flog->oneway_deregs;
	mr[0] = odpd_reg(c, p, page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0);
	CHECK(odpd_verify(keep, p + 40 * page_size(), 64, &crc) == 0);   /* read after it, in order */
	CHECK(flog->deregs == deregs + 1 && flog->oneway_deregs == oneway + 1);

	/* waited for: remote access, longer than the daemon allows, relaxed */
	mr[0] = odpd_reg(c, p, page_size(), lw | IBV_ACCESS_REMOTE_READ);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0);
	mr[0] = odpd_reg(c, p, 17 * page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0);
	mr[0] = odpd_reg(c, p + page_size(), page_size(), lw);
	CHECK(mr[0] && odpd_dereg_relaxed(mr[0]) == 0);
	CHECK(flog->deregs == deregs + 4 && flog->oneway_deregs == oneway + 1);
	CHECK(odpd_flush_relaxed(c) == 0);

	/* 32 in a row, then one that waits (and answers for them all) */
	for (int i = 0; i < 33; i++)
		CHECK((mr[i] = odpd_reg(c, p + (size_t)i * page_size(), page_size(), lw)) != NULL);
	for (int i = 0; i < 33; i++)
		CHECK(odpd_dereg(mr[i]) == 0);
	CHECK(flog->deregs == deregs + 37 && flog->oneway_deregs == oneway + 33);

	/* a crash: the new odpd kept neither of the two: both sent again */
	oneway_crash(c, p, keep);
	CHECK(odpd_dereg(keep) == 0 && odpd_detach(seg) == 0);
	odpd_disconnect(c);

	/* ODPD_ONEWAY_DEREG=0: every release waits */
	setenv("ODPD_ONEWAY_DEREG", "0", 1);
	c = odpd_connect(path, NULL);
	unsetenv("ODPD_ONEWAY_DEREG");
	CHECK(c && (seg = odpd_alloc(c, 4 * page_size(), 0)) != NULL);
	oneway = flog->oneway_deregs;
	mr[0] = odpd_reg(c, odpd_segment_addr(seg), page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0 && flog->oneway_deregs == oneway);
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c);
	flog->oneway_dereg_max = 0;
}

/*
 * The release ring (since 1.4.5): where the daemon grants one, a release
 * that qualifies for a one-way request is written into it instead (no
 * request: the fake sees no DeregMr, and takes the ring before the next
 * request, as odpd does). A full ring makes the next release wait for its
 * answer. After a RestartEvent that did not keep them, the releases are
 * sent again as one-way requests; after a stop that handed the connection
 * over (the table retired, no RestartEvent), those the odpd before did not
 * take. ODPD_CACHE=0 still opens a table, with
 * the two header slots only, for the ring; ODPD_ONEWAY_DEREG=0 then opens
 * none.
 */
static void test_release_ring(const char *path)
{
	const unsigned lw = IBV_ACCESS_LOCAL_WRITE;
	struct odpd_conn *c;
	struct odpd_segment *seg;
	struct odpd_mr *mr[9], *keep;
	struct odpd_stats st;
	unsigned deregs, oneway, taken, opens, regs;
	uint32_t crc;
	char *p;

	flog->hit_tables = 1;
	flog->ring = 8;
	c = oneway_connect(path, &seg, &p, &keep);

	/* written, not sent: the fake takes it before the next request */
	deregs = flog->deregs;
	oneway = flog->oneway_deregs;
	taken = flog->ring_deregs;
	mr[0] = odpd_reg(c, p, page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0);
	CHECK(flog->deregs == deregs && flog->oneway_deregs == oneway && flog->ring_deregs == taken);
	CHECK(odpd_verify(keep, p + 40 * page_size(), 64, &crc) == 0);
	CHECK(flog->ring_deregs == taken + 1);

	/* relaxed or with remote access: a request that waits, as before */
	mr[0] = odpd_reg(c, p, page_size(), lw | IBV_ACCESS_REMOTE_READ);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0 && flog->deregs == deregs + 1);

	/* nine in a row into a ring of eight: the ninth waits, after the eight
	 * were taken */
	for (int i = 0; i < 9; i++)
		CHECK((mr[i] = odpd_reg(c, p + (size_t)(2 + i) * page_size(), page_size(), lw)) != NULL);
	taken = flog->ring_deregs;
	for (int i = 0; i < 9; i++)
		CHECK(odpd_dereg(mr[i]) == 0);
	CHECK(flog->ring_deregs == taken + 8 && flog->deregs == deregs + 2 && flog->oneway_deregs == oneway);

	/* a crash: the new odpd kept neither of the two written just before:
	 * both sent again, as one-way requests */
	oneway_crash(c, p, keep);
	/* the new table has a ring of its own */
	taken = flog->ring_deregs;
	mr[0] = odpd_reg(c, p, page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0 && odpd_verify(keep, p + 40 * page_size(), 64, &crc) == 0);
	CHECK(flog->ring_deregs == taken + 1 && flog->oneway_deregs == oneway + 2);

	/* a stop that handed the connection over (no RestartEvent) after this
	 * release was written and before odpd took it: the library sends it
	 * (one-way) once it sees the table retired, before the new table */
	opens = flog->hit_opens;
	mr[0] = odpd_reg(c, p, page_size(), lw);
	CHECK(mr[0] && odpd_dereg(mr[0]) == 0);
	CHECK(odpd_verify(keep, p + 40 * page_size(), RETIRE_LENGTH, &crc) == 0);
	CHECK(flog->ring_deregs == taken + 1 && flog->oneway_deregs == oneway + 2);
	CHECK(odpd_verify(keep, p + 40 * page_size(), 64, &crc) == 0);
	CHECK(flog->hit_opens == opens + 1);
	CHECK(flog->oneway_deregs == oneway + 3);     /* not lost */
	CHECK(flog->ring_deregs == taken + 1);
	CHECK(odpd_dereg(keep) == 0 && odpd_detach(seg) == 0);
	odpd_disconnect(c);

	/* ODPD_CACHE=0: a table without slots for references, for the ring */
	setenv("ODPD_CACHE", "0", 1);
	opens = flog->hit_opens;
	c = odpd_connect(path, NULL);
	CHECK(c && flog->hit_opens == opens + 1 && flog->last_hit_slots == 2);
	CHECK(odpd_stats(c, &st, sizeof(st)) == 0 && !st.hit_table);
	CHECK((seg = odpd_alloc(c, 4 * page_size(), 0)) != NULL);
	taken = flog->ring_deregs;
	regs = flog->regs;
	mr[0] = odpd_reg(c, odpd_segment_addr(seg), page_size(), lw);
	mr[1] = odpd_reg(c, odpd_segment_addr(seg), page_size(), lw);   /* no local hit */
	CHECK(mr[0] && mr[1] && flog->regs == regs + 2);
	CHECK(odpd_dereg(mr[0]) == 0 && odpd_dereg(mr[1]) == 0);
	CHECK(odpd_detach(seg) == 0 && flog->ring_deregs == taken + 2);
	odpd_disconnect(c);
	/* and with ODPD_ONEWAY_DEREG=0 too, none */
	setenv("ODPD_ONEWAY_DEREG", "0", 1);
	c = odpd_connect(path, NULL);
	CHECK(c && flog->hit_opens == opens + 1);
	odpd_disconnect(c);
	unsetenv("ODPD_ONEWAY_DEREG");
	unsetenv("ODPD_CACHE");
	flog->oneway_dereg_max = 0;
	flog->ring = 0;
	flog->hit_tables = 0;
}

/* Huge pages: rounded to the huge page size, or refused where none are reserved. */
static void test_hugetlb(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg;

	CHECK(c);
	seg = odpd_alloc(c, 5000, ODPD_ALLOC_HUGETLB);
	if (seg) {
		CHECK(odpd_segment_length(seg) > page_size());
		CHECK(odpd_segment_length(seg) == flog->attach_file_size);
		CHECK(odpd_detach(seg) == 0);
	} else {
		/* ENOMEM without reserved huge pages; the errno is the fake's mmap's */
		CHECK(errno != 0 && strstr(odpd_errmsg(), "odpd_alloc: fake: mmap failed"));
		CHECK(flog->attach_file_size > page_size());
	}
	odpd_disconnect(c);
}

struct thread_arg {
	struct odpd_conn *conn;
	uint8_t *base;
};

static void *thread_main(void *p)
{
	struct thread_arg *a = p;

	for (int i = 0; i < 200; i++) {
		struct odpd_mr *mr = odpd_reg(a->conn, a->base + i, 64, IBV_ACCESS_LOCAL_WRITE);
		uint32_t crc;

		if (!mr || odpd_verify(mr, NULL, 0, &crc) < 0 || crc != crc32(0, a->base + i, 64) ||
		    odpd_dereg(mr) < 0)
			return (void *)1;
	}
	return NULL;
}

/* Calls from several threads on one connection are serialized. */
static void test_threads(const char *path)
{
	struct odpd_conn *c = odpd_connect(path, NULL);
	struct odpd_segment *seg = c ? odpd_alloc(c, 4 * page_size(), 0) : NULL;
	struct thread_arg a[4];
	pthread_t t[4];
	void *ret;

	CHECK(seg);
	for (int i = 0; i < 4; i++) {
		a[i] = (struct thread_arg) { c, (uint8_t *)odpd_segment_addr(seg) + (size_t)i * page_size() };
		memset(a[i].base, i + 1, page_size());
		CHECK(pthread_create(&t[i], NULL, thread_main, &a[i]) == 0);
	}
	for (int i = 0; i < 4; i++)
		CHECK(pthread_join(t[i], &ret) == 0 && ret == NULL);
	CHECK(odpd_detach(seg) == 0);
	odpd_disconnect(c);
}

/* The librdmacm mirror, up to what can run without an importing device. */
static void test_mirror(const char *path)
{
	struct ibv_device dev;
	struct ibv_context ctx;
	struct ibv_pd pd;
	struct rdma_cm_id id;
	struct odpd_segment *seg;
	struct odpd_conn *dc;
	struct ibv_mr fake_mr;
	unsigned regs;
	void *p;

	memset(&dev, 0, sizeof(dev));
	memset(&ctx, 0, sizeof(ctx));
	memset(&pd, 0, sizeof(pd));
	memset(&id, 0, sizeof(id));
	strcpy(dev.name, "rxe0");
	ctx.device = &dev;
	ctx.cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	pd.context = &ctx;
	pd.handle = 77;
	id.verbs = &ctx;
	id.pd = &pd;

	CHECK(setenv(ODPD_SOCKET_ENV, path, 1) == 0);
	dc = odpd_default_conn();
	CHECK(dc && odpd_default_conn() == dc);
	odpd_disconnect(dc);                    /* does nothing */
	seg = odpd_alloc(dc, page_size(), 0);
	CHECK(seg);
	p = odpd_segment_addr(seg);

	regs = flog->regs;
	CHECK_FAIL(odpd_reg_msgs(&id, p, 64), EOPNOTSUPP, "only mlx5 implements ibv_import_device");
	CHECK(strstr(odpd_errmsg(), "rxe0") && strstr(odpd_errmsg(), "Soft-RoCE (rxe)"));
	id.pd = NULL;
	CHECK_FAIL(odpd_reg_read(&id, p, 64), EINVAL, "id->pd is NULL");
	id.pd = &pd;
	id.verbs = NULL;
	CHECK_FAIL(odpd_reg_write(&id, p, 64), EINVAL, "id->verbs is NULL");
	id.verbs = &ctx;
	strcpy(dev.name, "nodev9");
	CHECK_FAIL(odpd_reg_msgs(&id, p, 64), ENODEV, "nodev9");
	strcpy(dev.name, "mlx5_0");
	CHECK_FAIL(odpd_reg_read(&id, &regs, sizeof(regs)), EINVAL, "odpd_alloc()");
	CHECK(flog->regs == regs);

	/* Sent in client-PD mode with the cmd_fd; the fake refuses it. */
	CHECK_FAIL(odpd_reg_write(&id, p, 64), EPERM, "odpd_reg_write: fake: remote access not granted");
	CHECK(flog->regs == regs + 1 && flog->reg_client_pd && flog->reg_nfds == 1);
	CHECK(flog->reg_pd_handle == 77 && strcmp(flog->reg_device, "mlx5_0") == 0);
	CHECK(flog->reg_access == (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_WRITE));

	memset(&fake_mr, 0, sizeof(fake_mr));
	CHECK_FAIL(odpd_dereg_mr(&fake_mr) == 0, ENOENT, "did not come from");
	CHECK(odpd_detach(seg) == 0);
	close(ctx.cmd_fd);
}

/* The default connection is made anew in a child after fork. */
static void test_default_fork(void)
{
	struct odpd_conn *dc = odpd_default_conn();
	int status;
	pid_t pid;

	CHECK(dc);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		unsigned hellos = flog->hellos;
		struct odpd_conn *child = odpd_default_conn();

		CHECK(child && child != dc && flog->hellos == hellos + 1);
		CHECK_FAIL(odpd_alloc(dc, 4096, 0), ENOTCONN, "(fork)");
		CHECK(odpd_detach(odpd_alloc(child, 4096, 0)) == 0);
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(odpd_default_conn() == dc);
	CHECK(odpd_detach(odpd_alloc(dc, 4096, 0)) == 0);
}

int main(void)
{
	char path[128];
	pid_t pid;

	/* large ranges in 4 parts (ODPD_POPULATE_THREADS; 8 MiB each at least), on any machine */
	setenv("ODPD_POPULATE_THREADS", "4", 1);
	flog = mmap(NULL, sizeof(*flog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(flog != MAP_FAILED);
	flog->next_window = FAKE_WINDOW;
	strcpy(test_dir, "/tmp/test-libodpd-XXXXXX");
	CHECK(mkdtemp(test_dir));
	snprintf(path, sizeof(path), "%s/odpd.sock", test_dir);
	pid = fake_start(path, &(struct fake_opts) { 0 });

	CHECK_FAIL(odpd_connect("/nonexistent/odpd.sock", NULL), ENOENT, "/nonexistent/odpd.sock");
	test_connect(path);
	test_version();
	test_connect_interrupted();
	test_alloc_reg_verify(path);
	test_reg_attr(path);
	test_relaxed(path);
	test_join_pd(path);
	test_populate(path);
	test_reg_unpopulated(path);
	test_populate_policy(path);
	test_daemon_error(path);
	test_alloc_taken(path);
	test_attach(path);
	test_fork(path);
	test_hangup(path);
	test_bad_replies(path);
	test_restart_event(path);
	test_oneway_dereg(path);
	test_release_ring(path);
	test_hugetlb(path);
	test_threads(path);
	test_mirror(path);
	test_default_fork();

	fake_stop(pid);
	unlink(path);
	rmdir(test_dir);
	printf("ok\n");
	return 0;
}
