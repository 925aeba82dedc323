//! Compiles `kernels/*.cu` to PTX (sm_90) with nvcc, only with the `cuda` feature.
//! `-fmad=false`: no FMA contraction, so the kernels' FP32 arithmetic is the CPU reference's.

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
            let ptx = out.join(path.file_stem().unwrap()).with_extension("ptx");
            let status = std::process::Command::new(&nvcc)
                .args(["--ptx", "-O3", "-std=c++17", "-fmad=false", &format!("-arch=compute_{arch}")])
                .arg(&path)
                .arg("-o")
                .arg(&ptx)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {nvcc} (set NVCC or put nvcc on PATH): {e}"));
            assert!(status.success(), "nvcc failed on {}", path.display());
        }
    }
}
