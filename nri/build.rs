//! Generates the NRI messages (rust-protobuf) and the ttrpc services (async
//! client and server) from `proto/api.proto` into `OUT_DIR`.
//!
//! Both generators emit whole-file inner attributes (`#![allow(...)]`,
//! `//!` docs). `include!` cannot take inner attributes, so they are dropped
//! here; `src/api.rs` puts the equivalent `#[allow]`s on the modules that
//! include the files instead.

use std::{
    env, fs, io,
    path::{Path, PathBuf},
};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

const PROTO: &str = "proto/api.proto";
const GENERATED: [&str; 2] = ["api.rs", "api_ttrpc.rs"];

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed={PROTO}");
    let out = PathBuf::from(
        env::var_os("OUT_DIR").ok_or_else(|| io::Error::other("OUT_DIR is not set"))?,
    );
    let raw = out.join("raw");
    fs::create_dir_all(&raw)?;

    Codegen::new()
        .out_dir(&raw)
        .input(PROTO)
        .include("proto")
        .rust_protobuf()
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .customize(Customize {
            async_client: true,
            async_server: true,
            ..Default::default()
        })
        .run()?;

    for name in GENERATED {
        strip_inner_attributes(&raw.join(name), &out.join(name))?;
    }
    Ok(())
}

/// Copies `from` to `to` without the lines that are inner attributes or inner
/// doc comments; everything else is kept byte for byte.
fn strip_inner_attributes(from: &Path, to: &Path) -> io::Result<()> {
    let text = fs::read_to_string(from)?;
    let kept: String = text
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !(line.starts_with("#![") || line.starts_with("//!"))
        })
        .flat_map(|line| [line, "\n"])
        .collect();
    fs::write(to, kept)
}
