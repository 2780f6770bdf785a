/* SPDX-License-Identifier: MIT */
/*
 * How many threads a large fault-in may use (segment.c, populate_threads):
 * never more than the CPUs of the calling thread's affinity mask (an MPI
 * rank pinned to one core splits nothing), at most 8, asked at each call
 * (a mask set after the first call counts), and ODPD_POPULATE_THREADS=N
 * sets N.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "libodpd-private.h"

#define CHECK(expr) do { \
	if (!(expr)) { \
		fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #expr); \
		exit(1); \
	} \
} while (0)

/* Pin the calling thread to the first @n CPUs of @all; false if it has fewer. */
static int pin(const cpu_set_t *all, unsigned n)
{
	cpu_set_t set;
	unsigned k = 0;

	CPU_ZERO(&set);
	for (int cpu = 0; cpu < CPU_SETSIZE && k < n; cpu++)
		if (CPU_ISSET(cpu, all)) {
			CPU_SET(cpu, &set);
			k++;
		}
	if (k < n)
		return 0;
	CHECK(sched_setaffinity(0, sizeof(set), &set) == 0);
	return 1;
}

/* Another thread's mask does not count: this one's does. */
static void *other_thread(void *arg)
{
	(void)arg;
	return (void *)(uintptr_t)populate_threads();
}

int main(void)
{
	cpu_set_t all;
	unsigned ncpu;
	void *res;
	pthread_t t;

	unsetenv("ODPD_POPULATE_THREADS");
	CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
	ncpu = (unsigned)CPU_COUNT(&all);
	CHECK(populate_threads() == (ncpu < 8 ? ncpu : 8));
	/* pinned to one CPU after the first call: no helper thread */
	CHECK(pin(&all, 1));
	CHECK(populate_threads() == 1);
	/* a thread made now inherits the mask; one with a wider mask may use it */
	CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
	CHECK(pthread_join(t, &res) == 0);
	CHECK((uintptr_t)res == 1);
	if (pin(&all, 2))
		CHECK(populate_threads() == 2);
	else
		printf("one CPU only: the two-CPU case is not checked\n");
	/* the environment sets it, whatever the mask */
	pin(&all, 1);
	setenv("ODPD_POPULATE_THREADS", "4", 1);
	CHECK(populate_threads() == 4);
	setenv("ODPD_POPULATE_THREADS", "1", 1);
	CHECK(populate_threads() == 1);
	/* back to the whole mask: up to 8 again */
	unsetenv("ODPD_POPULATE_THREADS");
	CHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
	CHECK(populate_threads() == (ncpu < 8 ? ncpu : 8));
	printf("ok: %u CPUs\n", ncpu);
	return 0;
}
