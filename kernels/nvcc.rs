// Shared by the build scripts of lowbit-optim and lowbit-model (`include!`d): compiles every
// `.cu` file of one kernels folder with nvcc into `$OUT_DIR/<name>.fatbin`, holding SASS for
// the target (`CUDA_COMPUTE_CAP`, default 90 = H100/H200: no JIT at start-up) and PTX (for
// newer GPUs). Does nothing without the crate's `cuda` feature, so CPU builds need no nvcc.

/// Compiles `<crate>/<folder>/*.cu` with `flags` added to nvcc's.
fn compile_fatbins(folder: &str, flags: &[&str]) {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
    // The folder itself: a `.cu` file added later reruns the build (cargo scans a folder).
    println!("cargo:rerun-if-changed={}", kernels.display());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let arch = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    for entry in std::fs::read_dir(&kernels).unwrap_or_else(|e| panic!("{}: {e}", kernels.display())) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cu" || e == "cuh") {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        if path.extension().is_some_and(|e| e == "cu") {
            let bin = out.join(path.file_stem().unwrap()).with_extension("fatbin");
            let status = std::process::Command::new(&nvcc)
                .args(["--fatbin", "-O3", "-std=c++17"])
                .args(flags)
                .arg(format!("-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"))
                .arg(&path)
                .arg("-o")
                .arg(&bin)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {nvcc} (set NVCC or put nvcc on PATH): {e}"));
            assert!(status.success(), "nvcc failed on {}", path.display());
        }
    }
}
