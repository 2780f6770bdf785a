/* SPDX-License-Identifier: MIT */
/*
 * The request path, stage by stage: where a request's time goes in odpd, as
 * wall-clock microseconds summed per request kind and stage (issue 26:
 * "find out where it goes"). Built only with meson -Drequest_stages=true,
 * for bench/run-stages; a release has none of it (the calls below are then
 * empty inlines).
 *
 * Each call ends the stage it names: the time since the previous call, on
 * the event loop's thread, is charged to that stage of the request being
 * read. A stage a request does not pass through is charged to the next one
 * it does (a refusal has no verb: all its work is ODPD_STAGE_ANSWER), and a
 * stage passed twice adds up (a miss's residency check is made where
 * REG_UNPOPULATED asks for it, else just before the verb).
 * A request handed to a worker (a big or non-resident registration) is
 * counted, but its verb and answer happen outside it and are not charged;
 * an event sent to another connection while a request runs is charged to
 * that request's answer and send. The benchmarks' 4 KiB misses run on the
 * loop, so neither applies to them.
 *
 * On SIGUSR2 the sums since the last SIGUSR2 are written to $ODPD_STAGES_OUT
 * ("KIND STAGE REQUESTS MICROSECONDS" lines), and counting starts again.
 */
#ifndef ODPD_STAGES_H
#define ODPD_STAGES_H

#include "config.h"

enum odpd_stage {
	ODPD_STAGE_START,      /* a packet is about to be read (nothing charged) */
	ODPD_STAGE_RECV,       /* its recvmsg */
	ODPD_STAGE_DECODE,     /* decoding it, and taking the connection's release ring */
	ODPD_STAGE_WORK,       /* the request's work outside the stages around it */
	ODPD_STAGE_CHECK,      /* a registration's checks of the segment: the cache lookup with a
				* hit's hole check (an fstat), a miss's residency check (a
				* PAGEMAP_SCAN of the witness view) */
	ODPD_STAGE_VERB,       /* ibv_reg_mr, on the loop */
	ODPD_STAGE_ANSWER,     /* the rest, up to the answer's sendmsg (encoding it too) */
	ODPD_STAGE_SEND,       /* the answer's sendmsg */
	ODPD_STAGE_AFTER,      /* after the answer, up to the ring's deregistrations */
	ODPD_STAGE_LATER,      /* those deregistrations (the request is then counted) */
	ODPD_STAGE_N
};

#ifdef ODPD_REQUEST_STAGES
void odpd_stage(enum odpd_stage s);
void odpd_stage_kind(unsigned body_case);
void odpd_stage_dump(void);
#else
static inline void odpd_stage(enum odpd_stage s)
{
	(void)s;
}

static inline void odpd_stage_kind(unsigned body_case)
{
	(void)body_case;
}

static inline void odpd_stage_dump(void)
{
}
#endif

#endif
