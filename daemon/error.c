/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"

int err_set(struct odpd_err *err, int code, const char *fmt, ...)
{
	va_list ap;

	code = abs(code);
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return -code;
}
