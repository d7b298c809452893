//! The module import graph of a crate, read from its sources with `syn`, and its cycles.
//!
//! An edge A -> B means module A names an item of module B: a `use`, or a `crate::`/`super::`/`self::` path
//! (or a path through one of A's child modules) in its code. Paths through a `pub use` land in the module that
//! defines the item. A module with no items but `mod` and `use` is only its children's interface: its
//! `pub use` of a descendant's item is no edge. A module with code of its own is a layer, and its re-exports
//! tie it to the modules it re-exports from: they are edges, so a child that imports its parent's own items
//! while the parent re-exports that child's is a cycle (docs/architecture.md: a parent with code of its own
//! keeps its children's shared types in a child). `cargo modules dependencies --acyclic` makes a looser check
//! (it sees no tie in a re-export); this one runs as a plain test.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GraphError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: syn::Error },
    #[error("{path}: module file not found for `mod {name};`")]
    MissingModule { path: PathBuf, name: String },
}

/// A module path from the crate root; the root is the empty path.
pub type ModPath = Vec<String>;

#[derive(Debug, Default)]
struct Module {
    children: BTreeSet<String>,
    /// Items of its own besides `mod` and `use` (module docs).
    has_code: bool,
    /// The absolute paths of its `pub use`s of descendants' items.
    interface: Vec<ModPath>,
    /// Re-exported name -> the path it names (absolute).
    reexports: BTreeMap<String, ModPath>,
    /// Absolute paths this module names.
    uses: Vec<ModPath>,
}

/// The modules of one crate and what each names.
#[derive(Debug, Default)]
pub struct Graph {
    modules: BTreeMap<ModPath, Module>,
}

impl Graph {
    /// Reads the crate whose root file is `root` (`src/lib.rs` or `src/main.rs`).
    pub fn read(root: &Path) -> Result<Self, GraphError> {
        let mut g = Graph::default();
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        g.read_file(root, &dir, Vec::new())?;
        Ok(g)
    }

    fn read_file(&mut self, file: &Path, dir: &Path, path: ModPath) -> Result<(), GraphError> {
        let text = std::fs::read_to_string(file).map_err(|source| GraphError::Read { path: file.into(), source })?;
        let ast = syn::parse_file(&text).map_err(|source| GraphError::Parse { path: file.into(), source })?;
        self.read_items(&ast.items, file, dir, path)
    }

    /// `dir` is where this module's child files live.
    fn read_items(&mut self, items: &[syn::Item], file: &Path, dir: &Path, path: ModPath) -> Result<(), GraphError> {
        self.modules.entry(path.clone()).or_default();
        for item in items {
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut child = path.clone();
                    child.push(name.clone());
                    self.modules.entry(path.clone()).or_default().children.insert(name.clone());
                    let child_dir = dir.join(&name);
                    if let Some((_, items)) = &m.content {
                        self.read_items(items, file, &child_dir, child)?;
                    } else {
                        let file_dir = file.parent().unwrap_or(Path::new("."));
                        let (child_file, grand_dir) = match path_attr(&m.attrs) {
                            Some(p) => {
                                let f = file_dir.join(p);
                                let d = f.with_extension("");
                                (f, d)
                            }
                            None => {
                                let flat = dir.join(format!("{name}.rs"));
                                if flat.exists() {
                                    (flat, child_dir.clone())
                                } else {
                                    (child_dir.join("mod.rs"), child_dir.clone())
                                }
                            }
                        };
                        if !child_file.exists() {
                            return Err(GraphError::MissingModule { path: file.into(), name });
                        }
                        self.read_file(&child_file, &grand_dir, child)?;
                    }
                }
                syn::Item::Use(u) => {
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    let mut flat = Vec::new();
                    flatten_use(&u.tree, Vec::new(), &mut flat);
                    for (segs, name) in flat {
                        let Some(abs) = self.absolute(&path, &segs) else { continue };
                        let m = self.modules.entry(path.clone()).or_default();
                        // Any `pub use` is a name others may import through; only one of a descendant's item is
                        // no import of this module's own.
                        let descendant = abs.starts_with(&path) && abs.len() > path.len();
                        if let (true, Some(n)) = (public, &name) {
                            m.reexports.insert(n.clone(), abs.clone());
                        }
                        if public && descendant && name.is_some() {
                            m.interface.push(abs);
                        } else {
                            m.uses.push(abs);
                        }
                    }
                }
                other => {
                    if !matches!(other, syn::Item::ExternCrate(_)) {
                        self.modules.entry(path.clone()).or_default().has_code = true;
                    }
                    let mut v = PathVisitor::default();
                    v.visit_item(other);
                    for segs in v.paths {
                        if let Some(abs) = self.absolute(&path, &segs) {
                            self.modules.entry(path.clone()).or_default().uses.push(abs);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `segs` as seen from module `from`, made absolute; `None` for paths into other crates.
    fn absolute(&self, from: &ModPath, segs: &[String]) -> Option<ModPath> {
        let first = segs.first()?;
        let (mut base, rest) = match first.as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (from.clone(), &segs[1..]),
            "super" => {
                let mut b = from.clone();
                let mut i = 0;
                while segs.get(i).map(String::as_str) == Some("super") {
                    b.pop();
                    i += 1;
                }
                (b, &segs[i..])
            }
            // A path through a child module (2018 uniform paths).
            name if self.modules.get(from).is_some_and(|m| m.children.contains(name)) => (from.clone(), segs),
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module an absolute path lands in: down through child modules, across re-exports.
    fn resolve(&self, abs: &[String], depth: u32) -> ModPath {
        let mut cur: ModPath = Vec::new();
        for (i, seg) in abs.iter().enumerate() {
            let Some(m) = self.modules.get(&cur) else { break };
            if m.children.contains(seg) {
                cur.push(seg.clone());
            } else if let Some(target) = m.reexports.get(seg).filter(|_| depth < 8) {
                let mut t = target.clone();
                t.extend(abs[i + 1..].iter().cloned());
                return self.resolve(&t, depth + 1);
            } else {
                break;
            }
        }
        cur
    }

    /// Module -> the other modules it imports from.
    pub fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut out: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (path, m) in &self.modules {
            let set = out.entry(path.clone()).or_default();
            let interface = m.interface.iter().filter(|_| m.has_code);
            for u in m.uses.iter().chain(interface) {
                let target = self.resolve(u, 0);
                if &target != path {
                    set.insert(target);
                }
            }
        }
        out
    }

    /// The imports inside each cycle, `a -> b`, to say what to break.
    pub fn cycle_edges(&self) -> Vec<String> {
        let edges = self.edges();
        let name = |p: &ModPath| if p.is_empty() { "crate".to_string() } else { p.join("::") };
        let mut out = Vec::new();
        for scc in tarjan(&edges).into_iter().filter(|s| s.len() > 1) {
            let members: BTreeSet<&ModPath> = scc.iter().collect();
            for m in &scc {
                for t in edges.get(m).into_iter().flatten().filter(|t| members.contains(t)) {
                    out.push(format!("{} -> {}", name(m), name(t)));
                }
            }
        }
        out.sort();
        out
    }

    /// Every set of modules that import each other (strongly connected components of two or more).
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let edges = self.edges();
        let mut found = Vec::new();
        for scc in tarjan(&edges) {
            if scc.len() > 1 {
                let mut names: Vec<String> =
                    scc.iter().map(|p| if p.is_empty() { "crate".to_string() } else { p.join("::") }).collect();
                names.sort();
                found.push(names);
            }
        }
        found.sort();
        found
    }
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Every leaf of a use tree: its path and the name it binds (`None` for a glob, which names the module).
fn flatten_use(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |s: &syn::Ident| {
        let mut p = prefix.clone();
        p.push(s.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => flatten_use(&p.tree, with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push((prefix, name));
        }
        syn::UseTree::Name(n) => out.push((with(&n.ident), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) => out.push((with(&r.ident), Some(r.rename.to_string()))),
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix.clone(), out);
            }
        }
    }
}

/// The paths one item's code names; nested modules are their own.
#[derive(Default)]
struct PathVisitor {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathVisitor {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            self.paths.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
    /// `pub(super)` names who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}
}

/// Tarjan's strongly connected components.
fn tarjan(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn connect<'a>(s: &mut State<'a>, v: &'a ModPath) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let targets: Vec<&'a ModPath> = s.edges.get(v).map(|t| t.iter().collect()).unwrap_or_default();
        for w in targets {
            let Some((w, _)) = s.edges.get_key_value(w) else { continue };
            if !s.index.contains_key(w) {
                connect(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            connect(&mut s, v);
        }
    }
    s.out
}
