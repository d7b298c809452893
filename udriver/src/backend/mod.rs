//! backend: see docs/.
