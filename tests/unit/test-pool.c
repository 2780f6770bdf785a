/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/pool.c: the worker pool and its completions on the loop. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <event2/event.h>

#include "pool.h"

#define N_JOBS 32

struct tjob {
	struct odpd_job job;            /* first: the pool hands us this pointer */
	int index;
	unsigned sleep_us;              /* in run */
	pthread_t run_thread, done_thread;
	int runs, dones;
	int done_seq;                   /* position among all done calls */
	struct fixture *f;
};

struct fixture {
	struct event_base *base;
	struct event *tick;
	struct odpd_pool *pool;
	pthread_t loop_thread;
	int ndone;
	int done_order[N_JOBS * 2];
	struct tjob jobs[N_JOBS * 2];
	/* for the concurrency test */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int arrived;
	bool met;
};

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct timeval tv = { 0, 20 * 1000 };

	if (!f)
		return -1;
	f->base = event_base_new();
	if (!f->base)
		return -1;
	/* a heartbeat, so that EVLOOP_ONCE always returns within 20 ms */
	f->tick = event_new(f->base, -1, EV_PERSIST, on_tick, NULL);
	if (!f->tick || event_add(f->tick, &tv) < 0)
		return -1;
	f->loop_thread = pthread_self();
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	odpd_pool_free(f->pool);    /* no-op if the test freed it */
	event_free(f->tick);
	event_base_free(f->base);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
	return 0;
}

static void job_run(struct odpd_job *job)
{
	struct tjob *j = (struct tjob *)job;

	j->run_thread = pthread_self();
	j->runs++;
	if (j->sleep_us)
		usleep(j->sleep_us);
}

static void job_done(struct odpd_job *job)
{
	struct tjob *j = (struct tjob *)job;
	struct fixture *f = j->f;

	assert_int_equal(j->runs, 1);          /* done only after run */
	j->done_thread = pthread_self();
	j->dones++;
	j->done_seq = f->ndone;
	f->done_order[f->ndone++] = j->index;
}

static void init_job(struct fixture *f, int i, unsigned sleep_us)
{
	struct tjob *j = &f->jobs[i];

	memset(j, 0, sizeof(*j));
	j->job.run = job_run;
	j->job.done = job_done;
	j->index = i;
	j->sleep_us = sleep_us;
	j->f = f;
}

/* Turn the loop until @n done callbacks ran; at most ~10 s. */
static void loop_until(struct fixture *f, int n)
{
	for (int i = 0; f->ndone < n && i < 500; i++)
		assert_true(event_base_loop(f->base, EVLOOP_ONCE) >= 0);
	assert_int_equal(f->ndone, n);
}

static void check_threads(struct fixture *f, int n)
{
	for (int i = 0; i < n; i++) {
		struct tjob *j = &f->jobs[i];

		assert_int_equal(j->runs, 1);
		assert_int_equal(j->dones, 1);
		assert_false(pthread_equal(j->run_thread, f->loop_thread));
		assert_true(pthread_equal(j->done_thread, f->loop_thread));
	}
}

static void test_single_worker_fifo(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 1, &f->pool), 0);
	assert_int_equal(odpd_pool_pending(f->pool), 0);
	for (int i = 0; i < N_JOBS; i++) {
		init_job(f, i, i % 3 ? 0 : 500);
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	assert_int_equal(odpd_pool_pending(f->pool), N_JOBS);
	/* nothing completes behind the loop's back */
	assert_int_equal(f->ndone, 0);

	loop_until(f, N_JOBS);
	check_threads(f, N_JOBS);
	for (int i = 0; i < N_JOBS; i++)
		assert_int_equal(f->done_order[i], i);
	/* one worker: every run on the same thread */
	for (int i = 1; i < N_JOBS; i++)
		assert_true(pthread_equal(f->jobs[i].run_thread, f->jobs[0].run_thread));
	assert_int_equal(odpd_pool_pending(f->pool), 0);
	assert_int_equal(odpd_pool_completed(f->pool), N_JOBS);
}

static void test_many_workers(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 4, &f->pool), 0);
	for (int i = 0; i < N_JOBS; i++) {
		init_job(f, i, 200 * (unsigned)(i % 5));
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	assert_int_equal(odpd_pool_pending(f->pool), N_JOBS);
	loop_until(f, N_JOBS);
	check_threads(f, N_JOBS);
	/* every job done exactly once */
	bool seen[N_JOBS] = { 0 };
	for (int i = 0; i < N_JOBS; i++) {
		assert_false(seen[f->done_order[i]]);
		seen[f->done_order[i]] = true;
	}
	assert_int_equal(odpd_pool_pending(f->pool), 0);
	assert_int_equal(odpd_pool_completed(f->pool), N_JOBS);

	/* and again: the pool keeps working after it was idle */
	for (int i = N_JOBS; i < 2 * N_JOBS; i++) {
		init_job(f, i, 0);
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	loop_until(f, 2 * N_JOBS);
	check_threads(f, 2 * N_JOBS);
	assert_int_equal(odpd_pool_pending(f->pool), 0);
	assert_int_equal(odpd_pool_completed(f->pool), 2 * N_JOBS);
}

/* Two jobs that can only finish together: proves two workers run at once. */
static void meet_run(struct odpd_job *job)
{
	struct tjob *j = (struct tjob *)job;
	struct fixture *f = j->f;
	struct timespec until;

	j->run_thread = pthread_self();
	j->runs++;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	pthread_mutex_lock(&f->lock);
	f->arrived++;
	pthread_cond_broadcast(&f->cond);
	while (f->arrived < 2)
		if (pthread_cond_timedwait(&f->cond, &f->lock, &until) == ETIMEDOUT)
			break;
	if (f->arrived >= 2)
		f->met = true;
	pthread_mutex_unlock(&f->lock);
}

static void test_workers_run_in_parallel(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 2, &f->pool), 0);
	for (int i = 0; i < 2; i++) {
		init_job(f, i, 0);
		f->jobs[i].job.run = meet_run;
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	loop_until(f, 2);
	check_threads(f, 2);
	assert_true(f->met);
	assert_false(pthread_equal(f->jobs[0].run_thread, f->jobs[1].run_thread));
}

/* A done callback may submit the next job. */
static void chain_done(struct odpd_job *job)
{
	struct tjob *j = (struct tjob *)job;
	struct fixture *f = j->f;

	job_done(job);
	if (j->index + 1 < N_JOBS) {
		init_job(f, j->index + 1, 0);
		f->jobs[j->index + 1].job.done = chain_done;
		odpd_pool_submit(f->pool, &f->jobs[j->index + 1].job);
	}
}

static void test_done_submits(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 2, &f->pool), 0);
	init_job(f, 0, 0);
	f->jobs[0].job.done = chain_done;
	odpd_pool_submit(f->pool, &f->jobs[0].job);
	loop_until(f, N_JOBS);
	check_threads(f, N_JOBS);
	for (int i = 0; i < N_JOBS; i++)
		assert_int_equal(f->done_order[i], i);
	assert_int_equal(odpd_pool_pending(f->pool), 0);
	assert_int_equal(odpd_pool_completed(f->pool), N_JOBS);
}

/* Freeing the pool with jobs still queued runs them and their done callbacks. */
static void test_free_drains(void **state)
{
	struct fixture *f = *state;
	const int n = 8;

	assert_int_equal(odpd_pool_new(f->base, 1, &f->pool), 0);
	for (int i = 0; i < n; i++) {
		init_job(f, i, i == 0 ? 50 * 1000 : 1000);
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	/* the first job is still running: the others are queued */
	assert_int_equal(odpd_pool_pending(f->pool), n);
	assert_int_equal(f->ndone, 0);
	odpd_pool_free(f->pool);
	f->pool = NULL;
	assert_int_equal(f->ndone, n);
	check_threads(f, n);
	for (int i = 0; i < n; i++)
		assert_int_equal(f->done_order[i], i);
}

/* Freeing an idle pool, and one whose completions the loop never saw. */
static void test_free_idle(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 3, &f->pool), 0);
	odpd_pool_free(f->pool);
	assert_int_equal(odpd_pool_new(f->base, 3, &f->pool), 0);
	init_job(f, 0, 0);
	odpd_pool_submit(f->pool, &f->jobs[0].job);
	usleep(20 * 1000);                       /* run, but done not yet called */
	assert_int_equal(f->ndone, 0);
	odpd_pool_free(f->pool);
	f->pool = NULL;
	assert_int_equal(f->ndone, 1);
	check_threads(f, 1);
}

/* Let every gate_run job go on. */
static void open_gate(struct fixture *f)
{
	pthread_mutex_lock(&f->lock);
	f->met = true;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

/* A big job that runs until the test opens the gate (f->met). */
static void gate_run(struct odpd_job *job)
{
	struct tjob *j = (struct tjob *)job;
	struct fixture *f = j->f;

	j->run_thread = pthread_self();
	j->runs++;
	pthread_mutex_lock(&f->lock);
	while (!f->met)
		pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
}

/* Two workers, two big jobs that block, then a small one: the small one
 * runs meanwhile (big jobs leave a worker to the others), the second big
 * one waits for the first. */
static void test_big_jobs_leave_a_worker(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(odpd_pool_new(f->base, 2, &f->pool), 0);
	for (int i = 0; i < 3; i++) {
		init_job(f, i, 0);
		if (i < 2) {
			f->jobs[i].job.run = gate_run;
			f->jobs[i].job.big = true;
		}
		odpd_pool_submit(f->pool, &f->jobs[i].job);
	}
	loop_until(f, 1);
	assert_int_equal(f->done_order[0], 2);
	usleep(100 * 1000);
	assert_int_equal(f->jobs[1].runs, 0);          /* not while the first big one runs */
	open_gate(f);
	loop_until(f, 3);
	assert_int_equal(f->done_order[1], 0);
	assert_int_equal(f->done_order[2], 1);
}

/*
 * One worker, busy (a gate job) while user 1 queues five jobs, user 2 one
 * and then user 1 one more: user 2's job runs second, not sixth (lanes take
 * turns); each user's jobs run in the order they came.
 */
static void test_lanes_take_turns(void **state)
{
	struct fixture *f = *state;
	const unsigned long lane_of[8] = { ODPD_LANE_DAEMON, ODPD_LANE_USER(1), ODPD_LANE_USER(1),
					   ODPD_LANE_USER(1), ODPD_LANE_USER(1), ODPD_LANE_USER(1),
					   ODPD_LANE_USER(2), ODPD_LANE_USER(1) };
	const int want[8] = { 0, 1, 6, 2, 3, 4, 5, 7 };

	assert_int_equal(odpd_pool_new(f->base, 1, &f->pool), 0);
	/* the second round: with the lanes of the first, reused once empty */
	for (int round = 0; round < 2; round++) {
		f->ndone = 0;
		f->met = false;
		for (int i = 0; i < 8; i++) {
			init_job(f, i, 0);
			f->jobs[i].job.lane = lane_of[i];
			if (i == 0)
				f->jobs[i].job.run = gate_run;
			odpd_pool_submit(f->pool, &f->jobs[i].job);
		}
		usleep(20 * 1000);               /* the worker waits at the gate */
		open_gate(f);
		loop_until(f, 8);
		check_threads(f, 8);
		for (int i = 0; i < 8; i++)
			assert_int_equal(f->done_order[i], want[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_single_worker_fifo, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_workers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_workers_run_in_parallel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_done_submits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_drains, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_idle, setup, teardown),
		cmocka_unit_test_setup_teardown(test_big_jobs_leave_a_worker, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lanes_take_turns, setup, teardown),
	};

	return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
