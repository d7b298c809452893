//! pci: see docs/.
