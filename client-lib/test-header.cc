// SPDX-License-Identifier: MIT
// odpd.h must compile alone as C++, with C linkage for its functions.
#include "odpd.h"

int main()
{
	odpd_device_attr attr = odpd_device_attr();
	odpd_mr mr = odpd_mr();
	const char *(*errmsg)(void) = odpd_errmsg;

	(void)attr;
	(void)mr;
	(void)errmsg;
	return attr.import == ODPD_SUPPORT_UNKNOWN ? 0 : 1;
}
