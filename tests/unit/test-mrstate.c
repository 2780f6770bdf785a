/* SPDX-License-Identifier: MIT */
/* Unit tests of the MR lifecycle (daemon/registry/mrlife.c): every
 * transition of registry.h's table goes through mr_set_state(), every other
 * one is refused (the assert fires, in a child), an MR may be freed only
 * when DEAD with no reference and no verify, and the wire sees the five
 * states it knows. */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "registry/mrlife.h"

#define REG ODPD_MR_REGISTERING
#define LIVE ODPD_MR_LIVE
#define RLX ODPD_MR_RELAXED
#define INV ODPD_MR_INVALIDATING
#define DEAD ODPD_MR_DEAD
#define DEF ODPD_MR_DEFERRED
#define DDEF ODPD_MR_DEAD_DEFERRED
#define DBAT ODPD_MR_DEAD_BATCHED

/* registry.h's table, written out again: the code must match the document. */
static const struct { enum odpd_mr_state from, to; } table[] = {
	{ REG, LIVE }, { REG, INV }, { REG, DEAD },
	{ LIVE, RLX }, { LIVE, INV }, { LIVE, DEF }, { LIVE, DBAT }, { LIVE, DDEF },
	{ RLX, LIVE }, { RLX, INV }, { RLX, DEF },
	{ DEF, INV }, { DDEF, DBAT },
	{ INV, DEAD }, { DBAT, DEAD },
};
#define N_TABLE (sizeof(table) / sizeof(table[0]))

static bool in_table(enum odpd_mr_state from, enum odpd_mr_state to)
{
	for (size_t i = 0; i < N_TABLE; i++)
		if (table[i].from == from && table[i].to == to)
			return true;
	return false;
}

static void test_table(void **state)
{
	(void)state;
	for (enum odpd_mr_state f = 0; f < ODPD_MR_N_STATES; f++)
		for (enum odpd_mr_state t = 0; t < ODPD_MR_N_STATES; t++)
			assert_int_equal(odpd_mr_transition_legal(f, t), in_table(f, t));
	assert_false(odpd_mr_transition_legal(LIVE, (enum odpd_mr_state)ODPD_MR_N_STATES));
	assert_false(odpd_mr_transition_legal((enum odpd_mr_state)ODPD_MR_N_STATES, LIVE));
}

/* Every legal transition, each through mr_set_state. */
static void test_every_transition(void **state)
{
	struct odpd_mr mr;

	(void)state;
	for (size_t i = 0; i < N_TABLE; i++) {
		memset(&mr, 0, sizeof(mr));
		mr.state = (unsigned)table[i].from;
		mr_set_state(&mr, table[i].to);
		assert_int_equal(mr.state, table[i].to);
	}
}

/* Whole lives, as the registry drives them. */
static void drive(const enum odpd_mr_state *path, size_t n)
{
	struct odpd_mr mr;

	memset(&mr, 0, sizeof(mr));
	assert_int_equal(mr.state, REG);         /* a zeroed MR is born registering */
	for (size_t i = 0; i < n; i++) {
		mr_set_state(&mr, path[i]);
		assert_int_equal(mr.state, path[i]);
	}
	assert_int_equal(mr.state, DEAD);
	assert_true(odpd_mr_may_free(&mr));
}

static void test_lives(void **state)
{
	static const enum odpd_mr_state failed[] = { DEAD };
	static const enum odpd_mr_state refused[] = { INV, DEAD };
	static const enum odpd_mr_state plain[] = { LIVE, INV, DEAD };
	static const enum odpd_mr_state relaxed[] = { LIVE, RLX, LIVE, RLX, INV, DEAD };
	static const enum odpd_mr_state verified[] = { LIVE, DEF, INV, DEAD };
	static const enum odpd_mr_state relaxed_verified[] = { LIVE, RLX, DEF, INV, DEAD };
	static const enum odpd_mr_state killed[] = { LIVE, DBAT, DEAD };
	static const enum odpd_mr_state killed_verified[] = { LIVE, DDEF, DBAT, DEAD };

	(void)state;
	drive(failed, 1);
	drive(refused, 2);
	drive(plain, 3);
	drive(relaxed, 6);
	drive(verified, 4);
	drive(relaxed_verified, 5);
	drive(killed, 3);
	drive(killed_verified, 4);
}

/* Only DEAD, with no reference and no verify. */
static void test_may_free(void **state)
{
	struct odpd_mr mr;

	(void)state;
	for (enum odpd_mr_state s = 0; s < ODPD_MR_N_STATES; s++) {
		memset(&mr, 0, sizeof(mr));
		mr.state = (unsigned)s;
		assert_int_equal(odpd_mr_may_free(&mr), s == DEAD);
		mr.refs = 1;
		assert_false(odpd_mr_may_free(&mr));
		mr.refs = 0;
		mr.busy = 1;
		assert_false(odpd_mr_may_free(&mr));
	}
}

static void test_wire(void **state)
{
	static const unsigned wire[ODPD_MR_N_STATES] = {
		[REG] = REG, [LIVE] = LIVE, [RLX] = RLX, [INV] = INV, [DEAD] = DEAD,
		[DEF] = INV, [DDEF] = DEAD, [DBAT] = DEAD,
	};
	struct odpd_mr mr;

	(void)state;
	for (enum odpd_mr_state s = 0; s < ODPD_MR_N_STATES; s++) {
		memset(&mr, 0, sizeof(mr));
		mr.state = (unsigned)s;
		assert_int_equal(odpd_mr_wire_state(&mr), wire[s]);
		assert_string_not_equal(odpd_mr_state_name(s), "?");
	}
}

/* Every transition not in the table aborts, each in a child of its own. */
static void test_illegal_caught(void **state)
{
	unsigned n = 0;

	(void)state;
#ifdef NDEBUG
	skip();
#endif
	for (enum odpd_mr_state f = 0; f < ODPD_MR_N_STATES; f++)
		for (enum odpd_mr_state t = 0; t < ODPD_MR_N_STATES; t++) {
			pid_t pid;
			int status;

			if (in_table(f, t))
				continue;
			pid = fork();
			assert_true(pid >= 0);
			if (pid == 0) {
				struct odpd_mr mr;

				memset(&mr, 0, sizeof(mr));
				mr.state = (unsigned)f;
				/* no core files, no assert message flood */
				close(STDERR_FILENO);
				mr_set_state(&mr, t);
				_exit(0);           /* not caught */
			}
			assert_int_equal(waitpid(pid, &status, 0), pid);
			if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
				fail_msg("%d -> %d was not caught (status %#x)", f, t, status);
			n++;
		}
	assert_int_equal(n, ODPD_MR_N_STATES * ODPD_MR_N_STATES - N_TABLE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_every_transition),
		cmocka_unit_test(test_lives),
		cmocka_unit_test(test_may_free),
		cmocka_unit_test(test_wire),
		cmocka_unit_test(test_illegal_caught),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
