//! How an executable is linked, read from its ELF program headers (ELF-64,
//! little-endian: the only kind this project builds). A program with a
//! `PT_INTERP` header asks the kernel for a dynamic loader (fs/binfmt_elf.c
//! `load_elf_binary`); one without it, and position-independent (`ET_DYN`), is
//! static-pie. Reads only the headers, so that a measuring harness does not
//! grow by the size of the file.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const PT_INTERP: u64 = 3;
const ET_DYN: u64 = 3;
/// Bounds on what is read: an ELF-64 program header is 56 bytes; loader paths
/// are short.
const MAX_PHNUM: u64 = 256;
const MAX_INTERP: u64 = 4096;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ElfError {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linking {
    /// Runs under this dynamic loader.
    Dynamic(String),
    /// No loader; `pie` when it is position-independent.
    Static { pie: bool },
}

fn read_at(f: &File, at: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; len as usize];
    f.read_exact_at(&mut buf, at)?;
    Ok(buf)
}

fn u16_at(b: &[u8], o: usize) -> u64 {
    u16::from_le_bytes([b[o], b[o + 1]]).into()
}

fn u32_at(b: &[u8], o: usize) -> u64 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes")).into()
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Reads the program headers of `path`.
pub fn linking(path: &Path) -> Result<Linking, ElfError> {
    let fail = |reason: String| ElfError {
        path: path.to_path_buf(),
        reason,
    };
    let io = |e: std::io::Error| fail(e.to_string());
    let f = File::open(path).map_err(io)?;
    let eh = read_at(&f, 0, 64).map_err(io)?;
    if &eh[..6] != b"\x7fELF\x02\x01" {
        return Err(fail("not a little-endian ELF-64 file".into()));
    }
    let (e_type, phoff, phentsize, phnum) = (
        u16_at(&eh, 16),
        u64_at(&eh, 32),
        u16_at(&eh, 54),
        u16_at(&eh, 56),
    );
    if phentsize < 56 || phnum > MAX_PHNUM {
        return Err(fail("implausible program headers".into()));
    }
    let phs = read_at(&f, phoff, phentsize * phnum).map_err(io)?;
    for ph in phs.chunks_exact(phentsize as usize) {
        if u32_at(ph, 0) != PT_INTERP {
            continue;
        }
        let (offset, size) = (u64_at(ph, 8), u64_at(ph, 32).min(MAX_INTERP));
        let name = read_at(&f, offset, size).map_err(io)?;
        let name = name.strip_suffix(b"\0").unwrap_or(&name);
        return Ok(Linking::Dynamic(String::from_utf8_lossy(name).into_owned()));
    }
    Ok(Linking::Static {
        pie: e_type == ET_DYN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_program_is_dynamically_linked() {
        let exe = std::env::current_exe().unwrap();
        assert!(matches!(linking(&exe), Ok(Linking::Dynamic(l)) if l.starts_with('/')));
    }

    #[test]
    fn what_is_not_elf_or_is_cut_short_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for (name, bytes) in [
            ("script", b"#!/bin/sh\n".to_vec()),
            ("empty", Vec::new()),
            ("header-only", exe[..64].to_vec()),
            ("elf32", b"\x7fELF\x01\x01".to_vec()),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            assert!(linking(&path).is_err(), "{name}");
        }
    }
}
