//! Writes the Envoy RLS types from `rls/proto` into the two crates that
//! use them: the library's client (client stubs only) and keyed-rls
//! (client and server).

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: single-threaded, before anything reads the environment.
    unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let proto = root.join("rls/proto");
    let files = [proto.join("envoy/service/ratelimit/v3/rls.proto")];
    // The library's client makes its own channel; keyed-rls's users may
    // want `connect`.
    generate(&root.join("src/rls/pb"), &files, &proto, false)?;
    generate(&root.join("rls/src/pb"), &files, &proto, true)?;
    Ok(())
}

fn generate(
    out: &Path,
    files: &[PathBuf],
    include: &Path,
    service: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(service)
        .build_transport(service)
        .emit_rerun_if_changed(false)
        .include_file("mod.rs")
        .out_dir(out)
        .compile_protos(files, &[include.to_path_buf()])?;
    Ok(())
}
