/* SPDX-License-Identifier: MIT */
/* odpd.h must compile alone, with nothing included before it. */
#include "odpd.h"

#if ODPD_VERSION_MAJOR != 1 || ODPD_VERSION_MINOR < 1
#error "ODPD_VERSION_MAJOR/_MINOR must be usable in #if"
#endif

int main(void)
{
	struct odpd_device_attr attr = { .import = ODPD_SUPPORT_UNKNOWN };
	struct odpd_mr mr = { .lkey = 0, .generation = 0, .cache_hit = 0 };
	struct odpd_reg_attr reg = {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = IBV_ACCESS_LOCAL_WRITE,
		.flags = ODPD_REG_NO_CACHE | ODPD_REG_NO_POPULATE,
	};

	(void)attr;
	(void)mr;
	(void)reg;
	return 0;
}
