//! A campaign's coverage in the terms of the issue: call sites by source file against a baseline, and which
//! entries of the driver's receive dispatch tables were reached.
//!
//! The tables are read from the guest kernel's own source at run time (verbs.c's `opcode_handler_tbl`, mad.c's
//! `subn_get_opa_sma` and `subn_set_opa_sma` switches): the repository holds none of it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use kernel_cov::symbolize::Site;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{file}: {what} not found (another kernel version?)")]
    Missing { file: String, what: &'static str },
}

/// A dispatch entry: the key (an opcode or an attribute ID's name) and the function it calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub key: String,
    pub handler: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Tables {
    pub opcode_handler_tbl: Vec<Entry>,
    pub subn_get_opa_sma: Vec<Entry>,
    pub subn_set_opa_sma: Vec<Entry>,
}

/// `[IB_OPCODE_X] = &handler,` lines of the table's initializer.
fn parse_designated(text: &str, table: &str) -> Option<Vec<Entry>> {
    let start = text.find(&format!("{table}[256] = {{"))?;
    let body = &text[start..];
    let body = &body[..body.find("};")?];
    let mut v = Vec::new();
    for line in body.lines() {
        let l = line.trim();
        let (Some(key), Some(h)) = (l.strip_prefix('[').and_then(|r| r.split_once(']')), l.split_once("= &")) else {
            continue;
        };
        let handler = h.1.trim_end_matches(',').trim().to_string();
        v.push(Entry { key: key.0.trim().to_string(), handler });
    }
    (!v.is_empty()).then_some(v)
}

/// `case ATTR:` followed by `ret = __subn_...(` in the named function's switch.
fn parse_switch(text: &str, function: &str) -> Option<Vec<Entry>> {
    let start = text.find(&format!("static int {function}("))?;
    let body = &text[start..];
    let end = body.find("\n}\n")?;
    let mut v = Vec::new();
    let mut pending: Vec<String> = vec![];
    for line in body[..end].lines() {
        let l = line.trim();
        if let Some(case) = l.strip_prefix("case ").and_then(|c| c.strip_suffix(':')) {
            pending.push(case.trim().to_string());
        } else if let Some(call) = l.strip_prefix("ret = ").and_then(|c| c.split_once('(')) {
            for key in pending.drain(..) {
                v.push(Entry { key, handler: call.0.trim().to_string() });
            }
        } else if l.starts_with("default:") || l.starts_with("break;") && !pending.is_empty() {
            pending.clear();
        }
    }
    (!v.is_empty()).then_some(v)
}

impl Tables {
    /// From the driver's directory of the guest kernel's source tree (drivers/infiniband/hw/hfi1).
    pub fn from_source(hfi1: &Path) -> Result<Tables, TablesError> {
        let read = |name: &str| {
            let p = hfi1.join(name);
            std::fs::read_to_string(&p).map_err(|source| TablesError::Read { path: p.display().to_string(), source })
        };
        let (verbs, mad) = (read("verbs.c")?, read("mad.c")?);
        let missing = |file: &str, what| TablesError::Missing { file: file.into(), what };
        Ok(Tables {
            opcode_handler_tbl: parse_designated(&verbs, "opcode_handler_tbl")
                .ok_or_else(|| missing("verbs.c", "opcode_handler_tbl"))?,
            subn_get_opa_sma: parse_switch(&mad, "subn_get_opa_sma")
                .ok_or_else(|| missing("mad.c", "subn_get_opa_sma"))?,
            subn_set_opa_sma: parse_switch(&mad, "subn_set_opa_sma")
                .ok_or_else(|| missing("mad.c", "subn_set_opa_sma"))?,
        })
    }
}

/// Reached or not, per entry of one table.
#[derive(Debug, Clone, Serialize)]
pub struct TableReach {
    pub entries: usize,
    pub reached: usize,
    pub missing: Vec<String>,
}

/// The functions that have a reached call site, by the innermost frame's name and the function holding the
/// code (a static handler inlined into its caller still counts as reached).
pub fn functions_reached(sites: &[Site], reached: &HashSet<u32>) -> BTreeSet<String> {
    let mut f = BTreeSet::new();
    for s in sites.iter().filter(|s| reached.contains(&s.offset)) {
        f.insert(s.function.clone());
        if let Some(i) = &s.inlined_into {
            f.insert(i.clone());
        }
    }
    f
}

pub fn reach(entries: &[Entry], functions: &BTreeSet<String>) -> TableReach {
    let missing: Vec<String> = entries
        .iter()
        .filter(|e| !functions.contains(&e.handler))
        .map(|e| format!("{} ({})", e.key, e.handler))
        .collect();
    TableReach { entries: entries.len(), reached: entries.len() - missing.len(), missing }
}

/// The files the coverage target names.
pub const TARGET_FILES: &[&str] = &["driver.c", "verbs.c", "ruc.c", "rc.c", "uc.c", "ud.c", "mad.c", "tid_rdma.c"];

/// Call sites reached and in total, by the site's source file's base name.
pub fn by_file(sites: &[Site], reached: &HashSet<u32>) -> BTreeMap<String, (u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in sites {
        let base = s.file.rsplit('/').next().unwrap_or(&s.file).to_string();
        let e = m.entry(base).or_default();
        e.1 += 1;
        e.0 += u64::from(reached.contains(&s.offset));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    // Excerpts in the layout of the 6.12 sources (verbs.c's table, mad.c's switch), with invented entries.
    const VERBS: &str = "static const opcode_handler opcode_handler_tbl[256] = {\n\
        \t/* RC */\n\
        \t[IB_OPCODE_RC_SEND_FIRST]                     = &hfi1_rc_rcv,\n\
        \t[IB_OPCODE_UD_SEND_ONLY]                      = &hfi1_ud_rcv,\n\
        \t/* CNP */\n\
        \t[IB_OPCODE_CNP]                               = &hfi1_cnp_rcv\n\
        };\n";
    const MAD: &str = "static int subn_get_opa_sma(__be16 attr_id, struct opa_smp *smp, u32 am,\n\
        \t\t\t    u8 *data)\n{\n\tint ret;\n\tswitch (attr_id) {\n\
        \tcase IB_SMP_ATTR_NODE_DESC:\n\t\tret = __subn_get_opa_nodedesc(smp, am, data, ibdev, port,\n\
        \t\t\t\t\t      resp_len, max_len);\n\t\tbreak;\n\
        \tcase IB_SMP_ATTR_SM_INFO:\n\t\tif (ibp->rvp.port_cap_flags & IB_PORT_SM_DISABLED)\n\
        \t\t\treturn IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_CONSUMED;\n\t\tbreak;\n\
        \tcase OPA_ATTRIB_ID_CABLE_INFO:\n\t\tret = __subn_get_opa_cable_info(smp, am, data, ibdev, port,\n\
        \t\t\t\t\t\t resp_len, max_len);\n\t\tbreak;\n\
        \tdefault:\n\t\tsmp->status |= IB_SMP_UNSUP_METH_ATTR;\n\t\tret = reply((struct ib_mad_hdr *)smp);\n\t}\n\treturn ret;\n}\n";

    #[test]
    fn the_dispatch_tables_read_from_the_source_layout() {
        let t = parse_designated(VERBS, "opcode_handler_tbl").unwrap();
        let want = [
            ("IB_OPCODE_RC_SEND_FIRST", "hfi1_rc_rcv"),
            ("IB_OPCODE_UD_SEND_ONLY", "hfi1_ud_rcv"),
            ("IB_OPCODE_CNP", "hfi1_cnp_rcv"),
        ];
        assert_eq!(t.iter().map(|e| (e.key.as_str(), e.handler.as_str())).collect::<Vec<_>>(), want);
        let s = parse_switch(MAD, "subn_get_opa_sma").unwrap();
        let want = [
            ("IB_SMP_ATTR_NODE_DESC", "__subn_get_opa_nodedesc"),
            ("OPA_ATTRIB_ID_CABLE_INFO", "__subn_get_opa_cable_info"),
        ];
        assert_eq!(s.iter().map(|e| (e.key.as_str(), e.handler.as_str())).collect::<Vec<_>>(), want);
    }

    #[test]
    fn an_inlined_handler_counts_as_reached_through_its_innermost_frame() {
        let site = |offset, function: &str, inlined_into: Option<&str>| Site {
            offset,
            function: function.into(),
            file: "drivers/infiniband/hw/hfi1/mad.c".into(),
            line: 1,
            inlined_into: inlined_into.map(Into::into),
        };
        let sites = [
            site(0x10, "__subn_get_opa_nodedesc", Some("subn_get_opa_sma")),
            site(0x20, "__subn_get_opa_cable_info", Some("subn_get_opa_sma")),
        ];
        let reached: HashSet<u32> = [0x10].into();
        let f = functions_reached(&sites, &reached);
        let entries = parse_switch(MAD, "subn_get_opa_sma").unwrap();
        let r = reach(&entries, &f);
        assert_eq!((r.entries, r.reached), (2, 1));
        assert_eq!(r.missing, vec!["OPA_ATTRIB_ID_CABLE_INFO (__subn_get_opa_cable_info)".to_string()]);
        assert_eq!(by_file(&sites, &reached)["mad.c"], (1, 2));
    }
}
