//! A BPF_PROG_TYPE_CGROUP_DEVICE program from a [`Ruleset`].
//!
//! The kernel runs the program with `struct bpf_cgroup_dev_ctx` in r1
//! (include/uapi/linux/bpf.h: `u32 access_type` = access << 16 | type,
//! `u32 major`, `u32 minor`) and allows the access when it returns 1
//! (kernel/bpf/cgroup.c `__cgroup_bpf_check_dev_permission`). Layout:
//!
//! ```text
//! r2 = type; r3 = access; r4 = major; r5 = minor
//! per exception: if type, access, major, minor match: r0 = verdict; exit
//! r0 = default; exit
//! ```
//!
//! An access matches an exception when every requested bit is in the
//! exception's access, as runc's generated programs match.

use super::rules::{Access, DevType, Rule, Ruleset};

/// The kernel's per-program limit for unprivileged loads is 4096
/// instructions (include/linux/bpf.h `BPF_MAXINSNS`); stay under it.
pub const MAX_INSNS: usize = 4096;

/// One `struct bpf_insn` (include/uapi/linux/bpf.h): opcode, dst and src
/// registers in one byte (dst in the low nibble on little-endian), a signed
/// 16-bit offset and a signed 32-bit immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcode parts (include/uapi/linux/bpf_common.h, bpf.h).
const BPF_LDX: u8 = 0x01;
const BPF_ALU: u8 = 0x04;
const BPF_JMP: u8 = 0x05;
const BPF_W: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_K: u8 = 0x00;
const BPF_X: u8 = 0x08;
const BPF_AND: u8 = 0x50;
const BPF_RSH: u8 = 0x70;
const BPF_MOV: u8 = 0xb0;
const BPF_JNE: u8 = 0x50;
const BPF_EXIT: u8 = 0x90;

// `BPF_DEVCG_DEV_*` in include/uapi/linux/bpf.h.
const DEV_BLOCK: i32 = 1;
const DEV_CHAR: i32 = 2;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R5: u8 = 5;

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        }
    }

    /// `dst = *(u32 *)(src + off)`
    const fn load_word(dst: u8, src: u8, off: i16) -> Insn {
        Insn::new(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0)
    }

    const fn alu32_imm(op: u8, dst: u8, imm: i32) -> Insn {
        Insn::new(BPF_ALU | op | BPF_K, dst, 0, 0, imm)
    }

    const fn mov32_reg(dst: u8, src: u8) -> Insn {
        Insn::new(BPF_ALU | BPF_MOV | BPF_X, dst, src, 0, 0)
    }

    /// `if dst != imm goto pc + 1 + off`
    const fn jne_imm(dst: u8, imm: i32, off: i16) -> Insn {
        Insn::new(BPF_JMP | BPF_JNE | BPF_K, dst, 0, off, imm)
    }

    /// `if dst != src goto pc + 1 + off`
    const fn jne_reg(dst: u8, src: u8, off: i16) -> Insn {
        Insn::new(BPF_JMP | BPF_JNE | BPF_X, dst, src, off, 0)
    }

    const fn exit() -> Insn {
        Insn::new(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
    }

    /// The 8 bytes the kernel reads, little-endian as on every host this
    /// builds for.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

/// Reads the context into r2..r5.
const PROLOGUE: [Insn; 6] = [
    Insn::load_word(R2, R1, 0),
    Insn::alu32_imm(BPF_AND, R2, 0xffff),
    Insn::load_word(R3, R1, 0),
    Insn::alu32_imm(BPF_RSH, R3, 16),
    Insn::load_word(R4, R1, 4),
    Insn::load_word(R5, R1, 8),
];

/// Why a rule set cannot become a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("{count} device exceptions need more than {MAX_INSNS} instructions")]
    TooLarge { count: usize },
}

/// One exception's block, ending in `r0 = verdict; exit`.
fn block(rule: &Rule) -> Vec<Insn> {
    let kind = match rule.kind {
        DevType::Block => DEV_BLOCK,
        DevType::Char => DEV_CHAR,
        // `a` rules reset the list and never become exceptions (rules.rs).
        DevType::All => unreachable_kind(),
    };
    // Tests first, each jumping past the block's end when it fails; the
    // offsets are filled in once the block's length is known.
    let mut tests = vec![Insn::jne_imm(R2, kind, 0)];
    if rule.access != Access::ALL {
        tests.push(Insn::mov32_reg(R1, R3));
        tests.push(Insn::alu32_imm(BPF_AND, R1, i32::from(rule.access.0)));
        tests.push(Insn::jne_reg(R1, R3, 0));
    }
    if let Some(major) = rule.major {
        tests.push(Insn::jne_imm(R4, major as i32, 0));
    }
    if let Some(minor) = rule.minor {
        tests.push(Insn::jne_imm(R5, minor as i32, 0));
    }
    let len = tests.len() + 2;
    for (i, insn) in tests.iter_mut().enumerate() {
        if insn.code & 0x07 == BPF_JMP {
            // Jump to the first instruction after this block.
            insn.off = (len - i - 1) as i16;
        }
    }
    tests.push(Insn::alu32_imm(BPF_MOV, R0, i32::from(rule.allow)));
    tests.push(Insn::exit());
    tests
}

/// Exceptions never hold `a` (see [`Ruleset::apply`]); should one appear,
/// matching no type is the fail-closed reading of it for an allow list.
const fn unreachable_kind() -> i32 {
    -1
}

/// The program for `set`.
pub fn generate(set: &Ruleset) -> Result<Vec<Insn>, ProgramError> {
    let mut out = PROLOGUE.to_vec();
    for (i, rule) in set.exceptions().enumerate() {
        out.extend(block(&rule));
        if out.len() + 2 > MAX_INSNS {
            return Err(ProgramError::TooLarge { count: i + 1 });
        }
    }
    out.push(Insn::alu32_imm(BPF_MOV, R0, i32::from(set.default_allow)));
    out.push(Insn::exit());
    Ok(out)
}

/// The program as the kernel takes it.
pub fn to_bytes(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_bytes()).collect()
}
