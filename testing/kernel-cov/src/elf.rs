//! Just enough of the module's ELF (x86-64, little-endian, relocatable) to turn the hook's text offsets back
//! into sections: where the kernel's module loader puts each executable section inside MOD_TEXT, and where
//! the compiler put the calls to `__sanitizer_cov_trace_pc` (every call site the module has).

use std::ops::Range;

pub const TRACE_PC: &str = "__sanitizer_cov_trace_pc";

const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHF_ALLOC: u64 = 0x2;
const SHF_EXECINSTR: u64 = 0x4;
/// x86-64 relocations a `call rel32` to an external function gets.
const R_X86_64_PC32: u32 = 2;
const R_X86_64_PLT32: u32 = 4;
/// `call rel32`; a `jmp rel32` is 0xe9.
const CALL_REL32: u8 = 0xe8;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not a little-endian ELF64 file")]
    NotElf64,
    #[error("{what} at {offset:#x} lies outside the file ({len} bytes)")]
    Truncated { what: &'static str, offset: u64, len: usize },
    #[error("section name at {0:#x} is not valid UTF-8")]
    Name(u64),
}

#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub kind: u32,
    pub flags: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub addralign: u64,
    pub entsize: u64,
}

/// An executable section as the loader places it: `start` is its offset inside MOD_TEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub section: usize,
    pub name: String,
    pub start: u64,
    pub size: u64,
}

pub struct Module<'a> {
    data: &'a [u8],
    pub sections: Vec<Section>,
}

fn slice<'a>(data: &'a [u8], what: &'static str, offset: u64, len: u64) -> Result<&'a [u8], ElfError> {
    let end = offset.checked_add(len);
    match end {
        Some(end) if end <= data.len() as u64 => Ok(&data[offset as usize..end as usize]),
        _ => Err(ElfError::Truncated { what, offset, len: data.len() }),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn c_str<'a>(data: &'a [u8], what: &'static str, offset: u64) -> Result<&'a str, ElfError> {
    let tail = slice(data, what, offset, 0).map(|_| &data[offset as usize..])?;
    let end = tail.iter().position(|&b| b == 0).ok_or(ElfError::Truncated { what, offset, len: data.len() })?;
    std::str::from_utf8(&tail[..end]).map_err(|_| ElfError::Name(offset))
}

impl<'a> Module<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Module<'a>, ElfError> {
        let ident = slice(data, "ELF header", 0, 64)?;
        // EI_CLASS 2 = ELFCLASS64, EI_DATA 1 = little-endian.
        if &ident[..4] != b"\x7fELF" || ident[4] != 2 || ident[5] != 1 {
            return Err(ElfError::NotElf64);
        }
        let shoff = u64_at(ident, 0x28);
        let shentsize = u64::from(u16_at(ident, 0x3a));
        let shnum = u64::from(u16_at(ident, 0x3c));
        let shstrndx = u64::from(u16_at(ident, 0x3e));
        if shentsize < 64 {
            return Err(ElfError::NotElf64);
        }
        let table = slice(data, "section headers", shoff, shentsize * shnum)?;
        let raw: Vec<(u32, Section)> = table
            .chunks_exact(shentsize as usize)
            .map(|h| {
                let s = Section {
                    name: String::new(),
                    kind: u32_at(h, 4),
                    flags: u64_at(h, 8),
                    offset: u64_at(h, 0x18),
                    size: u64_at(h, 0x20),
                    link: u32_at(h, 0x28),
                    info: u32_at(h, 0x2c),
                    addralign: u64_at(h, 0x30),
                    entsize: u64_at(h, 0x38),
                };
                (u32_at(h, 0), s)
            })
            .collect();
        let strtab = raw.get(shstrndx as usize).map(|(_, s)| s.offset).ok_or(ElfError::NotElf64)?;
        let sections = raw
            .into_iter()
            .map(|(name_off, mut s)| {
                s.name = c_str(data, "section name", strtab + u64::from(name_off))?.to_string();
                Ok(s)
            })
            .collect::<Result<_, ElfError>>()?;
        Ok(Module { data, sections })
    }

    /// The executable sections in MOD_TEXT, placed as the module loader does (kernel/module/main.c
    /// layout_sections and module_get_offset_and_type): in section-header order, each aligned to its
    /// sh_addralign after the previous one; `.init*` sections go to MOD_INIT_TEXT instead.
    pub fn text_layout(&self) -> Vec<Placed> {
        let mut size = 0u64;
        let mut placed = Vec::new();
        for (i, s) in self.sections.iter().enumerate() {
            if s.flags & (SHF_ALLOC | SHF_EXECINSTR) != SHF_ALLOC | SHF_EXECINSTR || s.name.starts_with(".init") {
                continue;
            }
            let start = size.next_multiple_of(s.addralign.max(1));
            size = start + s.size;
            placed.push(Placed { section: i, name: s.name.clone(), start, size: s.size });
        }
        placed
    }

    /// Every call site of the trace-pc hook in MOD_TEXT, as the hook records it: the return address's offset
    /// (the relocated rel32 field's offset + 4, the end of the 5-byte `call`), sorted. A `jmp` to the hook (a
    /// sibling call, which ci/build-hfi1-module.sh's -fno-optimize-sibling-calls rules out) is no call site:
    /// the hook would record its caller's return address.
    pub fn call_sites(&self) -> Result<Vec<u32>, ElfError> {
        let layout = self.text_layout();
        let mut sites = Vec::new();
        for rela in self.sections.iter().filter(|s| s.kind == SHT_RELA) {
            let Some(target) = layout.iter().find(|p| p.section == rela.info as usize) else { continue };
            let symtab = self.sections.get(rela.link as usize).filter(|s| s.kind == SHT_SYMTAB);
            let Some(symtab) = symtab else { continue };
            let strtab = self.sections.get(symtab.link as usize).map_or(0, |s| s.offset);
            let syms = slice(self.data, "symbol table", symtab.offset, symtab.size)?;
            let entries = slice(self.data, "relocations", rela.offset, rela.size)?;
            for r in entries.chunks_exact(24) {
                let (r_offset, r_info) = (u64_at(r, 0), u64_at(r, 8));
                if !matches!(r_info as u32, R_X86_64_PC32 | R_X86_64_PLT32) {
                    continue;
                }
                let sym = (r_info >> 32) as usize * 24;
                if sym + 24 > syms.len() {
                    return Err(ElfError::Truncated {
                        what: "symbol",
                        offset: symtab.offset + sym as u64,
                        len: self.data.len(),
                    });
                }
                let Some(at) = r_offset.checked_sub(1) else { continue };
                let text = &self.sections[target.section];
                let opcode = slice(self.data, "call instruction", text.offset.saturating_add(at), 1)?[0];
                if opcode == CALL_REL32
                    && c_str(self.data, "symbol name", strtab + u64::from(u32_at(syms, sym)))? == TRACE_PC
                {
                    sites.push((target.start + r_offset + 4) as u32);
                }
            }
        }
        sites.sort_unstable();
        Ok(sites)
    }

    /// The section a text offset falls in, and the offset inside it.
    pub fn locate(layout: &[Placed], text_offset: u64) -> Option<(&Placed, u64)> {
        layout
            .iter()
            .find(|p| (Range { start: p.start, end: p.start + p.size }).contains(&text_offset))
            .map(|p| (p, text_offset - p.start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHT_PROGBITS: u32 = 1;
    const SHT_STRTAB: u32 = 3;
    const SHF_WRITE: u64 = 0x1;
    const AX: u64 = SHF_ALLOC | SHF_EXECINSTR;

    struct Sec {
        name: &'static str,
        kind: u32,
        flags: u64,
        align: u64,
        data: Vec<u8>,
        link: u32,
        info: u32,
    }

    fn sec(name: &'static str, kind: u32, flags: u64, align: u64, data: Vec<u8>) -> Sec {
        Sec { name, kind, flags, align, data, link: 0, info: 0 }
    }

    /// `size` bytes of text with `call rel32` (0xe8) or `jmp rel32` (0xe9) opcodes at the given offsets.
    fn text(size: usize, insns: &[(usize, u8)]) -> Vec<u8> {
        let mut t = vec![0x90; size];
        for &(at, op) in insns {
            t[at] = op;
        }
        t
    }

    fn rela(entries: &[(u64, u64, u32)]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|&(off, sym, kind)| {
                let mut e = off.to_le_bytes().to_vec();
                e.extend((sym << 32 | u64::from(kind)).to_le_bytes());
                e.extend((-4i64).to_le_bytes());
                e
            })
            .collect()
    }

    /// A relocatable ELF64 with the given sections after the null one, then .symtab (null, the hook, `foo`),
    /// .strtab and .shstrtab; relocation sections name the symtab through `link`.
    fn elf(mut secs: Vec<Sec>) -> Vec<u8> {
        let symtab_idx = secs.len() as u32 + 1;
        let strtab = b"\0__sanitizer_cov_trace_pc\0foo\0".to_vec();
        let mut syms = vec![0u8; 24];
        for name in [1u32, 26] {
            let mut s = vec![0u8; 24];
            s[..4].copy_from_slice(&name.to_le_bytes());
            syms.extend(s);
        }
        for s in secs.iter_mut().filter(|s| s.kind == SHT_RELA) {
            s.link = symtab_idx;
        }
        let mut symtab = sec(".symtab", SHT_SYMTAB, 0, 8, syms);
        symtab.link = symtab_idx + 1;
        secs.push(symtab);
        secs.push(sec(".strtab", SHT_STRTAB, 0, 1, strtab));
        let mut shstr = vec![0u8];
        let names: Vec<u32> = secs
            .iter()
            .chain(std::iter::once(&sec(".shstrtab", SHT_STRTAB, 0, 1, vec![])))
            .map(|s| {
                let at = shstr.len() as u32;
                shstr.extend(s.name.as_bytes());
                shstr.push(0);
                at
            })
            .collect();
        secs.push(sec(".shstrtab", SHT_STRTAB, 0, 1, shstr));

        let mut out = vec![0u8; 64];
        let mut offsets = Vec::new();
        for s in &secs {
            offsets.push(out.len() as u64);
            out.extend(&s.data);
        }
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let shoff = out.len() as u64;
        out.extend([0u8; 64]);
        for (i, s) in secs.iter().enumerate() {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&names[i].to_le_bytes());
            h[4..8].copy_from_slice(&s.kind.to_le_bytes());
            h[8..16].copy_from_slice(&s.flags.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&offsets[i].to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(s.data.len() as u64).to_le_bytes());
            h[0x28..0x2c].copy_from_slice(&s.link.to_le_bytes());
            h[0x2c..0x30].copy_from_slice(&s.info.to_le_bytes());
            h[0x30..0x38].copy_from_slice(&s.align.to_le_bytes());
            out.extend(h);
        }
        out[..6].copy_from_slice(b"\x7fELF\x02\x01");
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&(secs.len() as u16 + 1).to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&(secs.len() as u16).to_le_bytes());
        out
    }

    /// Sections 1-8; the hook is symbol 1, `foo` symbol 2.
    fn module() -> Vec<u8> {
        let mut rela_text = sec(
            ".rela.text",
            SHT_RELA,
            0,
            8,
            rela(&[(0x11, 1, R_X86_64_PLT32), (0x21, 1, R_X86_64_PLT32), (0x31, 2, R_X86_64_PLT32)]),
        );
        rela_text.info = 1;
        let mut rela_init = sec(".rela.init.text", SHT_RELA, 0, 8, rela(&[(0x1, 1, R_X86_64_PLT32)]));
        rela_init.info = 3;
        let mut rela_static = sec(".rela.static_call.text", SHT_RELA, 0, 8, rela(&[(0x1, 1, R_X86_64_PC32)]));
        rela_static.info = 7;
        elf(vec![
            sec(".text", SHT_PROGBITS, AX, 16, text(0x40, &[(0x10, 0xe8), (0x20, 0xe9), (0x30, 0xe8)])),
            rela_text,
            sec(".init.text", SHT_PROGBITS, AX, 16, text(0x10, &[(0, 0xe8)])),
            rela_init,
            sec(".altinstr_replacement", SHT_PROGBITS, AX, 1, text(3, &[])),
            sec(".data", SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, 64, vec![0; 0x20]),
            sec(".static_call.text", SHT_PROGBITS, AX, 4, text(8, &[(0, 0xe8)])),
            rela_static,
        ])
    }

    #[test]
    fn executable_sections_are_placed_in_header_order_each_at_its_alignment_init_text_apart() {
        let data = module();
        let m = Module::parse(&data).unwrap();
        let layout = m.text_layout();
        let got: Vec<(&str, u64, u64)> = layout.iter().map(|p| (p.name.as_str(), p.start, p.size)).collect();
        // layout_sections: .text at 0; .altinstr_replacement (align 1) right after; .static_call.text at the
        // next multiple of 4; .init.text goes to MOD_INIT_TEXT and .data is not executable.
        assert_eq!(got, vec![(".text", 0, 0x40), (".altinstr_replacement", 0x40, 3), (".static_call.text", 0x44, 8)]);
    }

    #[test]
    fn call_sites_are_the_return_addresses_of_calls_to_the_hook_in_module_text() {
        let data = module();
        let m = Module::parse(&data).unwrap();
        // .text: the call at 0x10 returns to 0x15; the jmp at 0x20 (a sibling call) and the call of foo at
        // 0x30 are no sites. .static_call.text (at 0x44): its call at 0 returns to 0x49. .init.text: not text.
        assert_eq!(m.call_sites().unwrap(), vec![0x15, 0x49]);
    }

    #[test]
    fn a_text_offset_is_located_in_its_section() {
        let data = module();
        let layout = Module::parse(&data).unwrap().text_layout();
        let cases: &[(u64, Option<(&str, u64)>)] = &[
            (0x0, Some((".text", 0))),
            (0x3f, Some((".text", 0x3f))),
            (0x42, Some((".altinstr_replacement", 2))),
            (0x43, None), // alignment padding
            (0x48, Some((".static_call.text", 4))),
            (0x4c, None),
        ];
        for &(off, want) in cases {
            let got = Module::locate(&layout, off).map(|(p, inner)| (p.name.as_str(), inner));
            assert_eq!(got, want, "offset {off:#x}");
        }
    }

    #[test]
    fn truncated_or_foreign_files_are_errors_not_panics() {
        let data = module();
        assert_eq!(
            Module::parse(b"\x7fELF").err(),
            Some(ElfError::Truncated { what: "ELF header", offset: 0, len: 4 })
        );
        let mut elf32 = data.clone();
        elf32[4] = 1;
        assert_eq!(Module::parse(&elf32).err(), Some(ElfError::NotElf64));
        for cut in [100, data.len() / 2, data.len() - 1] {
            let _ = Module::parse(&data[..cut]).map(|m| m.call_sites());
        }
    }
}
