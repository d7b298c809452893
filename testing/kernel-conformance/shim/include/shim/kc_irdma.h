/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The harness's flat C API over the kernel's irdma control path (shim/src/kc_irdma.c). Fixed-width fields
 * only, largest first, so the Rust mirror (src/ffi.rs) has no padding to guess; kc_irdma_abi() reports
 * the sizes and the Rust side checks them.
 */
#ifndef SHIM_KC_IRDMA_H
#define SHIM_KC_IRDMA_H

#include <shim/types.h>

struct kc_irdma;

/* struct irdma_cqp_init_info's inputs (hw.c irdma_create_cqp fills the rest). */
struct kc_cqp_params {
	u32 sq_size;
	u32 dcqcn_b;
	u32 rreduce_mperiod;
	u16 hw_maj_ver;
	u16 hw_min_ver;
	u16 rai_factor;
	u16 hai_factor;
	u16 dcqcn_t;
	u8 struct_ver;
	u8 hmc_profile;
	u8 ena_vf_count;
	u8 ceqs_per_vf;
	u8 disable_packed;
	u8 rocev2_rto_policy;
	u8 protocol_used;
	u8 en_datacenter_tcp;
	u8 cc_cfg_valid;
	u8 min_dec_factor;
	u8 min_rate;
	u8 dcqcn_f;
};

/* struct irdma_ccq_init_info's inputs. */
struct kc_ccq_params {
	u32 num_elem;
	u32 ceq_id;
	u32 shadow_read_threshold;
	u16 vsi_idx;
	u8 ceqe_mask;
	u8 ceq_id_valid;
	u8 avoid_mem_cflct;
	u8 tph_en;
	u8 tph_val;
	u8 pad;
};

/* struct irdma_qhash_table_info, with the VSI's qs_handle per user priority inline. */
struct kc_qhash {
	u32 manage;
	u32 entry_type;
	u32 qp_num;
	u32 dest_ip[4];
	u32 src_ip[4];
	u16 qs_handle[8];
	u16 vlan_id;
	u16 dest_port;
	u16 src_port;
	u8 mac_addr[6];
	u8 vlan_valid;
	u8 ipv4_valid;
	u8 user_pri;
	u8 pad[3];
};

/* struct irdma_ccq_cqe_info, with the cqp pointer reduced to "is it this device's CQP". */
struct kc_cqe_info {
	u64 scratch;
	u32 op_ret_val;
	u16 maj_err_code;
	u16 min_err_code;
	u8 op_code;
	u8 error;
	u8 cqp_is_ours;
	u8 pad[5];
};

/* The kernel objects' state, as the tests look at it. */
struct kc_state {
	u64 cqp_addr;		/* (uintptr_t)cqp: what the kernel puts in host-context qw3 */
	u64 ccq_addr;		/* (uintptr_t)ccq: CQ create/destroy qw1 is this >> 1 */
	u64 sq_va;
	u64 sq_pa;
	u64 host_ctx_va;
	u64 host_ctx_pa;
	u64 sdbuf_pa;
	u64 ccq_va;
	u64 ccq_pa;
	u64 shadow_va;
	u64 shadow_pa;
	u64 requested_ops;
	u64 completed_ops;
	u32 sq_size;
	u32 sq_head;
	u32 sq_tail;
	u32 ccq_size;
	u32 ccq_head;
	u32 ccq_tail;
	u32 backlog_len;
	u8 polarity;
	u8 ccq_polarity;
	u8 pad[2];
};

struct kc_abi {
	u32 cqp_params, ccq_params, qhash, cqe_info, state;
};

void kc_irdma_abi(struct kc_abi *out);

/* bar0 is a reserved (never dereferenced) window; dma_ctx goes to every dma_alloc_coherent. */
struct kc_irdma *kc_irdma_new(void *bar0, void *dma_ctx);
void kc_irdma_free(struct kc_irdma *k);

/* irdma_sc_dev_init(IRDMA_GEN_2, ...): icrdma_init_hw, PE readiness, LBARCTRL. */
int kc_irdma_dev_init(struct kc_irdma *k, u32 max_pe_ready_count, u32 max_done_count, u32 max_sleep_count);
/* irdma_cfg_ceq via dev->irq_ops (icrdma_cfg_ceq). */
void kc_irdma_cfg_ceq(struct kc_irdma *k, u32 ceq_id, u32 idx, bool enable);

/* hw.c irdma_create_cqp, split: memory + irdma_sc_cqp_init, then irdma_sc_cqp_create. */
int kc_irdma_cqp_init(struct kc_irdma *k, const struct kc_cqp_params *p);
int kc_irdma_cqp_create(struct kc_irdma *k, u16 *maj_err, u16 *min_err);
int kc_irdma_cqp_destroy(struct kc_irdma *k);

/* hw.c irdma_create_ccq, split: memory + irdma_sc_ccq_init, then irdma_sc_ccq_create. */
int kc_irdma_ccq_init(struct kc_irdma *k, const struct kc_ccq_params *p);
int kc_irdma_ccq_create(struct kc_irdma *k, u64 scratch, bool check_overflow, bool post_sq);
int kc_irdma_ccq_destroy(struct kc_irdma *k, u64 scratch, bool post_sq);
void kc_irdma_ccq_arm(struct kc_irdma *k);
int kc_irdma_ccq_get_cqe_info(struct kc_irdma *k, struct kc_cqe_info *out);
int kc_irdma_poll_for_cqp_op_done(struct kc_irdma *k, u8 op_code, struct kc_cqe_info *out);

/* The static irdma_sc_manage_qhash_table_entry itself. */
int kc_irdma_manage_qhash_table_entry(struct kc_irdma *k, const struct kc_qhash *q, u64 scratch, bool post_sq);
/* The same through irdma_process_cqp_cmd (executes at once, or joins the backlog). */
int kc_irdma_process_qhash(struct kc_irdma *k, const struct kc_qhash *q, u64 scratch);
/* irdma_process_bh: runs backlogged commands while the SQ has room. */
int kc_irdma_process_bh(struct kc_irdma *k);
void kc_irdma_post_sq(struct kc_irdma *k);

void kc_irdma_state(const struct kc_irdma *k, struct kc_state *out);

#endif
