// SPDX-License-Identifier: Apache-2.0
/*
 * The OS layer osdep.h declares, for the control path: register access, the CQP backlog list head,
 * printing. The rest of osdep.h (and the utils.c/cm.c/puda.c functions ctrl.c and uk.c reference) belongs
 * to QPs, HMC, statistics and the iWARP connection manager, which the control path never calls: those are
 * traps that fail the test with the function's name (see README "The shim's contract").
 */
#include "osdep.h"
#include "type.h"
#include "protos.h"
#include "ws.h"

__thread char shim_thread_token;

void wr32(struct irdma_hw *hw, u32 reg, u32 val)
{
	writel(val, hw->hw_addr + reg);
}

u32 rd32(struct irdma_hw *hw, u32 reg)
{
	return readl(hw->hw_addr + reg);
}

u64 rd64(struct irdma_hw *hw, u32 reg)
{
	return readq(hw->hw_addr + reg);
}

/* As utils.c: pops the oldest backlogged command. */
void *irdma_remove_cqp_head(struct irdma_sc_dev *dev)
{
	struct list_head *entry;
	struct list_head *list = &dev->cqp_cmd_head;

	if (list_empty(list))
		return NULL;
	entry = list->next;
	list_del(entry);
	return entry;
}

#define SHIM_TRAP(name) shim_bug("outside the control path: " name, __FILE__, __LINE__)

int irdma_cqp_sds_cmd(struct irdma_sc_dev *dev, struct irdma_update_sds_info *info)
{
	SHIM_TRAP("irdma_cqp_sds_cmd");
	return -EOPNOTSUPP;
}

int irdma_cqp_qp_suspend_resume(struct irdma_sc_qp *qp, u8 cmd)
{
	SHIM_TRAP("irdma_cqp_qp_suspend_resume");
	return -EOPNOTSUPP;
}

int irdma_cqp_stats_inst_cmd(struct irdma_sc_vsi *vsi, u8 cmd, struct irdma_stats_inst_info *stats_info)
{
	SHIM_TRAP("irdma_cqp_stats_inst_cmd");
	return -EOPNOTSUPP;
}

void irdma_hw_stats_start_timer(struct irdma_sc_vsi *vsi) { SHIM_TRAP("irdma_hw_stats_start_timer"); }
void irdma_hw_stats_stop_timer(struct irdma_sc_vsi *vsi) { SHIM_TRAP("irdma_hw_stats_stop_timer"); }
void irdma_modify_qp_to_err(struct irdma_sc_qp *sc_qp) { SHIM_TRAP("irdma_modify_qp_to_err"); }
void irdma_reinitialize_ieq(struct irdma_sc_vsi *vsi) { SHIM_TRAP("irdma_reinitialize_ieq"); }
void irdma_term_modify_qp(struct irdma_sc_qp *qp, u8 next_state, u8 term, u8 term_len)
{
	SHIM_TRAP("irdma_term_modify_qp");
}
void irdma_terminate_done(struct irdma_sc_qp *qp, int timeout_occurred) { SHIM_TRAP("irdma_terminate_done"); }
void irdma_terminate_start_timer(struct irdma_sc_qp *qp) { SHIM_TRAP("irdma_terminate_start_timer"); }

int irdma_ws_add(struct irdma_sc_vsi *vsi, u8 user_pri)
{
	SHIM_TRAP("irdma_ws_add");
	return -EOPNOTSUPP;
}
void irdma_ws_remove(struct irdma_sc_vsi *vsi, u8 user_pri) { SHIM_TRAP("irdma_ws_remove"); }
void irdma_ws_reset(struct irdma_sc_vsi *vsi) { SHIM_TRAP("irdma_ws_reset"); }
