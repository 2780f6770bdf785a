/* SPDX-License-Identifier: MIT */
/* odpd.h must compile alone, with nothing included before it. */
#include "odpd.h"

int main(void)
{
	struct odpd_device_attr attr = { .import = ODPD_SUPPORT_UNKNOWN };
	struct odpd_mr mr = { .lkey = 0 };

	(void)attr;
	(void)mr;
	return 0;
}
