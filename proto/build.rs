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
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out_dir.join("kg_v1_descriptors.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&protos, &["."])?;
    write_method_paths(&descriptors, &out_dir.join("kg_v1_methods.rs"))?;
    Ok(())
}

/// Writes `METHOD_PATHS`, every `/package.Service/Method` the protos declare, so the servers
/// can tell a method they serve from any other path a client sends (a bounded metric label).
fn write_method_paths(
    descriptors: &std::path::Path,
    out: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use prost::Message as _;
    let set = prost_types::FileDescriptorSet::decode(std::fs::read(descriptors)?.as_slice())?;
    let mut paths = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                paths.push(format!(
                    "/{}.{}/{}",
                    file.package(),
                    service.name(),
                    method.name()
                ));
            }
        }
    }
    paths.sort();
    let mut code = String::from(
        "/// Every `/package.Service/Method` path of the v1 services, sorted.\npub const METHOD_PATHS: &[&str] = &[\n",
    );
    for path in &paths {
        code.push_str(&format!("    {path:?},\n"));
    }
    code.push_str("];\n");
    std::fs::write(out, code)?;
    Ok(())
}
