//! irdma: see docs/.
