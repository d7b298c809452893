//! hfi1: see docs/.
