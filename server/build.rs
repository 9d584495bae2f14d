//! Compiles the protocol subset in `proto/` with protox (a pure-Rust proto
//! compiler, so no `protoc` is needed) and tonic's code generator.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/apache/rocketmq/v2/service.proto"];
    for file in ["proto/apache/rocketmq/v2/service.proto", "proto/apache/rocketmq/v2/definition.proto"] {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
