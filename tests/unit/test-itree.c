/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/itree.c: the interval tree and its union
 * measures, by hand and against brute force. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "itree.h"

#define PAGE ((uint64_t)4096)
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Small deterministic generator (xorshift64*), seeded per test. */
static uint64_t rng_state;

static void rng_seed(uint64_t seed)
{
	rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
}

static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, n), n > 0. */
static uint64_t rnd(uint64_t n)
{
	return rng() % n;
}

static const uint64_t seeds[] = { 1, 2, 3, 42, 20240601 };

/* ====================================================== interval tree */

struct item {
	struct odpd_inode n;
	uint64_t order;             /* our own insertion counter */
	bool in;
};

#define item_of(p) ((struct item *)((char *)(p) - offsetof(struct item, n)))

/* What a query's callback saw; it returns true at the stop_at-th visit. */
struct visits {
	struct odpd_inode *v[256];
	unsigned n;
	unsigned stop_at;           /* 0: never stop */
};

static bool record(struct odpd_inode *n, void *arg)
{
	struct visits *vs = arg;

	assert_true(vs->n < ARRAY_SIZE(vs->v));
	vs->v[vs->n++] = n;
	return vs->stop_at && vs->n == vs->stop_at;
}

/* Insert @n with the next insertion order (the caller's seq). */
static uint64_t test_seq;

static void tinsert(struct odpd_itree *t, struct odpd_inode *n)
{
	n->seq = ++test_seq;
	odpd_itree_insert(t, n);
}

static struct odpd_inode *query(struct odpd_itree *t, bool cover, uint64_t s, uint64_t e,
				struct visits *vs, unsigned stop_at)
{
	vs->n = 0;
	vs->stop_at = stop_at;
	return cover ? odpd_itree_find_covering(t, s, e, record, vs)
		     : odpd_itree_find_overlapping(t, s, e, record, vs);
}

static void item_set(struct item *it, uint64_t start, uint64_t end)
{
	memset(it, 0, sizeof(*it));
	it->n.start = start;
	it->n.end = end;
}

/* Visit exactly want[0..nwant) (in that order) for [s, e). */
static void expect_query(struct odpd_itree *t, bool cover, uint64_t s, uint64_t e,
			 struct item *const *want, unsigned nwant)
{
	struct visits vs;
	struct odpd_inode *r = query(t, cover, s, e, &vs, 0);

	assert_null(r);
	assert_int_equal(vs.n, nwant);
	for (unsigned i = 0; i < nwant; i++)
		assert_ptr_equal(vs.v[i], &want[i]->n);
}

static void test_itree_empty(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct visits vs;

	odpd_itree_init(&t);
	assert_true(odpd_itree_empty(&t));
	assert_true(odpd_itree_check(&t));
	assert_null(odpd_itree_first(&t));
	assert_null(query(&t, true, 0, 1, &vs, 1));
	assert_int_equal(vs.n, 0);
	assert_null(query(&t, false, 0, UINT64_MAX, &vs, 1));
	assert_int_equal(vs.n, 0);
}

static void test_itree_one(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct item a;
	struct item *const A[] = { &a };

	odpd_itree_init(&t);
	item_set(&a, 10, 20);
	tinsert(&t, &a.n);
	assert_false(odpd_itree_empty(&t));
	assert_true(odpd_itree_check(&t));
	assert_ptr_equal(odpd_itree_first(&t), &a.n);
	assert_null(odpd_itree_next(&t, &a.n));

	expect_query(&t, true, 10, 20, A, 1);
	expect_query(&t, true, 12, 15, A, 1);
	expect_query(&t, true, 9, 15, NULL, 0);
	expect_query(&t, true, 12, 21, NULL, 0);
	expect_query(&t, true, 0, 5, NULL, 0);
	expect_query(&t, true, 25, 30, NULL, 0);
	expect_query(&t, false, 19, 30, A, 1);
	expect_query(&t, false, 0, 11, A, 1);
	expect_query(&t, false, 0, 100, A, 1);
	expect_query(&t, false, 20, 30, NULL, 0);     /* [s, e) half-open */
	expect_query(&t, false, 0, 10, NULL, 0);

	odpd_itree_remove(&t, &a.n);
	assert_true(odpd_itree_empty(&t));
	assert_true(odpd_itree_check(&t));
	assert_null(odpd_itree_first(&t));
	expect_query(&t, false, 0, 100, NULL, 0);
}

static void test_itree_nested(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct item big, mid, small, side, late;

	odpd_itree_init(&t);
	/* inserted out of order: the visits still come by start */
	item_set(&small, 20, 30);
	item_set(&side, 60, 70);
	item_set(&big, 0, 100);
	item_set(&late, 90, 200);
	item_set(&mid, 10, 50);
	tinsert(&t, &small.n);
	tinsert(&t, &side.n);
	tinsert(&t, &big.n);
	tinsert(&t, &late.n);
	tinsert(&t, &mid.n);
	assert_true(odpd_itree_check(&t));

	{
		struct item *const want[] = { &big, &mid, &small };
		expect_query(&t, true, 25, 28, want, 3);
	}
	{
		struct item *const want[] = { &big, &mid };
		expect_query(&t, true, 10, 50, want, 2);
	}
	{
		struct item *const want[] = { &big, &side };
		expect_query(&t, true, 60, 65, want, 2);
	}
	{
		struct item *const want[] = { &big, &late };
		expect_query(&t, true, 95, 100, want, 2);
	}
	{
		struct item *const want[] = { &late };
		expect_query(&t, true, 95, 101, want, 1);
	}
	expect_query(&t, true, 0, 101, NULL, 0);
	{
		struct item *const want[] = { &big, &mid, &side };
		expect_query(&t, false, 40, 65, want, 3);
	}
	{
		struct item *const want[] = { &big, &mid, &small, &side, &late };
		expect_query(&t, false, 0, 1000, want, 5);
	}

	/* take the root-level container out: the rest still answer */
	odpd_itree_remove(&t, &big.n);
	assert_true(odpd_itree_check(&t));
	{
		struct item *const want[] = { &mid, &small };
		expect_query(&t, true, 25, 28, want, 2);
	}
	expect_query(&t, true, 60, 71, NULL, 0);
}

static void test_itree_equal_starts(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct item it[6];
	const uint64_t ends[] = { 50, 10, 30, 50, 20, 40 };
	struct odpd_inode *n;
	unsigned i;

	odpd_itree_init(&t);
	for (i = 0; i < ARRAY_SIZE(it); i++) {
		item_set(&it[i], 5, ends[i]);
		tinsert(&t, &it[i].n);
		assert_true(odpd_itree_check(&t));
	}
	/* equal starts come in insertion order */
	for (i = 0, n = odpd_itree_first(&t); n; n = odpd_itree_next(&t, n), i++)
		assert_ptr_equal(n, &it[i].n);
	assert_int_equal(i, ARRAY_SIZE(it));
	{
		struct item *const want[] = { &it[0], &it[2], &it[3], &it[5] };
		expect_query(&t, true, 5, 25, want, 4);
	}
	{
		struct item *const want[] = { &it[0], &it[3], &it[5] };
		expect_query(&t, false, 35, 60, want, 3);
	}

	/* a removed node inserted again comes after the equal starts left */
	odpd_itree_remove(&t, &it[0].n);
	tinsert(&t, &it[0].n);
	assert_true(odpd_itree_check(&t));
	{
		struct item *const want[] = { &it[3], &it[0] };
		expect_query(&t, true, 5, 45, want, 2);
	}
}

static void test_itree_stops_at_first_true(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct item it[8];
	struct visits vs;
	struct odpd_inode *r;
	unsigned i;

	odpd_itree_init(&t);
	/* [7-i, 100+i): all cover [10, 20), inserted in descending start */
	for (i = 0; i < ARRAY_SIZE(it); i++) {
		item_set(&it[i], 7 - i, 100 + i);
		tinsert(&t, &it[i].n);
	}
	assert_true(odpd_itree_check(&t));
	for (unsigned stop = 1; stop <= ARRAY_SIZE(it); stop++) {
		r = query(&t, true, 10, 20, &vs, stop);
		assert_int_equal(vs.n, stop);
		/* ascending start: it[7] (start 0) first */
		for (i = 0; i < vs.n; i++)
			assert_ptr_equal(vs.v[i], &it[ARRAY_SIZE(it) - 1 - i].n);
		assert_ptr_equal(r, &it[ARRAY_SIZE(it) - stop].n);

		r = query(&t, false, 50, 60, &vs, stop);
		assert_int_equal(vs.n, stop);
		assert_ptr_equal(r, &it[ARRAY_SIZE(it) - stop].n);
	}
	r = query(&t, true, 10, 20, &vs, 0);
	assert_null(r);
	assert_int_equal(vs.n, ARRAY_SIZE(it));
}

static void test_itree_remove_equal_starts(void **state)
{
	(void)state;
	struct odpd_itree t;
	struct item it[40];
	unsigned left = ARRAY_SIZE(it), i;

	rng_seed(7);
	odpd_itree_init(&t);
	for (i = 0; i < ARRAY_SIZE(it); i++) {
		/* three distinct starts, many duplicates, ends all over */
		item_set(&it[i], (i % 3) * 4, 20 + rnd(30));
		it[i].in = true;
		tinsert(&t, &it[i].n);
	}
	assert_true(odpd_itree_check(&t));
	while (left) {
		struct odpd_inode *n;
		unsigned pick = (unsigned)rnd(ARRAY_SIZE(it)), seen = 0;
		uint64_t prev_start = 0;
		int prev_idx = -1;

		if (!it[pick].in)
			continue;
		odpd_itree_remove(&t, &it[pick].n);
		it[pick].in = false;
		left--;
		assert_true(odpd_itree_check(&t));
		assert_int_equal(odpd_itree_empty(&t), left == 0);
		/* by start, then insertion order (the array index here) */
		for (n = odpd_itree_first(&t); n; n = odpd_itree_next(&t, n), seen++) {
			int idx = (int)((struct item *)n - it);

			assert_true(it[idx].in);
			if (prev_idx >= 0 && n->start == prev_start)
				assert_true(idx > prev_idx);
			else if (prev_idx >= 0)
				assert_true(n->start > prev_start);
			prev_start = n->start;
			prev_idx = idx;
		}
		assert_int_equal(seen, left);
	}
}

/* ---- randomized differential test */

#define NITEMS 48
#define SPAN 64                 /* coordinates: pages 0..SPAN */

struct model {
	struct odpd_itree t;
	struct item it[NITEMS];
	struct item *sorted[NITEMS];    /* in tree, by (start, order) */
	unsigned nin;
	uint64_t next_order;
};

static int cmp_items(const void *a, const void *b)
{
	const struct item *x = *(struct item *const *)a, *y = *(struct item *const *)b;

	if (x->n.start != y->n.start)
		return x->n.start < y->n.start ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

static void model_sort(struct model *m)
{
	m->nin = 0;
	for (unsigned i = 0; i < NITEMS; i++)
		if (m->it[i].in)
			m->sorted[m->nin++] = &m->it[i];
	qsort(m->sorted, m->nin, sizeof(m->sorted[0]), cmp_items);
}

/* Compare one query, run to the end and stopped at a random visit, with
 * the brute-force scan. */
static void check_query(struct model *m, bool cover, uint64_t s, uint64_t e)
{
	struct item *want[NITEMS];
	struct visits vs;
	struct odpd_inode *r;
	unsigned nwant = 0, i;

	for (i = 0; i < m->nin; i++) {
		const struct odpd_inode *n = &m->sorted[i]->n;
		bool hit = cover ? n->start <= s && n->end >= e : n->start < e && n->end > s;

		if (hit)
			want[nwant++] = m->sorted[i];
	}
	r = query(&m->t, cover, s, e, &vs, 0);
	if (vs.n != nwant)
		print_message("%s [%" PRIu64 ", %" PRIu64 "): %u visits, want %u\n",
			      cover ? "covering" : "overlapping", s, e, vs.n, nwant);
	assert_null(r);
	assert_int_equal(vs.n, nwant);
	for (i = 0; i < nwant; i++)
		assert_ptr_equal(vs.v[i], &want[i]->n);
	if (nwant) {
		unsigned stop = 1 + (unsigned)rnd(nwant);

		r = query(&m->t, cover, s, e, &vs, stop);
		assert_ptr_equal(r, &want[stop - 1]->n);
		assert_int_equal(vs.n, stop);
		for (i = 0; i < stop; i++)
			assert_ptr_equal(vs.v[i], &want[i]->n);
	}
}

static void random_range(uint64_t *s, uint64_t *e)
{
	uint64_t a, b;

	switch (rnd(4)) {
	case 0:                 /* few distinct starts: many equal ones */
		a = rnd(8) * (SPAN / 8);
		break;
	default:
		a = rnd(SPAN);
		break;
	}
	b = a + 1 + (rnd(2) ? rnd(SPAN - a) : rnd(4));
	if (b > SPAN)
		b = SPAN;
	*s = a * PAGE;
	*e = b * PAGE;
}

/* Items with an even insertion order: the predicate of the union queries. */
static bool even_order(const struct odpd_inode *n, const void *arg)
{
	(void)arg;
	return item_of(n)->order % 2 == 0;
}

static bool any_item(const struct odpd_inode *n, const void *arg)
{
	(void)n;
	(void)arg;
	return true;
}

static bool model_covers(struct model *m, uint64_t x, bool even)
{
	for (unsigned i = 0; i < m->nin; i++) {
		const struct item *it = m->sorted[i];

		if ((!even || it->order % 2 == 0) && it->n.start <= x && it->n.end > x)
			return true;
	}
	return false;
}

/* odpd_itree_gaps, a few at a time: ascending, maximal (a covered byte on
 * each side inside [s, e)), uncovered at both ends, @want bytes in all. */
static void check_tree_gaps(struct model *m, uint64_t s, uint64_t e, bool even, uint64_t want)
{
	struct odpd_gap g[3];
	uint64_t pos = s, sum = 0, last_end = 0;
	bool any = false;

	while (pos < e) {
		uint64_t next;
		unsigned max = 1 + (unsigned)rnd(3);
		unsigned n = odpd_itree_gaps(&m->t, pos, e, even ? even_order : any_item, NULL, g, max, &next);

		assert_true(n <= max);
		assert_true(next > pos || (n == 0 && next == e));
		for (unsigned i = 0; i < n; i++) {
			assert_true(g[i].start < g[i].end && g[i].start >= pos && g[i].end <= e);
			assert_true(!any || g[i].start > last_end);           /* maximal: not adjacent */
			assert_false(model_covers(m, g[i].start, even));
			assert_false(model_covers(m, g[i].end - 1, even));
			assert_true(g[i].start == s || model_covers(m, g[i].start - 1, even));
			assert_true(g[i].end == e || model_covers(m, g[i].end, even));
			sum += g[i].end - g[i].start;
			last_end = g[i].end;
			any = true;
		}
		assert_true(n == max || next == e);
		pos = next;
	}
	assert_int_equal(sum, want);
}

/* odpd_itree_uncovered against a byte-by-byte count (ranges are small). */
static void check_uncovered(struct model *m, uint64_t s, uint64_t e, bool even)
{
	uint64_t want = 0;

	/* a whole page at once where x is page aligned (nodes are whole pages) */
	for (uint64_t x = s, step; x < e; x += step) {
		bool covered = false;

		step = x % PAGE == 0 && x + PAGE <= e ? PAGE : 1;

		for (unsigned i = 0; i < m->nin && !covered; i++) {
			const struct item *it = m->sorted[i];

			covered = (!even || it->order % 2 == 0) && it->n.start <= x && it->n.end > x;
		}
		if (!covered)
			want += step;
	}
	assert_int_equal(odpd_itree_uncovered(&m->t, s, e, even ? even_order : any_item, NULL), want);
	check_tree_gaps(m, s, e, even, want);
}

static void check_model(struct model *m)
{
	struct odpd_inode *n;
	unsigned i = 0;

	assert_true(odpd_itree_check(&m->t));
	model_sort(m);
	assert_int_equal(m->t.count, m->nin);
	for (n = odpd_itree_first(&m->t); n; n = odpd_itree_next(&m->t, n), i++) {
		assert_true(i < m->nin);
		assert_ptr_equal(n, &m->sorted[i]->n);
	}
	assert_int_equal(i, m->nin);

	for (unsigned q = 0; q < 6; q++) {
		uint64_t s, e;

		random_range(&s, &e);
		check_query(m, true, s, e);
		check_query(m, false, s, e);
		check_uncovered(m, s, e, false);
		check_uncovered(m, s, e, true);
		check_uncovered(m, 0, SPAN * PAGE, true);
		/* a point, a byte-granular range and an empty one */
		s = rnd(SPAN * PAGE + 1);
		check_query(m, true, s, s + 1);
		check_query(m, false, s, s + 1 + rnd(3 * PAGE));
		check_query(m, false, s, s);
		check_uncovered(m, s, s + 1 + rnd(3 * PAGE), rnd(2));
		assert_int_equal(odpd_itree_uncovered(&m->t, s, s, any_item, NULL), 0);
		/* inside a node that is there: covering has at least one hit */
		if (m->nin) {
			const struct odpd_inode *in = &m->sorted[rnd(m->nin)]->n;
			uint64_t len = in->end - in->start;

			s = in->start + rnd(len);
			e = s + 1 + rnd(in->end - s);
			check_query(m, true, s, e);
			check_query(m, true, in->start, in->end);
		}
	}
}

/*
 * A client chooses the starts and the order it registers in: ascending,
 * descending or all at one start, 100,000 nodes stay shallow (a search tree
 * without balancing would be 100,000 deep; a treap's expected depth is
 * about 2.9 ln n = 33 here, and its deepest path about 45), and emptying
 * the tree front to back keeps it so.
 */
static void test_itree_depth_any_order(void **state)
{
	(void)state;
	enum { N = 100000 };
	struct item *it = calloc(N, sizeof(*it));
	struct odpd_itree t;

	assert_non_null(it);
	for (unsigned order = 0; order < 3; order++) {
		odpd_itree_init(&t);
		for (unsigned i = 0; i < N; i++) {
			uint64_t s = order == 0 ? i * PAGE : order == 1 ? (uint64_t)(N - i) * PAGE : PAGE;

			item_set(&it[i], s, s + (i % 7 + 1) * PAGE);
			tinsert(&t, &it[i].n);
		}
		assert_true(odpd_itree_check(&t));
		assert_int_equal(t.count, N);
		assert_in_range(odpd_itree_depth(&t), 17, 80);
		for (unsigned i = 0; i < N / 2; i++)
			odpd_itree_remove(&t, &it[i].n);
		assert_true(odpd_itree_check(&t));
		assert_in_range(odpd_itree_depth(&t), 16, 80);
		for (unsigned i = N / 2; i < N; i++)
			odpd_itree_remove(&t, &it[i].n);
		assert_true(odpd_itree_empty(&t) && odpd_itree_depth(&t) == 0);
	}
	free(it);
}

static void test_itree_random(void **state)
{
	(void)state;

	for (unsigned k = 0; k < ARRAY_SIZE(seeds); k++) {
		struct model *m = calloc(1, sizeof(*m));

		assert_non_null(m);
		rng_seed(seeds[k]);
		odpd_itree_init(&m->t);
		for (unsigned op = 0; op < 4000; op++) {
			struct item *it = &m->it[rnd(NITEMS)];
			/* drift between sparse and full trees */
			bool grow = ((op / 500) % 2 == 0) ? rnd(4) != 0 : rnd(4) == 0;

			if (!it->in && grow) {
				uint64_t s, e;

				random_range(&s, &e);
				it->n.start = s;
				it->n.end = e;
				it->order = m->next_order++;
				it->in = true;
				tinsert(&m->t, &it->n);
			} else if (it->in && !grow) {
				odpd_itree_remove(&m->t, &it->n);
				it->in = false;
			} else {
				continue;
			}
			check_model(m);
		}
		free(m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_itree_empty),
		cmocka_unit_test(test_itree_one),
		cmocka_unit_test(test_itree_nested),
		cmocka_unit_test(test_itree_equal_starts),
		cmocka_unit_test(test_itree_stops_at_first_true),
		cmocka_unit_test(test_itree_remove_equal_starts),
		cmocka_unit_test(test_itree_random),
		cmocka_unit_test(test_itree_depth_any_order),
	};

	return cmocka_run_group_tests_name("itree", tests, NULL, NULL);
}
