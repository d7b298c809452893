//! ci/bench.sh's reports: the results of a benchmark run (`report`: docs/bench/results.json from the runs'
//! outputs), its plots (`svg`: results.svg and scale.svg), docs/bench.md's results table (`table`) and the
//! summary printed at the end of a run (`summary`). Definitions: docs/bench.md.

pub mod doc;
pub mod pyformat;
pub mod report;
pub mod summary;
pub mod svg;
pub mod table;
