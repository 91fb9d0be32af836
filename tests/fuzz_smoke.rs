//! A short, deterministic version of the fuzz runs for CI: the fuzz targets'
//! own checks (`fuzz/checks.rs`) over the seed corpus and mutations of it.
//! The long runs (10 M executions each) are recorded in docs/fuzzing.md.
#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::Path;

/// xorshift64*: reproducible mutations without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b"\"minor\":",
    b"-1",
    b"\"gpu\"",
    b"\"rdma\"",
    b"\"vfs\"",
    b"\"busID\":\"0000:19:00.2\"",
    b"\"koordinator.sh/gpu-core\":\"50\"",
    b"\"16Gi\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"\"..\"",
    b"99999999999",
    b"\"id\":\"GPU-",
    b"\\u0000",
    b"1e9",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(4) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = rng.next() as u8;
            }
            1 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            2 => v.truncate(at),
            _ => {
                let end = (at + rng.below(16)).min(v.len());
                v.drain(at..end);
            }
        }
    }
    v
}

fn seeds(dir: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(dir);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.expect("seed entry").path()).expect("read seed"))
        .collect();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out.sort();
    out
}

fn smoke(dir: &str, runs: usize, check: fn(&[u8])) {
    let seeds = seeds(dir);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for s in &seeds {
        check(s);
    }
    for _ in 0..runs {
        let s = &seeds[rng.below(seeds.len())];
        check(&mutate(&mut rng, s));
    }
}

#[test]
fn allocation_parser_survives_mutated_seeds() {
    smoke("allocation", 20_000, checks::allocation);
}

#[test]
fn plan_survives_mutated_seeds() {
    smoke("plan", 10_000, checks::plan);
}

#[test]
fn hook_state_survives_mutated_seeds() {
    smoke("hook_state", 20_000, checks::hook_state);
}

#[test]
fn nri_request_decoding_survives_mutated_seeds() {
    smoke("nri_request", 30_000, checks::nri_request);
}
