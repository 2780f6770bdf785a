/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <event2/event.h>

/*
 * A small pool of worker threads for work that touches the kernel
 * (registration, deregistration, verify, teardown). The event loop queues a
 * job; a worker runs job->run; the loop then runs job->done. The loop never
 * waits for a worker.
 */
struct odpd_job {
	void (*run)(struct odpd_job *job);   /* on a worker thread */
	void (*done)(struct odpd_job *job);  /* on the event loop, after run */
	struct odpd_job *next;               /* owned by the pool while queued */
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
