/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/hittab.c: the two header slots (revocations, events)
 * are never a reference's, nothing aimed at them changes them, and the
 * events word is what the client's read-only mapping sees; the client's fd
 * is read-only while odpd's stays writable, and a table is retired through
 * either the table or odpd's fd alone (as the odpd after a crash does);
 * a release ring gives back what the client wrote, once, in order, and a
 * ring whose count the client broke gives nothing. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "hittab.h"

#define SLOTS 16u

struct table {
	struct odpd_hittab *t;
	int use_fd, gen_fd;
	const _Atomic uint64_t *gen;    /* as the client maps it */
};

static void table_open(struct table *tb, uint32_t slots)
{
	struct odpd_err err = { 0 };

	tb->use_fd = memfd_create("test-hittab-use", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(tb->use_fd >= 0);
	assert_int_equal(ftruncate(tb->use_fd, 4096), 0);
	assert_int_equal(fcntl(tb->use_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	tb->gen_fd = -1;
	assert_int_equal(odpd_hittab_open(slots, 0, tb->use_fd, &tb->t, &tb->gen_fd, &err), 0);
	assert_true(tb->gen_fd >= 0);
	tb->gen = mmap(NULL, 4096, PROT_READ, MAP_SHARED, tb->gen_fd, 0);
	assert_true(tb->gen != MAP_FAILED);
}

static void table_close(struct table *tb)
{
	munmap((void *)tb->gen, 4096);
	odpd_hittab_close(tb->t);
	close(tb->use_fd);
	close(tb->gen_fd);
}

/* Every slot but the headers is handed out once; then none is left. */
static void test_headers_never_taken(void **state)
{
	struct table tb;
	bool taken[SLOTS] = { false };

	(void)state;
	table_open(&tb, SLOTS);
	assert_int_equal(odpd_hittab_slots(tb.t), SLOTS);
	assert_int_equal(odpd_hittab_used(tb.t), 0);
	for (uint32_t i = 0; i < SLOTS - ODPD_HIT_HEADER_SLOTS; i++) {
		uint32_t s = odpd_hittab_take(tb.t, 100 + i);

		assert_true(s >= ODPD_HIT_HEADER_SLOTS && s < SLOTS);
		assert_false(taken[s]);
		taken[s] = true;
		assert_int_equal(atomic_load(&tb.gen[s]), 100 + i);
	}
	assert_int_equal(odpd_hittab_take(tb.t, 999), 0);
	assert_int_equal(odpd_hittab_used(tb.t), SLOTS - ODPD_HIT_HEADER_SLOTS);
	assert_int_equal(atomic_load(&tb.gen[0]), 0);
	assert_int_equal(atomic_load(&tb.gen[ODPD_HIT_EVENTS_SLOT]), 0);
	table_close(&tb);

	/* the smallest table: headers only, no reference slot */
	table_open(&tb, 1);
	assert_int_equal(odpd_hittab_slots(tb.t), ODPD_HIT_SLOTS_MIN);
	assert_int_equal(odpd_hittab_take(tb.t, 7), 0);
	assert_int_equal(odpd_hittab_used(tb.t), 0);
	table_close(&tb);
}

/* put, invalidate and revoke aimed at a header slot change nothing. */
static void test_headers_untouched(void **state)
{
	struct table tb;

	(void)state;
	table_open(&tb, SLOTS);
	odpd_hittab_events(tb.t, 3);
	for (uint32_t h = 0; h < ODPD_HIT_HEADER_SLOTS; h++) {
		odpd_hittab_put(tb.t, h);
		odpd_hittab_invalidate(tb.t, h, 5);
		assert_false(odpd_hittab_revoke(tb.t, h, 5));
		assert_int_equal(odpd_hittab_use(tb.t, h), 0);
	}
	assert_int_equal(atomic_load(&tb.gen[0]), 0);
	assert_int_equal(atomic_load(&tb.gen[ODPD_HIT_EVENTS_SLOT]), 3);
	/* a put header slot did not join the free slots */
	for (uint32_t i = 0; i < SLOTS - ODPD_HIT_HEADER_SLOTS; i++)
		assert_true(odpd_hittab_take(tb.t, 100 + i) >= ODPD_HIT_HEADER_SLOTS);
	assert_int_equal(odpd_hittab_take(tb.t, 999), 0);
	table_close(&tb);
}

/* The events word is what the client reads, and a revocation does not touch it. */
static void test_events_word(void **state)
{
	struct table tb;
	uint32_t s;

	(void)state;
	table_open(&tb, SLOTS);
	for (uint64_t n = 1; n <= 5; n++) {
		odpd_hittab_events(tb.t, n);
		assert_int_equal(atomic_load(&tb.gen[ODPD_HIT_EVENTS_SLOT]), n);
	}
	s = odpd_hittab_take(tb.t, 42);
	assert_true(s >= ODPD_HIT_HEADER_SLOTS);
	assert_true(odpd_hittab_revoke(tb.t, s, 42));      /* the use word is not 42: unused */
	assert_int_equal(atomic_load(&tb.gen[0]), 1);
	assert_int_equal(atomic_load(&tb.gen[ODPD_HIT_EVENTS_SLOT]), 5);
	table_close(&tb);
}

/* The client's fd cannot write; odpd's is the table, writable. */
static void test_fds(void **state)
{
	struct table tb;
	struct stat st;
	_Atomic uint64_t *w;
	uint32_t s;
	int fd;

	(void)state;
	table_open(&tb, SLOTS);
	assert_int_equal(fcntl(tb.gen_fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	assert_int_equal(fcntl(tb.gen_fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(fstat(tb.gen_fd, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, tb.gen_fd, 0) == MAP_FAILED);
	assert_int_equal(errno, EACCES);
	assert_int_equal(mprotect((void *)tb.gen, 4096, PROT_READ | PROT_WRITE), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(fcntl(tb.gen_fd, F_ADD_SEALS, F_SEAL_WRITE), -1);

	fd = odpd_hittab_fd(tb.t);
	assert_true(fd >= 0 && fd != tb.gen_fd);
	assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
	w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(w != MAP_FAILED);
	s = odpd_hittab_take(tb.t, 77);
	assert_int_equal(atomic_load(&w[s]), 77);        /* the same table */
	munmap((void *)w, 4096);
	table_close(&tb);
}

/* What a retired table says: every ticket invalid (kept), free slots and
 * the revocations header as they were, the events word ODPD_HIT_RETIRED. */
static void check_retired(const struct table *tb, const uint64_t *before, uint32_t slots)
{
	for (uint32_t s = ODPD_HIT_HEADER_SLOTS; s < slots; s++)
		assert_int_equal(atomic_load(&tb->gen[s]), before[s] ? before[s] | ODPD_HIT_INVALID : 0);
	assert_int_equal(atomic_load(&tb->gen[0]), before[0]);
	assert_int_equal(atomic_load(&tb->gen[ODPD_HIT_EVENTS_SLOT]), ODPD_HIT_RETIRED);
}

/* Tickets in some slots: one valid, one invalidated, one revoked, one put. */
static void fill(struct table *tb, uint64_t *before)
{
	uint32_t a = odpd_hittab_take(tb->t, 11), b = odpd_hittab_take(tb->t, 12);
	uint32_t c = odpd_hittab_take(tb->t, 13), d = odpd_hittab_take(tb->t, 14);

	odpd_hittab_invalidate(tb->t, b, 12);
	assert_true(odpd_hittab_revoke(tb->t, c, 13));
	odpd_hittab_put(tb->t, d);
	odpd_hittab_events(tb->t, 4);
	(void)a;
	for (uint32_t s = 0; s < SLOTS; s++)
		before[s] = atomic_load(&tb->gen[s]);
	assert_int_equal(before[a], 11);
	assert_int_equal(before[b], 12 | ODPD_HIT_INVALID);
	assert_int_equal(before[c], 0);
	assert_int_equal(before[d], 0);
	assert_int_equal(before[0], 1);
}

static void test_retire(void **state)
{
	uint64_t before[SLOTS];
	struct table tb;

	(void)state;
	table_open(&tb, SLOTS);
	fill(&tb, before);
	odpd_hittab_retire(tb.t);
	check_retired(&tb, before, SLOTS);
	table_close(&tb);
}

/* After a crash: the stored fd alone, the table (and odpd's mapping) gone. */
static void test_retire_fd(void **state)
{
	struct odpd_err err = { 0 };
	uint64_t before[SLOTS];
	struct table tb;
	int stored, p[2];

	(void)state;
	table_open(&tb, SLOTS);
	fill(&tb, before);
	stored = dup(odpd_hittab_fd(tb.t));              /* what systemd's fd store keeps */
	assert_true(stored >= 0);
	odpd_hittab_close(tb.t);
	tb.t = NULL;
	assert_int_equal(odpd_hittab_retire_fd(stored, &err), 0);
	check_retired(&tb, before, SLOTS);
	assert_int_equal(odpd_hittab_retire_fd(stored, &err), 0);   /* again: the same */
	check_retired(&tb, before, SLOTS);

	/* not through the client's read-only fd; not a pipe */
	assert_true(odpd_hittab_retire_fd(tb.gen_fd, &err) < 0);
	assert_int_equal(err.code, EACCES);
	assert_int_equal(pipe(p), 0);
	assert_int_equal(odpd_hittab_retire_fd(p[0], &err), -EINVAL);
	close(p[0]);
	close(p[1]);
	close(stored);
	table_close(&tb);
}

static unsigned fds_open(void)
{
	unsigned n = 0;

	for (int fd = 0; fd < 1024; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* The child of test_no_proc, in a mount namespace of its own with an empty
 * /proc: 0 if odpd_hittab_open fails as it should, else the failed step. */
static int no_proc_child(void)
{
	struct odpd_err err = { 0 };
	struct odpd_hittab *t = NULL;
	int use, gen = -1;
	unsigned fds;

	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("none", "/proc", "tmpfs", 0, NULL) < 0)
		return 77;                       /* not allowed here: skipped */
	use = memfd_create("test-hittab-use", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (use < 0 || ftruncate(use, 4096) < 0 || fcntl(use, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return 1;
	fds = fds_open();
	if (odpd_hittab_open(SLOTS, 0, use, &t, &gen, &err) != -ENOENT || err.code != ENOENT)
		return 2;
	if (!strstr(err.msg, "needs /proc") || gen != -1)
		return 3;
	if (fds_open() != fds)                   /* the memfd went with the failure */
		return 4;
	return 0;
}

/* The release ring: entries after the slots of the use table, the tail
 * word before them, odpd's count in the generation table at [slots]. */
static void test_release_ring(void **state)
{
	const uint32_t ring = 8;
	struct odpd_err err = { 0 };
	struct odpd_hittab *t;
	_Atomic uint64_t *use;
	const _Atomic uint64_t *gen;
	uint64_t got[ODPD_HIT_RING_MAX];
	int use_fd, gen_fd = -1;
	bool bad;

	(void)state;
	use_fd = memfd_create("test-hittab-use", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(use_fd >= 0);
	/* too small for the slots and the ring: refused, saying so */
	assert_int_equal(ftruncate(use_fd, SLOTS * 8), 0);
	assert_int_equal(fcntl(use_fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	assert_int_equal(odpd_hittab_open(SLOTS, ring, use_fd, &t, &gen_fd, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "release ring"));
	assert_int_equal(ftruncate(use_fd, 4096), 0);
	assert_int_equal(odpd_hittab_open(SLOTS, ring, use_fd, &t, &gen_fd, &err), 0);
	assert_int_equal(odpd_hittab_ring(t), ring);
	use = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, use_fd, 0);
	gen = mmap(NULL, 4096, PROT_READ, MAP_SHARED, gen_fd, 0);
	assert_true(use != MAP_FAILED && gen != MAP_FAILED);

	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 0);
	assert_false(bad);
	/* 11 releases in two rounds, the second wrapping the ring */
	for (uint64_t i = 0; i < 5; i++)
		use[SLOTS + 1 + i % ring] = 100 + i;
	use[SLOTS] = 5;
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 5);
	assert_false(bad);
	for (unsigned i = 0; i < 5; i++)
		assert_int_equal(got[i], 100 + i);
	assert_int_equal(gen[SLOTS], 5);
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 0);   /* taken once */
	for (uint64_t i = 5; i < 11; i++)
		use[SLOTS + 1 + i % ring] = 100 + i;
	use[SLOTS] = 11;
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 6);
	for (unsigned i = 0; i < 6; i++)
		assert_int_equal(got[i], 105 + i);
	assert_int_equal(gen[SLOTS], 11);
	/* the slots are not the ring's: a slot taken is untouched by it */
	assert_int_not_equal(odpd_hittab_take(t, 7), 0);

	/* more than a ring ahead, then behind: nothing taken, odpd's count
	 * follows the tail */
	use[SLOTS] = 11 + ring + 1;
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 0);
	assert_true(bad);
	assert_int_equal(gen[SLOTS], 11 + ring + 1);
	use[SLOTS] = 3;
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 0);
	assert_true(bad);
	assert_int_equal(gen[SLOTS], 3);
	/* and it works again from there */
	use[SLOTS + 1 + 3 % ring] = 42;
	use[SLOTS] = 4;
	assert_int_equal(odpd_hittab_ring_take(t, got, &bad), 1);
	assert_false(bad);
	assert_int_equal(got[0], 42);

	/* more than ODPD_HIT_RING_MAX asked: the most */
	assert_int_equal(odpd_hittab_mapped(SLOTS, 1000), odpd_hittab_mapped(SLOTS, ODPD_HIT_RING_MAX));
	munmap(use, 4096);
	munmap((void *)gen, 4096);
	odpd_hittab_close(t);
	close(use_fd);
	close(gen_fd);
}

/* Without /proc no read-only fd can be made: OpenHitTable fails, saying
 * why, rather than hand out the writable memfd. */
static void test_no_proc(void **state)
{
	int status;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(no_proc_child());
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		skip();
	assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_headers_never_taken),
		cmocka_unit_test(test_headers_untouched),
		cmocka_unit_test(test_events_word),
		cmocka_unit_test(test_fds),
		cmocka_unit_test(test_retire),
		cmocka_unit_test(test_release_ring),
		cmocka_unit_test(test_retire_fd),
		cmocka_unit_test(test_no_proc),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
