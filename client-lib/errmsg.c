/* SPDX-License-Identifier: MIT */
/* errmsg.c - the thread-local text behind odpd_errmsg(). */
#include <stdarg.h>
#include <stdio.h>

#include "libodpd-private.h"

/* Long enough for a daemon's message behind our prefix. */
static _Thread_local char errmsg_buf[512];

_public_ const char *odpd_errmsg(void)
{
	return errmsg_buf;
}

_Thread_local bool errmsg_dirty __attribute__((tls_model("initial-exec")));

void errmsg_reset(void)
{
	errmsg_buf[0] = '\0';
	errmsg_dirty = false;
}

int errmsg_set(int r, const char *fmt, ...)
{
	va_list ap;

	errno = -r;             /* for %m */
	va_start(ap, fmt);
	vsnprintf(errmsg_buf, sizeof(errmsg_buf), fmt, ap);
	va_end(ap);
	errmsg_dirty = true;
	return r;
}
