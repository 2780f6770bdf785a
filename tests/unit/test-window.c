/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/window.c: the PROT_NONE address window. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "window.h"

#define PAGE ((size_t)4096)
#define MIB ((size_t)1 << 20)

/*
 * Check the VMAs of /proc/self/maps that overlap [addr, addr + len): every
 * byte of the range must be covered, and every VMA must have permissions
 * @perms and inode @ino. Returns true if so; prints the offending line if not.
 */
static bool range_is(uintptr_t addr, size_t len, const char *perms, unsigned long long ino)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uintptr_t want = addr, end = addr + len;
	char line[4096];
	bool ok = true;

	assert_non_null(f);
	while (want < end && fgets(line, sizeof(line), f)) {
		unsigned long long start, stop, off, inode;
		unsigned maj, min;
		char p[8];

		if (!strchr(line, '\n'))        /* never parse the tail of a long line */
			while (fgetc(f) != '\n' && !feof(f))
				;
		if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &stop, p, &off,
			   &maj, &min, &inode) != 7)
			continue;
		if (stop <= want)
			continue;
		if (start > want) {
			print_message("hole at %#lx\n", (unsigned long)want);
			ok = false;
			break;
		}
		if (strcmp(p, perms) != 0 || inode != ino) {
			print_message("unexpected VMA: %s", line);
			ok = false;
			break;
		}
		want = stop;
	}
	fclose(f);
	return ok && want >= end;
}

/* Is any byte of [addr, addr + len) mapped from inode @ino? */
static bool range_has_inode(uintptr_t addr, size_t len, unsigned long long ino)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	bool found = false;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long start, stop, off, inode;
		unsigned maj, min;
		char p[8];

		if (!strchr(line, '\n'))
			while (fgetc(f) != '\n' && !feof(f))
				;
		if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &stop, p, &off,
			   &maj, &min, &inode) != 7)
			continue;
		if (start < addr + len && addr < stop && inode == ino)
			found = true;
	}
	fclose(f);
	return found;
}

static struct odpd_window *new_window(size_t size)
{
	struct odpd_window *w = NULL;

	assert_int_equal(odpd_window_new(size, &w), 0);
	assert_non_null(w);
	return w;
}

/* The window's base: the first page-aligned allocation of a fresh window. */
static uintptr_t window_base(struct odpd_window *w, size_t size)
{
	void *p = odpd_window_alloc(w, size, PAGE);

	assert_non_null(p);
	odpd_window_release(w, p, size);
	return (uintptr_t)p;
}

static void test_new_is_prot_none(void **state)
{
	(void)state;
	const size_t size = 16 * MIB;
	struct odpd_window *w = new_window(size);
	uintptr_t base = window_base(w, size);

	assert_true(odpd_window_contains(w, (void *)base, size));
	assert_true(range_is(base, size, "---p", 0));
	odpd_window_free(w);
}

static void test_alloc_aligned_inside(void **state)
{
	(void)state;
	const size_t size = 64 * MIB;
	struct odpd_window *w = new_window(size);
	const size_t aligns[] = { PAGE, 64 * 1024, 2 * MIB, 8 * MIB, 16 * MIB };

	for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++) {
		void *p = odpd_window_alloc(w, PAGE * 3, aligns[i]);

		assert_non_null(p);
		assert_int_equal((uintptr_t)p % aligns[i], 0);
		assert_true(odpd_window_contains(w, p, PAGE * 3));
	}
	odpd_window_free(w);
}

static void test_alloc_no_overlap(void **state)
{
	(void)state;
	const size_t size = 32 * MIB;
	struct odpd_window *w = new_window(size);
	uintptr_t a[8];
	size_t len[8];

	for (int i = 0; i < 8; i++) {
		len[i] = (size_t)(i + 1) * PAGE * 5;
		a[i] = (uintptr_t)odpd_window_alloc(w, len[i], i % 2 ? 2 * MIB : PAGE);
		assert_true(a[i] != 0);
		assert_true(odpd_window_contains(w, (void *)a[i], len[i]));
	}
	for (int i = 0; i < 8; i++)
		for (int j = i + 1; j < 8; j++)
			assert_false(a[i] < a[j] + len[j] && a[j] < a[i] + len[i]);
	odpd_window_free(w);
}

static void test_full_window(void **state)
{
	(void)state;
	const size_t size = 16 * PAGE;
	struct odpd_window *w = new_window(size);
	void *all = odpd_window_alloc(w, size, PAGE);

	assert_non_null(all);
	assert_null(odpd_window_alloc(w, PAGE, PAGE));
	odpd_window_release(w, all, size);

	/* larger than the window */
	assert_null(odpd_window_alloc(w, size + PAGE, PAGE));
	/* half is taken: the other half fits, one page more does not */
	void *half = odpd_window_alloc(w, size / 2, PAGE);
	assert_non_null(half);
	assert_null(odpd_window_alloc(w, size / 2 + PAGE, PAGE));
	void *rest = odpd_window_alloc(w, size / 2, PAGE);
	assert_non_null(rest);
	assert_null(odpd_window_alloc(w, PAGE, PAGE));
	odpd_window_free(w);
}

/* An alignment the remaining free space cannot meet gives NULL. */
static void test_alignment_unsatisfiable(void **state)
{
	(void)state;
	const size_t size = 4 * MIB;
	struct odpd_window *w = new_window(size);
	uintptr_t base = window_base(w, size);
	/* an alignment larger than the window that the base does not have */
	size_t big = 8 * MIB;
	while (base % big == 0)
		big *= 2;
	uintptr_t aligned = (base + big - 1) & ~(uintptr_t)(big - 1);

	if (aligned + PAGE > base + size) {
		assert_null(odpd_window_alloc(w, PAGE, big));
	} else {
		assert_int_equal((uintptr_t)odpd_window_alloc(w, PAGE, big), aligned);
		assert_null(odpd_window_alloc(w, PAGE, big));
	}
	odpd_window_free(w);
}

static void test_release_realloc_reuses(void **state)
{
	(void)state;
	const size_t size = 8 * PAGE;
	struct odpd_window *w = new_window(size);
	void *p = odpd_window_alloc(w, size, PAGE);

	assert_non_null(p);
	odpd_window_release(w, p, size);
	void *q = odpd_window_alloc(w, size, PAGE);
	assert_ptr_equal(p, q);
	odpd_window_release(w, q, size);

	/* a hole in the middle is found again */
	void *a = odpd_window_alloc(w, 2 * PAGE, PAGE);
	void *b = odpd_window_alloc(w, 2 * PAGE, PAGE);
	void *c = odpd_window_alloc(w, 4 * PAGE, PAGE);
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(c);
	assert_null(odpd_window_alloc(w, PAGE, PAGE));
	odpd_window_release(w, b, 2 * PAGE);
	assert_ptr_equal(odpd_window_alloc(w, 2 * PAGE, PAGE), b);
	odpd_window_free(w);
}

/* Three neighbours released in every order coalesce back into one extent. */
static void test_release_coalesces(void **state)
{
	(void)state;
	const size_t seg = 4 * PAGE, size = 3 * seg;
	static const int orders[6][3] = {
		{ 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 }, { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 },
	};
	struct odpd_window *w = new_window(size);

	for (int o = 0; o < 6; o++) {
		void *p[3];

		for (int i = 0; i < 3; i++) {
			p[i] = odpd_window_alloc(w, seg, PAGE);
			assert_non_null(p[i]);
		}
		assert_null(odpd_window_alloc(w, PAGE, PAGE));

		/* the middle one alone: only its own size fits */
		if (orders[o][0] == 1) {
			odpd_window_release(w, p[1], seg);
			assert_null(odpd_window_alloc(w, seg + PAGE, PAGE));
			assert_ptr_equal(odpd_window_alloc(w, seg, PAGE), p[1]);
		}
		for (int i = 0; i < 3; i++)
			odpd_window_release(w, p[orders[o][i]], seg);

		void *all = odpd_window_alloc(w, size, PAGE);
		assert_ptr_equal(all, p[0]);
		odpd_window_release(w, all, size);
	}
	odpd_window_free(w);
}

/* An aligned allocation carved out of the middle of a free extent leaves
 * both sides usable, and everything coalesces again afterwards. */
static void test_carve_middle_and_tail(void **state)
{
	(void)state;
	const size_t size = 8 * MIB, align = 2 * MIB;
	struct odpd_window *w = new_window(size);
	uintptr_t base = window_base(w, size);

	/* make the free space start off the 2 MiB grid */
	void *head = odpd_window_alloc(w, PAGE, PAGE);
	assert_int_equal((uintptr_t)head, base);
	uintptr_t start = base + PAGE;
	uintptr_t a = (start + align - 1) & ~(uintptr_t)(align - 1);
	assert_true(a > start);

	void *mid = odpd_window_alloc(w, PAGE, align);
	assert_int_equal((uintptr_t)mid, a);
	/* the gap before it is still free */
	void *gap = odpd_window_alloc(w, a - start, PAGE);
	assert_int_equal((uintptr_t)gap, start);
	/* and so is everything after it, up to the end */
	uintptr_t after = a + PAGE;
	void *tail = odpd_window_alloc(w, base + size - after, PAGE);
	assert_int_equal((uintptr_t)tail, after);
	assert_null(odpd_window_alloc(w, PAGE, PAGE));

	odpd_window_release(w, gap, a - start);
	odpd_window_release(w, tail, base + size - after);
	odpd_window_release(w, head, PAGE);
	odpd_window_release(w, mid, PAGE);
	assert_int_equal((uintptr_t)odpd_window_alloc(w, size, PAGE), base);
	odpd_window_release(w, (void *)base, size);

	/* an aligned block that ends exactly at the end of a free extent */
	const size_t a64 = 64 * 1024;
	size_t head_len = (base + PAGE) % a64 ? PAGE : 2 * PAGE;
	head = odpd_window_alloc(w, head_len, PAGE);
	assert_int_equal((uintptr_t)head, base);
	start = base + head_len;
	uintptr_t end = base + size, b = (start + a64 - 1) & ~(uintptr_t)(a64 - 1);
	assert_true(b > start);
	tail = odpd_window_alloc(w, end - b, a64);
	assert_int_equal((uintptr_t)tail, b);
	gap = odpd_window_alloc(w, b - start, PAGE);
	assert_int_equal((uintptr_t)gap, start);
	assert_null(odpd_window_alloc(w, PAGE, PAGE));
	odpd_window_release(w, tail, end - b);
	odpd_window_release(w, head, head_len);
	odpd_window_release(w, gap, b - start);
	assert_int_equal((uintptr_t)odpd_window_alloc(w, size, PAGE), base);
	odpd_window_free(w);
}

static void test_contains(void **state)
{
	(void)state;
	const size_t size = 16 * PAGE;
	struct odpd_window *w = new_window(size);
	uintptr_t base = window_base(w, size);
	int on_stack;

	assert_true(odpd_window_contains(w, (void *)base, size));
	assert_true(odpd_window_contains(w, (void *)(base + PAGE), size - PAGE));
	assert_false(odpd_window_contains(w, (void *)(base + PAGE), size));
	assert_false(odpd_window_contains(w, (void *)(base - PAGE), PAGE * 2));
	assert_false(odpd_window_contains(w, (void *)(base + size), PAGE));
	assert_false(odpd_window_contains(w, (void *)base, size + 1));
	assert_false(odpd_window_contains(w, (void *)(base + PAGE), SIZE_MAX));
	assert_false(odpd_window_contains(w, &on_stack, sizeof(on_stack)));
	odpd_window_free(w);
}

/* What the daemon does to place a segment: MAP_FIXED over an allocation. */
static void *map_over(void *p, size_t len, int fd)
{
	void *q = mmap(p, len, PROT_READ | PROT_WRITE,
		       fd >= 0 ? MAP_SHARED | MAP_FIXED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		       fd, 0);
	assert_ptr_equal(q, p);
	return q;
}

static void test_release_restores_prot_none(void **state)
{
	(void)state;
	const size_t size = 64 * PAGE, len = 8 * PAGE;
	struct odpd_window *w = new_window(size);
	uint8_t *p = odpd_window_alloc(w, len, PAGE);

	assert_non_null(p);
	map_over(p, len, -1);
	memset(p, 0xa5, len);
	assert_true(range_is((uintptr_t)p, len, "rw-p", 0));

	odpd_window_release(w, p, len);
	assert_true(range_is((uintptr_t)p, len, "---p", 0));
	/* the pages are gone, not just protected: mincore says none resident */
	unsigned char vec[8];
	assert_int_equal(mincore(p, len, vec), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(vec[i] & 1, 0);
	odpd_window_free(w);
}

static void test_release_drops_file_mapping(void **state)
{
	(void)state;
	const size_t size = 16 * MIB, len = 2 * MIB;
	struct odpd_window *w = new_window(size);
	int fd = memfd_create("unit-window", MFD_CLOEXEC);
	struct stat st;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	assert_int_equal(fstat(fd, &st), 0);

	uint8_t *p = odpd_window_alloc(w, len, 2 * MIB);
	assert_non_null(p);
	map_over(p, len, fd);
	p[0] = 1;
	p[len - 1] = 2;
	assert_true(range_is((uintptr_t)p, len, "rw-s", st.st_ino));

	odpd_window_release(w, p, len);
	assert_false(range_has_inode((uintptr_t)p, len, st.st_ino));
	assert_true(range_is((uintptr_t)p, len, "---p", 0));
	/* the whole window is one reservation again, and usable */
	uintptr_t base = (uintptr_t)odpd_window_alloc(w, size, PAGE);
	assert_true(base != 0);
	assert_true(range_is(base, size, "---p", 0));
	close(fd);
	odpd_window_free(w);
}

static void test_free_unmaps(void **state)
{
	(void)state;
	const size_t size = 16 * MIB;
	struct odpd_window *w = new_window(size);
	uintptr_t base = window_base(w, size);
	void *p = odpd_window_alloc(w, PAGE, PAGE);

	assert_non_null(p);
	odpd_window_free(w);
	/* nothing is mapped there any more: MAP_FIXED_NOREPLACE succeeds */
	void *q = mmap((void *)base, size, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	assert_ptr_equal(q, (void *)base);
	munmap(q, size);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_new_is_prot_none),
		cmocka_unit_test(test_alloc_aligned_inside),
		cmocka_unit_test(test_alloc_no_overlap),
		cmocka_unit_test(test_full_window),
		cmocka_unit_test(test_alignment_unsatisfiable),
		cmocka_unit_test(test_release_realloc_reuses),
		cmocka_unit_test(test_release_coalesces),
		cmocka_unit_test(test_carve_middle_and_tail),
		cmocka_unit_test(test_contains),
		cmocka_unit_test(test_release_restores_prot_none),
		cmocka_unit_test(test_release_drops_file_mapping),
		cmocka_unit_test(test_free_unmaps),
	};

	return cmocka_run_group_tests_name("window", tests, NULL, NULL);
}
