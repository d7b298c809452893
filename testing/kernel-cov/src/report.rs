//! Coverage by file and function: the call sites reached (the region's first-hit log) against every call
//! site the module has (its relocations to the trace-pc hook), both symbolised.

use crate::elf::Module;
use crate::region::{Header, Region};
use crate::symbolize::{Site, SymbolizeError, Symbolizer};
use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Count {
    pub reached: u64,
    pub total: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    /// The region's header (None for a report of sites gathered elsewhere).
    pub header: Option<Header>,
    /// Distinct call sites hit, from the first-hit bitmap.
    pub sites_reached: u64,
    /// Call sites in the module's MOD_TEXT (hook call relocations).
    pub sites_total: u64,
    /// First hits the log had no room for (its entries are then missing from `files`/`functions`).
    pub log_dropped: u64,
    /// Non-zero bytes of the edge map since the last reset.
    pub edges: u64,
    pub functions_reached: u64,
    pub functions_total: u64,
    /// By the source file of the site's innermost (possibly inlined) frame.
    pub files: BTreeMap<String, Count>,
    /// By the function whose body holds the site.
    pub functions: BTreeMap<String, Count>,
}

fn tally(
    sites: &[Site],
    reached: &HashSet<u32>,
    files: &mut BTreeMap<String, Count>,
    funcs: &mut BTreeMap<String, Count>,
) {
    for s in sites {
        let hit = u64::from(reached.contains(&s.offset));
        let f = files.entry(s.file.clone()).or_default();
        f.total += 1;
        f.reached += hit;
        let func = s.inlined_into.as_ref().unwrap_or(&s.function);
        let c = funcs.entry(func.clone()).or_default();
        c.total += 1;
        c.reached += hit;
    }
}

impl Report {
    pub fn build(region: &Region, module: &Module, symbolizer: &Symbolizer) -> Result<Report, ReportError> {
        let header = region.header()?;
        let log = region.pc_log();
        let reached: HashSet<u32> = log.offsets.iter().copied().collect();
        let mut report = Report::from_reached(module, symbolizer, &reached)?;
        let map = region.edge_map();
        report.sites_reached = region.seen_count();
        report.log_dropped = log.dropped;
        report.edges = map.iter().filter(|&&b| b != 0).count() as u64;
        report.header = Some(header);
        Ok(report)
    }

    /// The report of a set of call sites gathered elsewhere (a campaign's union over its boots): no header,
    /// no edge map.
    pub fn from_reached(
        module: &Module,
        symbolizer: &Symbolizer,
        reached: &HashSet<u32>,
    ) -> Result<Report, ReportError> {
        let all = module.call_sites()?;
        let unknown: Vec<u32> = reached.iter().copied().filter(|o| all.binary_search(o).is_err()).collect();
        if !unknown.is_empty() {
            // A site the module does not have: the region was written by another build of the module.
            return Err(ReportError::ForeignSites { count: unknown.len(), first: unknown[0] });
        }
        let sites = symbolizer.symbolize(module, &all)?;
        let (mut files, mut functions) = (BTreeMap::new(), BTreeMap::new());
        tally(&sites, reached, &mut files, &mut functions);
        Ok(Report {
            header: None,
            sites_reached: reached.len() as u64,
            sites_total: all.len() as u64,
            log_dropped: 0,
            edges: 0,
            functions_reached: functions.values().filter(|c| c.reached > 0).count() as u64,
            functions_total: functions.len() as u64,
            files,
            functions,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Region(#[from] crate::region::RegionError),
    #[error(transparent)]
    Elf(#[from] crate::elf::ElfError),
    #[error(transparent)]
    Symbolize(#[from] SymbolizeError),
    #[error("{count} recorded call sites (first {first:#x}) are not call sites of this module: the region was written by another build")]
    ForeignSites { count: usize, first: u32 },
}
