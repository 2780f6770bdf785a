/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * An error for the client: a positive errno value and a human message.
 * Functions on the request path take a `struct odpd_err *` and return
 * err_set(...) == -errno, so `return err_set(err, EINVAL, "...")` both fills
 * the reply and propagates the code.
 */
struct odpd_err {
	int code;
	char msg[256];
};

int err_set(struct odpd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
