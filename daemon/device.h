/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "odpd.pb-c.h"

/* An RDMA device as odpd probed it at start. Clients get contexts of their own. */
struct odpd_device {
	char name[64];
	struct ibv_device *ibdev;
	char transport[16];
	char fw_ver[64];
	uint64_t node_guid;           /* host byte order */
	uint32_t phys_port_cnt;
	uint64_t max_mr_size;
	uint64_t odp_general_caps;
	uint32_t odp_rc_caps, odp_uc_caps, odp_ud_caps;
	bool odp, implicit_odp;
	Odpd__Support advise_mr;
	int advise_mr_errno;
	Odpd__Support import;
	int import_errno;
};

struct odpd_devices {
	struct ibv_device **list;
	struct odpd_device *dev;
	unsigned n;
};

/* Open and probe every device, or only those in @names (@n_names > 0; a name
 * that is not found is an error). Zero devices is not an error. */
int odpd_devices_open(char *const *names, unsigned n_names, struct odpd_devices *ret);
void odpd_devices_close(struct odpd_devices *d);

/* @name NULL or "": the first device. NULL if none matches. */
struct odpd_device *odpd_devices_find(struct odpd_devices *d, const char *name);

/* Fill @out (initialized by the caller) from @dev; strings point into @dev. */
void odpd_device_to_proto(const struct odpd_device *dev, Odpd__Device *out);
