//! The worker's data path, above the state blocks it drives: packets from the cable routed into the receive
//! engine (`ingress`), PIO packets onto the cable (`egress`), the project's loopback send block
//! (`loopback`), the port the cable calls (`port`) and the worker's jobs (`worker`). The SDMA walk lives next
//! to the engines' state (`wfr::sdma::walk`).

pub(super) mod egress;
pub(super) mod ingress;
pub(super) mod loopback;
pub(super) mod port;
pub(super) mod worker;
