//! Compiles `kernels/*.cu` with nvcc, only with the `cuda` feature, into a fatbin holding
//! SASS for the target (`CUDA_COMPUTE_CAP`, default 90 = H100/H200: no JIT at start-up) and
//! PTX (for newer GPUs). `-fmad=false`: no FMA contraction, so the kernels' FP32 arithmetic
//! is the CPU reference's.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let arch = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    for entry in std::fs::read_dir(&kernels).expect("kernels/ folder") {
        let path = entry.unwrap().path();
        println!("cargo:rerun-if-changed={}", path.display());
        if path.extension().is_some_and(|e| e == "cu") {
            let bin = out.join(path.file_stem().unwrap()).with_extension("fatbin");
            let status = std::process::Command::new(&nvcc)
                .args(["--fatbin", "-O3", "-std=c++17", "-fmad=false"])
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
