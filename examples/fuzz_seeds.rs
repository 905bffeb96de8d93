//! Writes the fuzz targets' starting corpora (`scripts/fuzz.sh` runs it): a valid call of
//! every method in both protocols, and each as a connection's bytes in every transport
//! (`foqs::rpc::mangle`, the shapes the randomized decoder test uses too).
//!
//!   cargo run --example fuzz_seeds -- DIR     writes DIR/<target>/seed-N

use std::path::Path;

use foqs::rpc::mangle;

fn write(dir: &Path, target: &str, seeds: &[Vec<u8>]) -> std::io::Result<usize> {
    let d = dir.join(target);
    std::fs::create_dir_all(&d)?;
    for (n, s) in seeds.iter().enumerate() {
        std::fs::write(d.join(format!("seed-{n}")), s)?;
    }
    Ok(seeds.len())
}

fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: fuzz_seeds DIR (the corpora's folder)");
    let dir = Path::new(&dir);
    let messages = mangle::seeds();
    let streams = mangle::streams();
    // A THeader frame without its length (what `wire::header::parse` reads).
    let theader: Vec<Vec<u8>> = streams
        .iter()
        .filter(|s| s.get(4..6) == Some(&[0x0f, 0xff][..]))
        .map(|s| s[4..].to_vec())
        .collect();
    let http: Vec<Vec<u8>> = streams
        .iter()
        .filter(|s| s.starts_with(b"POST"))
        .cloned()
        .collect();
    let mut n = 0;
    n += write(dir, "wire_session", &streams)?;
    n += write(dir, "wire_decoder", &streams)?;
    n += write(dir, "theader", &theader)?;
    n += write(dir, "http_head", &http)?;
    n += write(dir, "rpc_message", &messages)?;
    eprintln!("fuzz_seeds: wrote {n} seeds under {}", dir.display());
    Ok(())
}
