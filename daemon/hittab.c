/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hittab.h"
#include "segment.h"

struct quarantined {
	uint32_t slot;
	uint64_t seq;                   /* the header's value when it was revoked */
};

struct odpd_hittab {
	_Atomic uint64_t *gen;          /* ours, read-write */
	int gen_fd;                     /* its memfd, read-write (the client's is read-only) */
	const _Atomic uint64_t *use;    /* the client's, read-only here */
	size_t len;                     /* bytes of each mapping (ordinary shmem: what the
					 * kernel maps is exactly this) */
	uint32_t slots;
	uint32_t ring;                  /* release ring entries (0: none), after the slots */
	uint64_t ring_head;             /* releases taken from the ring */
	uint64_t ring_bad;              /* times the client broke the ring's rule */
	uint32_t *free;                 /* a stack of free slots */
	uint32_t n_free;
	struct quarantined *quar;       /* revoked, oldest first (a ring) */
	uint32_t q_head, q_len;
	uint64_t revoked;               /* the header word */
};

static size_t table_len(uint32_t slots)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return ((size_t)slots * sizeof(uint64_t) + page - 1) / page * page;
}

/* Words of each table: the slots, then (with a ring) the ring's word and
 * entries. */
static size_t table_words(uint32_t slots, uint32_t ring)
{
	return (size_t)slots + (ring ? 1 + (size_t)ring : 0);
}

static uint32_t ring_clamp(uint32_t want)
{
	return want > ODPD_HIT_RING_MAX ? ODPD_HIT_RING_MAX : want;
}

static uint32_t slots_clamp(uint32_t want)
{
	return want < ODPD_HIT_SLOTS_MIN ? ODPD_HIT_SLOTS_MIN :
	       want > ODPD_HIT_SLOTS_MAX ? ODPD_HIT_SLOTS_MAX : want;
}

static int use_map(struct odpd_hittab *t, int fd, struct odpd_err *err)
{
	struct stat st;
	size_t page;
	bool hugetlb;
	void *p;
	int seals = fcntl(fd, F_GET_SEALS), r;

	if (seals < 0)
		return err_set(err, EINVAL, "the use table is not a memfd (F_GET_SEALS: %s)", strerror(errno));
	if (!(seals & F_SEAL_SHRINK))
		return err_set(err, EINVAL, "the use table must be sealed with F_SEAL_SHRINK");
	/*
	 * Ordinary shmem only: the kernel rounds a mapping of a hugetlb memfd
	 * up to its huge page, and odpd's mapping must be exactly what it
	 * unmaps (and charges): len bytes of 4 KiB pages.
	 */
	r = odpd_memfd_fs(fd, &page, &hugetlb);
	if (r < 0)
		return err_set(err, -r, "fstatfs on the use table: %s", strerror(-r));
	if (hugetlb || page != (size_t)sysconf(_SC_PAGESIZE))
		return err_set(err, EINVAL, "the use table is a %s memfd (%zu-byte pages): make it an "
			       "ordinary memfd, without MFD_HUGETLB", hugetlb ? "hugetlbfs" : "shmem", page);
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, "fstat on the use table: %s", strerror(errno));
	if ((uint64_t)st.st_size < table_words(t->slots, t->ring) * sizeof(uint64_t))
		return err_set(err, EINVAL, "the use table has %lld bytes; %u slots and a release ring "
			       "of %u need %zu", (long long)st.st_size, t->slots, t->ring,
			       table_words(t->slots, t->ring) * sizeof(uint64_t));
	p = mmap(NULL, t->len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return err_set(err, errno == EACCES ? EINVAL : errno, "mapping the use table: %s",
			       strerror(errno));
	t->use = p;
	return 0;
}

/*
 * A read-only file description of the generation table for the client: a
 * new open of the memfd's inode, not a dup (which would share the
 * read-write description). Through it no writable shared mapping can be
 * made (EACCES), mprotect cannot add PROT_WRITE to a shared one, and
 * F_ADD_SEALS is refused (it needs a writable fd); reopening it read-write
 * through /proc needs write permission on the inode, which is odpd's uid's
 * only (0600).
 */
static int gen_reopen_ro(int fd, int *ret_fd, struct odpd_err *err)
{
	char path[64];
	int ro;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	if (ro < 0)
		return err_set(err, errno, "reopening the generation table read-only (%s): %s; odpd "
			       "needs /proc to hand out hit tables", path, strerror(errno));
	*ret_fd = ro;
	return 0;
}

/*
 * The generation table: a memfd that cannot change size (sealed), not
 * sealed against writes, so that the odpd after a crash can still retire it
 * through the read-write memfd kept in systemd's fd store
 * (odpd_hittab_retire_fd). The client gets a read-only description of it.
 */
static int gen_make(struct odpd_hittab *t, int *ret_fd, struct odpd_err *err)
{
	const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	int fd = memfd_create("odpd-hit-generations", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;
	int r;

	if (fd < 0)
		return err_set(err, errno, "memfd_create: %s", strerror(errno));
	if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)t->len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, seals) < 0)
		goto fail;
	p = mmap(NULL, t->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	r = gen_reopen_ro(fd, ret_fd, err);
	if (r < 0) {
		munmap(p, t->len);
		close(fd);
		return r;
	}
	t->gen = p;
	t->gen_fd = fd;
	return 0;
fail:
	err_set(err, errno, "making the generation table: %s", strerror(errno));
	close(fd);
	return -err->code;
}

int odpd_hittab_open(uint32_t want, uint32_t ring, int use_fd, struct odpd_hittab **ret, int *ret_gen_fd,
		     struct odpd_err *err)
{
	struct odpd_hittab *t = calloc(1, sizeof(*t));
	int r;

	if (!t)
		return err_set(err, ENOMEM, "out of memory");
	t->gen_fd = -1;
	t->slots = slots_clamp(want);
	t->ring = ring_clamp(ring);
	t->len = table_len(table_words(t->slots, t->ring));
	t->free = malloc(t->slots * sizeof(*t->free));
	t->quar = malloc(t->slots * sizeof(*t->quar));
	if (!t->free || !t->quar) {
		odpd_hittab_close(t);
		return err_set(err, ENOMEM, "out of memory");
	}
	/* the header slots are never handed out; low slots go first */
	for (uint32_t s = t->slots - 1; s >= ODPD_HIT_HEADER_SLOTS; s--)
		t->free[t->n_free++] = s;
	r = use_map(t, use_fd, err);
	if (r >= 0)
		r = gen_make(t, ret_gen_fd, err);
	if (r < 0) {
		odpd_hittab_close(t);
		return r;
	}
	*ret = t;
	return 0;
}

void odpd_hittab_close(struct odpd_hittab *t)
{
	if (!t)
		return;
	if (t->gen)
		munmap((void *)t->gen, t->len);
	if (t->gen_fd >= 0)
		close(t->gen_fd);
	if (t->use)
		munmap((void *)t->use, t->len);
	free(t->free);
	free(t->quar);
	free(t);
}

uint64_t odpd_hittab_mapped(uint32_t want, uint32_t ring)
{
	return 2 * (uint64_t)table_len(table_words(slots_clamp(want), ring_clamp(ring)));
}

int odpd_hittab_fd(const struct odpd_hittab *t)
{
	return t->gen_fd;
}

/*
 * Retire the generation table of @slots words at @gen: no reference slot
 * says valid any more (each one holding a ticket gets ODPD_HIT_INVALID,
 * its ticket kept), then the events word says ODPD_HIT_RETIRED. Release
 * stores, slots first: a client that sees the word sees the slots.
 */
static void gen_retire(_Atomic uint64_t *gen, uint32_t slots)
{
	for (uint32_t s = ODPD_HIT_HEADER_SLOTS; s < slots; s++) {
		uint64_t v = atomic_load_explicit(&gen[s], memory_order_relaxed);

		if (v)
			atomic_store_explicit(&gen[s], v | ODPD_HIT_INVALID, memory_order_release);
	}
	atomic_store_explicit(&gen[ODPD_HIT_EVENTS_SLOT], ODPD_HIT_RETIRED, memory_order_release);
}

void odpd_hittab_retire(struct odpd_hittab *t)
{
	gen_retire(t->gen, t->slots);
}

int odpd_hittab_retire_fd(int fd, struct odpd_err *err)
{
	struct stat st;
	size_t len;
	void *p;

	if (fstat(fd, &st) < 0)
		return err_set(err, errno, "fstat on a generation table: %s", strerror(errno));
	if (!S_ISREG(st.st_mode) || st.st_size < (off_t)(ODPD_HIT_SLOTS_MIN * sizeof(uint64_t)) ||
	    (uint64_t)st.st_size > (uint64_t)table_len(table_words(ODPD_HIT_SLOTS_MAX, ODPD_HIT_RING_MAX)))
		return err_set(err, EINVAL, "not a generation table (%lld bytes)", (long long)st.st_size);
	len = (size_t)st.st_size;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return err_set(err, errno, "mapping a generation table to retire it: %s", strerror(errno));
	gen_retire(p, (uint32_t)(len / sizeof(uint64_t)));
	munmap(p, len);
	return 0;
}

uint32_t odpd_hittab_slots(const struct odpd_hittab *t)
{
	return t->slots;
}

uint32_t odpd_hittab_ring(const struct odpd_hittab *t)
{
	return t->ring;
}

unsigned odpd_hittab_ring_take(struct odpd_hittab *t, uint64_t *handles, bool *bad)
{
	const _Atomic uint64_t *tailp, *ent;
	uint64_t tail, n;

	*bad = false;
	if (!t->ring)
		return 0;
	tailp = &t->use[t->slots];
	ent = tailp + 1;
	/* Acquire: pairs with the client's release store of the tail, made
	 * after it wrote the entries (client-lib/hit.c, hit_ring_push). */
	tail = atomic_load_explicit(tailp, memory_order_acquire);
	if (tail == t->ring_head)
		return 0;
	n = tail - t->ring_head;
	if (n > t->ring) {
		/* behind odpd's count, or past the ring: not libodpd's doing.
		 * Nothing of it is taken, and its count is odpd's from now on. */
		*bad = true;
		t->ring_bad++;
		n = 0;
	}
	for (uint64_t i = 0; i < n; i++)
		handles[i] = atomic_load_explicit(&ent[(t->ring_head + i) % t->ring], memory_order_relaxed);
	t->ring_head = tail;
	/* Release: the client reuses the entries only once it sees this. */
	atomic_store_explicit(&t->gen[t->slots], t->ring_head, memory_order_release);
	return (unsigned)n;
}

uint32_t odpd_hittab_used(const struct odpd_hittab *t)
{
	return t->slots - ODPD_HIT_HEADER_SLOTS - t->n_free;
}

uint32_t odpd_hittab_take(struct odpd_hittab *t, uint64_t ticket)
{
	uint32_t s;

	if (t->n_free == 0 || ticket == 0 || ticket >= ODPD_HIT_TICKET_LIMIT)
		return 0;
	s = t->free[--t->n_free];
	atomic_store_explicit(&t->gen[s], ticket, memory_order_release);
	return s;
}

void odpd_hittab_events(struct odpd_hittab *t, uint64_t sent)
{
	atomic_store_explicit(&t->gen[ODPD_HIT_EVENTS_SLOT], sent, memory_order_release);
}

void odpd_hittab_put(struct odpd_hittab *t, uint32_t slot)
{
	if (slot < ODPD_HIT_HEADER_SLOTS || slot >= t->slots)
		return;
	atomic_store_explicit(&t->gen[slot], 0, memory_order_release);
	t->free[t->n_free++] = slot;
}

void odpd_hittab_invalidate(struct odpd_hittab *t, uint32_t slot, uint64_t ticket)
{
	if (slot < ODPD_HIT_HEADER_SLOTS || slot >= t->slots)
		return;
	atomic_store_explicit(&t->gen[slot], ticket | ODPD_HIT_INVALID, memory_order_release);
}

uint64_t odpd_hittab_use(const struct odpd_hittab *t, uint32_t slot)
{
	if (slot < ODPD_HIT_HEADER_SLOTS || slot >= t->slots)
		return 0;
	return atomic_load_explicit(&t->use[slot], memory_order_relaxed);
}

bool odpd_hittab_revoke(struct odpd_hittab *t, uint32_t slot, uint64_t ticket)
{
	uint64_t was, use;

	if (slot < ODPD_HIT_HEADER_SLOTS || slot >= t->slots)
		return false;
	was = atomic_load_explicit(&t->gen[slot], memory_order_relaxed);
	/* Store, fence, load: the client does the same in the other order
	 * of words (client-lib/hit.c, hit_claim). */
	atomic_store_explicit(&t->gen[slot], ticket | ODPD_HIT_REVOKING, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	use = atomic_load_explicit(&t->use[slot], memory_order_seq_cst);
	if (use == ticket) {
		atomic_store_explicit(&t->gen[slot], was, memory_order_release);
		return false;
	}
	atomic_store_explicit(&t->gen[slot], 0, memory_order_release);
	t->revoked++;
	atomic_store_explicit(&t->gen[0], t->revoked, memory_order_release);
	t->quar[(t->q_head + t->q_len) % t->slots] = (struct quarantined) { slot, t->revoked };
	t->q_len++;
	return true;
}

void odpd_hittab_seen(struct odpd_hittab *t, uint64_t seen)
{
	if (seen > t->revoked)                   /* a client cannot vouch for the future */
		seen = t->revoked;
	while (t->q_len > 0 && t->quar[t->q_head].seq <= seen) {
		t->free[t->n_free++] = t->quar[t->q_head].slot;
		t->q_head = (t->q_head + 1) % t->slots;
		t->q_len--;
	}
}
