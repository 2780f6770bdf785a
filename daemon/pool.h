/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <event2/event.h>

/*
 * A small pool of worker threads for work that touches the kernel
 * (registration, deregistration, verify, teardown). The event loop queues a
 * job; a worker runs job->run; the loop then runs job->done. The loop never
 * waits for a worker.
 *
 * Jobs queue in lanes, one per user (job->lane): a lane's jobs start in the
 * order they came, and the lanes with work take turns, so a user with many
 * connections (each has at most one job at a time) queues no more than one
 * job ahead of another user's next one.
 */
#define ODPD_LANE_DAEMON 0ul                 /* the daemon's own work */
#define ODPD_LANE_USER(uid) ((unsigned long)(uid) + 1)

struct odpd_job {
	void (*run)(struct odpd_job *job);   /* on a worker thread */
	void (*done)(struct odpd_job *job);  /* on the event loop, after run */
	struct odpd_job *next;               /* owned by the pool while queued */
	unsigned long lane;                  /* ODPD_LANE_USER(uid) or ODPD_LANE_DAEMON */
	bool big;                            /* long (a large registration): at most all
					      * workers but one run big jobs at a time */
};

struct odpd_pool;

int odpd_pool_new(struct event_base *base, unsigned nthreads, struct odpd_pool **ret);
void odpd_pool_submit(struct odpd_pool *pool, struct odpd_job *job);
/* Jobs queued or running right now. */
unsigned odpd_pool_pending(const struct odpd_pool *pool);
/* Jobs completed since start: the watchdog's proof of progress. */
unsigned long odpd_pool_completed(const struct odpd_pool *pool);
/* Stop the threads after the queue drains, running every remaining done. */
void odpd_pool_free(struct odpd_pool *pool);
