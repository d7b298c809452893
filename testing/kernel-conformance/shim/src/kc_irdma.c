// SPDX-License-Identifier: Apache-2.0
/*
 * The harness side of the kernel's irdma control path. ctrl.c is included whole and unmodified, so its
 * static functions (irdma_sc_manage_qhash_table_entry, irdma_cqp_poll_registers) are callable here under
 * their own names. Everything else in this file does what hw.c's irdma_create_cqp / irdma_create_ccq and
 * the ice glue do around ctrl.c: allocate queue memory, fill the init infos, own the objects.
 */
#include "ctrl.c"

#include <shim/kc_irdma.h>

/* Commands waiting in dev->cqp_cmd_head need memory that outlives the call that queued them. */
#define KC_BACKLOG_MAX 256

struct kc_irdma {
	struct irdma_sc_dev dev;
	struct irdma_hw hw;
	struct irdma_hmc_info hmc_info;
	struct irdma_hmc_obj_info hmc_obj[IRDMA_HMC_IW_MAX];
	struct irdma_sc_vsi vsi;
	struct irdma_sc_cqp cqp;
	struct irdma_sc_cq ccq;
	struct device device;
	void *bar0;
	u64 *scratch_array;
	struct irdma_dma_mem sq, host_ctx, ccq_mem, shadow;
	bool dev_ready, cqp_ready, ccq_ready;
	struct cqp_cmds_info backlog[KC_BACKLOG_MAX];
};

void kc_irdma_abi(struct kc_abi *out)
{
	out->cqp_params = sizeof(struct kc_cqp_params);
	out->ccq_params = sizeof(struct kc_ccq_params);
	out->qhash = sizeof(struct kc_qhash);
	out->cqe_info = sizeof(struct kc_cqe_info);
	out->state = sizeof(struct kc_state);
}

struct kc_irdma *kc_irdma_new(void *bar0, void *dma_ctx)
{
	struct kc_irdma *k = kzalloc(sizeof(*k), GFP_KERNEL);

	if (!k)
		return NULL;
	k->bar0 = bar0;
	k->device.shim_ctx = dma_ctx;
	k->hw.device = &k->device;
	k->dev.hmc_info = &k->hmc_info;
	k->hmc_info.hmc_obj = k->hmc_obj;
	return k;
}

static void kc_free_dma(struct kc_irdma *k, struct irdma_dma_mem *m)
{
	if (m->va)
		dma_free_coherent(&k->device, m->size, m->va, m->pa);
	m->va = NULL;
}

void kc_irdma_free(struct kc_irdma *k)
{
	if (!k)
		return;
	/* A CQP that was never destroyed still owns its SD buffer (irdma_sc_cqp_destroy frees it). */
	if (k->cqp.sdbuf.va)
		dma_free_coherent(&k->device, k->cqp.sdbuf.size, k->cqp.sdbuf.va, k->cqp.sdbuf.pa);
	kc_free_dma(k, &k->sq);
	kc_free_dma(k, &k->host_ctx);
	kc_free_dma(k, &k->ccq_mem);
	kc_free_dma(k, &k->shadow);
	kfree(k->scratch_array);
	kfree(k);
}

int kc_irdma_dev_init(struct kc_irdma *k, u32 max_pe_ready_count, u32 max_done_count, u32 max_sleep_count)
{
	struct irdma_device_init_info info = {};
	struct irdma_l2params l2p = {};
	struct irdma_vsi_init_info vsi_info = {};
	int ret;

	info.hw = &k->hw;
	info.bar0 = k->bar0;
	ret = irdma_sc_dev_init(IRDMA_GEN_2, &k->dev, &info);
	if (ret)
		return ret;
	/*
	 * irdma_sc_dev_init sets the delays and counts; a test shortens them so that failure paths run in
	 * microseconds. PE readiness has already been waited for with the kernel's own values by then,
	 * which is why max_pe_ready_count only matters to a second dev_init.
	 */
	k->dev.hw_attrs.max_pe_ready_count = max_pe_ready_count;
	k->dev.hw_attrs.max_done_count = max_done_count;
	k->dev.hw_attrs.max_sleep_count = max_sleep_count;

	/*
	 * What irdma_sc_init_iw_hmc would have read from the firmware's FPM values: the device model has no
	 * HMC, so only the limits irdma_sc_cq_create and irdma_sc_ccq_init check are set: one CQ (the CCQ),
	 * and every CEQ id the CQ context can name (IRDMA_CEQ_MAX_COUNT).
	 */
	k->hmc_info.hmc_obj[IRDMA_HMC_IW_CQ].max_cnt = 1;
	k->hmc_info.hmc_obj[IRDMA_HMC_IW_CQ].cnt = 1;
	k->dev.hmc_fpm_misc.max_ceqs = IRDMA_CEQ_MAX_COUNT;

	/* The default VSI as irdma_rt_init_hw makes it; qs_handle comes per command (ice's register_qset). */
	l2p.mtu = 1500;
	vsi_info.dev = &k->dev;
	vsi_info.params = &l2p;
	irdma_sc_vsi_init(&k->vsi, &vsi_info);
	k->dev_ready = true;
	return 0;
}

void kc_irdma_cfg_ceq(struct kc_irdma *k, u32 ceq_id, u32 idx, bool enable)
{
	k->dev.irq_ops->irdma_cfg_ceq(&k->dev, ceq_id, idx, enable);
}

int kc_irdma_cqp_init(struct kc_irdma *k, const struct kc_cqp_params *p)
{
	struct irdma_cqp_init_info info = {};
	u32 sqsize = p->sq_size;
	int ret;

	if (!k->dev_ready || k->sq.va)
		return -EINVAL;
	/* irdma_sc_cqp_init validates the size; the memory is sized for it only if it is sane. */
	if (sqsize >= IRDMA_CQP_SW_SQSIZE_4 && sqsize <= IRDMA_CQP_SW_SQSIZE_2048) {
		k->scratch_array = kcalloc(sqsize, sizeof(*k->scratch_array), GFP_KERNEL);
		if (!k->scratch_array)
			return -ENOMEM;
		k->sq.size = ALIGN(sizeof(struct irdma_cqp_sq_wqe) * sqsize, IRDMA_CQP_ALIGNMENT);
		k->sq.va = dma_alloc_coherent(&k->device, k->sq.size, &k->sq.pa, GFP_KERNEL);
		k->host_ctx.size = sizeof(struct irdma_cqp_ctx);
		k->host_ctx.va = dma_alloc_coherent(&k->device, k->host_ctx.size, &k->host_ctx.pa, GFP_KERNEL);
		if (!k->sq.va || !k->host_ctx.va)
			return -ENOMEM;
	}
	k->dev.cqp = &k->cqp;
	k->cqp.dev = &k->dev;
	info.dev = &k->dev;
	info.sq_size = sqsize;
	info.sq = k->sq.va;
	info.sq_pa = k->sq.pa;
	info.host_ctx_pa = k->host_ctx.pa;
	info.host_ctx = k->host_ctx.va;
	info.scratch_array = k->scratch_array;
	info.hw_maj_ver = p->hw_maj_ver;
	info.hw_min_ver = p->hw_min_ver;
	info.struct_ver = p->struct_ver;
	info.hmc_profile = p->hmc_profile;
	info.ena_vf_count = p->ena_vf_count;
	info.ceqs_per_vf = p->ceqs_per_vf;
	info.en_datacenter_tcp = p->en_datacenter_tcp;
	info.disable_packed = p->disable_packed;
	info.rocev2_rto_policy = p->rocev2_rto_policy;
	info.protocol_used = p->protocol_used;
	info.dcqcn_params.cc_cfg_valid = p->cc_cfg_valid;
	info.dcqcn_params.min_dec_factor = p->min_dec_factor;
	info.dcqcn_params.min_rate = p->min_rate;
	info.dcqcn_params.dcqcn_f = p->dcqcn_f;
	info.dcqcn_params.rai_factor = p->rai_factor;
	info.dcqcn_params.hai_factor = p->hai_factor;
	info.dcqcn_params.dcqcn_t = p->dcqcn_t;
	info.dcqcn_params.dcqcn_b = p->dcqcn_b;
	info.dcqcn_params.rreduce_mperiod = p->rreduce_mperiod;
	ret = irdma_sc_cqp_init(&k->cqp, &info);
	if (ret)
		return ret;
	k->cqp_ready = true;
	return 0;
}

int kc_irdma_cqp_create(struct kc_irdma *k, u16 *maj_err, u16 *min_err)
{
	if (!k->cqp_ready)
		return -EINVAL;
	return irdma_sc_cqp_create(&k->cqp, maj_err, min_err);
}

int kc_irdma_cqp_destroy(struct kc_irdma *k)
{
	if (!k->cqp_ready)
		return -EINVAL;
	return irdma_sc_cqp_destroy(&k->cqp);
}

int kc_irdma_ccq_init(struct kc_irdma *k, const struct kc_ccq_params *p)
{
	struct irdma_ccq_init_info info = {};
	int ret;

	if (!k->cqp_ready || k->ccq_mem.va)
		return -EINVAL;
	if (p->num_elem > IRDMA_MAX_CQ_SIZE)
		return -EINVAL;
	k->dev.ccq = &k->ccq;
	k->ccq.dev = &k->dev;
	k->ccq_mem.size = ALIGN(sizeof(struct irdma_cqe) * p->num_elem, IRDMA_CQ0_ALIGNMENT);
	k->ccq_mem.va = dma_alloc_coherent(&k->device, k->ccq_mem.size ? k->ccq_mem.size : 1, &k->ccq_mem.pa,
					   GFP_KERNEL);
	k->shadow.size = sizeof(struct irdma_cq_shadow_area);
	k->shadow.va = dma_alloc_coherent(&k->device, k->shadow.size, &k->shadow.pa, GFP_KERNEL);
	if (!k->ccq_mem.va || !k->shadow.va)
		return -ENOMEM;
	k->vsi.vsi_idx = p->vsi_idx;
	info.dev = &k->dev;
	info.cq_base = k->ccq_mem.va;
	info.cq_pa = k->ccq_mem.pa;
	info.num_elem = p->num_elem;
	info.shadow_area = k->shadow.va;
	info.shadow_area_pa = k->shadow.pa;
	info.ceq_id = p->ceq_id;
	info.ceqe_mask = p->ceqe_mask;
	info.ceq_id_valid = p->ceq_id_valid;
	info.avoid_mem_cflct = p->avoid_mem_cflct;
	info.tph_en = p->tph_en;
	info.tph_val = p->tph_val;
	info.shadow_read_threshold = p->shadow_read_threshold;
	info.vsi = &k->vsi;
	ret = irdma_sc_ccq_init(&k->ccq, &info);
	if (ret)
		return ret;
	k->ccq_ready = true;
	return 0;
}

int kc_irdma_ccq_create(struct kc_irdma *k, u64 scratch, bool check_overflow, bool post_sq)
{
	if (!k->ccq_ready)
		return -EINVAL;
	return irdma_sc_ccq_create(&k->ccq, scratch, check_overflow, post_sq);
}

int kc_irdma_ccq_destroy(struct kc_irdma *k, u64 scratch, bool post_sq)
{
	if (!k->ccq_ready)
		return -EINVAL;
	return irdma_sc_ccq_destroy(&k->ccq, scratch, post_sq);
}

void kc_irdma_ccq_arm(struct kc_irdma *k)
{
	if (k->ccq_ready)
		irdma_sc_ccq_arm(&k->ccq);
}

static void kc_cqe_out(const struct kc_irdma *k, const struct irdma_ccq_cqe_info *in, struct kc_cqe_info *out)
{
	out->scratch = in->scratch;
	out->op_ret_val = in->op_ret_val;
	out->maj_err_code = in->maj_err_code;
	out->min_err_code = in->min_err_code;
	out->op_code = in->op_code;
	out->error = in->error;
	out->cqp_is_ours = in->cqp == &k->cqp;
}

int kc_irdma_ccq_get_cqe_info(struct kc_irdma *k, struct kc_cqe_info *out)
{
	struct irdma_ccq_cqe_info info = {};
	int ret;

	if (!k->ccq_ready)
		return -EINVAL;
	ret = irdma_sc_ccq_get_cqe_info(&k->ccq, &info);
	kc_cqe_out(k, &info, out);
	return ret;
}

int kc_irdma_poll_for_cqp_op_done(struct kc_irdma *k, u8 op_code, struct kc_cqe_info *out)
{
	struct irdma_ccq_cqe_info info = {};
	int ret;

	if (!k->ccq_ready)
		return -EINVAL;
	ret = irdma_sc_poll_for_cqp_op_done(&k->cqp, op_code, &info);
	kc_cqe_out(k, &info, out);
	return ret;
}

static void kc_qhash_info(struct kc_irdma *k, const struct kc_qhash *q, struct irdma_qhash_table_info *info)
{
	int i;

	/* vsi->qos[].qs_handle is what ice hands irdma for each user priority (register_qset). */
	for (i = 0; i < IRDMA_MAX_USER_PRIORITY; i++)
		k->vsi.qos[i].qs_handle = q->qs_handle[i];
	info->vsi = &k->vsi;
	info->manage = q->manage;
	info->entry_type = q->entry_type;
	info->vlan_valid = q->vlan_valid;
	info->ipv4_valid = q->ipv4_valid;
	memcpy(info->mac_addr, q->mac_addr, ETH_ALEN);
	info->vlan_id = q->vlan_id;
	info->user_pri = q->user_pri;
	info->qp_num = q->qp_num;
	memcpy(info->dest_ip, q->dest_ip, sizeof(info->dest_ip));
	memcpy(info->src_ip, q->src_ip, sizeof(info->src_ip));
	info->dest_port = q->dest_port;
	info->src_port = q->src_port;
}

int kc_irdma_manage_qhash_table_entry(struct kc_irdma *k, const struct kc_qhash *q, u64 scratch, bool post_sq)
{
	struct irdma_qhash_table_info info = {};

	/* The kernel indexes vsi->qos[user_pri] unchecked; its callers keep user_pri below 8. */
	if (!k->cqp_ready || q->user_pri >= IRDMA_MAX_USER_PRIORITY)
		return -EINVAL;
	kc_qhash_info(k, q, &info);
	return irdma_sc_manage_qhash_table_entry(&k->cqp, &info, scratch, post_sq);
}

static bool kc_on_backlog(struct kc_irdma *k, struct cqp_cmds_info *c)
{
	struct list_head *pos;

	list_for_each(pos, &k->dev.cqp_cmd_head)
		if (pos == &c->cqp_cmd_entry)
			return true;
	return false;
}

int kc_irdma_process_qhash(struct kc_irdma *k, const struct kc_qhash *q, u64 scratch)
{
	struct cqp_cmds_info *c = NULL;
	int i;

	if (!k->cqp_ready || q->user_pri >= IRDMA_MAX_USER_PRIORITY)
		return -EINVAL;
	for (i = 0; i < KC_BACKLOG_MAX && !c; i++)
		if (!kc_on_backlog(k, &k->backlog[i]))
			c = &k->backlog[i];
	if (!c)
		return -ENOSPC;
	memset(c, 0, sizeof(*c));
	/* As utils.c irdma_manage_qhash fills it. */
	c->cqp_cmd = IRDMA_OP_MANAGE_QHASH_TABLE_ENTRY;
	c->post_sq = 1;
	c->in.u.manage_qhash_table_entry.cqp = &k->cqp;
	c->in.u.manage_qhash_table_entry.scratch = scratch;
	kc_qhash_info(k, q, &c->in.u.manage_qhash_table_entry.info);
	return irdma_process_cqp_cmd(&k->dev, c);
}

int kc_irdma_process_bh(struct kc_irdma *k)
{
	if (!k->cqp_ready)
		return -EINVAL;
	return irdma_process_bh(&k->dev);
}

void kc_irdma_post_sq(struct kc_irdma *k)
{
	if (k->cqp_ready)
		irdma_sc_cqp_post_sq(&k->cqp);
}

void kc_irdma_state(const struct kc_irdma *k, struct kc_state *out)
{
	const struct list_head *pos;

	memset(out, 0, sizeof(*out));
	out->cqp_addr = (uintptr_t)&k->cqp;
	out->ccq_addr = (uintptr_t)&k->ccq;
	out->sq_va = (uintptr_t)k->sq.va;
	out->sq_pa = k->sq.pa;
	out->host_ctx_va = (uintptr_t)k->host_ctx.va;
	out->host_ctx_pa = k->host_ctx.pa;
	out->sdbuf_pa = k->cqp.sdbuf.va ? k->cqp.sdbuf.pa : 0;
	out->ccq_va = (uintptr_t)k->ccq_mem.va;
	out->ccq_pa = k->ccq_mem.pa;
	out->shadow_va = (uintptr_t)k->shadow.va;
	out->shadow_pa = k->shadow.pa;
	out->requested_ops = k->cqp.requested_ops;
	out->completed_ops = atomic64_read(&k->cqp.completed_ops);
	out->sq_size = k->cqp.sq_ring.size;
	out->sq_head = k->cqp.sq_ring.head;
	out->sq_tail = k->cqp.sq_ring.tail;
	out->polarity = k->cqp.polarity;
	out->ccq_size = k->ccq.cq_uk.cq_ring.size;
	out->ccq_head = k->ccq.cq_uk.cq_ring.head;
	out->ccq_tail = k->ccq.cq_uk.cq_ring.tail;
	out->ccq_polarity = k->ccq.cq_uk.polarity;
	if (k->dev_ready)
		list_for_each(pos, &k->dev.cqp_cmd_head)
			out->backlog_len++;
}
