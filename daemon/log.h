/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <syslog.h>

/*
 * Logging to stderr. When stderr is connected to journald (JOURNAL_STREAM is
 * set and names our stderr), each line carries a "<N>" priority prefix that
 * journald turns into PRIORITY=; otherwise lines are "odpd[pid]: level: text".
 */
void log_setup(int max_priority);
int log_parse_level(const char *name);
void log_msg(int priority, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log "text: strerror(err)" and return -abs(err), for `return log_errno(...)`. */
int log_errno(int priority, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * One cause, few lines: at most 10 lines per 5 s from one call site (a
 * static struct log_ratelimit there); the next line after a pause says how
 * many were left out.
 */
struct log_ratelimit {
	long long start_ns;
	unsigned n, suppressed;
};
bool log_ratelimit_ok(struct log_ratelimit *rl, unsigned *ret_suppressed);
#define log_ratelimited(priority, ...) do {                                      \
		static struct log_ratelimit rl_;                                 \
		unsigned sup_;                                                   \
		if (log_ratelimit_ok(&rl_, &sup_)) {                             \
			if (sup_)                                                \
				log_msg(priority, "(%u similar lines left out)", sup_); \
			log_msg(priority, __VA_ARGS__);                          \
		}                                                                \
	} while (0)

/* A size for a log line, in IEC units: "512 bytes", "64 GiB", "983 MiB"
 * (whole units from 10 up, one decimal below), "unlimited" for UINT64_MAX. */
#define LOG_BYTES_LEN 32
const char *log_bytes(unsigned long long v, char buf[static LOG_BYTES_LEN]);

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERR, __VA_ARGS__)
