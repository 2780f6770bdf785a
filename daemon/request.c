/* SPDX-License-Identifier: MIT */
/* request.c - the dispatcher: a decoded request to its handler (handler.h). */
#include <errno.h>
#include <unistd.h>

#include "request.h"

int odpd_request_dispatch(const struct odpd_caller *k, const Odpd__Request *req, int fd, struct odpd_out *o)
{
	switch (req->body_case) {
	case ODPD__REQUEST__BODY_ATTACH_SEGMENT:
		return odpd_attach_segment(k, req->attach_segment, fd, o);
	case ODPD__REQUEST__BODY_DETACH_SEGMENT:
		return odpd_detach_segment(k, req->detach_segment, o);
	case ODPD__REQUEST__BODY_MAP_SEGMENT:
		return odpd_map_segment(k, req->map_segment, o);
	case ODPD__REQUEST__BODY_REG_MR:
		return odpd_reg_mr(k, req->reg_mr, fd, o);
	case ODPD__REQUEST__BODY_DEREG_MR:
		return odpd_dereg_mr(k, req->dereg_mr, o);
	case ODPD__REQUEST__BODY_VERIFY:
		return odpd_verify(k, req->verify, o);
	case ODPD__REQUEST__BODY_STATUS:
		return odpd_admin_status(k, o);
	case ODPD__REQUEST__BODY_LIST_MRS:
		return odpd_admin_list_mrs(k, req->list_mrs, o);
	case ODPD__REQUEST__BODY_RELOAD:
		return odpd_admin_reload(k, o);
	case ODPD__REQUEST__BODY_JOIN_PD:
		return odpd_join_pd(k, req->join_pd, o);
	case ODPD__REQUEST__BODY_FLUSH:
		return odpd_flush(k, req->flush, o);
	case ODPD__REQUEST__BODY_IMPORT_PD:
		return odpd_import_pd(k, req->import_pd, o);
	case ODPD__REQUEST__BODY_ADVISE_MR:
		return odpd_advise_mr(k, req->advise_mr, o);
	case ODPD__REQUEST__BODY_ADMIN_VERIFY:
		return odpd_admin_verify(k, req->admin_verify, o);
	case ODPD__REQUEST__BODY_OPEN_HIT_TABLE:
		return odpd_open_hit_table(k, req->open_hit_table, fd, o);
	default:
		if (fd >= 0)
			close(fd);
		odpd_out_error(o, k, EOPNOTSUPP, "unknown request type (a newer client?)");
		return ODPD_DONE;
	}
}
