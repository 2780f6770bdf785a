/* SPDX-License-Identifier: MIT */
/* The request path, stage by stage (stages.h): -Drequest_stages=true only. */
#include "stages.h"

#ifdef ODPD_REQUEST_STAGES
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "odpd-wire.h"

#define KINDS 64                       /* body cases are field numbers, all below this */

static const char *const stage_names[ODPD_STAGE_N] = {
	"start", "recv", "decode", "work", "check", "verb", "answer", "send", "after", "later",
};

static struct {
	double us[ODPD_STAGE_N];
	unsigned long requests;
} kinds[KINDS];

/* the request being read, on the loop's thread (the one that reads
 * packets: a worker's registration is not on the path, and not counted) */
static _Thread_local bool on_loop;
static double last, cur[ODPD_STAGE_N];
static unsigned cur_kind;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void odpd_stage(enum odpd_stage s)
{
	double t;

	if (s == ODPD_STAGE_START) {           /* client_read_one, on the loop */
		on_loop = true;
		memset(cur, 0, sizeof(cur));
		cur_kind = 0;
		last = now_us();
		return;
	}
	if (!on_loop)
		return;
	t = now_us();
	cur[s] += t - last;
	last = t;
	if (s == ODPD_STAGE_LATER) {
		for (int i = 0; i < ODPD_STAGE_N; i++)
			kinds[cur_kind].us[i] += cur[i];
		kinds[cur_kind].requests++;
		memset(cur, 0, sizeof(cur));
	}
}

void odpd_stage_kind(unsigned body_case)
{
	cur_kind = body_case < KINDS ? body_case : 0;
}

void odpd_stage_dump(void)
{
	const char *path = getenv("ODPD_STAGES_OUT");
	char tmp[4096];
	FILE *f = NULL;

	/* written aside and renamed: a reader never sees half of it */
	if (path && snprintf(tmp, sizeof(tmp), "%s.tmp", path) < (int)sizeof(tmp))
		f = fopen(tmp, "we");
	if (f) {
		for (unsigned k = 0; k < KINDS; k++)
			for (int s = ODPD_STAGE_RECV; s < ODPD_STAGE_N && kinds[k].requests; s++)
				fprintf(f, "%s %s %lu %.1f\n",
					k ? odpd_request_name((Odpd__Request__BodyCase)k) : "other",
					stage_names[s], kinds[k].requests, kinds[k].us[s]);
		if (fclose(f) == 0)
			rename(tmp, path);
	}
	memset(kinds, 0, sizeof(kinds));
}
#endif
