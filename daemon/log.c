/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_max = LOG_INFO;
static bool log_journal;

static const char *const level_names[] = {
	[LOG_EMERG] = "emerg", [LOG_ALERT] = "alert", [LOG_CRIT] = "crit",
	[LOG_ERR] = "err", [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
	[LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

/* JOURNAL_STREAM is "DEV:INO" of the stream journald gave us; it only counts
 * if stderr is still that stream (not redirected by a wrapper). */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return st.st_dev == dev && st.st_ino == ino;
}

void log_setup(int max_priority)
{
	log_max = max_priority;
	log_journal = stderr_is_journal();
}

int log_parse_level(const char *name)
{
	for (int i = 0; i <= LOG_DEBUG; i++)
		if (strcasecmp(name, level_names[i]) == 0)
			return i;
	return -EINVAL;
}

__attribute__((format(printf, 3, 0)))
static void log_va(int priority, const char *suffix, const char *fmt, va_list ap)
{
	char text[1024];

	if (priority > log_max)
		return;
	vsnprintf(text, sizeof(text), fmt, ap);
	if (log_journal)
		fprintf(stderr, "<%d>%s%s\n", priority, text, suffix);
	else
		fprintf(stderr, "odpd[%d]: %s: %s%s\n", (int)getpid(), level_names[priority], text, suffix);
}

void log_msg(int priority, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_va(priority, "", fmt, ap);
	va_end(ap);
}

int log_errno(int priority, int err, const char *fmt, ...)
{
	char suffix[128];
	va_list ap;

	err = abs(err);
	snprintf(suffix, sizeof(suffix), ": %s", strerror(err));
	va_start(ap, fmt);
	log_va(priority, suffix, fmt, ap);
	va_end(ap);
	return -err;
}

bool log_ratelimit_ok(struct log_ratelimit *rl, unsigned *ret_suppressed)
{
	const long long interval = 5000000000LL;
	struct timespec ts;
	long long now;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
	*ret_suppressed = 0;
	if (rl->n == 0 || now - rl->start_ns >= interval) {
		*ret_suppressed = rl->suppressed;
		rl->start_ns = now;
		rl->n = 0;
		rl->suppressed = 0;
	}
	if (rl->n >= 10) {
		rl->suppressed++;
		return false;
	}
	rl->n++;
	return true;
}

const char *log_bytes(unsigned long long v, char buf[static LOG_BYTES_LEN])
{
	static const char units[] = "KMGTPE";
	double d = (double)v;
	unsigned i = 0;

	if (v == ~0ull)
		return strcpy(buf, "unlimited");
	if (v < 1024) {
		snprintf(buf, LOG_BYTES_LEN, "%llu byte%s", v, v == 1 ? "" : "s");
		return buf;
	}
	while (i < 6 && d >= 1023.95) {
		d /= 1024;
		i++;
	}
	if (v % (1ull << (10 * i)) == 0)
		snprintf(buf, LOG_BYTES_LEN, "%llu %ciB", v >> (10 * i), units[i - 1]);
	else if (d < 9.95)
		snprintf(buf, LOG_BYTES_LEN, "%.1f %ciB", d, units[i - 1]);
	else
		snprintf(buf, LOG_BYTES_LEN, "%.0f %ciB", d, units[i - 1]);
	return buf;
}
