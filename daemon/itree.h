/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Two interval structures over byte ranges [start, end) of one segment,
 * both red-black trees (libbsd's <bsd/sys/tree.h>):
 *
 *  - odpd_itree: an interval tree of caller-embedded nodes (the MRs of one
 *    PD over one segment), augmented with each subtree's largest end, so
 *    that "which nodes cover [s, e)?" visits only subtrees that can hold one:
 *    O(log n + k). Nodes may overlap and repeat.
 *
 *  - odpd_covmap: a coverage count over pages: disjoint intervals, each
 *    with how many ranges cover it. Adding a range returns how many bytes
 *    became covered for the first time; removing one returns how many bytes
 *    are no longer covered at all. This is how pinned bytes are counted as
 *    distinct pages: overlapping MRs are not counted twice.
 */

#include <stdbool.h>
#include <stdint.h>
#include <bsd/sys/tree.h>

struct odpd_inode {
	RB_ENTRY(odpd_inode) rb;
	uint64_t start, end;        /* [start, end), start < end; set before insert, fixed while in */
	uint64_t max_end;           /* private: largest end in this subtree */
	uint64_t seq;               /* private: insertion order, tie-break */
};

RB_HEAD(odpd_itree_rb, odpd_inode);

struct odpd_itree {
	struct odpd_itree_rb root;
	uint64_t next_seq;
	unsigned count;
};

void odpd_itree_init(struct odpd_itree *t);
void odpd_itree_insert(struct odpd_itree *t, struct odpd_inode *n);
void odpd_itree_remove(struct odpd_itree *t, struct odpd_inode *n);
static inline bool odpd_itree_empty(const struct odpd_itree *t) { return t->count == 0; }

/*
 * Call @fn for nodes with start <= @s and end >= @e (the nodes covering
 * [s, e)), in ascending (start, insertion) order, until @fn returns true;
 * return that node, or NULL. @fn must not change the tree.
 */
struct odpd_inode *odpd_itree_find_covering(struct odpd_itree *t, uint64_t s, uint64_t e,
					     bool (*fn)(struct odpd_inode *n, void *arg), void *arg);

/* Call @fn for every node overlapping [s, e) (start < e && end > s), ascending,
 * until it returns true; return that node or NULL. @fn must not change the tree. */
struct odpd_inode *odpd_itree_find_overlapping(struct odpd_itree *t, uint64_t s, uint64_t e,
						bool (*fn)(struct odpd_inode *n, void *arg), void *arg);

/*
 * Bytes of [s, e) that no node for which @pred holds overlaps: the part of
 * the range the union of those nodes leaves uncovered. One in-order walk of
 * the nodes overlapping [s, e): O(log n + k). This is how distinct bytes are
 * counted (pinned pages: overlapping MRs are not counted twice) without a
 * structure of their own.
 */
uint64_t odpd_itree_uncovered(struct odpd_itree *t, uint64_t s, uint64_t e,
			      bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg);

/* First node in (start, insertion) order, and the next; NULL at the end. */
struct odpd_inode *odpd_itree_first(struct odpd_itree *t);
struct odpd_inode *odpd_itree_next(struct odpd_itree *t, struct odpd_inode *n);

/* ---------------------------------------------------------------- covmap */

struct odpd_covseg;
RB_HEAD(odpd_covmap_rb, odpd_covseg);

struct odpd_covmap {
	struct odpd_covmap_rb root;
	uint64_t covered;           /* bytes covered by at least one range */
	unsigned nsegs;             /* disjoint intervals held (memory use) */
};

void odpd_covmap_init(struct odpd_covmap *m);
/* Free every interval. */
void odpd_covmap_clear(struct odpd_covmap *m);
/* Bytes of [s, e) that no range covers yet (what odpd_covmap_add would return). */
uint64_t odpd_covmap_uncovered(const struct odpd_covmap *m, uint64_t s, uint64_t e);
/* Call @fn for each maximal sub-range of [s, e) that no range covers, in
 * ascending order. @fn must not change @m. */
void odpd_covmap_for_each_gap(const struct odpd_covmap *m, uint64_t s, uint64_t e,
			      void (*fn)(uint64_t gs, uint64_t ge, void *arg), void *arg);
/* Cover [s, e) once more. Returns the bytes newly covered (>= 0), or -ENOMEM
 * (then nothing changed). */
int64_t odpd_covmap_add(struct odpd_covmap *m, uint64_t s, uint64_t e);
/* Undo one odpd_covmap_add(s, e) (the caller guarantees it was added).
 * Intervals are never merged, so the boundaries add made are still there:
 * removing never splits and never allocates. Returns the bytes no longer
 * covered by anything. */
uint64_t odpd_covmap_remove(struct odpd_covmap *m, uint64_t s, uint64_t e);

/* ------------------------------------------------------------- for tests */

/* Check every invariant: red-black shape, parent links, (start, insertion)
 * order, each node's max_end, and count / nsegs / covered. O(n). */
bool odpd_itree_check(const struct odpd_itree *t);
bool odpd_covmap_check(const struct odpd_covmap *m);
/* Let the next @after covmap allocations succeed and fail the one after
 * (once); a negative @after disables the failure. */
void odpd_covmap_test_fail_alloc(int after);
