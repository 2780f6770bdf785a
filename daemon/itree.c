/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "itree.h"

/*
 * RB_GENERATE_STATIC spells its attribute "__unused", which libbsd leaves
 * undefined (it clashes with Linux headers' member names): say it here.
 */
#define ITREE_RB_GENERATE(name, type, cmp) \
	RB_GENERATE_INTERNAL(name, type, rb, cmp, __attribute__((__unused__)) static)

static inline uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t m = a > b ? a : b;

	return m > c ? m : c;
}

/* ================================================================ covmap */

/*
 * Generated first, while <bsd/sys/tree.h>'s RB_AUGMENT is still its no-op
 * default: the interval tree below redefines it.
 */

struct odpd_covseg {
	RB_ENTRY(odpd_covseg) rb;
	uint64_t start, end;        /* [start, end), disjoint from the others */
	unsigned count;             /* ranges covering it, >= 1 */
};

static int covseg_cmp(const struct odpd_covseg *a, const struct odpd_covseg *b)
{
	return a->start < b->start ? -1 : a->start > b->start;
}

ITREE_RB_GENERATE(odpd_covmap_rb, odpd_covseg, covseg_cmp)

#define covseg_next(g) RB_NEXT(odpd_covmap_rb, NULL, g)

static int fail_alloc_after = -1;

void odpd_covmap_test_fail_alloc(int after)
{
	fail_alloc_after = after;
}

static struct odpd_covseg *covseg_alloc(void)
{
	if (fail_alloc_after >= 0 && fail_alloc_after-- == 0)
		return NULL;
	return malloc(sizeof(struct odpd_covseg));
}

void odpd_covmap_init(struct odpd_covmap *m)
{
	RB_INIT(&m->root);
	m->covered = 0;
	m->nsegs = 0;
}

void odpd_covmap_clear(struct odpd_covmap *m)
{
	struct odpd_covseg *g = RB_ROOT(&m->root);

	/* Post-order teardown along the parent links: O(n), no rebalancing. */
	while (g) {
		struct odpd_covseg *p;

		if (RB_LEFT(g, rb)) {
			g = RB_LEFT(g, rb);
			continue;
		}
		if (RB_RIGHT(g, rb)) {
			g = RB_RIGHT(g, rb);
			continue;
		}
		p = RB_PARENT(g, rb);
		if (p) {
			if (RB_LEFT(p, rb) == g)
				RB_LEFT(p, rb) = NULL;
			else
				RB_RIGHT(p, rb) = NULL;
		}
		free(g);
		g = p;
	}
	odpd_covmap_init(m);
}

/*
 * One descent: *floor is the last segment starting at or before @s, *ceil
 * the first starting after it (its in-order successor). Either may be NULL.
 */
static void covseg_search(const struct odpd_covmap *m, uint64_t s,
			  struct odpd_covseg **floor, struct odpd_covseg **ceil)
{
	struct odpd_covseg *g = RB_ROOT(&m->root);

	*floor = *ceil = NULL;
	while (g) {
		if (g->start <= s) {
			*floor = g;
			g = RB_RIGHT(g, rb);
		} else {
			*ceil = g;
			g = RB_LEFT(g, rb);
		}
	}
}

/* The first segment ending after @s (the one holding s, or the next). */
static struct odpd_covseg *covseg_first_after(const struct odpd_covmap *m, uint64_t s)
{
	struct odpd_covseg *floor, *ceil;

	covseg_search(m, s, &floor, &ceil);
	return floor && floor->end > s ? floor : ceil;
}

/*
 * Link @x between @prev and @next, adjacent in order (NULL: none there), and
 * rebalance. No search: of two adjacent nodes, either the first has no right
 * child or the second no left child; the first of all has no left child.
 * O(1) amortized.
 */
static void covseg_link(struct odpd_covmap *m, struct odpd_covseg *x,
			struct odpd_covseg *prev, struct odpd_covseg *next)
{
	if (prev && !RB_RIGHT(prev, rb)) {
		RB_SET(x, prev, rb);
		RB_RIGHT(prev, rb) = x;
	} else if (next) {
		RB_SET(x, next, rb);
		RB_LEFT(next, rb) = x;
	} else {
		RB_SET(x, NULL, rb);
		RB_ROOT(&m->root) = x;
	}
	odpd_covmap_rb_RB_INSERT_COLOR(&m->root, x);
}

/* Link @x right after @g. */
static void covseg_link_after(struct odpd_covmap *m, struct odpd_covseg *x, struct odpd_covseg *g)
{
	struct odpd_covseg *n = RB_RIGHT(g, rb);

	if (n)
		while (RB_LEFT(n, rb))
			n = RB_LEFT(n, rb);
	covseg_link(m, x, g, n);
}

/* Take a preallocated segment from @spare (chained through rbe_left). */
static struct odpd_covseg *covseg_take(struct odpd_covseg **spare, uint64_t start, uint64_t end,
				       unsigned count)
{
	struct odpd_covseg *x = *spare;

	*spare = RB_LEFT(x, rb);
	x->start = start;
	x->end = end;
	x->count = count;
	return x;
}

/* Split @g at @at (g->start < at < g->end): @g keeps the head; the tail,
 * with the same count, is linked right after it and returned. */
static struct odpd_covseg *covseg_split(struct odpd_covmap *m, struct odpd_covseg *g, uint64_t at,
					struct odpd_covseg **spare)
{
	struct odpd_covseg *x = covseg_take(spare, at, g->end, g->count);

	g->end = at;
	covseg_link_after(m, x, g);
	return x;
}

/*
 * Walk [s, e) as odpd_covmap_add would, changing nothing: return the bytes
 * no segment covers, and in *need how many segments add would allocate (one
 * per gap, one per split at s or at e). O(log n + k).
 */
static uint64_t covmap_plan(const struct odpd_covmap *m, uint64_t s, uint64_t e, size_t *need)
{
	struct odpd_covseg *g = covseg_first_after(m, s);
	uint64_t pos = s, gap = 0;
	size_t k = 0;

	if (g && g->start < s)
		k++;                            /* split at s */
	while (pos < e) {
		if (!g || g->start >= e) {
			gap += e - pos;
			k++;
			break;
		}
		if (g->start > pos) {
			gap += g->start - pos;
			k++;
		}
		if (g->end > e)
			k++;                    /* split at e */
		pos = g->end;
		g = covseg_next(g);
	}
	if (need)
		*need = k;
	return gap;
}

void odpd_covmap_for_each_gap(const struct odpd_covmap *m, uint64_t s, uint64_t e,
			      void (*fn)(uint64_t gs, uint64_t ge, void *arg), void *arg)
{
	const struct odpd_covseg *g = s < e ? covseg_first_after(m, s) : NULL;
	uint64_t pos = s;

	while (pos < e) {
		if (!g || g->start >= e) {
			fn(pos, e, arg);
			return;
		}
		if (g->start > pos)
			fn(pos, g->start, arg);
		pos = g->end;
		g = covseg_next((struct odpd_covseg *)g);
	}
}

uint64_t odpd_covmap_uncovered(const struct odpd_covmap *m, uint64_t s, uint64_t e)
{
	if (s >= e)
		return 0;
	return covmap_plan(m, s, e, NULL);
}

int64_t odpd_covmap_add(struct odpd_covmap *m, uint64_t s, uint64_t e)
{
	struct odpd_covseg *spare = NULL, *floor, *ceil, *prev, *g;
	uint64_t gained, pos = s;
	size_t need, i;

	if (s >= e)
		return 0;
	gained = covmap_plan(m, s, e, &need);

	/* All the allocations first: past this point nothing can fail. */
	for (i = 0; i < need; i++) {
		struct odpd_covseg *x = covseg_alloc();

		if (!x) {
			while (spare) {
				x = RB_LEFT(spare, rb);
				free(spare);
				spare = x;
			}
			return -ENOMEM;
		}
		RB_LEFT(x, rb) = spare;
		spare = x;
	}

	/* prev and g stay adjacent in order: prev ends at or before pos, g
	 * (or nothing) is the first segment ending after pos. */
	covseg_search(m, s, &floor, &ceil);
	if (floor && floor->end > s) {
		if (floor->start < s) {
			prev = floor;
			g = covseg_split(m, floor, s, &spare);
		} else {
			prev = RB_PREV(odpd_covmap_rb, &m->root, floor);
			g = floor;
		}
	} else {
		prev = floor;
		g = ceil;
	}
	while (pos < e) {
		if (!g || g->start >= e) {
			covseg_link(m, covseg_take(&spare, pos, e, 1), prev, g);
			break;
		}
		if (g->start > pos)
			covseg_link(m, covseg_take(&spare, pos, g->start, 1), prev, g);
		if (g->end > e)
			covseg_split(m, g, e, &spare);
		g->count++;
		pos = g->end;
		prev = g;
		g = covseg_next(g);
	}

	m->nsegs += need;
	m->covered += gained;
	return (int64_t)gained;
}

uint64_t odpd_covmap_remove(struct odpd_covmap *m, uint64_t s, uint64_t e)
{
	struct odpd_covseg *g;
	uint64_t freed = 0;

	if (s >= e)
		return 0;
	/* add split at s and e and nothing merges, so the segments of [s, e)
	 * lie exactly inside it; a segment that does not (the caller broke the
	 * contract) is left alone rather than miscounted. */
	for (g = covseg_first_after(m, s); g && g->start < e;) {
		struct odpd_covseg *next = covseg_next(g);

		if (g->start >= s && g->end <= e && --g->count == 0) {
			freed += g->end - g->start;
			RB_REMOVE(odpd_covmap_rb, &m->root, g);
			free(g);
			m->nsegs--;
		}
		g = next;
	}
	m->covered -= freed;
	return freed;
}

/* Red-black shape and parent links of a subtree: its black height, or -1. */
#define RB_CHECK_FN(fname, type)                                                \
static int fname(const struct type *x, const struct type *parent)              \
{                                                                               \
	int l, r;                                                               \
                                                                                \
	if (!x)                                                                 \
		return 1;                                                       \
	if (RB_PARENT(x, rb) != parent)                                         \
		return -1;                                                      \
	if (RB_COLOR(x, rb) == RB_RED &&                                        \
	    ((RB_LEFT(x, rb) && RB_COLOR(RB_LEFT(x, rb), rb) == RB_RED) ||      \
	     (RB_RIGHT(x, rb) && RB_COLOR(RB_RIGHT(x, rb), rb) == RB_RED)))     \
		return -1;                                                      \
	l = fname(RB_LEFT(x, rb), x);                                           \
	r = fname(RB_RIGHT(x, rb), x);                                          \
	if (l < 0 || l != r)                                                    \
		return -1;                                                      \
	return l + (RB_COLOR(x, rb) == RB_BLACK);                               \
}

RB_CHECK_FN(covseg_check_shape, odpd_covseg)

bool odpd_covmap_check(const struct odpd_covmap *m)
{
	const struct odpd_covseg *root = RB_ROOT(&m->root), *prev = NULL;
	struct odpd_covseg *g;
	uint64_t covered = 0;
	unsigned n = 0;

	if (root && RB_COLOR(root, rb) != RB_BLACK)
		return false;
	if (covseg_check_shape(root, NULL) < 0)
		return false;
	RB_FOREACH(g, odpd_covmap_rb, (struct odpd_covmap_rb *)&m->root) {
		if (g->start >= g->end || g->count == 0 || (prev && prev->end > g->start))
			return false;
		covered += g->end - g->start;
		n++;
		prev = g;
	}
	return n == m->nsegs && covered == m->covered;
}

/* ========================================================== interval tree */

/*
 * Augmentation, kept exact at every step, with RB_AUGMENT(x) recomputing x
 * alone from its own end and its children's max_end (O(1)):
 *  - rotations: <bsd/sys/tree.h> augments the lower node, then the upper
 *    one, each after its children are final; the pair's parent keeps the
 *    same subtree, so nothing above changes;
 *  - insert: RB_INSERT augments only the new leaf's parent, so the descent
 *    below raises max_end along the path first (RB_INSERT then takes the
 *    same path: keys are unique), and every value is exact before the
 *    rebalancing starts;
 *  - remove: the node's own end is first taken out of its max_end and its
 *    ancestors' (as if it were already gone), then RB_REMOVE: when the
 *    node has one child or none, the parent's max_end already is what it
 *    must become; when it has two, the tree re-augments the whole path from
 *    the successor's old parent to the root itself, bottom-up.
 * Insert and remove are O(log n). The randomized test checks every max_end
 * after every operation.
 */

static inline uint64_t inode_max(const struct odpd_inode *n)
{
	return n ? n->max_end : 0;
}

/* Recompute n->max_end from n and its children; true if it changed. */
static inline bool inode_augment(struct odpd_inode *n)
{
	uint64_t m = max3(n->end, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb)));

	if (m == n->max_end)
		return false;
	n->max_end = m;
	return true;
}

static int inode_cmp(const struct odpd_inode *a, const struct odpd_inode *b)
{
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

#undef RB_AUGMENT
#define RB_AUGMENT(x) ((void)inode_augment(x))
ITREE_RB_GENERATE(odpd_itree_rb, odpd_inode, inode_cmp)
#undef RB_AUGMENT
#define RB_AUGMENT(x) do {} while (0)

void odpd_itree_init(struct odpd_itree *t)
{
	RB_INIT(&t->root);
	t->next_seq = 0;
	t->count = 0;
}

void odpd_itree_insert(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode *p;

	n->seq = t->next_seq++;
	n->max_end = n->end;
	for (p = RB_ROOT(&t->root); p; p = inode_cmp(n, p) < 0 ? RB_LEFT(p, rb) : RB_RIGHT(p, rb))
		if (p->max_end < n->end)
			p->max_end = n->end;
	RB_INSERT(odpd_itree_rb, &t->root, n);
	t->count++;
}

void odpd_itree_remove(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode *p;

	n->max_end = max3(0, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb)));
	for (p = RB_PARENT(n, rb); p && inode_augment(p); p = RB_PARENT(p, rb))
		;
	RB_REMOVE(odpd_itree_rb, &t->root, n);
	t->count--;
}

/*
 * In order, skipping subtrees whose max_end < e (nothing there ends late
 * enough) and, past a node starting after s, everything to its right.
 * Recurses on left children only: depth <= the tree's height.
 */
static struct odpd_inode *covering(struct odpd_inode *n, uint64_t s, uint64_t e,
				   bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	while (n && n->max_end >= e) {
		struct odpd_inode *r = covering(RB_LEFT(n, rb), s, e, fn, arg);

		if (r)
			return r;
		if (n->start > s)
			return NULL;
		if (n->end >= e && fn(n, arg))
			return n;
		n = RB_RIGHT(n, rb);
	}
	return NULL;
}

static struct odpd_inode *overlapping(struct odpd_inode *n, uint64_t s, uint64_t e,
				      bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	while (n && n->max_end > s) {
		struct odpd_inode *r = overlapping(RB_LEFT(n, rb), s, e, fn, arg);

		if (r)
			return r;
		if (n->start >= e)
			return NULL;
		if (n->end > s && fn(n, arg))
			return n;
		n = RB_RIGHT(n, rb);
	}
	return NULL;
}

struct odpd_inode *odpd_itree_find_covering(struct odpd_itree *t, uint64_t s, uint64_t e,
					     bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return covering(RB_ROOT(&t->root), s, e, fn, arg);
}

struct odpd_inode *odpd_itree_find_overlapping(struct odpd_itree *t, uint64_t s, uint64_t e,
						bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return overlapping(RB_ROOT(&t->root), s, e, fn, arg);
}

struct uncovered {
	bool (*pred)(const struct odpd_inode *n, const void *arg);
	const void *arg;
	uint64_t pos, e, gap;               /* covered up to pos; gap: uncovered before it */
};

static bool uncovered_visit(struct odpd_inode *n, void *arg)
{
	struct uncovered *u = arg;

	if (u->pos >= u->e)
		return true;                    /* all of it covered: stop */
	if (!u->pred(n, u->arg))
		return false;
	if (n->start > u->pos) {               /* in ascending start order */
		u->gap += (n->start < u->e ? n->start : u->e) - u->pos;
		u->pos = n->start;
	}
	if (n->end > u->pos)
		u->pos = n->end;
	return false;
}

uint64_t odpd_itree_uncovered(struct odpd_itree *t, uint64_t s, uint64_t e,
			      bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg)
{
	struct uncovered u = { .pred = pred, .arg = arg, .pos = s, .e = e };

	if (s >= e)
		return 0;
	overlapping(RB_ROOT(&t->root), s, e, uncovered_visit, &u);
	return u.gap + (u.pos < e ? e - u.pos : 0);
}

struct odpd_inode *odpd_itree_first(struct odpd_itree *t)
{
	return RB_MIN(odpd_itree_rb, &t->root);
}

struct odpd_inode *odpd_itree_next(struct odpd_itree *t, struct odpd_inode *n)
{
	(void)t;
	return RB_NEXT(odpd_itree_rb, &t->root, n);
}

RB_CHECK_FN(inode_check_shape, odpd_inode)

/* max_end of every node of the subtree, and start < end. */
static bool inode_check_max(const struct odpd_inode *n)
{
	if (!n)
		return true;
	if (n->start >= n->end ||
	    n->max_end != max3(n->end, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb))))
		return false;
	return inode_check_max(RB_LEFT(n, rb)) && inode_check_max(RB_RIGHT(n, rb));
}

bool odpd_itree_check(const struct odpd_itree *t)
{
	const struct odpd_inode *root = RB_ROOT(&t->root), *prev = NULL;
	struct odpd_inode *n;
	unsigned count = 0;

	if (root && RB_COLOR(root, rb) != RB_BLACK)
		return false;
	if (inode_check_shape(root, NULL) < 0 || !inode_check_max(root))
		return false;
	RB_FOREACH(n, odpd_itree_rb, (struct odpd_itree_rb *)&t->root) {
		if (prev && inode_cmp(prev, n) >= 0)
			return false;
		if (n->seq >= t->next_seq)
			return false;
		count++;
		prev = n;
	}
	return count == t->count;
}
