//! The receive engine (RXE): the CSR state a driver programs (`state`), the RcvArray (`rcvarray`) and the TID
//! flow tables (`flow`), and the rules that judge and place an arriving packet against them: header queues
//! and eager buffers (`rhq`), TID placement (`rcv`), KDETH packets (`kdeth`). The worker's data path
//! (`hfi1::ingress`) calls these; none of them reaches up into it.

pub(super) mod batch;
pub(super) mod flow;
pub(super) mod kdeth;
pub(super) mod rcv;
pub(super) mod rcvarray;
pub(super) mod rhq;
pub(super) mod state;
#[cfg(test)]
mod test_context;
