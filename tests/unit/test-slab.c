/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/slab.c: objects are distinct, zeroed and reused;
 * blocks fill, empty and go back (one kept). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "slab.h"

#define BLOCK_OF(p) ((uintptr_t)(p) & ~(uintptr_t)(ODPD_SLAB_BLOCK - 1))

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;

	return x < y ? -1 : x > y;
}

/* Inside one block, past its header (the block variant only). */
static void assert_in_block(const void *p, size_t size)
{
#ifndef ODPD_SLAB_BY_MALLOC
	assert_true(BLOCK_OF(p) == BLOCK_OF((const char *)p + size - 1));
	assert_true((uintptr_t)p - BLOCK_OF(p) >= 32);
#else
	(void)p;
	(void)size;
#endif
}

static void fill_free_reuse(size_t size)
{
	struct odpd_slab s;
	enum { N = 1500 };              /* several blocks of either size */
	void *p[N], *sorted[N];
	unsigned per_block;

	odpd_slab_init(&s, size);
	per_block = s.per_block;
	assert_true(per_block >= 200 && per_block * size <= ODPD_SLAB_BLOCK);
	for (unsigned i = 0; i < N; i++) {
		p[i] = odpd_slab_zalloc(&s);
		assert_non_null(p[i]);
		assert_int_equal((uintptr_t)p[i] % 8, 0);
		assert_in_block(p[i], size);
		assert_true(all_bytes(p[i], size, 0));
		memset(p[i], (int)(i & 0xff) | 1, size);
	}
	assert_int_equal(s.objects, N);
	/* distinct and not overlapping */
	memcpy(sorted, p, sizeof(p));
	qsort(sorted, N, sizeof(sorted[0]), cmp_ptr);
	for (unsigned i = 1; i < N; i++)
		assert_true((uintptr_t)sorted[i] >= (uintptr_t)sorted[i - 1] + size);
	for (unsigned i = 0; i < N; i++)
		assert_true(all_bytes(p[i], size, (unsigned char)((i & 0xff) | 1)));
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, (N + per_block - 1) / per_block);
#endif
	/* every other one back, then taken again: zeroed, in no new block */
	for (unsigned i = 0; i < N; i += 2)
		odpd_slab_free(&s, p[i]);
	assert_int_equal(s.objects, N / 2);
	for (unsigned i = 0; i < N; i += 2) {
		p[i] = odpd_slab_zalloc(&s);
		assert_non_null(p[i]);
		assert_true(all_bytes(p[i], size, 0));
		memset(p[i], 0x55, size);
	}
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, (N + per_block - 1) / per_block);   /* no new block */
#endif
	for (unsigned i = 1; i < N; i += 2)
		assert_true(all_bytes(p[i], size, (unsigned char)((i & 0xff) | 1)));
	/* all back, in a scrambled order: one empty block kept, the rest given back */
	for (unsigned i = 0; i < N; i++) {
		unsigned j = (i * 389u) % N;       /* 389 and 1500 coprime: a permutation */
		odpd_slab_free(&s, p[j]);
	}
	assert_int_equal(s.objects, 0);
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, 1);
#endif
	odpd_slab_free(&s, NULL);
	/* the kept block serves the next block's worth, fresh, then a new one */
	for (unsigned i = 0; i <= per_block; i++) {
		p[i] = odpd_slab_zalloc(&s);
		assert_non_null(p[i]);
		assert_in_block(p[i], size);
		assert_true(all_bytes(p[i], size, 0));
		memset(p[i], 0x77, size);
#ifndef ODPD_SLAB_BY_MALLOC
		assert_int_equal(s.blocks, i < per_block ? 1 : 2);
#endif
	}
	memcpy(sorted, p, (per_block + 1) * sizeof(p[0]));
	qsort(sorted, per_block + 1, sizeof(sorted[0]), cmp_ptr);
	for (unsigned i = 1; i <= per_block; i++)
		assert_true((uintptr_t)sorted[i] >= (uintptr_t)sorted[i - 1] + size);
	for (unsigned i = 0; i <= per_block; i++)
		odpd_slab_free(&s, p[i]);
	odpd_slab_fini(&s);
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, 0);
#endif
}

static void test_slab_fill_free_reuse(void **state)
{
	(void)state;
	fill_free_reuse(264);           /* struct odpd_mr */
	fill_free_reuse(112);           /* struct odpd_ref */
}

/* A full block that gets room again is used before a new one. */
/* The objects odpd_slab_next walks: exactly those in use, each once. */
static void expect_walk(const struct odpd_slab *s, void *const *p, const bool *in, unsigned n)
{
	unsigned seen = 0, want = 0;

	for (unsigned i = 0; i < n; i++)
		want += in[i];
	for (void *o = odpd_slab_next(s, NULL); o; o = odpd_slab_next(s, o)) {
		unsigned i = *(unsigned *)o;

		assert_true(i < n && p[i] == o && in[i]);
		assert_true(seen++ < want);
	}
	assert_int_equal(seen, want);
}

/*
 * The walk finds every object in use, in full and partial blocks, none that
 * was freed, none twice; the walker may free the object it stands on once
 * it took the next (emptying blocks, which go back), and objects allocated
 * afterwards are walked again.
 */
static void test_slab_walk(void **state)
{
	(void)state;
	enum { N = 1200 };
	static void *p[N];
	static bool in[N];
	struct odpd_slab s;
	unsigned left = N;

	odpd_slab_init(&s, 192);
	assert_null(odpd_slab_next(&s, NULL));
	for (unsigned i = 0; i < N; i++) {
		p[i] = odpd_slab_zalloc(&s);
		assert_non_null(p[i]);
		*(unsigned *)p[i] = i;
		in[i] = true;
	}
	expect_walk(&s, p, in, N);
	for (unsigned i = 0; i < N; i += 3) {         /* holes everywhere */
		odpd_slab_free(&s, p[i]);
		in[i] = false;
		left--;
	}
	expect_walk(&s, p, in, N);
	/* free every object whose index is odd while walking: the next is taken first */
	for (void *o = odpd_slab_next(&s, NULL), *next; o; o = next) {
		unsigned i = *(unsigned *)o;

		next = odpd_slab_next(&s, o);
		if (i % 2) {
			odpd_slab_free(&s, o);
			in[i] = false;
			left--;
		}
	}
	expect_walk(&s, p, in, N);
	assert_int_equal(s.objects, left);
	for (unsigned i = 0; i < N; i++)
		if (!in[i]) {
			p[i] = odpd_slab_zalloc(&s);
			assert_non_null(p[i]);
			*(unsigned *)p[i] = i;
			in[i] = true;
		}
	expect_walk(&s, p, in, N);
	for (void *o = odpd_slab_next(&s, NULL), *next; o; o = next) {
		next = odpd_slab_next(&s, o);
		in[*(unsigned *)o] = false;
		odpd_slab_free(&s, o);
	}
	assert_int_equal(s.objects, 0);
	assert_null(odpd_slab_next(&s, NULL));
	odpd_slab_fini(&s);
}

static void test_slab_full_block_gets_room(void **state)
{
	struct odpd_slab s;
	void **p;
	unsigned n;

	(void)state;
	odpd_slab_init(&s, 264);
	n = s.per_block;
	p = calloc(n + 1, sizeof(*p));
	assert_non_null(p);
	for (unsigned i = 0; i < n; i++)
		assert_non_null(p[i] = odpd_slab_zalloc(&s));
	odpd_slab_free(&s, p[n / 2]);
	p[n / 2] = odpd_slab_zalloc(&s);
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, 1);
#endif
	assert_non_null(p[n] = odpd_slab_zalloc(&s));   /* a second block now */
#ifndef ODPD_SLAB_BY_MALLOC
	assert_int_equal(s.blocks, 2);
#endif
	for (unsigned i = 0; i <= n; i++)
		odpd_slab_free(&s, p[i]);
	odpd_slab_fini(&s);
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slab_fill_free_reuse),
		cmocka_unit_test(test_slab_full_block_gets_room),
		cmocka_unit_test(test_slab_walk),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
