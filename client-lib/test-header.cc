// SPDX-License-Identifier: MIT
// odpd.h must compile alone as C++, with C linkage for its functions.
#include "odpd.h"

int main()
{
	odpd_device_attr attr = odpd_device_attr();
	odpd_mr mr = odpd_mr();
	const char *(*errmsg)(void) = odpd_errmsg;
	// The struct and the function of the same name live side by side.
	struct odpd_reg_attr reg = { ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
				     IBV_ACCESS_LOCAL_WRITE, ODPD_REG_NO_CACHE };
	struct odpd_mr *(*reg_attr)(struct odpd_conn *, void *, size_t,
				    const struct odpd_reg_attr *) = odpd_reg_attr;
	int (*join)(struct odpd_conn *, const char *) = odpd_join_pd;

	(void)attr;
	(void)mr;
	(void)errmsg;
	(void)reg;
	(void)reg_attr;
	(void)join;
	return attr.import == ODPD_SUPPORT_UNKNOWN && mr.cache_hit == 0 &&
	       ODPD_VERSION_MAJOR == 1 ? 0 : 1;
}
