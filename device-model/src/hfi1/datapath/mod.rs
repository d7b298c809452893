//! The worker's data path, above the state blocks it drives: packets from the cable routed into the receive
//! engine (`ingress`), PIO packets onto the cable (`egress`), the project's loopback send block
//! (`loopback`), the port the cable calls (`port`), the worker's jobs (`worker`) and the control socket's batches from
//! the wire (`batch`). The SDMA walk lives next
//! to the engines' state (`wfr::sdma::walk`).

pub(super) mod batch;
pub(super) mod egress;
pub(super) mod ingress;
pub(super) mod loopback;
pub(super) mod port;
pub(super) mod worker;
