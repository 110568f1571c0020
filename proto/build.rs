//! Compiles `kg/v1/*.proto` with the vendored protoc, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds protoc through this variable; a build script is
    // single-threaded, so setting it here races with nothing.
    unsafe { std::env::set_var("PROTOC", &protoc) };
    let protos = [
        "kg/v1/common.proto",
        "kg/v1/auth.proto",
        "kg/v1/files.proto",
        "kg/v1/events.proto",
        "kg/v1/retrieval.proto",
        "kg/v1/graph.proto",
        "kg/v1/ontology.proto",
        "kg/v1/approval.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure().compile_protos(&protos, &["."])?;
    Ok(())
}
