/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What every part of the registry shares: the public registry.h, and a few
 * constants and clocks. Parts of the registry only; nothing outside
 * daemon/registry/ includes this.
 */

#include <time.h>

#include "registry.h"

#define PAGE 4096ull
#define ACCESS_REMOTE (ODPD__ACCESS__ACCESS_REMOTE_READ | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)

/* A time in ns (a file's ctime: unique until 2554). */
static inline uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts_ns(&ts);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
