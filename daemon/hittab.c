/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hittab.h"
#include "segment.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

struct quarantined {
	uint32_t slot;
	uint64_t seq;                   /* the header's value when it was revoked */
};

struct odpd_hittab {
	_Atomic uint64_t *gen;          /* ours, read-write */
	const _Atomic uint64_t *use;    /* the client's, read-only here */
	size_t len;                     /* bytes of each mapping (ordinary shmem: what the
					 * kernel maps is exactly this) */
	uint32_t slots;
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
	if ((uint64_t)st.st_size < (uint64_t)t->slots * sizeof(uint64_t))
		return err_set(err, EINVAL, "the use table has %lld bytes; %u slots need %zu",
			       (long long)st.st_size, t->slots, (size_t)t->slots * sizeof(uint64_t));
	p = mmap(NULL, t->len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return err_set(err, errno == EACCES ? EINVAL : errno, "mapping the use table: %s",
			       strerror(errno));
	t->use = p;
	return 0;
}

static int gen_make(struct odpd_hittab *t, int *ret_fd, struct odpd_err *err)
{
	const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	int fd = memfd_create("odpd-hit-generations", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;

	if (fd < 0)
		return err_set(err, errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)t->len) < 0)
		goto fail;
	p = mmap(NULL, t->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	/* Our mapping stays writable; no other ever can be. */
	if (fcntl(fd, F_ADD_SEALS, seals) < 0) {
		munmap(p, t->len);
		goto fail;
	}
	t->gen = p;
	*ret_fd = fd;
	return 0;
fail:
	err_set(err, errno, "making the generation table: %s", strerror(errno));
	close(fd);
	return -err->code;
}

int odpd_hittab_open(uint32_t want, int use_fd, struct odpd_hittab **ret, int *ret_gen_fd,
		     struct odpd_err *err)
{
	struct odpd_hittab *t = calloc(1, sizeof(*t));
	int r;

	if (!t)
		return err_set(err, ENOMEM, "out of memory");
	t->slots = slots_clamp(want);
	t->len = table_len(t->slots);
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
	if (t->use)
		munmap((void *)t->use, t->len);
	free(t->free);
	free(t->quar);
	free(t);
}

uint64_t odpd_hittab_mapped(uint32_t want)
{
	return 2 * (uint64_t)table_len(slots_clamp(want));
}

uint32_t odpd_hittab_slots(const struct odpd_hittab *t)
{
	return t->slots;
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
