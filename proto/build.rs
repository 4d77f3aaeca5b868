fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let file_descriptors = protox::compile(["proto/leasehold.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(file_descriptors)?;
    Ok(())
}
