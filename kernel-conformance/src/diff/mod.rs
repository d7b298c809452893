//! Differential testing: kernel vs udriver.
