/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"

/* The queued jobs of one lane, oldest first. */
struct lane {
	unsigned long key;
	struct odpd_job *head, **tail;
	struct lane *next;                   /* in turns, or in spare */
};

struct odpd_pool {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct lane *turns, **turns_tail;    /* lanes with jobs, the next to serve first */
	struct lane *spare;                  /* empty lanes, for reuse */
	struct lane daemon_lane;             /* also where jobs go when no lane can be made */
	unsigned queued;                     /* jobs in lanes */
	struct odpd_job *finished;           /* LIFO, reversed when drained */
	bool notified;                       /* the eventfd was written since the loop drained */
	unsigned idle;                       /* workers waiting for a job */
	unsigned big_running, big_max;       /* big jobs on workers, and how many may be */
	bool stopping;
	unsigned pending;                    /* loop thread only */
	unsigned long completed;             /* loop thread only */
	int efd;
	struct event *ev;
	unsigned nthreads;
	pthread_t threads[];
};

/* The first job of @l this worker may take, unlinked: the oldest small one,
 * or the oldest big one while fewer than big_max run. Under the lock. */
static struct odpd_job *take_from(struct odpd_pool *p, struct lane *l)
{
	struct odpd_job **pp, *job;

	for (pp = &l->head; (job = *pp); pp = &job->next)
		if (!job->big || p->big_running < p->big_max)
			break;
	if (!job)
		return NULL;
	*pp = job->next;
	if (l->tail == &job->next)
		l->tail = pp;
	if (job->big)
		p->big_running++;
	p->queued--;
	return job;
}

/* The next job, round robin over the lanes: the lane served goes to the back
 * of the turns, or to the spares once empty. Under the lock. */
static struct odpd_job *take(struct odpd_pool *p)
{
	struct lane **lp, *l;
	struct odpd_job *job = NULL;

	for (lp = &p->turns; (l = *lp); lp = &l->next)
		if ((job = take_from(p, l)))
			break;
	if (!job)
		return NULL;
	*lp = l->next;                       /* out of the turns ... */
	if (p->turns_tail == &l->next)
		p->turns_tail = lp;
	if (l->head) {                       /* ... and in again at the back */
		l->next = NULL;
		*p->turns_tail = l;
		p->turns_tail = &l->next;
	} else if (l != &p->daemon_lane) {
		l->next = p->spare;
		p->spare = l;
	}
	return job;
}

/* The lane of @key with jobs queued, else a spare or new one put at the
 * back of the turns; the daemon's lane when none can be made. Under the lock. */
static struct lane *lane_get(struct odpd_pool *p, unsigned long key)
{
	struct lane *l;

	for (l = p->turns; l; l = l->next)
		if (l->key == key)
			return l;
	if (key == ODPD_LANE_DAEMON)
		l = &p->daemon_lane;
	else if ((l = p->spare))
		p->spare = l->next;
	else if (!(l = malloc(sizeof(*l))))
		return lane_get(p, ODPD_LANE_DAEMON);
	l->key = key;
	l->head = NULL;
	l->tail = &l->head;
	l->next = NULL;
	*p->turns_tail = l;
	p->turns_tail = &l->next;
	return l;
}

static void *worker_main(void *arg)
{
	struct odpd_pool *p = arg;
	struct odpd_job *job;
	bool wake_worker, notify;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!(job = take(p)) && !p->stopping) {
			p->idle++;
			pthread_cond_wait(&p->cond, &p->lock);
			p->idle--;
		}
		if (!job)
			break;
		pthread_mutex_unlock(&p->lock);

		job->run(job);

		pthread_mutex_lock(&p->lock);
		job->next = p->finished;
		p->finished = job;
		/* a big job may have been waiting for this one's place */
		wake_worker = job->big && p->big_running-- == p->big_max && p->queued && p->idle;
		/* One wake-up of the loop for all that completes before it drains. */
		notify = !p->notified;
		p->notified = true;
		if (wake_worker || notify) {
			/* Woken after the unlock: neither the loop nor a worker
			 * wakes up only to wait for this lock. */
			pthread_mutex_unlock(&p->lock);
			if (wake_worker)
				pthread_cond_signal(&p->cond);
			if (notify && write(p->efd, &(uint64_t){ 1 }, sizeof(uint64_t)) < 0)
				log_error("pool: eventfd write failed");
			pthread_mutex_lock(&p->lock);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void run_finished(struct odpd_pool *p)
{
	pthread_mutex_lock(&p->lock);
	struct odpd_job *list = p->finished, *rev = NULL;
	p->finished = NULL;
	p->notified = false;
	pthread_mutex_unlock(&p->lock);

	while (list) {                       /* oldest first */
		struct odpd_job *n = list->next;
		list->next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct odpd_job *n = rev->next;
		p->pending--;
		p->completed++;
		rev->done(rev);                /* may free rev or submit more */
		rev = n;
	}
}

static void on_eventfd(evutil_socket_t fd, short what, void *arg)
{
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_error("pool: eventfd read failed");
	run_finished(arg);
}

int odpd_pool_new(struct event_base *base, unsigned nthreads, struct odpd_pool **ret)
{
	struct odpd_pool *p = calloc(1, sizeof(*p) + nthreads * sizeof(pthread_t));
	int r;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->turns_tail = &p->turns;
	/* Big jobs leave a worker to the others (one of one, else all but one). */
	p->big_max = nthreads > 1 ? nthreads - 1 : 1;
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->efd < 0) {
		r = -errno;
		free(p);
		return r;
	}
	p->ev = event_new(base, p->efd, EV_READ | EV_PERSIST, on_eventfd, p);
	if (!p->ev || event_add(p->ev, NULL) < 0) {
		odpd_pool_free(p);
		return -ENOMEM;
	}
	for (; p->nthreads < nthreads; p->nthreads++) {
		r = pthread_create(&p->threads[p->nthreads], NULL, worker_main, p);
		if (r) {
			odpd_pool_free(p);
			return -r;
		}
	}
	*ret = p;
	return 0;
}

void odpd_pool_submit(struct odpd_pool *p, struct odpd_job *job)
{
	struct lane *l;
	bool wake;

	job->next = NULL;
	p->pending++;
	pthread_mutex_lock(&p->lock);
	l = lane_get(p, job->lane);
	*l->tail = job;
	l->tail = &job->next;
	p->queued++;
	/* Only an idle worker needs waking: a busy one takes the job when it
	 * is done with its own. Signalled after the unlock, so that the woken
	 * worker does not block on the lock at once. */
	wake = p->idle > 0;
	pthread_mutex_unlock(&p->lock);
	if (wake)
		pthread_cond_signal(&p->cond);
}

unsigned odpd_pool_pending(const struct odpd_pool *p)
{
	return p->pending;
}

unsigned long odpd_pool_completed(const struct odpd_pool *p)
{
	return p->completed;
}

void odpd_pool_free(struct odpd_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopping = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	run_finished(p);
	while (p->spare) {
		struct lane *l = p->spare;

		p->spare = l->next;
		free(l);
	}
	if (p->ev)
		event_free(p->ev);
	close(p->efd);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
