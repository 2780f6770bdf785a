/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * odpd <-> odpd-registrar: the implicit-ODP registrar of one PD.
 *
 * An implicit ODP MR (ibv_reg_mr(pd, NULL, SIZE_MAX, ...|ON_DEMAND)) lets
 * the device reach the whole address space of the process that registers
 * it. odpd holds every client's segments, so it never makes one itself
 * (doc/design.md §8.2): it posix_spawns odpd-registrar, a process of its
 * own binary that holds nothing but one client's segments, mapped at the
 * client's addresses, and lets it import the PD and register there.
 *
 * Two SOCK_SEQPACKET sockets, both made by odpd with socketpair():
 *   fd 3, "maps":  REG_MAP / REG_UNMAP, sent by odpd's event loop in order,
 *                  answered in order (one reply per request);
 *   fd 4, "verbs": REG_INIT / REG_REG / REG_DEREG, sent by odpd's workers,
 *                  one request at a time (a mutex in odpd).
 * Every request is one struct odpd_reg_msg, with at most one fd
 * (SCM_RIGHTS: REG_MAP the segment's memfd, REG_INIT the PD's context
 * cmd_fd); every reply one struct odpd_reg_reply. The registrar exits when
 * either socket reaches EOF, when odpd dies (PR_SET_PDEATHSIG), or on a
 * malformed message (odpd and the registrar are one build: a mismatch is a
 * bug, never a client's doing).
 *
 * Both ends are built from one tree, so the layout is fixed by this header
 * and checked by ODPD_REG_MAGIC in every message.
 */

#include <stdint.h>

#define ODPD_REG_MAGIC 0x6f647231u          /* "odr1" */
#define ODPD_REG_MAPS_FD 3
#define ODPD_REG_VERBS_FD 4
#define ODPD_REG_MAX_MAPS 4096u             /* segments mapped at once */
#define ODPD_REG_MAX_MRS 64u                /* implicit MRs at once */

enum odpd_reg_op {
	ODPD_REG_MAP = 1,       /* fd: map it at addr (MAP_SHARED|MAP_FIXED_NOREPLACE) */
	ODPD_REG_UNMAP = 2,     /* id: unmap what REG_MAP mapped under that id */
	ODPD_REG_INIT = 3,      /* fd: ibv_import_device(fd); ibv_import_pd(pd_handle) */
	ODPD_REG_REG = 4,       /* ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND) */
	ODPD_REG_DEREG = 5,     /* ibv_dereg_mr of the MR with kernel handle mr_handle */
};

struct odpd_reg_msg {
	uint32_t magic;
	uint32_t op;            /* enum odpd_reg_op */
	uint64_t id;            /* MAP/UNMAP: odpd's name for the mapping */
	uint64_t addr;          /* MAP: the client's address of file offset @offset */
	uint64_t length;        /* MAP: bytes, page multiple */
	uint64_t offset;        /* MAP: file offset, page multiple */
	uint32_t writable;      /* MAP: PROT_WRITE too */
	uint32_t pd_handle;     /* INIT */
	uint32_t access;        /* REG: enum ibv_access_flags (ON_DEMAND added) */
	uint32_t mr_handle;     /* DEREG */
};

struct odpd_reg_reply {
	uint32_t magic;
	int32_t error;          /* 0, or a positive errno */
	uint32_t mr_handle;     /* REG: the kernel handle, for ibv_import_mr */
	uint32_t lkey, rkey;    /* REG */
	uint32_t pad;
	char message[232];      /* NUL-terminated; why, when error != 0 */
};
