//! `guest-run opafm-config IN OUT`: edits opa-fm's packaged opafm.xml for the test guest (ci/build-guest.sh's
//! stage_userland, which then runs opa-fm's own config_check on the result).
//!
//! The edit is textual: every byte outside the edited elements' text stays as Debian ships it, comments included.
//! Each edit names the element by its path from <Config>; a path that is not in the file is an error, so a changed
//! upstream layout is noticed at build time. A path step is the first child element of that name (the first <Fm>
//! is fm0), as in ElementTree's `find`; commented-out elements are not elements.

use std::ops::Range;
use std::path::PathBuf;

/// (path, value). The paths are those of opa-fm 10.10's opafm.xml. An element the file does not have is added
/// after the sibling that [`INSERT_AFTER`] names.
pub const EDITS: &[(&str, &str)] = &[
    // The PM sweeps over GSI (QP1), which the guest's HFIs carry by SDMA: the SM alone needs only VL15 PIO.
    ("Common/Pm/Start", "0"),
    // No syslogd in the guest: everything goes to a file the init and the user can read.
    ("Common/Shared/LogFile", "/var/log/opafm.log"),
    ("Common/Shared/LogMode", "2"),
    // MinRespTimeout 0: each SMP waits the whole RespTimeout, MaxAttempts times. Under TCG a trapped access costs
    // tens of microseconds and the peer's SMA runs in the same slow guest, so the 35 ms start is too short.
    ("Common/Sm/MinRespTimeout", "0"),
    ("Common/Sm/RespTimeout", "1000"),
];

/// (path, sibling): upstream has LogFile commented out just below LogLevel.
pub const INSERT_AFTER: &[(&str, &str)] = &[("Common/Shared/LogFile", "LogLevel")];

/// Settings the guest relies on that must already be so.
pub const EXPECTED: &[(&str, &str)] = &[
    ("Common/Fe/Start", "0"), // no Fabric Executive (it wants TLS certificates and a network)
    ("Fm/Shared/Hfi", "1"),   // fm0 runs on the first HFI ...
    ("Fm/Shared/Port", "1"),
    ("Fm/Shared/PortGUID", "0x0000000000000000"), // ... unless the init names hfi1_0's port GUID at run time
];

/// What ci/guest/init's opafm_use replaces with hfi1_0's port GUID: the first <PortGUID> after the first <Fm>.
const ZERO_GUID: &str = "<PortGUID>0x0000000000000000</PortGUID>";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("malformed XML at byte {at}: {what}")]
    Xml { at: usize, what: &'static str },
    #[error("root element is <{0}>, not <Config>")]
    Root(String),
    #[error("{0} is not in the packaged opafm.xml")]
    Missing(String),
    #[error("{path} is {got:?} in the packaged opafm.xml, expected {want:?}")]
    Unexpected { path: &'static str, got: String, want: &'static str },
    #[error("the first <PortGUID> after <Fm> is not fm0's Shared PortGUID")]
    Fm0PortGuid,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("opafm-config: {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("opafm-config: {path}: {source}")]
    Config { path: String, source: ConfigError },
}

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// The package's opafm.xml.
    input: PathBuf,
    /// Where the edited file goes.
    output: PathBuf,
}

/// Reads IN, edits it and checks the result, and only then writes OUT.
pub fn run(args: &ConfigArgs) -> Result<(), RunError> {
    let input = args.input.display().to_string();
    let text = std::fs::read_to_string(&args.input).map_err(|source| RunError::Io { path: input.clone(), source })?;
    let edited = edit(&text).map_err(|source| RunError::Config { path: input, source })?;
    let output = args.output.display().to_string();
    std::fs::write(&args.output, edited).map_err(|source| RunError::Io { path: output, source })
}

/// The guest's opafm.xml from the package's: [`EXPECTED`] checked, [`EDITS`] applied, fm0's PortGUID placement
/// checked.
pub fn edit(text: &str) -> Result<String, ConfigError> {
    let doc = Doc::parse(text)?;
    let root = doc.name(0);
    if root != "Config" {
        return Err(ConfigError::Root(root.to_owned()));
    }
    for &(path, want) in EXPECTED {
        let el = doc.find(0, path).ok_or_else(|| ConfigError::Missing(path.to_owned()))?;
        let got = doc.text(el)?;
        if got.trim() != want {
            return Err(ConfigError::Unexpected { path, got, want });
        }
    }
    let mut out = text.to_owned();
    // One edit at a time, each on the text the one before left: the spans stay those of a fresh parse.
    for &(path, value) in EDITS {
        let doc = Doc::parse(&out)?;
        let (parent_path, tag) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = doc.find(0, parent_path).ok_or_else(|| ConfigError::Missing(parent_path.to_owned()))?;
        let (span, with) = match doc.child(parent, tag) {
            Some(el) => doc.set_text(el, value),
            None => {
                let after = INSERT_AFTER
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| ConfigError::Missing(path.to_owned()))?;
                let sibling =
                    doc.child(parent, after).ok_or_else(|| ConfigError::Missing(format!("{parent_path}/{after}")))?;
                doc.insert_after(sibling, tag, value)
            }
        };
        out.replace_range(span, &with);
    }
    fm0_port_guid_first(&out)?;
    Ok(out)
}

/// ci/guest/init's opafm_use names the SM's port by replacing the first <PortGUID> after the first <Fm> in the
/// text: that must be fm0's Fm/Shared/PortGUID, still zero.
fn fm0_port_guid_first(text: &str) -> Result<(), ConfigError> {
    let fm0 = text.find("<Fm>").ok_or(ConfigError::Fm0PortGuid)?;
    let after = |from: usize, what: &str| text[from..].find(what).map(|i| from + i);
    let shared = after(fm0, "<Shared>").ok_or(ConfigError::Fm0PortGuid)?;
    let shared_end = after(shared, "</Shared>").ok_or(ConfigError::Fm0PortGuid)?;
    let pg = after(fm0, "<PortGUID>").ok_or(ConfigError::Fm0PortGuid)?;
    if shared < pg && pg < shared_end && text[pg..].starts_with(ZERO_GUID) {
        Ok(())
    } else {
        Err(ConfigError::Fm0PortGuid)
    }
}

/// One element's byte spans in the text.
struct Element {
    name: Range<usize>,
    children: Vec<usize>,
    /// The start tag, `<` to `>`.
    open: Range<usize>,
    /// Where its text (ElementTree's `.text`) ends: the first child element, comment or processing instruction,
    /// or the end tag.
    text_end: usize,
    /// The end tag; empty at `open.end` for `<X/>`.
    close: Range<usize>,
}

impl Element {
    fn self_closing(&self) -> bool {
        self.close.is_empty()
    }
}

/// The elements of an XML document (the root is 0), found by a scan that skips comments, processing
/// instructions, CDATA sections and a DOCTYPE.
struct Doc<'a> {
    text: &'a str,
    elements: Vec<Element>,
}

fn malformed(at: usize, what: &'static str) -> ConfigError {
    ConfigError::Xml { at, what }
}

impl<'a> Doc<'a> {
    fn parse(text: &'a str) -> Result<Self, ConfigError> {
        let find = |from: usize, what: &str, missing: &'static str| {
            text[from..].find(what).map(|i| from + i).ok_or_else(|| malformed(from, missing))
        };
        let mut elements: Vec<Element> = Vec::new();
        let mut stack: Vec<usize> = Vec::new();
        let mut text_end: Vec<Option<usize>> = Vec::new();
        let mut i = 0;
        loop {
            let lt = text[i..].find('<').map_or(text.len(), |o| i + o);
            if stack.is_empty() && !text[i..lt].trim().is_empty() {
                return Err(malformed(i, "text outside the root element"));
            }
            if lt == text.len() {
                break;
            }
            let rest = &text[lt..];
            // A comment or processing instruction ends its parent's text.
            let mut ends_text = true;
            if rest.starts_with("<!--") {
                i = find(lt + 4, "-->", "an unterminated comment")? + 3;
            } else if rest.starts_with("<?") {
                i = find(lt + 2, "?>", "an unterminated processing instruction")? + 2;
            } else if rest.starts_with("<![CDATA[") {
                if stack.is_empty() {
                    return Err(malformed(lt, "a CDATA section outside the root element"));
                }
                i = find(lt + 9, "]]>", "an unterminated CDATA section")? + 3;
                ends_text = false;
            } else if rest.starts_with("<!") {
                if !elements.is_empty() {
                    return Err(malformed(lt, "a declaration after the root element's start"));
                }
                i = declaration_end(text, lt)?;
            } else if let Some(name) = rest.strip_prefix("</") {
                let gt = find(lt, ">", "an unterminated end tag")?;
                let name = name[..gt - lt - 2].trim_end();
                let open = stack.pop().ok_or_else(|| malformed(lt, "an end tag without a start tag"))?;
                if &text[elements[open].name.clone()] != name {
                    return Err(malformed(lt, "an end tag that does not match its start tag"));
                }
                elements[open].text_end = text_end[open].unwrap_or(lt);
                elements[open].close = lt..gt + 1;
                i = gt + 1;
                if stack.is_empty() {
                    // Only comments, processing instructions and white space may follow.
                    if let Some(at) = trailing_element(text, i) {
                        return Err(malformed(at, "a second root element"));
                    }
                }
                ends_text = false;
            } else {
                if stack.is_empty() && !elements.is_empty() {
                    return Err(malformed(lt, "a second root element"));
                }
                let gt = start_tag_end(text, lt)?;
                let name_end =
                    text[lt + 1..gt].find(|c: char| c.is_whitespace() || c == '/').map_or(gt, |o| lt + 1 + o);
                if name_end == lt + 1 {
                    return Err(malformed(lt, "a tag without a name"));
                }
                let self_closing = text[..gt].ends_with('/');
                let el = elements.len();
                if let Some(&parent) = stack.last() {
                    text_end[parent].get_or_insert(lt);
                    elements[parent].children.push(el);
                }
                elements.push(Element {
                    name: lt + 1..name_end,
                    children: Vec::new(),
                    open: lt..gt + 1,
                    text_end: gt + 1,
                    close: gt + 1..gt + 1,
                });
                text_end.push(None);
                if !self_closing {
                    stack.push(el);
                }
                i = gt + 1;
                ends_text = false;
            }
            if ends_text {
                if let Some(&parent) = stack.last() {
                    text_end[parent].get_or_insert(lt);
                }
            }
        }
        if !stack.is_empty() {
            return Err(malformed(text.len(), "an element that is not closed"));
        }
        if elements.is_empty() {
            return Err(malformed(0, "no root element"));
        }
        Ok(Doc { text, elements })
    }

    fn name(&self, el: usize) -> &'a str {
        &self.text[self.elements[el].name.clone()]
    }

    /// The first child element of `el` named `tag`.
    fn child(&self, el: usize, tag: &str) -> Option<usize> {
        self.elements[el].children.iter().copied().find(|&c| self.name(c) == tag)
    }

    /// The element at `path` (names joined by `/`; empty: `el` itself) below `el`.
    fn find(&self, el: usize, path: &str) -> Option<usize> {
        path.split('/').filter(|s| !s.is_empty()).try_fold(el, |at, tag| self.child(at, tag))
    }

    /// ElementTree's `.text`: the character data before the first child node, entities and CDATA resolved.
    fn text(&self, el: usize) -> Result<String, ConfigError> {
        let e = &self.elements[el];
        decode(&self.text[e.open.end..e.text_end], e.open.end)
    }

    /// The splice that sets `el`'s text to `value`.
    fn set_text(&self, el: usize, value: &str) -> (Range<usize>, String) {
        let e = &self.elements[el];
        if e.self_closing() {
            // `<X a="b"/>` becomes `<X a="b">value</X>`.
            let inner = self.text[e.open.start..e.open.end - 2].trim_end();
            (e.open.clone(), format!("{inner}>{}</{}>", escape(value), self.name(el)))
        } else {
            (e.open.end..e.text_end, escape(value))
        }
    }

    /// The splice that adds `<tag>value</tag>` after `sibling`, preceded by the white space that precedes the
    /// sibling's next node (ElementTree: the new element's tail is the sibling's).
    fn insert_after(&self, sibling: usize, tag: &str, value: &str) -> (Range<usize>, String) {
        let end = self.elements[sibling].close.end;
        let tail_end = self.text[end..].find('<').map_or(self.text.len(), |o| end + o);
        (end..end, format!("{}<{tag}>{}</{tag}>", &self.text[end..tail_end], escape(value)))
    }
}

/// The end of a start tag: the first `>` outside a quoted attribute value.
fn start_tag_end(text: &str, lt: usize) -> Result<usize, ConfigError> {
    let mut quote = None;
    for (o, c) in text[lt..].char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if q == c => quote = None,
            (None, '>') => return Ok(lt + o),
            (None, '<') if o > 0 => break,
            _ => {}
        }
    }
    Err(malformed(lt, "an unterminated start tag"))
}

/// The end of a `<!DOCTYPE ...>` declaration, its internal subset in brackets included.
fn declaration_end(text: &str, lt: usize) -> Result<usize, ConfigError> {
    let mut depth = 0usize;
    for (o, c) in text[lt..].char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            '>' if depth == 0 => return Ok(lt + o + 1),
            _ => {}
        }
    }
    Err(malformed(lt, "an unterminated declaration"))
}

/// The position of an element start after the root element's end, if any.
fn trailing_element(text: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(o) = text[i..].find('<') {
        let lt = i + o;
        let rest = &text[lt..];
        let end = if rest.starts_with("<!--") {
            rest.find("-->").map(|e| e + 3)
        } else if rest.starts_with("<?") {
            rest.find("?>").map(|e| e + 2)
        } else {
            return Some(lt);
        };
        // An unterminated comment here is left to the main scan, which reports it.
        i = lt + end?;
    }
    None
}

/// Character data with its entity references and CDATA sections resolved; `at` is its offset in the document.
fn decode(raw: &str, at: usize) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while let Some(o) = raw[i..].find(['&', '<']) {
        let s = i + o;
        out.push_str(&raw[i..s]);
        let rest = &raw[s..];
        if let Some(cdata) = rest.strip_prefix("<![CDATA[") {
            let end = cdata.find("]]>").ok_or_else(|| malformed(at + s, "an unterminated CDATA section"))?;
            out.push_str(&cdata[..end]);
            i = s + 9 + end + 3;
            continue;
        }
        let semi = rest.find(';').ok_or_else(|| malformed(at + s, "an unterminated entity reference"))?;
        let c = match &rest[1..semi] {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            num => num
                .strip_prefix("#x")
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| num.strip_prefix('#').map(str::parse))
                .and_then(Result::ok)
                .and_then(char::from_u32)
                .ok_or_else(|| malformed(at + s, "an unknown entity reference"))?,
        };
        out.push(c);
        i = s + semi + 1;
    }
    out.push_str(&raw[i..]);
    Ok(out)
}

fn escape(value: &str) -> String {
    value.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of opa-fm 10.10's opafm.xml the edits and checks touch, laid out as the package has them: the
    /// commented-out LogFile elements, fm0 and fm1 with their Shared PortGUIDs, a PortGUID in Common before the
    /// first <Fm>.
    const FIXTURE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<Config>
<!-- Common FM configuration -->
<Common>
  <Applications>
    <!-- A PortGUID: <PortGUID>0x123567</PortGUID> -->
    <PortGUID>0x123567812345678</PortGUID>
  </Applications>
  <Shared>
    <LogLevel>2</LogLevel>

    <!-- <LogFile>/var/log/fm.log</LogFile> --> <!-- log for all instances -->

    <LogMode>0</LogMode>
  </Shared>
  <Sm>
    <Start>1</Start> <!-- default SM startup for all instances -->
    <RespTimeout>250</RespTimeout> <!-- in milliseconds -->
    <MinRespTimeout>35</MinRespTimeout> <!-- in milliseconds -->
    <NonRespTimeout>600</NonRespTimeout> <!-- in seconds -->
  </Sm>
  <Fe>
    <Start>0</Start> <!-- default FE startup for all instances -->
  </Fe>
  <Pm>
    <Start>1</Start> <!-- default PM startup for all instances -->
    <RespTimeout>250</RespTimeout>
  </Pm>
</Common>
<!-- Instance 0 of the FM -->
<Fm>
  <Shared>
    <Start>1</Start>
    <Hfi>1</Hfi> <!-- local HFI to use for FM instance, 1=1st HFI -->
    <Port>1</Port> <!-- local HFI port to use for FM instance, 1=1st Port -->
    <PortGUID>0x0000000000000000</PortGUID> <!-- local port to use for FM -->
    <!-- <LogFile>/var/log/fm0_log</LogFile> --> <!-- log for this instance -->
  </Shared>
  <Sm>
  </Sm>
</Fm>
<Fm>
  <Shared>
    <Start>0</Start>
    <Hfi>1</Hfi>
    <Port>2</Port>
    <PortGUID>0x0000000000000000</PortGUID>
  </Shared>
</Fm>
</Config>
"#;

    /// FIXTURE with each edit applied by hand: Pm/Start 0, a LogFile after LogLevel (the blank line after LogLevel
    /// repeated after it), LogMode 2, Sm's MinRespTimeout 0 and RespTimeout 1000; nothing else changed.
    const EDITED: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<Config>
<!-- Common FM configuration -->
<Common>
  <Applications>
    <!-- A PortGUID: <PortGUID>0x123567</PortGUID> -->
    <PortGUID>0x123567812345678</PortGUID>
  </Applications>
  <Shared>
    <LogLevel>2</LogLevel>

    <LogFile>/var/log/opafm.log</LogFile>

    <!-- <LogFile>/var/log/fm.log</LogFile> --> <!-- log for all instances -->

    <LogMode>2</LogMode>
  </Shared>
  <Sm>
    <Start>1</Start> <!-- default SM startup for all instances -->
    <RespTimeout>1000</RespTimeout> <!-- in milliseconds -->
    <MinRespTimeout>0</MinRespTimeout> <!-- in milliseconds -->
    <NonRespTimeout>600</NonRespTimeout> <!-- in seconds -->
  </Sm>
  <Fe>
    <Start>0</Start> <!-- default FE startup for all instances -->
  </Fe>
  <Pm>
    <Start>0</Start> <!-- default PM startup for all instances -->
    <RespTimeout>250</RespTimeout>
  </Pm>
</Common>
<!-- Instance 0 of the FM -->
<Fm>
  <Shared>
    <Start>1</Start>
    <Hfi>1</Hfi> <!-- local HFI to use for FM instance, 1=1st HFI -->
    <Port>1</Port> <!-- local HFI port to use for FM instance, 1=1st Port -->
    <PortGUID>0x0000000000000000</PortGUID> <!-- local port to use for FM -->
    <!-- <LogFile>/var/log/fm0_log</LogFile> --> <!-- log for this instance -->
  </Shared>
  <Sm>
  </Sm>
</Fm>
<Fm>
  <Shared>
    <Start>0</Start>
    <Hfi>1</Hfi>
    <Port>2</Port>
    <PortGUID>0x0000000000000000</PortGUID>
  </Shared>
</Fm>
</Config>
"#;

    /// FIXTURE with the first occurrence of `from` replaced by `to`.
    fn fixture_with(from: &str, to: &str) -> String {
        assert!(FIXTURE.contains(from), "the fixture has no {from:?}");
        FIXTURE.replacen(from, to, 1)
    }

    #[test]
    fn each_edit_is_applied_and_every_other_byte_is_kept() {
        assert_eq!(edit(FIXTURE).as_deref(), Ok(EDITED));
    }

    #[test]
    fn an_element_that_is_already_there_is_edited_in_place_not_inserted() {
        let with_logfile = fixture_with("<LogMode>0</LogMode>", "<LogFile>/x</LogFile><LogMode>0</LogMode>");
        let out = edit(&with_logfile).unwrap();
        assert!(out.contains("<LogFile>/var/log/opafm.log</LogFile><LogMode>2</LogMode>"), "{out}");
        assert_eq!(out.matches("<LogFile>/var/log/opafm.log</LogFile>").count(), 1);
        assert!(out.contains("<LogLevel>2</LogLevel>\n\n    <!-- <LogFile>"), "{out}");
    }

    #[test]
    fn a_self_closing_element_gets_the_value_as_its_text() {
        let out = edit(&fixture_with("<LogMode>0</LogMode>", "<LogMode a=\"/>\" />")).unwrap();
        assert!(out.contains("<LogMode a=\"/>\">2</LogMode>"), "{out}");
    }

    #[test]
    fn what_the_packaged_file_must_have_or_be_is_checked() {
        use ConfigError::*;
        let missing = |p: &str| Err(Missing(p.into()));
        #[rustfmt::skip]
        let cases: &[(&str, &str, &str, Result<(), ConfigError>)] = &[
            ("a missing edited element is an error", "<MinRespTimeout>35</MinRespTimeout>", "", missing("Common/Sm/MinRespTimeout")),
            ("a missing parent of an edited element is an error",
                "<Pm>\n    <Start>1</Start> <!-- default PM startup for all instances -->\n    <RespTimeout>250</RespTimeout>\n  </Pm>",
                "", missing("Common/Pm")),
            ("a missing expected element is an error", "<Port>1</Port>", "", missing("Fm/Shared/Port")),
            ("the sibling to insert after must be there", "<LogLevel>2</LogLevel>", "", missing("Common/Shared/LogLevel")),
            ("a commented-out element is not matched", "<LogLevel>2</LogLevel>", "<!-- <LogLevel>2</LogLevel> -->", missing("Common/Shared/LogLevel")),
            ("an expected value that differs is an error", "<Start>0</Start> <!-- default FE", "<Start>1</Start> <!-- default FE",
                Err(Unexpected { path: "Common/Fe/Start", got: "1".into(), want: "0" })),
            ("fm0's settings are the first <Fm>'s", "<Port>1</Port>", "<Port>2</Port>",
                Err(Unexpected { path: "Fm/Shared/Port", got: "2".into(), want: "1" })),
            ("an expected value is compared without its white space", "<Hfi>1</Hfi> <!-- local", "<Hfi>\n 1 </Hfi> <!-- local", Ok(())),
            ("an expected value's entities are resolved", "<Hfi>1</Hfi> <!-- local", "<Hfi>&#x31;</Hfi> <!-- local", Ok(())),
            ("fm0's PortGUID must be after its Shared's start", "<Fm>\n  <Shared>",
                "<Fm>\n  <Name><PortGUID>0x0000000000000000</PortGUID></Name>\n  <Shared>", Err(Fm0PortGuid)),
            ("a PortGUID in a comment in fm0 before its Shared is still the init's first", "<Fm>\n  <Shared>",
                "<Fm>\n  <!-- <PortGUID>0x0000000000000000</PortGUID> -->\n  <Shared>", Err(Fm0PortGuid)),
            ("an end tag left out is malformed", "</Fm>\n<Fm>", "\n<Fm>",
                Err(Xml { at: FIXTURE.len() - "</Fm>".len() - "</Config>\n".len(), what: "an end tag that does not match its start tag" })),
        ];
        for (name, from, to, want) in cases {
            let got = edit(&fixture_with(from, to)).map(|_| ());
            assert_eq!(&got, want, "{name}");
        }
    }

    #[test]
    fn the_root_must_be_config() {
        assert_eq!(edit(&FIXTURE.replace("Config>", "Conf>")), Err(ConfigError::Root("Conf".into())));
    }

    #[test]
    fn malformed_documents_are_errors_not_panics() {
        for text in
            ["", "<", "<Config", "<Config></Fm>", "</Config>", "<Config/><Config/>", "x<Config/>", "<Config><!--"]
        {
            assert!(matches!(Doc::parse(text), Err(ConfigError::Xml { .. })), "{text:?}");
        }
    }

    #[test]
    fn the_paths_step_to_the_first_child_of_each_name() {
        let doc = Doc::parse(FIXTURE).unwrap();
        let text = |path| doc.find(0, path).map(|el| doc.text(el).unwrap());
        assert_eq!(text("Fm/Shared/Port").as_deref(), Some("1"));
        assert_eq!(text("Common/Sm/RespTimeout").as_deref(), Some("250"));
        assert_eq!(text("Common/Pm/RespTimeout").as_deref(), Some("250"));
        assert_eq!(text("Common/Applications/PortGUID").as_deref(), Some("0x123567812345678"));
        assert_eq!(text("Common/Shared/LogFile"), None);
        assert_eq!(text("Shared/LogLevel"), None);
    }
}
