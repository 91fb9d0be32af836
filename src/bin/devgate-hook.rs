//! `devgate-hook <stage>`: the OCI hook.
fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("devgate-hook {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    eprintln!("devgate-hook: not built yet");
    std::process::exit(1);
}
